"""Planted block affinities with a known answer, for tests and benchmarks."""

from __future__ import annotations

from collections.abc import Sequence

import numpy as np

__all__ = ["planted_affinity"]


def planted_affinity(
    block_sizes: Sequence[int],
    *,
    within: float = 0.8,
    across: float = 0.1,
    noise: float = 0.05,
    shuffle: bool = True,
    seed: int = 0,
) -> tuple[np.ndarray, np.ndarray]:
    """A symmetric ``(F, F)`` affinity of planted feature blocks plus Gaussian noise.

    Args:
        block_sizes: number of features in each block (``F = sum(block_sizes)``).
        within: mean affinity between two features of the same block.
        across: mean affinity between features of different blocks.
        noise: standard deviation of the symmetric Gaussian noise (values are clipped to [0, 1]).
        shuffle: randomly permute the features so blocks are not contiguous.
        seed: seed of the noise and the permutation.

    Returns:
        ``(affinity, blocks)``: float64 ``(F, F)`` with a unit diagonal, and int64 ``(F,)`` block
        label of each feature.
    """
    rng = np.random.default_rng(seed)
    blocks = np.repeat(np.arange(len(block_sizes)), block_sizes)
    if shuffle:
        blocks = blocks[rng.permutation(len(blocks))]
    num_features = len(blocks)
    affinity = rng.standard_normal((num_features, num_features), dtype=np.float32).astype(
        np.float64
    )
    affinity *= noise / np.sqrt(2)
    affinity += affinity.T.copy()
    same = blocks[:, None] == blocks[None, :]
    affinity += np.where(same, within, across)
    np.clip(affinity, 0.0, 1.0, out=affinity)
    np.fill_diagonal(affinity, 1.0)
    return affinity, blocks.astype(np.int64)
