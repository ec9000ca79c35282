"""Run directories: a unique default name, one run at a time, and no run over another's outputs.

- **Unique names.** ``conf/config.yaml`` names runs ``outputs/${dmt.run_stamp:}`` and sweeps
  ``multirun/${dmt.run_stamp:}``: the date, the time and the process id
  (``2025-01-31/14-03-59-12345``), so runs started in the same second differ; in a container,
  whose pids repeat across containers, the host name and 4 random hex digits follow
  (``...-7-<host>-1f3a``). Under ``torchrun``
  the ranks adopt the first rank's stamp through the agent's c10d store, so they agree on one
  directory, and the restarts of an elastic job (same ``TORCHELASTIC_RUN_ID``) keep it.
- **Lock.** Rank 0 holds an ``fcntl.flock`` on ``<run dir>/run.lock`` while the run lives (the
  kernel drops it when the process dies, however it dies), and on ``<sweep dir>/run.lock`` while
  a multirun lives; a second run into a locked directory stops at once, naming the holder, its
  ranks before any of them writes there; a restart of the holder's own job waits for it a while
  (:data:`STALE_LOCK_WAIT_S`: on NFS a dead host's lock outlives it). A run that writes
  checkpoints into a ``trainer.checkpoint_dir`` outside its run directory (absolute, or ``..``
  out of it) holds ``<checkpoint dir>/run.lock`` too, and one whose checkpoint directory is a
  live run's under another name (inside its run directory, or its outside checkpoint directory)
  is refused, so two live runs never write one checkpoint directory.
- **Outputs.** A directory that holds another run's ``metrics.json``, ``history.jsonl`` or
  checkpoints is refused unless this run resumes it (``trainer.resume_from=auto`` or a checkpoint
  inside it or its ``trainer.checkpoint_dir``).

:class:`RunDirGuard` (a Hydra callback, ``conf/config.yaml``) applies the checks before Hydra
writes ``.hydra/`` and the log into the directory; :func:`claim_run_dir` (called by
:func:`dmt.train.train`) applies them again for runs started from Python, under the process group.
"""

from __future__ import annotations

import copy
import errno
import fcntl
import logging
import math
import os
import re
import socket
import sys
import time
import warnings
from collections.abc import Callable, Iterator, Mapping
from contextlib import contextmanager
from datetime import datetime, timedelta
from pathlib import Path, PurePosixPath
from typing import TYPE_CHECKING, Any

from hydra.core.hydra_config import HydraConfig
from hydra.experimental.callback import Callback
from omegaconf import DictConfig, OmegaConf, open_dict, read_write
from omegaconf.errors import OmegaConfBaseException

from dmt.history import CURVES_FILE, HISTORY_FILE
from dmt.results import file_in_the_way

if TYPE_CHECKING:
    from dmt.config import Config
    from dmt.runtime import World

log = logging.getLogger(__name__)

LOCK_FILE = "run.lock"
METRICS_FILE = "metrics.json"
#: the embedding tables' sharding plan, rank 0's (:func:`dmt.sharding.write_sharding_plan`)
PLAN_FILE = "sharding_plan.txt"
HYDRA_FILES = (".hydra/config.yaml", ".hydra/hydra.yaml", ".hydra/overrides.yaml")
STAMP_RESOLVER = "dmt.run_stamp"
RANK_LOG_RESOLVER = "dmt.rank_log_suffix"
RANK_TAG_RESOLVER = "dmt.rank_tag"
JOB_RECORD_RESOLVER = "dmt.job_record"
JOB_LOG_RESOLVER = "dmt.job_log"
#: where :func:`job_refused` keeps its answer, in the job config's resolver cache
JOB_REFUSED_CACHE = "dmt.job_refused"


# -- unique names -------------------------------------------------------------------------------
def run_stamp(now: datetime, pid: int, host: str | None = None) -> str:
    """``YYYY-MM-DD/HH-MM-SS-<pid>``: unique among the processes of a host at any second;
    ``...-<pid>-<host>`` with ``host`` (in a container, whose pids repeat: :func:`stamp_host`)."""
    stamp = f"{now:%Y-%m-%d}/{now:%H-%M-%S}-{pid}"
    return f"{stamp}-{host}" if host else stamp


INIT_PID_NAMESPACE = "pid:[4026531836]"
"""``readlink /proc/self/ns/pid`` in the kernel's initial pid namespace (its fixed inode,
``PROC_PID_INIT_INO``): the host's own processes; a container's differs, whatever ``/proc`` it
mounted."""


def stamp_host(ns_link: Path = Path("/proc/self/ns/pid")) -> str | None:
    """What :func:`run_stamp` appends in a container (a pid namespace other than the host's,
    where pids start again from 1 in every container): the short host name (its first label,
    ``[A-Za-z0-9_-]`` only: the pod's or container's) and 4 random hex digits, since containers
    with the host's network share its host name; ``None`` on the host."""
    try:
        link = os.readlink(ns_link)
    except OSError:
        return None
    if link == INIT_PID_NAMESPACE:
        return None
    host = re.sub(r"[^A-Za-z0-9_-]", "_", socket.gethostname().split(".")[0]) or "container"
    return f"{host}-{os.urandom(2).hex()}"


def agreed_stamp(store: Any, run_id: str, stamp: str) -> str:
    """The stamp of the first process of job ``run_id`` to ask ``store`` (a c10d store)."""
    return store.compare_set(f"dmt/run_stamp/{run_id}", "", stamp).decode()


def slurm_stamp(env: Mapping[str, str]) -> str | None:
    """``slurm/<SLURM_JOB_ID>.<step>`` for a task of a SLURM job step of several tasks outside
    torchrun (``srun dmt-train``), ``None`` otherwise: every task of the step computes the same
    stamp without meeting (their clocks and pids differ, and there is no store before the run
    directory), and a requeued job's step gets its directory again, where
    ``trainer.resume_from=auto`` finds its checkpoints."""
    from dmt.runtime import launcher_env, world_from_env  # noqa: PLC0415

    try:
        # the launcher's variables only: a multirun's later jobs resolve the sweep directory
        # again after the first job's init_runtime exported torchrun's variables
        world = world_from_env(launcher_env(env))
    except ValueError:
        return None  # a launch the runtime refuses, with its message, when training starts
    if world.launcher != "slurm" or world.world_size < 2:
        return None
    step = env.get("SLURM_STEP_ID", env.get("SLURM_STEPID", "0"))
    return f"slurm/{env.get('SLURM_JOB_ID', 'job')}.{step}"


def _resolve_run_stamp() -> str:
    env = os.environ
    if (shared := slurm_stamp(env)) is not None:
        return shared
    stamp = run_stamp(datetime.now(), os.getpid(), stamp_host())
    if env.get("TORCHELASTIC_USE_AGENT_STORE") != "True" or "MASTER_PORT" not in env:
        return stamp
    import torch.distributed as dist  # noqa: PLC0415 - only under torchrun

    store = dist.TCPStore(
        env["MASTER_ADDR"],
        int(env["MASTER_PORT"]),
        is_master=False,
        wait_for_workers=False,
        timeout=timedelta(seconds=60),
    )
    return agreed_stamp(store, env.get("TORCHELASTIC_RUN_ID", "none"), stamp)


def rank_log_suffix() -> str:
    """``""`` for rank 0 (and a world of one), ``".rank<r>"`` for rank ``r > 0``, as the launcher
    numbers this process (:func:`launch_rank`): the log file of each rank (``train.log``,
    ``train.rank1.log``, ...), so that no two processes append to one file, which NFS does not
    keep whole when they run on several hosts."""
    rank = launch_rank()
    return f".rank{rank}" if rank else ""


def rank_tag() -> str:
    """``""`` in a world of one, ``"[rank<r>]"`` on every rank ``r`` of a world of several, as
    the launcher numbers this process (``conf/hydra/job_logging/dmt.yaml`` prefixes the console's
    lines with it): a cluster job's log gathers every rank's lines, rank 17's warning among them."""
    world = launch_world(os.environ)
    return f"[rank{world.rank}]" if world is not None and world.world_size > 1 else ""


def register_resolvers() -> None:
    """Register ``${dmt.run_stamp:}`` (cached per config, like Hydra's ``${now:}``),
    ``${dmt.rank_log_suffix:}`` (:func:`rank_log_suffix`), ``${dmt.rank_tag:}``
    (:func:`rank_tag`), ``${dmt.job_record:}`` (:func:`job_record`) and
    ``${dmt.job_log:<path>}`` (:func:`job_log`)."""
    if not OmegaConf.has_resolver(STAMP_RESOLVER):
        OmegaConf.register_new_resolver(STAMP_RESOLVER, _resolve_run_stamp, use_cache=True)
    if not OmegaConf.has_resolver(RANK_LOG_RESOLVER):
        OmegaConf.register_new_resolver(RANK_LOG_RESOLVER, rank_log_suffix)
    if not OmegaConf.has_resolver(RANK_TAG_RESOLVER):
        OmegaConf.register_new_resolver(RANK_TAG_RESOLVER, rank_tag)
    if not OmegaConf.has_resolver(JOB_RECORD_RESOLVER):
        OmegaConf.register_new_resolver(JOB_RECORD_RESOLVER, job_record)
    if not OmegaConf.has_resolver(JOB_LOG_RESOLVER):
        OmegaConf.register_new_resolver(JOB_LOG_RESOLVER, job_log)


# -- lock ---------------------------------------------------------------------------------------
def _job_id() -> str:
    env = os.environ
    return (
        env.get("TORCHELASTIC_RUN_ID")
        or env.get("SLURM_JOB_ID")
        or f"{socket.gethostname()}:{os.getpid()}"
    )


class RunDirLock:
    """An exclusive ``flock`` on ``<run_dir>/run.lock``; the file records the holder and the
    ``kind`` of directory (:func:`lock_run_dir`). ``others``: the locks of directories outside
    it that the run writes (its ``trainer.checkpoint_dir``: :func:`claim`), released with it."""

    def __init__(self, run_dir: Path, fd: int, kind: str = "run") -> None:
        self.run_dir, self.fd, self.kind = run_dir, fd, kind
        self.others: list[RunDirLock] = []

    def record(self) -> None:
        """Write this process as the holder (what a refused run reports)."""
        os.ftruncate(self.fd, 0)
        os.pwrite(
            self.fd,
            (
                f"pid={os.getpid()} host={socket.gethostname()} job={_job_id()} "
                f"slurm_job={os.environ.get('SLURM_JOB_ID', '-')} "
                f"elastic_run={os.environ.get('TORCHELASTIC_RUN_ID', '-')} "
                f"started={datetime.now().isoformat(timespec='seconds')} kind={self.kind}\n"
            ).encode(),
            0,
        )

    def release(self) -> None:
        while self.others:
            self.others.pop().release()
        _HELD.pop(self.run_dir, None)
        os.close(self.fd)  # closing the descriptor drops the flock


_HELD: dict[Path, RunDirLock] = {}


STALE_LOCK_WAIT_S = 300.0
"""How long a restarted job (a requeued SLURM job, a torchelastic restart) waits for the lock of
its own earlier attempt. A process's ``flock`` goes when it dies, but on NFS the lock of a
*host* that died stays with the file server: NFSv4 frees it when the host's lease ends (Linux's
server: 90 s), NFSv3 only when that host comes back or an administrator clears it. The restart,
possibly on another host, would otherwise stop at once and fail its requeue."""
_LOCK_POLL_S = 2.0


def _holder_fields(lock_path: Path) -> dict[str, str]:
    try:
        return dict(f.split("=", 1) for f in lock_path.read_text().split() if "=" in f)
    except OSError:
        return {}


def _holder(lock_path: Path) -> str:
    fields = _holder_fields(lock_path)
    pid, host, started = (fields.get(k, "?") for k in ("pid", "host", "started"))
    return f"pid {pid} on host {host}, started {started}"


def stale_lock_wait(collective_timeout_s: float) -> float:
    """How long rank 0 may wait for an earlier attempt's lock: :data:`STALE_LOCK_WAIT_S`, at
    most half of ``trainer.collective_timeout_s``, which the other ranks wait for rank 0 at
    start."""
    return min(STALE_LOCK_WAIT_S, collective_timeout_s / 2)


def _restarted_holder(fields: dict[str, str]) -> str | None:
    """If this process restarts the job that holds the lock (the lock file's ``fields``), which
    job and restart (``"SLURM job 7, SLURM_RESTART_COUNT=1"``); else ``None``. A requeued SLURM
    job keeps its ``SLURM_JOB_ID`` (``torchrun --standalone`` in it draws a new run id each
    time); a torchelastic restart keeps its run id, unless that is torchrun's default
    ``none``, which unrelated jobs share."""
    env = os.environ
    for count_var, id_var, field, what in (
        ("SLURM_RESTART_COUNT", "SLURM_JOB_ID", "slurm_job", "SLURM job"),
        ("TORCHELASTIC_RESTART_COUNT", "TORCHELASTIC_RUN_ID", "elastic_run", "torchelastic run"),
    ):
        count, job = env.get(count_var, "0"), env.get(id_var, "")
        restarted = count.isdigit() and int(count) > 0
        if restarted and job not in ("", "-", "none") and fields.get(field) == job:
            return f"{what} {job}, {count_var}={count}"
    return None


#: the ``kind`` of :func:`lock_run_dir` for a run's ``trainer.checkpoint_dir`` outside its run
#: directory (:func:`claim`)
CHECKPOINT_KIND = "checkpoint"


def _named(directory: Path, kind: str) -> tuple[str, str]:
    """How an error names a ``kind`` directory, and the setting that chooses another."""
    if kind == CHECKPOINT_KIND:
        return f"trainer.checkpoint_dir={directory}", "trainer.checkpoint_dir"
    return f"{kind} directory {directory}", f"hydra.{kind}.dir"


def _in_use(run_dir: Path, lock_path: Path, waited: str = "", kind: str = "run") -> ValueError:
    name, setting = _named(run_dir, kind)
    holder = "sweep" if kind == "sweep" else "run"
    return ValueError(
        f"{name} is in use by another {holder} ({_holder(lock_path)}){waited}; "
        f"choose another {setting}, or wait until that {holder} has ended"
    )


def _cannot_make(run_dir: Path, error: OSError, kind: str) -> ValueError:
    """The error for a ``kind`` directory that cannot be made or its lock file not created: a
    Hydra callback's own exception is only a warning to Hydra, whose job then failed with a
    traceback making the same directory."""
    blocking = file_in_the_way(run_dir)
    why = (
        f"{blocking} is not a directory"
        if blocking is not None
        else f"cannot make it or its {LOCK_FILE}: {error.strerror or error}"
    )
    name, setting = _named(run_dir, kind)
    return ValueError(f"{name}: {why}; choose another {setting}")


def _try_flock(fd: int, lock_path: Path, kind: str = "run") -> bool:
    """Take the exclusive lock without blocking: False if another process holds it."""
    try:
        fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
    except BlockingIOError:
        return False
    except OSError as e:  # e.g. NFSv3 without lockd (ENOLCK), Lustre mounted noflock (ENOSYS)
        where = (
            "a trainer.checkpoint_dir"
            if kind == CHECKPOINT_KIND
            else "a hydra.run.dir (hydra.sweep.dir)"
        )
        raise ValueError(
            f"cannot lock {lock_path}: {e.strerror or e} ({errno.errorcode.get(e.errno or 0, e.errno)}): "
            "its file system does not support flock, which keeps a second run out of a live "
            "run's directory; mount it with locking (NFS: lockd or NFSv4; Lustre: -o flock), "
            f"or choose {where} on a file system that has it"
        ) from e
    return True


def lock_held(run_dir: Path) -> bool:
    """Whether a process holds ``run_dir``'s ``run.lock`` (a live run), told without taking it:
    a shared ``flock``, which fails while the exclusive one is held, dropped at once. False
    where it cannot be told (no lock file; a file system without ``flock``: only the outputs
    tell)."""
    lock_path = run_dir / LOCK_FILE
    try:
        fd = os.open(lock_path, os.O_RDONLY)
    except (FileNotFoundError, NotADirectoryError):  # none, or a file where its directory goes
        return False
    try:
        # shared: conflicts with the holder's exclusive lock, allowed on a read-only descriptor
        fcntl.flock(fd, fcntl.LOCK_SH | fcntl.LOCK_NB)
    except BlockingIOError:
        return True
    except OSError:  # e.g. a file system without flock: only the outputs tell
        return False
    finally:
        os.close(fd)  # drops the lock if it was taken
    return False


def held_by_another(run_dir: Path) -> bool:
    """Whether another process holds ``run_dir``'s lock (:func:`lock_held`): not this
    process's own (closing a second descriptor of its file would drop it on NFS), nor an
    earlier attempt of this job's (which the claim waits for)."""
    run_dir = run_dir.absolute()
    if run_dir in _HELD or not lock_held(run_dir):
        return False
    return _restarted_holder(_holder_fields(run_dir / LOCK_FILE)) is None


def _wait_for_earlier_attempt(
    fd: int, run_dir: Path, lock_path: Path, wait_s: float, kind: str = "run"
) -> str | None:
    """Wait up to ``wait_s`` for the lock when this process restarts the job that holds it;
    returns ``None`` once it is taken, else what the error adds (``""``: not waited for)."""
    restart = _restarted_holder(_holder_fields(lock_path))
    what = "checkpoint" if kind == CHECKPOINT_KIND else "run"
    if restart is None or wait_s <= 0:
        return ""  # not ours to wait for
    log.warning(
        "%s directory %s is locked by an earlier attempt of this job (%s; this is %s), "
        "probably on a host that died, whose lock the file server keeps until its lease ends; "
        "waiting up to %.1f s for it",
        what,
        run_dir,
        _holder(lock_path),
        restart,
        wait_s,
    )
    deadline = time.monotonic() + wait_s
    while (left := deadline - time.monotonic()) > 0:
        time.sleep(min(_LOCK_POLL_S, left))
        if _try_flock(fd, lock_path, kind):
            log.info("%s directory %s: the earlier attempt's lock is released", what, run_dir)
            return None
    return (
        f", an earlier attempt of this job ({restart}), still locked after {wait_s:.1f} s: if "
        "its host died, the file server keeps its lock until the host's lease ends (NFSv4) or "
        "the host comes back or an administrator clears it (NFSv3); if it is alive, stop it"
    )


def lock_run_dir(
    run_dir: Path,
    *,
    record: bool = True,
    stale_wait_s: float = STALE_LOCK_WAIT_S,
    kind: str = "run",
) -> tuple[RunDirLock, bool]:
    """Lock ``run_dir`` (created if absent) for this process; returns the lock and whether it was
    taken now (False: this process already holds it). Raises ``ValueError`` naming the holder
    (or, where the directory cannot be made, the file in its way); a restart of the holder's
    own job first waits up to ``stale_wait_s`` for it (:data:`STALE_LOCK_WAIT_S`).
    ``record=False`` leaves the previous holder's record (call :meth:`RunDirLock.record`).
    ``kind``: ``"sweep"`` for a multirun's directory (the error names ``hydra.sweep.dir``),
    :data:`CHECKPOINT_KIND` for a run's checkpoint directory (``trainer.checkpoint_dir``)."""
    run_dir = run_dir.absolute()
    if run_dir in _HELD:
        return _HELD[run_dir], False
    lock_path = run_dir / LOCK_FILE
    try:
        run_dir.mkdir(parents=True, exist_ok=True)
        fd = os.open(lock_path, os.O_RDWR | os.O_CREAT, 0o644)
    except OSError as e:  # e.g. a file where the directory goes, a read-only file system
        raise _cannot_make(run_dir, e, kind) from e
    try:
        if not _try_flock(fd, lock_path, kind):
            why = _wait_for_earlier_attempt(fd, run_dir, lock_path, stale_wait_s, kind)
            if why is not None:
                raise _in_use(run_dir, lock_path, why, kind)
    except BaseException:
        os.close(fd)
        raise
    lock = _HELD[run_dir] = RunDirLock(run_dir, fd, kind)
    if record:
        try:
            lock.record()
        except BaseException:  # e.g. a full disk: release what was taken
            lock.release()
            raise
    return lock, True


# -- outputs ------------------------------------------------------------------------------------
def resumes(run_dir: Path, resume_from: str | None, checkpoint_dir: str = "checkpoints") -> bool:
    """Whether ``trainer.resume_from`` continues the run in ``run_dir``: a path inside it or
    inside its checkpoint directory (an absolute ``checkpoint_dir`` is elsewhere: a checkpoint
    there is the one ``auto`` takes), or ``auto`` when that directory holds a complete
    checkpoint (``auto`` with none would start afresh over the outputs there)."""
    if not resume_from:
        return False
    ckpt = Path(checkpoint_dir)
    root = ckpt if ckpt.is_absolute() else run_dir / ckpt
    if resume_from == "auto":
        from dmt.checkpoint import latest  # noqa: PLC0415 (torch; only when resuming)

        return latest(root) is not None
    # normalized: "<run dir>/../other/checkpoints/step_2" is another run's checkpoint
    inside = Path(os.path.normpath(Path(resume_from).absolute()))
    return any(inside.is_relative_to(os.path.normpath(d.absolute())) for d in (run_dir, root))


def outputs_of(run_dir: Path, checkpoint_dir: str) -> list[str]:
    """The run outputs present in ``run_dir``: ``metrics.json``, a non-empty ``history.jsonl``
    (a run stopped before its end and its first checkpoint leaves only that) and a non-empty
    checkpoint dir (its :data:`LOCK_FILE`, which a run holds there when it is outside the run
    directory, is none: :func:`claim`)."""
    found = []
    if (run_dir / METRICS_FILE).exists():
        found.append(METRICS_FILE)
    history = run_dir / HISTORY_FILE
    if history.is_file() and history.stat().st_size > 0:
        found.append(HISTORY_FILE)
    ckpt = Path(checkpoint_dir)
    ckpt = ckpt if ckpt.is_absolute() else run_dir / ckpt
    if ckpt.is_dir() and any(p.name != LOCK_FILE for p in ckpt.iterdir()):
        found.append(f"{ckpt.relative_to(run_dir) if ckpt.is_relative_to(run_dir) else ckpt}/")
    return found


#: what a finished Optuna sweep leaves beside its jobs (dmt's trials table is rewritten from
#: all the jobs there, so it is not one)
SWEEP_RECORDS = ("optimization_results.yaml",)
#: what Hydra's default ``hydra.sweep.subdir`` (``${hydra.job.num}``) is made of: job numbers,
#: from 0 in every sweep
JOB_NUM_FORMS = ("hydra.job.num", "hydra:job.num")


def job_dirs(sweep_dir: Path, subdir: str) -> list[Path]:
    """The directories in ``sweep_dir`` as deep as ``hydra.sweep.subdir`` puts a job's
    (``${hydra.job.num}``: one level; ``trial/${hydra.job.num}``: two), links left out."""
    depth = len(PurePosixPath(subdir).parts) if subdir else 0
    level = [sweep_dir] if sweep_dir.is_dir() else []
    for _ in range(depth):
        level = [p for d in level for p in sorted(d.iterdir()) if p.is_dir() and not p.is_symlink()]
    return level if depth else []


def sweep_outputs(sweep_dir: Path, checkpoint_dir: str, *, subdir: str | None = None) -> list[str]:
    """The outputs of an earlier sweep in ``sweep_dir``: its own records
    (:data:`SWEEP_RECORDS`) and, given the sweep's ``subdir``, those of its jobs
    (:func:`outputs_of` of each of :func:`job_dirs`, as ``<job>/metrics.json``)."""
    if not sweep_dir.is_dir():
        return []
    found = [name for name in SWEEP_RECORDS if (sweep_dir / name).exists()]
    if subdir is not None:
        shared = Path(checkpoint_dir).is_absolute()  # one for every job: not a job's own
        for job in job_dirs(sweep_dir, subdir):
            outputs = outputs_of(job, checkpoint_dir)
            name = job.relative_to(sweep_dir).as_posix()
            found += [f"{name}/{o}" for o in outputs if not shared or o == METRICS_FILE]
    return found


def starts_afresh(found: list[str], resume_from: str | None) -> bool:
    """Whether a run that does not resume the outputs ``found`` in its directory
    (:func:`outputs_of`) starts afresh over them: ``auto`` where no run finished (no
    ``metrics.json``), e.g. one stopped before its first complete checkpoint."""
    return resume_from == "auto" and METRICS_FILE not in found


#: what a run writes into its directory that a user may have placed there too, and how dmt's
#: own is told from it: dmt writes ``history.jsonl`` (empty, when a run starts afresh) before
#: it draws ``curves.png`` (from that history) or writes ``sharding_plan.txt``
OWN_BESIDE_HISTORY = (
    (CURVES_FILE, f"drew there (no {HISTORY_FILE} it was drawn from)"),
    (PLAN_FILE, f"wrote there (no {HISTORY_FILE}, which a run writes before its plan)"),
)


def _users_own(run_dir: Path) -> list[tuple[str, str]]:
    """The files of :data:`OWN_BESIDE_HISTORY` in ``run_dir`` that no dmt run wrote there."""
    if (run_dir / HISTORY_FILE).exists():
        return []
    return [(name, made) for name, made in OWN_BESIDE_HISTORY if (run_dir / name).exists()]


def check_outputs(run_dir: Path, *, resume_from: str | None, checkpoint_dir: str) -> None:
    """Raise if ``run_dir`` holds another run's outputs and this run does not resume it, or a
    ``curves.png`` or ``sharding_plan.txt`` that no run wrote there (:data:`OWN_BESIDE_HISTORY`):
    a user's own, which a run would replace."""
    run_dir = run_dir.absolute()
    if own := _users_own(run_dir):
        name, made = own[0]
        raise ValueError(
            f"run directory {run_dir} holds a {name} that no dmt run {made}: a run writes its "
            f"own {name} there, and dmt does not replace a file it did not make; choose another "
            f"hydra.run.dir (or leave it unset for a new one), or move that {name} away"
        )
    found = outputs_of(run_dir, checkpoint_dir)
    if found and not resumes(run_dir, resume_from, checkpoint_dir):
        if starts_afresh(found, resume_from):
            # e.g. a SLURM job preempted while it wrote its first checkpoint, and requeued
            log.warning(
                "run directory %s holds no complete checkpoint and no %s, only %s: "
                "trainer.resume_from=auto starts the run afresh there",
                run_dir,
                METRICS_FILE,
                ", ".join(found),
            )
            return
        restarts = os.environ.get("SLURM_RESTART_COUNT", "0")
        requeued = (
            f" (this SLURM job was requeued, SLURM_RESTART_COUNT={restarts}: they are probably "
            "its own earlier attempt's; set trainer.resume_from=auto and trainer.checkpoint_every "
            "for jobs that may be preempted)"
            if restarts.isdigit() and int(restarts) > 0
            else ""
        )
        if resume_from == "auto":  # a finished run without a complete checkpoint
            raise ValueError(
                f"run directory {run_dir} already holds another run's outputs ({', '.join(found)})"
                f" and no complete checkpoint that trainer.resume_from=auto resumes{requeued}; "
                "choose another hydra.run.dir (or leave it unset for a new one)"
            )
        raise ValueError(
            f"run directory {run_dir} already holds another run's outputs ({', '.join(found)})"
            f"{requeued}; choose another hydra.run.dir (or leave it unset for a new one), or "
            "resume that run with trainer.resume_from=auto or trainer.resume_from=<a checkpoint "
            f"in {run_dir}>"
        )


def checkpoint_dir_outside(run_dir: Path, checkpoint_dir: str) -> Path | None:
    """``trainer.checkpoint_dir`` where it lies outside ``run_dir`` (absolute, or ``..`` out of
    it), links resolved; ``None`` inside it (through a link too), where the run directory's
    lock covers it."""
    run_dir = run_dir.resolve()
    ckpt = (run_dir / checkpoint_dir).resolve()
    return None if ckpt.is_relative_to(run_dir) else ckpt


def check_not_in_live_run(run_dir: Path, checkpoint_dir: str) -> None:
    """Raise if the checkpoint directory of a run in ``run_dir`` is another live run's
    directory under another name: inside the run directory of a run (or sweep job) alive now,
    for one outside ``run_dir`` (``/x/a/checkpoints`` while a run of ``/x/a`` writes its
    default ``checkpoints`` there); inside ``run_dir``, one that a live run holds as its own
    outside checkpoint directory (or a directory in it), or one inside a live run's directory
    above ``run_dir`` (``/x/a/sub/ckpt`` while a run of ``/x/a`` may write its
    ``trainer.checkpoint_dir=sub/ckpt`` there: its lock does not say where). Either lock
    alone, the run directory's or the outside checkpoint directory's, kept neither run out. A
    sweep's lock is none (its jobs' directories are in it), nor is this job's own earlier
    attempt's (:func:`held_by_another`)."""
    run_dir = run_dir.resolve()
    ckpt = (run_dir / checkpoint_dir).resolve()
    # every directory it is in but the run directory, whose own lock is the run's
    around = [directory for directory in (ckpt, *ckpt.parents) if directory != run_dir]
    if not ckpt.is_relative_to(run_dir):  # an outside one is locked itself (:func:`_claim`)
        around.remove(ckpt)
    held = {p.resolve() for p in _HELD}
    for directory in around:
        if directory in held or not held_by_another(directory):
            continue
        lock_path = directory / LOCK_FILE
        holder_kind = _holder_fields(lock_path).get("kind", "run")
        if holder_kind == "sweep":
            continue
        if directory == ckpt:
            raise _in_use(ckpt, lock_path, kind=CHECKPOINT_KIND)
        what = "checkpoint" if holder_kind == CHECKPOINT_KIND else "run"
        nested = run_dir.is_relative_to(directory)  # this run's directory is in it too
        choose = "hydra.run.dir or trainer.checkpoint_dir" if nested else "trainer.checkpoint_dir"
        raise ValueError(
            f"trainer.checkpoint_dir={ckpt} is inside {what} directory {directory}, in use by "
            f"another run ({_holder(lock_path)}); choose another {choose}, or wait until that "
            "run has ended"
        )


def claim(
    run_dir: Path,
    *,
    resume_from: str | None,
    checkpoint_dir: str,
    stale_wait_s: float = STALE_LOCK_WAIT_S,
    writes_checkpoints: bool = True,
) -> tuple[RunDirLock, bool]:
    """Lock ``run_dir`` and check its outputs (a locked directory is reported as in use, not for
    its outputs); returns the lock and whether it was taken now. A run that
    ``writes_checkpoints`` into a ``checkpoint_dir`` outside ``run_dir``
    (:func:`checkpoint_dir_outside`) locks that directory too, released with the run
    directory's lock (:attr:`RunDirLock.others`): a second live run there wrote its checkpoints
    beside the first's, failed at a step the first had saved, and moved aside as incomplete a
    checkpoint the first was still writing. A checkpoint directory that is another live run's
    under another name is refused too (:func:`check_not_in_live_run`, before the locks and
    again once they are taken: two runs started together both passed the first)."""

    def check() -> None:
        check_outputs(run_dir, resume_from=resume_from, checkpoint_dir=checkpoint_dir)

    if writes_checkpoints:  # before anything is made
        check_not_in_live_run(run_dir, checkpoint_dir)
    lock, taken = _claim(run_dir, check, checkpoint_dir, stale_wait_s, writes_checkpoints)
    if writes_checkpoints:  # and again once locked: two runs that started together both passed
        try:
            check_not_in_live_run(run_dir, checkpoint_dir)
        except BaseException:
            if taken:
                lock.release()
            raise
    return lock, taken


def _claim(
    run_dir: Path,
    check: Callable[[], None],
    checkpoint_dir: str,
    stale_wait_s: float,
    writes_checkpoints: bool,
) -> tuple[RunDirLock, bool]:
    """:func:`claim`'s locks: the run directory's, and its outside checkpoint directory's."""
    outside = checkpoint_dir_outside(run_dir, checkpoint_dir) if writes_checkpoints else None
    if outside is None:
        return _check_and_lock(run_dir, check, stale_wait_s=stale_wait_s)
    # the run directory waits what the checkpoint directory left: the other ranks wait for both
    deadline = time.monotonic() + stale_wait_s
    claimed: list[tuple[RunDirLock, bool]] = []

    def and_the_run_dir() -> None:  # the checkpoint directory's check
        left = max(0.0, deadline - time.monotonic())
        claimed.append(_check_and_lock(run_dir, check, stale_wait_s=left))

    try:
        checkpoints, taken = _check_and_lock(
            outside, and_the_run_dir, stale_wait_s=stale_wait_s, kind=CHECKPOINT_KIND
        )
    except BaseException:
        for lock, run_taken in claimed:
            if run_taken:
                lock.release()
        raise
    lock, run_taken = claimed[0]
    if taken:
        lock.others.append(checkpoints)
    return lock, run_taken


def _check_and_lock(
    directory: Path, check: Callable[[], None], *, stale_wait_s: float, kind: str = "run"
) -> tuple[RunDirLock, bool]:
    """``check()``, then lock ``directory``; where its lock file is there already (a live run's,
    perhaps), lock first (:func:`lock_then_check`), so that it is reported as in use."""
    if (directory / LOCK_FILE).exists() or directory.absolute() in _HELD:
        return lock_then_check(directory, check, stale_wait_s=stale_wait_s, kind=kind)
    check()
    return lock_run_dir(directory, stale_wait_s=stale_wait_s, kind=kind)


def lock_then_check(
    run_dir: Path, check: Callable[[], None], *, stale_wait_s: float, kind: str = "run"
) -> tuple[RunDirLock, bool]:
    """Lock ``run_dir`` (:func:`lock_run_dir`), then ``check()`` it: the lock file keeps its
    previous holder's record until the check passes, and the lock is released if it raises."""
    lock, taken = lock_run_dir(run_dir, record=False, stale_wait_s=stale_wait_s, kind=kind)
    try:
        check()
        if taken:
            lock.record()
    except BaseException:
        if taken:
            lock.release()
        raise
    return lock, taken


# -- one directory per job ----------------------------------------------------------------------
def agree_on_run_dir(run_dir: Path, *, rank: int, world_size: int, from_hydra: bool) -> Path:
    """Rank 0's run directory, on every rank (call with the default process group up).

    A rank whose ``run_dir`` differs (a launcher that gave each process its own clock) and came
    from Hydra (``from_hydra``) removes the ``.hydra/`` files Hydra wrote there in this process,
    and the directory if nothing else is left in it (its log stays).
    """
    if world_size == 1:
        return run_dir
    import torch.distributed as dist  # noqa: PLC0415

    chosen = [str(run_dir.absolute())]
    dist.broadcast_object_list(chosen, src=0)
    agreed = Path(chosen[0])
    if agreed != run_dir.absolute():
        log.warning("rank %d: using rank 0's run directory %s instead of %s", rank, agreed, run_dir)
        if from_hydra:
            _remove_stray(run_dir)
    return agreed


def _remove_stray(run_dir: Path) -> None:
    for name in HYDRA_FILES:
        (run_dir / name).unlink(missing_ok=True)
    for d in (run_dir / ".hydra", run_dir):
        if d.is_dir() and not any(d.iterdir()):
            d.rmdir()


@contextmanager
def claim_run_dir(
    run_dir: Path,
    *,
    resume_from: str | None,
    checkpoint_dir: str,
    rank: int = 0,
    world_size: int = 1,
    stale_wait_s: float = STALE_LOCK_WAIT_S,
    writes_checkpoints: bool = True,
) -> Iterator[Path]:
    """Hold ``run_dir`` for the body: rank 0 locks it (and a ``checkpoint_dir`` outside it that
    the run ``writes_checkpoints`` into: :func:`claim`) and checks its outputs; every rank
    raises the same ``ValueError`` if it is refused (call with the default process group up)."""
    error, taken, lock = None, False, None
    if rank == 0:
        try:
            lock, taken = claim(
                run_dir,
                resume_from=resume_from,
                checkpoint_dir=checkpoint_dir,
                stale_wait_s=stale_wait_s,
                writes_checkpoints=writes_checkpoints,
            )
        except ValueError as e:
            error = str(e)
    if world_size > 1:
        import torch.distributed as dist  # noqa: PLC0415

        shared = [error]
        dist.broadcast_object_list(shared, src=0)
        error = shared[0]
    if error is not None:
        raise ValueError(error)
    try:
        yield run_dir
    finally:
        if taken and lock is not None:
            lock.release()


def share_verdict(world: World, error: str | None, *, timeout_s: float) -> str | None:
    """Rank 0's verdict on the run's (or sweep's) directory (``None``: it holds the directory;
    else why it is refused) on every rank of ``world``, a world of several, through the
    launcher's store (:func:`dmt.runtime.launch_store`), before any process group: the other
    ranks wait for it before Hydra writes their ``.hydra/`` record and log into the directory,
    so a refused job writes nothing over the records of the run that holds it. Rank 0 passes
    its ``error``. A rank that cannot learn the verdict (no store, no verdict in time) raises
    ``ValueError`` saying so."""
    import torch.distributed as dist  # noqa: PLC0415 (torch)

    from dmt.runtime import launch_store  # noqa: PLC0415 (torch)

    attempt = os.environ.get("TORCHELASTIC_RESTART_COUNT", "0")  # the agent's store outlives it
    try:
        launched = launch_store(world, timedelta(seconds=timeout_s))
    except dist.DistError as e:  # raised from the callback, Hydra warned and ran the job: the
        # rank waited as long again in the runtime's rendezvous, for an error naming nothing
        raise ValueError(
            f"rank {world.rank} cannot reach the job's store at {world.master_addr}:"
            f"{world.master_port} (MASTER_ADDR:MASTER_PORT; rank 0 serves it under srun and in "
            f"a world set by hand, torchrun's agent otherwise) within "
            f"trainer.collective_timeout_s={timeout_s:g} s ({e})"
        ) from None
    store = dist.PrefixStore(f"dmt/run_dir/attempt_{attempt}", launched)
    if world.rank == 0:
        store.set("verdict", error or "")
        if error is not None:  # a store rank 0 serves ends with it: the others read it first
            try:
                store.wait([f"read/{r}" for r in range(1, world.world_size)])
            except dist.DistError:
                pass  # a rank that never came: its launcher ends it
        return error
    try:
        verdict = store.get("verdict").decode()
    except dist.DistError as e:
        raise ValueError(
            f"rank {world.rank} had no verdict on its directory from rank 0 within "
            f"trainer.collective_timeout_s={timeout_s:g} s ({e})"
        ) from None
    store.set(f"read/{world.rank}", "")
    return verdict or None


def _refusal_timeout_s(config: DictConfig) -> float:
    """How long the ranks of a job whose settings are refused wait for rank 0's word:
    ``trainer.collective_timeout_s``, or its default where that is not a positive number (the
    refusal may be of that very setting)."""
    from dmt.config import TrainerConfig  # noqa: PLC0415 (dmt.config imports this module)

    default = TrainerConfig.collective_timeout_s
    try:
        value = float(OmegaConf.select(config, "trainer.collective_timeout_s", default=default))
    except (TypeError, ValueError, OmegaConfBaseException):
        return default
    return value if 0 < value < math.inf else default


def launch_world(environ: Mapping[str, str]) -> World | None:
    """This process's world as its launcher's variables in ``environ`` give it (torchrun or a
    SLURM step), before any process group exists; None when it cannot be told (the runtime
    reports that case)."""
    from dmt.runtime import world_from_env  # noqa: PLC0415 (torch)

    try:
        return world_from_env(environ)
    except ValueError:
        return None


def launch_rank() -> int:
    """This process's rank as its launcher gives it (torchrun or a SLURM step), before any
    process group exists; 0 when it cannot be told (the runtime reports that case)."""
    world = launch_world(os.environ)
    return 0 if world is None else world.rank


#: where each launcher's ranks per host come from (:attr:`dmt.runtime.World.launcher`), as the
#: row-wise check names them (:func:`check_launch_row_wise_rows`)
LOCAL_RANKS_FROM = {
    "torchrun": "LOCAL_WORLD_SIZE",
    "slurm": "the SLURM step's tasks per node",
    "none": "a single process, started without a launcher",
}


def check_launch_row_wise_rows(conf: Config) -> None:
    """:func:`dmt.config.check_row_wise_rows` on this process's launcher's ranks per host
    (torchrun or a SLURM step), named by where they come from, before any process group exists;
    without them where the launcher's world cannot be told (the runtime reports that case)."""
    from dmt.config import check_row_wise_rows  # noqa: PLC0415 (dmt.config imports this module)
    from dmt.runtime import launcher_env  # noqa: PLC0415 (torch)

    world = launch_world(launcher_env(os.environ))
    if world is None:
        check_row_wise_rows(conf)
    else:
        check_row_wise_rows(conf, world.local_world_size, LOCAL_RANKS_FROM[world.launcher])


def check_resume_config(
    config: DictConfig, run_dir: Path, resume_from: str, checkpoint_dir: str
) -> None:
    """Raise ``ValueError`` if the run that resumes ``trainer.resume_from`` (in ``run_dir`` or
    elsewhere) has a config its checkpoint refuses (:func:`dmt.checkpoint.check_config`, as the
    trainer checks it again), an SPTT layout that the launcher's world cannot give (a topology
    whose towers are not the checkpoint model's: :func:`dmt.checkpoint.check_sptt_towers`) or
    that splits a table into other column blocks than its row-wise optimizer state was saved in
    (:func:`dmt.checkpoint.check_sptt_column_blocks`), goes back in ``run_dir``, ends before
    the checkpoint's step or reads other training rows than it trained on, where a preprocessed
    directory already holds them (:func:`train_rows_known`,
    :func:`dmt.checkpoint.check_data_fingerprint`)."""
    from dmt.checkpoint import (  # noqa: PLC0415 (torch)
        check_config,
        check_data_fingerprint,
        check_ends_after,
        check_not_going_back,
        check_sptt_column_blocks,
        check_sptt_towers,
        end_known_from,
        read_meta,
        resume_checkpoint,
    )
    from dmt.config import config_yaml  # noqa: PLC0415 (dmt.config imports this module)
    from dmt.models.partition import load_partition_file  # noqa: PLC0415 (dmt.config)
    from dmt.runtime import world_from_env  # noqa: PLC0415 (torch)
    from dmt.sptt.topology import Topology  # noqa: PLC0415
    from dmt.train import to_config  # noqa: PLC0415 (dmt.train imports this module)

    ckpt = Path(checkpoint_dir)
    root = ckpt if ckpt.is_absolute() else run_dir / ckpt
    path = resume_checkpoint(resume_from, root)
    if path is None:
        return
    check_not_going_back(path, root)
    task = config.copy()  # the job's config: Hydra's callbacks see it with the hydra node
    with open_dict(task):
        task.pop("hydra", None)
    try:
        conf = to_config(task)
    except OmegaConfBaseException:  # e.g. ${hydra:...} in a task key: unset before the job runs
        return  # the trainer checks the config again, once Hydra has set its job up
    partition = conf.model.partition
    if partition.kind == "tp" and partition.recorded_towers is None and partition.path:
        try:  # as the trainer records them; a file it cannot build from, it names
            partition.recorded_towers = load_partition_file(partition.path)
        except ValueError:
            pass
    check_config(path, config_yaml(conf), allow_change=conf.trainer.resume_allow_config_change)
    if (rows := train_rows_known(conf)) is not None:  # as the trainer checks them again
        check_data_fingerprint(path, *rows, allow_change=conf.trainer.resume_allow_config_change)
    if conf.sptt.enabled:  # the topology as the trainer takes it (dmt_sharding.topology_from)
        world = world_from_env(os.environ)
        topology = Topology(
            world_size=world.world_size,
            local_world_size=conf.sptt.local_world_size or world.local_world_size,
            hosts_per_tower=conf.sptt.hosts_per_tower,
        )
        check_sptt_towers(path, topology)
        check_sptt_column_blocks(
            path,
            sharding_type=conf.sptt.sharding_type,
            tower_size=topology.tower_size,
            optim=conf.optim,
        )
    meta = read_meta(path)
    end = end_known_from(meta, conf.trainer)  # None: in its first epoch, before any end
    if end is not None:
        check_ends_after(int(meta["step"]), end, path, conf.trainer)


def train_rows_known(conf: Any) -> tuple[dict[str, Any], str] | None:
    """What identifies the Criteo training rows a run of ``conf`` (a typed config) will read,
    and the setting that names them, as the trainer records and checks them
    (:attr:`dmt.data.DataBundle.train_fingerprint`), where they are known before it starts: its
    ``data.criteo.preprocessed_dir`` holds an intact output (preprocessing uses it as it is, or
    refuses to replace it). None for synthetic data, or a directory the run has yet to write
    (the trainer checks its rows once it has)."""
    from dmt.data.criteo_preprocess import (  # noqa: PLC0415 (numpy)
        output_damage,
        read_manifest,
        train_fingerprint,
    )

    if conf.data.kind != "criteo" or conf.data.criteo is None:
        return None
    root = Path(str(conf.data.criteo.preprocessed_dir))
    try:
        manifest = read_manifest(root)
        if output_damage(root) is not None:  # rebuilt by the run
            return None
        fingerprint = train_fingerprint(root, manifest)
    except (OSError, ValueError):
        return None
    return fingerprint, f"data.criteo.preprocessed_dir={str(root)!r}"


def job_record(*, _root_: DictConfig) -> str | None:
    """``hydra.output_subdir`` (``${dmt.job_record:}``, ``conf/config.yaml``): ``.hydra``, where
    Hydra records a job's config and overrides; ``None``, no record, for a multirun job that
    :func:`claim_run_dir` will refuse for the run in its directory (:func:`job_refused`). Hydra
    writes a job's record before any callback runs: it replaced that run's record with the
    refused job's settings (a second multirun with a subdir per seed, a sweep resumed with other
    settings, a job whose directory was a live run's), and the trials table read the run's
    ``metrics.json`` as the result of settings that never ran."""
    return None if job_refused(_root_) else ".hydra"


def job_log(path: str, *, _root_: DictConfig) -> str:
    """The job's log file (``${dmt.job_log:<path>}``, ``conf/hydra/job_logging/dmt.yaml``):
    ``path``, or ``os.devnull`` for a multirun job that :func:`claim_run_dir` will refuse for
    the run in its directory (:func:`job_refused`): Hydra opens the log before any callback
    runs, and the refused job's lines went into that run's log (its console keeps them)."""
    return os.devnull if job_refused(_root_) else path


def job_refused(root: DictConfig) -> bool:
    """Whether the multirun job of config ``root`` will be refused for the run in its directory
    by :func:`claim_run_dir`: a run alive there (:func:`held_by_another`), or its outputs, unless
    this job resumes them with a config their checkpoint takes. False for a single run
    (:class:`RunDirGuard` refuses it before Hydra writes). Answered once per job directory, in
    the config's resolver cache: Hydra opens the log, then writes the record, by one answer."""
    mode = OmegaConf.select(root, "hydra.mode", default=None)
    output_dir = OmegaConf.select(root, "hydra.runtime.output_dir", default=None)
    if getattr(mode, "name", mode) != "MULTIRUN" or not output_dir:
        return False
    answers = OmegaConf.get_cache(root).setdefault(JOB_REFUSED_CACHE, {})
    if str(output_dir) not in answers:
        answers[str(output_dir)] = _job_refused(root, Path(str(output_dir)))
    return bool(answers[str(output_dir)])


def _job_refused(root: DictConfig, run_dir: Path) -> bool:
    sweep_dir = os.path.abspath(str(OmegaConf.select(root, "hydra.sweep.dir", default="")))
    # a job in the sweep directory itself: its lock is the sweep's, which rank 0 holds
    if os.path.abspath(run_dir) != sweep_dir and held_by_another(run_dir):
        return True
    if _users_own(run_dir):  # a user's own file there: the job says which (check_outputs)
        return True
    resume_from = OmegaConf.select(root, "trainer.resume_from", default=None)
    checkpoint_dir = str(OmegaConf.select(root, "trainer.checkpoint_dir", default="checkpoints"))
    found = outputs_of(run_dir, checkpoint_dir)
    if not found:
        return False
    if not resumes(run_dir, resume_from, checkpoint_dir):
        return not starts_afresh(found, resume_from)
    try:
        check_resume_config(root, run_dir, str(resume_from), checkpoint_dir)
    except ValueError:  # the job says why, once it runs
        return True
    return False


def job_config(config: DictConfig) -> Any:
    """The typed config the job's task function gets: ``config`` without ``hydra``, as Hydra
    makes it (``run_job``)."""
    job = copy.deepcopy(config)
    with read_write(job), open_dict(job):
        del job["hydra"]
    return OmegaConf.to_object(job)


def submits_jobs(config: DictConfig) -> bool:
    """Whether the multirun of ``config`` runs its jobs as jobs of their own
    (hydra-submitit-launcher: ``hydra/launcher=slurm``, one SLURM job per point, whose tasks
    form its world), not in this process: this process only submits them and waits, alone
    whatever SLURM allocation it was started in (an ``salloc`` shell, an ``sbatch`` script of
    several tasks)."""
    target = OmegaConf.select(config, "hydra.launcher._target_", default="")
    return str(target).startswith("hydra_plugins.hydra_submitit_launcher.")


class RunDirGuard(Callback):
    """Hydra callback: refuse a run directory before Hydra writes ``.hydra/`` and the log there
    (exit status 1 and the error on stderr).

    Rank 0 (as torchrun or the SLURM step numbers it) takes the lock here and keeps it until the
    run ends; the other ranks wait for its verdict (:func:`share_verdict`: probing the lock
    would race with rank 0's claim), so none of a refused job's ranks writes into the
    directory. Multirun jobs get fresh directories and are checked by :func:`claim_run_dir`.
    """

    def __init__(self) -> None:
        self.lock: RunDirLock | None = None

    def on_run_start(self, config: DictConfig, **kwargs: Any) -> None:
        from dmt.config import Config, validate  # noqa: PLC0415 (dmt.config imports this module)

        try:
            # the settings first: one that fails leaves no run directory behind (.hydra/, a log,
            # the lock) and says so in one line; ${hydra:...} in them resolves as in the job
            # (Hydra sets the same config again when the job starts)
            HydraConfig.instance().set_config(config)
            conf = job_config(config)
            if isinstance(conf, Config):  # the training root config (not a test's own)
                validate(conf)
                # row-wise tables on the launcher's ranks per host, as dmt.train.train checks
                # them (there each rank raised it, after Hydra wrote the run's directory)
                check_launch_row_wise_rows(conf)
        except (ValueError, OmegaConfBaseException) as e:
            # every rank refuses the same command line: said once, by rank 0 (a job of 64 ranks
            # printed 64 copies), as its verdict, which the others wait for before they exit
            # (torchrun ends the job at the first rank's exit, maybe before rank 0 said it)
            refused = str(e)

            def refuse() -> tuple[RunDirLock, bool]:
                raise ValueError(refused)

            self._hold(refuse, _refusal_timeout_s(config), own_error=refused)
        run_dir = Path(str(config.hydra.run.dir)).absolute()
        resume_from = OmegaConf.select(config, "trainer.resume_from", default=None)
        checkpoint_dir = OmegaConf.select(config, "trainer.checkpoint_dir", default="checkpoints")
        timeout_s = float(OmegaConf.select(config, "trainer.collective_timeout_s", default=600.0))
        writes_checkpoints = bool(
            OmegaConf.select(config, "trainer.checkpoint", default=False)
            or OmegaConf.select(config, "trainer.checkpoint_every", default=0)
        )

        def take() -> tuple[RunDirLock, bool]:
            if resume_from:
                # before Hydra writes this config over the resumed run's .hydra/ record, and
                # before a new run's directory (and its lock) is made for a resume that cannot run
                check_resume_config(config, run_dir, resume_from, checkpoint_dir)
            return claim(
                run_dir,
                resume_from=resume_from,
                checkpoint_dir=checkpoint_dir,
                stale_wait_s=stale_lock_wait(timeout_s),
                writes_checkpoints=writes_checkpoints,
            )

        self._hold(take, timeout_s)

    def _hold(
        self,
        take: Callable[[], tuple[RunDirLock, bool]],
        timeout_s: float,
        *,
        alone: bool = False,
        own_error: str | None = None,
    ) -> None:
        """Rank 0 of the launcher's world takes the directory (``take``: lock and checks, a
        ``ValueError`` if refused) and keeps its lock; every rank learns its verdict
        (:func:`share_verdict`), and all of a refused job's ranks exit with status 1, rank 0
        saying why (once: before the others learn of it). ``alone``: this process is a world of
        one, whatever the launcher's variables say (it submits the sweep's jobs:
        :func:`submits_jobs`). ``own_error``: this rank refuses to run, said by this rank unless
        rank 0 refused."""
        from dmt.runtime import world_from_env  # noqa: PLC0415 (torch)

        try:
            # the launcher's world, or its error (before two ranks 0 of two worlds both claim);
            # alone: the world of one of an environment without a launcher's variables
            world = world_from_env({} if alone else os.environ)
        except ValueError as e:
            sys.exit(f"Error: {e}")
        error = said = None
        own = world.rank == 0  # the error is this rank's to say (not rank 0's verdict)
        if world.rank == 0:
            try:
                lock, taken = take()
                self.lock = lock if taken else None
            except ValueError as e:
                error = str(e)
            if error is not None and world.world_size > 1:
                # said before the others learn of it and exit: torchrun ends the job then
                said = error
                print(f"Error: {error}", file=sys.stderr, flush=True)
        if world.world_size > 1:
            try:
                error = share_verdict(world, error, timeout_s=timeout_s)
            except ValueError as e:  # rank 0 cannot serve the store, another cannot reach it
                error, own = str(e), True
        if error is None and own_error is not None:  # refused here, not by rank 0
            error, own = own_error, True
        if error is not None:
            if self.lock is not None:
                self.lock.release()
                self.lock = None
            # Hydra turns a callback's exception into a warning and runs the job anyway; rank
            # 0's verdict is said once, by rank 0 (not once per rank), every rank exits with 1
            sys.exit(f"Error: {error}" if own and error != said else 1)

    def on_multirun_start(self, config: DictConfig, **kwargs: Any) -> None:
        """Refuse a sweep directory that holds another sweep's outputs where this sweep's jobs
        would go, before Hydra writes ``multirun.yaml`` and each job's ``.hydra/`` over that
        sweep's records (a job is refused only once its own record is rewritten): with a
        ``hydra.sweep.subdir`` of job numbers (the default; they start from 0 again) any job
        directory with outputs, and an earlier Optuna sweep's ``optimization_results.yaml``
        whatever the subdir. Jobs in directories named otherwise (e.g.
        ``subdir=seed_${trainer.seed}``, to add seeds to a study) go on, each refused by
        :func:`claim_run_dir` if its directory holds outputs, with no ``.hydra/`` record of its
        own there (:func:`job_record`). A sweep that resumes (``trainer.resume_from`` set) goes
        on where each numbered job directory holds nothing, or what it resumes. Rank 0 locks the
        sweep directory until the sweep ends, as a run's (a second sweep started into it while
        its jobs have no outputs yet is refused)."""
        sweep_dir = Path(str(config.hydra.sweep.dir)).absolute()
        checkpoint_dir = OmegaConf.select(config, "trainer.checkpoint_dir", default="checkpoints")
        sweep = OmegaConf.to_container(config.hydra.sweep, resolve=False)
        subdir = str(sweep.get("subdir", "")) if isinstance(sweep, dict) else ""
        numbered = any(form in subdir for form in JOB_NUM_FORMS)
        resume_from = OmegaConf.select(config, "trainer.resume_from", default=None)
        timeout_s = float(OmegaConf.select(config, "trainer.collective_timeout_s", default=600.0))

        def check() -> None:
            if resume_from:
                for job in job_dirs(sweep_dir, subdir) if numbered else []:
                    # as a single run's check_outputs: another run's outputs there that this
                    # sweep's job would not resume (auto: no complete checkpoint) stop it before
                    # Hydra writes the job's .hydra/ over their record (and the trials table
                    # reads them)
                    found = outputs_of(job, checkpoint_dir)
                    afresh = starts_afresh(found, resume_from)
                    if found and not afresh and not resumes(job, resume_from, checkpoint_dir):
                        raise ValueError(
                            f"sweep directory {sweep_dir}: job directory {job} holds another "
                            f"run's outputs ({', '.join(found)}) and no checkpoint that "
                            f"trainer.resume_from={resume_from} resumes; choose another "
                            "hydra.sweep.dir (or leave it unset for a new one)"
                        )
                return
            found = sweep_outputs(sweep_dir, checkpoint_dir, subdir=subdir if numbered else None)
            if found:
                shown = ", ".join(found[:4])
                shown += f" and {len(found) - 4} more" if len(found) > 4 else ""
                raise ValueError(
                    f"sweep directory {sweep_dir} already holds another sweep's outputs "
                    f"({shown}); choose another hydra.sweep.dir (or leave it unset for a new "
                    "one), or resume that sweep with trainer.resume_from=auto"
                )

        def take() -> tuple[RunDirLock, bool]:
            # held for the sweep: a second sweep started into it while its jobs have no outputs
            # yet wrote its multirun.yaml and job 0's .hydra/ record over this sweep's
            return lock_then_check(
                sweep_dir, check, stale_wait_s=stale_lock_wait(timeout_s), kind="sweep"
            )

        self._hold(take, timeout_s, alone=submits_jobs(config))

    def on_multirun_end(self, config: DictConfig, **kwargs: Any) -> None:
        self.on_run_end(config)

    def on_run_end(self, config: DictConfig, **kwargs: Any) -> None:
        if self.lock is not None:
            self.lock.release()
            self.lock = None


#: the job logging config (``conf/hydra/job_logging/dmt.yaml``) whose handlers take warnings
JOB_LOGGING = "dmt"


class WarningsToLog(Callback):
    """Hydra callback: while a job runs under ``hydra/job_logging=dmt``, Python's warnings
    (``warnings.warn``: dmt's, torch's, TorchRec's) are log records of logger ``py.warnings``
    (:func:`logging.captureWarnings`), through the job's handlers: the console's lines of a
    world of several name the rank (:func:`rank_tag`), and each rank's log file keeps them.
    Python's filters still decide which warnings show (once per place by default); a recorder
    (``pytest.warns``, ``warnings.catch_warnings(record=True)``) entered inside the job records
    them, one entered around a whole in-process job does not (Python calls the logging hook
    first). Hydra sets the job's logging up before
    :meth:`on_job_start`; under another job logging config (``disabled``: no handlers, which
    would swallow them), and between a sweep's jobs, warnings print to stderr as Python prints
    them."""

    def __init__(self) -> None:
        self.captured = False

    def on_job_start(self, config: DictConfig, *, task_function: Any, **kwargs: Any) -> None:
        if OmegaConf.select(config, "hydra.runtime.choices.hydra/job_logging") == JOB_LOGGING:
            before = warnings.showwarning
            logging.captureWarnings(True)
            # a capture its caller set up already is left to the caller (True again: no change)
            self.captured = warnings.showwarning is not before

    def on_job_end(self, config: DictConfig, job_return: Any, **kwargs: Any) -> None:
        if self.captured:  # only its own: not a capture that the caller of the app set up
            logging.captureWarnings(False)
            self.captured = False
