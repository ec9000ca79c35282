"""DLRM: bottom MLP, embedding bags, pairwise dot interaction, top MLP."""

from __future__ import annotations

from torchrec import EmbeddingBagCollection

from dmt.models.interaction import DotInteraction
from dmt.models.rec_model import RecModel


class DLRM(RecModel):
    """DLRM (Naumov et al., 2019) on a TorchRec ``EmbeddingBagCollection``: a
    :class:`~dmt.models.RecModel` with :class:`~dmt.models.DotInteraction` (what
    :func:`~dmt.models.build_model` builds from ``conf/model/dlrm.yaml``).

    The bottom MLP's output joins the ``F`` pooled embeddings in the dot interaction, so its last
    size must equal the embedding dim ``N``.

    Example::

        ebc = EmbeddingBagCollection(tables=[EmbeddingBagConfig(name="t_cat_0", embedding_dim=16,
            num_embeddings=100, feature_names=["cat_0"])])
        model = DLRM(ebc, num_dense=13, bottom_mlp=[32, 16], top_mlp=[32, 1])
        logits = model(dense, kjt)  # (B,)
    """

    def __init__(
        self,
        embedding_bag_collection: EmbeddingBagCollection,
        num_dense: int,
        bottom_mlp: list[int],
        top_mlp: list[int],
        *,
        bottom_final_activation: bool = False,
        dropout: float = 0.0,
    ) -> None:
        tables = embedding_bag_collection.embedding_bag_configs()
        num_features = sum(len(t.feature_names) for t in tables)
        dim = tables[0].embedding_dim
        super().__init__(
            embedding_bag_collection,
            num_dense,
            bottom_mlp,
            DotInteraction(num_features, dim, bottom_mlp[-1]),
            top_mlp,
            bottom_final_activation=bottom_final_activation,
            dropout=dropout,
        )
