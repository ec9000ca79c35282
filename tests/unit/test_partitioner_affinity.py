"""Feature affinity: streaming accumulator, model hook, validation and files."""

from __future__ import annotations

import json

import numpy as np
import pytest
import torch

from dmt.partitioner.affinity import (
    AffinityAccumulator,
    check_affinity,
    compute_affinity,
    load_affinity,
    model_affinity,
    save_affinity,
    sidecar_path,
)


def brute_force_affinity(samples: np.ndarray) -> np.ndarray:
    """Reference: |mean over samples of cos| between every pair of feature vectors (paper
    §3.3: I = abs(K), K = mean(R R^T, dim=0)), float64."""
    num_samples, num_features, _ = samples.shape
    total = np.zeros((num_features, num_features))
    for b in range(num_samples):
        for i in range(num_features):
            for j in range(num_features):
                u, v = samples[b, i], samples[b, j]
                nu, nv = np.linalg.norm(u), np.linalg.norm(v)
                total[i, j] += 0.0 if nu == 0 or nv == 0 else (u @ v) / (nu * nv)
    result = np.abs(total / num_samples)
    np.fill_diagonal(result, 1.0)
    return result


def random_batches(seed: int, sizes=(5, 3, 7), num_features=6, dim=4):
    generator = torch.Generator().manual_seed(seed)
    batches = [torch.randn(b, num_features, dim, generator=generator) for b in sizes]
    batches[1][0, 2] = 0.0  # an empty bag: contributes cosine 0
    return batches


@pytest.mark.parametrize("chunk_elements", [1, 7, 72, 1 << 22])  # 72: blocks of 2 samples
def test_accumulator_matches_brute_force(chunk_elements):
    batches = random_batches(seed=0)
    accumulator = AffinityAccumulator(chunk_elements=chunk_elements)
    for batch in batches:
        accumulator.update(batch)
    expected = brute_force_affinity(torch.cat(batches).double().numpy())
    result = accumulator.result()
    assert accumulator.num_samples == 15
    assert result.dtype == np.float64
    np.testing.assert_allclose(result, expected, atol=1e-6)
    assert np.array_equal(result, result.T)
    assert np.all(np.diag(result) == 1.0)


def test_compute_affinity_accepts_per_feature_lists():
    batches = random_batches(seed=1)
    as_lists = [list(batch.unbind(dim=1)) for batch in batches]
    np.testing.assert_allclose(compute_affinity(as_lists), compute_affinity(batches), atol=1e-12)


def test_affinity_sign_and_scale_invariant():
    # abs(mean cos) ignores a consistent sign and length: features 0 and 1 are the same
    # direction up to -3x in every sample
    base = torch.randn(10, 1, 8)
    pooled = torch.cat([base, -3 * base, torch.randn(10, 1, 8)], dim=1)
    result = compute_affinity([pooled])
    assert result[0, 1] == pytest.approx(1.0, abs=1e-6)
    assert result[0, 2] < 0.9


def test_a_sign_that_flips_between_samples_is_no_affinity():
    # the paper averages the cosines before the absolute value: feature 1 is feature 0 with a
    # random sign per sample, related in no coherent way (the mean of |cos| rated it about 0.9,
    # and unrelated feature 2 about 0.2)
    generator = torch.Generator().manual_seed(0)
    base = torch.randn(4000, 1, 16, generator=generator)
    sign = torch.randint(0, 2, (4000, 1, 1), generator=generator) * 2.0 - 1.0
    other = torch.randn(4000, 1, 16, generator=generator)
    result = compute_affinity([torch.cat([base, sign * base, other], dim=1)])
    assert result[0, 1] < 0.05 and result[0, 2] < 0.05 and result[1, 2] < 0.05


def test_different_embedding_dims_name_both_features():
    accumulator = AffinityAccumulator(["cat_0", "cat_1", "cat_2"])
    tensors = [torch.randn(4, 8), torch.randn(4, 8), torch.randn(4, 16)]
    with pytest.raises(
        ValueError,
        match=r"feature 0 \('cat_0'\) has embedding dim 8 but feature 2 \('cat_2'\) has "
        r"embedding dim 16",
    ):
        accumulator.update(tensors)


def test_accumulator_errors():
    with pytest.raises(ValueError, match=r"must have shape \(B, F, N\), got \(4, 3\)"):
        AffinityAccumulator().update(torch.randn(4, 3))
    accumulator = AffinityAccumulator()
    accumulator.update(torch.randn(2, 3, 4))
    with pytest.raises(ValueError, match="expected pooled embeddings of 3 features, got 5"):
        accumulator.update(torch.randn(2, 5, 4))
    with pytest.raises(ValueError, match="no samples accumulated"):
        AffinityAccumulator().result()
    # a KeyedTensor.to_dict() itself: iterating it gave the names ('str' has no attribute 'dim')
    pooled = {"cat_0": torch.randn(2, 4), "cat_1": torch.randn(2, 4)}
    with pytest.raises(TypeError) as error:
        AffinityAccumulator().update(pooled)
    assert str(error.value) == (
        "pooled embeddings must be a (B, F, N) tensor or a sequence of F (B, N) tensors, got a "
        "mapping (e.g. KeyedTensor.to_dict()); pass its tensors in feature order, e.g. "
        "[pooled[name] for name in feature_names]"
    )


def test_non_finite_pooled_embeddings_name_the_features():
    # result() returned NaN rows and columns (not an affinity in [0, 1]), and the error came
    # only from the partition, naming a matrix entry instead of the features
    batches = random_batches(seed=2)
    batches[1][1, 2] = float("nan")
    batches[2][0, 4, 1] = float("inf")
    accumulator = AffinityAccumulator([f"cat_{i}" for i in range(6)])
    for batch in batches:
        accumulator.update(batch)
    with pytest.raises(ValueError) as error:
        accumulator.result()
    assert str(error.value) == (
        "pooled embeddings of feature 2 ('cat_2'), feature 4 ('cat_4') hold NaN or inf in some "
        "of the 15 samples; the affinity needs finite embeddings (a model whose training "
        "diverged?)"
    )


def test_model_affinity_uses_ebc_outputs():
    from torchrec import EmbeddingBagCollection, EmbeddingBagConfig, KeyedJaggedTensor
    from torchrec.datasets.utils import Batch

    torch.manual_seed(0)
    names = ["cat_0", "cat_1", "cat_2"]
    ebc = EmbeddingBagCollection(
        tables=[
            EmbeddingBagConfig(name=f"t_{n}", embedding_dim=4, num_embeddings=10, feature_names=[n])
            for n in names
        ]
    )
    model = torch.nn.Module()
    model.embedding_bag_collection = ebc

    def make_batch(seed: int) -> Batch:
        generator = torch.Generator().manual_seed(seed)
        lengths = torch.randint(1, 3, (len(names) * 5,), generator=generator)
        values = torch.randint(0, 10, (int(lengths.sum()),), generator=generator)
        kjt = KeyedJaggedTensor.from_lengths_sync(keys=names, values=values, lengths=lengths)
        return Batch(torch.zeros(5, 1), kjt, torch.zeros(5))

    batches = [make_batch(seed) for seed in range(3)]
    result, order = model_affinity(model, batches, max_batches=2)
    assert order == names
    pooled = [ebc(b.sparse_features).values().detach().view(5, 3, 4) for b in batches[:2]]
    np.testing.assert_allclose(result, brute_force_affinity(torch.cat(pooled).numpy()), atol=1e-5)

    reordered, reorder_names = model_affinity(model, batches, feature_names=names[::-1])
    assert reorder_names == names[::-1]
    full, _ = model_affinity(model, batches)
    np.testing.assert_allclose(reordered, full[::-1, ::-1], atol=1e-12)


@pytest.mark.parametrize(
    ("matrix", "message"),
    [
        (np.ones((2, 3)), r"non-empty square \(F, F\) matrix, got shape \(2, 3\)"),
        (np.ones(4), r"square \(F, F\) matrix, got shape \(4,\)"),
        (np.array([[1.0, np.nan], [np.nan, 1.0]]), r"NaN or infinite values \(first at \[0, 1\]"),
        (np.array([[1.0, 1.5], [1.5, 1.0]]), r"must lie in \[0, 1\].*got 1.5 at \[0, 1\]"),
        (np.array([[1.0, -0.1], [-0.1, 1.0]]), r"must lie in \[0, 1\].*got -0.1 at \[0, 1\]"),
        (np.array([[1.0, 0.2], [0.3, 1.0]]), r"must be symmetric.*affinity\[0, 1\] = 0.2"),
        (np.array([[1.0, 0.2], [0.20001, 1.0]]), r"must be symmetric.*1e-05 > 1e-06"),
    ],
)
def test_check_affinity_errors(matrix, message):
    with pytest.raises(ValueError, match=message):
        check_affinity(matrix)


def test_save_load_roundtrip(tmp_path):
    matrix = compute_affinity(random_batches(seed=2))
    names = [f"f{i}" for i in range(6)]
    path = tmp_path / "affinity.npy"
    sidecar = save_affinity(path, matrix, names)
    assert sidecar == sidecar_path(path) == tmp_path / "affinity.features.json"
    assert json.loads(sidecar.read_text()) == {"feature_names": names}
    loaded, loaded_names = load_affinity(path)
    np.testing.assert_array_equal(loaded, matrix)
    assert loaded_names == names

    sidecar.unlink()
    with pytest.warns(UserWarning, match="no feature-name sidecar"):
        _, default_names = load_affinity(path)
    assert default_names == [f"cat_{i}" for i in range(6)]

    with pytest.raises(ValueError, match="must end in .npy"):
        save_affinity(tmp_path / "affinity.bin", matrix, names)
    with pytest.raises(ValueError, match="got 2 feature names for a 6 x 6 affinity"):
        save_affinity(path, matrix, names[:2])


def test_model_affinity_of_a_dmt_model_equals_its_base_model():
    """A DMT model holds one collection per tower; its affinity (in the data's feature order) is
    that of the base model whose tables it copied."""
    from torchrec import KeyedJaggedTensor
    from torchrec.datasets.utils import Batch

    from dmt.config import DotInteractionConfig, ModelConfig, PartitionConfig
    from dmt.models import build_model
    from dmt.models.dmt import copy_base_weights

    torch.manual_seed(0)
    names = [f"cat_{i}" for i in range(5)]
    common = dict(feature_names=names, cardinalities=[10] * 5, num_dense=2)
    dot = DotInteractionConfig()
    base = build_model(
        ModelConfig(
            name="dlrm", interaction=dot, embedding_dim=4, bottom_mlp=[8, 4], top_mlp=[8, 1]
        ),
        **common,
    )
    towers = [["cat_3", "cat_0"], ["cat_1", "cat_4", "cat_2"]]
    dmt_cfg = ModelConfig(
        name="dlrm",
        interaction=dot,
        embedding_dim=4,
        bottom_mlp=[8, 4],
        top_mlp=[8, 1],
        partition=PartitionConfig(kind="explicit", towers=towers),
    )
    dmt_model = build_model(dmt_cfg, **common)
    copy_base_weights(dmt_model, base)

    def make_batch(seed: int) -> Batch:
        generator = torch.Generator().manual_seed(seed)
        lengths = torch.randint(0, 3, (len(names) * 6,), generator=generator)
        values = torch.randint(0, 10, (int(lengths.sum()),), generator=generator)
        kjt = KeyedJaggedTensor.from_lengths_sync(keys=names, values=values, lengths=lengths)
        return Batch(torch.zeros(6, 2), kjt, torch.zeros(6))

    batches = [make_batch(seed) for seed in range(3)]
    expected, _ = model_affinity(base, batches, feature_names=names)
    result, order = model_affinity(dmt_model, batches, feature_names=names)
    assert order == names
    np.testing.assert_allclose(result, expected, atol=1e-12)
    # default order: the towers' outputs in tower order
    _, tower_order = model_affinity(dmt_model, batches)
    assert tower_order == ["cat_3", "cat_0", "cat_1", "cat_4", "cat_2"]


def test_model_affinity_names_what_it_needs():
    with pytest.raises(ValueError, match="Linear has no embedding_bag_collection .* and no towers"):
        model_affinity(torch.nn.Linear(2, 2), [])


@pytest.mark.parametrize(
    ("sidecar_text", "matrix", "message"),
    [
        (
            '{"names": []}',
            None,
            "feature-name sidecar '{sidecar}' has no 'feature_names' list of names; expected "
            '{{"feature_names": [<one name per affinity row>]}}',
        ),
        (
            '{"feature_names": [',
            None,
            "feature-name sidecar '{sidecar}' is not valid JSON (Expecting value: line 1 column "
            '20 (char 19)); expected {{"feature_names": [<one name per affinity row>]}}',
        ),
        (
            '{"feature_names": ["a", "b", "a", "c", "b", "d"]}',
            None,
            "feature-name sidecar '{sidecar}' lists feature(s) ['a', 'b'] more than once; "
            "feature names must be unique",
        ),
        (
            None,
            np.triu(np.full((3, 3), 0.5)),
            "affinity file '{path}': affinity must be symmetric, but affinity[0, 1] = 0.5 and "
            "affinity[1, 0] = 0.0 (difference 0.5 > 1e-06)",
        ),
        (
            None,
            np.eye(3) + 0.5j,  # as a float array, its imaginary parts would be dropped
            "affinity file '{path}': affinity must hold real numbers, got dtype complex128",
        ),
        (
            None,
            np.array([["1", "0"], ["0", "1"]]),
            "affinity file '{path}': affinity must hold real numbers, got dtype <U1",
        ),
    ],
    ids=[
        "sidecar-without-names",
        "sidecar-not-json",
        "sidecar-duplicates",
        "not-symmetric",
        "complex",
        "strings",
    ],
)
def test_load_affinity_errors_name_the_file(tmp_path, sidecar_text, matrix, message):
    path = tmp_path / "affinity.npy"
    np.save(path, np.eye(6) if matrix is None else matrix)
    if sidecar_text is not None:
        sidecar_path(path).write_text(sidecar_text)
    with pytest.raises(ValueError) as error:
        load_affinity(path)
    assert str(error.value) == message.format(path=path, sidecar=sidecar_path(path))


def test_load_affinity_of_a_file_that_is_not_npy(tmp_path):
    expected = "expected an (F, F) float array saved with numpy.save (as save_affinity writes)"
    junk = tmp_path / "junk.npy"
    junk.write_text("not a npy")
    with pytest.raises(ValueError) as error:
        load_affinity(junk)
    assert str(error.value) == f"affinity file {str(junk)!r} is not a NumPy .npy file; {expected}"
    with pytest.raises(ValueError) as error:
        load_affinity(tmp_path / "missing.npy")
    assert str(error.value) == f"affinity file {str(tmp_path / 'missing.npy')!r} does not exist"
