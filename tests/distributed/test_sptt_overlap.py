"""SPTT's step f overlaps the bottom MLP: its all-to-all is in flight while the bottom MLP runs,
in the forward and in the backward (``ShardedTowers.output_dist`` is asynchronous and
``DMTModel.interact`` touches the towers' outputs last)."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest
import torch
from torch.nn.functional import binary_cross_entropy_with_logits

from dmt.runtime import Runtime
from dmt.sptt.dmt_sharding import ShardedDMT
from dmt.train import compose_config, to_config
from dmt.trainer import Trainer
from tests.distributed.distributed_harness import backends, run_on_ranks

OVERRIDES = [
    "logger=disabled",
    "trainer.progress_bar=false",
    "data.synthetic.num_train=1024",
    "data.synthetic.num_val=256",
    "data.synthetic.num_test=256",
    "data.batch_size=256",
    "experiment=dmt_4t_dlrm",
    "model.partition.num_towers=2",
    "sptt=on",
    "sptt.local_world_size=1",
    "model.embedding_dim=8",
    "model.bottom_mlp=[16,8]",
    "model.top_mlp=[16,1]",
]


def _events(rank: int, world_size: int, backend: str) -> list[tuple[str, Any]]:
    cfg = to_config(compose_config(*OVERRIDES))
    device = torch.device("cuda", rank) if backend == "nccl" else torch.device("cpu")
    rt = Runtime(rank, world_size, rank, world_size, device, backend)
    trainer = Trainer(cfg, rt, Path("/nonexistent"))
    sharded = trainer.model.model
    assert isinstance(sharded, ShardedDMT) and sharded.tower_module is not None
    batch = next(iter(trainer.data.train.batches(0))).to(device)

    events: list[tuple[str, Any]] = []
    exchange = sharded.towers(batch.sparse_features)  # steps a-e, then step f started
    request = exchange.request
    events.append(("f started", request.in_flight))
    bottom = sharded.dense_arch.module.bottom
    bottom.register_forward_pre_hook(lambda *_: events.append(("bottom", request.in_flight)))
    next(bottom.parameters()).register_hook(
        lambda grad: events.append(("bottom backward", request.grad_in_flight))
    )
    next(sharded.tower_module.parameters()).register_hook(
        lambda grad: events.append(("tower module backward", request.grad_in_flight))
    )
    logits = sharded.dense_arch(batch.dense_features, exchange)
    events.append(("logits", request.in_flight))
    binary_cross_entropy_with_logits(logits, batch.labels).backward()
    return events


@pytest.mark.parametrize("backend", backends(min_gpus=2))
def test_step_f_is_in_flight_while_the_bottom_mlp_runs(backend: str) -> None:
    for events in run_on_ranks(_events, 2, backend, timeout_s=120, backend=backend):
        assert events == [
            ("f started", True),
            ("bottom", True),  # forward: f still in flight
            ("logits", False),  # interact waited for it
            ("bottom backward", True),  # backward: f's gradient all-to-all in flight
            ("tower module backward", False),  # ... and waited for before the tower module
        ], events
