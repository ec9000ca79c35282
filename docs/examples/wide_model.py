"""A model that is not in the paper, added as one builder plus one YAML file (docs/tower_modules.md,
"Adding a model"): DLRM with a "wide" part, a linear term over the dense features added to the
logit (Wide & Deep's idea on DLRM's skeleton)."""

from __future__ import annotations

from typing import Any

import torch
from torch import nn
from torchrec import EmbeddingBagCollection

from dmt.config import ModelConfig
from dmt.models import DMTModel, RecModel, build_rec_model


class WideRecModel(RecModel):
    """``logits = top(interaction(bottom(dense), ebc(sparse))) + wide(dense)``.

    A :class:`~dmt.models.RecModel` subclass, so dmt shards, checkpoints and evaluates it like the
    base models: the tables stay in ``embedding_bag_collection``, the rest is dense.

    Args: as :class:`~dmt.models.RecModel`; ``num_dense`` is also the wide part's input size.
    """

    def __init__(
        self,
        embedding_bag_collection: EmbeddingBagCollection,
        num_dense: int,
        *args: Any,
        **kwargs: Any,
    ) -> None:
        super().__init__(embedding_bag_collection, num_dense, *args, **kwargs)
        self.wide = nn.Linear(num_dense, 1)

    def dense_forward(self, dense_features: torch.Tensor, pooled: torch.Tensor) -> torch.Tensor:
        return super().dense_forward(dense_features, pooled) + self.wide(dense_features).squeeze(-1)


def build_wide_model(cfg: ModelConfig, **sizes: Any) -> RecModel | DMTModel:
    """``model._target_`` of ``conf/model/wide_dlrm.yaml``: dmt calls it with the model's config
    and the data's sizes (``feature_names``, ``cardinalities``, ``num_dense``, ``table_device``,
    ``dense_device``), as :func:`dmt.models.build_rec_model`, which builds the tables, MLPs and
    interaction of this class."""
    return build_rec_model(cfg, **sizes, model_class=WideRecModel)
