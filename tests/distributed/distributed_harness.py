"""Run a function on ``G`` processes (gloo on CPU, or nccl) and collect what each rank returns.

On a machine without GPUs, processes start from a ``forkserver`` that has imported torch and
torchrec once, so a test pays a fork, not a fresh interpreter and a torchrec import, per rank
(that matters with 8 ranks on 2 cores). NCCL ranks, and every rank on a machine with GPUs, are
spawned: the forkserver's imports initialize CUDA (FBGEMM's CUDA libraries), and CUDA cannot be
used again in a forked child ("Cannot re-initialize CUDA in forked subprocess" and "CUDA error:
initialization error", both seen on an H100). The default group rendezvouses through a file, so
no port is picked; every collective has a timeout, and the whole run has a deadline after which
the parent kills its children. Every rank has met every other before ``fn`` runs, and after
it returns (a rank that raised does not wait); what ``fn`` returns travels by value. When ranks
fail, the error raised is the one that left ``fn`` first: a rank whose peer raised fails too, with
gloo's "Connection closed by peer", and torch reports whichever failed process it sees first.
Failures outside ``fn`` (the rendezvous, the barriers, pickling the result) are torch's report as
it stands, and an ``fn`` that tears its groups down before re-raising can let a peer's error
leave ``fn`` first.
"""

from __future__ import annotations

import io
import os
import tempfile
import time
import traceback
from collections.abc import Callable
from datetime import timedelta
from pathlib import Path
from typing import Any

import torch
import torch.distributed as dist
import torch.multiprocessing as mp

_START_METHOD = "forkserver"
_PRELOAD = [
    "torch",
    "torch.distributed",
    "torchrec",
    "dmt.sptt.dataflow",
    "dmt.sptt.dmt_sharding",
    "dmt.trainer",
]
mp.get_context(_START_METHOD).set_forkserver_preload(_PRELOAD)

COLLECTIVE_TIMEOUT = timedelta(seconds=30)
END_TIMEOUT = timedelta(seconds=120)  # ranks whose function ends at different times


def _entry(
    rank: int,
    world_size: int,
    init_file: str,
    fn: Callable[..., Any],
    args: tuple[Any, ...],
    results: Any,
    backend: str,
) -> None:
    torch.set_num_threads(1)
    if backend == "nccl":
        torch.cuda.set_device(rank)
    dist.init_process_group(
        backend,
        init_method=f"file://{init_file}",
        rank=rank,
        world_size=world_size,
        timeout=COLLECTIVE_TIMEOUT,
    )
    # torch no longer ends init_process_group with a barrier (TORCH_DIST_INIT_BARRIER=0): a rank
    # whose fn uses no collective could finish and exit while a slower rank was still meeting it,
    # which then failed with "Gloo connectFullMesh failed ... Connection closed by peer" (seen
    # in CI on a loaded machine, and reproduced under load: about 1 in 100 runs)
    dist.barrier()
    try:
        # by value: a tensor pickled by torch.multiprocessing is a file descriptor that the
        # parent fetches from this process, which may have exited by the time the parent reads
        # the queue (FileNotFoundError / ConnectionResetError; 18 of 20 runs under load)
        buffer = io.BytesIO()
        try:
            value = fn(rank, world_size, *args)
        except BaseException:
            with open(f"{init_file}.failed{rank}", "w", encoding="utf-8") as f:
                f.write(f"{time.time()!r}\n{traceback.format_exc()}")
            raise
        torch.save(value, buffer)
        # and none leaves while another still meets it in a group fn created last (new_group
        # has no barrier either): they meet in a store of the harness's own, not in a group,
        # which fn may have replaced by one with a short timeout or destroyed
        done = dist.FileStore(f"{init_file}.done", world_size)
        done.set(f"rank{rank}", "1")
        done.wait([f"rank{r}" for r in range(world_size)], END_TIMEOUT)
        results.put((rank, buffer.getvalue()))
    finally:
        if dist.is_initialized():
            dist.destroy_process_group()


def _loaded(value: bytes) -> Any:
    return torch.load(io.BytesIO(value), weights_only=False)


def _first_failure(init_file: str, world_size: int) -> tuple[int, str] | None:
    """The rank whose ``fn`` raised first, and its traceback (``None``: no ``fn`` raised)."""
    failures = []
    for rank in range(world_size):
        try:  # a file cut short (a rank killed while writing it) is skipped
            when, trace = Path(f"{init_file}.failed{rank}").read_text("utf-8").split("\n", 1)
            failures.append((float(when), rank, trace))
        except (OSError, ValueError):
            continue
    if not failures:
        return None
    _, rank, trace = min(failures)
    return rank, trace


def start_method_for(backend: str, cuda_available: bool | None = None) -> str:
    """How the ranks start: ``spawn`` (a fresh interpreter) for nccl and on any machine with a
    GPU, since CUDA cannot be used in a child forked after it was initialized (the forkserver's
    imports load FBGEMM's CUDA libraries; torch's optimizers query CUDA even for CPU tensors),
    else the preloaded ``forkserver``."""
    if cuda_available is None:
        cuda_available = torch.cuda.is_available()
    return "spawn" if backend == "nccl" or cuda_available else _START_METHOD


def run_on_ranks(
    fn: Callable[..., Any],
    world_size: int,
    *args: Any,
    timeout_s: float = 120.0,
    backend: str = "gloo",
) -> list[Any]:
    """Call ``fn(rank, world_size, *args)`` on ``world_size`` ranks; return results by rank.

    ``fn`` must be a module-level function (it is pickled by name) and runs with the default
    process group initialized (``backend``: gloo, or nccl with rank ``r`` on ``cuda:r``). A
    failure on any rank is re-raised here with its traceback.
    """
    start_method = start_method_for(backend)
    ctx = mp.get_context(start_method)
    results = ctx.SimpleQueue()
    with tempfile.TemporaryDirectory() as tmp:
        init_file = os.path.join(tmp, "rendezvous")
        context = mp.start_processes(
            _entry,
            args=(world_size, init_file, fn, args, results, backend),
            nprocs=world_size,
            join=False,
            start_method=start_method,
        )
        by_rank: dict[int, Any] = {}
        deadline = time.monotonic() + timeout_s
        try:
            while True:
                while not results.empty():
                    rank, value = results.get()
                    by_rank[rank] = _loaded(value)
                if context.join(timeout=0.05):
                    break
                if time.monotonic() > deadline:
                    raise TimeoutError(f"{world_size} ranks did not finish in {timeout_s} s")
        except mp.ProcessRaisedException as reported:
            first = _first_failure(init_file, world_size)
            if first is None or first[0] == reported.error_index:
                raise
            rank, trace = first
            message = f"\n\n-- Process {rank} failed first, with the following error:\n{trace}"
            raise mp.ProcessRaisedException(
                message, rank, context.processes[rank].pid
            ) from reported
        finally:
            for process in context.processes:
                if process.is_alive():
                    process.kill()
        while not results.empty():
            rank, value = results.get()
            by_rank[rank] = _loaded(value)
    assert sorted(by_rank) == list(range(world_size)), sorted(by_rank)
    return [by_rank[r] for r in range(world_size)]


def backends(min_gpus: int) -> list[Any]:
    """``gloo`` (CPU), and ``nccl`` (one GPU per rank) that skips without ``min_gpus`` GPUs: the
    parametrization of tests that must hold on both."""
    import pytest  # noqa: PLC0415

    gpus = torch.cuda.device_count() if torch.cuda.is_available() else 0
    return [
        "gloo",
        pytest.param(
            "nccl",
            marks=pytest.mark.skipif(gpus < min_gpus, reason=f"needs {min_gpus} GPUs, {gpus} here"),
        ),
    ]
