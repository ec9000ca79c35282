"""A small DLRM-style DMT model shared by the byte-counting tests (``test_comm_trace.py``,
``test_plan_bytes.py``): ``F`` features of ``ROWS`` rows, embedding dim ``N``, DLRM tower modules
of width ``D`` (or pass-through towers), naive strided towers."""

from __future__ import annotations

import torch

from dmt.config import (
    DLRMTowerConfig,
    DotInteractionConfig,
    ModelConfig,
    PartitionConfig,
    PassThroughTowerConfig,
)
from dmt.models import build_dmt_model, naive_partition

F, ROWS, N, D = 6, 40, 8, 4
NAMES = [f"cat_{f}" for f in range(F)]


def small_dmt_model(num_towers: int, tower: str) -> torch.nn.Module:
    """The model in ``num_towers`` towers with ``tower`` modules (``"passthrough"`` or
    ``"dlrm"``), seeded: every rank builds the same weights."""
    dim = N if tower == "passthrough" else D
    cfg = ModelConfig(
        name="dlrm",
        interaction=DotInteractionConfig(),
        embedding_dim=N,
        bottom_mlp=[8, dim],
        top_mlp=[8, 1],
        tower=(
            PassThroughTowerConfig()
            if tower == "passthrough"
            else DLRMTowerConfig(dim=dim, c=1, p=0)
        ),
        partition=PartitionConfig(kind="explicit"),
    )
    torch.manual_seed(0)
    return build_dmt_model(
        cfg,
        naive_partition(NAMES, num_towers),
        feature_names=NAMES,
        cardinalities=[ROWS] * F,
        num_dense=3,
    )
