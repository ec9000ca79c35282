"""Euclidean embedding of a feature distance matrix (TP step 2, paper §3.3).

Features are placed at coordinates ``X`` (``(F, n)``, ``n`` = ``dim``) whose pairwise distances
``d_ij = ||X_i - X_j||`` match the target distances ``D`` (``(F, F)``) in the least-squares sense
(metric MDS "stress"), using Adam:

    min_X  sum_{i<j} (d_ij - D_ij)^2

Scaling to many features: the full pair matrix of 10,000 features has 10^8 entries, too many to
touch on every step on a CPU. When the number of pairs ``F (F - 1) / 2`` exceeds
``pairs_per_step``, each step uses a stratified sample instead: every feature is the anchor of
``pairs_per_step // F`` pairs whose partner is drawn uniformly among the other features. Every
feature therefore gets a gradient on every step, and the sampled loss is an unbiased estimate of the
full objective (up to a constant factor). Smaller problems use all pairs on every step. The
stress that selects the best restart (and that is returned) is always the exact one, computed over
all pairs in row chunks.
"""

from __future__ import annotations

import math
from collections.abc import Iterator
from contextlib import contextmanager

import numpy as np
import torch

__all__ = ["fit_euclidean_embedding", "normalized_stress"]

# Keeps sqrt differentiable where two points coincide: the gradient (X_i - X_j) / d is then 0.
_SQRT_EPS = 1e-12
# Rows of the pair matrix evaluated at once when computing the exact stress.
_STRESS_CHUNK_ELEMENTS = 1 << 22


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
    rows = max(1, _STRESS_CHUNK_ELEMENTS // max(1, num_features))
    num = 0.0
    den = 0.0
    for start in range(0, num_features, rows):
        stop = min(num_features, start + rows)
        target = torch.as_tensor(distances[start:stop], dtype=torch.float64)
        # Upper triangle only: column j > row i.
        mask = torch.arange(num_features)[None, :] > torch.arange(start, stop)[:, None]
        # The mm-based formula loses precision for near-coincident points; stress must be exact.
        d = torch.cdist(x[start:stop], x, compute_mode="donot_use_mm_for_euclid_dist")
        num += float(((d - target) ** 2)[mask].sum())
        den += float((target**2)[mask].sum())
    return num, den


def fit_euclidean_embedding(
    distances: np.ndarray,
    dim: int = 2,
    *,
    restarts: int = 4,
    steps: int = 1000,
    lr: float = 0.05,
    pairs_per_step: int = 1 << 17,
    seed: int = 0,
) -> tuple[np.ndarray, float]:
    """Embed ``F`` items in ``dim``-dimensional Euclidean space so distances match ``distances``.

    Args:
        distances: ``(F, F)`` symmetric, non-negative target distances ``D`` (diagonal ignored).
        dim: embedding dimension ``n`` (the paper uses ``n < N``; 2 is a good default).
        restarts: independent random initializations; the one with the lowest exact stress wins.
        steps: Adam steps per restart (learning rate follows a cosine decay to ``lr / 1000``).
        lr: initial Adam learning rate, relative to the mean target distance (targets are
            rescaled to mean 1 internally, so ``lr`` does not depend on the scale of ``D``).
        pairs_per_step: pair budget per step; all pairs are used when there are at most this
            many, otherwise a stratified sample (see module docstring).
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
    if restarts < 1 or steps < 0 or pairs_per_step < 1:
        raise ValueError(
            "restarts and pairs_per_step must be >= 1 and steps >= 0, got "
            f"restarts={restarts}, steps={steps}, pairs_per_step={pairs_per_step}"
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
    target = torch.from_numpy(np.asarray(distances, dtype=np.float32)) / scale

    generator = torch.Generator().manual_seed(seed)
    best_x: torch.Tensor | None = None
    best_num = math.inf
    den = 0.0
    for _ in range(restarts):
        with _single_intra_op_thread():
            x = _fit_once(target, dim, steps, lr, pairs_per_step, generator)
        num, den = _stress_terms(x.double() * scale, distances)
        if num < best_num:
            best_num, best_x = num, x
    assert best_x is not None
    coords = best_x.double().numpy() * scale
    return coords, math.sqrt(best_num / den)


def _fit_once(
    target: torch.Tensor,
    dim: int,
    steps: int,
    lr: float,
    pairs_per_step: int,
    generator: torch.Generator,
) -> torch.Tensor:
    """One Adam run from a random start; ``target`` has mean off-diagonal distance 1.

    The gradient is written out rather than taken by autograd: for anchor ``i`` and partners
    ``j``, ``dL/dX_i = sum_j 2 (d_ij - D_ij) (X_i - X_j) / d_ij``. With all partners this is the
    exact gradient of the objective; with sampled partners it is an unbiased estimate (each pair
    is seen from both ends in expectation), and needs no scatter-add, which keeps a step cheap.
    """
    num_features = target.shape[0]
    # Gaussian start whose mean pairwise distance is about 1, the mean target distance.
    x = torch.randn(num_features, dim, generator=generator) / math.sqrt(2 * dim)
    optimizer = torch.optim.Adam([x], lr=lr)
    scheduler = torch.optim.lr_scheduler.CosineAnnealingLR(optimizer, max(1, steps), lr * 1e-3)

    full_batch = num_features * (num_features - 1) // 2 <= pairs_per_step
    if full_batch:
        # Every feature against every feature; the i == j terms contribute exactly 0.
        partners = torch.arange(num_features).expand(num_features, num_features)
        pair_targets = target
    else:
        per_anchor = max(1, pairs_per_step // num_features)
        anchors = torch.arange(num_features)[:, None]
        flat_target = target.reshape(-1)

    for _ in range(steps):
        if not full_batch:
            offsets = torch.randint(
                1, num_features, (num_features, per_anchor), generator=generator
            )
            partners = (anchors + offsets) % num_features
            pair_targets = flat_target[anchors * num_features + partners]
        diff = x[:, None, :] - x[partners]  # (F, k, n)
        d = torch.sqrt((diff * diff).sum(-1) + _SQRT_EPS)
        weight = (d - pair_targets) / d
        x.grad = (weight[..., None] * diff).sum(1) / partners.shape[1]
        optimizer.step()
        scheduler.step()
    return x
