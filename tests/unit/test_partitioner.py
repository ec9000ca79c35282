"""Tower Partitioner end to end on planted affinities with a known answer."""

from __future__ import annotations

import warnings

import numpy as np
import pytest
import torch
from sklearn.metrics import adjusted_rand_score

from dmt.partitioner import (
    PartitionResult,
    allot_towers,
    check_partition_arguments,
    compute_affinity,
    partition_features,
    partition_hierarchical,
    random_partition,
    tower_partition,
)
from dmt.partitioner.partition import canonical_towers
from dmt.partitioner.synthetic import planted_affinity

STEPS = 300  # enough for these sizes; keeps the file fast


def same_block_pairs_in_towers(towers: list[list[int]], blocks: np.ndarray) -> int:
    """How many features share a tower with an earlier feature of their block."""
    return sum(len(tower) - len(set(blocks[tower].tolist())) for tower in towers)


def assert_canonical(towers: list[list[int]], num_features: int) -> None:
    assert sorted(i for tower in towers for i in tower) == list(range(num_features))
    assert all(tower == sorted(tower) for tower in towers)
    assert [tower[0] for tower in towers] == sorted(tower[0] for tower in towers)


@pytest.mark.parametrize(
    ("block_sizes", "max_size_ratio"),
    [
        ([8, 8, 8, 8], 1.0),
        ([5, 5, 5, 5, 5, 5], 1.0),
        ([7, 7, 6], 1.0),  # F = 20 not divisible by 3: sizes 7/7/6 match floor/ceil
        ([6, 10, 8], 2.0),  # unequal blocks: bounds [6, 12] allow them
        ([4, 12], 3.0),
    ],
)
@pytest.mark.parametrize("seed", [0, 1, 2])
def test_coherent_recovers_planted_blocks(block_sizes, max_size_ratio, seed):
    affinity, blocks = planted_affinity(block_sizes, seed=seed)
    result = tower_partition(
        affinity,
        len(block_sizes),
        "coherent",
        max_size_ratio=max_size_ratio,
        seed=seed,
        steps=STEPS,
    )
    assert adjusted_rand_score(blocks, result.labels) >= 0.9
    assert_canonical(result.towers, len(blocks))


@pytest.mark.parametrize(
    ("block_sizes", "max_size_ratio"),
    [([6, 6], 1.0), ([5, 5, 5, 5], 1.0), ([4] * 8, 1.0), ([3, 6, 9, 12], 4.0), ([8, 4, 4, 8], 2.0)],
)
@pytest.mark.parametrize("noise", [0.5, 1.5])
def test_coherent_recovers_blocks_from_pooled_embeddings_exactly(
    block_sizes, max_size_ratio, noise
):
    # Pooled embeddings (B, F, N): in each sample, the features of a block share a random
    # direction, plus independent noise (within-block affinity about 0.8 at noise 0.5, 0.4 at
    # 1.5; across blocks about 0.01). affinity -> distance -> embedding -> K-Means must give back
    # exactly the blocks, with their unequal sizes.
    generator = torch.Generator().manual_seed(0)
    blocks = np.repeat(np.arange(len(block_sizes)), block_sizes)
    blocks = blocks[torch.randperm(len(blocks), generator=generator).numpy()]
    shared = torch.randn(512, len(block_sizes), 16, generator=generator)
    pooled = shared[:, blocks] + noise * torch.randn(512, len(blocks), 16, generator=generator)
    affinity = compute_affinity([pooled])
    result = tower_partition(affinity, len(block_sizes), max_size_ratio=max_size_ratio, steps=STEPS)
    assert canonical_towers(blocks) == result.towers
    assert adjusted_rand_score(blocks, result.labels) == 1.0


@pytest.mark.parametrize(("num_blocks", "num_towers"), [(6, 4), (5, 3), (4, 6), (10, 2)])
def test_diverse_spreads_blocks_over_towers(num_blocks, num_towers):
    # Blocks of size T: the ideal diverse partition puts one member of every block in each tower.
    collisions = []
    random_collisions = []
    for seed in range(3):
        affinity, blocks = planted_affinity([num_towers] * num_blocks, seed=seed)
        result = tower_partition(affinity, num_towers, "diverse", seed=seed, steps=STEPS)
        collisions.append(same_block_pairs_in_towers(result.towers, blocks))
        random_towers = random_partition(len(blocks), num_towers, seed=seed)
        random_collisions.append(same_block_pairs_in_towers(random_towers, blocks))
        coherent = tower_partition(affinity, num_towers, "coherent", seed=seed, steps=STEPS)
        # Sanity of the measure: coherent does the opposite and piles blocks together.
        assert same_block_pairs_in_towers(coherent.towers, blocks) > collisions[-1]
    assert max(collisions) <= 2, collisions
    assert collisions.count(0) >= 2, collisions
    assert sum(collisions) < sum(random_collisions) / 2, (collisions, random_collisions)


@pytest.mark.parametrize(
    ("num_features", "num_towers"),
    [(1, 1), (6, 1), (6, 6), (7, 2), (10, 3), (26, 8), (26, 16), (31, 5)],
)
@pytest.mark.parametrize("strategy", ["coherent", "diverse"])
def test_balance_is_exact(num_features, num_towers, strategy):
    affinity, _ = planted_affinity([num_features], within=0.5, noise=0.2, seed=num_features)
    result = tower_partition(affinity, num_towers, strategy, steps=50, restarts=1)
    floor, remainder = divmod(num_features, num_towers)
    assert sorted(result.sizes) == [floor] * (num_towers - remainder) + [floor + 1] * remainder
    assert result.num_towers == num_towers and result.num_features == num_features
    assert_canonical(result.towers, num_features)


@pytest.mark.parametrize("max_size_ratio", [1.5, 2.0, 4.0])
def test_max_size_ratio_respected(max_size_ratio):
    # One big block and two small ones into 3 towers: the big block wants a big tower.
    affinity, _ = planted_affinity([20, 4, 4], seed=5)
    result = tower_partition(affinity, 3, max_size_ratio=max_size_ratio, seed=0, steps=STEPS)
    assert max(result.sizes) <= max_size_ratio * min(result.sizes)
    assert max(result.sizes) > 28 / 3  # and the freedom is used


def test_deterministic_by_seed():
    affinity, _ = planted_affinity([6, 6, 6, 6], noise=0.3, seed=4)
    first = tower_partition(affinity, 4, seed=11, steps=STEPS)
    second = tower_partition(affinity, 4, seed=11, steps=STEPS)
    assert first.towers == second.towers
    assert first.stress == second.stress
    np.testing.assert_array_equal(first.coords, second.coords)


def test_partition_features_returns_towers():
    affinity, blocks = planted_affinity([5, 5, 5], seed=3)
    towers = partition_features(affinity, 3, "coherent", seed=0)
    assert_canonical(towers, 15)
    for tower in towers:
        assert len(set(blocks[tower].tolist())) == 1


def test_result_fields():
    affinity, _ = planted_affinity([4, 4], seed=0)
    result = tower_partition(affinity, 2, "diverse", embed_dim=3, seed=2, steps=50)
    assert isinstance(result, PartitionResult)
    assert result.coords.shape == (8, 3)
    assert (result.strategy, result.seed, result.embed_dim) == ("diverse", 2, 3)
    assert 0.0 <= result.stress < 1.0
    assert result.pre_groups is None
    for tower_index, tower in enumerate(result.towers):
        assert (result.labels[tower] == tower_index).all()


@pytest.mark.parametrize(
    ("sizes", "num_towers", "expected"),
    [
        ([10, 10], 4, [2, 2]),
        ([12, 6, 6], 4, [2, 1, 1]),
        ([10, 5, 1], 4, [2, 1, 1]),  # the singleton takes a tower from the most over-served group
        ([20, 6, 2], 7, [5, 1, 1]),  # quotas 5, 1.5, 0.5: the 0.5 remainder loses to the group's 1
        ([3, 3, 3], 3, [1, 1, 1]),
        ([6, 5, 4], 5, [2, 2, 1]),  # quotas 2, 1.67, 1.33: the largest remainder gets the 5th
        ([3, 3], 3, [2, 1]),  # equal remainders: the first group gets the spare tower
        ([19, 6, 5], 3, [1, 1, 1]),  # [2, 1, 0]: only a group of 2 towers can give one
        ([8, 8, 1], 6, [2, 3, 1]),  # [3, 3, 0]: of equal donors the first gives
    ],
)
def test_allot_towers(sizes, num_towers, expected):
    assert allot_towers(sizes, num_towers) == expected


def test_canonical_towers_are_sorted_and_ordered_by_their_first_feature():
    # interleaved towers: {1, 2} ends before {0, 3} but starts after it
    assert canonical_towers([1, 0, 0, 1, 2]) == [[0, 3], [1, 2], [4]]


def test_allot_towers_errors():
    with pytest.raises(
        ValueError,
        match=r"between the number of pre-groups \(3\) and the number of features \(9\).*got 2",
    ):
        allot_towers([3, 3, 3], 2)


def test_hierarchical_keeps_pre_groups_apart():
    # Blocks 0,1 are "item" features and block 2 "user"; an affinity that links blocks 1 and 2
    # would merge them in a flat partition, but pre-groups forbid mixing.
    affinity, blocks = planted_affinity([6, 6, 6], shuffle=False, seed=0)
    affinity[6:12, 12:18] = affinity[12:18, 6:12] = 0.8
    pre_groups = [list(range(12)), list(range(12, 18))]
    result = partition_hierarchical(affinity, 3, pre_groups, seed=0, steps=STEPS)
    assert result.pre_groups == pre_groups
    assert result.sizes == [6, 6, 6]
    for tower in result.towers:
        assert len({0 if i < 12 else 1 for i in tower}) == 1
    assert adjusted_rand_score(blocks, result.labels) >= 0.9
    assert 0.0 <= result.stress < 1.0


def test_hierarchical_stress_pools_the_pre_groups_pairs():
    """The stress of a hierarchical partition is the normalized stress over the pairs inside
    each pre-group (each embedded on its own): sqrt(sum (d - D)^2 / sum D^2) over all of them."""
    rng = np.random.default_rng(0)
    upper = np.triu(rng.uniform(size=(12, 12)), 1)
    affinity = upper + upper.T + np.eye(12)
    groups = [list(range(6)), list(range(6, 12))]
    result = partition_hierarchical(affinity, 4, groups, restarts=1, steps=30)
    squared_error = squared_total = 0.0
    for group in groups:
        distance = 1.0 - affinity[np.ix_(group, group)]  # coherent: D = 1 - I
        coords = result.coords[group]
        fitted = np.linalg.norm(coords[:, None] - coords[None], axis=-1)
        pairs = np.triu_indices(len(group), 1)
        squared_error += float(np.square(fitted - distance)[pairs].sum())
        squared_total += float(np.square(distance)[pairs].sum())
    assert 0 < result.stress == pytest.approx(np.sqrt(squared_error / squared_total), rel=1e-9)


def test_hierarchical_allotment_and_errors():
    affinity, _ = planted_affinity([8, 4], shuffle=False, seed=1)
    result = partition_hierarchical(affinity, 3, [list(range(8)), list(range(8, 12))], steps=50)
    assert sorted(result.sizes) == [4, 4, 4]

    groups_ok = [list(range(8)), list(range(8, 12))]
    with pytest.raises(ValueError, match="feature 3 is in pre-groups 0 and 1"):
        partition_hierarchical(affinity, 2, [list(range(8)), [3] + list(range(8, 12))])
    with pytest.raises(ValueError, match=r"must cover every feature; 1 missing, first \[11\]"):
        partition_hierarchical(affinity, 2, [list(range(8)), list(range(8, 11))])
    with pytest.raises(ValueError, match=r"feature index 12, outside \[0, 12\)"):
        partition_hierarchical(affinity, 2, [list(range(8)), list(range(8, 13))])
    with pytest.raises(ValueError, match=r"pre-groups \(2\).*got 1"):
        partition_hierarchical(affinity, 1, groups_ok)


def test_hierarchical_warns_when_towers_of_different_pre_groups_break_the_ratio():
    # Each pre-group holds its ratio, but a pre-group of 10 features with 1 tower and one of 3
    # with 1 tower make towers of 10 and 3, though max_size_ratio=1 asks for the most balanced.
    affinity, _ = planted_affinity([13], seed=0)
    with pytest.warns(UserWarning) as record:
        result = partition_hierarchical(affinity, 2, [list(range(10)), [10, 11, 12]], steps=50)
    assert result.sizes == [10, 3]
    assert [str(w.message) for w in record] == [
        "max_size_ratio=1 holds within each pre-group only: pre-groups of [10, 3] features get "
        "[1, 1] towers, so the towers hold 3 to 10 features (no tower mixes pre-groups)"
    ]
    # Sizes within the ratio, or the most balanced split (floor/ceil(F / T)), are no news.
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        groups = [list(range(7)), list(range(7, 13))]
        assert partition_hierarchical(affinity, 2, groups, steps=50).sizes == [7, 6]
        partition_hierarchical(affinity, 2, [list(range(9)), [9, 10, 11, 12]], max_size_ratio=3)


@pytest.mark.parametrize(
    ("affinity", "num_towers", "kwargs", "message"),
    [
        (np.ones((3, 4)), 2, {}, r"square \(F, F\) matrix, got shape \(3, 4\)"),
        (np.array([[1.0, 0.1], [0.4, 1.0]]), 1, {}, "must be symmetric"),
        (np.array([[1.0, np.nan], [np.nan, 1.0]]), 1, {}, "NaN or infinite"),
        (np.full((2, 2), 2.0), 1, {}, r"must lie in \[0, 1\]"),
        (np.eye(4), 0, {}, r"num_towers must be between 1 and the number of features \(4\), got 0"),
        (np.eye(4), 5, {}, r"num_towers must be between 1 and the number of features \(4\), got 5"),
        (np.eye(4), 2, {"max_size_ratio": 0.9}, r"max_size_ratio must be >= 1"),
        (np.eye(4), 2, {"strategy": "random"}, r"strategy must be one of"),
    ],
)
def test_errors(affinity, num_towers, kwargs, message):
    with pytest.raises(ValueError, match=message):
        tower_partition(affinity, num_towers, steps=5, **kwargs)


def test_coherent_recovers_unequal_blocks_within_the_ratio():
    """Blocks of 10 to 20 features meet max_size_ratio 2, though the widest size window, [12, 24],
    excludes the block of 10: the tower of that block used to take 2 features of another."""
    affinity, blocks = planted_affinity([10, 20, 15, 15], seed=0)
    result = tower_partition(affinity, 4, seed=0, steps=STEPS, max_size_ratio=2.0)
    assert same_block_pairs_in_towers(result.towers, blocks) == 60 - 4
    assert sorted(result.sizes) == [10, 15, 15, 20]


@pytest.mark.parametrize(
    ("kwargs", "message"),
    [
        ({"seed": -1}, r"^seed must be an integer between 0 and 2\*\*32 - 1, got -1$"),
        ({"seed": 2**32}, r"^seed must be an integer between 0 and 2\*\*32 - 1, got 4294967296$"),
        ({"embed_dim": 0}, r"^embed_dim must be an integer >= 1, got 0$"),
    ],
    ids=["seed-negative", "seed-too-large", "embed-dim"],
)
def test_seed_and_embed_dim_are_checked_before_any_work(kwargs, message):
    # A seed K-Means rejects used to fail only after the embedding.
    affinity, _ = planted_affinity([4, 4], seed=0)
    with pytest.raises(ValueError, match=message):
        tower_partition(affinity, 2, steps=STEPS, **kwargs)
    with pytest.raises(ValueError, match=message):
        partition_hierarchical(affinity, 2, [list(range(4)), list(range(4, 8))], **kwargs)


@pytest.mark.filterwarnings("ignore:max_size_ratio=1 holds within each pre-group only")
def test_numpy_integer_seed_and_embed_dim_partition_as_python_ints():
    # The checks accept NumPy integers (a seed from np.arange or a Generator), but the embedding
    # handed the seed to torch's manual_seed, which raised "TypeError: an integer is required".
    affinity, _ = planted_affinity([4, 4, 3], seed=0)
    groups = [list(range(6)), list(range(6, 11))]
    for numpy_int in (np.int64, np.uint32):
        flat = tower_partition(affinity, 3, seed=numpy_int(5), embed_dim=numpy_int(2), steps=50)
        reference = tower_partition(affinity, 3, seed=5, embed_dim=2, steps=50)
        assert flat.towers == reference.towers
        np.testing.assert_array_equal(flat.coords, reference.coords)
        nested = partition_hierarchical(affinity, 3, groups, seed=numpy_int(5), steps=50)
        assert nested.towers == partition_hierarchical(affinity, 3, groups, seed=5, steps=50).towers


def test_check_partition_arguments():
    names = [f"cat_{i}" for i in range(6)]
    assert check_partition_arguments(6, 3) is None
    assert check_partition_arguments(6, 3, seed=2**32 - 1) is None  # K-Means' largest seed
    assert check_partition_arguments(6, 3, pre_groups=[[5, 0, 1, 2], [3, 4]]) == (
        [[0, 1, 2, 5], [3, 4]],
        [2, 1],
    )
    with pytest.raises(ValueError, match=r"^feature 'cat_2' is in pre-groups 0 and 1; "):
        check_partition_arguments(6, 2, pre_groups=[[0, 1, 2], [2, 3, 4, 5]], feature_names=names)
    with pytest.raises(ValueError, match=r"1 missing, first \['cat_5'\]$"):
        check_partition_arguments(6, 2, pre_groups=[[0, 1, 2], [3, 4]], feature_names=names)
    with pytest.raises(ValueError, match=r"num_towers must be between 1 .* \(6\), got 7"):
        check_partition_arguments(6, 7)
    # An unreachable ratio warns, unless asked not to (a pre-check before the partition warns).
    with pytest.warns(UserWarning, match=r"max_size_ratio=1.5 cannot be met"):
        check_partition_arguments(10, 7, max_size_ratio=1.5)
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        check_partition_arguments(10, 7, max_size_ratio=1.5, warn=False)
