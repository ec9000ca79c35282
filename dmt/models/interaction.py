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
import torch.nn.functional as F
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


class _PairDots(torch.autograd.Function):
    """``[dense, <v_i, v_j> for the pairs i < j]`` of ``vectors = [dense, sparse_0, ...]``
    (``dense`` ``(B, D)``, ``sparse`` ``(B, V, D)``; ``n = V + 1`` vectors): the dot products as
    one batched matrix product, and a backward of one more, ``(G + G^T) v`` with ``G`` the pairs'
    gradients in their Gram positions, where autograd's takes two (``G v`` and ``G^T v``) and
    their sum. ``G`` and ``G^T`` share no position (``i < j``), so ``G + G^T`` is one gather of
    the gradients, each placed twice, with no addition: the same terms summed in one product.
    The sparse vectors' gradient is that product's rows ``1..V``, computed on their own into a
    contiguous ``(B, V, D)``: the lookup's backward reads it as it is, where a slice of the
    ``(B, n, D)`` product made FBGEMM copy it. Once differentiable (no double backward).

    ``pairs``: the pairs' positions ``i n + j`` in the flattened Gram matrix; ``sources``: for
    each of its ``n^2`` positions, 1 + the index of the pair it holds (``(i, j)`` or ``(j, i)``),
    0 on the diagonal."""

    @staticmethod
    def forward(
        ctx: torch.autograd.function.FunctionCtx,
        dense: torch.Tensor,
        sparse: torch.Tensor,
        pairs: torch.Tensor,
        sources: torch.Tensor,
    ) -> torch.Tensor:
        vectors = torch.cat([dense.unsqueeze(1), sparse], dim=1)  # (B, n, D)
        gram = torch.bmm(vectors, vectors.transpose(1, 2))  # (B, n, n)
        ctx.save_for_backward(vectors, sources)
        return torch.cat([dense, gram.flatten(1).index_select(1, pairs)], dim=1)

    @staticmethod
    @torch.autograd.function.once_differentiable
    def backward(
        ctx: torch.autograd.function.FunctionCtx, grad: torch.Tensor
    ) -> tuple[torch.Tensor, torch.Tensor, None, None]:
        vectors, sources = ctx.saved_tensors  # type: ignore[attr-defined]
        B, n, D = vectors.shape
        # under autocast the forward's product (and so the pairs' gradient) may be bf16/fp16
        # while the saved vectors are not; the gradient is computed in the vectors' dtype, as
        # autograd returns it
        grad = grad.to(vectors.dtype)
        # G + G^T, symmetric: a zero column in front for the diagonal's 0
        both = F.pad(grad[:, D:], (1, 0)).index_select(1, sources).view(B, n, n)
        if D < n:  # on CPU the product of (D, n) by (n, n) is the faster one for narrow vectors
            product = torch.bmm(vectors.transpose(1, 2), both).transpose(1, 2)
            return grad[:, :D] + product[:, 0], product[:, 1:], None, None
        sparse = torch.bmm(both[:, 1:], vectors)  # (B, V, D), contiguous
        return grad[:, :D] + torch.bmm(both[:, :1], vectors).squeeze(1), sparse, None, None


@torch.fx.wrap
def pair_dots(
    dense: torch.Tensor, sparse: torch.Tensor, pairs: torch.Tensor, sources: torch.Tensor
) -> torch.Tensor:
    """:class:`_PairDots`: one call in an fx graph (TorchRec's train pipeline traces the model)."""
    out = _PairDots.apply(dense, sparse, pairs, sources)
    assert isinstance(out, torch.Tensor)
    return out


class DotInteraction(nn.Module):
    """Pairwise dot products of ``[dense, sparse_0, ..., sparse_{V-1}]`` (upper triangle, no
    diagonal) concatenated with ``dense``; the products' backward is one batched matrix product
    (:class:`_PairDots`).

    Args:
        num_vectors: ``V``, the number of sparse vectors.
        dim: ``D``, their size.
        dense_dim: ``D0``, the dense vector's size; it joins the dot products, so it must be ``D``
            (``None``: ``D``).

    Output: ``(B, D + (V + 1) V / 2)``.
    """

    _pairs: torch.Tensor
    _sources: torch.Tensor

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
        # for the backward: each Gram position's pair (1 + its index; 0 on the diagonal)
        n, index = num_vectors + 1, torch.arange(1, len(rows) + 1)
        sources = torch.zeros(n * n, dtype=torch.long)
        sources[rows * n + cols] = index
        sources[cols * n + rows] = index
        self.register_buffer("_sources", sources, persistent=False)
        #: the products' own backward (:class:`_PairDots`); False: autograd's
        self.fused_backward = True

    @property
    def output_dim(self) -> int:
        return self.dim + (self.num_vectors + 1) * self.num_vectors // 2

    def forward(self, dense: torch.Tensor, sparse: torch.Tensor) -> torch.Tensor:
        if self.fused_backward:
            return pair_dots(dense, sparse, self._pairs, self._sources)
        # autograd's backward, two products (what FLOP accounting counts, as the paper)
        vectors = torch.cat([dense.unsqueeze(1), sparse], dim=1)  # (B, V + 1, D)
        gram = torch.bmm(vectors, vectors.transpose(1, 2))
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
