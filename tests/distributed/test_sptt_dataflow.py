"""SPTT steps a-f on gloo equal the single-process lookup on the concatenated global batch.

Every rank builds the same unsharded reference (all tables, all tower modules, the global batch)
from fixed seeds, runs it, and compares its own slice of the outputs and its own tables' and tower
module's gradients with the dataflow's.
"""

from __future__ import annotations

import copy
from dataclasses import dataclass
from datetime import timedelta
from typing import Any

import pytest
import torch
import torch.distributed as dist
from torch import nn
from torch.testing import assert_close
from torchrec.modules.embedding_configs import EmbeddingBagConfig, PoolingType
from torchrec.modules.embedding_modules import EmbeddingBagCollection
from torchrec.sparse.jagged_tensor import KeyedJaggedTensor

from dmt.sptt.comm_stats import CommStats
from dmt.sptt.dataflow import SPTTDataflow
from dmt.sptt.peer_permute import PEER_PERMUTES, peer_permute_site
from dmt.sptt.plan import SPTTPlan, build_plan
from dmt.sptt.process_groups import create_process_groups
from dmt.sptt.topology import Topology
from tests.distributed.distributed_harness import run_on_ranks

N = 4  # embedding dim
D = 3  # tower module output dim
B = 2  # local batch


@dataclass(frozen=True)
class Case:
    world_size: int
    local_world_size: int
    hosts_per_tower: int
    tower_features: tuple[tuple[int, ...], ...]
    reverse_keys: bool = False
    column_wise: tuple[int, ...] = ()
    row_wise: tuple[int, ...] = ()

    @property
    def num_features(self) -> int:
        return sum(len(t) for t in self.tower_features)


CASES = {
    # one tower of one host: steps d on 2 ranks, f on a group of 1
    "G2-L2-K1": Case(2, 2, 1, ((0, 1, 2),)),
    # the paper's example; tower 1 has one feature on two ranks, so rank 3 holds no table
    "G4-L2-K1": Case(4, 2, 1, ((0, 2, 3, 4), (1,)), reverse_keys=True),
    # four towers of one host each
    "G8-L2-K1": Case(8, 2, 1, ((0, 4), (1, 5, 6), (2,), (3,))),
    # two towers of two hosts each: step d crosses hosts
    "G8-L2-K2": Case(8, 2, 2, ((0, 2, 4, 6, 8), (1, 3, 5, 7))),
    # one rank per tower: step d is a group of 1
    "G4-L1-K1": Case(4, 1, 1, ((0, 3), (1,), (2, 4), (5,))),
    # column-wise (single-hot) and row-wise (multi-hot) shards next to whole tables
    "G4-L2-K1-cw-rw": Case(4, 2, 1, ((0, 2, 3, 4), (1, 5)), column_wise=(0, 4), row_wise=(3, 5)),
    "G8-L2-K2-cw-rw": Case(
        8, 2, 2, ((0, 2, 4, 6, 8), (1, 3, 5, 7)), column_wise=(2, 4), row_wise=(3, 7)
    ),
    # a tower of row-wise tables only: step d is a reduce-scatter alone
    "G4-L2-K1-rw-only": Case(4, 2, 1, ((0, 2), (1, 3)), row_wise=(1, 3)),
}


def _tables(case: Case) -> list[EmbeddingBagConfig]:
    """Mixed SUM/MEAN pooling; row-wise tables need SUM."""
    return [
        EmbeddingBagConfig(
            name=f"t_cat_{f}",
            feature_names=[f"cat_{f}"],
            embedding_dim=N,
            num_embeddings=5 + 3 * f,
            pooling=(
                PoolingType.MEAN if f % 3 == 2 and f not in case.row_wise else PoolingType.SUM
            ),
        )
        for f in range(case.num_features)
    ]


def _global_batch(
    tables: list[EmbeddingBagConfig], num_samples: int
) -> tuple[list[torch.Tensor], list[torch.Tensor]]:
    """Per feature: lengths (S,) and values; even features single-hot, odd ones multi-hot."""
    gen = torch.Generator().manual_seed(1)
    lengths, values = [], []
    for f, table in enumerate(tables):
        if f % 2 == 0:
            length = torch.ones(num_samples, dtype=torch.int64)
        else:
            length = torch.randint(0, 4, (num_samples,), generator=gen)
        lengths.append(length)
        values.append(torch.randint(0, table.num_embeddings, (int(length.sum()),), generator=gen))
    return lengths, values


def _kjt(
    names: list[str],
    lengths: list[torch.Tensor],
    values: list[torch.Tensor],
    start: int,
    stop: int,
    order: list[int],
) -> KeyedJaggedTensor:
    """Samples ``start:stop`` of the batch, keys in ``order``."""
    out_lengths, out_values = [], []
    for f in order:
        offsets = torch.cat([torch.zeros(1, dtype=torch.int64), lengths[f].cumsum(0)])
        out_lengths.append(lengths[f][start:stop])
        out_values.append(values[f][offsets[start] : offsets[stop]])
    return KeyedJaggedTensor.from_lengths_sync(
        keys=[names[f] for f in order],
        values=torch.cat(out_values),
        lengths=torch.cat(out_lengths),
    )


class _TowerModule(nn.Module):
    """(S, F_t, N) -> (S, V_t, D) with V_t = F_t + 1: a linear map of the flattened tower."""

    def __init__(self, num_features: int, seed: int) -> None:
        super().__init__()
        torch.manual_seed(seed)
        self.out_features = num_features + 1
        self.linear = nn.Linear(num_features * N, self.out_features * D)

    def forward(self, embs: torch.Tensor) -> torch.Tensor:
        return self.linear(embs.flatten(1)).view(embs.size(0), self.out_features, D)


@dataclass
class _Setup:
    """What every dataflow worker starts from: the topology, its groups, the plan, the reference
    tables and the global batch (all of it and this rank's share)."""

    topo: Topology
    groups: Any
    plan: SPTTPlan
    tables: list
    names: list[str]
    reference: EmbeddingBagCollection
    lengths: Any
    values: Any
    global_kjt: KeyedJaggedTensor
    local_kjt: KeyedJaggedTensor
    lo: int
    hi: int


def _setup(rank: int, world_size: int, case: Case) -> _Setup:
    topo = Topology(world_size, case.local_world_size, case.hosts_per_tower)
    groups = create_process_groups(topo, timeout=timedelta(seconds=30))
    F, G = case.num_features, world_size
    names = [f"cat_{f}" for f in range(F)]
    tables = _tables(case)
    kinds = {names[f]: "column_wise" for f in case.column_wise}
    kinds.update({names[f]: "row_wise" for f in case.row_wise})
    plan = build_plan(
        topo,
        names,
        case.tower_features,
        embedding_dim=N,
        num_embeddings=[t.num_embeddings for t in tables],
        sharding_types=kinds,
        costs=[t.num_embeddings for t in tables],
    )
    lo, hi = rank * B, (rank + 1) * B
    torch.manual_seed(0)
    reference = EmbeddingBagCollection(tables)
    lengths, values = _global_batch(tables, G * B)
    global_kjt = _kjt(names, lengths, values, 0, G * B, list(range(F)))
    order = list(reversed(range(F))) if case.reverse_keys else list(range(F))
    local_kjt = _kjt(names, lengths, values, lo, hi, order)
    return _Setup(
        topo, groups, plan, tables, names, reference, lengths, values, global_kjt, local_kjt, lo, hi
    )


def _dataflow_worker(rank: int, world_size: int, case: Case) -> dict[str, int]:
    s = _setup(rank, world_size, case)
    topo, groups, plan, tables, reference = s.topo, s.groups, s.plan, s.tables, s.reference
    global_kjt, local_kjt, lo, hi = s.global_kjt, s.local_kjt, s.lo, s.hi
    F, G, T = case.num_features, world_size, topo.num_towers
    towers = case.tower_features
    gen = torch.Generator().manual_seed(2)

    # ---- pass-through towers: pooled embeddings (B, F, N) and table gradients -------------
    stats = CommStats(topo, rank)
    dataflow = SPTTDataflow(plan, tables, groups=groups, stats=stats)
    dataflow.load_tables_from(reference)
    weight = torch.randn(G * B, F, N, generator=gen)

    ref = copy.deepcopy(reference)
    ref_pooled = ref(global_kjt).values().view(G * B, F, N)
    (ref_pooled * weight).sum().backward()

    pooled = dataflow.pooled_embeddings(local_kjt)
    assert_close(pooled, ref_pooled[lo:hi].detach())
    (pooled * weight[lo:hi]).sum().backward()
    _assert_shard_grads(dataflow, ref)
    _check_stats(stats, topo, rank, plan)

    # ---- tower modules between e and f ---------------------------------------------------
    dims = [(len(fs) + 1, D) for fs in towers]
    dataflow = SPTTDataflow(plan, tables, groups=groups, tower_output_dims=dims)
    dataflow.load_tables_from(reference)
    ref = copy.deepcopy(reference)
    ref_modules = [_TowerModule(len(fs), seed=10 + t) for t, fs in enumerate(towers)]
    my_tower = topo.tower_of(rank)
    module = _TowerModule(len(towers[my_tower]), seed=10 + my_tower)
    out_weights = [torch.randn(G * B, v, d, generator=gen) for v, d in dims]

    ref_pooled = ref(global_kjt).values().view(G * B, F, N)
    ref_outputs = [m(ref_pooled[:, list(fs)]) for m, fs in zip(ref_modules, towers)]
    sum((o * w).sum() for o, w in zip(ref_outputs, out_weights)).backward()

    outputs = dataflow(local_kjt, tower_module=module)
    assert len(outputs) == T
    for out, ref_out in zip(outputs, ref_outputs):
        assert_close(out, ref_out[lo:hi].detach())
    sum((o * w[lo:hi]).sum() for o, w in zip(outputs, out_weights)).backward()
    _assert_shard_grads(dataflow, ref)
    # the tower module is replicated in the tower: its gradients are summed over the tower only
    for p, ref_p in zip(module.parameters(), ref_modules[my_tower].parameters()):
        assert p.grad is not None and ref_p.grad is not None
        dist.all_reduce(p.grad, group=groups.tower)
        assert_close(p.grad, ref_p.grad)
    return stats.as_dict()


def _assert_shard_grads(dataflow: SPTTDataflow, ref: EmbeddingBagCollection) -> None:
    ref_params = dict(ref.named_parameters())
    shards = dataflow.shard_parameters()
    assert [s for s, _ in shards] == list(dataflow.plan.rank_shards(dataflow.rank))
    assert (dataflow.embedding_bag_collection is None) == (not shards)
    for shard, param in shards:
        ref_grad = ref_params[f"embedding_bags.t_cat_{shard.feature}.weight"].grad
        assert param.grad is not None and ref_grad is not None
        rows, cols = slice(shard.row_start, shard.row_stop), slice(shard.col_start, shard.col_stop)
        assert_close(param.grad, ref_grad[rows, cols])


def _check_stats(stats: CommStats, topo: Topology, rank: int, plan: SPTTPlan) -> None:
    def counter(step: str, group: str, direction: str = "forward"):
        return stats.counters[(step, group, direction)]

    T, KL, tower = topo.num_towers, topo.tower_size, topo.tower_of(rank)
    f_dims = [len(fs) * N for fs in plan.tower_features]
    # step f: this rank sends B rows of its tower's output to each of its T-1 peers, all off-host
    f_bytes = (T - 1) * B * f_dims[tower] * 4
    assert counter("f", "peer").bytes_sent == f_bytes
    assert counter("f", "peer").bytes_cross_host == f_bytes
    # step d: the T*B peer rows of its table/column-wise columns to each of its K*L-1 tower-mates,
    # and as much of its row-wise partial sums (reduce-scatter; all-gather in the backward)
    row_wise = len(plan.row_wise_features(tower)) * N
    d_bytes = (KL - 1) * T * B * (plan.all_to_all_width(rank) + row_wise) * 4
    assert counter("d", "tower").bytes_sent == d_bytes
    if topo.hosts_per_tower == 1:
        assert counter("d", "tower").bytes_cross_host == 0
    # backward mirrors forward: the gradient of what a rank received goes back to its source
    received_f = sum(B * f_dims[t] * 4 for t in range(T) if t != tower)
    assert counter("f", "peer", "backward").bytes_sent == received_f
    mates = [q for q in topo.tower_ranks(tower) if q != rank]
    received_d = sum(T * B * (plan.all_to_all_width(q) + row_wise) * 4 for q in mates)
    assert counter("d", "tower", "backward").bytes_sent == received_d
    a = counter("a", "world")
    assert a.calls == 1 and a.bytes_cross_host <= a.bytes_sent
    assert ("a", "world", "backward") not in stats.counters


@pytest.mark.parametrize("name", list(CASES))
def test_dataflow_matches_single_process(name: str) -> None:
    case = CASES[name]
    stats = run_on_ranks(_dataflow_worker, case.world_size, case)
    topo = Topology(case.world_size, case.local_world_size, case.hosts_per_tower)
    # world totals: forward and backward move the same bytes in steps d and f
    for step, group in (("d", "tower"), ("f", "peer")):
        for field in ("bytes_sent", "bytes_cross_host"):
            fwd = sum(s[f"{step}/{group}/forward/{field}"] for s in stats)
            bwd = sum(s[f"{step}/{group}/backward/{field}"] for s in stats)
            assert fwd == bwd, (step, field, fwd, bwd)
    if topo.hosts_per_tower > 1:
        assert sum(s["d/tower/forward/bytes_cross_host"] for s in stats) > 0
    if topo.num_towers > 1:
        assert sum(s["a/world/forward/bytes_cross_host"] for s in stats) > 0


# ---- where step c permutes (section 3.1.3) ---------------------------------------------------


def _received_ids(plan: SPTTPlan, rank: int, lengths, values) -> int:
    """Ids of the global batch that step a brings ``rank``: each shard's feature's, row-wise
    ones only in the shard's row block."""
    count = 0
    for shard in plan.rank_shards(rank):
        ids = values[shard.feature]
        if plan.is_row_wise(shard.feature):
            ids = ids[(ids >= shard.row_start) & (ids < shard.row_stop)]
        count += ids.numel()
    return count


def _peer_permute_worker(rank: int, world_size: int, case: Case) -> dict[str, dict[str, int]]:
    s = _setup(rank, world_size, case)
    topo, groups, plan, tables = s.topo, s.groups, s.plan, s.tables
    reference, lengths, values = s.reference, s.lengths, s.values
    global_kjt, local_kjt, lo, hi = s.global_kjt, s.local_kjt, s.lo, s.hi
    F, G = case.num_features, world_size
    weight = torch.randn(G * B, F, N, generator=torch.Generator().manual_seed(2))
    ref = copy.deepcopy(reference)
    ref_pooled = ref(global_kjt).values().view(G * B, F, N)
    (ref_pooled * weight).sum().backward()

    dataflows, outputs, stats = {}, {}, {}
    for setting in PEER_PERMUTES:
        stats[setting] = CommStats(topo, rank)
        dataflow = SPTTDataflow(
            plan, tables, groups=groups, stats=stats[setting], peer_permute=setting
        )
        dataflow.load_tables_from(reference)
        outputs[setting] = dataflow.pooled_embeddings(local_kjt)
        (outputs[setting] * weight[lo:hi]).sum().backward()
        _assert_shard_grads(dataflow, ref)
        dataflows[setting] = dataflow
    for setting in PEER_PERMUTES:
        # the same floats as the default path, which equals the single-process lookup
        assert_close(outputs[setting], outputs["output"], rtol=0, atol=0)
        assert_close(outputs[setting], ref_pooled[lo:hi].detach())

    # what step c moved: the pooled output twice, the ids and lengths once, or nothing
    permutes = topo.num_towers > 1 and topo.tower_size > 1
    k = len(plan.rank_shards(rank))
    input_bytes = (k * G * B + _received_ids(plan, rank, lengths, values)) * 8
    output_bytes = G * B * plan.lookup_width(rank) * 4
    expected = {
        "output": {"c/output/forward": output_bytes, "c/output/backward": output_bytes},
        "input": {"c/input/forward": input_bytes},
        "skip": {"c/none/forward": 0},
    }
    # training: the output permute moves its gradient too
    auto = peer_permute_site("auto", input_bytes=input_bytes, output_bytes=2 * output_bytes)
    expected["auto"] = expected[auto]
    shuffled = {}
    for setting in PEER_PERMUTES:
        got = {
            key.removesuffix("/bytes_shuffled"): value
            for key, value in stats[setting].as_dict().items()
            if key.startswith("c/") and key.endswith("/bytes_shuffled")
        }
        want = expected[setting] if permutes or setting == "skip" else {"c/none/forward": 0}
        assert got == want, (setting, got, want)
        # steps a, d and f are the same whatever step c does
        comm = {
            key: value
            for key, value in stats[setting].as_dict().items()
            if not key.startswith("c/")
        }
        base = {k: v for k, v in stats["output"].as_dict().items() if not k.startswith("c/")}
        assert comm == base, setting
        shuffled[setting] = got

    # "skip" is valid because TorchRec's staggered all-to-all delivers exactly what the plain
    # one delivers after the input permute (not because we assume it)
    with torch.no_grad():
        staggered = dataflows["skip"].distribute_input(local_kjt)
        permuted = dataflows["input"].peer_permute_input(
            dataflows["output"].distribute_input(local_kjt)
        )
    assert staggered.keys() == permuted.keys()
    assert torch.equal(staggered.lengths(), permuted.lengths())
    assert torch.equal(staggered.values(), permuted.values())
    # the permuted KJT carries its per-key totals (the lookup's to_dict needs no host sync),
    # and they are right
    assert permuted.length_per_key_or_none() == staggered.length_per_key()
    assert permuted.offset_per_key_or_none() == staggered.offset_per_key()
    return shuffled


PEER_PERMUTE_CASES = ["G4-L2-K1-cw-rw", "G8-L2-K1", "G8-L2-K2-cw-rw", "G4-L1-K1"]


@pytest.mark.parametrize("name", PEER_PERMUTE_CASES)
def test_peer_permute_variants_match_single_process(name: str) -> None:
    """Every ``peer_permute`` setting gives the default path's pooled embeddings and the
    single-process lookup's table gradients; only what step c shuffles differs."""
    case = CASES[name]
    shuffled = run_on_ranks(_peer_permute_worker, case.world_size, case)
    topo = Topology(case.world_size, case.local_world_size, case.hosts_per_tower)
    if topo.num_towers > 1 and topo.tower_size > 1:
        assert sum(s["input"]["c/input/forward"] for s in shuffled) > 0
