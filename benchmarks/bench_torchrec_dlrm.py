"""dmt against Meta's ``torchrec_dlrm`` training loop, one process, the same batches (issue 11).

In one process (a world of one: gloo on the CPU, or NCCL on one GPU with ``--device cuda``) and
on the same batches of the Criteo Kaggle sample
(``data=criteo_sample``, preprocessed by dmt's loaders), six variants train side by side:

- ``reference``: ``facebookresearch/dlrm``'s ``torchrec_dlrm/dlrm_main.py`` loop rebuilt from
  TorchRec's own parts: ``torchrec.models.dlrm.DLRM`` in ``DLRMTrain``, tables as an
  ``EmbeddingBagCollection`` on ``meta``, ``torch.optim.Adagrad`` applied in backward on the
  tables, TorchRec's planner (``collective_plan``, 5% heuristic storage reservation),
  ``DistributedModelParallel``, the dense Adagrad through ``KeyedOptimizerWrapper`` +
  ``CombinedOptimizer``, an LR scheduler stepped every step (``LRPolicyScheduler`` without
  warm-up or decay keeps the base LR; a constant ``LambdaLR`` here) and
  ``TrainPipelineSparseDist.progress`` until the pipeline is drained;
- ``dmt default``: ``dmt.trainer.Trainer.run_steps`` with dmt's defaults: ``trainer.pipeline=true``,
  which in a world of one is the plain loop (``dmt.config.use_pipeline``);
- ``dmt pipelined``: the same through TorchRec's ``TrainPipelineSparseDist``
  (``trainer.pipeline_world_of_one=true``), as dmt trains 2+ ranks;
- ``dmt sync``: the default with ``trainer.log_every=1``, the loss read back every step;
- ``dmt unfused``: the default with ``optim.dense_fused=false``, torch's default (looping) dense
  Adagrad, as the reference's;
- ``reference fused``: the reference with ``fused=True`` on its dense Adagrad (one argument added
  to ``dlrm_main.py``'s optimizer), the reference at its strongest on that count.

The dmt variants read the loss back every ``trainer.log_every`` steps (default 50), as
``Trainer.fit`` does. Both sides: DLRM, dim 64, bottom 512-256-64 (ReLU after its last layer, as
TorchRec's ``DenseArch``), top 512-256-1, batch 512, exact (not row-wise) Adagrad lr 0.01 on the
tables (FBGEMM's eps 1e-8) and on the dense part (torch's default eps 1e-10: ``dlrm_main.py`` gives
it the LR only); table sizes are dmt's preprocessed cardinalities.

Every run builds a fresh model per variant, runs ``--warmup`` untimed steps of each, then the
``--steps`` timed steps in rounds of ``--block`` steps per variant, the variants' order rotating
every round and every run: on a shared machine, every variant sees the same load. On a machine
whose cores other processes share, ``--threads 1`` keeps torch's thread pool from being
oversubscribed (with 2 threads on 2 busy cores every variant ran about 8x slower, and erratically).
Every variant runs with freed host memory kept for reuse, as ``dmt-train`` runs
(``dmt.host_malloc``; ``--glibc-malloc``: glibc's defaults). ``--variants`` runs some of the
variants; one alone times it in a process of its own (alternate such invocations).

    .venv/bin/python benchmarks/bench_torchrec_dlrm.py --runs 5 --threads 1
    .venv/bin/python benchmarks/bench_torchrec_dlrm.py --steps 200 --runs 5 --json out.json
    .venv/bin/python benchmarks/bench_torchrec_dlrm.py --device cuda --steps 200 --warmup 20 --runs 5
    .venv/bin/python benchmarks/bench_torchrec_dlrm.py --device cuda --override data.batch_size=4096
    .venv/bin/python benchmarks/bench_torchrec_dlrm.py --runs 3 --threads 1 --variants reference

Prints samples/s per run, the median and range of each variant, the ratios dmt / reference,
pipelined / plain (the default) and no-sync / sync, and the load average at start and end.
"""

from __future__ import annotations

import argparse
import gc
import os
import statistics
import sys
import time
from collections.abc import Callable, Iterator
from pathlib import Path
from tempfile import TemporaryDirectory

import torch
import torch.distributed as dist
from torchrec import EmbeddingBagCollection, EmbeddingBagConfig
from torchrec.datasets.utils import Batch
from torchrec.distributed import TrainPipelineSparseDist
from torchrec.distributed.comm import get_local_size
from torchrec.distributed.model_parallel import DistributedModelParallel, get_default_sharders
from torchrec.distributed.planner import EmbeddingShardingPlanner
from torchrec.distributed.planner.storage_reservations import HeuristicalStorageReservation
from torchrec.distributed.planner.types import KernelConfig, TopologyFactory, TrainerConfig
from torchrec.models.dlrm import DLRM, DLRMTrain
from torchrec.optim.apply_optimizer_in_backward import apply_optimizer_in_backward
from torchrec.optim.keyed import CombinedOptimizer, KeyedOptimizerWrapper
from torchrec.optim.optimizers import in_backward_optimizer_filter

from dmt.config import Config
from dmt.data import DataBundle, build_data
from dmt.host_malloc import reuse_host_memory
from dmt.models.factory import table_name
from dmt.results import (
    add_runs_options,
    check_counts,
    check_runs,
    compose_or_exit,
    existing_output,
    write_json,
)
from dmt.runtime import Runtime, close_runtime, init_runtime
from dmt.train import compose_config, to_config
from dmt.trainer import Trainer

LR = 0.01
OVERRIDES = [
    "logger=disabled",
    "trainer.progress_bar=false",
    "data=criteo_sample",
    "data.batch_size=512",
    "model=dlrm",
    "model.embedding_dim=64",
    "model.bottom_mlp=[512,256,64]",
    "model.top_mlp=[512,256,1]",
    "model.bottom_final_activation=true",
    "optim=adagrad",
    "optim.sparse._target_=torch.optim.Adagrad",
    f"optim.sparse_lr={LR}",
    f"optim.lr={LR}",
    "optim.dense.eps=1e-10",  # torch's default, which torchrec_dlrm's dense Adagrad keeps
]
DMT_VARIANTS: dict[str, list[str]] = {
    "dmt default": [],
    "dmt pipelined": ["trainer.pipeline=true", "trainer.pipeline_world_of_one=true"],
    "dmt sync": ["trainer.log_every=1"],
    "dmt unfused": ["optim.dense_fused=false"],
}
REFERENCE_VARIANTS = ("reference", "reference fused")
VARIANTS = [*REFERENCE_VARIANTS, *DMT_VARIANTS]


def dmt_overrides(variant: str, device: str = "cpu", extra: tuple[str, ...] = ()) -> list[str]:
    """The variant's overrides; ``extra`` (``--override``) before the variant's own settings and
    the device (``--device``), which it cannot change."""
    return [*OVERRIDES, *extra, *DMT_VARIANTS[variant], f"trainer.device={device}"]


def dmt_config(variant: str, device: str = "cpu", extra: tuple[str, ...] = ()) -> Config:
    """The variant's config (:func:`dmt_overrides`)."""
    return to_config(compose_config(*dmt_overrides(variant, device, extra)))


def training_batches(data: DataBundle, count: int) -> list[Batch]:
    """The first ``count`` training batches, epoch after epoch."""
    out: list[Batch] = []
    epoch = 0
    while len(out) < count:
        out.extend(data.train.batches(epoch))
        epoch += 1
    return out[:count]


# -- the reference: torchrec_dlrm's loop ---------------------------------------------------------


def reference_pipeline(
    data: DataBundle, cfg: Config, device: torch.device, *, fused: bool = False
) -> tuple[TrainPipelineSparseDist, Callable[[], None]]:
    """torchrec_dlrm's model, optimizers and pipeline for ``cfg``'s sizes; returns the pipeline
    and the per-step LR scheduler step. ``fused``: the dense Adagrad with ``fused=True``
    (``dlrm_main.py`` gives it the LR only)."""
    m = cfg.model
    tables = [
        EmbeddingBagConfig(
            name=table_name(f), embedding_dim=m.embedding_dim, num_embeddings=n, feature_names=[f]
        )
        for f, n in zip(data.feature_names, data.cardinalities)
    ]
    dlrm = DLRM(
        embedding_bag_collection=EmbeddingBagCollection(tables=tables, device=torch.device("meta")),
        dense_in_features=data.num_dense,
        dense_arch_layer_sizes=list(m.bottom_mlp),
        over_arch_layer_sizes=list(m.top_mlp),
        dense_device=device,
    )
    train_model = DLRMTrain(dlrm)
    apply_optimizer_in_backward(
        torch.optim.Adagrad, train_model.model.sparse_arch.parameters(), {"lr": cfg.optim.sparse_lr}
    )
    planner = EmbeddingShardingPlanner(
        # dlrm_main.py's Topology(local_world_size, world_size, compute_device), built as TorchRec
        # 1.8 asks (the same topology; built directly, it warned "... the job will fail")
        topology=TopologyFactory.create_topology(
            trainer_config=TrainerConfig(
                world_size=dist.get_world_size(), local_world_size=get_local_size()
            ),
            kernel_config=KernelConfig(compute_device=device.type),
        ),
        batch_size=cfg.data.batch_size,
        storage_reservation=HeuristicalStorageReservation(percentage=0.05),
    )
    plan = planner.collective_plan(train_model, get_default_sharders(), dist.GroupMember.WORLD)
    model = DistributedModelParallel(module=train_model, device=device, plan=plan)
    fused_kwargs = {"fused": True} if fused else {}
    dense = KeyedOptimizerWrapper(
        dict(in_backward_optimizer_filter(model.named_parameters())),
        lambda params: torch.optim.Adagrad(params, lr=cfg.optim.lr, **fused_kwargs),
    )
    optimizer = CombinedOptimizer([model.fused_optimizer, dense])
    scheduler = torch.optim.lr_scheduler.LambdaLR(optimizer, lambda step: 1.0)
    return TrainPipelineSparseDist(model, optimizer, device), scheduler.step


def reference_steps(
    pipeline: TrainPipelineSparseDist, lr_step: Callable[[], None], batches: list[Batch]
) -> Iterator[torch.Tensor]:
    """torchrec_dlrm's ``_train``: ``progress`` then the scheduler's step, until drained."""
    it = iter(batches)
    while True:
        try:
            loss, _logits, _labels = pipeline.progress(it)
        except StopIteration:
            return
        lr_step()
        yield loss


# -- the runs ------------------------------------------------------------------------------------


def variant_steps(
    variant: str,
    rt: Runtime,
    data: DataBundle,
    batches: list[Batch],
    out: Path,
    extra: tuple[str, ...] = (),
) -> Iterator[torch.Tensor]:
    """A fresh model of ``variant``, as an iterator over its training steps on ``batches``
    (each yields the step's loss)."""
    name = variant if variant not in REFERENCE_VARIANTS else "dmt default"
    cfg = dmt_config(name, rt.device.type, extra)
    torch.manual_seed(cfg.trainer.seed)
    if variant in REFERENCE_VARIANTS:
        pipeline, lr_step = reference_pipeline(
            data, cfg, rt.device, fused=variant == "reference fused"
        )
        return reference_steps(pipeline, lr_step, batches)
    trainer = Trainer(cfg, rt, out / variant.replace(" ", "_"))
    if (trainer.pipeline is not None) != (variant == "dmt pipelined"):
        raise RuntimeError(f"{variant}: trainer.pipeline came out {trainer.pipeline!r}")
    every = cfg.trainer.log_every

    def steps() -> Iterator[torch.Tensor]:
        for loss in trainer.run_steps(iter(batches)):
            if trainer.step % every == 0:
                float(loss)  # Trainer.fit's log step: the host sync
            yield loss

    return steps()


def _sync(device: torch.device) -> None:
    """Wait for the device's queued work (CUDA runs asynchronously: a clock read without it
    measures launches, not steps)."""
    if device.type == "cuda":
        torch.cuda.synchronize(device)


def run(
    rt: Runtime,
    data: DataBundle,
    batches: list[Batch],
    *,
    warmup: int,
    block: int,
    first: int,
    extra: tuple[str, ...] = (),
    variants: tuple[str, ...] = tuple(VARIANTS),
) -> dict[str, tuple[float, float]]:
    """One run: a fresh model per variant, ``warmup`` untimed steps each, then the timed steps
    in rounds of ``block`` steps per variant, the order rotating every round (round ``r``
    starts with variant ``first + r``), so that every variant sees the same machine load.
    Returns samples/s and the mean loss of the timed steps per variant; the losses are read
    after the clock stops, so the timing adds no host sync."""
    steps = len(batches) - warmup
    batch_size = len(batches[0].labels)
    order = list(variants)
    elapsed = dict.fromkeys(order, 0.0)
    losses: dict[str, list[torch.Tensor]] = {v: [] for v in order}
    with TemporaryDirectory() as out:
        its = {v: variant_steps(v, rt, data, batches, Path(out), extra) for v in order}
        for it in its.values():
            for _ in range(warmup):
                next(it)
        for r, start in enumerate(range(0, steps, block)):
            k = (first + r) % len(order)
            for v in order[k:] + order[:k]:
                _sync(rt.device)
                tick = time.perf_counter()
                for _ in range(min(block, steps - start)):
                    losses[v].append(next(its[v]))
                _sync(rt.device)
                elapsed[v] += time.perf_counter() - tick
        for v, it in its.items():
            if next(it, None) is not None:
                raise RuntimeError(f"{v} ran more steps than there are batches")
        del its
    gc.collect()
    return {
        v: (batch_size * steps / elapsed[v], float(torch.stack(losses[v]).mean())) for v in order
    }


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    p.add_argument("--steps", type=int, default=100, help="timed steps per run")
    p.add_argument("--warmup", type=int, default=10, help="untimed steps before them")
    add_runs_options(p, "runs, each of every variant")
    p.add_argument("--block", type=int, default=10, help="steps per variant before the next")
    p.add_argument("--threads", type=int, default=0, help="torch threads (0: torch's default)")
    p.add_argument("--json", type=Path, default=None, help="write the results here")
    p.add_argument("--overwrite", action="store_true", help="replace an existing --json file")
    p.add_argument("--device", choices=["cpu", "cuda"], default="cpu", help="one CPU or one GPU")
    p.add_argument(
        "--variants",
        default=",".join(VARIANTS),
        help="comma-separated, of those above (default: all); one alone, in separate "
        "invocations, times each variant in a process of its own",
    )
    p.add_argument(
        "--glibc-malloc",
        action="store_true",
        help="keep glibc's adapting malloc thresholds (as trainer.reuse_host_memory=false); "
        "default: freed host memory kept for reuse in this process, for every variant, as "
        "dmt-train does (dmt.host_malloc)",
    )
    p.add_argument(
        "--override",
        action="append",
        default=[],
        help="a further dmt config override for every variant (e.g. data.criteo.raw_path=...)",
    )
    args = p.parse_args(argv)
    variants = tuple(v.strip() for v in args.variants.split(","))
    if unknown := [v for v in variants if v not in VARIANTS]:
        p.error(f"--variants: {', '.join(map(repr, unknown))} not among {VARIANTS}")
    if len(set(variants)) < len(variants):
        p.error(f"--variants {args.variants!r} names a variant twice")
    check_runs(p, args.runs, args.smoke)
    check_counts(p, args, ("steps", "block"), ("warmup",))
    if (error := existing_output(args.json, "--json", args.overwrite)) is not None:
        p.error(error)
    if args.threads < 0:
        p.error(f"--threads {args.threads}: must be 0 (torch's default) or more")
    extra = tuple(args.override)
    for variant in dict.fromkeys(("dmt default", *variants)):  # "dmt default" gives the data
        if variant in DMT_VARIANTS:  # each --override checked before any work, as each runs
            compose_or_exit(p, dmt_overrides(variant, args.device, extra), extra)
    if args.threads > 0:
        torch.set_num_threads(args.threads)
    reuse = not args.glibc_malloc and reuse_host_memory()
    load_start = os.getloadavg()
    print(
        f"load average at start {load_start[0]:.2f} {load_start[1]:.2f} {load_start[2]:.2f}; "
        f"{os.cpu_count()} cores, {torch.get_num_threads()} torch threads; host memory "
        f"{'kept for reuse' if reuse else 'as the C library manages it'} (every variant)",
        flush=True,
    )
    rt = init_runtime(args.device)
    try:
        cfg = dmt_config("dmt default", args.device, extra)
        data = build_data(cfg.data, rank=0, world_size=1, seed=cfg.trainer.seed)
        batches = training_batches(data, args.warmup + args.steps)
        rates: dict[str, list[float]] = {v: [] for v in variants}
        losses: dict[str, list[float]] = {v: [] for v in variants}
        for i in range(args.runs):
            result = run(
                rt,
                data,
                batches,
                warmup=args.warmup,
                block=args.block,
                first=i,
                extra=extra,
                variants=variants,
            )
            for variant, (rate, loss) in result.items():
                rates[variant].append(rate)
                losses[variant].append(loss)
                print(
                    f"run {i} {variant:15}: {rate:8,.0f} samples/s (mean loss {loss:.4f})",
                    flush=True,
                )
    finally:
        close_runtime()
    load_end = os.getloadavg()
    print(f"load average at end {load_end[0]:.2f} {load_end[1]:.2f} {load_end[2]:.2f}")
    median = {v: statistics.median(r) for v, r in rates.items()}
    for v, r in rates.items():
        print(f"{v:15} median {median[v]:8,.0f} samples/s (range {min(r):,.0f}-{max(r):,.0f})")
    pairs = {
        "dmt default / reference": ("dmt default", "reference"),
        "dmt pipelined / reference": ("dmt pipelined", "reference"),
        "dmt sync / reference": ("dmt sync", "reference"),
        "dmt default / ref. fused": ("dmt default", "reference fused"),
        "dmt unfused / reference": ("dmt unfused", "reference"),
        "fused / unfused (dmt)": ("dmt default", "dmt unfused"),
        "ref. fused / reference": ("reference fused", "reference"),
        "pipelined / plain": ("dmt pipelined", "dmt default"),
        "no sync / sync": ("dmt default", "dmt sync"),
    }
    pairs = {name: (a, b) for name, (a, b) in pairs.items() if a in rates and b in rates}
    ratios = {name: median[a] / median[b] for name, (a, b) in pairs.items()}
    # the same ratios within each run (the variants of a run share the machine's load)
    per_run = {name: [x / y for x, y in zip(rates[a], rates[b])] for name, (a, b) in pairs.items()}
    for name, value in ratios.items():
        r = per_run[name]
        print(
            f"{name:26}: {value:.3f}x of the medians; within runs median "
            f"{statistics.median(r):.3f}x (range {min(r):.3f}-{max(r):.3f})"
        )
    if args.json is not None:
        result = {
            "steps": args.steps,
            "warmup": args.warmup,
            "runs": args.runs,
            "block": args.block,
            "batch_size": cfg.data.batch_size,
            "torch_threads": torch.get_num_threads(),
            "reuse_host_memory": reuse,
            "device": str(rt.device),
            "device_name": torch.cuda.get_device_name(rt.device)
            if rt.device.type == "cuda"
            else None,
            "load_start": load_start,
            "load_end": load_end,
            "samples_per_s": rates,
            "mean_loss": losses,
            "median": median,
            "ratios": ratios,
            "ratios_per_run": per_run,
        }
        write_json(args.json, result, replace=args.overwrite)
    return 0


if __name__ == "__main__":
    sys.exit(main())
