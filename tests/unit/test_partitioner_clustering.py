"""Balanced constrained K-Means, tower size bounds and the baseline partitions."""

from __future__ import annotations

import math
import warnings

import numpy as np
import pytest
from sklearn.metrics import adjusted_rand_score

from dmt.partitioner.baselines import naive_partition, random_partition
from dmt.partitioner.clustering import (
    balanced_kmeans,
    default_kmeans_budget,
    tower_size_bounds,
)

FT_PAIRS = [(1, 1), (5, 1), (5, 5), (7, 2), (10, 3), (26, 8), (26, 16), (33, 4), (50, 7)]


@pytest.mark.parametrize(("num_features", "num_towers"), FT_PAIRS)
def test_kmeans_sizes_are_floor_ceil(num_features, num_towers):
    coords = np.random.default_rng(num_features).normal(size=(num_features, 2))
    labels = balanced_kmeans(coords, num_towers, seed=0)
    sizes = np.bincount(labels, minlength=num_towers)
    assert len(sizes) == num_towers
    floor, remainder = divmod(num_features, num_towers)
    assert sorted(sizes.tolist()) == [floor] * (num_towers - remainder) + [floor + 1] * remainder


def test_kmeans_follows_clusters_and_seed():
    rng = np.random.default_rng(0)
    centers = np.array([[0.0, 0.0], [10.0, 0.0], [0.0, 10.0]])
    truth = np.repeat(np.arange(3), 6)
    coords = centers[truth] + 0.1 * rng.normal(size=(18, 2))
    labels = balanced_kmeans(coords, 3, seed=3)
    # Same clusters up to renaming: each cluster one label, and three different labels
    assert adjusted_rand_score(truth, labels) == 1.0
    np.testing.assert_array_equal(labels, balanced_kmeans(coords, 3, seed=3))


@pytest.mark.parametrize(
    ("num_features", "num_towers", "ratio", "expected"),
    [
        (24, 4, 1.0, (6, 6)),
        (26, 8, 1.0, (3, 4)),
        (24, 3, 2.0, (6, 12)),  # widest range with size_max <= 2 * size_min
        (100, 4, 2.0, (20, 40)),
        (10, 2, math.inf, (1, 9)),
        (10, 10, 3.0, (1, 1)),
        (54, 2, 1.16, (25, 29)),  # 1.16 * 25 is 28.999... in floats: 29 is allowed
    ],
)
def test_size_bounds(num_features, num_towers, ratio, expected):
    size_min, size_max = tower_size_bounds(num_features, num_towers, ratio)
    assert (size_min, size_max) == expected
    assert num_towers * size_min <= num_features <= num_towers * size_max


def test_a_ratio_met_only_by_the_most_balanced_sizes_is_met_without_a_warning():
    # 10 features in 4 towers: sizes 2 and 3 (ratio 1.5) are the only split within ratio 1.5
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        assert tower_size_bounds(10, 4, 1.5) == (2, 3)


def test_kmeans_budget_steps_down_above_1e5_and_1e6_arcs():
    assert default_kmeans_budget(1000, 100) == (10, 300)
    assert default_kmeans_budget(1001, 100) == (2, 100)
    assert default_kmeans_budget(10_000, 100) == (2, 100)
    assert default_kmeans_budget(10_001, 100) == (1, 50)


@pytest.mark.parametrize("ratio", [1.5, 2.0, 3.0])
def test_max_size_ratio_respected_on_unbalanced_data(ratio):
    # Two natural clusters of 30 and 6 points into 2 towers: K-Means wants 30/6, the ratio caps it.
    rng = np.random.default_rng(1)
    coords = np.concatenate([rng.normal(size=(30, 2)), 20 + rng.normal(size=(6, 2))])
    sizes = np.bincount(balanced_kmeans(coords, 2, max_size_ratio=ratio, seed=0))
    assert sizes.max() <= ratio * sizes.min()
    # The ratio is binding: the large cluster's tower is as big as allowed.
    _, size_max = tower_size_bounds(36, 2, ratio)
    assert sizes.max() == size_max < 30


def test_ratio_finer_than_possible_falls_back_to_most_balanced():
    # 10 features into 7 towers: sizes 1 and 2 are unavoidable (ratio 2).
    with pytest.warns(UserWarning, match=r"max_size_ratio=1.5 cannot be met .* sizes 1 and 2"):
        assert tower_size_bounds(10, 7, 1.5) == (1, 2)


@pytest.mark.parametrize(
    ("args", "message"),
    [
        ((10, 0, 1.0), r"num_towers must be between 1 and the number of features \(10\), got 0"),
        ((10, 11, 1.0), r"num_towers must be between 1 and the number of features \(10\), got 11"),
        ((10, 2, 0.5), r"max_size_ratio must be >= 1 \(largest tower / smallest tower\), got 0.5"),
        ((10, 2, math.nan), r"max_size_ratio must be >= 1 .*got nan"),
    ],
)
def test_size_bound_errors(args, message):
    with pytest.raises(ValueError, match=message):
        tower_size_bounds(*args)


def test_naive_partition_matches_paper_example():
    # DMT paper §5.2.3, 26 Criteo sparse features into 8 towers.
    assert naive_partition(26, 8) == [
        [0, 8, 16, 24],
        [1, 9, 17, 25],
        [2, 10, 18],
        [3, 11, 19],
        [4, 12, 20],
        [5, 13, 21],
        [6, 14, 22],
        [7, 15, 23],
    ]
    assert naive_partition(3, 1) == [[0, 1, 2]]
    with pytest.raises(ValueError, match="num_towers must be between 1"):
        naive_partition(3, 4)


@pytest.mark.parametrize(("num_features", "num_towers"), FT_PAIRS)
def test_random_partition_balanced_and_seeded(num_features, num_towers):
    towers = random_partition(num_features, num_towers, seed=1)
    assert sorted(i for tower in towers for i in tower) == list(range(num_features))
    sizes = [len(tower) for tower in towers]
    assert len(towers) == num_towers and max(sizes) - min(sizes) <= 1
    assert all(tower == sorted(tower) for tower in towers)
    assert [tower[0] for tower in towers] == sorted(tower[0] for tower in towers)
    assert towers == random_partition(num_features, num_towers, seed=1)


def test_random_partition_depends_on_seed():
    assert random_partition(26, 8, seed=0) != random_partition(26, 8, seed=1)


def test_ratio_reaches_unequal_natural_groups():
    """Natural groups of 10, 20, 15 and 15 points meet the ratio 2 (20 <= 2 x 10), but the widest
    window [12, 24] cannot hold the group of 10; balanced_kmeans also tries the window [10, 20]
    that fits them and keeps it (lower inertia). It used to split the groups."""
    rng = np.random.default_rng(0)
    truth = np.repeat(np.arange(4), [10, 20, 15, 15])
    centers = np.array([[0.0, 0.0], [10.0, 0.0], [0.0, 10.0], [10.0, 10.0]])
    coords = centers[truth] + 0.5 * rng.normal(size=(60, 2))
    assert tower_size_bounds(60, 4, 2.0) == (12, 24)
    labels = balanced_kmeans(coords, 4, max_size_ratio=2.0, seed=0)
    # Same groups up to renaming.
    assert len({(int(a), int(b)) for a, b in zip(truth, labels, strict=True)}) == 4
    assert sorted(np.bincount(labels).tolist()) == [10, 15, 15, 20]


def test_a_ratio_near_the_largest_float_clusters_as_any_other_loose_one():
    """A reproduced bug: ``--max-size-ratio 1e308`` (K between 1 and inf, as documented) raised
    OverflowError (K times a tower size is inf, which math.floor cannot take). Any K of 19 or
    more caps no tower of 20 features in 4 towers; the windows, and so the labels, are those of
    K = 1e6."""
    rng = np.random.default_rng(0)
    truth = np.repeat(np.arange(4), [2, 3, 7, 8])
    coords = 10 * rng.normal(size=(4, 2))[truth] + rng.normal(size=(20, 2))
    loose = balanced_kmeans(coords, 4, max_size_ratio=1e6, seed=0)
    assert sorted(np.bincount(loose).tolist()) == [2, 3, 7, 8]
    np.testing.assert_array_equal(balanced_kmeans(coords, 4, max_size_ratio=1e308, seed=0), loose)
