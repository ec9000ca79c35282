"""Per-rank memory of a plan (:mod:`dmt.planning.memory`): the tables and optimizer state of all
ranks add up to the unsharded tables', UVM-cached shards move to host memory, and a rank that
does not fit is named with its numbers."""

from __future__ import annotations

from typing import Any

import pytest
import torch
from torch import nn

from dmt.memory import FUSED, FUSED_UVM_CACHING, GIB, MemoryBudget, table_bytes
from dmt.planning.collectives import FlatShard, FlatTable
from dmt.planning.memory import (
    RankMemory,
    check_fits,
    dense_activations_per_sample,
    dense_optimizer_states,
    dense_state_bytes,
    flat_rank_memory,
    sptt_rank_memory,
)
from dmt.sptt.plan import build_plan
from dmt.sptt.topology import Topology

ROWS = [1000, 50, 300, 7, 2000, 64]
N = 16


def _plan(memory: MemoryBudget | None = None):  # type: ignore[no-untyped-def]
    names = [f"f{i}" for i in range(len(ROWS))]
    return build_plan(
        Topology(8, 2, 2),
        names,
        [[0, 2, 4], [1, 3, 5]],
        embedding_dim=N,
        num_embeddings=ROWS,
        sharding_types={"f0": "row_wise", "f1": "column_wise"},
        sparse_optimizer="rowwise_adagrad",
        memory=memory,
    )


def test_tables_and_state_add_up_to_the_unsharded_tables() -> None:
    plan = _plan()
    per_rank = [sptt_rank_memory(plan, r, local_batch=4, dense_param_bytes=0) for r in range(8)]
    weights = sum(4 * rows * N for rows in ROWS)
    assert sum(m.table_bytes for m in per_rank) == weights
    # row-wise Adagrad: one value per row and shard (column-wise f1 has 4 shards of 50 rows)
    state_rows = sum(ROWS) + 3 * ROWS[1]
    assert sum(m.optimizer_state_bytes for m in per_rank) == 4 * state_rows
    assert all(m.uvm_cache_bytes == m.uvm_host_bytes == 0 for m in per_rank)


def test_uvm_cached_shards_take_their_cache_in_hbm() -> None:
    biggest = table_bytes("rowwise_adagrad", 2000, N)
    budget = MemoryBudget("cuda", hbm_bytes=biggest - 1, ddr_bytes=GIB, uvm_cache_load_factor=0.5)
    plan = _plan(budget)
    rank = next(s.rank for s in plan.shards if s.feature == 4)
    m = sptt_rank_memory(plan, rank, local_batch=4, dense_param_bytes=0)
    # row-wise Adagrad's state (4 bytes a row) stays in HBM: FBGEMM puts row-wise optimizer
    # state on the device whatever the table's location
    assert m.uvm_host_bytes == biggest - 4 * 2000
    assert m.uvm_cache_bytes == budget.cached_hbm_bytes(biggest, 2000, 4 * 2000)
    # half the table and its state, 4 + 16 / 2 bytes of FBGEMM's bookkeeping per row, and the
    # row-wise state
    assert m.uvm_cache_bytes == biggest // 2 + 12 * 2000 + 4 * 2000
    # the cache counts against the GPU's memory, the host part does not
    assert m.device_bytes == (
        m.table_bytes
        + m.optimizer_state_bytes
        + m.uvm_cache_bytes
        + m.dense_bytes
        + m.activation_bytes
    )
    assert m.uvm_cache_bytes > 0 and m.uvm_host_bytes > 0


def _allocated_states(cls: type, kwargs: dict[str, Any]) -> float:
    """State tensors of a parameter's shape a real ``cls`` optimizer keeps after two steps, by
    counting its state's elements (scalars such as Adam's ``step`` are not of its shape)."""
    param = nn.Parameter(torch.ones(7, 5))
    optimizer = cls([param], lr=0.01, **kwargs)
    for _ in range(2):
        param.grad = torch.full_like(param, 0.5)
        optimizer.step()
    state = optimizer.state[param]
    elements = sum(
        v.numel() for v in state.values() if torch.is_tensor(v) and v.shape == param.shape
    )
    return elements / param.numel()


@pytest.mark.parametrize(
    ("cls", "kwargs"),
    [
        (torch.optim.SGD, {}),
        (torch.optim.SGD, {"momentum": 0.9}),
        (torch.optim.SGD, {"momentum": 0.9, "nesterov": True}),
        (torch.optim.Adam, {}),
        (torch.optim.Adam, {"amsgrad": True}),
        (torch.optim.AdamW, {}),
        (torch.optim.AdamW, {"amsgrad": True}),
        (torch.optim.Adagrad, {}),
        (torch.optim.RMSprop, {}),
        (torch.optim.RMSprop, {"momentum": 0.9}),
        (torch.optim.RMSprop, {"centered": True}),
        (torch.optim.RMSprop, {"momentum": 0.5, "centered": True}),
    ],
)
def test_dense_optimizer_states_are_what_torch_allocates(cls: type, kwargs: dict[str, Any]) -> None:
    # kwargs as optim.dense holds them: _target_ and _partial_ beside the optimizer's own
    config = {"_target_": f"{cls.__module__}.{cls.__qualname__}", "_partial_": True, **kwargs}
    assert dense_optimizer_states(cls, config) == _allocated_states(cls, kwargs)


def test_an_unknown_dense_optimizer_is_named() -> None:
    with pytest.raises(ValueError) as e:
        dense_optimizer_states(torch.optim.NAdam, {})
    assert str(e.value).startswith(
        "optim.dense._target_=torch.optim.nadam.NAdam: dmt-plan counts the dense optimizer "
        "state of ['torch.optim.sgd.SGD', 'torch.optim.adam.Adam', 'torch.optim.adamw.AdamW', "
        "'torch.optim.adagrad.Adagrad', 'torch.optim.rmsprop.RMSprop'] only"
    )


def test_dense_state_and_activations() -> None:
    assert dense_state_bytes(100, 2) == 400
    assert dense_state_bytes(100, 0) == 200
    mlp = nn.Sequential(nn.Linear(3, 8), nn.ReLU(), nn.Linear(8, 5))
    assert dense_activations_per_sample(mlp, torch.zeros(2, 3)) == 13
    plan = _plan()
    base = sptt_rank_memory(plan, 0, local_batch=4, dense_param_bytes=0)
    more = sptt_rank_memory(plan, 0, local_batch=4, dense_param_bytes=0, dense_activations=13)
    assert more.activation_bytes - base.activation_bytes == 2 * 4 * 4 * 13


class _Layers(nn.Module):
    """A layer without a bias (``mm``), one with (``addmm``), and a product of activations."""

    def __init__(self) -> None:
        super().__init__()
        self.first = nn.Linear(3, 8, bias=False)
        self.second = nn.Linear(8, 5)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        y = self.second(self.first(x))
        return torch.bmm(y.unsqueeze(2), y.unsqueeze(1))


def test_dense_activations_are_the_widths_of_layers_with_weights() -> None:
    layers = _Layers()
    widths = sum(m.out_features for m in layers.modules() if isinstance(m, nn.Linear))
    assert dense_activations_per_sample(layers, torch.zeros(2, 3)) == widths == 13


def test_the_first_of_equally_full_ranks_is_named() -> None:
    ranks = [RankMemory(r, 100, 10, 0, 0, 5, 1) for r in range(3)]
    assert check_fits(ranks, 116, what="flat") == ranks[0]
    with pytest.raises(ValueError, match=r"^flat: rank 0 needs 116 bytes"):
        check_fits(ranks, 115, what="flat")


def test_a_rank_that_does_not_fit_is_named() -> None:
    ranks = [RankMemory(r, 100 * r, 10, 0, 0, 5, 1) for r in range(3)]
    assert check_fits(ranks, 216, what="sptt") == ranks[2]
    with pytest.raises(ValueError) as e:
        check_fits(ranks, 215, what="sptt")
    assert str(e.value) == (
        "sptt: rank 2 needs 216 bytes (0.00 GiB) of GPU memory, 215 bytes (0.00 GiB) are "
        "available (tables 200, optimizer state 10, UVM caches 0, dense 5, activations 1 bytes)"
    )


def _fp32(*shape: int) -> int:
    """Bytes of an fp32 tensor of ``shape``, as torch allocates it."""
    return torch.empty(shape, dtype=torch.float32, device="meta").nbytes


def test_flat_rank_memory_counts_each_part() -> None:
    """Rank 1 of two hosts of two ranks under every flat sharding type, one table UVM-cached:
    each part counted from the shards' shapes (``B = 3``, row-wise Adagrad)."""
    budget = MemoryBudget("cuda", hbm_bytes=GIB, ddr_bytes=GIB, uvm_cache_load_factor=0.5)
    tables = [
        FlatTable("t0", 0, "f0", 100, 8, "table_wise", (FlatShard(1, 0, 100, 0, 8),)),
        FlatTable(
            "t1",
            1,
            "f1",
            60,
            4,
            "row_wise",
            tuple(FlatShard(r, 15 * r, 15 * r + 15, 0, 4) for r in range(4)),
        ),
        FlatTable(
            "t2",
            2,
            "f2",
            50,
            16,
            "column_wise",
            (FlatShard(1, 0, 50, 0, 8), FlatShard(3, 0, 50, 8, 16)),
        ),
        FlatTable(
            "t3",
            3,
            "f3",
            40,
            4,
            "table_row_wise",
            (FlatShard(0, 0, 20, 0, 4), FlatShard(1, 20, 40, 0, 4)),
        ),
        FlatTable(
            "t4", 4, "f4", 1000, 8, "table_wise", (FlatShard(1, 0, 1000, 0, 8),), FUSED_UVM_CACHING
        ),
        FlatTable("t5", 5, "f5", 10, 4, "data_parallel", ()),
        FlatTable("t6", 6, "f6", 30, 4, "table_wise", (FlatShard(0, 0, 30, 0, 4),), FUSED),
    ]
    m = flat_rank_memory(
        tables,
        Topology(4, 2),
        1,
        local_batch=3,
        sparse_optimizer="rowwise_adagrad",
        dense_param_bytes=40,
        dense_optimizer_states=2,
        dense_activations=5,
        budget=budget,
    )
    held = [(100, 8), (15, 4), (50, 8), (20, 4)]  # rank 1's shards in HBM (t6 is on rank 0)
    assert m.table_bytes == sum(_fp32(rows, cols) for rows, cols in held)
    assert m.optimizer_state_bytes == sum(_fp32(rows) for rows, _ in held)  # one value a row
    # t4 in host memory; its row-wise state, half of it and its state, 4 + 16 / 2 bytes a row
    # of FBGEMM's bookkeeping in HBM
    assert m.uvm_host_bytes == _fp32(1000, 8)
    assert m.uvm_cache_bytes == (_fp32(1000, 8) + _fp32(1000)) // 2 + 12 * 1000 + _fp32(1000)
    # the data-parallel table is replicated and trained as the dense part is
    assert m.dense_bytes == (2 + 2) * (40 + _fp32(10, 4))
    # lookup output (G B, columns of its shards, t4's too), the data-parallel lookup (B, 4),
    # the output dist's (B, every table's dim), the dense layers' (B, 5)
    lookup = _fp32(4 * 3, 8 + 4 + 8 + 4 + 8) + _fp32(3, 4)
    delivered = _fp32(3, 8 + 4 + 16 + 4 + 8 + 4 + 4)
    assert m.activation_bytes == 2 * (lookup + delivered + _fp32(3, 5))


def test_sptt_rank_memory_counts_each_tensor_of_the_step() -> None:
    """Dense state and activations of a rank of each tower, from the shapes of what the step
    holds (``G = 8, T = 2, B = 4``): tower 0's module emits ``(3, 8)`` per sample (as many
    vectors as features, but narrower), tower 1's is a pass-through."""
    plan = _plan()
    G, T, B = 8, 2, 4
    dims = [(3, 8), (3, N)]
    for rank, tower in ((1, 0), (6, 1)):
        m = sptt_rank_memory(
            plan,
            rank,
            local_batch=B,
            dense_param_bytes=40,
            dense_optimizer_states=1,
            dense_activations=5,
            tower_param_bytes=[100, 0],
            tower_activations=[7, 0],
            tower_output_dims=dims,
        )
        assert m.dense_bytes == (2 + 1) * (40 + [100, 0][tower])
        lookup = _fp32(G * B, sum(s.num_cols for s in plan.rank_shards(rank)))
        tower_input = _fp32(T * B, len(plan.tower_features[tower]) * N)  # step d delivers
        tower_output = _fp32(T * B, 3 * 8) if tower == 0 else 0  # a pass-through's is its input
        delivered = _fp32(B, 3 * 8 + 3 * N)  # step f, from every tower
        layers = _fp32(B, 5) + _fp32(T * B, [7, 0][tower])
        assert m.activation_bytes == 2 * (lookup + tower_input + tower_output + delivered + layers)
