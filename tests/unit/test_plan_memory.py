"""Per-rank memory of a plan (:mod:`dmt.planning.memory`): the tables and optimizer state of all
ranks add up to the unsharded tables', UVM-cached shards move to host memory, and a rank that
does not fit is named with its numbers."""

from __future__ import annotations

import pytest
from torch import nn

from dmt.memory import GIB, MemoryBudget, table_bytes
from dmt.planning.memory import (
    RankMemory,
    check_fits,
    dense_activations_per_sample,
    dense_state_bytes,
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


def test_dense_state_and_activations() -> None:
    assert dense_state_bytes(100, "Adam") == 400
    assert dense_state_bytes(100, "SGD") == 200
    with pytest.raises(ValueError, match="dense optimizer 'lamb' is not one of"):
        dense_state_bytes(100, "lamb")
    mlp = nn.Sequential(nn.Linear(3, 8), nn.ReLU(), nn.Linear(8, 5))
    assert dense_activations_per_sample(mlp) == 13
    plan = _plan()
    base = sptt_rank_memory(plan, 0, local_batch=4, dense_param_bytes=0)
    more = sptt_rank_memory(plan, 0, local_batch=4, dense_param_bytes=0, dense_activations=13)
    assert more.activation_bytes - base.activation_bytes == 2 * 4 * 4 * 13


def test_a_rank_that_does_not_fit_is_named() -> None:
    ranks = [RankMemory(r, 100 * r, 10, 0, 0, 5, 1) for r in range(3)]
    assert check_fits(ranks, 216, what="sptt") == ranks[2]
    with pytest.raises(ValueError) as e:
        check_fits(ranks, 215, what="sptt")
    assert str(e.value) == (
        "sptt: rank 2 needs 216 bytes (0.00 GiB) of GPU memory, 215 bytes (0.00 GiB) are "
        "available (tables 200, optimizer state 10, UVM caches 0, dense 5, activations 1 bytes)"
    )
