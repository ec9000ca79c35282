"""A tower module that is not in the paper: a small MLP per tower (the worked example of
``docs/tower_modules.md``).

``MLPTowerModule`` flattens the tower's ``F_t`` pooled embeddings, runs them through
``Linear(F_t N -> hidden)``, ReLU, ``Linear(hidden -> num_vectors D)`` and sends ``num_vectors``
vectors of size ``D``: a non-linear compression where Listing 1 is linear.
"""

from __future__ import annotations

import torch
from torch import nn

from dmt.models import TowerModule


class MLPTowerModule(TowerModule):
    """``(B, F_t, N) -> (B, num_vectors, D)`` through a one-hidden-layer MLP.

    Args:
        num_features: ``F_t`` (given by the model builder).
        embedding_dim: ``N`` (given by the model builder).
        dim: ``D``, the size of each output vector.
        hidden: width of the hidden layer.
        num_vectors: output vectors per tower.
    """

    def __init__(
        self, num_features: int, embedding_dim: int, dim: int, *, hidden: int, num_vectors: int = 1
    ) -> None:
        super().__init__()
        for name, value in (("dim", dim), ("hidden", hidden), ("num_vectors", num_vectors)):
            if not isinstance(value, int) or value <= 0:
                raise ValueError(f"MLPTowerModule: {name}={value!r} must be a positive integer")
        self.num_features, self.embedding_dim = num_features, embedding_dim
        self.num_vectors, self.dim = num_vectors, dim
        self.mlp = nn.Sequential(
            nn.Linear(num_features * embedding_dim, hidden),
            nn.ReLU(),
            nn.Linear(hidden, num_vectors * dim),
        )

    def forward(self, embs: torch.Tensor) -> torch.Tensor:
        self._check_input(embs)
        return self.mlp(embs.flatten(1)).view(embs.size(0), self.num_vectors, self.dim)
