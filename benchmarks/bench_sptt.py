"""Benchmark flat TorchRec sharding against SPTT and DMT on the same model and data.

Modes (one training step = forward, backward with the fused sparse optimizer, dense step):

* ``flat``: the DMT model with pass-through towers (semantically the base DLRM) sharded flat by
  TorchRec (``DistributedModelParallel``; tables table-wise, or the planner's choice with
  ``--flat-sharding planner``) -- the paper's baseline;
* ``flat-1tower``: the same model through :func:`dmt.sptt.dmt_sharding.shard_dmt` with one tower
  spanning the world. It moves exactly the bytes of TorchRec's table-wise flat lookup (step a =
  the KJT all-to-all to the table owners, step d = the pooled-embedding all-to-all over all ``G``
  ranks, no step f), so it is where the flat byte counts come from;
* ``sptt``: the pass-through model with SPTT on ``T = G / (K L)`` towers (same semantics);
* ``dmt``: the DMT model with DLRM tower modules (``c = 1, p = 0, D = --tower-dim``) on the same
  towers: compression ratio ``N / D``.

``--peer-permute output,input,auto,skip`` runs ``sptt`` and ``dmt`` once per setting of where step
c permutes (paper section 3.1.3, :mod:`dmt.sptt.peer_permute`), as ``sptt:input`` and so on:
the pooled output, the sparse input before the lookup, the smaller of the two, or nothing (step a
delivers peer order). The ``c MB`` column gives the bytes step c shuffled (local, no wire).

Reported per mode: the median over ``--runs`` runs of the median step time of each run, and, per
step and summed over all ranks, the bytes each process group carries and how many cross a host
boundary (``L`` ranks per host). Gradient all-reduces are counted with the ring model
(``2 (n - 1) / n`` of the buffer per rank).

Hosts are emulated: ``L`` consecutive ranks form a host. On one machine (gloo, CPU)::

    python benchmarks/bench_sptt.py --world-size 8 --local-world-size 2

To put every emulated host in its own network namespace, with 1 Gbit/s between hosts, see
``scripts/netns_throttle.sh``; it starts one copy per host with ``--nnodes``/``--node-rank``/
``--init-file``. Under torchrun (NCCL on GPUs)::

    torchrun --nproc-per-node 8 benchmarks/bench_sptt.py --local-world-size 8 ...

CPU timings with more ranks than cores mostly measure contention; the byte counts are exact.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import tempfile
import time
from collections.abc import Callable
from datetime import timedelta
from typing import Any

import torch
import torch.distributed as dist
import torch.multiprocessing as mp
from torch import nn
from torchrec.datasets.utils import Batch
from torchrec.distributed.model_parallel import DistributedModelParallel, get_default_sharders
from torchrec.distributed.planner import EmbeddingShardingPlanner, ParameterConstraints
from torchrec.distributed.planner import Topology as PlannerTopology
from torchrec.sparse.jagged_tensor import KeyedJaggedTensor

from dmt.config import (
    DLRMTowerConfig,
    DotInteractionConfig,
    ModelConfig,
    OptimConfig,
    PartitionConfig,
    PassThroughTowerConfig,
)
from dmt.models import build_dmt_model, embedding_parameters, naive_partition
from dmt.models.accounting import compression_ratio
from dmt.optim import apply_sparse_optimizer, build_optimizer
from dmt.runtime import Runtime
from dmt.sharding import shard_model
from dmt.sptt.comm_stats import CommStats
from dmt.sptt.dmt_sharding import shard_dmt
from dmt.sptt.peer_permute import PEER_PERMUTES
from dmt.sptt.process_groups import create_process_groups
from dmt.sptt.topology import Topology
from dmt.trainer import TrainTask

MODES = ("flat", "flat-1tower", "sptt", "dmt")
GROUP_OF_STEP = {"a": "world", "d": "tower", "f": "peer", "tm": "tower", "dense": "world"}
SHUFFLED = ("output", "input", "none")  # what step c permuted


def _parse(argv: list[str] | None = None) -> argparse.Namespace:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawTextHelpFormatter)
    p.add_argument("--world-size", type=int, default=4, help="G")
    p.add_argument("--local-world-size", type=int, default=2, help="L, ranks per (emulated) host")
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
        default="output",
        help=f"where step c permutes in sptt/dmt: comma-separated, of {PEER_PERMUTES}",
    )
    p.add_argument("--iters", type=int, default=10, help="timed steps per run")
    p.add_argument("--warmup", type=int, default=3, help="untimed steps before each run")
    p.add_argument("--runs", type=int, default=3, help="runs per mode (modes interleaved)")
    p.add_argument("--json", default=None, help="write the results here (rank 0)")
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
    unknown = set(args.modes.split(",")) - set(MODES)
    if unknown:
        p.error(f"unknown modes {sorted(unknown)}; choose from {MODES}")
    unknown = set(args.peer_permute.split(",")) - set(PEER_PERMUTES)
    if unknown:
        p.error(f"unknown --peer-permute {sorted(unknown)}; choose from {PEER_PERMUTES}")
    if args.world_size % args.nnodes:
        p.error("--world-size must be a multiple of --nnodes")
    if args.nnodes > 1 and not args.init_file:
        p.error("--nnodes > 1 needs --init-file (a file every launcher can reach)")
    return args


# ---- model, data, modes ----------------------------------------------------------------------


def _names(args: argparse.Namespace) -> list[str]:
    return [f"cat_{f}" for f in range(args.features)]


def _model(args: argparse.Namespace, num_towers: int, tower: str) -> nn.Module:
    D = args.dim if tower == "passthrough" else args.tower_dim
    cfg = ModelConfig(
        name="dlrm",
        interaction=DotInteractionConfig(),
        embedding_dim=args.dim,
        bottom_mlp=[64, D],
        top_mlp=[64, 1],
        tower=PassThroughTowerConfig() if tower == "passthrough" else DLRMTowerConfig(dim=D, c=1, p=0),
        partition=PartitionConfig(kind="explicit"),
    )
    torch.manual_seed(0)
    names = _names(args)
    return build_dmt_model(
        cfg,
        naive_partition(names, num_towers),
        feature_names=names,
        cardinalities=[args.rows] * args.features,
        num_dense=13,
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


OPTIM = OptimConfig(sparse="rowwise_adagrad", sparse_lr=0.05, dense="sgd", lr=0.01)


def _flat(args: argparse.Namespace, runtime: Runtime) -> tuple[nn.Module, Any, None]:
    model = _model(args, 1, "passthrough")
    apply_sparse_optimizer(embedding_parameters(model), OPTIM)
    task = TrainTask(model)
    if args.flat_sharding == "planner":
        dmp = shard_model(task, runtime, batch_size=args.batch * runtime.world_size)
    else:
        planner = EmbeddingShardingPlanner(
            topology=PlannerTopology(
                world_size=runtime.world_size,
                local_world_size=runtime.local_world_size,
                compute_device=runtime.device.type,
            ),
            batch_size=args.batch,
            constraints={
                f"t_{f}": ParameterConstraints(sharding_types=["table_wise"]) for f in _names(args)
            },
        )
        sharders = get_default_sharders()
        plan = planner.collective_plan(task, sharders, dist.GroupMember.WORLD)
        dmp = DistributedModelParallel(task, device=runtime.device, plan=plan, sharders=sharders)
    return dmp, build_optimizer(dmp, OPTIM), None


def _sptt(
    args: argparse.Namespace,
    runtime: Runtime,
    topo: Topology,
    hosts: Topology,
    tower: str,
    peer_permute: str = "output",
) -> tuple[nn.Module, Any, CommStats]:
    stats = CommStats(hosts, runtime.rank)
    groups = create_process_groups(topo, timeout=timedelta(minutes=5))
    task, optimizer = shard_dmt(
        TrainTask(_model(args, topo.num_towers, tower)),
        runtime,
        topology=topo,
        groups=groups,
        optim_cfg=OPTIM,
        stats=stats,
        peer_permute=peer_permute,
    )
    return task, optimizer, stats


def _time_steps(
    step: Callable[[Batch], None], batches: list[Batch], args: argparse.Namespace, cuda: bool
) -> list[float]:
    times = []
    for i in range(args.warmup + args.iters):
        dist.barrier()
        start = time.perf_counter()
        step(batches[i % len(batches)])
        if cuda:
            torch.cuda.synchronize()
        times.append(time.perf_counter() - start)
    return times[args.warmup :]


def _main_on_rank(args: argparse.Namespace) -> dict[str, Any] | None:
    rank, world_size = dist.get_rank(), dist.get_world_size()
    cuda = torch.cuda.is_available() and dist.get_backend() == "nccl"
    local_rank = rank % args.local_world_size
    device = torch.device("cuda", local_rank) if cuda else torch.device("cpu")
    runtime = Runtime(
        rank, world_size, local_rank, args.local_world_size, device, dist.get_backend()
    )
    hosts = Topology(world_size, args.local_world_size, args.hosts_per_tower)
    settings = args.peer_permute.split(",")
    built: dict[str, tuple[nn.Module, Any, CommStats | None]] = {}
    for mode in args.modes.split(","):  # every rank builds the modes in the same order
        if mode == "flat":
            built[mode] = _flat(args, runtime)
        elif mode == "flat-1tower":
            built[mode] = _sptt(
                args, runtime, Topology(world_size, world_size), hosts, "passthrough"
            )
        else:
            tower = "passthrough" if mode == "sptt" else "dlrm"
            for setting in settings:
                name = mode if len(settings) == 1 else f"{mode}:{setting}"
                built[name] = _sptt(args, runtime, hosts, hosts, tower, setting)
    modes = list(built)
    batches = _batches(args, rank, device)

    run_medians: dict[str, list[float]] = {m: [] for m in modes}
    for _ in range(args.runs):
        for mode in modes:
            module, optimizer, stats = built[mode]

            def step(batch: Batch, module: nn.Module = module, optimizer: Any = optimizer) -> None:
                optimizer.zero_grad()
                loss, _ = module(batch)
                loss.backward()
                optimizer.step()

            if stats is not None:
                stats.reset()
            run_medians[mode].append(statistics.median(_time_steps(step, batches, args, cuda)))

    results: dict[str, Any] = {}
    for mode in modes:
        stats = built[mode][2]
        counts = _world_totals(stats, device) if stats is not None else {}
        steps_counted = args.warmup + args.iters  # the last run's (stats are reset before each)
        results[mode] = {
            "ms_per_step": statistics.median(run_medians[mode]) * 1e3,
            "ms_per_step_runs": [t * 1e3 for t in run_medians[mode]],
            "bytes_per_step": {k: v / steps_counted for k, v in counts.items()},
        }
        if mode.startswith("dmt"):
            dmt_model = _model(args, hosts.num_towers, "dlrm")
            results[mode]["compression_ratio"] = compression_ratio(dmt_model)
    if rank != 0:
        return None
    return results


def _world_totals(stats: CommStats, device: torch.device) -> dict[str, float]:
    """``{"<step>/<group>/<direction>/<field>": sum over ranks}`` (collective)."""
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
    values = torch.tensor(
        [float(local.get(k, 0)) for k in keys], dtype=torch.float64, device=device
    )
    dist.all_reduce(values)
    return dict(zip(keys, values.tolist()))


def _group_totals(bytes_per_step: dict[str, float]) -> dict[str, dict[str, float]]:
    out: dict[str, dict[str, float]] = {}
    for key, value in bytes_per_step.items():
        step, group, _, field = key.split("/")
        if step == "c":
            continue
        entry = out.setdefault(group, {"bytes_sent": 0.0, "bytes_cross_host": 0.0})
        entry[field] += value
    return out


def _report(args: argparse.Namespace, results: dict[str, Any]) -> str:
    hosts = Topology(args.world_size, args.local_world_size, args.hosts_per_tower)
    lines = [
        f"G={args.world_size} L={args.local_world_size} K={args.hosts_per_tower} "
        f"T={hosts.num_towers} F={args.features} N={args.dim} D={args.tower_dim} B={args.batch} "
        f"rows={args.rows} hotness={args.hotness} flat={args.flat_sharding}; median of "
        f"{args.runs} runs x {args.iters} steps; MB per step summed over ranks (fwd+bwd)",
        f"{'mode':12s} {'ms/step':>9s} {'x flat':>7s} {'world MB':>9s} {'tower MB':>9s} "
        f"{'peer MB':>9s} {'total MB':>9s} {'cross MB':>9s} {'cross x':>8s} {'c MB':>8s}",
    ]
    flat_ms = results.get("flat", {}).get("ms_per_step")
    flat_bytes = results.get("flat-1tower", {}).get("bytes_per_step")
    flat_cross = (
        sum(v for k, v in flat_bytes.items() if k.endswith("bytes_cross_host"))
        if flat_bytes
        else None
    )
    for mode, r in results.items():
        groups = _group_totals(r["bytes_per_step"]) if r["bytes_per_step"] else {}
        mb = {g: groups.get(g, {}).get("bytes_sent", 0.0) / 1e6 for g in ("world", "tower", "peer")}
        cross = sum(g["bytes_cross_host"] for g in groups.values()) if groups else None
        if mode == "flat" and flat_bytes:  # flat bytes are those of its 1-tower equivalent
            groups = _group_totals(flat_bytes)
            mb = {
                g: groups.get(g, {}).get("bytes_sent", 0.0) / 1e6
                for g in ("world", "tower", "peer")
            }
            cross = flat_cross
        speed = f"{flat_ms / r['ms_per_step']:7.2f}" if flat_ms else "      -"
        ratio = f"{flat_cross / cross:8.2f}" if flat_cross and cross else "       -"
        total = sum(mb.values())
        shuffled = sum(v for k, v in r["bytes_per_step"].items() if k.endswith("/bytes_shuffled"))
        lines.append(
            f"{mode:12s} {r['ms_per_step']:9.2f} {speed} {mb['world']:9.3f} {mb['tower']:9.3f} "
            f"{mb['peer']:9.3f} {total:9.3f} "
            f"{(cross or 0) / 1e6:9.3f} {ratio} {shuffled / 1e6:8.3f}"
        )
    lines.append(
        f"groups: world = G = {args.world_size} ranks (step a, dense all-reduce); tower = K L = "
        f"{hosts.tower_size} ranks (step d, tower-module all-reduce; flat: one tower = the "
        f"world); peer = T = {hosts.num_towers} ranks (step f)"
    )
    lines.append(
        "x flat: flat ms / mode ms (speed-up); cross x: flat cross-host bytes / mode's. "
        "flat's bytes are flat-1tower's (the same flows). c MB: bytes step c's peer permute "
        "shuffled in memory (not on a wire; mode:setting = --peer-permute setting)."
    )
    ratios = [r["compression_ratio"] for r in results.values() if "compression_ratio" in r]
    if ratios:
        lines.append(f"dmt compression ratio F N / sum O_t = {ratios[0]:.2f}")
    for mode, r in results.items():
        lines.append(f"  {mode}: runs ms/step {[round(t, 2) for t in r['ms_per_step_runs']]}")
        for key in sorted(r["bytes_per_step"]):
            if key.startswith("c/") and key.endswith("/calls") and r["bytes_per_step"][key]:
                moved = r["bytes_per_step"][key.replace("/calls", "/bytes_shuffled")]
                what = key.removesuffix("/calls")
                lines.append(f"    {what:28s} {moved / 1e6:9.3f} MB  shuffled (step c, local)")
            if key.endswith("bytes_sent") and r["bytes_per_step"][key]:
                cross = r["bytes_per_step"][key.replace("bytes_sent", "bytes_cross_host")]
                lines.append(
                    f"    {key.removesuffix('/bytes_sent'):28s} {r['bytes_per_step'][key] / 1e6:9.3f} MB"
                    f"  cross-host {cross / 1e6:9.3f} MB"
                )
    return "\n".join(lines)


def _run(args: argparse.Namespace) -> None:
    results = _main_on_rank(args)
    if results is not None:
        print(_report(args, results), flush=True)
        if args.json:
            with open(args.json, "w") as f:
                json.dump({"args": vars(args), "results": results}, f, indent=2)


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
        if backend == "nccl":
            torch.cuda.set_device(int(os.environ.get("LOCAL_RANK", 0)))
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
