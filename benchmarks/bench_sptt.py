"""Benchmark flat TorchRec sharding against SPTT and DMT on the same model and data.

Modes (one training step = forward, backward with the fused sparse optimizer, dense step):

* ``flat``: the base DLRM (:func:`dmt.models.build_model`, the same tables, MLPs and
  interaction as the DMT model with pass-through towers) sharded flat by TorchRec
  (``DistributedModelParallel``; tables table-wise, or the planner's choice with
  ``--flat-sharding planner``) and, pipelined, trained through ``TrainPipelineSparseDist`` as
  ``dmt-train`` trains it -- the paper's baseline;
* ``flat-1tower``: the same model through :func:`dmt.sptt.dmt_sharding.shard_dmt` with one tower
  spanning the world. It moves the bytes of TorchRec's table-wise flat lookup (step a = the KJT
  all-to-all to the table owners, step d = the pooled-embedding all-to-all over all ``G`` ranks,
  no step f): SPTT's code path against TorchRec's on the same flows;
* ``sptt``: the pass-through model with SPTT on ``T = G / (K L)`` towers (same semantics);
* ``dmt``: the DMT model with DLRM tower modules (``c = 1, p = 0, D = --tower-dim``) on the same
  towers: compression ratio ``N / D``.

``--peer-permute output,input,auto,skip`` runs ``sptt`` and ``dmt`` once per setting of where step
c permutes (paper section 3.1.3, :mod:`dmt.sptt.peer_permute`), as ``sptt:input`` and so on:
the pooled output, the sparse input before the lookup, the smaller of the two, or nothing (step a
delivers peer order). The ``c MB`` column gives the bytes step c shuffled (local, no wire).

``--pipeline on,off`` trains each mode through TorchRec's train pipeline
(:func:`dmt.trainer.build_pipeline`, as ``trainer.pipeline=true``) and through the plain loop;
``--comm-precision fp32,bf16`` sets ``sptt.comm_precision`` (SPTT steps d and f; TorchRec's
quantized comms for the flat modes). Every combination is its own model, and all of them run
interleaved; speed-ups and byte ratios compare with ``flat`` at the same pipeline and precision.

Every mode plans its tables within the same per-rank memory budget (``sharding``'s defaults:
the same kernels, in the rank's memory or UVM-cached on CUDA). Runs alternate the variants'
order (run ``k`` starts ``k`` variants later), and a step's time is its slowest rank's. Each
timed step starts after a barrier of the default group; each run also times the same number of
steps back to back (the window columns), which holds whatever a step leaves running past its end.

Reported per (mode, pipeline, comm_precision): the median over ``--runs`` runs of the median step
time of each run, and, per step and summed over all ranks, the bytes each process group carries
and how many cross a host boundary (``L`` ranks per host), measured on ``--trace-steps`` further
steps by :class:`dmt.sptt.comm_trace.CommTrace`: every c10d collective the step issues (TorchRec's
own all-to-alls for the flat modes, DDP's all-reduces, SPTT's steps), whatever code issued it.
Gradient all-reduces are counted with the ring model (``2 (n - 1) / n`` of the buffer per rank).
SPTT modes also report their own :class:`~dmt.sptt.comm_stats.CommStats` per step and group of
the same steps (the trace adds TorchRec's small split-size exchange of step a to it).
``--json FILE`` writes a list of records with ``mode``, ``peer_permute``, ``pipeline``,
``comm_precision``, ``world_size``, ``local_world_size``, ``batch_per_rank``, ``ms_per_step``
(median of the run medians), ``ms_per_step_runs``/``_min``/``_max`` (each run's median step),
``ms_steps`` (every timed step, the slowest rank's, per run), ``ms_per_step_window`` (median
over runs) and ``ms_per_step_window_runs`` (each run then times its ``--iters`` steps again back to
back, with no barrier between them, as training runs them: the window's time per step, its
slowest rank's; what a step leaves in flight, such as flat's next-batch input all-to-all under
TorchRec's pipeline, is inside it), ``load_avg`` (the 1-minute load
average before and after the timed runs), ``speedup_vs_best_flat`` (the fastest
``flat`` record at the same precision, pipelined or not, over this one: the strongest baseline
measured), ``cross_host_mb`` and ``total_mb`` (traced, per step, summed over ranks) and details.

Hosts are emulated: ``L`` consecutive ranks form a host. On one machine (gloo, CPU)::

    python benchmarks/bench_sptt.py --world-size 8 --local-world-size 2
    python benchmarks/bench_sptt.py --pipeline on,off --comm-precision fp32,bf16 --json out.json

To put every emulated host in its own network namespace, with 1 Gbit/s between hosts, see
``scripts/netns_throttle.sh``; it starts one copy per host with ``--nnodes``/``--node-rank``/
``--init-file``. Under torchrun (NCCL on GPUs)::

    torchrun --nproc-per-node 8 benchmarks/bench_sptt.py ...

(``--local-world-size`` defaults to torchrun's ``LOCAL_WORLD_SIZE`` there, 2 otherwise; a value
other than torchrun's emulates hosts of that size. With ``--nnodes`` above 1 each launcher's
ranks are one host, and another value is refused.)

CPU timings with more ranks than cores mostly measure contention; the byte counts are exact.
"""

from __future__ import annotations

import argparse
import itertools
import os
import statistics
import tempfile
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass, replace
from datetime import timedelta
from typing import Any

import torch
import torch.distributed as dist
import torch.multiprocessing as mp
from torch import nn
from torchrec.datasets.utils import Batch
from torchrec.distributed.model_parallel import DistributedModelParallel
from torchrec.sparse.jagged_tensor import KeyedJaggedTensor

from dmt.config import (
    DLRMTowerConfig,
    DotInteractionConfig,
    ModelConfig,
    OptimConfig,
    PartitionConfig,
    PassThroughTowerConfig,
    ShardingConfig,
)
from dmt.host_malloc import reuse_host_memory
from dmt.memory import MemoryBudget
from dmt.models import build_dmt_model, build_model, embedding_parameters, naive_partition
from dmt.models.accounting import compression_ratio
from dmt.optim import apply_sparse_optimizer, build_optimizer
from dmt.results import (
    add_runs_options,
    check_counts,
    check_runs,
    existing_output,
    write_json,
)
from dmt.runtime import Runtime, cuda_index
from dmt.sharding import (
    flat_planner,
    flat_sharders,
    job_gpus,
    memory_budget,
    place_on_devices,
    rank_devices,
    shard_model,
    table_constraints,
)
from dmt.sptt.collectives import COMM_PRECISIONS
from dmt.sptt.comm_stats import CommStats
from dmt.sptt.comm_trace import CommTrace
from dmt.sptt.dmt_sharding import shard_dmt
from dmt.sptt.peer_permute import DEFAULT_PEER_PERMUTE, PEER_PERMUTES
from dmt.sptt.process_groups import create_process_groups
from dmt.sptt.topology import Topology
from dmt.trainer import TrainTask, build_pipeline

MODES = ("flat", "flat-1tower", "sptt", "dmt")
GROUP_OF_STEP = {"a": "world", "d": "tower", "f": "peer", "tm": "tower", "dense": "world"}
SHUFFLED = ("output", "input", "none")  # what step c permuted
PIPELINES = {"on": True, "off": False}


def _parse(argv: list[str] | None = None) -> argparse.Namespace:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawTextHelpFormatter)
    p.add_argument("--world-size", type=int, default=4, help="G")
    p.add_argument(
        "--local-world-size",
        type=int,
        default=None,
        help="L, ranks per (emulated) host (default: torchrun's LOCAL_WORLD_SIZE, else 2)",
    )
    p.add_argument("--hosts-per-tower", type=int, default=1, help="K")
    p.add_argument("--features", type=int, default=26, help="F")
    p.add_argument("--rows", type=int, default=2000, help="rows per table")
    p.add_argument("--dim", type=int, default=32, help="N")
    p.add_argument("--tower-dim", type=int, default=8, help="D of the DMT tower modules")
    p.add_argument("--batch", type=int, default=512, help="local batch B")
    p.add_argument("--hotness", type=int, default=1, help="ids per sample and feature")
    p.add_argument("--flat-sharding", default="table_wise", choices=["table_wise", "planner"])
    p.add_argument("--modes", default=",".join(MODES), help=f"comma-separated, of {MODES}")
    p.add_argument(
        "--peer-permute",
        default=DEFAULT_PEER_PERMUTE,
        help=f"where step c permutes in sptt/dmt: comma-separated, of {PEER_PERMUTES}",
    )
    p.add_argument(
        "--pipeline",
        default="on",
        help="on (TorchRec's train pipeline, dmt.trainer.build_pipeline, as trainer.pipeline=true;"
        " the default), off (plain loop) or on,off",
    )
    p.add_argument(
        "--comm-precision",
        default="fp32",
        help=f"sptt.comm_precision of every mode: comma-separated, of {tuple(COMM_PRECISIONS)}",
    )
    p.add_argument("--iters", type=int, default=10, help="timed steps per run")
    p.add_argument("--warmup", type=int, default=3, help="untimed steps before each run")
    add_runs_options(p, "runs per mode (modes interleaved)")
    p.add_argument(
        "--trace-steps", type=int, default=2, help="untimed steps whose bytes are measured"
    )
    p.add_argument("--json", default=None, help="write the results here (rank 0)")
    p.add_argument("--overwrite", action="store_true", help="replace an existing --json file")
    p.add_argument(
        "--glibc-malloc",
        action="store_true",
        help="keep glibc's adapting malloc thresholds (as trainer.reuse_host_memory=false); "
        "default: every rank keeps freed host memory for reuse, as dmt-train does",
    )
    env = os.environ  # scripts/netns_throttle.sh sets DMT_NNODES, DMT_NODE_RANK, DMT_INIT_FILE
    p.add_argument(
        "--nnodes", type=int, default=int(env.get("DMT_NNODES", 1)), help="launchers (hosts)"
    )
    p.add_argument(
        "--node-rank", type=int, default=int(env.get("DMT_NODE_RANK", 0)), help="this launcher"
    )
    p.add_argument(
        "--init-file", default=env.get("DMT_INIT_FILE"), help="rendezvous file (--nnodes > 1)"
    )
    args = p.parse_args(argv)
    if (error := existing_output(args.json, "--json", args.overwrite)) is not None:
        p.error(error)
    unknown = set(args.modes.split(",")) - set(MODES)
    if unknown:
        p.error(f"unknown modes {sorted(unknown)}; choose from {MODES}")
    unknown = set(args.peer_permute.split(",")) - set(PEER_PERMUTES)
    if unknown:
        p.error(f"unknown --peer-permute {sorted(unknown)}; choose from {PEER_PERMUTES}")
    unknown = set(args.pipeline.split(",")) - set(PIPELINES)
    if unknown:
        p.error(f"unknown --pipeline {sorted(unknown)}; choose from on, off, on,off")
    unknown = set(args.comm_precision.split(",")) - set(COMM_PRECISIONS)
    if unknown:
        p.error(f"unknown --comm-precision {sorted(unknown)}; choose from {tuple(COMM_PRECISIONS)}")
    for option in ("modes", "peer_permute", "pipeline", "comm_precision"):
        values = getattr(args, option).split(",")
        if twice := sorted({v for v in values if values.count(v) > 1}):
            # two variants of one name would pool their step times into one record
            p.error(
                f"--{option.replace('_', '-')} {getattr(args, option)!r} names {twice} twice; "
                "give each setting once"
            )
    check_runs(p, args.runs, args.smoke)
    check_counts(p, args, ("trace_steps", "iters"), ("warmup",))
    sizes = ("world_size", "nnodes", "hosts_per_tower", "features", "rows", "dim", "tower_dim")
    check_counts(p, args, (*sizes, "batch", "hotness"))
    if args.world_size % args.nnodes:
        p.error("--world-size must be a multiple of --nnodes")
    if args.nnodes > 1:  # each launcher's ranks are one host (netns_throttle.sh's namespace)
        per_node = args.world_size // args.nnodes
        if args.local_world_size not in (None, per_node):
            p.error(
                f"--local-world-size {args.local_world_size} with --nnodes {args.nnodes}: each "
                f"launcher's {per_node} ranks are one host (its own network namespace), so "
                f"hosts of another size would count loopback traffic as crossing hosts; leave "
                f"it unset or give {per_node}"
            )
        args.local_world_size = per_node
    elif args.local_world_size is None:
        args.local_world_size = int(os.environ.get("LOCAL_WORLD_SIZE", 2))
    if args.local_world_size < 1:
        p.error("--local-world-size must be at least 1")
    # torchrun starts the ranks: its WORLD_SIZE wins over --world-size, checked here too (in
    # the ranks, Topology's ValueError was a traceback from every rank)
    torchrun = "RANK" in os.environ
    G = int(os.environ["WORLD_SIZE"]) if torchrun else args.world_size
    size = f"torchrun's WORLD_SIZE {G}" if torchrun else f"--world-size {G}"
    L, K = args.local_world_size, args.hosts_per_tower
    if G % L:
        p.error(f"{size} must be a multiple of --local-world-size {L} (ranks per emulated host)")
    if G // L % K:
        p.error(
            f"{size} is {G // L} hosts of --local-world-size {L}: not a multiple "
            f"of --hosts-per-tower {K} (every tower spans K whole hosts)"
        )
    if not 0 <= args.node_rank < args.nnodes:
        p.error(
            f"--node-rank {args.node_rank}: expected 0 to {args.nnodes - 1} (this launcher's "
            f"index among --nnodes {args.nnodes})"
        )
    if args.nnodes > 1 and not args.init_file:
        p.error("--nnodes > 1 needs --init-file (a file every launcher can reach)")
    if args.init_file:  # file:// takes an absolute path ("file://rdv": no path, a traceback)
        args.init_file = os.path.abspath(args.init_file)
        folder = os.path.dirname(args.init_file)
        if os.path.isdir(args.init_file) or not os.path.isdir(folder):
            p.error(
                f"--init-file {args.init_file}: expected a file in an existing directory (the "
                "launchers' rendezvous)"
            )
    return args


# ---- model, data, modes ----------------------------------------------------------------------


def _names(args: argparse.Namespace) -> list[str]:
    return [f"cat_{f}" for f in range(args.features)]


def _model_config(args: argparse.Namespace, tower: str) -> ModelConfig:
    """The benchmark's DLRM with ``tower`` modules (its towers are given when it is built)."""
    D = args.dim if tower == "passthrough" else args.tower_dim
    return ModelConfig(
        name="dlrm",
        interaction=DotInteractionConfig(),
        embedding_dim=args.dim,
        bottom_mlp=[64, D],
        top_mlp=[64, 1],
        tower=PassThroughTowerConfig()
        if tower == "passthrough"
        else DLRMTowerConfig(dim=D, c=1, p=0),
        partition=PartitionConfig(kind="explicit"),
    )


def _model(
    args: argparse.Namespace,
    num_towers: int,
    tower: str,
    *,
    dense_device: torch.device | str = "cpu",
) -> nn.Module:
    torch.manual_seed(0)
    names = _names(args)
    return build_dmt_model(
        _model_config(args, tower),
        naive_partition(names, num_towers),
        feature_names=names,
        cardinalities=[args.rows] * args.features,
        num_dense=13,
        dense_device=dense_device,
    )


def _batches(args: argparse.Namespace, rank: int, device: torch.device) -> list[Batch]:
    gen = torch.Generator().manual_seed(1000 + rank)
    out = []
    for _ in range(4):
        num = args.features * args.batch
        kjt = KeyedJaggedTensor.from_lengths_sync(
            keys=_names(args),
            values=torch.randint(0, args.rows, (num * args.hotness,), generator=gen),
            lengths=torch.full((num,), args.hotness, dtype=torch.int64),
        )
        batch = Batch(
            dense_features=torch.randn(args.batch, 13, generator=gen),
            sparse_features=kjt,
            labels=torch.randint(0, 2, (args.batch,), generator=gen).float(),
        )
        out.append(batch.to(device))
    return out


OPTIM = OptimConfig(
    sparse_lr=0.05,
    lr=0.01,
    sparse={
        "_target_": "torchrec.optim.RowWiseAdagrad",
        "_partial_": True,
        "lr": "${..sparse_lr}",
        "eps": 1e-8,
    },
    dense={"_target_": "torch.optim.SGD", "_partial_": True, "lr": "${..lr}"},
)


def _base_model(args: argparse.Namespace) -> nn.Module:
    """The base DLRM of :func:`_model`'s DMT models (their pass-through form's tables, MLPs and
    interaction), a ``RecModel`` as ``dmt-train`` builds it: the flat baseline."""
    cfg = replace(_model_config(args, "passthrough"), partition=PartitionConfig())
    torch.manual_seed(0)
    return build_model(
        cfg,
        feature_names=_names(args),
        cardinalities=[args.rows] * args.features,
        num_dense=13,
    )


def _flat(
    args: argparse.Namespace, runtime: Runtime, precision: str, memory: MemoryBudget
) -> tuple[nn.Module, Any, None]:
    model = _base_model(args)
    apply_sparse_optimizer(embedding_parameters(model), OPTIM)
    task = TrainTask(model)
    if args.flat_sharding == "planner":
        dmp = shard_model(
            task,
            runtime,
            batch_size=args.batch * runtime.world_size,
            memory=memory,
            comm_precision=precision,
        )
    else:
        constraints = table_constraints(task, memory)
        for constraint in constraints.values():
            constraint.sharding_types = ["table_wise"]
        planner = flat_planner(
            memory,
            world_size=runtime.world_size,
            local_world_size=runtime.local_world_size,
            batch_size=args.batch,
            constraints=constraints,
        )
        sharders = flat_sharders(precision)
        plan = planner.collective_plan(task, sharders, dist.GroupMember.WORLD)
        plan = place_on_devices(plan, rank_devices(runtime))  # the planner says cuda:<r % L>
        dmp = DistributedModelParallel(task, device=runtime.device, plan=plan, sharders=sharders)
    return dmp, build_optimizer(dmp, OPTIM), None


def _sptt(
    args: argparse.Namespace,
    runtime: Runtime,
    topo: Topology,
    hosts: Topology,
    tower: str,
    peer_permute: str = DEFAULT_PEER_PERMUTE,
    precision: str = "fp32",
    memory: MemoryBudget | None = None,
) -> tuple[nn.Module, Any, CommStats]:
    stats = CommStats(hosts, runtime.rank)
    groups = create_process_groups(topo, timeout=timedelta(minutes=5))
    task, optimizer = shard_dmt(
        # SPTT wraps the dense part in DDP where it is: built on the rank's device
        TrainTask(_model(args, topo.num_towers, tower, dense_device=runtime.device)),
        runtime,
        topology=topo,
        groups=groups,
        optim_cfg=OPTIM,
        stats=stats,
        peer_permute=peer_permute,
        comm_precision=precision,
        even_batches=True,  # every rank trains on B samples, as in training
        memory=memory,
    )
    return task, optimizer, stats


@dataclass
class Variant:
    """One (mode, peer permute, pipeline, precision) combination, built and ready to step."""

    mode: str
    peer_permute: str | None
    pipeline: bool
    precision: str
    step: Callable[[], None]
    stats: CommStats | None

    @property
    def name(self) -> str:
        mode = self.mode if self.peer_permute is None else f"{self.mode}:{self.peer_permute}"
        return f"{mode} pipe={'on' if self.pipeline else 'off'} {self.precision}"

    @property
    def setting(self) -> tuple[bool, str]:
        """What ``flat`` must share to be this variant's baseline."""
        return self.pipeline, self.precision


def _stepper(
    module: nn.Module,
    optimizer: Any,
    batches: list[Batch],
    pipeline: bool,
    device: torch.device,
) -> Callable[[], None]:
    """One training step per call on the next of ``batches`` (cycled): through TorchRec's
    train pipeline (as ``trainer.pipeline=true``) or the plain loop."""
    feed: Iterator[Batch] = itertools.cycle(batches)
    if pipeline:
        train = build_pipeline(module, optimizer, device)

        def progress() -> None:
            train.progress(feed)

        return progress

    def step() -> None:
        optimizer.zero_grad()
        loss, _ = module(next(feed))
        loss.backward()
        optimizer.step()

    return step


def _time_steps(
    step: Callable[[], None], args: argparse.Namespace, cuda: bool, device: torch.device
) -> list[float]:
    """The seconds of each timed step after ``--warmup`` untimed ones, each its slowest rank's
    (the ranks start every step together, after a barrier)."""
    times = []
    for _ in range(args.warmup + args.iters):
        dist.barrier()
        start = time.perf_counter()
        step()
        if cuda:
            torch.cuda.synchronize()
        times.append(time.perf_counter() - start)
    slowest = torch.tensor(times[args.warmup :], dtype=torch.float64, device=device)
    dist.all_reduce(slowest, op=dist.ReduceOp.MAX)
    return slowest.tolist()


def _time_window(
    step: Callable[[], None], args: argparse.Namespace, cuda: bool, device: torch.device
) -> float:
    """The seconds per step of ``--iters`` steps run back to back, as training runs them, between
    two barriers of the default group (the slowest rank's). No barrier separates the steps, so
    whatever a step leaves in flight (flat's next-batch input all-to-all, issued by TorchRec's
    pipeline and waited for in the next step) is inside the window. On gloo a barrier of the
    default group waits for the collectives issued on that group before it (flat's): the one
    left at the window's end is waited for by the closing barrier, as the one left by the step
    before the window is by the opening barrier, so the window holds ``--iters`` of them. SPTT's
    own groups are not waited for by either barrier: one of their collectives may straddle each
    end of the window, which the average over ``--iters`` steps dilutes."""
    dist.barrier()
    start = time.perf_counter()
    for _ in range(args.iters):
        step()
    if cuda:
        torch.cuda.synchronize()
    dist.barrier()
    per_step = torch.tensor([(time.perf_counter() - start) / args.iters], device=device)
    dist.all_reduce(per_step, op=dist.ReduceOp.MAX)
    return float(per_step.item())


def _build(
    args: argparse.Namespace, runtime: Runtime, hosts: Topology, batches: list[Batch]
) -> list[Variant]:
    """Every variant, built on every rank in the same order (process groups are collective),
    within one per-rank memory budget."""
    world_size = runtime.world_size
    memory = memory_budget(ShardingConfig(), runtime.device.type, gpus=job_gpus(runtime))
    settings = args.peer_permute.split(",")
    variants = []
    for precision, pipe in itertools.product(
        args.comm_precision.split(","), args.pipeline.split(",")
    ):
        pipeline = PIPELINES[pipe]
        for mode in args.modes.split(","):
            built: list[tuple[str | None, tuple[nn.Module, Any, CommStats | None]]] = []
            if mode == "flat":
                built.append((None, _flat(args, runtime, precision, memory)))
            elif mode == "flat-1tower":
                one_tower = Topology(world_size, world_size)
                built.append(
                    (
                        None,
                        _sptt(
                            args,
                            runtime,
                            one_tower,
                            hosts,
                            "passthrough",
                            "output",
                            precision,
                            memory,
                        ),
                    )
                )
            else:
                tower = "passthrough" if mode == "sptt" else "dlrm"
                for setting in settings:
                    variant = _sptt(args, runtime, hosts, hosts, tower, setting, precision, memory)
                    built.append((setting, variant))  # recorded even when it is the only one
            for setting, (module, optimizer, stats) in built:
                step = _stepper(module, optimizer, batches, pipeline, runtime.device)
                variants.append(Variant(mode, setting, pipeline, precision, step, stats))
    return variants


def _main_on_rank(args: argparse.Namespace) -> list[dict[str, Any]] | None:
    rank, world_size = dist.get_rank(), dist.get_world_size()
    reuse = not args.glibc_malloc and reuse_host_memory()  # for every mode, as dmt-train
    cuda = torch.cuda.is_available() and dist.get_backend() == "nccl"
    local_rank = rank % args.local_world_size  # of the emulated host
    # the GPU torchrun's LOCAL_RANK chose (main), not the emulated host's index: with
    # --local-world-size below the GPUs per node, that index would put several ranks on one GPU
    device = torch.device("cuda", torch.cuda.current_device()) if cuda else torch.device("cpu")
    runtime = Runtime(
        rank, world_size, local_rank, args.local_world_size, device, dist.get_backend()
    )
    hosts = Topology(world_size, args.local_world_size, args.hosts_per_tower)
    variants = _build(args, runtime, hosts, _batches(args, rank, device))

    run_steps: dict[str, list[list[float]]] = {v.name: [] for v in variants}
    run_windows: dict[str, list[float]] = {v.name: [] for v in variants}
    load_before = os.getloadavg()[0]
    for run in range(args.runs):
        shift = run % len(variants)  # each run starts with another variant
        for v in variants[shift:] + variants[:shift]:
            run_steps[v.name].append(_time_steps(v.step, args, cuda, device))
            run_windows[v.name].append(_time_window(v.step, args, cuda, device))
    load_avg = [load_before, os.getloadavg()[0]]
    run_medians = {name: [statistics.median(r) for r in runs] for name, runs in run_steps.items()}

    records = []
    for v in variants:
        # the bytes of --trace-steps further steps: CommTrace sees every collective they issue;
        # an SPTT mode's own CommStats counts the same steps
        if v.stats is not None:
            v.stats.reset()
        trace = CommTrace(CommStats(hosts, rank))
        dist.barrier()
        with trace:
            for _ in range(args.trace_steps):
                v.step()
        if trace.unaccounted:
            raise RuntimeError(f"{v.name}: collectives without a byte model: {trace.unaccounted}")
        traced = _world_totals(_traced_by_group(trace, hosts, rank), device)
        counted = _world_totals(_stats_keys(v.stats), device) if v.stats is not None else {}
        per_step = 1 / args.trace_steps
        record: dict[str, Any] = {
            "mode": v.mode,
            "peer_permute": v.peer_permute,
            "pipeline": v.pipeline,
            "comm_precision": v.precision,
            "world_size": world_size,
            "local_world_size": args.local_world_size,
            "hosts_per_tower": args.hosts_per_tower,
            "batch_per_rank": args.batch,
            "ms_per_step": statistics.median(run_medians[v.name]) * 1e3,
            "ms_per_step_runs": [t * 1e3 for t in run_medians[v.name]],
            "ms_per_step_min": min(run_medians[v.name]) * 1e3,
            "ms_per_step_max": max(run_medians[v.name]) * 1e3,
            "ms_steps": [[t * 1e3 for t in r] for r in run_steps[v.name]],
            "ms_per_step_window": statistics.median(run_windows[v.name]) * 1e3,
            "ms_per_step_window_runs": [t * 1e3 for t in run_windows[v.name]],
            "load_avg": load_avg,
            "reuse_host_memory": reuse,
            "cross_host_mb": traced["all/bytes_cross_host"] * per_step / 1e6,
            "total_mb": traced["all/bytes_sent"] * per_step / 1e6,
            "traced_bytes_per_step": {k: x * per_step for k, x in traced.items()},
            "bytes_per_step": {k: x * per_step for k, x in counted.items()},
        }
        if v.mode == "dmt":
            record["compression_ratio"] = compression_ratio(_model(args, hosts.num_towers, "dlrm"))
        records.append(record)
    return records if rank == 0 else None


def _traced_by_group(trace: CommTrace, hosts: Topology, rank: int) -> dict[str, float]:
    """This rank's traced bytes by the role of each collective's group: ``world`` (all ranks),
    ``tower`` (this rank's tower: K L ranks), ``peer`` (its T peers), else ``other``."""
    roles: dict[tuple[int, ...], str] = {}
    # a group equal to another (T = 1: tower = world; G = T: peer = world) takes the first name
    for ranks, role in (
        (tuple(range(hosts.world_size)), "world"),
        (tuple(hosts.tower_ranks(hosts.tower_of(rank))), "tower"),
        (tuple(hosts.peers_of(rank)), "peer"),
    ):
        roles.setdefault(ranks, role)
    out = {
        f"{g}/{field}": 0.0
        for g in ("all", "world", "tower", "peer", "other")
        for field in ("bytes_sent", "bytes_cross_host")
    }
    for call in trace.calls:
        role = roles.get(call.ranks, "other")
        for dst, nbytes in zip(call.ranks, call.bytes_per_rank):
            if dst == rank:
                continue
            cross = nbytes if hosts.crosses_host(rank, dst) else 0
            for g in ("all", role):
                out[f"{g}/bytes_sent"] += nbytes
                out[f"{g}/bytes_cross_host"] += cross
    return out


def _stats_keys(stats: CommStats) -> dict[str, float]:
    """``{"<step>/<group>/<direction>/<field>": this rank's value}`` over every step's keys."""
    local = stats.as_dict()
    keys = sorted(
        f"{step}/{GROUP_OF_STEP[step]}/{d}/{field}"
        for step in GROUP_OF_STEP
        for d in ("forward", "backward")
        for field in ("bytes_sent", "bytes_cross_host")
    ) + [
        f"c/{what}/{d}/{field}"
        for what in SHUFFLED
        for d in ("forward", "backward")
        for field in ("calls", "bytes_shuffled")
    ]
    return {k: float(local.get(k, 0)) for k in keys}


def _world_totals(local: dict[str, float], device: torch.device) -> dict[str, float]:
    """``local`` summed over ranks (collective; the same keys on every rank)."""
    keys = sorted(local)
    values = torch.tensor([local[k] for k in keys], dtype=torch.float64, device=device)
    dist.all_reduce(values)
    return dict(zip(keys, values.tolist()))


def _label(r: dict[str, Any]) -> str:
    mode = r["mode"] if r["peer_permute"] is None else f"{r['mode']}:{r['peer_permute']}"
    return f"{mode} {'on' if r['pipeline'] else 'off'} {r['comm_precision']}"


def _report(args: argparse.Namespace, records: list[dict[str, Any]]) -> str:
    hosts = Topology(args.world_size, args.local_world_size, args.hosts_per_tower)
    lines = [
        f"G={args.world_size} L={args.local_world_size} K={args.hosts_per_tower} "
        f"T={hosts.num_towers} F={args.features} N={args.dim} D={args.tower_dim} B={args.batch} "
        f"rows={args.rows} hotness={args.hotness} flat={args.flat_sharding}; median of "
        f"{args.runs} runs x {args.iters} steps; MB per step summed over ranks (fwd+bwd), "
        f"measured on {args.trace_steps} steps; load average "
        f"{records[0]['load_avg'][0]:.1f} before, {records[0]['load_avg'][1]:.1f} after",
        f"{'mode pipeline precision':28s} {'ms/step':>9s} {'x flat':>7s} {'x best':>7s} "
        f"{'win ms':>8s} {'x flat':>7s} "
        f"{'world MB':>9s} "
        f"{'tower MB':>9s} {'peer MB':>9s} {'total MB':>9s} {'cross MB':>9s} {'cross x':>8s} "
        f"{'c MB':>8s}",
    ]
    flat = {(r["pipeline"], r["comm_precision"]): r for r in records if r["mode"] == "flat"}
    for r in records:
        base = flat.get((r["pipeline"], r["comm_precision"]))
        traced = r["traced_bytes_per_step"]
        mb = {g: traced[f"{g}/bytes_sent"] / 1e6 for g in ("world", "tower", "peer")}
        speed = f"{base['ms_per_step'] / r['ms_per_step']:7.2f}" if base else "      -"
        window = r["ms_per_step_window"]
        window_speed = f"{base['ms_per_step_window'] / window:7.2f}" if base else "      -"
        best = r.get("speedup_vs_best_flat")
        best_speed = f"{best:7.2f}" if best is not None else "      -"
        cross = r["cross_host_mb"]
        ratio = f"{base['cross_host_mb'] / cross:8.2f}" if base and cross else "       -"
        shuffled = sum(v for k, v in r["bytes_per_step"].items() if k.endswith("/bytes_shuffled"))
        lines.append(
            f"{_label(r):28s} {r['ms_per_step']:9.2f} {speed} {best_speed} {window:8.2f} "
            f"{window_speed} {mb['world']:9.3f} "
            f"{mb['tower']:9.3f} {mb['peer']:9.3f} {r['total_mb']:9.3f} {cross:9.3f} {ratio} "
            f"{shuffled / 1e6:8.3f}"
        )
    lines.append(
        f"groups: world = G = {args.world_size} ranks (step a, dense all-reduce, flat's "
        f"all-to-alls); tower = K L = {hosts.tower_size} ranks (step d, tower-module all-reduce); "
        f"peer = T = {hosts.num_towers} ranks (step f)"
    )
    lines.append(
        "x flat: flat ms / mode ms (speed-up), cross x: flat cross-host bytes / mode's, both "
        "against flat at the same pipeline and precision; x best: against the fastest flat at "
        "the same precision, pipelined or not (the strongest baseline measured). win ms: per "
        "step of the runs' --iters steps back to back (no barrier between them; median of the "
        "runs), and its x flat. Bytes: "
        "CommTrace (every collective). c MB: bytes step c's peer permute shuffled in memory "
        "(not on a wire)."
    )
    ratios = [r["compression_ratio"] for r in records if "compression_ratio" in r]
    if ratios:
        lines.append(f"dmt compression ratio F N / sum O_t = {ratios[0]:.2f}")
    for r in records:
        lines.append(
            f"  {_label(r)}: runs ms/step {[round(t, 2) for t in r['ms_per_step_runs']]}, "
            f"back to back {[round(t, 2) for t in r['ms_per_step_window_runs']]}"
        )
        counted = r["bytes_per_step"]
        for key in sorted(counted):
            if key.startswith("c/") and key.endswith("/calls") and counted[key]:
                moved = counted[key.replace("/calls", "/bytes_shuffled")]
                what = key.removesuffix("/calls")
                lines.append(f"    {what:28s} {moved / 1e6:9.3f} MB  shuffled (step c, local)")
            if key.endswith("bytes_sent") and counted[key]:
                cross = counted[key.replace("bytes_sent", "bytes_cross_host")]
                lines.append(
                    f"    {key.removesuffix('/bytes_sent'):28s} {counted[key] / 1e6:9.3f} MB"
                    f"  cross-host {cross / 1e6:9.3f} MB  (CommStats)"
                )
    return "\n".join(lines)


def _add_best_flat(records: list[dict[str, Any]]) -> None:
    """Give every record ``speedup_vs_best_flat``: the fastest ``flat`` record's ms per step at
    the same ``comm_precision`` (pipelined or not: the strongest baseline this run measured)
    over the record's; left out where that precision has no flat record."""
    best: dict[str, float] = {}
    for r in records:
        if r["mode"] == "flat":
            prec = r["comm_precision"]
            best[prec] = min(best.get(prec, r["ms_per_step"]), r["ms_per_step"])
    for r in records:
        if r["comm_precision"] in best:
            r["speedup_vs_best_flat"] = best[r["comm_precision"]] / r["ms_per_step"]


def _run(args: argparse.Namespace) -> None:
    records = _main_on_rank(args)
    if records is not None:
        _add_best_flat(records)
        print(_report(args, records), flush=True)
        if args.json:  # never over a file that appeared since the check at the start
            write_json(args.json, records, replace=args.overwrite)


def _spawned(local: int, args: argparse.Namespace, init_file: str) -> None:
    torch.set_num_threads(1)
    per_node = args.world_size // args.nnodes
    dist.init_process_group(
        "gloo",
        init_method=f"file://{init_file}",
        rank=args.node_rank * per_node + local,
        world_size=args.world_size,
        timeout=timedelta(minutes=5),
    )
    try:
        _run(args)
    finally:
        dist.destroy_process_group()


def main(argv: list[str] | None = None) -> None:
    args = _parse(argv)
    if "RANK" in os.environ:  # torchrun
        backend = "nccl" if torch.cuda.is_available() else "gloo"
        if backend == "nccl":  # a launcher that binds one GPU per task shows each rank one
            local_rank = int(os.environ.get("LOCAL_RANK", 0))
            torch.cuda.set_device(cuda_index(local_rank, torch.cuda.device_count()))
        dist.init_process_group(backend, timeout=timedelta(minutes=5))
        args.world_size = dist.get_world_size()
        try:
            _run(args)
        finally:
            dist.destroy_process_group()
        return
    per_node = args.world_size // args.nnodes
    with tempfile.TemporaryDirectory() as tmp:
        init_file = args.init_file or os.path.join(tmp, "rendezvous")
        mp.start_processes(_spawned, args=(args, init_file), nprocs=per_node, start_method="spawn")


if __name__ == "__main__":
    main()
