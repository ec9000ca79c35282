"""ShardedDMT on gloo trains exactly like the single-process DMT model on the global batch.

Every rank builds the same plain DMT model (``dmt.models.build_dmt_model``) and the same global
batches from fixed seeds. It trains one copy single-process on the concatenated global batch
(the reference) and shards another with :func:`dmt.sptt.dmt_sharding.shard_dmt` inside the
trainer's ``TrainTask``, then checks, for two optimizer steps: its logits and the loss, the
gradients of its tower-module replica and of the dense arch (after their all-reduces), and all
weights (its table shards, tower module and dense arch) after the steps. Variants share one
process-group set per topology to keep the suite short on two cores.
"""

from __future__ import annotations

import copy
import logging
import math
import re
from dataclasses import dataclass, field
from datetime import timedelta

import pytest
import torch
import torch.distributed as dist
from torch.testing import assert_close
from torch.utils._python_dispatch import TorchDispatchMode
from torchrec.datasets.utils import Batch
from torchrec.distributed.model_parallel import DistributedModelParallel, get_default_sharders
from torchrec.distributed.planner import EmbeddingShardingPlanner, ParameterConstraints
from torchrec.distributed.planner import Topology as PlannerTopology
from torchrec.distributed.types import ShardedTensor
from torchrec.sparse.jagged_tensor import KeyedJaggedTensor

from dmt.config import (
    CrossInteractionConfig,
    DCNTowerConfig,
    DLRMTowerConfig,
    DotInteractionConfig,
    ModelConfig,
    OptimConfig,
    PartitionConfig,
    PassThroughTowerConfig,
)
from dmt.models import build_dmt_model
from dmt.models.accounting import compression_ratio
from dmt.optim import dense_optimizer
from dmt.runtime import Runtime
from dmt.sharding import shard_model
from dmt.sptt.comm_stats import CommStats
from dmt.sptt.dmt_sharding import DMTSharder, ShardedDMT, shard_dmt, sparse_optimizer_spec
from dmt.sptt.process_groups import create_process_groups
from dmt.sptt.topology import Topology
from dmt.trainer import TrainTask
from tests.distributed.distributed_harness import backends, run_on_ranks

N = 8  # embedding dim (FBGEMM: multiple of 4; two column blocks)
D = 2  # tower module output vector size
B = 2  # local batch
NUM_DENSE = 3
STEPS = 2
TOL = {"rtol": 1e-5, "atol": 1e-6}


@dataclass(frozen=True)
class Variant:
    name: str  # base model: "dlrm" or "dcn"
    tower: str  # "passthrough", "dlrm", "dcn" or "dlrm_skip_square"
    sharding: str | tuple[tuple[int, str], ...] = "table_wise"  # all, or (feature, kind) pairs
    sparse: str = "rowwise_adagrad"
    dense: str = "sgd"
    pooling: str = "sum"
    fused: bool = True  # False: plain tables, compare their gradients instead
    peer_permute: str = "output"  # where step c permutes (section 3.1.3)
    tower_lr_scale: float = 1.0  # optim.tower_lr_scale
    tower_bias: bool = True  # model.tower.bias (DLRM tower modules)


@dataclass(frozen=True)
class Case:
    world_size: int
    local_world_size: int
    hosts_per_tower: int
    partition: tuple[tuple[int, ...], ...]
    variants: tuple[Variant, ...] = field(default=())

    @property
    def num_features(self) -> int:
        return sum(len(t) for t in self.partition)


CASES = {
    # one host of two ranks, one tower: step f is a group of one
    "G2-1host": Case(
        world_size=2,
        local_world_size=2,
        hosts_per_tower=1,
        partition=((0, 1, 2, 3, 4),),
        variants=(
            Variant("dlrm", "dlrm", dense="adam"),
            Variant("dcn", "passthrough", sharding="row_wise", sparse="sgd"),
            # the tower modules in their own param group: found by name in the sharded model
            Variant("dlrm", "dlrm", dense="adam", tower_lr_scale=0.5, tower_bias=False),
        ),
    ),
    # one table on two ranks: rank 1 holds none and sends empty pieces in steps d and f (on
    # NCCL, zero-sized sends and receives; the smallest such case, for machines of 2-4 GPUs)
    "G2-1host-one-table": Case(
        world_size=2,
        local_world_size=2,
        hosts_per_tower=1,
        partition=((0,),),
        variants=(Variant("dlrm", "dlrm", dense="adam"), Variant("dcn", "passthrough")),
    ),
    # two hosts of two ranks, a tower per host (the paper's example)
    "G4-2hosts": Case(
        world_size=4,
        local_world_size=2,
        hosts_per_tower=1,
        partition=((0, 2, 3, 5), (1, 4)),
        variants=(
            Variant("dlrm", "passthrough"),
            Variant("dlrm", "dlrm", sharding="column_wise", sparse="adagrad", pooling="mean"),
            Variant("dcn", "dcn", dense="adam", fused=False),
        ),
    ),
    # four hosts of two ranks, a tower per host
    "G8-4hosts": Case(
        world_size=8,
        local_world_size=2,
        hosts_per_tower=1,
        partition=((0, 4), (1, 5, 6), (2,), (3, 7)),
        variants=(
            Variant("dlrm", "dlrm", dense="adam"),
            Variant(
                "dcn", "passthrough", sharding=((1, "row_wise"), (5, "column_wise")), sparse="sgd"
            ),
        ),
    ),
    # four hosts of two ranks, two towers of two hosts each: step d crosses hosts
    "G8-2towers-of-2hosts": Case(
        world_size=8,
        local_world_size=2,
        hosts_per_tower=2,
        partition=((0, 2, 4, 6, 8), (1, 3, 5, 7)),
        variants=(
            Variant("dcn", "dcn", sharding=((2, "column_wise"), (3, "row_wise")), sparse="adagrad"),
            Variant("dlrm", "passthrough", sharding="row_wise", dense="adam"),
        ),
    ),
}


# ---- model and data --------------------------------------------------------------------------


def _names(case: Case) -> list[str]:
    return [f"cat_{f}" for f in range(case.num_features)]


def _build(case: Case, variant: Variant) -> torch.nn.Module:
    names = _names(case)
    tower = {
        "passthrough": PassThroughTowerConfig(),
        "dlrm": DLRMTowerConfig(dim=D, c=1, p=1, bias=variant.tower_bias),
        "dcn": DCNTowerConfig(dim=D, dcn_num_layers=1, dcn_low_rank=2),
        # one N-vector per tower: a one-feature tower's square Linear(N -> N) is left out
        "dlrm_skip_square": DLRMTowerConfig(dim=N, c=0, p=1, skip_square=True),
    }[variant.tower]
    interaction = {
        "dlrm": DotInteractionConfig(),
        "dcn": CrossInteractionConfig(num_layers=1, low_rank=2),
    }[variant.name]
    cfg = ModelConfig(
        name=variant.name,
        interaction=interaction,
        embedding_dim=N,
        bottom_mlp=[4, getattr(tower, "dim", N)],
        top_mlp=[4, 1],
        dcn_num_layers=1,
        dcn_low_rank=2,
        pooling=variant.pooling,
        tower=tower,
        partition=PartitionConfig(kind="explicit"),
    )
    torch.manual_seed(0)
    return build_dmt_model(
        cfg,
        [[names[f] for f in tower] for tower in case.partition],
        feature_names=names,
        cardinalities=[5 + 3 * f for f in range(case.num_features)],
        num_dense=NUM_DENSE,
    )


def _global_batch(
    case: Case, step: int
) -> tuple[torch.Tensor, list[torch.Tensor], list[torch.Tensor], torch.Tensor]:
    """Dense, per-feature lengths and values (odd features multi-hot), labels of ``G B`` samples."""
    S = case.world_size * B
    gen = torch.Generator().manual_seed(100 + step)
    lengths, values = [], []
    for f in range(case.num_features):
        length = (
            torch.ones(S, dtype=torch.int64)
            if f % 2 == 0
            else torch.randint(0, 4, (S,), generator=gen)
        )
        lengths.append(length)
        values.append(torch.randint(0, 5 + 3 * f, (int(length.sum()),), generator=gen))
    dense = torch.randn(S, NUM_DENSE, generator=gen)
    labels = torch.randint(0, 2, (S,), generator=gen).float()
    return dense, lengths, values, labels


def _batch(case: Case, step: int, start: int, stop: int) -> Batch:
    dense, lengths, values, labels = _global_batch(case, step)
    out_lengths, out_values = [], []
    for length, value in zip(lengths, values):
        offsets = torch.cat([torch.zeros(1, dtype=torch.int64), length.cumsum(0)])
        out_lengths.append(length[start:stop])
        out_values.append(value[offsets[start] : offsets[stop]])
    kjt = KeyedJaggedTensor.from_lengths_sync(
        keys=_names(case), values=torch.cat(out_values), lengths=torch.cat(out_lengths)
    )
    return Batch(dense_features=dense[start:stop], sparse_features=kjt, labels=labels[start:stop])


# the variants' optimizers, as optim.sparse / optim.dense configs
_SPARSE = {
    "rowwise_adagrad": {"_target_": "torchrec.optim.RowWiseAdagrad", "eps": 1e-8},
    "adagrad": {"_target_": "torch.optim.Adagrad", "eps": 1e-8},
    "sgd": {"_target_": "torch.optim.SGD"},
}
_DENSE = {"sgd": {"_target_": "torch.optim.SGD"}, "adam": {"_target_": "torch.optim.Adam"}}


def _optim_cfg(variant: Variant) -> OptimConfig:
    return OptimConfig(
        sparse_lr=0.05,
        lr=0.01,
        tower_lr_scale=variant.tower_lr_scale,
        sparse={**_SPARSE[variant.sparse], "_partial_": True, "lr": "${..sparse_lr}"},
        dense={**_DENSE[variant.dense], "_partial_": True, "lr": "${..lr}"},
    )


def _sharding(case: Case, variant: Variant) -> str | dict[str, str]:
    if isinstance(variant.sharding, str):
        return variant.sharding
    return {f"cat_{f}": kind for f, kind in variant.sharding}


# ---- checks ----------------------------------------------------------------------------------


def _table_weights(model: torch.nn.Module) -> dict[str, torch.Tensor]:
    return {
        name.split(".")[-2]: weight
        for tower in model.towers
        for name, weight in tower.embedding_bag_collection.named_parameters()
    }


def _pairs(sharded: ShardedDMT, ref: torch.nn.Module, tower: int):
    """(sharded parameter, reference parameter) of the tower-module replica and the dense arch."""
    ref_params = dict(ref.named_parameters())
    for name, p in sharded.named_dense_parameters():
        if name.startswith("towers.tower_module.module."):
            rest = name.removeprefix("towers.tower_module.module.")
            ref_name = f"towers.{tower}.tower_module.{rest}"
        else:
            ref_name = name.removeprefix("dense_arch.module.")
        yield name, p, ref_params[ref_name]


def _check_tables(sharded: ShardedDMT, ref: torch.nn.Module, *, grads: bool) -> None:
    ref_tables = _table_weights(ref)
    for shard, param in sharded.dataflow.shard_parameters():
        ref_w = ref_tables[f"t_cat_{shard.feature}"]
        rows, cols = slice(shard.row_start, shard.row_stop), slice(shard.col_start, shard.col_stop)
        if grads:
            assert param.grad is not None and ref_w.grad is not None
            assert_close(param.grad, ref_w.grad[rows, cols], **TOL)
        else:
            assert_close(param.detach(), ref_w.detach()[rows, cols], **TOL)


def _variant(case: Case, variant: Variant, rank: int, groups, runtime: Runtime) -> dict[str, int]:
    topo = groups.topology
    lo, hi = rank * B, (rank + 1) * B
    tower = topo.tower_of(rank)
    cfg = _optim_cfg(variant)

    ref = _build(case, variant).to(runtime.device)
    init = copy.deepcopy(ref)
    ref_tables = list(_table_weights(ref).values())
    ref_tables_set = {id(p) for p in ref_tables}
    sparse_class, sparse_kwargs = sparse_optimizer_spec(cfg)
    ref_sparse = sparse_class(ref_tables, **sparse_kwargs)
    ref_towers = [p for t in ref.towers for p in t.tower_module.parameters()]
    ref_dense = dense_optimizer(
        [p for p in ref.parameters() if id(p) not in ref_tables_set], cfg, scaled=ref_towers
    )

    stats = CommStats(topo, rank)
    if variant.fused:
        task, optimizer = shard_dmt(
            TrainTask(copy.deepcopy(init)),
            runtime,
            topology=topo,
            groups=groups,
            optim_cfg=cfg,
            sharding_type=_sharding(case, variant),
            stats=stats,
            peer_permute=variant.peer_permute,
        )
        sharded = task.model
    else:
        sharded = DMTSharder(
            topo, sharding_type=_sharding(case, variant), peer_permute=variant.peer_permute
        ).shard(copy.deepcopy(init), groups, device=runtime.device, stats=stats)
        task = TrainTask(sharded)
        optimizer = None
    assert isinstance(sharded, ShardedDMT)
    assert dist.get_world_size(groups.peer) == topo.num_towers

    for step in range(STEPS):
        batch = _batch(case, step, lo, hi).to(runtime.device)
        global_batch = _batch(case, step, 0, case.world_size * B).to(runtime.device)
        ref_sparse.zero_grad()
        ref_dense.zero_grad()
        ref_logits = ref(global_batch.dense_features, global_batch.sparse_features)
        ref_loss = torch.nn.functional.binary_cross_entropy_with_logits(
            ref_logits, global_batch.labels
        )
        ref_loss.backward()

        if optimizer is not None:
            optimizer.zero_grad()
        else:
            task.zero_grad()
        if step == 0:
            stats.reset()
        loss, logits = task(batch)
        assert_close(logits, ref_logits[lo:hi].detach(), **TOL)
        mean_loss = loss.detach().clone()
        dist.all_reduce(mean_loss)
        assert_close(mean_loss / case.world_size, ref_loss.detach(), **TOL)
        loss.backward()

        for name, p, ref_p in _pairs(sharded, ref, tower):
            assert p.grad is not None and ref_p.grad is not None, name
            assert_close(p.grad, ref_p.grad, **TOL, msg=lambda m, n=name: f"{n}: {m}")
        if not variant.fused:
            _check_tables(sharded, ref, grads=True)
            break
        if step == 0:
            forward_stats = stats.as_dict()
        optimizer.step()
        ref_sparse.step()
        ref_dense.step()

    if variant.fused:
        _check_tables(sharded, ref, grads=False)
        for name, p, ref_p in _pairs(sharded, ref, tower):
            assert_close(p.detach(), ref_p.detach(), **TOL, msg=lambda m, n=name: f"{n}: {m}")
    else:
        forward_stats = stats.as_dict()
    _check_step_f(stats, topo, rank, ref)
    forward_stats["compression_ratio_x1e6"] = round(compression_ratio(ref) * 1e6)
    forward_stats["holds_tables"] = int(sharded.dataflow.embedding_bag_collection is not None)
    return forward_stats


def _check_step_f(stats: CommStats, topo: Topology, rank: int, model: torch.nn.Module) -> None:
    """Step f sends this rank's tower output (V_t D_t per sample) to its T - 1 peers, off-host."""
    T, tower = topo.num_towers, topo.tower_of(rank)
    V, Dt = model.tower_output_dims[tower]
    counter = stats.counters[("f", "peer", "forward")]
    assert counter.bytes_sent == (T - 1) * B * V * Dt * 4 * counter.calls
    assert counter.bytes_cross_host == counter.bytes_sent


def _case_worker(
    rank: int, world_size: int, case: Case, backend: str = "gloo"
) -> list[dict[str, int]]:
    topo = Topology(world_size, case.local_world_size, case.hosts_per_tower)
    groups = create_process_groups(topo, timeout=timedelta(seconds=30))
    runtime = Runtime(
        rank,
        world_size,
        rank % case.local_world_size,
        case.local_world_size,
        torch.device("cuda", rank) if backend == "nccl" else torch.device("cpu"),
        backend,
    )
    return [_variant(case, v, rank, groups, runtime) for v in case.variants]


def _run_case(case: Case, backend: str) -> list[list[dict[str, int]]]:
    """Run every variant of ``case`` on its ranks (one GPU per rank with ``nccl``)."""
    gpus = torch.cuda.device_count() if torch.cuda.is_available() else 0
    if backend == "nccl" and gpus < case.world_size:
        pytest.skip(f"needs {case.world_size} GPUs, {gpus} here")
    return run_on_ranks(
        _case_worker, case.world_size, case, backend, timeout_s=180, backend=backend
    )


@pytest.mark.parametrize("backend", backends(min_gpus=2))
@pytest.mark.parametrize("name", list(CASES))
def test_sharded_dmt_trains_like_single_process(name: str, backend: str) -> None:
    case = CASES[name]
    results = _run_case(case, backend)
    topo = Topology(case.world_size, case.local_world_size, case.hosts_per_tower)
    for i, variant in enumerate(case.variants):
        stats = [r[i] for r in results]
        total = {k: sum(s.get(k, 0) for s in stats) for k in stats[0]}
        if variant.tower != "passthrough":
            # the tower-module all-reduce stays inside the tower: on one host when K = 1
            assert total["tm/tower/backward/calls"] > 0
            if case.hosts_per_tower == 1:
                assert total["tm/tower/backward/bytes_cross_host"] == 0
        if topo.num_towers > 1:
            assert total["f/peer/forward/bytes_cross_host"] > 0
    if name == "G2-1host-one-table":
        assert [[r[i]["holds_tables"] for r in results] for i in range(2)] == [[1, 0], [1, 0]]
    if name == "G4-2hosts":
        # same partition, pass-through vs DLRM tower modules: step f's cross-host bytes shrink by
        # exactly the compression ratio sum_t F_t N / sum_t O_t
        passthrough, dlrm = (
            {k: sum(r[i].get(k, 0) for r in results) for k in results[0][i]} for i in (0, 1)
        )
        ratio = results[0][1]["compression_ratio_x1e6"] / 1e6
        assert ratio > 1
        key = "f/peer/forward/bytes_cross_host"
        assert passthrough[key] == pytest.approx(ratio * dlrm[key], rel=1e-5)
        assert passthrough[key.replace("forward", "backward")] == pytest.approx(
            ratio * dlrm[key.replace("forward", "backward")], rel=1e-5
        )


# ---- where step c permutes (section 3.1.3) ---------------------------------------------------

PEER_PERMUTE_CASES = {
    "G4-2hosts": Case(
        world_size=4,
        local_world_size=2,
        hosts_per_tower=1,
        partition=((0, 2, 3, 5), (1, 4)),
        variants=(
            Variant(
                "dlrm",
                "dlrm",
                sharding="column_wise",
                sparse="adagrad",  # row-wise Adagrad differs on column-wise shards
                pooling="mean",
                peer_permute="input",
            ),
            Variant("dcn", "dcn", sparse="adagrad", peer_permute="skip"),
            Variant("dlrm", "passthrough", dense="adam", peer_permute="auto"),
            Variant("dlrm", "dlrm", sharding="row_wise", fused=False, peer_permute="input"),
        ),
    ),
    "G8-2towers-of-2hosts": Case(
        world_size=8,
        local_world_size=2,
        hosts_per_tower=2,
        partition=((0, 2, 4, 6, 8), (1, 3, 5, 7)),
        variants=(
            Variant(
                "dcn",
                "dcn",
                sharding=((2, "column_wise"), (3, "row_wise")),
                sparse="adagrad",
                peer_permute="input",
            ),
            Variant("dlrm", "passthrough", sharding="row_wise", peer_permute="skip"),
            Variant("dlrm", "dlrm", sparse="sgd", dense="adam", peer_permute="auto"),
        ),
    ),
}


@pytest.mark.parametrize("backend", backends(min_gpus=4))
@pytest.mark.parametrize("name", list(PEER_PERMUTE_CASES))
def test_peer_permute_variants_train_like_single_process(name: str, backend: str) -> None:
    """Permuting the input, choosing by bytes, or skipping step c (the default) trains exactly
    like the single-process model (logits, loss, gradients, weights after two steps), like
    Figure 7's step c in the other cases."""
    case = PEER_PERMUTE_CASES[name]
    results = _run_case(case, backend)
    for i, variant in enumerate(case.variants):
        shuffled = {
            key.split("/")[1]
            for r in results
            for key, value in r[i].items()
            if key.startswith("c/") and key.endswith("/calls") and value
        }
        if variant.peer_permute == "auto":  # chosen per rank and batch
            assert shuffled <= {"input", "output"} and shuffled, shuffled
        else:
            expected = {"skip": {"none"}, "input": {"input"}, "output": {"output"}}
            assert shuffled == expected[variant.peer_permute], (variant, shuffled)
        if variant.peer_permute == "input":
            assert not any(key.startswith("c/input/backward") for r in results for key in r[i])


# ---- failures --------------------------------------------------------------------------------


def _failing_rank_worker(rank: int, world_size: int) -> tuple[str, str]:
    case = CASES["G4-2hosts"]
    topo = Topology(world_size, 2)
    groups = create_process_groups(topo, timeout=timedelta(seconds=2))
    runtime = Runtime(rank, world_size, rank % 2, 2, torch.device("cpu"), "gloo")
    variant = case.variants[0]
    task, _ = shard_dmt(
        TrainTask(_build(case, variant)),
        runtime,
        topology=topo,
        groups=groups,
        optim_cfg=_optim_cfg(variant),
    )
    outcome, message = "ok", ""
    if rank != 3:  # rank 3 "fails" and never joins the forward's collectives
        try:
            task(_batch(case, 0, rank * B, (rank + 1) * B))
        except RuntimeError as e:
            outcome, message = type(e).__name__, str(e)
    dist.barrier()
    return outcome, message


def test_a_failing_rank_fails_the_others_by_timeout() -> None:
    """By the SPTT groups' own timeout (2 s), which gloo names, not the default group's. A rank
    whose peer timed out first may see that peer close their connection instead (a race: CI
    once had rank 0 fail so), but some rank names the 2 s timeout and none another."""
    results = run_on_ranks(_failing_rank_worker, 4, timeout_s=60)
    named = []
    for rank, (outcome, message) in enumerate(results[:3]):
        assert outcome == "RuntimeError", (rank, outcome)
        timeout = re.search(r"\bTimed out waiting (\d+)ms\b", message)
        if timeout is None:
            assert "Connection closed by peer" in message, (rank, message)
        else:
            named.append(int(timeout.group(1)))
    assert named and set(named) == {2000}, results


# ---- a tower module without parameters beside one with --------------------------------------

# a one-feature tower (its module has no parameter) and a two-feature one (a Linear(2 N -> N))
UNEVEN_TOWERS = Case(
    world_size=2,
    local_world_size=1,
    hosts_per_tower=1,
    partition=((0,), (1, 2)),
    variants=(
        Variant("dlrm", "dlrm_skip_square", dense="adam", tower_lr_scale=0.5),
        Variant("dlrm", "passthrough", tower_lr_scale=0.5),
    ),
)


class _Warnings(logging.Handler):
    """The messages of the warnings a logger emits (pytest's ``caplog`` sees no other process)."""

    def __init__(self) -> None:
        super().__init__(logging.WARNING)
        self.messages: list[str] = []

    def emit(self, record: logging.LogRecord) -> None:
        self.messages.append(record.getMessage())


def _warnings_worker(rank: int, world_size: int) -> list[list[str]]:
    """What ``dmt.optim`` warns of while each variant of ``UNEVEN_TOWERS`` is sharded and
    trained (and checked against the single-process model)."""
    case = UNEVEN_TOWERS
    topo = Topology(world_size, case.local_world_size, case.hosts_per_tower)
    groups = create_process_groups(topo, timeout=timedelta(seconds=30))
    runtime = Runtime(rank, world_size, rank, world_size, torch.device("cpu"), "gloo")
    logger = logging.getLogger("dmt.optim")
    out = []
    for variant in case.variants:
        warned = _Warnings()
        logger.addHandler(warned)
        try:
            _variant(case, variant, rank, groups, runtime)
        finally:
            logger.removeHandler(warned)
        out.append(warned.messages)
    return out


def test_tower_lr_scale_acts_when_only_some_towers_have_parameters() -> None:
    """``optim.tower_lr_scale`` with ``skip_square`` towers of one and two features: the ranks of
    the two-feature tower train its linear at half the LR, as the single-process model does
    (checked in the worker), and no rank warns that the setting does nothing (the rank whose
    tower has no parameter did). Pass-through towers have none anywhere: every rank warns."""
    results = run_on_ranks(_warnings_worker, 2, timeout_s=120)
    unused = (
        "optim.tower_lr_scale=0.5 does nothing: the model has no tower-module parameters (a base "
        "model, pass-through towers or tower modules without parameters)"
    )
    assert results == [[[], [unused]], [[], [unused]]]


# ---- the flat TorchRec baseline --------------------------------------------------------------


def _flat_torchrec(task: TrainTask, case: Case, runtime: Runtime, init: torch.nn.Module, how: str):
    """``task`` sharded flat by TorchRec (DMP over the world) with ``init``'s tables: forced
    table-wise, or ``dmt.sharding.shard_model`` (the planner's choice)."""
    if how == "planner":
        dmp = shard_model(task, runtime, batch_size=case.world_size * B)
    else:
        planner = EmbeddingShardingPlanner(
            topology=PlannerTopology(
                world_size=case.world_size,
                local_world_size=case.local_world_size,
                compute_device="cpu",
            ),
            batch_size=B,
            constraints={
                name: ParameterConstraints(sharding_types=["table_wise"])
                for name in _table_weights(init)
            },
        )
        sharders = get_default_sharders()
        plan = planner.collective_plan(task, sharders, dist.GroupMember.WORLD)
        for module_plan in plan.plan.values():
            for param_sharding in module_plan.values():  # type: ignore[union-attr]
                assert param_sharding.sharding_type == "table_wise"
        dmp = DistributedModelParallel(
            task, device=torch.device("cpu"), plan=plan, sharders=sharders
        )
    tables = _table_weights(init)
    state = dmp.state_dict()
    with torch.no_grad():
        for name, value in state.items():
            table = name.split(".")[-2]
            if table not in tables or not name.endswith(".weight"):
                continue
            full = tables[table]
            if isinstance(value, ShardedTensor):
                for shard in value.local_shards():
                    (r, c), (h, w) = shard.metadata.shard_offsets, shard.metadata.shard_sizes
                    shard.tensor.copy_(full[r : r + h, c : c + w])
            else:
                value.copy_(full)
    dmp.load_state_dict(state)  # the state dict may hold copies of the kernels' weights
    return dmp


def _flat_worker(rank: int, world_size: int, case: Case) -> dict[str, list[float]]:
    """SPTT pass-through vs TorchRec's flat sharding of the same DMT model, same weights."""
    topo = Topology(world_size, case.local_world_size, case.hosts_per_tower)
    groups = create_process_groups(topo, timeout=timedelta(seconds=30))
    runtime = Runtime(
        rank,
        world_size,
        rank % case.local_world_size,
        case.local_world_size,
        torch.device("cpu"),
        "gloo",
    )
    variant = Variant("dlrm", "passthrough")
    init = _build(case, variant)
    sharded, _ = shard_dmt(
        copy.deepcopy(init), runtime, topology=topo, groups=groups, optim_cfg=_optim_cfg(variant)
    )
    batch = _batch(case, 0, rank * B, (rank + 1) * B)
    with torch.no_grad():
        sptt_outputs = sharded.tower_outputs(batch.sparse_features)
        sptt_logits = sharded(batch.dense_features, batch.sparse_features)
    jagged = batch.sparse_features.to_dict()
    out: dict[str, list[float]] = {"sptt": sptt_logits.tolist()}
    for how in ("table_wise", "planner"):
        dmp = _flat_torchrec(TrainTask(copy.deepcopy(init)), case, runtime, init, how)
        towers = dmp.module.model.towers
        with torch.no_grad():
            by_name = []
            for tower, names in zip(towers, init.partition):
                kjt = KeyedJaggedTensor.from_jt_dict({f: jagged[f] for f in names})
                pooled = tower.embedding_bag_collection(kjt).wait().to_dict()
                by_name.append(torch.stack([pooled[f] for f in names], dim=1))
            for flat, ours in zip(by_name, sptt_outputs):
                assert_close(flat, ours, **TOL)
            # the flat lookup read by feature name, then the same dense part
            out[f"{how}/by_name"] = init.interact(batch.dense_features, by_name).tolist()
            out[f"{how}/model"] = dmp(batch)[1].tolist()
    return out


@pytest.fixture(scope="module")
def flat_results() -> list[dict[str, list[float]]]:
    return run_on_ranks(_flat_worker, 4, CASES["G4-2hosts"], timeout_s=180)


@pytest.mark.parametrize("how", ["table_wise", "planner"])
def test_passthrough_sptt_equals_flat_torchrec(flat_results, how: str) -> None:
    """Pass-through SPTT gives every feature's pooled embedding (checked in the worker) and the
    logits that TorchRec's flat sharding of the same model gives: its lookup read by feature
    name through the model's dense part, and the DMP-sharded model itself."""
    for rank in flat_results:
        sptt = torch.tensor(rank["sptt"])
        assert_close(torch.tensor(rank[f"{how}/by_name"]), sptt, **TOL)
        assert_close(torch.tensor(rank[f"{how}/model"]), sptt, **TOL)


# ---- uneven local batches --------------------------------------------------------------------

UNEVEN_TRAIN = (3, 2, 1, 2)  # local batch of each rank
UNEVEN_EVAL = (3, 2, 0, 1)


def _uneven_worker(rank: int, world_size: int) -> None:
    case = CASES["G4-2hosts"]
    topo = Topology(world_size, 2)
    groups = create_process_groups(topo, timeout=timedelta(seconds=30))
    variant = Variant("dlrm", "dlrm")
    ref = _build(case, variant)
    sharded = DMTSharder(topo).shard(copy.deepcopy(ref), groups)
    for sizes in (UNEVEN_TRAIN, UNEVEN_EVAL):
        starts = [sum(sizes[:r]) for r in range(world_size + 1)]
        lo, hi = starts[rank], starts[rank + 1]
        batch, full = _batch(case, 0, lo, hi), _batch(case, 0, 0, starts[-1])
        if sizes == UNEVEN_EVAL:  # evaluation: a rank may even hold no sample
            with torch.no_grad():
                logits = sharded(batch.dense_features, batch.sparse_features)
                ref_logits = ref(full.dense_features, full.sparse_features)
            assert logits.shape == (hi - lo,)
            assert_close(logits, ref_logits[lo:hi], **TOL)
            continue
        # training: each rank's loss is the mean over its samples, averaged over ranks (DDP)
        logits = sharded(batch.dense_features, batch.sparse_features)
        loss = torch.nn.functional.binary_cross_entropy_with_logits(logits, batch.labels)
        loss.backward()
        ref_logits = ref(full.dense_features, full.sparse_features)
        weights = torch.cat([torch.full((b,), 1.0 / (b * world_size)) for b in sizes])
        losses = torch.nn.functional.binary_cross_entropy_with_logits(
            ref_logits, full.labels, reduction="none"
        )
        (losses * weights).sum().backward()
        assert_close(logits, ref_logits[lo:hi].detach(), **TOL)
        for name, p, ref_p in _pairs(sharded, ref, topo.tower_of(rank)):
            assert_close(p.grad, ref_p.grad, **TOL, msg=lambda m, n=name: f"{n}: {m}")
        _check_tables(sharded, ref, grads=True)


def test_uneven_local_batches() -> None:
    run_on_ranks(_uneven_worker, 4, timeout_s=120)


# ---- gradient scaling after the wire (sptt.comm_precision=fp16) -------------------------------


class _AllToAllMax(TorchDispatchMode):
    """The largest magnitude each ``all_to_all_single`` this rank issues sends, by group."""

    def __init__(self) -> None:
        super().__init__()
        self.sent: dict[tuple[int, ...], float] = {}

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        kwargs = kwargs or {}
        if func._schema.name == "c10d::alltoall_base_":
            names = [a.name for a in func._schema.arguments]
            named = {**dict(zip(names, args)), **kwargs}
            group = dist.ProcessGroup.unbox(named["process_group"])
            ranks = tuple(dist.get_process_group_ranks(group))
            sent = float(named["input"].abs().max()) if named["input"].numel() else 0.0
            self.sent[ranks] = max(self.sent.get(ranks, 0.0), sent)
        return func(*args, **kwargs)


def _global_max(value: float, device: torch.device) -> float:
    out = torch.tensor([value], dtype=torch.float64, device=device)
    dist.all_reduce(out, op=dist.ReduceOp.MAX)
    return float(out)


def _wire_worker(rank: int, world_size: int, backend: str) -> None:
    device = torch.device(f"cuda:{rank}") if backend == "nccl" else torch.device("cpu")
    case = CASES["G4-2hosts"]
    topo = Topology(world_size, 2)
    groups = create_process_groups(topo, timeout=timedelta(seconds=30))
    ref = _build(case, Variant("dlrm", "passthrough")).to(device)
    batch = _batch(case, 0, rank * B, (rank + 1) * B).to(device)

    def backward(precision: str, loss_scale: float):
        sharder = DMTSharder(topo, comm_precision=precision)
        sharded = sharder.shard(copy.deepcopy(ref), groups, device=device)
        logits = sharded(batch.dense_features, batch.sparse_features)
        loss = torch.nn.functional.binary_cross_entropy_with_logits(logits, batch.labels)
        wire = _AllToAllMax()
        with wire:
            (loss * loss_scale).backward()
        grads = {
            (s.feature, s.row_start): p.grad.cpu() for s, p in sharded.dataflow.shard_parameters()
        }
        return wire, grads

    # Pass-through towers: in the backward, step d sends exactly the numbers step f received
    # (steps e and c only move them), so both wires carry the gradient of each rank's own loss,
    # unscaled, as TorchRec's collectives do; the 1/G lands on the lookup's output after step d.
    wire, grads32 = backward("fp32", 1.0)
    step_d = wire.sent[topo.tower_ranks(topo.tower_of(rank))]
    step_f = wire.sent[topo.peers_of(rank)]
    assert _global_max(step_d, device) == _global_max(step_f, device) > 0

    # fp16 with gradients in fp16's subnormal range (spacing 2**-24): the tables' gradients are
    # the fp32 ones within one rounding of each unscaled contribution, divided by G. Rounding
    # them G times smaller, before the 1/G, would err up to G times more.
    biggest = _global_max(step_f, device)  # the largest unscaled gradient any wire carries
    scale = 2.0 ** (-22 - math.ceil(math.log2(biggest)))  # now below 2**-22 on every wire
    _, grads32 = backward("fp32", scale)
    _, grads16 = backward("fp16", scale)
    _, _, values, _ = _global_batch(case, 0)
    per_contribution = (2.0**-25 + 2.0**-29) / world_size  # half a subnormal step, + fwd fp16
    for (feature, row_start), g16 in grads16.items():
        g32 = grads32[(feature, row_start)]
        counts = torch.bincount(values[feature], minlength=5 + 3 * feature).double()
        bound = counts[row_start : row_start + g32.size(0), None] * per_contribution
        err = (g16.double() - g32.double()).abs()
        assert (err <= bound).all(), (feature, (err - bound).max().item())
        assert (g16 != 0).any() or (g32 == 0).all()


@pytest.mark.parametrize("backend", backends(min_gpus=4))
def test_gradients_cross_the_wire_unscaled_so_fp16_keeps_them(backend: str) -> None:
    """Steps d and f send each rank's gradient unscaled (the 1/G comes after the wire), so fp16
    rounds it as TorchRec's flat collectives do; scaling first reproduced a G-times-larger error."""
    run_on_ranks(_wire_worker, 4, backend, timeout_s=120, backend=backend)
