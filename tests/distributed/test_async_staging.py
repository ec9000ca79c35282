"""Asynchronous checkpoints (``trainer.checkpoint_async=true``) and host memory: each rank's
staging copy is what DCP itself plans to write from that rank, the host memory staging takes at
its peak is that copy (measured by torch's profiler; DCP's own stager took up to twice as much),
its checkpoint is a synchronous save's byte for byte, and a save whose staging would not fit on
some host is written synchronously by every rank alike (no rank left in a collective)."""

from __future__ import annotations

import logging
import math
import socket
import tempfile
import time
from collections.abc import Callable
from concurrent.futures import Future
from pathlib import Path

import pytest
import torch
import torch.distributed as dist
import torch.distributed.checkpoint as dcp
from torch.distributed._shard.sharded_tensor import ShardedTensor
from torch.distributed.checkpoint import DefaultSavePlanner
from torch.distributed.checkpoint.planner import WriteItemType
from torch.profiler import ProfilerActivity, profile

from dmt import checkpoint
from dmt.host_memory import staged_bytes
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


def _stager_bytes(state: dict) -> int:
    """Host memory dmt's stager allocates for ``state``: the storages of its copy."""
    copy = checkpoint.HostStager().stage(state)
    storages: dict[int, int] = {}

    def walk(v: object) -> None:
        if isinstance(v, ShardedTensor):
            for shard in v.local_shards():
                walk(shard.tensor)
        elif isinstance(v, torch.Tensor):
            assert v.device.type == "cpu"
            st = v.untyped_storage()
            storages[st.data_ptr()] = st.nbytes()
        elif isinstance(v, dict):
            for x in v.values():
                walk(x)
        elif isinstance(v, list | tuple):
            for x in v:
                walk(x)

    walk(copy)
    return sum(storages.values())


def _unreadable() -> dict[str, int]:
    raise OSError("planted: /proc/meminfo unreadable")


def _rank(rank: int, world_size: int, out: str, case: str, backend: str) -> dict:
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
    staged, planned, stager = staged_bytes(state), _planned_bytes(state), _stager_bytes(state)
    tables = [v for v in state["model"].values() if isinstance(v, ShardedTensor)]
    assert tables
    # rank 1 short of memory: every rank writes the next checkpoint synchronously; rank 1 unable
    # to read it: not checked there, every rank saves asynchronously (none left in the gather)
    if rank == 1 and case != "fits":
        ck.host_memory = (lambda: {"host": 1}) if case == "short" else _unreadable
    path = ck.save(trainer.model, trainer.optimizer, step=100, epoch=0, batch_in_epoch=0)
    pending_after_save = ck._pending is not None
    complete_at_return = checkpoint.damage(path) is None
    polls = []
    if case == "fits":
        # a rank whose part is not written yet keeps every rank from marking it complete
        pending = ck._pending
        assert pending is not None
        pending.future.result()  # this rank's part is written
        if rank == 1:
            real, pending.future = pending.future, Future()
        polls.append((ck.poll(), checkpoint.damage(path) is None))
        if rank == 1:
            pending.future = real
        # ... and once every rank's is, polling marks it complete, on every rank alike
        polls.append((ck.poll(), checkpoint.damage(path) is None))
        # polling while DCP's thread still writes (its collectives on the checkpoint group):
        # every rank gets the same answer at every poll, until the save is complete
        later = ck.save(trainer.model, trainer.optimizer, step=101, epoch=0, batch_in_epoch=0)
        for _ in range(10_000):
            if ck.poll():
                break
            time.sleep(0.005)
        polls.append((ck._pending is None, checkpoint.damage(later) is None))
    ck.close()
    return {
        "staged": staged,
        "planned": planned,
        "stager": stager,
        "tables": staged_bytes(tables),
        "all_tables": sum(4 * 8 * rows for rows in trainer.data.cardinalities),
        "async": pending_after_save,
        "complete_at_return": complete_at_return,
        "polls": polls,
        "complete": checkpoint.damage(path) is None,
        "messages": [m for m in messages if "writing it synchronously" in m or "cannot read" in m],
    }


@pytest.mark.parametrize("backend", backends(min_gpus=2))
@pytest.mark.parametrize("case", ["fits", "short", "unreadable"])
def test_async_save_stages_what_dcp_writes_and_goes_synchronous_where_memory_is_short(
    tmp_path: Path, case: str, backend: str
) -> None:
    ranks = run_on_ranks(_rank, 2, str(tmp_path), case, backend, timeout_s=180, backend=backend)
    for r in ranks:
        # what DCP's stager allocates, and what its planner writes from the rank
        assert r["staged"] == r["stager"] == r["planned"] > 0
        assert r["complete"]
    # the tables are sharded over the 2 ranks: each stages its own shards, not the whole tables
    assert sum(r["tables"] for r in ranks) == ranks[0]["all_tables"]
    assert (
        0
        < min(r["tables"] for r in ranks)
        <= max(r["tables"] for r in ranks)
        < ranks[0]["all_tables"]
    )
    if case == "fits":  # (no save pending, complete) after each poll
        assert [r["polls"] for r in ranks] == [[(False, False), (True, True), (True, True)]] * 2
    if case != "short":
        assert [r["async"] for r in ranks] == [True, True]
        assert ranks[0]["messages"] == []
        assert ranks[1]["messages"] == (
            []
            if case == "fits"
            else [
                "rank 1 cannot read its free host memory (planted: /proc/meminfo unreadable); "
                "not checked"
            ]
        )
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


# four tables of 20,000 rows: a table's first copy outweighed what DCP's own stager copies after it
LARGER = ["data.synthetic.num_sparse=4", "data.synthetic.cardinalities=[20000,20000,20000,20000]"]
SPTT_EMA = [
    "experiment=dmt_4t_dlrm",
    "model.partition.num_towers=2",
    "sptt.local_world_size=1",
    "trainer.ema_decay=0.9",
]


def _stager_peak(stage: Callable[[dict], object], state: dict) -> int:
    """The most host memory ``stage`` holds at once while it stages ``state``: torch's
    profiler's CPU allocations and frees, in order."""
    with profile(activities=[ProfilerActivity.CPU], profile_memory=True) as prof:
        stage(state)
    events = [e for e in prof.profiler.kineto_results.events() if e.name() == "[memory]"]
    held = peak = 0
    for e in sorted(events, key=lambda e: e.start_ns()):
        held += e.nbytes()
        peak = max(peak, held)
    return peak


def _tensor_files(path: Path) -> dict[str, bytes]:
    return {p.name: p.read_bytes() for p in path.glob("*.distcp")}


def _peak_rank(rank: int, world_size: int, out: str, model: list[str]) -> dict:
    cfg = to_config(compose_config(*BASE, *LARGER, *model))
    rt = Runtime(rank, world_size, rank, world_size, torch.device("cpu"), "gloo")
    messages: list[str] = []
    handler = logging.Handler()
    handler.emit = lambda record: messages.append(record.getMessage())  # type: ignore[method-assign]
    logging.getLogger("dmt.checkpoint").addHandler(handler)
    trainer = Trainer(cfg, rt, Path(out))
    trainer.fit()
    ck = trainer.checkpointer
    assert ck is not None
    state = checkpoint.checkpoint_state(
        trainer.model, trainer.optimizer, rank=rank, ema=trainer.ema
    )
    staged = staged_bytes(state)
    # room for both ranks' copies, and not a byte more
    copies: list[int] = [0] * world_size
    dist.all_gather_object(copies, staged)
    ck.host_memory = lambda: {"host": sum(copies)}
    written = ck.save(
        trainer.model, trainer.optimizer, step=100, epoch=0, batch_in_epoch=0, ema=trainer.ema
    )
    pending = ck._pending is not None
    ck.close()
    ck.async_save = False  # the same state, written synchronously
    again = ck.save(
        trainer.model, trainer.optimizer, step=101, epoch=0, batch_in_epoch=0, ema=trainer.ema
    )
    return {
        "staged": staged,
        "peak": _stager_peak(checkpoint.HostStager().stage, state),
        "dcp_peak": _stager_peak(dcp.FileSystemWriter(tempfile.mkdtemp()).stage, state),
        "async": pending,
        "same_files": _tensor_files(written) == _tensor_files(again) != {},
        "messages": [m for m in messages if "writing it synchronously" in m],
    }


@pytest.mark.parametrize("model", [[], SPTT_EMA], ids=["flat", "sptt-ema"])
def test_staging_takes_the_copy_it_keeps_and_no_more(tmp_path: Path, model: list[str]) -> None:
    """dmt's stager copies each tensor's own elements once: flat and SPTT (with an EMA) alike,
    the host memory it takes at its peak is :func:`staged_bytes`, where DCP's own stager
    (``FileSystemWriter``) deep-copied each sharded table first, with the storage of every
    table of the FBGEMM kernel the shard is a view of (and the kernel's buffer once per table).
    A host with room for the copies saves asynchronously (it used to write synchronously,
    counting that deep copy), and what it writes is a synchronous save's tensor files byte for
    byte."""
    ranks = run_on_ranks(_peak_rank, 2, str(tmp_path), model, timeout_s=180)
    for r in ranks:
        assert r["peak"] == r["staged"]
        assert r["dcp_peak"] > r["staged"] * 1.25
        assert r["same_files"]
    assert [r["async"] for r in ranks] == [True, True]
    assert [r["messages"] for r in ranks] == [[], []]
