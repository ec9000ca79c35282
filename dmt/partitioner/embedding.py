"""Euclidean embedding of a feature distance matrix (TP step 2, paper §3.3).

Features are placed at coordinates ``X`` (``(F, n)``, ``n`` = ``dim``) whose pairwise distances
``d_ij = ||X_i - X_j||`` match the target distances ``D`` (``(F, F)``) in the least-squares sense
(metric MDS "stress"), using Adam:

    min_X  sum_{i<j} (d_ij - D_ij)^2

The gradient is written out rather than taken by autograd:
``dL/dX_i = sum_j 2 (d_ij - D_ij) (X_i - X_j) / d_ij``.

Scaling to many features: the pair matrix of 10,000 features has 10^8 entries, too many to touch
on every step on a CPU. When ``F - 1 > partners``, every step instead draws ``partners`` random
offsets ``o`` and uses the pairs ``(r, r + o mod F)`` of all features ``r`` (in a fixed random
order of the features). Every feature thus meets ``partners`` uniformly random partners per step,
and its gradient estimate is unbiased. Offsets shared by all features make a step cheap: the
partners' coordinates are contiguous slices, and the targets of one offset, ``D[r, r + o]``, are
one contiguous row of a re-laid-out float32 copy of ``D`` built once. Memory: two float32
``F x F`` buffers during the set-up (0.8 GB at ``F = 10,000``), one while optimizing.

The number of partners matters more than the number of steps: in the coherent case the pairs
that shape the result are the few small distances inside groups of related features, and too few
of them per step leave Adam's updates dominated by noise (64 planted blocks in 2,000 features:
16 partners per step gave an unrecognizable partition, 64 most of it, 128 all of it). The stress
that selects the best restart (and that is returned) is always the exact one, over all pairs.
"""

from __future__ import annotations

import math
import operator
from collections.abc import Iterator
from contextlib import contextmanager

import numpy as np
import torch

__all__ = ["fit_euclidean_embedding", "normalized_stress"]

# Floor on a distance before dividing by it (targets are scaled to mean 1).
_MIN_DISTANCE = 1e-6
# Elements of the pair matrix processed at once outside the optimization loop.
_CHUNK_ELEMENTS = 1 << 22


@contextmanager
def _single_intra_op_thread() -> Iterator[None]:
    """Run torch ops on one thread, restoring the previous setting afterwards.

    An Adam step here is a handful of ops on ~10^5 elements; splitting them across threads only
    adds synchronization, and on a busy 2-core machine it made the loop 10-50x slower.
    """
    previous = torch.get_num_threads()
    torch.set_num_threads(1)
    try:
        yield
    finally:
        torch.set_num_threads(previous)


def normalized_stress(coords: np.ndarray | torch.Tensor, distances: np.ndarray) -> float:
    """Normalized stress ``sqrt(sum_{i<j} (d_ij - D_ij)^2 / sum_{i<j} D_ij^2)``.

    Args:
        coords: ``(F, n)`` coordinates.
        distances: ``(F, F)`` symmetric target distances ``D``.

    Returns:
        The normalized stress, 0 for a perfect embedding (and when all ``D`` are 0 and all points
        coincide). Computed in float64 over all pairs, chunked to bound memory.
    """
    x = torch.as_tensor(np.asarray(coords), dtype=torch.float64)
    num, den = _stress_terms(x, np.asarray(distances))
    if den == 0.0:
        return 0.0 if num == 0.0 else math.inf
    return math.sqrt(num / den)


def _stress_terms(x: torch.Tensor, distances: np.ndarray) -> tuple[float, float]:
    """``sum_{i<j} (d_ij - D_ij)^2`` and ``sum_{i<j} D_ij^2``, exact, in float64."""
    num_features = x.shape[0]
    rows = max(1, _CHUNK_ELEMENTS // max(1, num_features))
    num = 0.0
    den = 0.0
    for start in range(0, num_features, rows):
        stop = min(num_features, start + rows)
        target = torch.as_tensor(distances[start:stop], dtype=torch.float64)
        upper = torch.arange(num_features)[None, :] > torch.arange(start, stop)[:, None]
        # The mm-based formula loses precision for near-coincident points; stress must be exact.
        d = torch.cdist(x[start:stop], x, compute_mode="donot_use_mm_for_euclid_dist")
        num += float(((d - target) ** 2)[upper].sum())
        den += float((target**2)[upper].sum())
    return num, den


def fit_euclidean_embedding(
    distances: np.ndarray,
    dim: int = 2,
    *,
    restarts: int = 4,
    steps: int = 1000,
    lr: float = 0.05,
    partners: int = 128,
    seed: int = 0,
) -> tuple[np.ndarray, float]:
    """Embed ``F`` items in ``dim``-dimensional Euclidean space so distances match ``distances``.

    Args:
        distances: ``(F, F)`` symmetric, non-negative target distances ``D`` (diagonal ignored).
        dim: embedding dimension ``n`` (the paper uses ``n < N``; 2 is the usual choice).
        restarts: independent random initializations; the one with the lowest exact stress wins.
        steps: Adam steps per restart (learning rate follows a cosine decay to ``lr / 1000``).
        lr: initial Adam learning rate, relative to the mean target distance (targets are
            rescaled to mean 1 internally, so ``lr`` does not depend on the scale of ``D``).
        partners: random partners per feature and step; with ``F - 1 <= partners`` every step
            uses all pairs (the exact gradient). See the module docstring.
        seed: seeds the initializations and the pair sampling; equal seeds give equal results.

    Returns:
        ``(X, stress)``: ``X`` float64 ``(F, dim)`` coordinates in the units of ``distances`` and
        the normalized stress ``sqrt(sum (d - D)^2 / sum D^2)`` over pairs ``i < j``.

    Example::

        >>> pts = np.random.default_rng(0).normal(size=(20, 2))
        >>> D = np.linalg.norm(pts[:, None] - pts[None], axis=-1)
        >>> X, stress = fit_euclidean_embedding(D, dim=2)  # stress close to 0
    """
    distances = np.asarray(distances)
    if distances.ndim != 2 or distances.shape[0] != distances.shape[1]:
        raise ValueError(f"distances must be a square (F, F) matrix, got shape {distances.shape}")
    if dim < 1:
        raise ValueError(f"dim must be >= 1, got {dim}")
    if restarts < 1 or steps < 0 or partners < 1:
        raise ValueError(
            "restarts and partners must be >= 1 and steps >= 0, got "
            f"restarts={restarts}, steps={steps}, partners={partners}"
        )
    num_features = distances.shape[0]
    if num_features < 2:
        return np.zeros((num_features, dim)), 0.0
    if not np.isfinite(distances).all() or (distances < 0).any():
        raise ValueError("distances must be finite and non-negative")

    off_diagonal_sum = float(distances.sum(dtype=np.float64) - np.trace(distances))
    scale = off_diagonal_sum / (num_features * (num_features - 1))
    if scale == 0.0:
        # All targets are 0: every feature at the origin is an exact solution.
        return np.zeros((num_features, dim)), 0.0

    # operator.index: a NumPy integer seed is a seed (torch's manual_seed takes Python ints only)
    generator = torch.Generator().manual_seed(operator.index(seed))
    target = torch.from_numpy(np.asarray(distances, dtype=np.float32)) / scale
    fit: _FullBatch | _SampledOffsets
    if num_features - 1 <= partners:
        fit = _FullBatch(target)
    else:
        fit = _SampledOffsets(target, partners, generator)
    del target

    best_x: torch.Tensor | None = None
    best_num = math.inf
    den = 0.0
    for _ in range(restarts):
        # Gaussian start whose mean pairwise distance is about 1, the mean target distance.
        x = torch.randn(num_features, dim, generator=generator) / math.sqrt(2 * dim)
        with _single_intra_op_thread():
            _adam(x, fit, steps, lr)
        num, den = _stress_terms(x.double() * scale, distances)
        if num < best_num:
            best_num, best_x = num, x
    assert best_x is not None
    return best_x.double().numpy() * scale, math.sqrt(best_num / den)


def _adam(x: torch.Tensor, fit: _FullBatch | _SampledOffsets, steps: int, lr: float) -> None:
    """Optimize ``x`` in place with Adam and a cosine learning-rate decay."""
    optimizer = torch.optim.Adam([x], lr=lr)
    scheduler = torch.optim.lr_scheduler.CosineAnnealingLR(optimizer, max(1, steps), lr * 1e-3)
    for _ in range(steps):
        x.grad = fit.gradient(x)
        optimizer.step()
        scheduler.step()


def _norm_over_first_dim(diff: torch.Tensor) -> torch.Tensor:
    """``||diff||`` over dim 0 (size ``n``), clamped away from 0 so that it can divide.

    Where two points coincide their difference is 0, so the gradient term
    ``(d - D) / d * (X_i - X_j)`` is 0 whatever the clamp. (An explicit loop: reductions over a
    short leading dim are slow in torch on CPU.)
    """
    squared = diff[0] * diff[0]
    for coordinate in diff[1:]:
        squared.addcmul_(coordinate, coordinate)
    return squared.sqrt_().clamp_min_(_MIN_DISTANCE)


class _FullBatch:
    """Exact gradient over all pairs (``F^2`` terms per step; for small ``F``)."""

    def __init__(self, target: torch.Tensor) -> None:
        self.target = target.clone()

    def gradient(self, x: torch.Tensor) -> torch.Tensor:
        xt = x.T  # (n, F)
        diff = xt[:, :, None] - xt[:, None, :]  # (n, F, F); i == j terms are exactly 0
        weight = 1.0 - self.target / _norm_over_first_dim(diff)
        return (weight[None] * diff).sum(2).T / (x.shape[0] - 1)


class _SampledOffsets:
    """Unbiased gradient estimate from random offsets (see the module docstring).

    Features are visited in a fixed random order ``perm`` so that offsets do not follow any
    structure of the original feature order. ``shifted[o, r] = D[perm[r], perm[(r + o) % F]]``.
    """

    def __init__(self, target: torch.Tensor, partners: int, generator: torch.Generator) -> None:
        num_features = target.shape[0]
        self.partners = partners
        self.generator = generator
        self.perm = torch.randperm(num_features, generator=generator)
        positions = torch.arange(num_features)
        flat = target.reshape(-1)
        self.shifted = torch.empty(num_features, num_features, dtype=target.dtype)
        rows = max(1, _CHUNK_ELEMENTS // num_features)
        for start in range(0, num_features, rows):
            offset = torch.arange(start, min(num_features, start + rows))[:, None]
            partner = self.perm[(positions[None, :] + offset) % num_features]
            self.shifted[start : start + rows] = flat[self.perm[None, :] * num_features + partner]

    def gradient(self, x: torch.Tensor) -> torch.Tensor:
        num_features = x.shape[0]
        offsets = torch.randint(1, num_features, (self.partners,), generator=self.generator)
        xt = x[self.perm].T.contiguous()  # (n, F) in visiting order
        doubled = torch.cat([xt, xt], dim=1)
        # Contiguous slices: partner of position r under offset o is position r + o (mod F).
        partner = torch.stack([doubled[:, o : o + num_features] for o in offsets.tolist()], 1)
        diff = xt[:, None, :] - partner  # (n, k, F)
        weight = 1.0 - self.shifted.index_select(0, offsets) / _norm_over_first_dim(diff)
        grad = torch.empty_like(x)
        grad[self.perm] = (weight[None] * diff).sum(1).T / self.partners
        return grad
