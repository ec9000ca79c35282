import numpy as np
import pytest
from sklearn.metrics import mutual_info_score, roc_auc_score

from dmt.config import SyntheticConfig
from dmt.data import InMemorySource, sparse_feature_names
from dmt.data.synthetic import SyntheticWorld

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


@pytest.mark.parametrize("world_size", [2, 3, 4])
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
