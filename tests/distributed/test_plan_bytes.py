"""The planner's bytes (:mod:`dmt.planning.collectives`) equal what the real gloo dataflow sends.

One spawned world per ``G`` in (2, 4, 8); inside it, several topologies (``L``, ``K``), pass-through
and DMT (DLRM tower modules) towers, table-, column- and row-wise tables, batch sizes and comm
precisions. Each rank compares the planner's bytes of its own collectives, given its real ids
(per feature and per row block), with what :class:`CommStats` recorded during one training step:
steps a, d, f and the tower-module and dense all-reduces, total and cross-host, byte for byte.
The busiest-rank summary (:func:`sptt_collectives`) is checked against the per-rank maxima when
every rank's batch has the same id counts. Flat TorchRec sharding (DMP at G = 4 and 8, two ranks
per host; the planner's plan and one with table-, column-, row- and table-row-wise tables) is
compared with :class:`CommTrace`'s measurement of every collective, by op. The dense state
the plan's memory counts on a rank (:func:`sptt_rank_memory`) is what the rank holds after a step.
"""

from __future__ import annotations

import os
from dataclasses import replace
from typing import cast

import pytest
import torch
import torch.distributed as dist
from torch.nn.parallel import DistributedDataParallel
from torchrec.datasets.utils import Batch
from torchrec.distributed.model_parallel import DistributedModelParallel, get_default_sharders
from torchrec.distributed.sharding_plan import (
    column_wise,
    construct_module_sharding_plan,
    row_wise,
    table_row_wise,
    table_wise,
)
from torchrec.distributed.types import ShardingPlan
from torchrec.modules.embedding_modules import EmbeddingBagCollection
from torchrec.optim.keyed import KeyedOptimizer
from torchrec.sparse.jagged_tensor import KeyedJaggedTensor

from dmt.config import OptimConfig, ShardingConfig
from dmt.models import embedding_parameters
from dmt.optim import apply_sparse_optimizer, build_optimizer
from dmt.planning.collectives import (
    CollectiveBytes,
    FlatTable,
    Workload,
    busiest,
    flat_rank_collectives,
    flat_tables,
    sptt_collectives,
    sptt_rank_collectives,
)
from dmt.planning.memory import dense_optimizer_states, sptt_rank_memory
from dmt.runtime import Runtime
from dmt.sharding import memory_budget, plan_tables
from dmt.sptt.comm_stats import CommStats
from dmt.sptt.comm_trace import CommTrace, TracedCall
from dmt.sptt.dmt_sharding import ShardedDMT, shard_dmt
from dmt.sptt.plan import SPTTPlan
from dmt.sptt.process_groups import SPTTProcessGroups, create_process_groups
from dmt.sptt.topology import Topology
from dmt.trainer import TrainTask
from tests.distributed.distributed_harness import run_on_ranks
from tests.distributed.small_dmt import NAMES, ROWS, F, small_dmt_model

OPTIM = OptimConfig(
    sparse_lr=0.05,
    lr=0.01,
    sparse={"_target_": "torch.optim.SGD", "_partial_": True, "lr": "${..sparse_lr}"},
    dense={"_target_": "torch.optim.SGD", "_partial_": True, "lr": "${..lr}"},
)
# cat_0 row-wise (reduce-scatter in step d), cat_1 column-wise, the rest table-wise
SHARDING = {"cat_0": "row_wise", "cat_1": "column_wise"}
# (L, K) per world size; T = G / (K L)
TOPOLOGIES = {2: [(1, 1), (1, 2)], 4: [(2, 1), (1, 2)], 8: [(2, 1), (2, 2)]}
STEP_NAMES = {"tm": "tower_allreduce", "dense": "dense_allreduce"}


def _batch(rank: int, step: int, B: int, *, same_counts: bool = False) -> Batch:
    """A multi-hot batch as dmt's loaders give it (int32 lengths, int64 ids). With
    ``same_counts`` every rank gets the same lengths and ids (so the same bytes)."""
    gen = torch.Generator().manual_seed(step if same_counts else 100 * rank + step)
    lengths = torch.randint(0, 4, (F * B,), generator=gen, dtype=torch.int32)
    return Batch(
        dense_features=torch.randn(B, 3, generator=gen),
        sparse_features=KeyedJaggedTensor.from_lengths_sync(
            keys=NAMES,
            values=torch.randint(0, ROWS, (int(lengths.sum()),), generator=gen),
            lengths=lengths,
        ),
        labels=torch.randint(0, 2, (B,), generator=gen).float(),
    )


def _workload(plan: SPTTPlan, kjt: KeyedJaggedTensor, comm_size: int) -> Workload:
    """The real ids of ``kjt``: per feature and, for row-wise features, per row block."""
    jagged = kjt.to_dict()
    blocks = {}
    for f, name in enumerate(plan.feature_names):
        if plan.is_row_wise(f):
            ids = jagged[name].values()
            blocks[name] = [
                int(((ids >= s.row_start) & (ids < s.row_stop)).sum())
                for s in plan.feature_shards(f)
            ]
    return Workload(
        kjt.stride(),
        tuple(int(jagged[name].values().numel()) for name in plan.feature_names),
        length_size=kjt.lengths().element_size(),
        id_size=kjt.values().element_size(),
        row_block_ids=blocks,
        comm_size=comm_size,
    )


def _param_bytes(module: torch.nn.Module | None) -> int:
    if module is None:
        return 0
    return sum(p.numel() * p.element_size() for p in module.parameters() if p.requires_grad)


def _by_key(planned: list[CollectiveBytes]) -> dict[tuple[str, str, str], tuple[int, int]]:
    """Planned bytes summed like CommStats' counters: ``{(step, group, direction): (sent, cross)}``."""
    out: dict[tuple[str, str, str], tuple[int, int]] = {}
    for c in planned:
        sent, cross = out.get((c.step, c.group, c.direction), (0, 0))
        out[(c.step, c.group, c.direction)] = (sent + c.total_bytes, cross + c.cross_host_bytes)
    return {k: v for k, v in out.items() if v != (0, 0)}


def _measured(stats: CommStats) -> dict[tuple[str, str, str], tuple[int, int]]:
    return {
        (STEP_NAMES.get(step, step), group, direction): (c.bytes_sent, c.bytes_cross_host)
        for (step, group, direction), c in stats.counters.items()
        if step != "c" and (c.bytes_sent, c.bytes_cross_host) != (0, 0)
    }


def _case(
    rank: int,
    world_size: int,
    topo: Topology,
    groups: SPTTProcessGroups,
    tower: str,
    precision: str,
) -> int:
    """Train a few steps of one case; return how many (rank, step) comparisons were made."""
    runtime = Runtime(rank, world_size, rank % topo.local_world_size, topo.local_world_size,
                      torch.device("cpu"), "gloo")  # fmt: skip
    model = small_dmt_model(topo.num_towers, tower)
    towers = list(cast(torch.nn.ModuleList, model.towers))
    tower_bytes = [_param_bytes(cast(torch.nn.Module | None, t.tower_module)) for t in towers]
    dense_bytes = _param_bytes(model) - sum(_param_bytes(t) for t in towers)
    stats = CommStats(topo, rank)
    task, optimizer = shard_dmt(
        TrainTask(model),
        runtime,
        topology=topo,
        optim_cfg=OPTIM,
        groups=groups,
        stats=stats,
        sharding_type=SHARDING,
        comm_precision=precision,
        even_batches=True,
    )
    sharded = task.model
    assert isinstance(sharded, ShardedDMT)
    dataflow = sharded.dataflow
    plan = dataflow.plan
    comm_size = 4 if precision == "fp32" else 2
    compared = 0
    # two warm-up steps (DDP's first steps sync more than gradients), then measured ones
    for step, (B, same) in enumerate([(4, False), (4, False), (3, False), (8, True), (5, False)]):
        batch = _batch(rank, step, B, same_counts=same)
        stats.reset()
        trace = CommTrace(CommStats(topo, rank))  # what the collectives really carry
        with trace:
            optimizer.zero_grad()
            loss, _ = task(batch)
            loss.backward()
            optimizer.step()
        if step < 2:
            continue
        assert not trace.unaccounted
        workload = _workload(plan, batch.sparse_features, comm_size)
        kwargs = dict(
            tower_output_dims=dataflow.tower_output_dims,
            tower_param_bytes=tower_bytes,
            dense_param_bytes=dense_bytes,
        )
        planned = sptt_rank_collectives(plan, rank, workload, **kwargs)  # type: ignore[arg-type]
        assert _by_key(planned) == _measured(stats), (topo, tower, precision, step)
        # CommStats' step a is counted by the planner's own formula; the trace is not
        traced, by_op = _traced(trace.calls, rank, topo), _planned_by_op(planned)
        assert traced == by_op, (topo, tower, precision, step, traced, by_op)
        assert _by_key(planned)[("a", "world", "forward")][0] > 0
        if same:  # every rank sent what its collectives say: the summary is their maximum
            everyone: list[list[CollectiveBytes] | None] = [None] * world_size
            dist.all_gather_object(everyone, planned)
            summary = sptt_collectives(plan, workload, **kwargs)  # type: ignore[arg-type]
            sent = [  # the summary's sender side; its receiver side: test_plan_timing.py
                replace(c, received_intra_host_bytes=0, received_cross_host_bytes=0)
                for c in summary
            ]
            assert sent == busiest([e for e in everyone if e is not None])
        compared += 1
    return compared


def _worker(rank: int, world_size: int) -> int:
    compared = 0
    for L, K in TOPOLOGIES[world_size]:
        topo = Topology(world_size, L, K)
        groups = create_process_groups(topo)
        for tower, precision in (("passthrough", "fp32"), ("dlrm", "fp32"), ("dlrm", "bf16")):
            if precision == "bf16" and world_size != 4:
                continue
            compared += _case(rank, world_size, topo, groups, tower, precision)
    return compared


def test_plan_bytes_equal_measured_g2() -> None:
    assert run_on_ranks(_worker, 2, timeout_s=120) == [12, 12]


def test_plan_bytes_equal_measured_g4() -> None:
    assert run_on_ranks(_worker, 4, timeout_s=120) == [18] * 4


def test_plan_bytes_equal_measured_g8() -> None:
    assert run_on_ranks(_worker, 8, timeout_s=180) == [12] * 8


# ---- flat TorchRec sharding, measured by CommTrace --------------------------------------------

TRACED_OPS = {
    "alltoall_base_": "all_to_all",
    "_reduce_scatter_base_": "reduce_scatter",
    "reduce_scatter_tensor_coalesced_": "reduce_scatter",
    "_allgather_base_": "all_gather",
    "allgather_into_tensor_coalesced_": "all_gather",
    "allreduce_": "all_reduce",
}


def _hand_plan(model: torch.nn.Module, world_size: int) -> ShardingPlan:
    """Table-, column-, row- and table-row-wise tables on ``world_size`` ranks, 2 per host."""
    path = "model.towers.0.embedding_bag_collection"
    ebc = cast(EmbeddingBagCollection, model.get_submodule(path.removeprefix("model.")))
    per_table = {
        "t_cat_0": table_wise(rank=1),
        "t_cat_1": column_wise(ranks=[0, 3]),
        "t_cat_2": row_wise(),
        "t_cat_3": table_row_wise(host_index=1),
        "t_cat_4": table_wise(rank=2),
        "t_cat_5": table_row_wise(host_index=0),
    }
    module_plan = construct_module_sharding_plan(
        ebc, per_table, local_size=2, world_size=world_size, device_type="cpu"
    )
    for sharding in module_plan.values():
        sharding.compute_kernel = "fused"  # as the planner's: the sparse optimizer is fused
    return ShardingPlan({path: module_plan})


def _traced(calls: list[TracedCall], rank: int, hosts: Topology) -> dict[str, tuple[int, int]]:
    """CommTrace's calls as ``{op: (sent, cross-host)}``, without TorchRec's exchange of the
    KJT split sizes (equal splits of integers)."""
    out: dict[str, tuple[int, int]] = {}
    for call in calls:
        if call.op == "alltoall_base_" and not call.split_sizes:
            assert not call.dtype.is_floating_point
            continue
        assert call.op in TRACED_OPS, (call, [c.op for c in calls])
        op = TRACED_OPS[call.op]
        sent, cross = out.get(op, (0, 0))
        for dst, nbytes in zip(call.ranks, call.bytes_per_rank):
            if dst != rank:
                sent += nbytes
                cross += nbytes if hosts.crosses_host(rank, dst) else 0
        out[op] = (sent, cross)
    return {k: v for k, v in out.items() if v != (0, 0)}


def _planned_by_op(planned: list[CollectiveBytes]) -> dict[str, tuple[int, int]]:
    out: dict[str, tuple[int, int]] = {}
    for c in planned:
        sent, cross = out.get(c.op, (0, 0))
        out[c.op] = (sent + c.total_bytes, cross + c.cross_host_bytes)
    return {k: v for k, v in out.items() if v != (0, 0)}


def _flat_workload(tables: list[FlatTable], kjt: KeyedJaggedTensor) -> Workload:
    jagged = kjt.to_dict()
    blocks = {}
    for t in tables:
        if t.sharding_type in ("row_wise", "table_row_wise"):
            ids = jagged[t.feature_name].values()
            blocks[t.feature_name] = [
                int(((ids >= s.row_start) & (ids < s.row_stop)).sum()) for s in t.shards
            ]
    return Workload(
        kjt.stride(),
        tuple(int(jagged[name].values().numel()) for name in NAMES),
        length_size=kjt.lengths().element_size(),
        id_size=kjt.values().element_size(),
        row_block_ids=blocks,
    )


def _flat_worker(rank: int, world_size: int) -> list[str]:
    hosts = Topology(world_size, 2)
    # TorchRec's sharding env reads the host size from torchrun's variables (table-row-wise
    # sharding builds its intra- and cross-host groups from them)
    os.environ.update(LOCAL_WORLD_SIZE="2", LOCAL_RANK=str(rank % 2))
    kinds = []
    for how in ("planner", "hand"):
        model = small_dmt_model(1, "passthrough")
        dense_bytes = _param_bytes(model) - sum(
            _param_bytes(t) for t in cast(torch.nn.ModuleList, model.towers)
        )
        apply_sparse_optimizer(embedding_parameters(model), OPTIM)
        task = TrainTask(model)
        plan = (
            plan_tables(
                task,
                memory_budget(ShardingConfig(), "cpu"),
                world_size=world_size,
                local_world_size=2,
                batch_size=4 * world_size,
            )
            if how == "planner"
            else _hand_plan(model, world_size)
        )
        tables = flat_tables(plan, task, NAMES)  # before DMP shards the task in place
        dmp = DistributedModelParallel(
            task, device=torch.device("cpu"), plan=plan, sharders=get_default_sharders()
        )
        kinds += [t.sharding_type for t in tables]
        optimizer = build_optimizer(dmp, OPTIM)
        for step, B in enumerate([4, 4, 4, 3, 6]):
            batch = _batch(rank, step, B)
            trace = CommTrace(CommStats(hosts, rank))
            with trace:
                optimizer.zero_grad()
                loss, _ = dmp(batch)
                loss.backward()
                optimizer.step()
            if step < 3:  # DDP's first steps sync more than gradients
                continue
            assert not trace.unaccounted
            workload = _flat_workload(tables, batch.sparse_features)
            planned = flat_rank_collectives(
                tables, hosts, rank, workload, dense_param_bytes=dense_bytes
            )
            assert _planned_by_op(planned) == _traced(trace.calls, rank, hosts), (how, step)
    return sorted(set(kinds))


# CI time (2 cores): 8 ranks (13-18 s) run with -m slow
@pytest.mark.parametrize("world_size", [4, pytest.param(8, marks=pytest.mark.slow)])
def test_flat_plan_bytes_equal_traced(world_size: int) -> None:
    """The planner's flat bytes equal CommTrace's measurement of TorchRec's DMP on hosts of two
    ranks, for TorchRec's planner's plan (on CPU: table-column-wise or table-wise, as its cost
    model decides) and a plan with table-, column-, row- and table-row-wise tables."""
    kinds = run_on_ranks(_flat_worker, world_size, timeout_s=180)
    assert {"table_wise", "column_wise", "row_wise", "table_row_wise"} <= set(kinds[0])


# ---- memory: the dense state a rank holds -----------------------------------------------------

ADAM = OptimConfig(
    sparse_lr=0.05,
    lr=0.01,
    sparse={"_target_": "torch.optim.SGD", "_partial_": True, "lr": "${..sparse_lr}"},
    dense={"_target_": "torch.optim.Adam", "_partial_": True, "lr": "${..lr}"},
)


def _held_dense_bytes(
    module: torch.nn.Module, params: list[torch.nn.Parameter], optimizer: KeyedOptimizer
) -> int:
    """What a rank holds for ``params`` after a step: the parameters, their gradients, the
    optimizer's state tensors and DDP's gradient buckets unless they are the gradients."""
    held = sum(
        t.numel() * t.element_size()
        for p in params
        for t in (p, p.grad, *optimizer.state.get(p, {}).values())
        if isinstance(t, torch.Tensor) and t.dim() > 0
    )
    for m in module.modules():
        if isinstance(m, DistributedDataParallel):
            logged = m._get_ddp_logging_data()  # DDP's own record of its buckets
            if not logged["gradient_as_bucket_view"]:
                held += sum(int(n) for n in str(logged["bucket_sizes"]).split(","))
    return held


def _dense_memory_worker(rank: int, world_size: int) -> list[tuple[int, int]]:
    out = []
    for L, K in TOPOLOGIES[world_size]:
        topo = Topology(world_size, L, K)
        runtime = Runtime(rank, world_size, rank % L, L, torch.device("cpu"), "gloo")
        model = small_dmt_model(topo.num_towers, "dlrm")
        towers = list(cast(torch.nn.ModuleList, model.towers))
        tower_bytes = [_param_bytes(cast(torch.nn.Module | None, t.tower_module)) for t in towers]
        dense_bytes = _param_bytes(model) - sum(_param_bytes(t) for t in towers)
        task, optimizer = shard_dmt(
            TrainTask(model), runtime, topology=topo, optim_cfg=ADAM, even_batches=True
        )
        for step in range(2):
            optimizer.zero_grad()
            loss, _ = task(_batch(rank, step, 4))
            loss.backward()
            optimizer.step()
        sharded = task.model
        assert isinstance(sharded, ShardedDMT)
        planned = sptt_rank_memory(
            sharded.dataflow.plan,
            rank,
            local_batch=4,
            dense_param_bytes=dense_bytes,
            dense_optimizer_states=dense_optimizer_states(torch.optim.Adam, {}),
            tower_param_bytes=tower_bytes,
        )
        params = [p for _, p in sharded.named_dense_parameters()]
        out.append((planned.dense_bytes, _held_dense_bytes(sharded, params, optimizer)))
    return out


def test_plan_dense_bytes_equal_held() -> None:
    """The dense state the SPTT plan counts on a rank (parameters of the dense arch and its
    tower module, their gradients, Adam's two state tensors) is what the rank holds after a
    step. DDP's gradient buckets are the gradients (as in TorchRec's DMP, the flat baseline):
    before, each rank held them a second time, one more copy of its dense parameters."""
    for per_topology in run_on_ranks(_dense_memory_worker, 2, timeout_s=120):
        for planned, held in per_topology:
            assert planned == held
