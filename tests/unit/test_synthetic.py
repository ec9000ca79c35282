import numpy as np
import pytest
from sklearn.metrics import mutual_info_score, roc_auc_score

from dmt.config import SyntheticConfig
from dmt.data import InMemorySource, sparse_feature_names
from dmt.data.synthetic import SyntheticWorld, ZipfSampler, zipf_cdf

SMALL = dict(
    num_train=4000, num_val=1000, num_test=1000, cardinality=50, num_sparse=12, num_groups=3
)


def test_deterministic_by_seed_and_different_across_seeds():
    a = SyntheticWorld(SyntheticConfig(**SMALL, seed=3)).generate("train", 3000)
    b = SyntheticWorld(SyntheticConfig(**SMALL, seed=3)).generate("train", 3000)
    c = SyntheticWorld(SyntheticConfig(**SMALL, seed=4)).generate("train", 3000)
    for x, y in [
        (a.dense, b.dense),
        (a.sparse, b.sparse),
        (a.labels, b.labels),
        (a.true_probs, b.true_probs),
    ]:
        np.testing.assert_array_equal(x, y)
    assert not np.array_equal(a.sparse, c.sparse)


def test_splits_differ_and_ids_are_in_range():
    w = SyntheticWorld(SyntheticConfig(**SMALL, multi_hot=3))
    tr, te = w.generate("train", 2000), w.generate("test", 2000)
    assert not np.array_equal(tr.sparse, te.sparse)
    assert tr.sparse.shape == (2000, 12, 3)
    assert tr.sparse.min() >= 0 and tr.sparse.max() < 50


def test_click_rate_and_true_probabilities():
    w = SyntheticWorld(SyntheticConfig(**SMALL, click_rate=0.3))
    d = w.generate("test", 20000)
    assert abs(d.labels.mean() - 0.3) < 0.02
    np.testing.assert_allclose(d.true_probs, 1 / (1 + np.exp(-w.logit(d.dense, d.sparse))))
    # labels are Bernoulli(true_probs): the oracle ranks clicks well, a shuffled oracle does not
    assert roc_auc_score(d.labels, d.true_probs) > 0.7
    assert (
        abs(roc_auc_score(d.labels, np.random.default_rng(0).permutation(d.true_probs)) - 0.5)
        < 0.03
    )


def test_interactions_only_inside_planted_groups():
    """Changing one feature's id moves the logit only through its own group's pairs."""
    w = SyntheticWorld(SyntheticConfig(**SMALL))
    d = w.generate("test", 200)
    g0 = w.feature_groups[0]
    i, j = g0[0], g0[1]
    other = next(f for grp in w.feature_groups[1:] for f in grp)
    base = d.sparse.copy()

    def mixed_effect(a: int, b: int) -> float:
        # second difference of the logit in features a and b: zero iff they do not interact
        x00, x10, x01, x11 = (base.copy() for _ in range(4))
        for x, da, db in [(x10, 1, 0), (x01, 0, 1), (x11, 1, 1)]:
            x[:, a, :] = (x[:, a, :] + da) % 50
            x[:, b, :] = (x[:, b, :] + db) % 50
        lg = [w.logit(d.dense, x) for x in (x00, x10, x01, x11)]
        return float(np.abs(lg[3] - lg[1] - lg[2] + lg[0]).max())

    assert mixed_effect(i, j) > 1e-3
    assert mixed_effect(i, other) < 1e-9


def test_features_of_a_group_are_dependent():
    w = SyntheticWorld(SyntheticConfig(**SMALL))
    d = w.generate("train", 4000)
    g = w.feature_groups
    c = 16
    within = mutual_info_score(d.sparse[:, g[0][0], 0] % c, d.sparse[:, g[0][1], 0] % c)
    across = mutual_info_score(d.sparse[:, g[0][0], 0] % c, d.sparse[:, g[1][0], 0] % c)
    assert within > 10 * across


def test_random_mode_has_no_oracle():
    d = SyntheticWorld(SyntheticConfig(**SMALL, mode="random")).generate("train", 1000)
    assert d.true_probs is None and set(np.unique(d.labels)) <= {0.0, 1.0}


@pytest.mark.parametrize("world_size", [2, 3, 4, 7])  # 7 does not divide the batch of 120
def test_rank_slices_partition_every_global_batch(world_size):
    w = SyntheticWorld(SyntheticConfig(**SMALL))
    d = w.generate("train", 1000)
    names = sparse_feature_names(12)
    kw = dict(batch_size=120, shuffle=True, seed=5, drop_last=True)
    single = list(InMemorySource(d.dense, d.sparse, d.labels, names, **kw).batches(1))
    ranks = (
        [
            list(
                InMemorySource(
                    d.dense, d.sparse, d.labels, names, rank=r, world_size=world_size, **kw
                ).batches(1)
            )
            for r in range(world_size)
        ]
        if 120 % world_size == 0
        else None
    )
    if ranks is None:
        with pytest.raises(ValueError, match="must be divisible by the world size"):
            InMemorySource(d.dense, d.sparse, d.labels, names, rank=0, world_size=world_size, **kw)
        return
    for b, whole in enumerate(single):
        np.testing.assert_array_equal(
            np.concatenate([r[b].labels.numpy() for r in ranks]), whole.labels.numpy()
        )
        np.testing.assert_array_equal(
            np.concatenate([r[b].dense_features.numpy() for r in ranks]),
            whole.dense_features.numpy(),
        )


def test_kjt_holds_the_ids_feature_major():
    w = SyntheticWorld(SyntheticConfig(**SMALL, multi_hot=2))
    d = w.generate("val", 50)
    names = sparse_feature_names(12)
    batch = next(InMemorySource(d.dense, d.sparse, d.labels, names, batch_size=50).batches(0))
    for f, name in enumerate(names):
        np.testing.assert_array_equal(
            batch.sparse_features[name].values().numpy(), d.sparse[:, f, :].reshape(-1)
        )


def test_make_kjt_announces_the_per_key_sizes_it_would_otherwise_compute():
    import numpy as np  # noqa: PLC0415
    from torchrec import KeyedJaggedTensor  # noqa: PLC0415

    from dmt.data.source import make_kjt  # noqa: PLC0415

    ids = np.random.default_rng(0).integers(0, 50, size=(5, 3, 2))
    kjt = make_kjt(["a", "b", "c"], ids)
    computed = KeyedJaggedTensor(keys=["a", "b", "c"], values=kjt.values(), lengths=kjt.lengths())
    assert kjt._length_per_key == [10, 10, 10]  # given, not derived lazily from the lengths
    assert kjt.length_per_key() == computed.length_per_key()
    assert kjt.offset_per_key() == computed.offset_per_key()
    assert kjt.stride() == computed.stride() == 5
    for key, jt in kjt.to_dict().items():
        assert jt.values().tolist() == computed.to_dict()[key].values().tolist()
        assert jt.values().tolist() == ids[:, "abc".index(key)].reshape(-1).tolist()


def test_an_empty_batch_is_padded_with_one_row_of_empty_bags():
    import torch  # noqa: PLC0415
    from torchrec import EmbeddingBagCollection, EmbeddingBagConfig  # noqa: PLC0415

    from dmt.data import pad_empty_batch  # noqa: PLC0415

    w = SyntheticWorld(SyntheticConfig(**SMALL))
    d = w.generate("val", 3)
    names = sparse_feature_names(12)
    # 3 rows on 4 ranks: rank 3 gets none of them
    full = next(InMemorySource(d.dense, d.sparse, d.labels, names, batch_size=3).batches(0))
    empty = next(
        InMemorySource(
            d.dense, d.sparse, d.labels, names, batch_size=3, rank=3, world_size=4
        ).batches(0)
    )
    assert empty.labels.numel() == 0
    assert pad_empty_batch(full) is full
    padded = pad_empty_batch(empty)
    kjt = padded.sparse_features
    assert padded.dense_features.tolist() == [[0.0] * d.dense.shape[1]]
    assert padded.labels.tolist() == [0.0]
    assert kjt.keys() == names and kjt.stride() == 1
    assert kjt.lengths().tolist() == [0] * 12 and kjt.values().numel() == 0
    assert kjt.lengths().dtype == empty.sparse_features.lengths().dtype
    assert kjt.values().dtype == empty.sparse_features.values().dtype
    assert kjt.length_per_key() == [0] * 12 and kjt.offset_per_key() == [0] * 13
    # a lookup of it is one row of zeros (sum pooling of empty bags)
    ebc = EmbeddingBagCollection(
        tables=[
            EmbeddingBagConfig(
                name=f"t_{n}", embedding_dim=4, num_embeddings=100, feature_names=[n]
            )
            for n in names
        ]
    )
    pooled = ebc(kjt).values()
    assert pooled.shape == (1, 48) and torch.count_nonzero(pooled) == 0


# --- random mode at Terabyte table sizes: ZipfSampler ---------------------------------------


def _zipf_pmf(card: int, skew: float) -> np.ndarray:
    p = np.arange(1, card + 1, dtype=np.float64) ** -skew
    return p / p.sum()


@pytest.mark.parametrize("skew", [1.05, 1.0, 0.8])
def test_zipf_sampler_ranks_follow_zipf_on_small_and_huge_tables(skew):
    """Top ranks and rank ranges (head, tail beyond K = 4096, far tail) against the exact pmf."""
    cards = np.array([50, 5000, 3_000_000])
    n = 200_000
    ranks = ZipfSampler(cards, skew).sample(np.random.default_rng(7), (n, 3, 1))
    assert ranks.shape == (n, 3, 1) and ranks.dtype == np.int64
    for f, card in enumerate(cards):
        r = ranks[:, f, 0]
        assert r.min() >= 0 and r.max() < card
        p = _zipf_pmf(int(card), skew)
        emp = np.bincount(r, minlength=card) / n
        edges = [e for e in (0, 1, 2, 3, 5, 10, 100, 4096, 100_000, card) if e <= card]
        for lo, hi in zip(edges[:-1], edges[1:]):
            expected = p[lo:hi].sum()
            se = np.sqrt(expected * (1 - expected) / n)
            assert abs(emp[lo:hi].sum() - expected) < 5 * se + 1e-12, (card, lo, hi)


def test_zipf_sampler_head_is_the_exact_inverse_cdf():
    """Below K ranks, the guide-table search returns exactly what a search of the full CDF does."""
    cards = np.array([7, 300, 4096])
    size = (50_000, 3, 1)
    ranks = ZipfSampler(cards, 1.05).sample(np.random.default_rng(3), size)
    u = np.random.default_rng(3).random(size)
    for f, card in enumerate(cards):
        exact = np.searchsorted(zipf_cdf(int(card), 1.05), u[:, f, 0], side="right")
        np.testing.assert_array_equal(ranks[:, f, 0], exact)


def test_random_mode_at_terabyte_sizes_is_zipf_by_id_deterministic_and_in_range(monkeypatch):
    cards = [45_833_188, 3, 1_572_176, 62, 48_937_457]
    cfg = SyntheticConfig(mode="random", cardinalities=cards, num_sparse=5, skew=1.05, seed=2)
    n = 140_000  # 3 chunks, generated in threads
    a = SyntheticWorld(cfg).generate("train", n)
    monkeypatch.setattr("dmt.data.synthetic.os.sched_getaffinity", lambda pid: {0})
    b = SyntheticWorld(cfg).generate("train", n)  # one thread
    for x, y in [(a.dense, b.dense), (a.sparse, b.sparse), (a.labels, b.labels)]:
        np.testing.assert_array_equal(x, y)
    other = SyntheticWorld(SyntheticConfig(**{**cfg.__dict__, "seed": 3})).generate("train", n)
    assert not np.array_equal(a.sparse, other.sparse)
    assert a.sparse.shape == (n, 5, 1) and a.true_probs is None
    assert np.isfinite(a.dense).all() and a.dense.min() >= 0
    world = SyntheticWorld(cfg)
    for f, card in enumerate(cards):
        ids = a.sparse[:, f, 0]
        assert ids.min() >= 0 and ids.max() < card
        top = min(card, 5)
        # the most frequent ids are the relabeled top ranks, with Zipf's probabilities
        top_ids = world.background_id_of_rank(f, np.arange(top))
        assert len(set(top_ids.tolist())) == top
        p = _zipf_pmf(card, 1.05)[:top]
        emp = np.array([(ids == i).mean() for i in top_ids])
        np.testing.assert_array_less(np.abs(emp - p), 5 * np.sqrt(p * (1 - p) / n))


def test_uniform_random_mode_covers_the_table():
    cfg = SyntheticConfig(mode="random", cardinalities=[10, 1000], num_sparse=2, skew=0.0)
    ids = SyntheticWorld(cfg).generate("val", 20_000).sparse
    assert set(np.unique(ids[:, 0]).tolist()) == set(range(10))
    assert ids[:, 1].min() >= 0 and ids[:, 1].max() < 1000
    assert abs(np.bincount(ids[:, 0, 0], minlength=10) / 20_000 - 0.1).max() < 0.02


class _FixedUniforms:
    """A stand-in generator whose ``random`` returns chosen values."""

    def __init__(self, u: np.ndarray) -> None:
        self.u = u

    def random(self, size: tuple[int, ...]) -> np.ndarray:
        return self.u.reshape(size).copy()


@pytest.mark.parametrize("skew", [1.05, 1.0])
def test_zipf_sampler_returns_the_rank_whose_cdf_interval_holds_the_uniform(skew):
    """The middle of rank k's interval of the exact CDF gives rank k (0-based k - 1), in the head,
    at the head/tail seam (K = 4096) and deep in the tail: no off-by-one anywhere."""
    card = 3_000_000
    cdf = zipf_cdf(card, skew)
    ks = np.array([1, 2, 3, 4095, 4096, 4097, 4098, 4099, 10_000, 123_457, 2_999_999, 3_000_000])
    lower = np.where(ks > 1, cdf[np.maximum(ks - 2, 0)], 0.0)
    u = (lower + cdf[ks - 1]) / 2
    ranks = ZipfSampler(np.array([card]), skew).sample(_FixedUniforms(u), (len(ks), 1, 1))
    np.testing.assert_array_equal(ranks.ravel(), ks - 1)
