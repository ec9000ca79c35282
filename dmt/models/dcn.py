"""DCNv2: bottom MLP, embedding bags, low-rank CrossNet, top MLP."""

from __future__ import annotations

from torchrec import EmbeddingBagCollection

from dmt.models.interaction import CrossInteraction
from dmt.models.rec_model import RecModel


class DCN(RecModel):
    """DCNv2 (Wang et al., 2021), stacked: a low-rank CrossNet over
    ``cat([bottom(dense), flatten(pooled)])`` feeds the top MLP: a :class:`~dmt.models.RecModel`
    with :class:`~dmt.models.CrossInteraction` (what :func:`~dmt.models.build_model` builds from
    ``conf/model/dcn.yaml``).
    """

    def __init__(
        self,
        embedding_bag_collection: EmbeddingBagCollection,
        num_dense: int,
        bottom_mlp: list[int],
        top_mlp: list[int],
        *,
        num_cross_layers: int = 3,
        low_rank: int = 64,
        bottom_final_activation: bool = False,
        dropout: float = 0.0,
    ) -> None:
        tables = embedding_bag_collection.embedding_bag_configs()
        num_features = sum(len(t.feature_names) for t in tables)
        interaction = CrossInteraction(
            num_features,
            tables[0].embedding_dim,
            bottom_mlp[-1],
            num_layers=num_cross_layers,
            low_rank=low_rank,
        )
        super().__init__(
            embedding_bag_collection,
            num_dense,
            bottom_mlp,
            interaction,
            top_mlp,
            bottom_final_activation=bottom_final_activation,
            dropout=dropout,
        )
