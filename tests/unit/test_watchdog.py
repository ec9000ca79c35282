"""The stuck-rank watchdog's bookkeeping (dmt/watchdog.py) on a real TCPStore, polled by hand."""

from __future__ import annotations

import contextlib
import os
import threading
import time
from collections.abc import Iterator

import pytest
import torch.distributed as dist

from dmt.watchdog import (
    LOST_BEATS,
    Watchdog,
    heartbeat_interval,
    process_state,
    watched_peers,
)


def _ranks(server: dist.TCPStore, world_size: int, timeout_s: float) -> list[Watchdog]:
    return [
        Watchdog(
            dist.TCPStore("127.0.0.1", server.port, is_master=False, wait_for_workers=False),
            rank=r,
            world_size=world_size,
            timeout_s=timeout_s,
        )
        for r in range(world_size)
    ]


def test_a_rank_whose_heartbeat_stops_is_named_and_a_finished_one_is_not():
    server = dist.TCPStore("127.0.0.1", 0, is_master=True, wait_for_workers=False)
    ranks = _ranks(server, 3, timeout_s=60)
    for w in ranks:  # start() would also run the thread, which exits the process on a silent peer
        w.store.add(f"heartbeat/{w.rank}", 1)
    for w in ranks:
        w.poll()
    ranks[0].poll()  # has seen every rank's latest beat
    assert ranks[0].silent_peers(0.25) == []
    for _ in range(3):  # rank 1 stopped answering; rank 2 still beats
        time.sleep(0.25)
        ranks[2].poll()
        ranks[0].poll()
    silent = ranks[0].silent_peers(0.5)
    assert [r for r, _ in silent] == [1] and silent[0][1] >= 0.75
    assert (
        ranks[0]
        .describe(silent)
        .startswith(
            "rank 1 stopped answering (no heartbeat for 1 s; trainer.collective_timeout_s=60)"
        )
    )
    ranks[1].store.add("heartbeat/1", 1 << 40)  # what finish() adds: rank 1 left cleanly
    ranks[0].poll()
    time.sleep(0.6)
    assert [r for r, _ in ranks[0].silent_peers(0.5)] == [2]  # rank 2 went quiet too; 1 is done


def test_after_a_failed_collective_a_peer_that_beats_no_more_is_named():
    """Reproduced: rank 1 of a world set by hand, SIGKILLed in training, was reported by rank 0
    as gloo's "Connection closed by peer [127.0.0.1]:<port>", naming no rank (the watchdog named
    only a peer silent for half the timeout). Now rank 0, beating, waits up to LOST_BEATS
    heartbeats for its peers: rank 1's counter stands still, rank 2's (still training) moves, and
    rank 1 is named; one that left with its own error marked itself done, and is not."""
    with _rank_2_beating() as ranks:
        ranks[0].check_after_error(ValueError("not the backend's"))  # returns: no peer silent
        start = time.monotonic()
        lost = ranks[0].lost_peers()  # rank 1 was killed: it beats no more
        assert [r for r, _ in lost] == [1]
        assert time.monotonic() - start >= LOST_BEATS * ranks[0].interval_s
        assert ranks[0].describe(lost).startswith("rank 1 stopped answering (no heartbeat for ")
        ranks[1].store.add("heartbeat/1", 1 << 40)  # what a rank that failed on its own adds
        assert ranks[0].lost_peers() == []


@contextlib.contextmanager
def _rank_2_beating() -> Iterator[list[Watchdog]]:
    """Three ranks' watchdogs on one store (a heartbeat every 0.5 s), each polled once; rank 2
    beats on (training) while the block runs, rank 1 does not."""
    server = dist.TCPStore("127.0.0.1", 0, is_master=True, wait_for_workers=False)
    ranks = _ranks(server, 3, timeout_s=10)
    for w in ranks:
        w.poll()
    stop = threading.Event()

    def rank_2_trains() -> None:
        while not stop.wait(0.1):
            ranks[2].poll()

    beating = threading.Thread(target=rank_2_trains)
    beating.start()
    try:
        yield ranks
    finally:
        stop.set()
        beating.join()


class _Named(Exception):
    """What :meth:`Watchdog.fail` raises here instead of ending the process."""


def test_a_ranks_own_runtime_error_does_not_name_a_slow_peer(monkeypatch):
    """Reproduced: rank 0 of two ranks set by hand raised a RuntimeError of its own (here "CUDA
    out of memory") while rank 1, alive, ran a long call that held the GIL (its heartbeat thread
    starved for a few beats): rank 0 exited with "rank 1 stopped answering (no heartbeat for 4
    s)", its own error never printed. Only gloo's error for a peer whose sockets closed makes
    the watchdog wait for the peers' beats; after it, the peer that beats no more is named."""

    def named(message: str) -> None:
        raise _Named(message)

    with _rank_2_beating() as ranks:  # rank 1 does not beat: alive but starved, or killed
        monkeypatch.setattr(ranks[0], "fail", named)
        for own in (RuntimeError("CUDA out of memory. Tried to allocate 2.00 GiB"), ValueError()):
            ranks[0].check_after_error(own)  # returns: the error propagates, no rank is named
        gloo = "[../gloo/transport/tcp/pair.cc:553] Connection closed by peer [127.0.0.1]:29500"
        with pytest.raises(_Named, match=r"^rank 1 stopped answering \(no heartbeat for "):
            ranks[0].check_after_error(RuntimeError(gloo))


def test_heartbeat_interval_and_process_state():
    assert (
        heartbeat_interval(20) == 1.0
        and heartbeat_interval(600) == 5.0
        and heartbeat_interval(2) == 0.5
    )
    assert process_state(os.getpid()) == "R"


def test_every_rank_is_watched_by_its_neighbors():
    assert watched_peers(0, 2) == [1] and watched_peers(3, 5) == [0, 1, 2, 4]
    world = 1000
    watchers = {r: set() for r in range(world)}
    for rank in range(world):
        peers = watched_peers(rank, world)
        assert len(peers) == 16 and rank not in peers
        for p in peers:
            watchers[p].add(rank)
    assert all(len(w) == 16 for w in watchers.values())
