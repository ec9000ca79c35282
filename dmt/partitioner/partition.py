"""Tower Partitioner (TP, paper §3.3): affinity -> distance -> Euclidean embedding -> towers.

:func:`tower_partition` runs the whole pipeline on one affinity matrix;
:func:`partition_hierarchical` first splits the features into given pre-groups (the paper's XLRM
recipe, §5.2.3: item / item-user / user features) and runs TP inside each.

:func:`check_partition_arguments` runs every check of their arguments that does not need the
affinity, so that a caller can fail fast before computing one (``dmt-partition --checkpoint``).

Every partition is canonical: each tower's feature indices are sorted, and towers are ordered by
their first (smallest) feature index.
"""

from __future__ import annotations

import math
import warnings
from collections.abc import Sequence
from dataclasses import dataclass

import numpy as np

from dmt.partitioner.affinity import check_affinity
from dmt.partitioner.clustering import balanced_kmeans, check_num_towers, tower_size_bounds
from dmt.partitioner.distance import affinity_to_distance, check_strategy
from dmt.partitioner.embedding import fit_euclidean_embedding

__all__ = [
    "PartitionResult",
    "allot_towers",
    "canonical_towers",
    "check_partition_arguments",
    "check_pre_groups",
    "partition_features",
    "partition_hierarchical",
    "tower_partition",
]


@dataclass(frozen=True, eq=False)
class PartitionResult:
    """A feature-to-tower assignment and how it was obtained.

    Shapes: ``F`` features, ``T`` towers, ``n`` embedding dim.
    """

    towers: list[list[int]]
    """Feature indices of each tower (canonical order, see the module docstring)."""
    strategy: str
    """``coherent`` or ``diverse``."""
    seed: int
    """Seed of the embedding and of K-Means."""
    stress: float
    """Normalized stress of the embedding (pooled over pre-groups in hierarchical mode)."""
    coords: np.ndarray
    """``(F, n)`` embedded coordinates. In hierarchical mode each pre-group is embedded on its
    own, so coordinates of different pre-groups are not comparable."""
    max_size_ratio: float
    """Requested largest / smallest tower size."""
    embed_dim: int
    """``n``, the Euclidean embedding dimension."""
    pre_groups: list[list[int]] | None = None
    """Feature indices of each pre-group (hierarchical mode), else ``None``."""

    @property
    def num_towers(self) -> int:
        return len(self.towers)

    @property
    def num_features(self) -> int:
        return sum(len(tower) for tower in self.towers)

    @property
    def sizes(self) -> list[int]:
        return [len(tower) for tower in self.towers]

    @property
    def labels(self) -> np.ndarray:
        """int64 ``(F,)``: the tower index of every feature."""
        labels = np.empty(self.num_features, dtype=np.int64)
        for tower, features in enumerate(self.towers):
            labels[features] = tower
        return labels


def canonical_towers(labels: np.ndarray | Sequence[int]) -> list[list[int]]:
    """Towers from per-feature labels: each sorted, ordered by smallest feature index."""
    groups: dict[int, list[int]] = {}
    for feature, label in enumerate(np.asarray(labels).tolist()):
        groups.setdefault(label, []).append(feature)
    return sorted(groups.values(), key=lambda tower: tower[0])


def tower_partition(
    affinity: np.ndarray,
    num_towers: int,
    strategy: str = "coherent",
    *,
    max_size_ratio: float = 1.0,
    embed_dim: int = 2,
    seed: int = 0,
    restarts: int = 4,
    steps: int = 1000,
    kmeans_n_init: int | None = None,
    kmeans_max_iter: int | None = None,
) -> PartitionResult:
    """Partition ``F`` features into ``num_towers`` balanced towers with TP.

    Args:
        affinity: ``(F, F)`` symmetric feature affinity with values in [0, 1]
            (see :mod:`dmt.partitioner.affinity`).
        num_towers: ``T``, between 1 and ``F``.
        strategy: ``"coherent"`` (related features together, ``D = 1 - I``) or ``"diverse"``
            (related features apart, ``D = I``).
        max_size_ratio: largest tower at most this many times the smallest; 1 means the most
            balanced split (sizes ``floor/ceil(F / T)``). See :mod:`dmt.partitioner.clustering`.
        embed_dim: dimension ``n`` of the Euclidean embedding, at least 1.
        seed: makes the result deterministic; between 0 and ``2**32 - 1`` (K-Means' range).
        restarts, steps: embedding restarts and Adam steps
            (see :func:`~dmt.partitioner.embedding.fit_euclidean_embedding`).
        kmeans_n_init, kmeans_max_iter: constrained K-Means budget (default: scaled to size).

    Returns:
        A :class:`PartitionResult`.

    Example::

        >>> result = tower_partition(affinity, num_towers=8, strategy="coherent")
        >>> result.towers[0], result.stress
    """
    matrix = check_affinity(affinity)
    strategy = check_strategy(strategy)
    # Fail fast on bad arguments; balanced_kmeans warns about an unreachable ratio.
    check_partition_arguments(
        matrix.shape[0],
        num_towers,
        max_size_ratio=max_size_ratio,
        embed_dim=embed_dim,
        seed=seed,
        warn=False,
    )
    labels, coords, stress, _ = _partition_group(
        matrix,
        num_towers,
        strategy,
        max_size_ratio=max_size_ratio,
        embed_dim=embed_dim,
        seed=seed,
        restarts=restarts,
        steps=steps,
        kmeans_n_init=kmeans_n_init,
        kmeans_max_iter=kmeans_max_iter,
    )
    return PartitionResult(
        towers=canonical_towers(labels),
        strategy=strategy,
        seed=seed,
        stress=stress,
        coords=coords,
        max_size_ratio=max_size_ratio,
        embed_dim=embed_dim,
    )


def partition_features(
    affinity: np.ndarray,
    num_towers: int,
    strategy: str = "coherent",
    *,
    max_size_ratio: float = 1.0,
    embed_dim: int = 2,
    seed: int = 0,
) -> list[list[int]]:
    """Feature indices per tower (canonical order); :func:`tower_partition` gives the details."""
    return tower_partition(
        affinity,
        num_towers,
        strategy,
        max_size_ratio=max_size_ratio,
        embed_dim=embed_dim,
        seed=seed,
    ).towers


def _partition_group(
    affinity: np.ndarray,
    num_towers: int,
    strategy: str,
    *,
    max_size_ratio: float,
    embed_dim: int,
    seed: int,
    restarts: int,
    steps: int,
    kmeans_n_init: int | None,
    kmeans_max_iter: int | None,
) -> tuple[np.ndarray, np.ndarray, float, float]:
    """Labels, coords, stress and ``sum_{i<j} D_ij^2`` (to pool stress over groups)."""
    distance = affinity_to_distance(affinity, strategy)
    coords, stress = fit_euclidean_embedding(
        distance, embed_dim, restarts=restarts, steps=steps, seed=seed
    )
    squared_total = float(np.square(distance).sum()) / 2
    del distance
    labels = balanced_kmeans(
        coords,
        num_towers,
        max_size_ratio=max_size_ratio,
        seed=seed,
        n_init=kmeans_n_init,
        max_iter=kmeans_max_iter,
    )
    return labels, coords, stress, squared_total


def allot_towers(group_sizes: Sequence[int], num_towers: int) -> list[int]:
    """Towers per pre-group, proportional to group size (largest remainder), at least 1 each.

    Example::

        >>> allot_towers([10, 5, 1], 4)
        [2, 1, 1]
    """
    num_groups = len(group_sizes)
    total = sum(group_sizes)
    if num_groups == 0 or min(group_sizes) < 1:
        raise ValueError(f"pre-groups must be non-empty, got sizes {list(group_sizes)}")
    if not num_groups <= num_towers <= total:
        raise ValueError(
            f"num_towers must be between the number of pre-groups ({num_groups}) and the number "
            f"of features ({total}) so that every pre-group gets at least one tower, "
            f"got {num_towers}"
        )
    quotas = [num_towers * size / total for size in group_sizes]
    allotted = [math.floor(quota) for quota in quotas]
    by_remainder = sorted(range(num_groups), key=lambda g: (-(quotas[g] - allotted[g]), g))
    for group in by_remainder[: num_towers - sum(allotted)]:
        allotted[group] += 1
    # A tiny group may get 0; take its tower from the group most above its quota.
    for group in range(num_groups):
        if allotted[group] == 0:
            donor = max(
                (g for g in range(num_groups) if allotted[g] >= 2),
                key=lambda g: (allotted[g] - quotas[g], allotted[g], -g),
            )
            allotted[donor] -= 1
            allotted[group] = 1
    assert sum(allotted) == num_towers
    assert all(1 <= a <= size for a, size in zip(allotted, group_sizes, strict=True))
    return allotted


def check_pre_groups(
    pre_groups: Sequence[Sequence[int]],
    num_features: int,
    feature_names: Sequence[str] | None = None,
) -> list[list[int]]:
    """Sorted pre-groups, after checking that they are non-empty, disjoint and cover all features.

    Args:
        pre_groups: feature indices of each pre-group.
        num_features: ``F``.
        feature_names: the ``F`` names; when given, error messages name the features.

    Raises:
        ValueError: an empty list or group, an index outside ``[0, F)``, a feature in two groups,
            or features in none.
    """

    def describe(feature: int) -> str:
        return repr(feature_names[feature]) if feature_names is not None else str(feature)

    groups = [sorted(int(i) for i in group) for group in pre_groups]
    if not groups or any(not group for group in groups):
        raise ValueError("pre_groups must be a non-empty list of non-empty lists of features")
    seen: dict[int, int] = {}
    for index, group in enumerate(groups):
        for feature in group:
            if not 0 <= feature < num_features:
                raise ValueError(
                    f"pre-group {index} holds feature index {feature}, outside [0, {num_features})"
                )
            if feature in seen:
                raise ValueError(
                    f"feature {describe(feature)} is in pre-groups {seen[feature]} and {index}; "
                    "pre-groups must be disjoint"
                )
            seen[feature] = index
    if len(seen) != num_features:
        missing = sorted(set(range(num_features)) - set(seen))
        raise ValueError(
            f"pre-groups must cover every feature; {len(missing)} missing, first "
            f"[{', '.join(describe(feature) for feature in missing[:5])}]"
        )
    return groups


def _is_int(value: object) -> bool:
    return isinstance(value, (int, np.integer)) and not isinstance(value, bool)


# sklearn's K-Means (and so k_means_constrained) takes seeds in [0, 2**32 - 1].
_MAX_SEED = 2**32 - 1


def check_partition_arguments(
    num_features: int,
    num_towers: int,
    *,
    pre_groups: Sequence[Sequence[int]] | None = None,
    max_size_ratio: float = 1.0,
    embed_dim: int = 2,
    seed: int = 0,
    feature_names: Sequence[str] | None = None,
    warn: bool = True,
) -> tuple[list[list[int]], list[int]] | None:
    """Every check :func:`tower_partition` (``pre_groups=None``) or
    :func:`partition_hierarchical` makes of its arguments, without the affinity.

    Args:
        num_features: ``F``, the affinity's size.
        num_towers, max_size_ratio, embed_dim, seed: as in :func:`tower_partition`.
        pre_groups: as in :func:`partition_hierarchical`, else ``None``.
        feature_names: the ``F`` names, to name features in pre-group errors.
        warn: warn when ``max_size_ratio`` cannot be met (see
            :func:`~dmt.partitioner.clustering.tower_size_bounds`).

    Returns:
        ``(groups, towers per group)`` (groups sorted) with ``pre_groups``, else ``None``.

    Raises:
        ValueError: naming the argument and what was expected.
    """
    check_num_towers(num_features, num_towers)
    if not _is_int(embed_dim) or embed_dim < 1:
        raise ValueError(f"embed_dim must be an integer >= 1, got {embed_dim!r}")
    if not _is_int(seed) or not 0 <= seed <= _MAX_SEED:
        raise ValueError(f"seed must be an integer between 0 and 2**32 - 1, got {seed!r}")
    with warnings.catch_warnings():
        if not warn:
            warnings.simplefilter("ignore", UserWarning)
        if pre_groups is None:
            tower_size_bounds(num_features, num_towers, max_size_ratio)
            return None
        groups = check_pre_groups(pre_groups, num_features, feature_names)
        allotted = allot_towers([len(group) for group in groups], num_towers)
        for group, group_towers in zip(groups, allotted, strict=True):
            tower_size_bounds(len(group), group_towers, max_size_ratio)
    return groups, allotted


def _warn_unbalanced_across_groups(
    sizes: Sequence[int],
    groups: Sequence[Sequence[int]],
    allotted: Sequence[int],
    max_size_ratio: float,
) -> None:
    """Warn when towers of different pre-groups break ``max_size_ratio`` (and are not the most
    balanced split, ``floor/ceil(F / T)``, which a flat partition would fall back to)."""
    smallest, largest = min(sizes), max(sizes)
    num_features, num_towers = sum(sizes), len(sizes)
    most_balanced = (
        largest <= -(-num_features // num_towers) and smallest >= num_features // num_towers
    )
    if largest <= max_size_ratio * smallest or most_balanced:
        return
    warnings.warn(
        f"max_size_ratio={max_size_ratio:g} holds within each pre-group only: pre-groups of "
        f"{[len(group) for group in groups]} features get {list(allotted)} towers, so the towers "
        f"hold {smallest} to {largest} features (no tower mixes pre-groups)",
        stacklevel=3,
    )


def partition_hierarchical(
    affinity: np.ndarray,
    num_towers: int,
    pre_groups: Sequence[Sequence[int]],
    strategy: str = "coherent",
    *,
    max_size_ratio: float = 1.0,
    embed_dim: int = 2,
    seed: int = 0,
    restarts: int = 4,
    steps: int = 1000,
    kmeans_n_init: int | None = None,
    kmeans_max_iter: int | None = None,
) -> PartitionResult:
    """TP inside given pre-groups of features (paper §5.2.3, XLRM).

    Towers are allotted to pre-groups in proportion to their size (:func:`allot_towers`); each
    pre-group is then partitioned on its own sub-affinity with :func:`tower_partition`'s
    pipeline, so no tower mixes pre-groups. ``max_size_ratio`` applies within each pre-group;
    towers of different pre-groups may differ more (a warning says so).

    Args:
        affinity: ``(F, F)`` affinity.
        num_towers: ``T``, between the number of pre-groups and ``F``.
        pre_groups: disjoint lists of feature indices covering all ``F`` features.
        strategy, max_size_ratio, embed_dim, seed, restarts, steps, kmeans_n_init,
            kmeans_max_iter: as in :func:`tower_partition`.
    """
    matrix = check_affinity(affinity)
    strategy = check_strategy(strategy)
    num_features = matrix.shape[0]
    checked = check_partition_arguments(
        num_features,
        num_towers,
        pre_groups=pre_groups,
        max_size_ratio=max_size_ratio,
        embed_dim=embed_dim,
        seed=seed,
        warn=False,
    )
    assert checked is not None
    groups, allotted = checked

    labels = np.empty(num_features, dtype=np.int64)
    coords = np.zeros((num_features, embed_dim))
    squared_error = 0.0
    squared_total = 0.0
    first_label = 0
    for group, group_towers in zip(groups, allotted, strict=True):
        group_labels, group_coords, stress, total = _partition_group(
            matrix[np.ix_(group, group)],
            group_towers,
            strategy,
            max_size_ratio=max_size_ratio,
            embed_dim=embed_dim,
            seed=seed,
            restarts=restarts,
            steps=steps,
            kmeans_n_init=kmeans_n_init,
            kmeans_max_iter=kmeans_max_iter,
        )
        labels[group] = group_labels + first_label
        coords[group] = group_coords
        squared_error += stress**2 * total
        squared_total += total
        first_label += group_towers
    pooled_stress = math.sqrt(squared_error / squared_total) if squared_total > 0 else 0.0
    towers = canonical_towers(labels)
    _warn_unbalanced_across_groups(
        [len(tower) for tower in towers], groups, allotted, max_size_ratio
    )
    return PartitionResult(
        towers=towers,
        strategy=strategy,
        seed=seed,
        stress=pooled_stress,
        coords=coords,
        max_size_ratio=max_size_ratio,
        embed_dim=embed_dim,
        pre_groups=groups,
    )
