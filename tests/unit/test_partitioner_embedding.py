"""Affinity -> distance and the Euclidean embedding (Adam on the stress objective)."""

from __future__ import annotations

import numpy as np
import pytest
import torch

from dmt.partitioner.distance import affinity_to_distance
from dmt.partitioner.embedding import fit_euclidean_embedding, normalized_stress


def plane_points(num_points: int, seed: int, scale: float = 3.0) -> tuple[np.ndarray, np.ndarray]:
    points = np.random.default_rng(seed).normal(size=(num_points, 2)) * scale
    return points, np.linalg.norm(points[:, None] - points[None], axis=-1)


def test_distance_strategies():
    affinity = np.array([[1.0, 0.9, 0.2], [0.9, 1.0, 0.4], [0.2, 0.4, 1.0]])
    coherent = affinity_to_distance(affinity, "coherent")
    diverse = affinity_to_distance(affinity, "diverse")
    np.testing.assert_allclose(coherent, [[0.0, 0.1, 0.8], [0.1, 0.0, 0.6], [0.8, 0.6, 0.0]])
    np.testing.assert_allclose(diverse, [[0.0, 0.9, 0.2], [0.9, 0.0, 0.4], [0.2, 0.4, 0.0]])
    assert affinity[0, 0] == 1.0  # input untouched
    with pytest.raises(ValueError, match=r"strategy must be one of \['coherent', 'diverse'\]"):
        affinity_to_distance(affinity, "cohesive")


@pytest.mark.parametrize(("num_points", "seed"), [(12, 0), (40, 1)])
def test_recovers_planar_metric(num_points, seed):
    points, distances = plane_points(num_points, seed)
    coords, stress = fit_euclidean_embedding(distances, dim=2, steps=600, seed=seed)
    assert stress < 1e-3
    assert stress == pytest.approx(normalized_stress(coords, distances), abs=1e-12)
    recovered = np.linalg.norm(coords[:, None] - coords[None], axis=-1)
    np.testing.assert_allclose(recovered, distances, atol=1e-2 * distances.max())


def test_stress_decreases_with_steps():
    _, distances = plane_points(30, seed=2)
    stresses = [
        fit_euclidean_embedding(distances, steps=steps, restarts=1, seed=0)[1]
        for steps in (0, 20, 100, 500)
    ]
    assert all(a > b for a, b in zip(stresses, stresses[1:], strict=False)), stresses
    assert stresses[0] > 0.3 and stresses[-1] < 1e-3


def test_sampled_pairs_mode_recovers_metric():
    # 300 points, 16 random partners per point and step instead of all 299.
    _, distances = plane_points(300, seed=3)
    _, stress = fit_euclidean_embedding(distances, steps=1000, restarts=1, partners=16, seed=0)
    assert stress < 5e-3


def test_deterministic_by_seed():
    _, distances = plane_points(25, seed=4)
    a, stress_a = fit_euclidean_embedding(distances, steps=100, seed=7)
    b, stress_b = fit_euclidean_embedding(distances, steps=100, seed=7)
    c, _ = fit_euclidean_embedding(distances, steps=100, seed=8)
    np.testing.assert_array_equal(a, b)
    assert stress_a == stress_b
    assert not np.allclose(a, c)


def test_restores_thread_setting():
    before = torch.get_num_threads()
    fit_euclidean_embedding(plane_points(5, seed=0)[1], steps=5)
    assert torch.get_num_threads() == before


def test_coincident_points_are_gradient_safe():
    # Three identical features (distance 0 among them) and one far away.
    distances = np.array([[0, 0, 0, 1], [0, 0, 0, 1], [0, 0, 0, 1], [1, 1, 1, 0]], dtype=np.float64)
    coords, stress = fit_euclidean_embedding(distances, steps=300, seed=0)
    assert np.isfinite(coords).all()
    assert stress < 1e-2


def test_degenerate_inputs():
    coords, stress = fit_euclidean_embedding(np.zeros((5, 5)), dim=3)
    assert coords.shape == (5, 3) and stress == 0.0
    coords, stress = fit_euclidean_embedding(np.zeros((1, 1)))
    assert coords.shape == (1, 2) and stress == 0.0
    with pytest.raises(ValueError, match=r"square \(F, F\) matrix, got shape \(2, 3\)"):
        fit_euclidean_embedding(np.zeros((2, 3)))
    with pytest.raises(ValueError, match="finite and non-negative"):
        fit_euclidean_embedding(-np.ones((3, 3)))


def test_sampled_gradient_is_unbiased():
    from dmt.partitioner.embedding import _FullBatch, _SampledOffsets

    _, distances = plane_points(12, seed=5)
    target = torch.from_numpy(distances.astype(np.float32))
    x = torch.randn(12, 2, generator=torch.Generator().manual_seed(0))
    exact = _FullBatch(target).gradient(x)
    sampled = _SampledOffsets(target, partners=3, generator=torch.Generator().manual_seed(1))
    mean = torch.stack([sampled.gradient(x) for _ in range(4000)]).mean(0)
    torch.testing.assert_close(mean, exact, atol=0.03 * exact.abs().max().item(), rtol=0)


def test_sampled_regime_recovers_blocks():
    from sklearn.metrics import adjusted_rand_score

    from dmt.partitioner.clustering import balanced_kmeans
    from dmt.partitioner.synthetic import planted_affinity

    affinity, blocks = planted_affinity([50] * 8, noise=0.1, seed=0)
    distances = affinity_to_distance(affinity, "coherent")
    coords, _ = fit_euclidean_embedding(distances, restarts=1, steps=400, partners=32)
    labels = balanced_kmeans(coords, 8, seed=0)
    assert adjusted_rand_score(blocks, labels) >= 0.9


def test_the_diagonal_of_the_distances_is_ignored():
    """normalized_stress is sqrt(sum (d - D)^2 / sum D^2) over the pairs i < j: a non-zero
    diagonal changes nothing."""
    points, distances = plane_points(6, seed=3)
    coords = points + np.random.default_rng(4).normal(size=points.shape) * 0.1
    expected = normalized_stress(coords, distances)
    fitted = np.linalg.norm(coords[:, None] - coords[None], axis=-1)
    pairs = np.triu_indices(6, 1)
    error = np.square(fitted - distances)[pairs].sum()
    assert expected == pytest.approx(np.sqrt(error / np.square(distances)[pairs].sum()), rel=1e-12)
    assert normalized_stress(coords, distances + np.eye(6)) == expected
