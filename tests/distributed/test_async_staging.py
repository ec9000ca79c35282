"""Asynchronous checkpoints (``trainer.checkpoint_async=true``) and host memory: each rank's
staging copy is what DCP itself plans to write from that rank, and a save whose copies would not
fit on some host is written synchronously by every rank alike (no rank left in a collective)."""

from __future__ import annotations

import logging
import math
import socket
from pathlib import Path

import pytest
import torch
from torch.distributed._shard.sharded_tensor import ShardedTensor
from torch.distributed.checkpoint import DefaultSavePlanner
from torch.distributed.checkpoint.planner import WriteItemType

from dmt import checkpoint
from dmt.host_memory import available_bytes, staged_bytes
from dmt.runtime import Runtime
from dmt.train import compose_config, to_config
from dmt.trainer import Trainer
from tests.distributed.distributed_harness import backends, run_on_ranks
from tests.integration.test_resume import TINY

BASE = [
    *TINY,  # embedding_dim 8: the tables' bytes below
    "trainer.max_steps=2",
    "trainer.eval_every=0",
    "trainer.checkpoint_async=true",
    "trainer.checkpoint=true",
]


def _planned_bytes(state: dict) -> int:
    """The tensor bytes DCP's own planner writes from this rank (its local plan)."""
    planner = DefaultSavePlanner()
    planner.set_up_planner(state, is_coordinator=False)
    return sum(
        math.prod(item.tensor_data.chunk.sizes)
        * torch.empty((), dtype=item.tensor_data.properties.dtype).element_size()
        for item in planner.create_local_plan().items
        if item.type != WriteItemType.BYTE_IO
    )


def _rank(rank: int, world_size: int, out: str, short_rank: int | None, backend: str) -> dict:
    cfg = to_config(compose_config(*BASE))
    device = torch.device("cuda", rank) if backend == "nccl" else torch.device("cpu")
    rt = Runtime(rank, world_size, rank, world_size, device, backend)
    messages: list[str] = []
    handler = logging.Handler()
    handler.emit = lambda record: messages.append(record.getMessage())  # type: ignore[method-assign]
    logging.getLogger("dmt.checkpoint").addHandler(handler)
    trainer = Trainer(cfg, rt, Path(out))
    trainer.fit()  # trains 2 steps, the final checkpoint asynchronously (memory to spare)
    ck = trainer.checkpointer
    assert ck is not None
    state = checkpoint.checkpoint_state(trainer.model, trainer.optimizer, rank=rank)
    staged, planned = staged_bytes(state), _planned_bytes(state)
    tables = [v for v in state["model"].values() if isinstance(v, ShardedTensor)]
    assert tables
    # one rank short of memory: every rank writes the next checkpoint synchronously
    ck.host_memory = (lambda: 1) if rank == short_rank else available_bytes
    path = ck.save(trainer.model, trainer.optimizer, step=100, epoch=0, batch_in_epoch=0)
    pending_after_save = ck._pending is not None
    complete_at_return = checkpoint.damage(path) is None
    ck.close()
    return {
        "staged": staged,
        "planned": planned,
        "tables": staged_bytes(tables),
        "all_tables": sum(4 * 8 * rows for rows in trainer.data.cardinalities),
        "async": pending_after_save,
        "complete_at_return": complete_at_return,
        "complete": checkpoint.damage(path) is None,
        "messages": [m for m in messages if "writing it synchronously" in m],
    }


@pytest.mark.parametrize("backend", backends(min_gpus=2))
@pytest.mark.parametrize("short_rank", [None, 1])
def test_async_save_stages_what_dcp_writes_and_goes_synchronous_where_memory_is_short(
    tmp_path: Path, short_rank: int | None, backend: str
) -> None:
    ranks = run_on_ranks(
        _rank, 2, str(tmp_path), short_rank, backend, timeout_s=180, backend=backend
    )
    for r in ranks:
        assert r["staged"] == r["planned"] > 0
        assert r["complete"]
    # the tables are sharded over the 2 ranks: each stages its own shards, not the whole tables
    assert sum(r["tables"] for r in ranks) == ranks[0]["all_tables"]
    assert (
        0
        < min(r["tables"] for r in ranks)
        <= max(r["tables"] for r in ranks)
        < ranks[0]["all_tables"]
    )
    if short_rank is None:
        assert [r["async"] for r in ranks] == [True, True]
        assert all(r["messages"] == [] for r in ranks)
        return
    assert [r["async"] for r in ranks] == [False, False]
    assert [r["complete_at_return"] for r in ranks] == [True, True]
    host = socket.gethostname()
    [said] = ranks[0]["messages"]
    assert f"host {host} (ranks 0, 1) would stage " in said
    assert (
        " of checkpoint state in host memory with 1 bytes free; writing it synchronously " in said
    )
    assert ranks[1]["messages"] == []  # rank 0 says it
