"""Every rank runs the stuck-rank watchdog, or none does (:func:`dmt.watchdog.watch_ranks`).

A reproduced bug: a rank that could not reach the job's store (a connect timeout, no
``MASTER_ADDR``) turned its watchdog off alone and trained on; the others, watching its heartbeat
counter that never moved, ended a healthy job after ``trainer.collective_timeout_s``, naming it.
"""

from __future__ import annotations

import logging
import os
from datetime import timedelta

import pytest
import torch
import torch.distributed as dist

from dmt.runtime import Runtime
from dmt.watchdog import watch_ranks
from tests.distributed.distributed_harness import backends, run_on_ranks


def _watch(rank: int, world_size: int, backend: str) -> tuple[bool, list[str]]:
    device = torch.device("cuda", rank) if backend == "nccl" else torch.device("cpu")
    server = None
    if rank == 0:  # rank 0 reaches a store; rank 1 has none (no MASTER_ADDR)
        server = dist.TCPStore(
            "127.0.0.1", 0, is_master=True, wait_for_workers=False, timeout=timedelta(seconds=30)
        )
        os.environ.update(MASTER_ADDR="127.0.0.1", MASTER_PORT=str(server.port))
    else:
        os.environ.pop("MASTER_ADDR", None)
    messages: list[str] = []
    handler = logging.Handler()
    handler.emit = lambda record: messages.append(record.getMessage())  # type: ignore[method-assign]
    logging.getLogger("dmt.watchdog").addHandler(handler)
    runtime = Runtime(rank, world_size, rank, world_size, device, backend)
    with watch_ranks(runtime, timeout_s=30) as watchdog:
        on = watchdog is not None
    dist.barrier()
    return on, messages


@pytest.mark.parametrize("backend", backends(min_gpus=2))
def test_a_rank_without_the_store_turns_the_watchdog_off_on_every_rank(backend: str) -> None:
    (on0, said0), (on1, said1) = run_on_ranks(_watch, 2, backend, backend=backend)
    assert (on0, on1) == (False, False)
    assert said0 == [
        "rank(s) 1 cannot reach the job's c10d store: the stuck-rank watchdog is off on every "
        "rank (process-group timeouts still apply)"
    ]
    assert len(said1) == 1 and said1[0].startswith("no MASTER_ADDR/MASTER_PORT: the stuck-rank")
