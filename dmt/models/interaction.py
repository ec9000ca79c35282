"""Global feature interactions of DLRM (pairwise dot) and DCNv2 (low-rank CrossNet).

Both take the bottom-MLP output ``dense`` of shape ``(B, D0)`` and the sparse vectors ``sparse`` of
shape ``(B, V, D)`` (``V`` pooled embeddings or tower outputs) and return the top MLP's input,
of size ``output_dim``.

An interaction is built from its config (``model.interaction``: ``_target_`` and its settings,
:class:`dmt.config.InteractionConfig`) by :func:`dmt.models.build_model`, which adds the sizes it
depends on as keyword arguments: ``num_vectors`` (``V``), ``dim`` (``D``) and ``dense_dim``
(``D0``). A new interaction is a class with that signature plus its settings.
"""

from __future__ import annotations

from typing import Protocol

import torch
from torch import nn
from torchrec.modules.crossnet import LowRankCrossNet


class Interaction(Protocol):
    """What a model needs of its interaction, an ``nn.Module`` mapping ``(B, D0)`` and
    ``(B, V, D)`` to ``(B, output_dim)``."""

    @property
    def output_dim(self) -> int: ...

    def __call__(self, dense: torch.Tensor, sparse: torch.Tensor) -> torch.Tensor: ...


def _check_positive(interaction: str, **values: int) -> None:
    for name, value in values.items():
        if not isinstance(value, int) or value <= 0:
            raise ValueError(f"{interaction}: {name}={value!r} must be a positive integer")


class DotInteraction(nn.Module):
    """Pairwise dot products of ``[dense, sparse_0, ..., sparse_{V-1}]`` (upper triangle, no
    diagonal) concatenated with ``dense``.

    Args:
        num_vectors: ``V``, the number of sparse vectors.
        dim: ``D``, their size.
        dense_dim: ``D0``, the dense vector's size; it joins the dot products, so it must be ``D``
            (``None``: ``D``).

    Output: ``(B, D + (V + 1) V / 2)``.
    """

    _pairs: torch.Tensor

    def __init__(self, num_vectors: int, dim: int, dense_dim: int | None = None) -> None:
        super().__init__()
        _check_positive("DotInteraction", num_vectors=num_vectors, dim=dim)
        if dense_dim is not None and dense_dim != dim:
            raise ValueError(
                f"DotInteraction: the dense vector has size {dense_dim} (model.bottom_mlp[-1]) but "
                f"the sparse vectors have size {dim} (the embedding dim N, or the towers' D); it "
                f"joins their dot products: set model.bottom_mlp[-1] to {dim}"
            )
        self.num_vectors = num_vectors
        self.dim = dim
        rows, cols = torch.triu_indices(num_vectors + 1, num_vectors + 1, offset=1)
        # positions in the flattened Gram matrix: index_select's backward (index_add) is several
        # times faster on CPU than that of gram[:, rows, cols] (index_put with accumulation)
        self.register_buffer("_pairs", rows * (num_vectors + 1) + cols, persistent=False)

    @property
    def output_dim(self) -> int:
        return self.dim + (self.num_vectors + 1) * self.num_vectors // 2

    def forward(self, dense: torch.Tensor, sparse: torch.Tensor) -> torch.Tensor:
        vectors = torch.cat([dense.unsqueeze(1), sparse], dim=1)  # (B, V + 1, D)
        gram = torch.bmm(vectors, vectors.transpose(1, 2))  # (B, V + 1, V + 1)
        return torch.cat([dense, gram.flatten(1).index_select(1, self._pairs)], dim=1)


class CrossInteraction(nn.Module):
    """DCNv2's low-rank CrossNet over ``cat([dense, flatten(sparse)])``.

    Args:
        num_vectors: ``V``, the number of sparse vectors.
        dim: ``D``, their size.
        dense_dim: ``D0``, the dense vector's size.
        num_layers: cross layers.
        low_rank: rank of each cross layer.

    Output: ``(B, D0 + V * D)``.
    """

    def __init__(
        self,
        num_vectors: int,
        dim: int,
        dense_dim: int,
        *,
        num_layers: int = 3,
        low_rank: int = 64,
    ) -> None:
        super().__init__()
        _check_positive(
            "CrossInteraction",
            num_vectors=num_vectors,
            dim=dim,
            dense_dim=dense_dim,
            num_layers=num_layers,
            low_rank=low_rank,
        )
        self.in_features = dense_dim + num_vectors * dim
        self.crossnet = LowRankCrossNet(
            in_features=self.in_features, num_layers=num_layers, low_rank=low_rank
        )

    @property
    def output_dim(self) -> int:
        return self.in_features

    def forward(self, dense: torch.Tensor, sparse: torch.Tensor) -> torch.Tensor:
        return self.crossnet(torch.cat([dense, sparse.flatten(1)], dim=1))
