"""Balanced clustering of embedded features into towers (TP step 3, paper §3.3).

Constrained K-Means (Bradley et al., 2000; ``k_means_constrained.KMeansConstrained``) assigns
every feature to a tower subject to a minimum and maximum tower size.

Tower sizes: with ``max_size_ratio`` ``K``, the largest tower holds at most ``K`` times as many
features as the smallest. ``K = 1`` asks for the most balanced split possible: sizes
``floor(F / T)`` and ``ceil(F / T)`` (they differ by one when ``T`` does not divide ``F``; no split
does better). :func:`tower_size_bounds` gives, for ``K > 1``, the bounds
``[size_min, size_max]`` with ``size_max <= K * size_min`` that leave the clustering the most
freedom (the widest range that can still hold ``F`` features in ``T`` towers); ``K = inf`` gives
``[1, F - T + 1]``. If no such bounds exist, the ratio ``K`` is finer than the unavoidable
``ceil / floor``; the most balanced split is used and a warning says so.

No single window ``[s, floor(K s)]`` holds every split that meets the ratio: the widest one forces
the smallest tower to be as large as possible, so towers of natural groups of 20 to 40 features
(ratio 2) are out of reach when it is ``[27, 54]``. For ``1 < K < inf``, :func:`balanced_kmeans`
therefore clusters within up to four windows ``[s, min(floor(K s), F - (T - 1) s)]`` and keeps
the labels of lowest K-Means inertia (ties keep the widest window): the widest window; the two
windows that fit an unconstrained K-Means' cluster sizes (``s`` = its smallest cluster, and its
largest / ``K``); and the two ends of the feasible range of ``s``, as many of these as fit in
four distinct windows, in that order. ``K = 1``, ``K = inf`` and an unreachable ``K`` use the
one window of :func:`tower_size_bounds`.

Cost: every K-Means iteration solves a min-cost-flow problem with ``F * T`` arcs (about 0.6 s at
10,000 features x 64 towers on one CPU core), so the library's defaults (10 initializations of up
to 300 iterations) would take minutes there. :func:`default_kmeans_budget` keeps them up to
``F * T = 10^5`` arcs and lowers them above (2 x 100 up to 10^6 arcs, 1 x 50 beyond). The points
are low-dimensional (``embed_dim``) and, when the affinity has structure, well separated: in the
10,000 x 64 benchmark (``scripts/bench_partitioner.py``) the clustering takes 3-5 s and still
recovers the planted blocks exactly. For ``1 < K < inf`` the clustering costs up to four times
as much (one constrained K-Means per window, plus one unconstrained K-Means, which is cheap).
"""

from __future__ import annotations

import math
import warnings

import numpy as np
from k_means_constrained import KMeansConstrained
from sklearn.cluster import KMeans
from sklearn.exceptions import ConvergenceWarning

__all__ = ["balanced_kmeans", "check_num_towers", "default_kmeans_budget", "tower_size_bounds"]


def check_num_towers(num_features: int, num_towers: int) -> None:
    """Raise ``ValueError`` unless ``1 <= num_towers <= num_features``."""
    if not 1 <= num_towers <= num_features:
        raise ValueError(
            f"num_towers must be between 1 and the number of features ({num_features}), "
            f"got {num_towers}"
        )


_MAX_WINDOWS = 4


def _smallest_min(num_features: int, num_towers: int, max_size_ratio: float, size: int) -> int:
    """The smallest ``size_min`` whose largest allowed tower, ``floor(K size_min)``, holds
    ``size`` features."""
    # compared as floats: K * size_min overflows to inf for a K near the largest float, which
    # math.floor cannot take (floor(x) >= n is x >= n for an integer n)
    size_min = max(1, math.ceil(size / max_size_ratio))
    while size_min > 1 and max_size_ratio * (size_min - 1) + 1e-9 >= size:
        size_min -= 1
    while max_size_ratio * size_min + 1e-9 < size:
        size_min += 1
    return size_min


def _size_windows(
    coords: np.ndarray,
    num_towers: int,
    max_size_ratio: float,
    widest: tuple[int, int],
    seed: int,
    n_init: int,
) -> list[tuple[int, int]]:
    """The size windows :func:`balanced_kmeans` tries (see the module docstring)."""
    num_features = coords.shape[0]
    if not 1.0 < max_size_ratio < math.inf:
        return [widest]
    largest_min = num_features // num_towers
    lowest = _smallest_min(num_features, num_towers, max_size_ratio, -(-num_features // num_towers))
    if lowest >= largest_min:  # one feasible window, or none (the most balanced fallback)
        return [widest]

    def window(size_min: int) -> tuple[int, int]:
        size_min = min(max(size_min, lowest), largest_min)
        largest = num_features - (num_towers - 1) * size_min
        # the cap before the floor: K * size_min may overflow to inf (see _smallest_min)
        return size_min, math.floor(min(max_size_ratio * size_min, largest) + 1e-9)

    with warnings.catch_warnings():  # coinciding points: fewer distinct clusters than asked
        warnings.simplefilter("ignore", ConvergenceWarning)
        natural = KMeans(n_clusters=num_towers, n_init=n_init, random_state=seed).fit(coords)
    sizes = np.bincount(natural.labels_, minlength=num_towers)
    candidates = [
        widest,
        window(int(sizes.min())),
        window(_smallest_min(num_features, num_towers, max_size_ratio, int(sizes.max()))),
        window(lowest),
        window(largest_min),
    ]
    return list(dict.fromkeys(candidates))[:_MAX_WINDOWS]


def tower_size_bounds(
    num_features: int, num_towers: int, max_size_ratio: float = 1.0
) -> tuple[int, int]:
    """``(size_min, size_max)`` for ``num_towers`` towers over ``num_features`` features.

    Args:
        num_features: ``F``.
        num_towers: ``T``, between 1 and ``F``.
        max_size_ratio: ``K >= 1`` (``math.inf`` allowed): largest tower / smallest tower.

    Returns:
        Bounds such that ``T * size_min <= F <= T * size_max`` and, when the ratio can be met at
        all, ``size_max <= K * size_min``.
    """
    check_num_towers(num_features, num_towers)
    if math.isnan(max_size_ratio) or max_size_ratio < 1.0:
        raise ValueError(
            f"max_size_ratio must be >= 1 (largest tower / smallest tower), got {max_size_ratio}"
        )
    smallest_max = -(-num_features // num_towers)  # ceil(F / T)
    largest_min = num_features // num_towers  # floor(F / T)
    best = (largest_min, smallest_max)
    best_width = -1
    # Larger size_min first, so ties keep the more balanced bounds.
    for size_min in range(largest_min, 0, -1):
        # The other T - 1 towers need at least size_min features each.
        size_max = num_features - (num_towers - 1) * size_min
        if max_size_ratio * size_min < size_max:
            size_max = math.floor(max_size_ratio * size_min + 1e-9)
        if size_max < smallest_max:
            continue
        if size_max - size_min > best_width:
            best, best_width = (size_min, size_max), size_max - size_min
    if best_width < 0 and max_size_ratio != 1.0:
        warnings.warn(
            f"max_size_ratio={max_size_ratio} cannot be met for {num_features} features in "
            f"{num_towers} towers (the most balanced split has sizes {largest_min} and "
            f"{smallest_max}); using the most balanced split",
            stacklevel=2,
        )
    return best


def default_kmeans_budget(num_features: int, num_towers: int) -> tuple[int, int]:
    """``(n_init, max_iter)`` scaled to the problem size ``F * T`` (min-cost-flow arcs)."""
    arcs = num_features * num_towers
    if arcs <= 100_000:
        return 10, 300
    if arcs <= 1_000_000:
        return 2, 100
    return 1, 50


def balanced_kmeans(
    coords: np.ndarray,
    num_towers: int,
    *,
    max_size_ratio: float = 1.0,
    seed: int = 0,
    n_init: int | None = None,
    max_iter: int | None = None,
) -> np.ndarray:
    """Assign ``F`` points to ``num_towers`` clusters with bounded cluster sizes.

    Args:
        coords: ``(F, n)`` embedded feature coordinates.
        num_towers: ``T``, between 1 and ``F``.
        max_size_ratio: see the module docstring (for ``1 < K < inf``, several size windows).
        seed: K-Means random state; equal seeds give equal labels.
        n_init, max_iter: K-Means restarts and iterations (default: :func:`default_kmeans_budget`).

    Returns:
        int64 ``(F,)`` tower label of every feature, labels in ``range(T)``.
    """
    coords = np.asarray(coords, dtype=np.float64)
    num_features = coords.shape[0]
    size_min, size_max = tower_size_bounds(num_features, num_towers, max_size_ratio)
    if num_towers == 1:
        return np.zeros(num_features, dtype=np.int64)
    if num_towers == num_features:
        return np.arange(num_features, dtype=np.int64)
    default_n_init, default_max_iter = default_kmeans_budget(num_features, num_towers)
    n_init = default_n_init if n_init is None else n_init
    max_iter = default_max_iter if max_iter is None else max_iter
    windows = _size_windows(coords, num_towers, max_size_ratio, (size_min, size_max), seed, n_init)
    best_labels: np.ndarray | None = None
    best_inertia = math.inf
    for window_min, window_max in windows:
        kmeans = KMeansConstrained(
            n_clusters=num_towers,
            size_min=window_min,
            size_max=window_max,
            n_init=n_init,
            max_iter=max_iter,
            random_state=seed,
        )
        labels = kmeans.fit_predict(coords)
        if best_labels is None or kmeans.inertia_ < best_inertia:
            best_labels, best_inertia = labels, kmeans.inertia_
    assert best_labels is not None
    return np.asarray(best_labels, dtype=np.int64)
