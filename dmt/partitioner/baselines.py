"""Reference partitions to compare TP against (paper §5.2.3, Table 6)."""

from __future__ import annotations

import numpy as np

from dmt.models.partition import strided_towers
from dmt.partitioner.clustering import check_num_towers

__all__ = ["naive_partition", "random_partition"]


def naive_partition(num_features: int, num_towers: int) -> list[list[int]]:
    """The paper's naive baseline: tower ``t`` gets features ``t, t + T, t + 2T, ...``.

    The models' own strided assignment (:func:`dmt.models.partition.strided_towers`, which a DMT
    model with ``partition=naive`` uses), with ``num_towers`` checked.

    Example::

        >>> naive_partition(26, 8)[:3]
        [[0, 8, 16, 24], [1, 9, 17, 25], [2, 10, 18]]
    """
    check_num_towers(num_features, num_towers)
    return strided_towers(num_features, num_towers)


def random_partition(num_features: int, num_towers: int, seed: int = 0) -> list[list[int]]:
    """A uniformly random balanced partition (tower sizes ``floor/ceil(F / T)``).

    Towers are sorted internally and ordered by their first feature, like every partition dmt
    returns; equal seeds give equal partitions.
    """
    check_num_towers(num_features, num_towers)
    order = np.random.default_rng(seed).permutation(num_features)
    towers = [sorted(int(i) for i in order[tower::num_towers]) for tower in range(num_towers)]
    return sorted(towers, key=lambda tower: tower[0])
