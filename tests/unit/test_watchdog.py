"""The stuck-rank watchdog's bookkeeping (dmt/watchdog.py) on a real TCPStore, polled by hand."""

from __future__ import annotations

import contextlib
import os
import threading
import time
from collections.abc import Iterator
from pathlib import Path

import pytest
import torch
import torch.distributed as dist

from dmt import watchdog as watchdog_module
from dmt.runtime import Runtime
from dmt.watchdog import (
    FINISHED,
    LOST_BEATS,
    Watchdog,
    heartbeat_interval,
    peer_gone,
    process_state,
    store_timeout,
    watch_ranks,
    watched_peers,
    within,
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
        start = time.monotonic()
        assert ranks[0].lost_peers() == []
        # at the first beat that sees every peer moved or done, not after LOST_BEATS of them
        assert time.monotonic() - start < LOST_BEATS * ranks[0].interval_s


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


@pytest.mark.parametrize("leave", [KeyboardInterrupt(), SystemExit(0), SystemExit("stopped")])
def test_a_rank_that_leaves_on_ctrl_c_or_sys_exit_marks_itself_done(monkeypatch, leave):
    """Reproduced: of three ranks set by hand, rank 1 left on Ctrl-C (KeyboardInterrupt) or
    ``sys.exit`` in training; rank 0, its collective failed with gloo's "Connection closed by
    peer", logged "rank 1 stopped answering (no heartbeat for 2 s ...)" and exited with the
    watchdog's status: only a rank's own Exception marked it done. Now every exit from the
    watched body marks the rank done, and its peers do not name it."""
    server = dist.TCPStore("127.0.0.1", 0, is_master=True, wait_for_workers=False)
    monkeypatch.setenv("MASTER_ADDR", "127.0.0.1")
    monkeypatch.setenv("MASTER_PORT", str(server.port))
    monkeypatch.delenv("TORCHELASTIC_RESTART_COUNT", raising=False)
    rank_1 = Runtime(1, 3, 1, 3, torch.device("cpu"), "gloo")
    with pytest.raises(type(leave)), watch_ranks(rank_1, timeout_s=10) as watchdog:
        assert watchdog is not None
        raise leave
    namespace = f"dmt/watchdog/0/{watchdog_module._runs}"
    assert int(server.get(f"{namespace}/heartbeat/1")) > FINISHED
    rank_0 = Watchdog(
        dist.TCPStore("127.0.0.1", server.port, is_master=False, wait_for_workers=False),
        rank=0,
        world_size=3,
        timeout_s=10,
        namespace=namespace,
    )
    assert [r for r, _ in rank_0.lost_peers()] == [2]  # rank 2 never beat; rank 1 is done


def test_a_killed_store_host_is_named_and_one_that_left_on_its_own_is_not():
    """Reproduced: of three ranks set by hand, rank 0 SIGKILLed in training took the store it
    serves with it; ranks 1 and 2 failed with gloo's "Connection closed by peer" alone, naming
    no rank (their watchdog's polls failed, and it gave up). Now a rank whose store closes its
    connection on every poll for LOST_BEATS heartbeats names the store's host, unless it saw
    that rank done (it left with an error of its own, Ctrl-C, sys.exit) or torchrun's agent
    serves the store."""
    for host, done, named in ((0, False, [0]), (0, True, []), (None, False, [])):
        server = dist.TCPStore("127.0.0.1", 0, is_master=True, wait_for_workers=False)
        ranks = [
            Watchdog(
                dist.TCPStore("127.0.0.1", server.port, is_master=False, wait_for_workers=False),
                rank=r,
                world_size=3,
                timeout_s=10,
                store_host=host,
            )
            for r in range(3)
        ]
        for w in ranks:
            w.poll()
        if done:  # what rank 0 adds when it leaves on its own
            ranks[0].store.add("heartbeat/0", FINISHED)
        ranks[1].poll()
        del server  # rank 0's process ended: its store is gone
        start = time.monotonic()
        lost = ranks[1].lost_peers()
        assert [r for r, _ in lost] == named, (host, done)
        if named:
            assert time.monotonic() - start >= LOST_BEATS * ranks[1].interval_s
            message = ranks[1].describe(lost)
            host = "rank 0 (which hosts the rendezvous store) stopped answering (no heartbeat for "
            assert message.startswith(host), message


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
    # two heartbeats are at most 10 s: a store's answer is awaited 10 s whatever the timeout
    assert store_timeout(2) == store_timeout(60) == store_timeout(600) == 10.0
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


def test_silent_peers_longest_silent_first_and_half_the_timeout_names_one() -> None:
    """``silent_peers`` lists the longest silent first (the message names the likeliest cause
    first); after any failed collective, a peer silent for half the timeout is named."""
    store = dist.HashStore()
    ranks = [Watchdog(store, rank=r, world_size=3, timeout_s=0.4) for r in range(3)]
    for w in ranks:
        w.poll()
    ranks[0].poll()
    time.sleep(0.25)  # rank 1 stands still; rank 2 beats once more
    ranks[2].poll()
    ranks[0].poll()
    silent = ranks[0].silent_peers(0)
    assert [r for r, _ in silent] == [1, 2] and silent[0][1] > silent[1][1]

    def named(message: str) -> None:
        raise _Named(message)

    ranks[0].fail = named  # type: ignore[method-assign]
    with pytest.raises(_Named, match=r"^rank 1 stopped answering \(no heartbeat for 0 s; "):
        ranks[0].check_after_error(ValueError("not the backend's"))


def test_within_returns_the_answer_raises_its_error_or_times_out() -> None:
    assert within(10, lambda: (time.sleep(0.2), 7)[1]) == 7  # waits as long as it takes
    with pytest.raises(KeyError):
        within(10, lambda: {}["key"])
    start = time.monotonic()
    with pytest.raises(TimeoutError, match=r"^no answer within 0.05 s$"):
        within(0.05, lambda: time.sleep(1))
    assert time.monotonic() - start < 0.5


def test_only_gloos_errors_for_a_closed_socket_are_a_peer_gone() -> None:
    gloo = "[../gloo/transport/tcp/pair.cc:553] Connection closed by peer [127.0.0.1]:29500"
    assert peer_gone(RuntimeError(gloo)) and peer_gone(dist.DistNetworkError("Broken pipe"))
    assert not peer_gone(RuntimeError("CUDA out of memory. Tried to allocate 2.00 GiB"))
    assert not peer_gone(ValueError(gloo))  # a rank's own error that quotes one


def test_every_job_of_a_process_is_watched_afresh(monkeypatch) -> None:
    """Worlds of two ranks are watched, and a second job in the same process (a Hydra sweep)
    beats under a key of its own: its peers do not read the first job's mark of this rank as
    done. Rank 0 serves the store of a world set by hand (torchrun's agent serves it with
    ``TORCHELASTIC_USE_AGENT_STORE``), and leaving cleanly, it does not wait for its watchers."""
    server = dist.TCPStore("127.0.0.1", 0, is_master=True, wait_for_workers=False)
    monkeypatch.setenv("MASTER_ADDR", "127.0.0.1")
    monkeypatch.setenv("MASTER_PORT", str(server.port))
    rank_0 = Runtime(0, 2, 0, 2, torch.device("cpu"), "gloo")
    for agent, store_host in ((None, 0), ("True", None)):
        if agent is None:
            monkeypatch.delenv("TORCHELASTIC_USE_AGENT_STORE", raising=False)
        else:
            monkeypatch.setenv("TORCHELASTIC_USE_AGENT_STORE", agent)
        start = time.monotonic()
        with watch_ranks(rank_0, timeout_s=10) as watchdog:
            assert watchdog is not None and watchdog.store_host == store_host
            assert watchdog.store.add("heartbeat/0", 0) == 1  # started, not done
        assert time.monotonic() - start < watchdog.interval_s


def test_process_state_of_a_process_whose_name_has_a_parenthesis() -> None:
    """``/proc/<pid>/stat`` puts the name in parentheses; a name may hold ``)`` itself."""
    comm = Path("/proc/self/comm")  # the main thread's name is the process's
    name = comm.read_text().strip()
    comm.write_text("dmt) S (x")
    try:
        assert process_state(os.getpid()) == "R"
    finally:
        comm.write_text(name)
