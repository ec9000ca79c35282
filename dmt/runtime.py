"""The process's place in the job: built once at the entry point and passed in.

The launcher decides the world (:func:`world_from_env`, a pure function of the environment):

- ``torchrun`` sets ``RANK``/``WORLD_SIZE``/``LOCAL_RANK``/``LOCAL_WORLD_SIZE``/``MASTER_ADDR``/
  ``MASTER_PORT``. They win over everything else, so a plain ``torchrun`` inside an ``salloc`` or
  ``sbatch`` allocation works as it does anywhere.
- Otherwise, a task of a SLURM job step (``srun``, or hydra-submitit-launcher's ``hydra/launcher=slurm``,
  which runs one ``srun`` step per sweep point) forms one world of all the step's tasks from SLURM's
  own variables: ``SLURM_STEP_NUM_TASKS``/``SLURM_NTASKS``, the ranks numbered node by node
  (``SLURM_NODEID``, ``SLURM_LOCALID`` and the step's tasks per node: ``SLURM_PROCID`` under the
  default block distribution, and hosts of consecutive ranks under any ``--distribution``), and
  the first host of the step's node list (node 0's, rank 0's) as the rendezvous host, on
  port ``12000 + (SLURM_JOB_ID + 7919 * SLURM_STEP_ID) % 20000`` (:func:`slurm_port`: below Linux's
  ephemeral ports, and different for steps of one job that run at once) unless
  ``MASTER_ADDR``/``MASTER_PORT`` are set.
- Without either, dmt runs as a world of one on an in-process store, so the same TorchRec sharded
  code path (DistributedModelParallel, fused kernels) serves a laptop run. A process that sees a
  multi-task SLURM job but would come up as a world of one (started in the batch script rather than
  by ``srun``, or ``torchrun`` with one process per task), or a ``torchrun`` alone in its rendezvous
  in each of several tasks of a step (``srun -N2 torchrun --standalone``: a world per node) stops
  with an error instead of training apart.

submitit's ``TorchDistributedEnvironment`` computes the SLURM part from ``os.environ`` of an active
submitit job only (not a plain ``srun``), and takes ``num_tasks // num_nodes`` as the local world
size, so dmt reads the variables itself and exports the same torchrun variables that its
``export()`` does (TorchRec reads ``LOCAL_WORLD_SIZE``/``LOCAL_RANK`` from the environment too).
"""

from __future__ import annotations

import itertools
import logging
import os
import re
import socket
import uuid
from collections.abc import Callable, Mapping, MutableMapping, Sequence
from dataclasses import dataclass
from datetime import timedelta

import torch
import torch.distributed as dist

log = logging.getLogger(__name__)

TORCHRUN_VARS = (
    "RANK",
    "WORLD_SIZE",
    "LOCAL_RANK",
    "LOCAL_WORLD_SIZE",
    "GROUP_WORLD_SIZE",
    "MASTER_ADDR",
    "MASTER_PORT",
)
SLURM_VARS = (
    "SLURM_JOB_ID",
    "SLURM_STEP_ID",
    "SLURM_PROCID",
    "SLURM_NTASKS",
    "SLURM_STEP_NUM_TASKS",
    "SLURM_LOCALID",
    "SLURM_NODEID",
    "SLURM_STEP_TASKS_PER_NODE",
    "SLURM_TASKS_PER_NODE",
    "SLURM_NTASKS_PER_NODE",
    "SLURM_STEP_NODELIST",
    "SLURM_JOB_NODELIST",
)
SLURM_PORT_BASE = 12000
SLURM_PORT_RANGE = 20000
SLURM_PORT_STEP_STRIDE = 7919  # prime to SLURM_PORT_RANGE: no two steps of a job share a port


@dataclass(frozen=True)
class World:
    """Where a process sits in its job, as its launcher describes it (no process group yet).

    ``master_addr``/``master_port`` are ``None`` for a world of one on an in-process store.
    """

    rank: int
    world_size: int
    local_rank: int
    local_world_size: int
    master_addr: str | None
    master_port: int | None
    launcher: str  # "torchrun", "slurm" or "none"
    #: SLURM's number of this task (``SLURM_PROCID``) and of its node in the step
    #: (``SLURM_NODEID``), for a SLURM world: ``rank`` numbers the tasks node by node whatever
    #: ``srun --distribution`` placed where (:func:`_slurm_world`)
    slurm_task: int | None = None
    slurm_node: int | None = None

    def torchrun_env(self) -> dict[str, str]:
        """The torchrun variables of this world (what ``init_process_group``'s ``env://`` reads)."""
        env = {
            "RANK": str(self.rank),
            "WORLD_SIZE": str(self.world_size),
            "LOCAL_RANK": str(self.local_rank),
            "LOCAL_WORLD_SIZE": str(self.local_world_size),
        }
        if self.master_addr is not None:
            env["MASTER_ADDR"] = self.master_addr
            env["MASTER_PORT"] = str(self.master_port)
        return env


@dataclass(frozen=True)
class Runtime:
    """Rank, world and device of this process."""

    rank: int
    world_size: int
    local_rank: int
    local_world_size: int
    device: torch.device
    backend: str

    @property
    def is_main(self) -> bool:
        return self.rank == 0


def _int(env: Mapping[str, str], name: str, default: int | None = None) -> int:
    if name not in env:
        if default is None:
            raise ValueError(f"environment variable {name} is not set ({_seen(env)})")
        return default
    try:
        return int(env[name])
    except ValueError:
        raise ValueError(f"environment variable {name}={env[name]!r} is not an integer") from None


def first_host(nodelist: str) -> str:
    """First host of a SLURM node list: ``gpu-[003-004,007],cpu1`` -> ``gpu-003``."""
    group = re.match(r"[^,\[\]]*(\[[^\[\]]*\][^,\[\]]*)*", nodelist.strip())
    assert group is not None  # the pattern matches every string
    host = re.sub(r"\[([^\]\-,]*)[^\]]*\]", r"\1", group.group(0))
    rest = nodelist.strip()[group.end() :]
    if not host or (rest and not rest.startswith(",")):
        raise ValueError(f"cannot read the first host of the SLURM node list {nodelist!r}")
    return host


def tasks_per_node(spec: str) -> list[int]:
    """Expand SLURM's tasks-per-node form: ``2(x3),1`` -> ``[2, 2, 2, 1]``."""
    counts: list[int] = []
    for part in spec.split(","):
        m = re.fullmatch(r"\s*(\d+)(?:\(x(\d+)\))?\s*", part)
        if m is None:
            raise ValueError(f"cannot read SLURM tasks per node {spec!r} (expected e.g. '2(x3),1')")
        counts += [int(m.group(1))] * int(m.group(2) or 1)
    return counts


def _seen(env: Mapping[str, str]) -> str:
    seen = [f"{k}={env[k]}" for k in TORCHRUN_VARS + SLURM_VARS if k in env]
    return ", ".join(seen) if seen else "no torchrun or SLURM variables"


def _torchrun_world(env: Mapping[str, str]) -> World:
    missing = [k for k in ("RANK", "WORLD_SIZE") if k not in env]
    if missing:
        raise ValueError(
            f"torchrun-style launch needs both RANK and WORLD_SIZE; {' and '.join(missing)} "
            f"missing ({_seen(env)})"
        )
    world_size = _int(env, "WORLD_SIZE")
    rank = _int(env, "RANK")
    # a rank outside the world would wait in the rendezvous until the timeout (rank 0 waits for
    # ranks 0 .. WORLD_SIZE-1 only), and so would its peers
    if not 0 <= rank < world_size:
        raise ValueError(
            f"RANK={rank} is not a rank of a world of WORLD_SIZE={world_size} (expected 0 <= "
            f"RANK < WORLD_SIZE; {_seen(env)})"
        )
    # without them, every rank on one host, numbered as torchrun numbers them (agree_on_hosts
    # refuses a world whose ranks run elsewhere than these say)
    local_world_size = _int(env, "LOCAL_WORLD_SIZE", world_size)
    if local_world_size < 1:
        raise ValueError(
            f"LOCAL_WORLD_SIZE={local_world_size}: the ranks on this host must be at least 1 "
            f"({_seen(env)})"
        )
    rendezvous = world_size > 1 or "MASTER_ADDR" in env
    if rendezvous and not ("MASTER_ADDR" in env and "MASTER_PORT" in env):
        raise ValueError(
            f"torchrun-style launch of {world_size} processes needs MASTER_ADDR and MASTER_PORT "
            f"({_seen(env)})"
        )
    return World(
        rank=rank,
        world_size=world_size,
        local_rank=_int(env, "LOCAL_RANK", rank % max(local_world_size, 1)),
        local_world_size=local_world_size,
        master_addr=env["MASTER_ADDR"] if rendezvous else None,
        master_port=_int(env, "MASTER_PORT") if rendezvous else None,
        launcher="torchrun",
    )


def _slurm_world(env: Mapping[str, str]) -> World:
    """A SLURM step's world. Ranks are numbered node by node, in the order of the step's node
    list (``SLURM_NODEID``), then by ``SLURM_LOCALID``: under ``srun``'s default block
    distribution that is ``SLURM_PROCID``; under ``--distribution=cyclic`` or ``plane`` (task 1 on
    the second node) or ``arbitrary`` (``SLURM_HOSTFILE``: task 0 on any node) it is not, and
    ``SLURM_PROCID`` would give TorchRec's plans and SPTT's towers hosts whose ranks sit on
    several nodes, and under ``arbitrary`` a rank 0 away from the rendezvous host (the first host
    of the node list), where the others would wait for it until the timeout."""
    world_size = _int(env, "SLURM_STEP_NUM_TASKS", _int(env, "SLURM_NTASKS", 1))
    if world_size == 1:
        return World(0, 1, 0, 1, None, None, "slurm")
    task = _int(env, "SLURM_PROCID")
    local_rank = _int(env, "SLURM_LOCALID")
    per_node_spec = env.get("SLURM_STEP_TASKS_PER_NODE", env.get("SLURM_TASKS_PER_NODE"))
    per_node = tasks_per_node(per_node_spec) if per_node_spec is not None else None
    # the node decides the rank: no default where there are several (two "rank 0"s would each
    # serve a store); srun always sets it
    decides = len(per_node) > 1 if per_node is not None else "SLURM_NTASKS_PER_NODE" in env
    node = _int(env, "SLURM_NODEID") if decides else _int(env, "SLURM_NODEID", 0)
    if per_node is not None:
        if node >= len(per_node):
            raise ValueError(f"SLURM_NODEID={node} is outside the tasks per node {per_node_spec!r}")
        local_world_size = per_node[node]
        rank = sum(per_node[:node]) + local_rank
    elif "SLURM_NTASKS_PER_NODE" in env:
        local_world_size = _int(env, "SLURM_NTASKS_PER_NODE")
        rank = node * local_world_size + local_rank
    else:
        local_world_size = world_size
        rank = task
    if local_rank >= local_world_size or rank >= world_size:
        raise ValueError(
            f"SLURM_LOCALID={local_rank} on node SLURM_NODEID={node} does not fit the step's "
            f"{world_size} tasks, {local_world_size} on this node ({_seen(env)})"
        )
    nodelist = env.get(
        "SLURM_STEP_NODELIST", env.get("SLURM_JOB_NODELIST", env.get("SLURM_NODELIST"))
    )
    if "MASTER_ADDR" in env:
        master_addr = env["MASTER_ADDR"]
    elif nodelist:
        master_addr = first_host(nodelist)  # node 0's, where rank 0 runs
    else:
        raise ValueError(f"SLURM step of {world_size} tasks without a node list ({_seen(env)})")
    if "MASTER_PORT" in env:
        master_port = _int(env, "MASTER_PORT")
    elif "SLURM_JOB_ID" in env:
        step = "SLURM_STEP_ID" if "SLURM_STEP_ID" in env else "SLURM_STEPID"
        master_port = slurm_port(_int(env, "SLURM_JOB_ID"), _int(env, step, 0))
    else:
        raise ValueError(f"SLURM step of {world_size} tasks without SLURM_JOB_ID ({_seen(env)})")
    return World(
        rank=rank,
        world_size=world_size,
        local_rank=local_rank,
        local_world_size=local_world_size,
        master_addr=master_addr,
        master_port=master_port,
        launcher="slurm",
        slurm_task=task,
        slurm_node=node,
    )


def world_from_env(env: Mapping[str, str]) -> World:
    """The world this process belongs to, from its launcher's environment variables.

    torchrun's variables win over SLURM's; a SLURM step task (``SLURM_PROCID`` and ``SLURM_STEP_ID``
    set) forms a world of the step's tasks; anything else is a world of one. Raises ``ValueError``
    when the job has several SLURM tasks but this process would come up as a world of one.

    Example::

        >>> world_from_env({"SLURM_JOB_ID": "7", "SLURM_STEP_ID": "0", "SLURM_PROCID": "1",
        ...                 "SLURM_NTASKS": "2", "SLURM_LOCALID": "0", "SLURM_NODEID": "1",
        ...                 "SLURM_TASKS_PER_NODE": "1(x2)", "SLURM_JOB_NODELIST": "n[1-2]"})
        World(rank=1, world_size=2, local_rank=0, local_world_size=1, master_addr='n1', master_port=12007, launcher='slurm', slurm_task=1, slurm_node=1)
    """
    if "RANK" in env or "WORLD_SIZE" in env:
        world = _torchrun_world(env)
    elif "SLURM_PROCID" in env and ("SLURM_STEP_ID" in env or "SLURM_STEPID" in env):
        world = _slurm_world(env)
    else:
        world = World(0, 1, 0, 1, None, None, "none")
    slurm_tasks = _int(env, "SLURM_STEP_NUM_TASKS", _int(env, "SLURM_NTASKS", 1))
    if world.world_size == 1 and slurm_tasks > 1:
        raise ValueError(
            f"this process is one of {slurm_tasks} SLURM tasks but would train as a world of one "
            f"({_seen(env)}); start one dmt process per task in a job step (srun, or "
            "hydra/launcher=slurm), or give torchrun a world that covers the job's tasks"
        )
    in_step = "SLURM_STEP_ID" in env or "SLURM_STEPID" in env
    if (
        world.launcher == "torchrun"
        and in_step
        and slurm_tasks > 1
        and env.get("GROUP_WORLD_SIZE", "").strip() == "1"
        # an elastic world (--nnodes=1:2, one --rdzv-id) restarted on the node left after a
        # failure; never --standalone's, whose run id is a fresh uuid4 and whose restart after
        # this very refusal would train apart
        and not (
            _int(env, "TORCHELASTIC_RESTART_COUNT", 0) > 0
            and not _is_uuid(env.get("TORCHELASTIC_RUN_ID", ""))
        )
    ):
        raise ValueError(
            f"this process's torchrun is alone in its rendezvous (GROUP_WORLD_SIZE=1) but is one "
            f"of {slurm_tasks} tasks of a SLURM job step, so each task's torchrun would train a "
            f"world of {world.world_size} of its own ({_seen(env)}); give torchrun "
            f"--nnodes={slurm_tasks} and one --rdzv-endpoint for all tasks, or start it in a "
            "step of one task (srun --ntasks=1)"
        )
    return world


def _is_uuid(text: str) -> bool:
    try:
        uuid.UUID(text)
    except ValueError:
        return False
    return True


def slurm_port(job_id: int, step_id: int) -> int:
    """The rendezvous port of a SLURM job step without ``MASTER_PORT``: ``12000 + (job_id +
    7919 * step_id) % 20000``, below Linux's default ephemeral ports (32768-60999, where another
    process's connection may hold it), and different for every step of a job (7919 is prime to
    20000), so two steps that run at once on one node never meet in one store."""
    return SLURM_PORT_BASE + (job_id + SLURM_PORT_STEP_STRIDE * step_id) % SLURM_PORT_RANGE


def cuda_index(local_rank: int, device_count: int) -> int:
    """CUDA device of a local rank: its own index, or 0 when the launcher binds one GPU per task."""
    if local_rank < device_count:
        return local_rank
    if device_count == 1:
        return 0
    raise ValueError(
        f"local rank {local_rank} has no CUDA device: {device_count} visible "
        "(CUDA_VISIBLE_DEVICES); give each node one GPU per task"
    )


def init_runtime(device: str = "auto", *, timeout_s: float = 600.0, job: str = "run") -> Runtime:
    """Initialize the default process group (gloo on CPU, nccl on CUDA) and return the runtime.

    The world comes from :func:`world_from_env`; a SLURM world is exported as torchrun variables
    (``RANK``, ``WORLD_SIZE``, ``LOCAL_RANK``, ``LOCAL_WORLD_SIZE``, ``MASTER_ADDR``,
    ``MASTER_PORT``) so that TorchRec, which reads some of them, sees the same world.

    ``job``: the same name on every rank for one job of a multirun, different for the others
    (:func:`dmt.train.train` gives Hydra's job number and overrides); without torchrun's agent,
    ranks meet only in the same job (:func:`_own_store`).
    """
    # one count decides both whether and which: before CUDA starts in this process, torch counts
    # the devices CUDA_VISIBLE_DEVICES shows now, which can differ from is_available()'s answer
    visible = torch.cuda.device_count() if device != "cpu" else 0
    use_cuda = device == "cuda" or (device == "auto" and visible > 0)
    world = world_from_env(launcher_env(os.environ))
    backend = "nccl" if use_cuda else "gloo"
    # a rank without its device says so through the rendezvous store, so that every rank fails
    # with its message at once rather than waiting for it until the timeout
    problem = ""
    dev = torch.device("cpu")
    try:
        if device == "cuda" and visible == 0:
            raise ValueError("trainer.device=cuda but no CUDA device is available")
        if use_cuda:
            dev = torch.device("cuda", cuda_index(world.local_rank, visible))
            try:
                torch.cuda.set_device(dev)
            except RuntimeError as err:  # busy (exclusive mode), failed (ECC), out of memory
                raise ValueError(
                    f"{dev} (local rank {world.local_rank}) cannot be used: "
                    f"{type(err).__name__}: {err}"
                ) from err
    except ValueError as err:
        if world.master_addr is None or dist.is_initialized():
            raise
        problem = str(err)
    if not dist.is_initialized():
        timeout = timedelta(seconds=timeout_s)
        if world.master_addr is None:
            dist.init_process_group(
                backend, store=dist.HashStore(), rank=0, world_size=1, timeout=timeout
            )
        else:
            if os.environ.get("TORCHELASTIC_USE_AGENT_STORE") == "True":
                store = _elastic_store(world.world_size, world.rank, timeout)
            else:
                _export(world, os.environ)
                store = _own_store(world, timeout, job)
            agree_on_devices(store, world.rank, world.world_size, problem)
            agree_on_backend(store, world.rank, world.world_size, backend)
            agree_on_hosts(
                store, world.rank, world.world_size, world.local_world_size, world.local_rank
            )
            dist.init_process_group(
                backend, store=store, rank=world.rank, world_size=world.world_size, timeout=timeout
            )
        global _world_number
        _world_number += 1
    if use_cuda and world.world_size > 1:
        try:
            _check_own_gpus(world.rank, world.world_size, dev)
        except ValueError:
            dist.destroy_process_group()  # a multirun's next job starts afresh
            raise
    rendezvous = (
        "in-process store"
        if world.master_addr is None
        else f"{world.master_addr}:{world.master_port}"
    )
    launcher = world.launcher
    if world.slurm_task is not None:
        launcher += f" task {world.slurm_task} on node {world.slurm_node}"
    log.info(
        "rank %d of %d (local rank %d of %d, launcher %s, rendezvous %s, %s on %s)",
        world.rank,
        world.world_size,
        world.local_rank,
        world.local_world_size,
        launcher,
        rendezvous,
        backend,
        dev,
    )
    return Runtime(
        world.rank, world.world_size, world.local_rank, world.local_world_size, dev, backend
    )


def _disagreement(entries: Sequence[str], key: Callable[[str], int | str] = str) -> str | None:
    """``None`` when every rank's entry (``entries[rank]``: ``"<value> on <host>"``) has the same
    value; else each value (sorted by ``key``) with its ranks and its first rank's host."""
    ranks: dict[str, list[int]] = {}
    for rank, entry in enumerate(entries):
        ranks.setdefault(entry.split(" ", 1)[0], []).append(rank)
    if len(ranks) < 2:
        return None
    return "; ".join(
        f"{value} on ranks {r} ({entries[r[0]].split(' on ', 1)[-1]}{', ...' if len(r) > 1 else ''})"
        for value, r in sorted(ranks.items(), key=lambda item: key(item[0]))
    )


def mixed_backends(backends: Sequence[str]) -> str | None:
    """``None`` when every rank (``backends[rank]``: ``"<backend> on <host>"``) chose the same
    backend; else a message naming the ranks of each choice."""
    if (chosen := _disagreement(backends)) is None:
        return None
    return (
        f"the ranks chose different backends ({chosen}): with trainer.device=auto a rank picks "
        "nccl only where it sees a GPU; make every rank see its GPU (CUDA_VISIBLE_DEVICES, "
        "SLURM --gpus-per-task) or set trainer.device=cuda or cpu on all of them"
    )


def device_problems(problems: Sequence[str]) -> str | None:
    """``None`` when no rank has a problem with its device (``problems[rank]``: ``""`` or the
    rank's message); else one message naming the ranks and the first rank's problem."""
    ranks = [rank for rank, problem in enumerate(problems) if problem]
    if not ranks:
        return None
    return f"ranks {ranks} have no device to run on; rank {ranks[0]}: {problems[ranks[0]]}"


def agree_on_devices(store: dist.Store, rank: int, world_size: int, problem: str) -> None:
    """Every rank has its device (``problem == ""``), or every rank raises the same
    ``ValueError`` naming the ranks without one, before the group starts: the others would
    otherwise wait in the rendezvous for a rank that has already failed, until the timeout."""
    _judge_through_store(store, rank, world_size, "dmt/runtime/device", problem, device_problems)


def uneven_hosts(layouts: Sequence[str]) -> str | None:
    """``None`` when every rank (``layouts[rank]``: ``"<local world size> on <host>"``) counts
    the same number of ranks on its host; else a message naming the ranks of each count."""
    if (counts := _disagreement(layouts, key=int)) is None:
        return None
    return (
        f"the ranks count different numbers of ranks per host (local world size {counts}): "
        "TorchRec's plans and SPTT's towers need the same number on every host; launch as many "
        "tasks on each node (SLURM --ntasks-per-node, torchrun --nproc-per-node, "
        "LOCAL_WORLD_SIZE)"
    )


def misplaced_ranks(layouts: Sequence[str]) -> str | None:
    """``None`` when the ranks are numbered host by host: with ``L`` ranks per host, ranks
    ``kL .. kL + L - 1`` are local ranks ``0 .. L - 1`` of one host (``layouts[rank]``:
    ``"<local world size> <local rank> on <host>"``, the same local world size on every rank);
    else a message naming the first group of ranks that is not. TorchRec's plans and SPTT's
    towers take ranks ``kL .. kL + L - 1`` for host ``k``: numbered otherwise, a "host" would
    span several machines and its intra-host traffic would cross the network. Ranks of different
    groups may share a host name (hosts emulated on one machine)."""
    entries = [entry.split(" on ", 1) for entry in layouts]
    counts = [head.split() for head, _ in entries]
    per_host = int(counts[0][0])
    if len(layouts) % per_host:
        return (
            f"a world of {len(layouts)} ranks is not a whole number of hosts of "
            f"{per_host} ranks (LOCAL_WORLD_SIZE={per_host})"
        )
    for first in range(0, len(layouts), per_host):
        group = range(first, first + per_host)
        hosts = {entries[r][1] for r in group}
        if len(hosts) == 1 and [int(counts[r][1]) for r in group] == list(range(per_host)):
            continue
        seen = ", ".join(f"rank {r} is local rank {counts[r][1]} on {entries[r][1]}" for r in group)
        return (
            f"ranks {first}-{first + per_host - 1} should be local ranks 0-{per_host - 1} of one "
            f"host ({per_host} ranks per host, numbered host by host: TorchRec's plans and SPTT's "
            f"towers assume it), but {seen}; launch with torchrun or srun, which number them so, "
            "or, setting the variables by hand, give every process LOCAL_WORLD_SIZE (the ranks "
            "on its host), LOCAL_RANK, and RANK = host index x LOCAL_WORLD_SIZE + LOCAL_RANK"
        )
    return None


def host_layout(layouts: Sequence[str]) -> str | None:
    """:func:`uneven_hosts`, then :func:`misplaced_ranks`."""
    return uneven_hosts(layouts) or misplaced_ranks(layouts)


def agree_on_hosts(
    store: dist.Store, rank: int, world_size: int, local_world_size: int, local_rank: int
) -> None:
    """Every rank has as many ranks on its host as the others, and the ranks are numbered host
    by host (:func:`host_layout`), or every rank raises the same ``ValueError`` before the group
    starts (uneven hosts, e.g. SLURM's ``2(x3),1``, would fail on some ranks only, in the plans,
    while the others went on until the timeout; ranks numbered across hosts, e.g. a hand-set
    world without ``LOCAL_WORLD_SIZE`` on several machines, would train with towers that span
    them)."""
    _judge_through_store(
        store,
        rank,
        world_size,
        "dmt/runtime/hosts",
        f"{local_world_size} {local_rank} on {socket.gethostname()}",
        host_layout,
    )


def agree_on_backend(store: dist.Store, rank: int, world_size: int, backend: str) -> None:
    """Every rank chose the same backend, or every rank raises the same ``ValueError``, before
    the group starts: a gloo rank among NCCL ranks would wait in the group's rendezvous until
    the timeout. Compared through the rendezvous store (the group's own key prefix)."""
    _judge_through_store(
        store,
        rank,
        world_size,
        "dmt/runtime/backend",
        f"{backend} on {socket.gethostname()}",
        mixed_backends,
    )


def _judge_through_store(
    store: dist.Store,
    rank: int,
    world_size: int,
    name: str,
    value: str,
    judge: Callable[[list[str]], str | None],
) -> None:
    """Every rank posts ``value`` under ``name``; rank 0 reads them all and posts ``judge``'s
    verdict (an error message, or ``None``), which every rank reads and raises as a
    ``ValueError``. O(G) requests to the store in all: every rank reading every value would
    make G squared at the start of every job."""
    store.set(f"{name}/{rank}", value)
    if rank == 0:
        values = [store.get(f"{name}/{r}").decode() for r in range(world_size)]
        store.set(f"{name}/verdict", judge(values) or "")
    verdict = store.get(f"{name}/verdict").decode()
    if verdict:
        raise ValueError(verdict)


def shared_devices(devices: Sequence[str]) -> list[list[int]]:
    """The groups of ranks (by rank) whose device names, ``devices[rank]``, are the same."""
    ranks: dict[str, list[int]] = {}
    for rank, device in enumerate(devices):
        ranks.setdefault(device, []).append(rank)
    return [r for r in ranks.values() if len(r) > 1]


def _check_own_gpus(rank: int, world_size: int, device: torch.device) -> None:
    """Every rank has a GPU of its own, or every rank raises the same ``ValueError``.

    NCCL refuses two ranks on one GPU only at their first collective, with "Duplicate GPU
    detected"; e.g. torchrun with more processes per node than GPUs visible, when a single GPU
    is visible (``cuda_index`` then gives every local rank ``cuda:0``, which is right only when
    the launcher binds one GPU per task). The GPUs are compared by host and UUID through the
    process group's store, not by a collective."""

    def judge(devices: list[str]) -> str | None:
        shared = shared_devices(devices)
        if not shared:
            return None
        ranks = shared[0]
        return (
            f"ranks {ranks} share one GPU ({devices[ranks[0]]}): give every rank a GPU of its "
            "own (torchrun --nproc-per-node at most the GPUs CUDA_VISIBLE_DEVICES shows, or "
            "SLURM --gpus-per-task=1)"
        )

    uuid = torch.cuda.get_device_properties(device).uuid
    _judge_through_store(
        dist.distributed_c10d._get_default_store(),
        rank,
        world_size,
        "dmt/runtime/gpu",
        f"{socket.gethostname()} GPU {uuid}",
        judge,
    )


#: the variables _export set in os.environ, with their values
_exported: dict[str, str] = {}


def _export(world: World, environ: MutableMapping[str, str]) -> None:
    for key, value in world.torchrun_env().items():
        if key not in environ:
            environ[key] = _exported[key] = value


def launcher_env(environ: Mapping[str, str]) -> dict[str, str]:
    """``environ`` without the variables :func:`_export` set: the next job of a multirun under
    ``srun`` must see SLURM's world, not come up as a torchrun world of dmt's making."""
    return {k: v for k, v in environ.items() if _exported.get(k) != v}


#: process groups this process has initialized on the torchrun agent's store (see _elastic_store)
_agent_store_inits = itertools.count()


def _elastic_store(world_size: int, rank: int, timeout: timedelta) -> dist.Store:
    """The torchrun agent's store, with this group's keys apart from earlier groups'.

    The agent's store outlives the process groups that meet in it, and keeps their keys:
    - after ``torchrun --max-restarts`` restarts the workers, they meet again in it;
    - a Hydra multirun (``-m``) under torchrun runs its jobs one after another in the same
      workers, each job initializing and destroying its own process group.
    A worker that starts before its peer would read the peer's *old* gloo/NCCL address and fail
    ("Connection refused" on gloo, a hang or a failed communicator on NCCL). The restart count
    (``TORCHELASTIC_RESTART_COUNT``) and this process's count of groups initialized so far (the
    same on every rank: all ranks run the same jobs in the same order) as a key prefix keep them
    apart.

    Rank 0 also deletes NCCL's dump key, which a failed attempt's watchdog leaves in this store
    (unprefixed): a restarted attempt's watchdog would see it and end its process some minutes
    later, using up the restarts. Its peers start their groups only after rank 0's verdict on
    the backends (:func:`agree_on_backend`), so after the deletion.
    """
    store = dist.TCPStore(
        os.environ["MASTER_ADDR"],
        int(os.environ["MASTER_PORT"]),
        world_size,
        is_master=False,
        timeout=timeout,
    )
    if rank == 0:
        store.delete_key(_NCCL_DUMP_KEY)
    attempt = os.environ.get("TORCHELASTIC_RESTART_COUNT", "0")
    return dist.PrefixStore(f"dmt/attempt_{attempt}/group_{next(_agent_store_inits)}", store)


#: the rendezvous store of SLURM and hand-set worlds, kept for the life of the process (_own_store)
_own: tuple[tuple[str, int, int, int], dist.TCPStore] | None = None
#: per job key, the process groups this process has initialized in ``_own`` so far
_own_store_inits: dict[str, itertools.count[int]] = {}
#: the key ProcessGroupNCCL's watchdog sets in the unprefixed store when a rank dumps its flight
#: recorder (kStoreDumpKey in torch's ProcessGroupNCCL.hpp); the other ranks' watchdogs see it and
#: end their process, so a failed job must not leave it for the next
_NCCL_DUMP_KEY = "exception_dump"


def _own_store(world: World, timeout: timedelta, job: str) -> dist.Store:
    """The store a world without torchrun's agent meets in: a ``TCPStore`` served by rank 0 at
    ``MASTER_ADDR:MASTER_PORT``, created at this process's first group and kept until it exits,
    with each group's keys under the prefix ``dmt/<job>/group_<n>``.

    torch's ``env://`` rendezvous makes a new store per group and rank 0 tears it down with the
    group. In a Hydra multirun (``srun dmt-train -m ...``) a rank that finished a job first then
    met the *previous* job's store, still served by a slower rank 0, read that job's gloo/NCCL
    addresses and failed ("Connection reset by peer"), while rank 0 waited for it in the new
    store. One store outlives the jobs. ``job`` names the job the same way on every rank (Hydra's
    job number and overrides), and ``n`` counts this process's groups of that job, so ranks meet
    only in the same job: a rank that failed a job before its group would otherwise pair its next
    job with its peers' current one.
    """
    store = _served_store(world, timeout)
    if world.rank == 0:
        store.delete_key(_NCCL_DUMP_KEY)  # before any peer's group of this job can start
    n = next(_own_store_inits.setdefault(job, itertools.count()))
    return dist.PrefixStore(f"dmt/{job}/group_{n}", store)


def _served_store(world: World, timeout: timedelta) -> dist.TCPStore:
    """The ``TCPStore`` that rank 0 of ``world`` serves at ``MASTER_ADDR:MASTER_PORT``, kept for
    the life of the process (:func:`_own_store`)."""
    global _own
    assert world.master_addr is not None and world.master_port is not None
    key = (world.master_addr, world.master_port, world.world_size, world.rank)
    if _own is None or _own[0] != key:
        _own = None  # a world of other settings: its own store (the old one closes when freed)
        _own_store_inits.clear()  # its peers count from 0 too
        try:
            store = dist.TCPStore(
                world.master_addr,
                world.master_port,
                world.world_size,
                is_master=world.rank == 0,
                timeout=timeout,
                wait_for_workers=False,
                multi_tenant=True,  # as env://: a later env:// group on this port shares it
            )
        except dist.DistNetworkError as err:
            if world.rank != 0:
                raise
            # rank 0 serves the store: a port another process holds (another job whose port
            # formula gives the same, on a shared first node) fails here, naming neither
            raise ValueError(
                f"rank 0 cannot serve the rendezvous store on {world.master_addr}:"
                f"{world.master_port} (MASTER_ADDR:MASTER_PORT; under SLURM without "
                f"MASTER_PORT the port is {SLURM_PORT_BASE} + (SLURM_JOB_ID + "
                f"{SLURM_PORT_STEP_STRIDE} x SLURM_STEP_ID) % {SLURM_PORT_RANGE}, which two jobs "
                f"can share): {err}; set MASTER_PORT to a free port"
            ) from err
        _own = (key, store)
    store = _own[1]
    store.set_timeout(timeout)
    return store


def launch_store(world: World, timeout: timedelta) -> dist.Store:
    """The store the ranks of ``world`` (several) meet in before their first process group:
    torchrun's agent's, or the one rank 0 serves (:func:`_own_store`, which its groups reuse)."""
    if os.environ.get("TORCHELASTIC_USE_AGENT_STORE") == "True":
        assert world.master_addr is not None and world.master_port is not None
        return dist.TCPStore(
            world.master_addr,
            world.master_port,
            is_master=False,
            wait_for_workers=False,
            timeout=timeout,
        )
    return _served_store(world, timeout)


#: how many default groups init_runtime has started in this process (a multirun: one per job)
_world_number = 0


def world_number() -> int:
    """The number of the world this process is in, counted from 1 in the order
    :func:`init_runtime` started them (the same on every rank: all ranks run the same jobs)."""
    return _world_number


def close_runtime(*, failed: bool = False) -> None:
    """End this process's groups. After a failure under NCCL they are aborted, not destroyed:
    destroying waits for every NCCL kernel in flight, and after one rank's error those wait for
    peers that may never come, so the rank would hang until NCCL's watchdog ended the process
    (a collective timeout later), its error unreported. Aborting returns at once (torch's
    ``_abort_process_group``, for NCCL) and leaves the process able to start a next group."""
    if not dist.is_initialized():
        return
    if failed and dist.get_backend() == "nccl":
        dist.distributed_c10d._abort_process_group()
    else:
        dist.destroy_process_group()
