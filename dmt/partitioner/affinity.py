"""Feature affinity ``I`` (TP step 0, paper §3.3).

``I(i, j) = |mean over samples of cos(F_i, F_j)|`` where ``F_i`` is the pooled embedding of
sparse feature ``i`` in one sample: the paper's ``I = abs(K)`` with the average feature affinity
``K = mean(R R^T, dim=0)`` (``R`` the L2-normalized ``(B, F, N)`` pooled embeddings). Averaging the
per-sample cosines, not the embeddings, is the point: each sample looks up different rows. The
sign is averaged before the absolute value is taken, as the paper writes it: a pair whose cosine
changes sign from sample to sample is not coherently related (the mean of ``|cos|``, which dmt
computed before 2026-11-25, rates such a pair, and any two unrelated features, well above 0).

A feature whose pooled embedding is exactly zero in a sample (for instance an empty bag) has no
direction; it contributes a cosine of 0 to every pair in that sample. The diagonal of the result is
set to exactly 1 (a feature is fully related to itself).

Files: :func:`save_affinity` writes the matrix as ``<name>.npy`` (float64, ``(F, F)``) and the
feature names, in row order, as the JSON sidecar ``<name>.features.json``
(``{"feature_names": [...]}``). :func:`load_affinity` reads both back.
"""

from __future__ import annotations

import json
import warnings
from collections import Counter
from collections.abc import Iterable, Mapping, Sequence
from pathlib import Path
from typing import Any

import numpy as np
import torch
import torch.nn.functional as nnf

__all__ = [
    "AffinityAccumulator",
    "check_affinity",
    "compute_affinity",
    "default_feature_names",
    "load_affinity",
    "model_affinity",
    "save_affinity",
    "sidecar_path",
]

# Elements of the (samples, rows, F) similarity block computed at once; bounds peak memory.
_CHUNK_ELEMENTS = 1 << 22
_SYMMETRY_ATOL = 1e-6
_CHECK_ROWS = 1024
_NPY_MAGIC = b"\x93NUMPY"


class AffinityAccumulator:
    """Streaming ``F x F`` feature affinity with memory independent of the number of samples.

    Keeps one float64 ``(F, F)`` running sum of ``cos(F_i, F_j)`` and a sample count; each
    update is processed in chunks of at most ``chunk_elements`` similarity entries.

    Args:
        feature_names: optional names used in error messages (and checked against the count).
        chunk_elements: size of the similarity block computed at once.

    Example::

        >>> acc = AffinityAccumulator()
        >>> for pooled in batches:  # each (B, F, N)
        ...     acc.update(pooled)
        >>> affinity = acc.result()  # (F, F) float64, symmetric, diagonal 1
    """

    def __init__(
        self,
        feature_names: Sequence[str] | None = None,
        *,
        chunk_elements: int = _CHUNK_ELEMENTS,
    ) -> None:
        self.feature_names = list(feature_names) if feature_names is not None else None
        self.chunk_elements = chunk_elements
        self._sum: torch.Tensor | None = None
        self.num_samples = 0

    @property
    def num_features(self) -> int | None:
        """``F``, known after the first update (or from ``feature_names``)."""
        if self._sum is not None:
            return self._sum.shape[0]
        return len(self.feature_names) if self.feature_names is not None else None

    def _name(self, index: int) -> str:
        if self.feature_names is not None and index < len(self.feature_names):
            return f"feature {index} ({self.feature_names[index]!r})"
        return f"feature {index}"

    def update(self, pooled: torch.Tensor | Sequence[torch.Tensor]) -> None:
        """Add a batch of per-sample pooled embeddings.

        Args:
            pooled: a ``(B, F, N)`` tensor, or a sequence of ``F`` tensors ``(B, N_i)`` (one per
                feature, e.g. the values of ``KeyedTensor.to_dict()`` in feature order); all
                ``N_i`` must be equal.
        """
        if isinstance(pooled, torch.Tensor):
            if pooled.dim() != 3:
                raise ValueError(
                    f"pooled embeddings must have shape (B, F, N), got {tuple(pooled.shape)}"
                )
            stacked = pooled
        elif isinstance(pooled, Mapping):  # iterating it would give the names, not the tensors
            raise TypeError(
                "pooled embeddings must be a (B, F, N) tensor or a sequence of F (B, N) tensors, "
                "got a mapping (e.g. KeyedTensor.to_dict()); pass its tensors in feature order, "
                "e.g. [pooled[name] for name in feature_names]"
            )
        else:
            stacked = self._stack(list(pooled))
        num_features = stacked.shape[1]
        expected = self.num_features
        if expected is not None and num_features != expected:
            raise ValueError(
                f"expected pooled embeddings of {expected} features, got {num_features}"
            )
        if self._sum is None:
            # On the embeddings' device: a GPU model's batches are never copied to the host.
            self._sum = torch.zeros(
                num_features, num_features, dtype=torch.float64, device=stacked.device
            )
        units = nnf.normalize(stacked.detach().float(), dim=-1).to(self._sum.device)  # 0 stays 0
        self._accumulate(units)
        self.num_samples += stacked.shape[0]

    def _stack(self, per_feature: list[torch.Tensor]) -> torch.Tensor:
        if not per_feature:
            raise ValueError("pooled embeddings list is empty; expected one (B, N) per feature")
        for index, tensor in enumerate(per_feature):
            if tensor.dim() != 2:
                raise ValueError(
                    f"{self._name(index)}: pooled embedding must have shape (B, N), "
                    f"got {tuple(tensor.shape)}"
                )
        batch, dim = per_feature[0].shape
        for index, tensor in enumerate(per_feature[1:], start=1):
            if tensor.shape[1] != dim:
                raise ValueError(
                    f"{self._name(0)} has embedding dim {dim} but {self._name(index)} has "
                    f"embedding dim {tensor.shape[1]}; cosine affinity needs one embedding dim "
                    "for all features"
                )
            if tensor.shape[0] != batch:
                raise ValueError(
                    f"{self._name(0)} has batch size {batch} but {self._name(index)} has "
                    f"batch size {tensor.shape[0]}"
                )
        return torch.stack(per_feature, dim=1)

    def _accumulate(self, units: torch.Tensor) -> None:
        assert self._sum is not None
        batch, num_features, _ = units.shape
        rows = min(num_features, max(1, self.chunk_elements // num_features))
        samples = max(1, self.chunk_elements // (rows * num_features))
        for b0 in range(0, batch, samples):
            block = units[b0 : b0 + samples]
            block_t = block.transpose(1, 2)
            for r0 in range(0, num_features, rows):
                cos = torch.matmul(block[:, r0 : r0 + rows], block_t)  # (b, rows, F)
                self._sum[r0 : r0 + rows] += cos.sum(0, dtype=torch.float64)

    def result(self) -> np.ndarray:
        """The affinity ``|mean cos|``: float64 ``(F, F)``, symmetric, values in [0, 1], diag 1.

        Raises:
            ValueError: naming the features whose pooled embeddings held NaN or inf.
        """
        if self._sum is None or self.num_samples == 0:
            raise ValueError("no samples accumulated; call update() with at least one batch")
        # A NaN or inf in a pooled embedding makes its feature's cosines, its diagonal too, NaN.
        not_finite = (~torch.isfinite(torch.diagonal(self._sum))).nonzero().flatten().tolist()
        if not_finite:
            raise ValueError(
                f"pooled embeddings of {', '.join(self._name(i) for i in not_finite)} hold NaN or "
                f"inf in some of the {self.num_samples} samples; the affinity needs finite "
                "embeddings (a model whose training diverged?)"
            )
        mean = self._sum / self.num_samples
        mean = ((mean + mean.T) / 2).abs_()
        mean.clamp_(0.0, 1.0).fill_diagonal_(1.0)
        return mean.cpu().numpy()


def compute_affinity(batches: Iterable[torch.Tensor | Sequence[torch.Tensor]]) -> np.ndarray:
    """Affinity over all samples of ``batches`` (each ``(B, F, N)`` or a list of ``(B, N)``)."""
    accumulator = AffinityAccumulator()
    for pooled in batches:
        accumulator.update(pooled)
    return accumulator.result()


def model_affinity(
    model: torch.nn.Module,
    batches: Iterable[Any],
    max_batches: int | None = None,
    *,
    feature_names: Sequence[str] | None = None,
) -> tuple[np.ndarray, list[str]]:
    """Affinity of a trained model's pooled sparse embeddings, under ``torch.no_grad()``.

    Args:
        model: a module with ``embedding_bag_collection`` (a TorchRec
            ``EmbeddingBagCollection``, called on ``batch.sparse_features``), or a DMT model
            (``towers``, each with its own collection over its features).
        batches: TorchRec ``Batch`` objects; only ``batch.sparse_features`` (a KJT) is used.
        max_batches: stop after this many batches (all when ``None``).
        feature_names: row order of the result (e.g. the data's sparse feature order); defaults
            to the EBC output order ``KeyedTensor.keys()``: tables in config order, then each
            table's ``feature_names`` (a sharded EBC may order them by its plan instead).

    Returns:
        ``(affinity, feature_names)``, the float64 ``(F, F)`` affinity and its row order.
    """
    collections = _embedding_collections(model)
    accumulator: AffinityAccumulator | None = None
    order = list(feature_names) if feature_names is not None else None
    with torch.no_grad():
        for index, batch in enumerate(batches):
            if max_batches is not None and index >= max_batches:
                break
            per_feature: dict[str, torch.Tensor] = {}
            for ebc, kjt in collections(batch.sparse_features):
                per_feature.update(ebc(kjt).to_dict())
            if order is None:
                order = list(per_feature)
            if set(order) != set(per_feature):
                raise ValueError(
                    f"feature_names {order} do not match the embedding outputs {list(per_feature)}"
                )
            if accumulator is None:
                accumulator = AffinityAccumulator(order)
            accumulator.update([per_feature[name] for name in order])
    if accumulator is None or order is None:
        raise ValueError("no batches given; model_affinity needs at least one batch")
    return accumulator.result(), order


def _embedding_collections(model: torch.nn.Module) -> Any:
    """``features -> [(ebc, kjt), ...]``: the model's embedding bag collections and their inputs.

    A base model has one ``embedding_bag_collection``; a DMT model (:class:`dmt.models.DMTModel`)
    has one per tower, each fed the tower's features.
    """
    if hasattr(model, "embedding_bag_collection"):
        ebc = model.embedding_bag_collection
        return lambda features: [(ebc, features)]
    towers = getattr(model, "towers", None)
    split = getattr(model, "split_features", None)  # DMTModel: one KJT per tower
    if towers is not None and split is not None:
        return lambda features: [
            (tower.embedding_bag_collection, kjt) for tower, kjt in zip(towers, split(features))
        ]
    raise ValueError(
        f"{type(model).__name__} has no embedding_bag_collection (a base model) and no towers "
        "(a DMT model); model_affinity needs the pooled embedding of every sparse feature"
    )


def check_affinity(affinity: np.ndarray | torch.Tensor) -> np.ndarray:
    """Validate an affinity matrix and return it as a float64 array.

    Raises:
        ValueError: if it does not hold real numbers, is not a square ``(F, F)`` matrix with
            ``F >= 1``, holds NaN or inf, has values outside [0, 1], or is not symmetric
            (atol 1e-6).
    """
    if isinstance(affinity, torch.Tensor):
        affinity = affinity.detach().cpu().numpy()
    given = np.asarray(affinity)
    if given.dtype.kind not in "biuf":  # a complex one would lose its imaginary parts silently
        raise ValueError(f"affinity must hold real numbers, got dtype {given.dtype}")
    matrix = given.astype(np.float64, copy=False)
    if matrix.ndim != 2 or matrix.shape[0] != matrix.shape[1] or matrix.shape[0] == 0:
        raise ValueError(
            f"affinity must be a non-empty square (F, F) matrix, got shape {matrix.shape}"
        )
    num_features = matrix.shape[0]
    # Row blocks keep the temporaries small for F in the tens of thousands.
    for start in range(0, num_features, _CHECK_ROWS):
        block = matrix[start : start + _CHECK_ROWS]
        finite = np.isfinite(block)
        if not finite.all():
            i, j = np.argwhere(~finite)[0]
            raise ValueError(
                f"affinity contains NaN or infinite values (first at [{start + i}, {j}] = "
                f"{block[i, j]}); expected finite values in [0, 1]"
            )
        outside = (block < 0.0) | (block > 1.0)
        if outside.any():
            i, j = np.argwhere(outside)[0]
            raise ValueError(
                f"affinity values must lie in [0, 1] (|cosine similarity|), got "
                f"{block[i, j]} at [{start + i}, {j}]"
            )
        gap = np.abs(block - matrix[:, start : start + _CHECK_ROWS].T)
        if (gap > _SYMMETRY_ATOL).any():
            i, j = np.unravel_index(np.argmax(gap), gap.shape)
            raise ValueError(
                f"affinity must be symmetric, but affinity[{start + i}, {j}] = {block[i, j]} "
                f"and affinity[{j}, {start + i}] = {matrix[j, start + i]} "
                f"(difference {gap[i, j]:.3g} > {_SYMMETRY_ATOL})"
            )
    return matrix


def default_feature_names(num_features: int) -> list[str]:
    """Sparse feature names ``cat_0 .. cat_{F-1}`` (the dmt/TorchRec Criteo convention)."""
    return [f"cat_{i}" for i in range(num_features)]


def sidecar_path(path: str | Path) -> Path:
    """``<name>.features.json`` next to ``<name>.npy``."""
    return Path(path).with_suffix(".features.json")


def save_affinity(path: str | Path, affinity: np.ndarray, feature_names: Sequence[str]) -> Path:
    """Write ``affinity`` to ``path`` (must end in ``.npy``) and names to the JSON sidecar.

    Returns:
        The sidecar path.
    """
    path = Path(path)
    if path.suffix != ".npy":
        raise ValueError(f"affinity path must end in .npy, got {str(path)!r}")
    matrix = check_affinity(affinity)
    names = [str(name) for name in feature_names]
    if len(names) != matrix.shape[0]:
        raise ValueError(
            f"got {len(names)} feature names for a {matrix.shape[0]} x {matrix.shape[0]} affinity"
        )
    if len(set(names)) != len(names):
        raise ValueError("feature names must be unique")
    path.parent.mkdir(parents=True, exist_ok=True)
    np.save(path, matrix)
    sidecar = sidecar_path(path)
    sidecar.write_text(json.dumps({"feature_names": names}, indent=1) + "\n")
    return sidecar


def load_affinity(path: str | Path) -> tuple[np.ndarray, list[str]]:
    """Read an affinity written by :func:`save_affinity` (or any ``(F, F)`` ``.npy``).

    Returns:
        ``(affinity, feature_names)``, validated with :func:`check_affinity`. Without a sidecar
        the names default to ``cat_0 .. cat_{F-1}`` (with a warning).

    Raises:
        ValueError: naming the file: not a ``.npy`` array, not a valid affinity, or a sidecar
            that is not ``{"feature_names": [F unique names]}``.
    """
    path = Path(path)
    if path.is_dir():  # e.g. dmt-partition's --out
        raise ValueError(
            f"affinity file {str(path)!r} is a folder; expected an affinity .npy file "
            f"(dmt-partition --checkpoint --out {path} writes {str(path / 'affinity.npy')!r})"
        )
    if not path.is_file():
        raise ValueError(f"affinity file {str(path)!r} does not exist")
    expected = "expected an (F, F) float array saved with numpy.save (as save_affinity writes)"
    try:
        with path.open("rb") as file:
            magic = file.read(len(_NPY_MAGIC))
        loaded = np.load(path, allow_pickle=False) if magic == _NPY_MAGIC else None
    except (ValueError, EOFError, OSError) as e:
        raise ValueError(f"cannot read affinity file {str(path)!r} ({e}); {expected}") from None
    if loaded is None:
        raise ValueError(f"affinity file {str(path)!r} is not a NumPy .npy file; {expected}")
    try:
        matrix = check_affinity(loaded)
    except ValueError as e:
        raise ValueError(f"affinity file {str(path)!r}: {e}") from None
    sidecar = sidecar_path(path)
    if not sidecar.exists():
        warnings.warn(
            f"no feature-name sidecar {str(sidecar)!r}; naming features cat_0..cat_{len(matrix) - 1}",
            stacklevel=2,
        )
        return matrix, default_feature_names(len(matrix))
    sidecar_format = 'expected {"feature_names": [<one name per affinity row>]}'
    try:
        document = json.loads(sidecar.read_text())
    except (OSError, UnicodeDecodeError, json.JSONDecodeError) as e:
        raise ValueError(
            f"feature-name sidecar {str(sidecar)!r} is not valid JSON ({e}); {sidecar_format}"
        ) from None
    names = document.get("feature_names") if isinstance(document, dict) else None
    if not isinstance(names, list) or not all(isinstance(name, (str, int)) for name in names):
        raise ValueError(
            f"feature-name sidecar {str(sidecar)!r} has no 'feature_names' list of names; {sidecar_format}"
        )
    if len(names) != len(matrix):
        raise ValueError(
            f"{str(sidecar)!r} lists {len(names)} feature names but the affinity in "
            f"{str(path)!r} has {len(matrix)} features"
        )
    names = [str(name) for name in names]
    duplicates = sorted(name for name, count in Counter(names).items() if count > 1)
    if duplicates:
        raise ValueError(
            f"feature-name sidecar {str(sidecar)!r} lists feature(s) {duplicates} more than once; "
            "feature names must be unique"
        )
    return matrix, names
