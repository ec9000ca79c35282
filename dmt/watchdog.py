"""Stuck-rank watchdog: a frozen or dead rank ends the whole job, naming the rank.

Every process group gets ``trainer.collective_timeout_s`` (see :func:`dmt.runtime.init_runtime`),
so a collective waiting on a rank that stopped answering raises after that time. That alone leaves
two gaps, which this module closes:

- gloo's timeout error names no rank (``Timed out waiting 20000ms for recv operation``);
- ``torchrun``'s agent, once the surviving rank has failed, stops the other workers with SIGTERM
  and sends SIGKILL only 30 s later; a rank stopped by SIGSTOP acts on SIGTERM only when
  continued, so the job outlives the timeout by those 30 s.

Each rank runs a :class:`Watchdog` thread that bumps its own heartbeat counter
``dmt/watchdog/<restart>/<run>/heartbeat/<rank>`` in the job's c10d store (the TCPStore at
``MASTER_ADDR:MASTER_PORT``: torchrun's agent or rank 0 holds it) and reads those of its
neighbors (up to 8 on each side: every rank is watched, at a cost independent of the job size).
The counters are compared on each rank's own monotonic clock, so host clocks need not agree. A peer
whose counter has not moved for the timeout, or a collective that fails while a peer's counter has
stood still for half of it, makes the rank log ``rank R stopped answering (no heartbeat for N s)``,
record that message as torchrun's error file (the job summary's root cause), SIGKILL the peer if it
is a stopped sibling process on this host (same torchrun agent; a stopped process ignores
SIGTERM), and leave with exit code :data:`EXIT_CODE`. torchrun's agent then ends the job.

On NCCL the process-group timeout is enforced by torch's own NCCL watchdog
(``TORCH_NCCL_ASYNC_ERROR_HANDLING``, set to 1 by torchrun); this heartbeat runs the same way.
"""

from __future__ import annotations

import logging
import os
import signal
import socket
import sys
import threading
import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from datetime import timedelta
from typing import NoReturn, TypeVar

import torch
import torch.distributed as dist

from dmt.runtime import Runtime

log = logging.getLogger(__name__)

EXIT_CODE = 3
"""Exit status of a rank that gives up because a peer stopped answering."""
FINISHED = 1 << 40
"""Added to a rank's heartbeat counter when it leaves cleanly: peers stop watching it."""


def heartbeat_interval(timeout_s: float) -> float:
    """Seconds between heartbeats: 1/20 of the timeout, within [0.5, 5] s."""
    return min(max(timeout_s / 20.0, 0.5), 5.0)


def store_timeout(timeout_s: float) -> float:
    """Seconds the watchdog waits for one answer of the job's store: two heartbeats, at least 10."""
    return max(heartbeat_interval(timeout_s) * 2, 10.0)


T = TypeVar("T")


def within(seconds: float, call: Callable[[], T]) -> T:
    """``call()``, or ``TimeoutError`` if it has not returned after ``seconds``.

    A TCPStore client's ``add``, ``set`` and ``check`` wait for the answer without the store's
    timeout: forever when the process that serves the store is stopped (SIGSTOP) or its host
    froze (rank 0 serves it under ``srun`` and in a world set by hand). The call runs in a daemon
    thread of its own, which stays blocked in such a case; the watchdog goes on."""
    done: list[T] = []
    error: list[BaseException] = []

    def run() -> None:
        try:
            done.append(call())
        except BaseException as e:  # noqa: BLE001 - raised again in the caller's thread
            error.append(e)

    thread = threading.Thread(target=run, name="dmt-watchdog-store", daemon=True)
    thread.start()
    thread.join(seconds)
    if error:
        raise error[0]
    if not done:
        raise TimeoutError(f"no answer within {seconds:g} s")
    return done[0]


def job_store(timeout_s: float) -> dist.Store | None:
    """A client of the job's TCPStore (``MASTER_ADDR:MASTER_PORT``), or None when there is none."""
    addr, port = os.environ.get("MASTER_ADDR"), os.environ.get("MASTER_PORT")
    if not addr or not port:
        return None
    return dist.TCPStore(
        addr,
        int(port),
        is_master=False,
        wait_for_workers=False,
        timeout=timedelta(seconds=timeout_s),
    )


LOST_BEATS = 3
"""After a collective fails (gloo: ``Connection closed by peer``), a peer whose counter stands
still for this many heartbeats while the rank waits, beating, is named as its cause: a rank killed
(SIGKILL, its host lost) beats no more, while the others do, in the same wait or still training,
and one that failed with an error of its own, or left on Ctrl-C or ``sys.exit``, marks itself done
first (:func:`watch_ranks`). A store whose connection stays closed as long names the rank that
served it (:meth:`Watchdog.lost_store_host`)."""
PEER_GONE = ("Connection closed by peer", "Connection reset by peer", "Broken pipe")
"""What gloo's collectives raise when a peer's sockets closed (its process ended): the errors
after which :meth:`Watchdog.check_after_error` looks for a peer that beats no more. A rank's
own error (a ``RuntimeError`` of torch's: out of memory, a shape) is not one: a peer alive but
slow to beat (a long call that holds the GIL) was named in its place, the error unreported."""


def peer_gone(error: BaseException) -> bool:
    """Whether ``error`` is gloo's for a peer whose sockets closed (:data:`PEER_GONE`)."""
    return isinstance(error, RuntimeError) and any(text in str(error) for text in PEER_GONE)


WATCHED_NEIGHBORS = 8
"""Each rank watches this many ranks on each side of it (in a ring): every rank is watched, and a
poll reads at most ``2 * WATCHED_NEIGHBORS`` counters however large the job."""


def watched_peers(rank: int, world_size: int) -> list[int]:
    """The ranks ``rank`` watches: ``WATCHED_NEIGHBORS`` on each side (all, in small jobs)."""
    near = {(rank + d) % world_size for d in range(-WATCHED_NEIGHBORS, WATCHED_NEIGHBORS + 1)}
    return sorted(near - {rank})


class Watchdog:
    """Heartbeat of this rank and watch over the others (see the module docstring).

    Args:
        store: the job's c10d store (every rank passes a client of the same store).
        rank, world_size: this rank and the number of ranks.
        timeout_s: a peer silent this long is declared stuck (``trainer.collective_timeout_s``).
        namespace: key prefix, distinct per attempt of an elastic job and per run of a process.
        store_host: the rank whose process serves the store (0 under ``srun`` and in a world set
            by hand), None where torchrun's agent serves it.
    """

    def __init__(
        self,
        store: dist.Store,
        *,
        rank: int,
        world_size: int,
        timeout_s: float,
        namespace: str = "dmt/watchdog/0",
        store_host: int | None = None,
    ) -> None:
        self.store = dist.PrefixStore(namespace, store)
        self.store_host = store_host
        self.rank, self.world_size, self.timeout_s = rank, world_size, timeout_s
        self.interval_s = heartbeat_interval(timeout_s)
        self.store_timeout_s = store_timeout(timeout_s)
        self.peers = watched_peers(rank, world_size)
        self._keys = [f"heartbeat/{r}" for r in self.peers]
        now = time.monotonic()
        self._seen: dict[int, tuple[int, float]] = {r: (-1, now) for r in self.peers}
        #: each running peer's "<host> <pid> <parent pid>", read once: fail() asks no store
        self._processes: dict[int, str] = {}
        self._store_ok_at = now
        self._stop = threading.Event()
        self._failing = threading.Lock()
        self._thread = threading.Thread(target=self._run, name="dmt-watchdog", daemon=True)

    # -- lifecycle ----------------------------------------------------------------------------
    def start(self) -> Watchdog:
        self.store.set(
            f"process/{self.rank}", f"{socket.gethostname()} {os.getpid()} {os.getppid()}"
        )
        self.store.add(f"heartbeat/{self.rank}", 1)
        self._thread.start()
        return self

    def finish(self, *, failed: bool = False) -> None:
        """Leave cleanly: stop the thread and tell the peers not to wait for this rank (``failed``:
        leaving on an error, Ctrl-C or ``sys.exit``; see :meth:`mark_done`)."""
        self._stop.set()
        self._thread.join()
        self.mark_done(failed=failed)

    def mark_done(self, *, failed: bool) -> None:
        """Tell the peers not to wait for this rank. ``failed`` (the peers' collectives fail when
        this process ends): the rank that serves the store then keeps it two heartbeats longer,
        so that its watchers read the mark before the store goes with this process (else they
        would take the store's end for this rank's loss: :meth:`lost_store_host`)."""
        try:
            within(self.store_timeout_s, lambda: self.store.add(f"heartbeat/{self.rank}", FINISHED))
        except (RuntimeError, OSError) as e:  # the store's host may have ended first: harmless
            log.debug("rank %d: could not mark itself finished (%s)", self.rank, e)
            return
        if failed and self.rank == self.store_host:
            time.sleep(2 * self.interval_s)

    def stop(self) -> None:
        self._stop.set()
        self._thread.join()

    # -- watching -----------------------------------------------------------------------------
    def poll(self) -> None:
        """One beat: bump this rank's counter, note which peers' counters moved."""
        self.store.add(f"heartbeat/{self.rank}", 1)
        if self.store.check(self._keys):
            values = [int(v) for v in self.store.multi_get(self._keys)]
        else:  # a peer has not started yet: add(key, 0) reads without blocking
            values = [self.store.add(k, 0) for k in self._keys]
        now = time.monotonic()
        self._store_ok_at = now
        for r, v in zip(self.peers, values):
            if v != self._seen[r][0]:
                self._seen[r] = (v, now)
            key = f"process/{r}"
            if v > 0 and r not in self._processes and self.store.check([key]):
                self._processes[r] = self.store.get(key).decode()

    def silent_peers(self, min_age_s: float) -> list[tuple[int, float]]:
        """``(rank, seconds without a heartbeat)`` of running peers silent for ``min_age_s`` or
        more, the longest silent first."""
        now = time.monotonic()
        silent = [
            (r, now - t)
            for r, (v, t) in self._seen.items()
            if v < FINISHED and now - t >= min_age_s
        ]
        return sorted(silent, key=lambda rs: -rs[1])

    def _run(self) -> None:
        while not self._stop.wait(self.interval_s):
            try:
                within(self.store_timeout_s, self.poll)
            except Exception as e:  # noqa: BLE001 - the store may be down with its host
                silent_for = time.monotonic() - self._store_ok_at
                if silent_for >= self.timeout_s:
                    self.fail(
                        f"the job's c10d store stopped answering for {silent_for:.0f} s "
                        f"(MASTER_ADDR={os.environ.get('MASTER_ADDR')}; it lives in torchrun's "
                        f"agent or in rank 0): {e}"
                    )
                continue
            silent = self.silent_peers(self.timeout_s)
            if silent:
                self.fail(self.describe(silent))

    def describe(self, silent: list[tuple[int, float]]) -> str:
        return "; ".join(
            f"rank {r}{' (which hosts the rendezvous store)' if r == self.store_host else ''} "
            f"stopped answering (no heartbeat for {age:.0f} s; "
            f"trainer.collective_timeout_s={self.timeout_s:g})"
            for r, age in silent
        )

    def check_after_error(self, error: Exception) -> None:
        """After a failed collective: if a peer has been silent for half the timeout, or, for an
        ``error`` of the backend's for a peer whose sockets closed (:func:`peer_gone`), stops
        beating now (:meth:`lost_peers`), it is the cause; name it and leave (does not return).
        Otherwise return and let the error propagate."""
        silent = self.silent_peers(self.timeout_s / 2)
        if not silent and peer_gone(error):
            silent = self.lost_peers()
        if silent:
            self.fail(self.describe(silent))

    def lost_peers(self) -> list[tuple[int, float]]:
        """``(rank, seconds without a heartbeat)`` of the running peers whose counters do not
        move for :data:`LOST_BEATS` heartbeats while this rank beats (call with the thread
        stopped); ``[]`` as soon as every peer has moved or is done, or when the store does not
        answer, except when it closed its connection at once: see :meth:`lost_store_host`."""
        try:
            within(self.store_timeout_s, self.poll)  # what the peers had beaten until now
        except dist.DistNetworkError:  # "Failed to recv, got 0 bytes", "Broken pipe"
            return self.lost_store_host()
        except Exception:  # noqa: BLE001 - a stopped store: nothing to tell
            return []
        try:
            since = time.monotonic()
            deadline = since + LOST_BEATS * self.interval_s
            while True:
                time.sleep(self.interval_s)
                within(self.store_timeout_s, self.poll)
                now = time.monotonic()
                still = [
                    (r, now - t) for r, (v, t) in self._seen.items() if v < FINISHED and t <= since
                ]
                if not still or now >= deadline:
                    return sorted(still, key=lambda rs: -rs[1])
        except Exception:  # noqa: BLE001 - the store may be gone with its host: nothing to tell
            return []

    def lost_store_host(self) -> list[tuple[int, float]]:
        """``[(store_host, seconds without a heartbeat)]`` when the rank that serves the store
        (:attr:`store_host`: rank 0 under ``srun`` and in a world set by hand) is a peer of this
        rank, not seen done, and every poll for :data:`LOST_BEATS` heartbeats fails with the
        store's connection error: its process ended, taking the store with it (a rank leaving
        with an error of its own marks itself done first). Else ``[]``."""
        host = self.store_host
        if host is None or host not in self._seen or self._seen[host][0] >= FINISHED:
            return []
        deadline = time.monotonic() + LOST_BEATS * self.interval_s
        while time.monotonic() < deadline:
            time.sleep(self.interval_s)
            try:
                within(self.store_timeout_s, self.poll)
            except dist.DistNetworkError:
                continue
            except Exception:  # noqa: BLE001 - a stopped store: nothing to tell
                return []
            return []  # it answers again
        return [(host, time.monotonic() - self._seen[host][1])]

    def fail(self, message: str) -> NoReturn:
        """Log ``message``, kill stopped local siblings, end this process with :data:`EXIT_CODE`."""
        with self._failing:
            text = f"rank {self.rank}: {message}; ending the job"
            log.error(text)
            print(f"[dmt watchdog] {text}", file=sys.stderr, flush=True)
            for r, _ in self.silent_peers(self.timeout_s / 2):
                self._kill_stopped_sibling(r)
            _record_for_torchrun(text)
            for handler in [*logging.getLogger().handlers, *logging.getLogger("dmt").handlers]:
                handler.flush()
            sys.stdout.flush()
            if self.rank == self.store_host:  # its peers must not name it when the store goes
                self.mark_done(failed=True)
            os._exit(EXIT_CODE)

    def _kill_stopped_sibling(self, peer: int) -> None:
        """SIGKILL ``peer`` if it is a stopped process on this host with our parent (our torchrun
        agent): SIGTERM from the agent would wait until it is continued."""
        try:
            host, pid, ppid = self._processes[peer].split()
        except (KeyError, ValueError):
            return
        if (
            host != socket.gethostname()
            or int(ppid) != os.getppid()
            or process_state(int(pid)) != "T"
        ):
            return
        log.error("rank %d (pid %s) is stopped: sending it SIGKILL", peer, pid)
        try:
            os.kill(int(pid), signal.SIGKILL)
        except ProcessLookupError:
            pass


def process_state(pid: int) -> str | None:
    """Linux process state letter (``R``, ``S``, ``T`` for stopped, ...) or None if unknown."""
    try:
        with open(f"/proc/{pid}/stat") as f:
            return f.read().rsplit(")", 1)[1].split()[0]
    except (OSError, IndexError):
        return None


def _record_for_torchrun(message: str) -> None:
    """Write ``message`` to torchrun's per-rank error file, so the job summary shows it."""
    if not os.environ.get("TORCHELASTIC_ERROR_FILE"):
        return
    from torch.distributed.elastic.multiprocessing.errors import ErrorHandler  # noqa: PLC0415

    try:
        raise StuckRankError(message)
    except StuckRankError as e:
        try:
            ErrorHandler().record_exception(e)
        except Exception:  # noqa: BLE001 - best effort while leaving
            pass


class StuckRankError(RuntimeError):
    """A peer rank stopped answering (recorded for torchrun's summary)."""


_runs = 0


def _ranks_without(has_store: bool, runtime: Runtime) -> list[int]:
    """The ranks without a store, as every rank sees it (one all-gather of a flag over the
    default group; none asked where it is not initialized)."""
    if not dist.is_available() or not dist.is_initialized():
        return [] if has_store else [runtime.rank]
    flags = torch.zeros(runtime.world_size, dtype=torch.int32, device=runtime.device)
    flags[runtime.rank] = int(not has_store)
    dist.all_reduce(flags)
    return [r for r, without in enumerate(flags.tolist()) if without]


@contextmanager
def watch_ranks(runtime: Runtime, *, timeout_s: float) -> Iterator[Watchdog | None]:
    """Run the body under a :class:`Watchdog` (worlds of more than one rank with a job store)."""
    global _runs
    _runs += 1  # every rank runs the same sequence of jobs (a Hydra sweep in one process)
    watchdog = None
    if runtime.world_size > 1:
        try:
            store = job_store(timeout_s=store_timeout(timeout_s))
            reason = "no MASTER_ADDR/MASTER_PORT"
        except (RuntimeError, ValueError) as e:  # DistNetworkError is a RuntimeError
            store, reason = None, f"cannot reach the job's c10d store: {e}"
        # every rank watches, or none: a rank without the store would beat no heartbeat, and
        # the others would end the job, naming that healthy rank
        off = _ranks_without(store is not None, runtime)
        if store is None:
            log.warning(
                "%s: the stuck-rank watchdog is off (process-group timeouts still apply)", reason
            )
        elif off:
            store = None
            log.warning(
                "rank(s) %s cannot reach the job's c10d store: the stuck-rank watchdog is off on "
                "every rank (process-group timeouts still apply)",
                ", ".join(map(str, off)),
            )
        if store is not None:
            restart = os.environ.get("TORCHELASTIC_RESTART_COUNT", "0")
            agent = os.environ.get("TORCHELASTIC_USE_AGENT_STORE") == "True"
            watchdog = Watchdog(
                store,
                rank=runtime.rank,
                world_size=runtime.world_size,
                timeout_s=timeout_s,
                namespace=f"dmt/watchdog/{restart}/{_runs}",
                store_host=None if agent else 0,  # else rank 0 serves it (dmt.runtime._own_store)
            )
    if watchdog is None:
        yield None
        return
    watchdog.start()
    try:
        yield watchdog
    except Exception as e:
        watchdog.stop()
        watchdog.check_after_error(e)  # exits if a silent peer explains the error
        watchdog.finish(failed=True)  # else the peers' check must not take this rank for a lost one
        raise
    except BaseException:  # Ctrl-C, sys.exit: this rank leaves of its own accord, as above
        watchdog.finish(failed=True)
        raise
    watchdog.finish()
