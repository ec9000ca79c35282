"""Global feature interactions of DLRM (pairwise dot) and DCNv2 (low-rank CrossNet).

Both take the bottom-MLP output ``dense`` of shape ``(B, D0)`` and the sparse vectors ``sparse`` of
shape ``(B, V, D)`` (``V`` pooled embeddings or tower outputs) and return the top MLP's input.
"""

from __future__ import annotations

import torch
from torch import nn
from torchrec.modules.crossnet import LowRankCrossNet


class DotInteraction(nn.Module):
    """Pairwise dot products of ``[dense, sparse_0, ..., sparse_{V-1}]`` (upper triangle, no
    diagonal) concatenated with ``dense``.

    Args:
        num_vectors: ``V``, the number of sparse vectors.
        dim: ``D``, their size; the dense vector must have the same size.

    Output: ``(B, D + (V + 1) V / 2)``.
    """

    def __init__(self, num_vectors: int, dim: int) -> None:
        super().__init__()
        self.num_vectors = num_vectors
        self.dim = dim
        rows, cols = torch.triu_indices(num_vectors + 1, num_vectors + 1, offset=1)
        self.register_buffer("_rows", rows, persistent=False)
        self.register_buffer("_cols", cols, persistent=False)

    @property
    def output_dim(self) -> int:
        return self.dim + (self.num_vectors + 1) * self.num_vectors // 2

    def forward(self, dense: torch.Tensor, sparse: torch.Tensor) -> torch.Tensor:
        vectors = torch.cat([dense.unsqueeze(1), sparse], dim=1)  # (B, V + 1, D)
        gram = torch.bmm(vectors, vectors.transpose(1, 2))  # (B, V + 1, V + 1)
        return torch.cat([dense, gram[:, self._rows, self._cols]], dim=1)


class CrossInteraction(nn.Module):
    """DCNv2's low-rank CrossNet over ``cat([dense, flatten(sparse)])``.

    Output: ``(B, D0 + V * D)``.
    """

    def __init__(self, in_features: int, num_layers: int, low_rank: int) -> None:
        super().__init__()
        self.in_features = in_features
        self.crossnet = LowRankCrossNet(in_features=in_features, num_layers=num_layers, low_rank=low_rank)

    @property
    def output_dim(self) -> int:
        return self.in_features

    def forward(self, dense: torch.Tensor, sparse: torch.Tensor) -> torch.Tensor:
        return self.crossnet(torch.cat([dense, sparse.flatten(1)], dim=1))
