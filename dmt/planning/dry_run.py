"""Dry run of the real sharded modules of one rank of a large world, in one process.

:func:`dry_run` builds what ``dmt-train`` would build on rank ``rank`` of ``world_size`` ranks
(``local_world_size`` per host): the flat TorchRec ``DistributedModelParallel`` of the base
model, or the :class:`~dmt.sptt.dmt_sharding.ShardedDMT` of a DMT model (SPTT with pass-through
towers, or DMT with tower modules), and runs one training step, so that a configuration that
would fail to plan, to construct or to line up its shapes at 512 ranks fails here, in seconds,
without a cluster. The model of torchtitan's ``--comm.mode fake_backend``: the collectives of one
rank run against process groups that do not communicate.

It runs in two phases, each in a process group of its own that is destroyed at the end:

1. **Construction at full size, on meta** (PyTorch's fake backend, ``FakeProcessGroup``): the
   planner's (flat) or the SPTT plan of the model *with its real table sizes*, and the sharded
   modules built from it with every table shard on the ``meta`` device. Checks that the plan
   places every table, and, for SPTT, that the towers and the process groups the module holds
   have the sizes of the topology. Dense modules (MLPs, tower modules) are real CPU tensors:
   DDP reads their values when it wraps them. Memory: the dense parameters only.

2. **One forward and backward, on CPU with the smallest real tensors**: the same configuration
   with every table cut to at most ``max_rows`` rows (never below ``world_size``), a local batch
   of ``batch_size`` samples per rank, the same sharding types and kernels as the full-size plan
   (flat: TorchRec's planner pinned to them; SPTT: ``sptt.sharding_type``), trained for one step
   with the fused sparse optimizer and the dense optimizer, exactly as the trainer does. Reports
   the logits' and the loss's shapes and step f's outputs per tower.

Why phase 2 is not on meta: two things in the real code need values, not only shapes.
FBGEMM's TBE forward (``SplitTableBatchedEmbeddingBagsCodegen``, the fused lookup of both the
flat and the SPTT tables) reads its iteration counter on the host (``self.iter.cpu().item()``),
which no meta tensor can give; and TorchRec's ``KJTAllToAll`` (step a, and the flat input
all-to-all) first exchanges the number of ids per rank and reads them on the host
(``.tolist()``) to size the id all-to-all. For the latter the fake backend is not enough either:
its all-to-all leaves a copy of the rank's *send* counts as the *received* counts, which sizes the
jagged all-to-all wrongly whenever ranks hold different numbers of features. Phase 2 therefore
uses :class:`MirrorProcessGroup`, a process group without communication whose collectives return
what they would return if every rank held this rank's batch (every rank sends this rank what
this rank sends itself): exact for the jagged input all-to-alls, right-sized for everything else.

Limits: cut tables change only the number of rows of each shard, never the shapes of what a
step moves; but the plan of the cut model may place tables on other ranks than the full-size
plan (TorchRec's planner and the SPTT plan balance by table size; the sharding types are the
same), so phase 2's rank may hold other shards than phase 1's. The flat model is sharded as
:func:`dmt.sharding.shard_model` does it (:func:`~dmt.sharding.plan_tables`, then
``DistributedModelParallel`` with :func:`~dmt.sharding.flat_sharders`), without its broadcast of
the plan. The CPU sharders build fewer sharding types than CUDA's (no ``row_wise``,
``table_row_wise`` or ``grid_shard``): given the plan being checked (``flat_sharding_types``), the
flat model is built with its types where the CPU has them and the planner's choice where not,
named in :attr:`DryRunReport.substituted`. ``torch.distributed.reduce_scatter_tensor`` and
``all_gather_into_tensor`` do not reach a Python process group in torch 2.13, so phase 2 does not
run row-wise SPTT shards (``sptt.sharding_type=row_wise``; :attr:`DryRunReport.phase_2_skipped`
says so): phase 1 still builds them. ``DistributedModelParallel`` broadcasts a pickled setting from rank 0
(TorchRec's ``init_collective_validation``), which no other rank can read without
communication, so the flat model dry-runs as rank 0.

Shape legend: ``G`` ranks, ``L`` ranks per host, ``K`` hosts per tower, ``T = G / (K L)`` towers,
``B`` local batch, ``(V_t, D_t)`` tower ``t``'s output.

Example::

    report = dry_run(conf, world_size=512, local_world_size=8, mode="dmt")
    report.logits_shape   # (B,)
    report.to_dict()
"""

from __future__ import annotations

import dataclasses
import logging
import os
import resource
import time
from collections.abc import Iterator, Mapping
from contextlib import contextmanager
from dataclasses import dataclass, field
from typing import Any

import torch
import torch.distributed as dist
from torch import nn
from torch._C._distributed_c10d import _create_work_from_future  # type: ignore[attr-defined]
from torch.futures import Future
from torch.testing._internal.distributed.fake_pg import FakeStore
from torchrec.datasets.utils import Batch
from torchrec.distributed.embeddingbag import EmbeddingBagCollectionSharder
from torchrec.distributed.model_parallel import DistributedModelParallel
from torchrec.distributed.types import ShardingPlan, ShardingType
from torchrec.modules.embedding_modules import EmbeddingBagCollection
from torchrec.sparse.jagged_tensor import KeyedJaggedTensor

from dmt.config import Config
from dmt.inspect import schema
from dmt.models import DMTModel, build_model, embedding_parameters
from dmt.optim import apply_sparse_optimizer, build_optimizer, check_sparse_optimizer
from dmt.runtime import Runtime
from dmt.sharding import (
    data_parallel_wrapper,
    flat_planner,
    flat_sharders,
    memory_budget,
    plan_tables,
    table_constraints,
    table_shardings,
)
from dmt.sptt.dmt_sharding import ShardedDMT, shard_dmt
from dmt.sptt.process_groups import create_process_groups
from dmt.sptt.topology import Topology

MODES = ("flat", "sptt", "dmt")
MIRROR_BACKEND = "dmt_mirror"
log = logging.getLogger(__name__)
_ROW_WISE = {ShardingType.ROW_WISE.value, ShardingType.TABLE_ROW_WISE.value}


# ---- process groups without communication ------------------------------------------------------


def _done(result: Any = None) -> dist.Work:
    future: Future[Any] = Future()
    future.set_result(result)
    return _create_work_from_future(future)


class MirrorProcessGroup(dist.ProcessGroup):
    """A process group that moves no data; each collective returns what it would if every rank
    held this rank's inputs (a world of identical batches).

    * ``all_to_all_single``: the block from every source is the block this rank sends itself
      when its size matches, zeros otherwise (then only its size is meaningful). For the jagged
      all-to-alls of TorchRec's ``KJTAllToAll`` (counts, lengths, ids) this is exact for
      identical batches, so the received ``KeyedJaggedTensor`` is consistent;
    * ``all_reduce``: unchanged (DDP's mean and the maximum of equal values are the value);
    * ``all_gather``: copies of the input; ``broadcast``, ``barrier``: nothing (rank 0 is the
      source that holds the value);
    * ``reduce_scatter`` (list form): this rank's block.
    """

    def __init__(self, rank: int, size: int) -> None:
        super().__init__(rank, size)  # type: ignore[call-arg]
        self._name = ""

    # the C++ names pybind overrides
    def getBackendName(self) -> str:  # noqa: N802
        return MIRROR_BACKEND

    def getGroupName(self) -> str:  # noqa: N802
        return self._name

    def setGroupName(self, name: str) -> None:  # noqa: N802
        self._name = name

    def alltoall_base(  # type: ignore[override]
        self,
        output: torch.Tensor,
        input: torch.Tensor,
        output_split_sizes: list[int],
        input_split_sizes: list[int],
        opts: Any,
    ) -> dist.Work:
        n, me = self.size(), self.rank()
        sent = list(input_split_sizes) or [input.numel() // n] * n
        received = list(output_split_sizes) or [output.numel() // n] * n
        start = sum(sent[:me])
        own = input.reshape(-1)[start : start + sent[me]]
        out, pos = output.view(-1), 0
        for size in received:
            block = out[pos : pos + size]
            block.copy_(own) if size == own.numel() else block.zero_()
            pos += size
        return _done([output])

    def allreduce(self, tensors: list[torch.Tensor], opts: Any) -> dist.Work:  # type: ignore[override]
        return _done(tensors)

    def allreduce_coalesced(self, tensors: list[torch.Tensor], opts: Any) -> dist.Work:  # type: ignore[override]
        return _done(tensors)

    def allgather(  # type: ignore[override]
        self, outputs: list[list[torch.Tensor]], inputs: list[torch.Tensor], opts: Any
    ) -> dist.Work:
        for out in outputs[0]:
            out.copy_(inputs[0])
        return _done(outputs)

    def broadcast(self, tensors: list[torch.Tensor], opts: Any) -> dist.Work:  # type: ignore[override]
        return _done(tensors)

    def barrier(self, opts: Any) -> dist.Work:  # type: ignore[override]
        return _done()

    def reduce_scatter(  # type: ignore[override]
        self, outputs: list[torch.Tensor], inputs: list[list[torch.Tensor]], opts: Any
    ) -> dist.Work:
        outputs[0].copy_(inputs[0][self.rank()])
        return _done(outputs)


def _create_mirror(common_opts: Any, backend_opts: Any) -> MirrorProcessGroup:
    return MirrorProcessGroup(common_opts.group_rank, common_opts.group_size)


def _register_mirror() -> None:
    if not hasattr(dist.Backend, MIRROR_BACKEND.upper()):
        dist.Backend.register_backend(
            MIRROR_BACKEND, _create_mirror, extended_api=True, devices=["cpu"]
        )


@contextmanager
def _world(backend: str, *, rank: int, world_size: int, local_world_size: int) -> Iterator[None]:
    """A default process group of ``backend`` (``"fake"`` or the mirror) as rank ``rank`` of
    ``world_size``, with torchrun's variables set as TorchRec reads them; both undone on exit."""
    if dist.is_initialized():
        raise RuntimeError(
            f"dry_run needs a process without a process group, but one is initialized "
            f"(backend {dist.get_backend()!r}, world size {dist.get_world_size()}); run it "
            "outside a distributed job"
        )
    if backend == MIRROR_BACKEND:
        _register_mirror()
    env = {
        "RANK": str(rank),
        "WORLD_SIZE": str(world_size),
        "LOCAL_RANK": str(rank % local_world_size),
        "LOCAL_WORLD_SIZE": str(local_world_size),
    }
    saved = {k: os.environ.get(k) for k in env}
    os.environ.update(env)
    try:
        dist.init_process_group(backend, store=FakeStore(), rank=rank, world_size=world_size)
        yield
    finally:
        if dist.is_initialized():
            dist.destroy_process_group()
        for k, v in saved.items():
            if v is None:
                os.environ.pop(k, None)
            else:
                os.environ[k] = v


# ---- the report --------------------------------------------------------------------------------


@dataclass
class DryRunReport:
    """What :func:`dry_run` built and ran for one rank.

    Phase 1 (full size, meta tables): ``num_tables`` ... ``local_shards``. Phase 2 (cut tables,
    real CPU tensors): ``batch_size`` ... ``dense_grads``.
    """

    mode: str  # "flat", "sptt" or "dmt"
    world_size: int  # G
    local_world_size: int  # L
    rank: int  # the rank built
    num_tables: int  # tables of the model (one per sparse feature)
    planned_tables: int  # tables the full-size plan places (must equal num_tables)
    sharding_types: dict[str, int]  # full-size plan: tables per sharding type
    local_shards: list[tuple[str, int, int]]  # full-size (table, rows, cols) of this rank's shards
    local_table_gb: float  # fp32 GB of those shards
    num_towers: int | None = None  # T (SPTT/DMT)
    hosts_per_tower: int | None = None  # K (SPTT/DMT)
    tower_group_size: int | None = None  # ranks of the tower group the module holds (K L)
    peer_group_size: int | None = None  # ranks of the peer group the module holds (T)
    max_rows: int = 0  # phase 2: rows of every table at most
    batch_size: int = 0  # phase 2: local batch B
    logits_shape: tuple[int, ...] = ()  # (B,)
    loss_shape: tuple[int, ...] = ()  # () (a scalar)
    pooled_shape: tuple[int, ...] = ()  # flat: the output all-to-all's (B, F, N)
    tower_output_shapes: list[tuple[int, ...]] = field(
        default_factory=list
    )  # step f, T x (B, V_t, D_t)
    dense_grads: int = 0  # dense parameters with a gradient of their own shape after backward
    phase_2_skipped: str | None = None  # why phase 2 did not run (row-wise shards), or None
    # flat: tables built with another sharding type than the plan checked gives them (one the
    # CPU cannot build, e.g. table_row_wise), as "planned -> built"
    substituted: dict[str, str] = field(default_factory=dict)
    on_meta: list[str] = field(default_factory=list)  # what ran on meta
    on_cpu: list[str] = field(default_factory=list)  # what ran on real CPU tensors
    seconds: float = 0.0  # wall time of both phases
    max_rss_gb: float = 0.0  # the process's peak resident memory after the run (GB: 1e9 bytes)

    def to_dict(self) -> dict[str, Any]:
        """JSON-ready (tuples as lists)."""
        return dataclasses.asdict(self)


# ---- building ------------------------------------------------------------------------------------


def _check_mode(conf: Config, mode: str) -> None:
    if mode not in MODES:
        raise ValueError(f"dry_run mode={mode!r} is not one of {list(MODES)}")
    towers = conf.model.partition.kind != "none"
    if mode == "flat" and towers:
        raise ValueError(
            f"mode='flat' dry-runs the base model, but model.partition.kind="
            f"{conf.model.partition.kind!r} builds a DMT model; pass the base experiment "
            "(e.g. experiment=paper_dlrm for paper_dmt_8t_dlrm)"
        )
    if mode != "flat" and not towers:
        raise ValueError(
            f"mode={mode!r} needs a DMT model (model.partition.kind != 'none', e.g. "
            "experiment=paper_sptt_dlrm or paper_dmt_8t_dlrm)"
        )


def _build(conf: Config, *, max_rows: int | None) -> nn.Module:
    """The plain model, tables on meta (cut to ``max_rows`` rows), dense on CPU."""
    names, cards, num_dense = schema(conf)
    rows = list(conf.model.num_embeddings_per_feature or cards)
    if max_rows is not None:
        rows = [min(r, max_rows) for r in rows]
    model_cfg = dataclasses.replace(conf.model, num_embeddings_per_feature=rows)
    return build_model(
        model_cfg,
        feature_names=names,
        cardinalities=rows,
        num_dense=num_dense,
        table_device="meta",
        dense_device="cpu",
    )


def _tables(module: nn.Module) -> list[tuple[str, int, int]]:
    return [
        (t.name, t.num_embeddings, t.embedding_dim)
        for m in module.modules()
        if isinstance(m, EmbeddingBagCollection)
        for t in m.embedding_bag_configs()
    ]


def _topology(conf: Config, world_size: int, local_world_size: int) -> Topology:
    return Topology(
        world_size=world_size,
        local_world_size=local_world_size,
        hosts_per_tower=conf.sptt.hosts_per_tower,
    )


def _flat_plan(
    conf: Config,
    task: nn.Module,
    *,
    world_size: int,
    local_world_size: int,
    pinned: ShardingPlan | None = None,
    sharding_types: Mapping[str, str] | None = None,
) -> ShardingPlan:
    """TorchRec's plan as ``shard_model`` makes it, or (``pinned``) with every table's sharding
    type and kernel fixed to those of ``pinned``, or (``sharding_types``, by table name) with
    the sharding types fixed (the kernels are the CPU's)."""
    memory = memory_budget(conf.sharding, "cpu")
    if pinned is None and sharding_types is None:
        return plan_tables(
            task,
            memory,
            world_size=world_size,
            local_world_size=local_world_size,
            batch_size=conf.data.batch_size,
            comm_precision=conf.sptt.comm_precision,
        )
    if pinned is not None:
        chosen = table_shardings(pinned)
        constraints = {
            name: dataclasses.replace(
                c,
                sharding_types=[chosen[name].sharding_type],
                compute_kernels=[chosen[name].compute_kernel],
            )
            for name, c in table_constraints(task, memory).items()
        }
    else:  # the CPU builds fewer sharding types than CUDA: the others are the planner's choice
        assert sharding_types is not None
        buildable = set(EmbeddingBagCollectionSharder().sharding_types("cpu"))
        constraints = {
            name: dataclasses.replace(c, sharding_types=[sharding_types[name]])
            if sharding_types.get(name) in buildable
            else c
            for name, c in table_constraints(task, memory).items()
        }
    planner = flat_planner(
        memory,
        world_size=world_size,
        local_world_size=local_world_size,
        batch_size=max(conf.data.batch_size // world_size, 1),
        constraints=constraints,
    )
    return planner.plan(task, flat_sharders(conf.sptt.comm_precision))


def _plan_summary(
    plan: ShardingPlan, rank: int
) -> tuple[int, dict[str, int], list[tuple[str, int, int]]]:
    types: dict[str, int] = {}
    local: list[tuple[str, int, int]] = []
    planned = 0
    for plans in plan.plan.values():
        for name, ps in plans.items():
            planned += 1
            types[ps.sharding_type] = types.get(ps.sharding_type, 0) + 1
            for shard in ps.sharding_spec.shards if ps.sharding_spec else []:
                if shard.placement is not None and shard.placement.rank() == rank:
                    local.append((name, *shard.shard_sizes))
    return planned, types, local


def _gb(shards: list[tuple[str, int, int]]) -> float:
    return sum(r * c for _, r, c in shards) * 4 / 1e9


def _batch(conf: Config, names: list[str], rows: list[int], num_dense: int, B: int) -> Batch:
    """``B`` samples with ``multi_hot`` ids per bag, id ``s mod rows`` for sample ``s``."""
    hot = conf.data.synthetic.multi_hot if conf.data.kind == "synthetic" else 1
    ids = [torch.arange(B * hot) % r for r in rows]
    return Batch(
        dense_features=torch.randn(B, num_dense),
        sparse_features=KeyedJaggedTensor(
            keys=names,
            values=torch.cat(ids),
            lengths=torch.full((len(names) * B,), hot, dtype=torch.int32),
            stride=B,
        ),
        labels=torch.randint(0, 2, (B,)).float(),
    )


def _step(task: nn.Module, optimizer: Any, batch: Batch) -> tuple[torch.Tensor, torch.Tensor]:
    optimizer.zero_grad()
    loss, logits = task(batch)
    loss.backward()
    optimizer.step()
    return loss, logits


def _dense_grads(module: nn.Module) -> int:
    return sum(
        1
        for p in module.parameters()
        if p.requires_grad and p.grad is not None and p.grad.shape == p.shape
    )


def dry_run(
    conf: Config,
    *,
    world_size: int,
    local_world_size: int,
    mode: str,
    rank: int = 0,
    batch_size: int = 2,
    max_rows: int = 1000,
    flat_sharding_types: Mapping[str, str] | None = None,
) -> DryRunReport:
    """Build rank ``rank``'s sharded modules of a ``world_size``-rank job and train one step.

    Args:
        conf: the typed config (``dmt.train.to_config``): model, data schema, optimizers,
            ``sptt.hosts_per_tower`` (K), ``sptt.sharding_type``, ``sharding.*``.
        world_size: ``G``; local_world_size: ``L`` ranks per host.
        mode: ``"flat"`` (TorchRec ``DistributedModelParallel`` of a base model), ``"sptt"``
            (``ShardedDMT`` of a DMT model with pass-through towers) or ``"dmt"`` (with tower
            modules).
        rank: the rank to build (flat: 0 only, see the module doc).
        batch_size: local batch ``B`` of the step in phase 2.
        max_rows: rows of every table at most in phase 2 (at least ``world_size``).
        flat_sharding_types: flat mode: each table's sharding type (by table name) in the plan
            being checked, e.g. ``dmt-plan``'s for the GPU cluster; phase 1 builds those (on
            the CPU's kernels: UVM caching needs CUDA). ``None``: TorchRec's CPU plan.

    Raises:
        ValueError: a mode the config does not fit, a topology that does not divide
            (``G`` not a multiple of ``K L``, towers not ``G / (K L)``), no plan in memory.
        RuntimeError: a process group is already initialized.
    """
    _check_mode(conf, mode)
    if not 0 <= rank < world_size:
        raise ValueError(f"rank={rank} is not in [0, world_size={world_size})")
    if world_size % local_world_size:
        raise ValueError(
            f"world_size={world_size} is not a multiple of local_world_size={local_world_size}"
        )
    if batch_size < 1:
        raise ValueError(f"batch_size={batch_size} must be at least 1")
    start = time.perf_counter()
    check_sparse_optimizer(conf.optim, "cpu")
    world = {"rank": rank, "world_size": world_size, "local_world_size": local_world_size}
    cut = max(max_rows, world_size)
    if mode == "flat":
        if rank != 0:
            raise ValueError(
                f"the flat model dry-runs as rank 0 only (TorchRec broadcasts its settings from "
                f"rank 0), got rank={rank}"
            )
        report = _dry_run_flat(conf, world, cut, batch_size, flat_sharding_types)
    else:
        report = _dry_run_sptt(conf, world, cut, batch_size, mode)
    report.seconds = time.perf_counter() - start
    # ru_maxrss is in KiB (Linux); GB as local_table_gb's, 1e9 bytes
    report.max_rss_gb = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * 1024 / 1e9
    return report


def _without_phase_2(report: DryRunReport, why: str) -> DryRunReport:
    """``report`` of phase 1 only: phase 2 cannot run (``why``), which is this tool's limit,
    not the plan's failure."""
    log.warning("dry run of %s: %s; phase 1 built its sharded modules", report.mode, why)
    report.phase_2_skipped = why
    report.on_cpu = [c for c in report.on_cpu if not c.startswith("phase 2")]
    return report


def _dry_run_flat(
    conf: Config,
    world: dict[str, int],
    cut: int,
    B: int,
    sharding_types: Mapping[str, str] | None,
) -> DryRunReport:
    G, L = world["world_size"], world["local_world_size"]
    # phase 1: the full-size plan and the sharded modules on meta
    with _world("fake", **world):
        plain = _build(conf, max_rows=None)
        num_tables = len(_tables(plain))
        apply_sparse_optimizer(embedding_parameters(plain), conf.optim)
        task = _task(plain)
        full_plan = _flat_plan(
            conf, task, world_size=G, local_world_size=L, sharding_types=sharding_types
        )
        DistributedModelParallel(
            task,
            device=torch.device("meta"),
            plan=full_plan,
            sharders=flat_sharders(conf.sptt.comm_precision),
            init_data_parallel=False,
            init_parameters=False,
        )
    planned, types, local = _plan_summary(full_plan, world["rank"])
    built = table_shardings(full_plan)
    substituted = {
        name: f"{kind} -> {built[name].sharding_type}"
        for name, kind in (sharding_types or {}).items()
        if name in built and built[name].sharding_type != kind
    }
    if substituted:
        log.warning(
            "dry run of flat: %d tables are built with another sharding type than the plan "
            "gives them, which the CPU cannot build (%s); the rest as planned",
            len(substituted),
            ", ".join(f"{n}: {k}" for n, k in list(substituted.items())[:3]),
        )
    report = DryRunReport(
        mode="flat",
        rank=world["rank"],
        world_size=world["world_size"],
        local_world_size=world["local_world_size"],
        num_tables=num_tables,
        planned_tables=planned,
        sharding_types=types,
        local_shards=local,
        local_table_gb=_gb(local),
        substituted=substituted,
        on_meta=["phase 1: the full-size tables of this rank's ShardedEmbeddingBagCollection"],
        on_cpu=[
            "phase 1: dense modules",
            "phase 2: tables cut to max_rows, input/output all-to-alls, lookup (FBGEMM TBE), "
            "dense forward/backward, fused and dense optimizer step",
        ],
    )
    if _ROW_WISE & set(types):
        return _without_phase_2(
            report,
            f"phase 2 cannot run row-wise shards ({sorted(_ROW_WISE & set(types))} in the plan): "
            "reduce_scatter_tensor does not reach a Python process group in torch 2.13",
        )
    # phase 2: one step on cut tables, same sharding types
    with _world(MIRROR_BACKEND, **world):
        plain = _build(conf, max_rows=cut)
        apply_sparse_optimizer(embedding_parameters(plain), conf.optim)
        rows = [r for _, r, _ in _tables(plain)]
        task = _task(plain)
        plan = _flat_plan(conf, task, world_size=G, local_world_size=L, pinned=full_plan)
        dmp = DistributedModelParallel(
            task,
            device=torch.device("cpu"),
            plan=plan,
            sharders=flat_sharders(conf.sptt.comm_precision),
            # the dense part as shard_model wraps it (TorchRec's default warned of the DDP
            # argument it passes: "`broadcast_buffers` is deprecated")
            data_parallel_wrapper=data_parallel_wrapper(G),
        )
        optimizer = build_optimizer(dmp, conf.optim)
        names, _, num_dense = schema(conf)
        batch = _batch(conf, names, rows, num_dense, B)
        loss, logits = _step(dmp, optimizer, batch)
        report.dense_grads = _dense_grads(dmp)
        with torch.no_grad():
            pooled = dmp.module.model.pooled_embeddings(batch.sparse_features)
    report.max_rows, report.batch_size = cut, B
    report.logits_shape, report.loss_shape = tuple(logits.shape), tuple(loss.shape)
    report.pooled_shape = tuple(pooled.shape)
    return report


def _dry_run_sptt(conf: Config, world: dict[str, int], cut: int, B: int, mode: str) -> DryRunReport:
    G, L, rank = world["world_size"], world["local_world_size"], world["rank"]
    topology = _topology(conf, G, L)
    device = torch.device("meta")

    def shard(plain: nn.Module, device: torch.device) -> tuple[ShardedDMT, Any, Any]:
        runtime = Runtime(
            rank=rank,
            world_size=G,
            local_rank=rank % L,
            local_world_size=L,
            device=device,
            backend=dist.get_backend(),
        )
        groups = create_process_groups(topology)
        task, optimizer = shard_dmt(
            _task(plain),
            runtime,
            topology=topology,
            optim_cfg=conf.optim,
            groups=groups,
            sharding_type=conf.sptt.sharding_type,
            peer_permute=conf.sptt.peer_permute,
            comm_precision=conf.sptt.comm_precision,
            memory=memory_budget(conf.sharding, "cpu"),
            even_batches=True,
        )
        sharded = task.model
        assert isinstance(sharded, ShardedDMT)
        return sharded, (task, optimizer), groups

    with _world("fake", **world):
        plain = _build(conf, max_rows=None)
        assert isinstance(plain, DMTModel)
        passthrough = not any(
            p.requires_grad
            for t in plain.towers
            if t.tower_module
            for p in t.tower_module.parameters()
        )
        if passthrough != (mode == "sptt"):
            raise ValueError(
                f"mode={mode!r}, but the model's towers are "
                f"{'pass-through' if passthrough else 'tower modules'}; 'sptt' needs "
                "tower=passthrough, 'dmt' tower modules"
            )
        sharded, _, groups = shard(plain, device)
        plan = sharded.dataflow.plan
        local = [(f"t_{s.feature}", s.num_rows, s.num_cols) for s in plan.rank_shards(rank)]
        planned = len({s.feature for r in range(G) for s in plan.rank_shards(r)})
        report = DryRunReport(
            mode=mode,
            rank=rank,
            world_size=G,
            local_world_size=L,
            num_tables=len(_tables(plain)),
            planned_tables=planned,
            sharding_types={conf.sptt.sharding_type: len(_tables(plain))},
            local_shards=local,
            local_table_gb=_gb(local),
            num_towers=sharded.topology.num_towers,
            hosts_per_tower=sharded.topology.hosts_per_tower,
            tower_group_size=dist.get_world_size(groups.tower),
            peer_group_size=dist.get_world_size(groups.peer),
            on_meta=["phase 1: the full-size table shards of this rank (SPTT dataflow)"],
            on_cpu=[
                "phase 1: dense modules and tower modules",
                "phase 2: tables cut to max_rows, steps a-f, lookup (FBGEMM TBE), tower "
                "module, dense forward/backward, fused and dense optimizer step",
            ],
        )
    if conf.sptt.sharding_type == "row_wise":
        return _without_phase_2(
            report,
            "phase 2 cannot run sptt.sharding_type=row_wise: step d's reduce_scatter_tensor "
            "does not reach a Python process group in torch 2.13",
        )
    with _world(MIRROR_BACKEND, **world):
        plain = _build(conf, max_rows=cut)
        rows = [r for _, r, _ in _tables(plain)]
        sharded, (task, optimizer), _ = shard(plain, torch.device("cpu"))
        names, _, num_dense = schema(conf)
        batch = _batch(conf, names, rows, num_dense, B)
        loss, logits = _step(task, optimizer, batch)
        report.dense_grads = _dense_grads(sharded.dense_arch) + (
            _dense_grads(sharded.tower_module) if sharded.tower_module is not None else 0
        )
        with torch.no_grad():
            outputs = sharded.tower_outputs(batch.sparse_features)
    report.max_rows, report.batch_size = cut, B
    report.logits_shape, report.loss_shape = tuple(logits.shape), tuple(loss.shape)
    report.tower_output_shapes = [tuple(o.shape) for o in outputs]
    return report


def _task(plain: nn.Module) -> nn.Module:
    from dmt.trainer import TrainTask  # noqa: PLC0415 - the trainer imports the data stack

    return TrainTask(plain)
