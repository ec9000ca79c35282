"""The shared skeleton of DLRM and DCNv2: embedding bags, bottom MLP, interaction, top MLP."""

from __future__ import annotations

import torch
from torch import nn
from torchrec import EmbeddingBagCollection, KeyedJaggedTensor, KeyedTensor

from dmt.models.interaction import Interaction
from dmt.models.mlp import mlp


@torch.fx.wrap
def pooled_in_order(kt: KeyedTensor, names: list[str], dim: int) -> torch.Tensor:
    """``kt``'s pooled embeddings as ``(B, len(names), dim)``, features in ``names`` order.

    When ``kt``'s keys are already in that order (an unsharded EBC, or a plan that keeps it), its
    values as they are: a view, no copy forward or backward. Otherwise (a sharded EBC returns
    its keys in its sharding plan's order) one fused permute, :meth:`KeyedTensor.regroup`. One
    call in an fx graph: the branch on the keys runs at run time, so the model stays traceable
    (TorchRec's ``TrainPipelineSparseDist``)."""
    if kt.keys() == names:
        values = kt.values()
    else:
        values = KeyedTensor.regroup([kt], [names])[0]
    return values.reshape(-1, len(names), dim)


class RecModel(nn.Module):
    """``logits = top(interaction(bottom(dense), ebc(sparse)))``.

    The sparse part (``embedding_bag_collection``) and the dense part (``dense_forward``) are
    reachable separately: accounting counts the dense FLOPs alone, the partitioner reads pooled
    embeddings, and sharders replace the lookup while keeping the dense part.

    Args:
        embedding_bag_collection: one table per sparse feature, all of the same dim ``N``.
        num_dense: number of dense input features.
        bottom_mlp: bottom MLP layer sizes.
        interaction: maps ``(B, D0)`` and ``(B, F, N)`` to the top MLP's input.
        top_mlp: top MLP layer sizes (ends in 1).
        bottom_final_activation: ReLU after the last bottom layer.
        dropout: dropout probability after every ReLU of the bottom and top MLPs (0: none).
    """

    def __init__(
        self,
        embedding_bag_collection: EmbeddingBagCollection,
        num_dense: int,
        bottom_mlp: list[int],
        interaction: Interaction,
        top_mlp: list[int],
        *,
        bottom_final_activation: bool = False,
        dropout: float = 0.0,
    ) -> None:
        super().__init__()
        dims = {c.embedding_dim for c in embedding_bag_collection.embedding_bag_configs()}
        if len(dims) != 1:
            raise ValueError(f"all tables must share one embedding_dim, got {sorted(dims)}")
        self.embedding_dim = dims.pop()
        self.feature_names: list[str] = [
            f for c in embedding_bag_collection.embedding_bag_configs() for f in c.feature_names
        ]
        self.embedding_bag_collection = embedding_bag_collection
        self.bottom = mlp(
            num_dense, list(bottom_mlp), final_activation=bottom_final_activation, dropout=dropout
        )
        self.interaction = interaction
        self.top = mlp(
            interaction.output_dim, list(top_mlp), final_activation=False, dropout=dropout
        )

    @property
    def num_features(self) -> int:
        return len(self.feature_names)

    def pooled_embeddings(self, sparse_features: KeyedJaggedTensor) -> torch.Tensor:
        """Pooled embeddings ``(B, F, N)`` in ``feature_names`` order."""
        kt = self.embedding_bag_collection(sparse_features)
        return pooled_in_order(kt, self.feature_names, self.embedding_dim)

    def dense_forward(self, dense_features: torch.Tensor, pooled: torch.Tensor) -> torch.Tensor:
        """Everything after the lookup: ``(B, num_dense)``, ``(B, F, N)`` -> logits ``(B,)``."""
        x = self.bottom(dense_features)
        return self.top(self.interaction(x, pooled)).squeeze(-1)

    def forward(
        self, dense_features: torch.Tensor, sparse_features: KeyedJaggedTensor
    ) -> torch.Tensor:
        return self.dense_forward(dense_features, self.pooled_embeddings(sparse_features))
