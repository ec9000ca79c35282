"""Affinity to distance, ``D = f(I)`` (TP step 1, paper §3.3).

The two strategies of the paper:

- ``coherent``: ``D = 1 - I``. Related features are close, so they end up in the same tower.
- ``diverse``: ``D = I``. Related features are far apart, so each tower mixes unrelated ones.

The diagonal of ``D`` is 0 in both cases.
"""

from __future__ import annotations

from typing import Literal, get_args

import numpy as np

__all__ = ["STRATEGIES", "Strategy", "affinity_to_distance", "check_strategy"]

Strategy = Literal["coherent", "diverse"]
STRATEGIES: tuple[str, ...] = get_args(Strategy)


def check_strategy(strategy: str) -> Strategy:
    """Return ``strategy`` if it is one of :data:`STRATEGIES`, else raise ``ValueError``."""
    if strategy not in STRATEGIES:
        raise ValueError(f"strategy must be one of {list(STRATEGIES)}, got {strategy!r}")
    return strategy  # type: ignore[return-value]


def affinity_to_distance(affinity: np.ndarray, strategy: str = "coherent") -> np.ndarray:
    """Distance matrix for the Euclidean embedding.

    Args:
        affinity: ``(F, F)`` affinity ``I`` with values in [0, 1] (see
            :func:`dmt.partitioner.affinity.check_affinity`).
        strategy: ``"coherent"`` (``1 - I``) or ``"diverse"`` (``I``).

    Returns:
        A new float64 ``(F, F)`` array ``D`` with a zero diagonal.
    """
    strategy = check_strategy(strategy)
    affinity = np.asarray(affinity, dtype=np.float64)
    distance = 1.0 - affinity if strategy == "coherent" else affinity.copy()
    np.fill_diagonal(distance, 0.0)
    return distance
