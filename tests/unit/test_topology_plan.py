"""Table sharding and feature layouts of SPTT (dmt.sptt.plan), pure."""

from __future__ import annotations

import random

import pytest

from dmt.sptt.plan import SHARDING_KINDS, SPTTPlan, TableShard, build_plan
from dmt.sptt.splits import (
    ColumnBlock,
    ring_allreduce_bytes,
    step_d_reduce_scatter_block,
    step_d_split_sizes,
    step_e_blocks,
    step_f_split_sizes,
)
from dmt.sptt.topology import Topology


def _names(num_features: int) -> list[str]:
    return [f"cat_{f}" for f in range(num_features)]


def _random_partition(num_features: int, num_towers: int, rng: random.Random) -> list[list[int]]:
    features = list(range(num_features))
    rng.shuffle(features)
    towers: list[list[int]] = [[f] for f in features[:num_towers]]
    for f in features[num_towers:]:
        towers[rng.randrange(num_towers)].append(f)
    return towers


def _plan(
    topo: Topology,
    towers: list[list[int]],
    *,
    dim: int = 4,
    rows: list[int] | None = None,
    kinds: dict[str, str] | None = None,
    costs: list[float] | None = None,
) -> SPTTPlan:
    num_features = sum(len(t) for t in towers)
    return build_plan(
        topo,
        _names(num_features),
        towers,
        embedding_dim=dim,
        num_embeddings=rows or [100] * num_features,
        sharding_types=kinds,
        costs=costs,
    )


@pytest.mark.parametrize(
    ("world_size", "local_world_size", "hosts_per_tower", "num_features"),
    [(2, 2, 1, 3), (4, 2, 1, 26), (8, 2, 2, 13), (16, 8, 1, 26), (64, 8, 2, 26), (512, 8, 1, 200)],
)
def test_layouts(
    world_size: int, local_world_size: int, hosts_per_tower: int, num_features: int
) -> None:
    topo = Topology(world_size, local_world_size, hosts_per_tower)
    rng = random.Random(world_size + num_features)
    towers = _random_partition(num_features, topo.num_towers, rng)
    names = _names(num_features)
    kinds = {names[f]: rng.choice(SHARDING_KINDS) for f in range(num_features)}
    dim = 8
    rows = [rng.randint(topo.tower_size, 1000) for _ in range(num_features)]
    costs = [float(rng.randint(1, 100)) for _ in range(num_features)]
    plan = _plan(topo, towers, dim=dim, rows=rows, kinds=kinds, costs=costs)

    # every shard on a rank of its feature's tower; shards tile their table
    for t, tower in enumerate(towers):
        for f in tower:
            assert plan.tower_of_feature(f) == t
            shards = plan.feature_shards(f)
            assert all(topo.tower_of(s.rank) == t for s in shards)
            assert sum(s.num_rows * s.num_cols for s in shards) == rows[f] * dim
            if plan.sharding_types[f] == "row_wise":
                assert [s.rank for s in shards] == list(topo.tower_ranks(t))
    held = [s for r in range(world_size) for s in plan.rank_shards(r)]
    assert sorted(held, key=lambda s: (s.feature, s.rank)) == sorted(
        plan.shards, key=lambda s: (s.feature, s.rank)
    )
    assert plan.input_splits == tuple(len(plan.rank_shards(r)) for r in range(world_size))

    # step e: the column index reads every (feature, column) of the tower once
    for t, tower in enumerate(towers):
        index = plan.tower_column_index(t)
        width = sum(plan.all_to_all_width(q) for q in topo.tower_ranks(t))
        width += len(plan.row_wise_features(t)) * dim
        assert sorted(index) == list(range(width)) and len(index) == len(tower) * dim
        for r in topo.tower_ranks(t):
            kinds_in_order = [plan.is_row_wise(s.feature) for s in plan.rank_shards(r)]
            assert kinds_in_order == sorted(kinds_in_order)  # row-wise shards last
            # step b's pooled width: the a2a columns, then N per row-wise feature of the tower
            assert (
                plan.lookup_width(r)
                == plan.all_to_all_width(r) + len(plan.row_wise_features(t)) * dim
            )

    by_tower = [f for tower in towers for f in tower]
    assert [by_tower[i] for i in plan.output_permutation] == list(range(num_features))

    # step e as blocks: what the column index reads, block by block, and every column once
    for r in range(world_size):
        t = topo.tower_of(r)
        index = plan.tower_column_index(t)
        blocks = step_e_blocks(plan, r)
        mates = [plan.all_to_all_width(q) for q in topo.tower_ranks(t)]
        glued = 0  # the blocks' first column in the received row glued side by side
        for b in blocks:
            offset = 0 if b.source == 0 else sum(mates)
            assert [index[j] for j in b.dest] == list(
                range(offset + b.start, offset + b.start + len(b.dest))
            )
            assert offset + b.start >= glued  # in received order
            glued = offset + b.start + len(b.dest)
        assert sorted(j for b in blocks for j in b.dest) == list(range(len(index)))
        assert {b.source for b in blocks} <= ({0, 1} if plan.row_wise_features(t) else {0})


def test_greedy_balances_costs() -> None:
    topo = Topology(world_size=4, local_world_size=4)
    costs = [10.0, 9.0, 8.0, 1.0, 1.0, 1.0]
    plan = _plan(topo, [[0, 1, 2, 3, 4, 5]], costs=costs)
    loads = [0.0] * 4
    for s in plan.shards:
        loads[s.rank] += costs[s.feature]
    assert sorted(loads) == [3, 8, 9, 10]


def test_table_wise_round_robin_and_empty_ranks() -> None:
    topo = Topology(world_size=4, local_world_size=2)  # towers (0, 1), (2, 3)
    plan = _plan(topo, [[0, 2, 3], [1]])
    assert [plan.feature_shards(f)[0].rank for f in range(4)] == [0, 2, 1, 0]
    assert [s.feature for s in plan.rank_shards(0)] == [0, 3]
    assert plan.rank_shards(3) == ()
    assert plan.input_splits == (2, 1, 1, 0)
    # received columns: rank 0's features 0, 3 then rank 1's feature 2; tower order 0, 2, 3
    assert plan.tower_column_index(0) == (0, 1, 2, 3, 8, 9, 10, 11, 4, 5, 6, 7)
    # step e: rank 0's block fills tower columns 0-3 (feature 0) and 8-11 (feature 3)
    assert step_e_blocks(plan, 0) == (
        ColumnBlock(0, 0, (0, 1, 2, 3, 8, 9, 10, 11)),
        ColumnBlock(0, 8, (4, 5, 6, 7)),
    )
    assert step_e_blocks(plan, 1) == step_e_blocks(plan, 0)  # a tower's ranks see one layout
    # rank 3 holds nothing: tower 1 has one block, rank 2's (no empty one for rank 3)
    assert step_e_blocks(plan, 2) == (ColumnBlock(0, 0, (0, 1, 2, 3)),)


def test_equal_costs_go_in_tower_order() -> None:
    topo = Topology(world_size=2, local_world_size=2)
    plan = _plan(topo, [[2, 0, 1]])
    # cat_2 to position 0, cat_0 to 1, cat_1 to 0 (the model order would give 0, 1, 0)
    assert [plan.feature_shards(f)[0].rank for f in range(3)] == [1, 0, 0]


def test_a_rank_looks_up_its_tables_in_tower_order() -> None:
    """Tower order, not model order: a tower on one rank then needs no reordering in step e (one
    block whose columns are already the tower's: one copy)."""
    plan = _plan(Topology(world_size=1, local_world_size=1), [[2, 0, 1]], dim=2)
    assert [s.feature for s in plan.rank_shards(0)] == [2, 0, 1]
    assert step_e_blocks(plan, 0) == (ColumnBlock(0, 0, (0, 1, 2, 3, 4, 5)),)


def test_row_wise_columns_are_read_in_lookup_order() -> None:
    """Tower [2, 0, 1]: cat_0 table-wise (on rank 0, the loads tie), cat_2 and cat_1 row-wise.
    Both ranks look up, and the reduce-scatter sums, the row-wise features in tower order (2, 1)
    after the table-wise one, so step d delivers [cat_0 | cat_2, cat_1] and the tower order
    reads cat_2 from columns 2-3, cat_0 from 0-1, cat_1 from 4-5."""
    topo = Topology(world_size=2, local_world_size=2)
    plan = _plan(topo, [[2, 0, 1]], dim=2, kinds={"cat_2": "row_wise", "cat_1": "row_wise"})
    assert [s.feature for s in plan.rank_shards(0)] == [0, 2, 1]
    assert [s.feature for s in plan.rank_shards(1)] == [2, 1]
    assert plan.row_wise_features(0) == (2, 1)
    assert plan.tower_column_index(0) == (2, 3, 0, 1, 4, 5)


def test_column_and_row_wise_shards() -> None:
    topo = Topology(world_size=4, local_world_size=2)
    plan = _plan(
        topo,
        [[0, 1], [2, 3]],
        dim=5,
        rows=[10, 11, 12, 13],
        kinds={"cat_0": "column_wise", "cat_3": "row_wise"},
    )
    assert [(s.rank, s.col_start, s.col_stop) for s in plan.feature_shards(0)] == [
        (0, 0, 3),
        (1, 3, 5),
    ]
    assert [(s.rank, s.row_start, s.row_stop) for s in plan.feature_shards(3)] == [
        (2, 0, 7),
        (3, 7, 13),
    ]
    assert plan.row_wise_features(1) == (3,)
    # table 2 goes to rank 3, less loaded by the row split (6 of 13 rows); table-wise shards
    # come first in lookup order
    assert [s.feature for s in plan.rank_shards(3)] == [2, 3]
    assert [s.feature for s in plan.rank_shards(2)] == [3]
    assert plan.all_to_all_width(2) == 0 and plan.all_to_all_width(3) == 5


def test_column_blocks_start_at_the_least_loaded_position() -> None:
    # cat_0's 3 rows split 2 + 1: position 1 is less loaded, so cat_1's first block goes there
    # and its second wraps around to position 0
    topo = Topology(world_size=2, local_world_size=2)
    kinds = {"cat_0": "row_wise", "cat_1": "column_wise"}
    plan = _plan(topo, [[0, 1]], rows=[3, 10], kinds=kinds)
    assert [(s.rank, s.col_start, s.col_stop) for s in plan.feature_shards(1)] == [
        (0, 2, 4),
        (1, 0, 2),
    ]


def test_column_blocks_load_their_share_of_the_cost() -> None:
    # N = 4 on 3 ranks: blocks of 2, 1, 1 columns load 1/2, 1/4, 1/4 of cat_0's cost 1, so
    # cat_1 (cost 1) goes to position 1, the least loaded (a block loading the whole cost, or
    # nothing, would leave a tie that position 0 wins)
    topo = Topology(world_size=3, local_world_size=3)
    plan = _plan(topo, [[0, 1]], kinds={"cat_0": "column_wise"})
    assert [(s.rank, s.col_start, s.col_stop) for s in plan.feature_shards(0)] == [
        (0, 0, 2),
        (1, 2, 3),
        (2, 3, 4),
    ]
    assert plan.feature_shards(1)[0].rank == 1


@pytest.mark.parametrize(
    ("towers", "shards", "match"),
    [
        ([[0, 1]], [(0, 0, 0, 4), (1, 0, 0, 4)], "towers"),
        ([[0, 1], [1]], [(0, 0, 0, 4), (1, 1, 0, 4)], "partition"),
        ([[0, 1], []], [(0, 0, 0, 4), (1, 0, 0, 4)], "at least one feature"),
        ([[0], [1]], [(0, 0, 0, 4), (1, 0, 0, 4)], "not in its tower"),
        ([[0], [1]], [(0, 0, 0, 4)], "no shard"),
        ([[0], [1]], [(0, 0, 0, 4), (1, 1, 0, 3)], "whole table"),
        ([[0], [1]], [(0, 0, 0, 4), (1, 1, 0, 4), (5, 1, 0, 4)], "outside"),
    ],
)
def test_plan_validation(
    towers: list[list[int]], shards: list[tuple[int, int, int, int]], match: str
) -> None:
    topo = Topology(world_size=2, local_world_size=1)
    with pytest.raises(ValueError, match=match):
        SPTTPlan(
            topo,
            ("a", "b"),
            tuple(tuple(t) for t in towers),
            embedding_dim=4,
            num_embeddings=(10, 10),
            sharding_types=("table_wise", "table_wise"),
            shards=tuple(TableShard(f, r, 0, 10, c0, c1) for f, r, c0, c1 in shards),
        )


def test_sharding_validation() -> None:
    topo = Topology(world_size=2, local_world_size=2)
    names = ("a",)
    with pytest.raises(ValueError, match="tiling"):  # column gap
        SPTTPlan(
            topo,
            names,
            ((0,),),
            4,
            (10,),
            ("column_wise",),
            (TableShard(0, 0, 0, 10, 0, 2), TableShard(0, 1, 0, 10, 3, 4)),
        )
    with pytest.raises(ValueError, match="two shards on one rank"):
        SPTTPlan(
            topo,
            names,
            ((0,),),
            4,
            (10,),
            ("column_wise",),
            (TableShard(0, 0, 0, 10, 0, 2), TableShard(0, 0, 0, 10, 2, 4)),
        )
    with pytest.raises(ValueError, match="every rank of its tower"):
        SPTTPlan(topo, names, ((0,),), 4, (10,), ("row_wise",), (TableShard(0, 0, 0, 10, 0, 4),))
    with pytest.raises(ValueError, match="fewer than"):
        _plan(topo, [[0]], rows=[1], kinds={"cat_0": "row_wise"})


def test_build_plan_argument_errors() -> None:
    topo = Topology(world_size=2, local_world_size=1)
    with pytest.raises(ValueError, match="duplicates"):
        build_plan(topo, ["a", "a"], [[0], [1]], embedding_dim=4, num_embeddings=[5, 5])
    with pytest.raises(ValueError, match="costs"):
        build_plan(topo, ["a", "b"], [[0], [1]], embedding_dim=4, num_embeddings=[5, 5], costs=[1])
    with pytest.raises(ValueError, match="towers"):
        build_plan(topo, ["a", "b"], [[0, 1]], embedding_dim=4, num_embeddings=[5, 5])
    with pytest.raises(ValueError, match="unknown feature"):
        _plan(topo, [[0], [1]], kinds={"z": "row_wise"})
    with pytest.raises(ValueError, match="not one of"):
        _plan(topo, [[0], [1]], kinds={"cat_0": "data_parallel"})
    with pytest.raises(ValueError, match=r"tower 1 has feature indices outside range\(2\)"):
        _plan(topo, [[0], [2]])
    # sizes are checked before the row and column blocks divide by them
    one_tower = Topology(world_size=2, local_world_size=2)
    with pytest.raises(ValueError, match=r"need 1 positive num_embeddings, got \[0\]"):
        build_plan(
            one_tower, ["a"], [[0]], embedding_dim=4, num_embeddings=[0],
            sharding_types={"a": "row_wise"},
        )  # fmt: skip
    with pytest.raises(ValueError, match="embedding_dim must be positive, got 0"):
        build_plan(
            one_tower, ["a"], [[0]], embedding_dim=0, num_embeddings=[5],
            sharding_types={"a": "column_wise"},
        )  # fmt: skip


def test_column_multiple_aligns_column_blocks() -> None:
    """FBGEMM kernels need shard widths that are multiples of 4: N=12 on 4 tower ranks gives
    three blocks of 4, not four blocks of 3."""
    topo = Topology(4, 4)
    plan = build_plan(
        topo,
        _names(2),
        [[0, 1]],
        embedding_dim=12,
        num_embeddings=[10, 10],
        sharding_types={"cat_0": "column_wise"},
        column_multiple=4,
    )
    widths = sorted((s.col_start, s.col_stop) for s in plan.feature_shards(0))
    assert widths == [(0, 4), (4, 8), (8, 12)]
    with pytest.raises(ValueError, match="divide embedding_dim"):
        build_plan(topo, _names(1), [[0]], embedding_dim=6, num_embeddings=[10], column_multiple=4)
    with pytest.raises(ValueError, match="column_multiple=0 must be positive"):
        build_plan(topo, _names(1), [[0]], embedding_dim=6, num_embeddings=[10], column_multiple=0)


@pytest.mark.parametrize(
    ("world_size", "local_world_size", "hosts_per_tower"),
    [(4, 2, 1), (8, 2, 2), (16, 4, 1), (24, 2, 3)],
)
def test_step_d_and_f_splits_conserve_elements(
    world_size: int, local_world_size: int, hosts_per_tower: int
) -> None:
    """What every rank sends in steps d and f is what its destination receives from it, and step
    d delivers each rank the ``T B F_t N`` elements step e reads (all-to-all plus reduce-scatter
    block); step f delivers ``B sum_u V_u D_u``."""
    topo = Topology(world_size, local_world_size, hosts_per_tower)
    rng = random.Random(world_size)
    F, dim, B = 3 * topo.num_towers + 2, 8, 5
    towers = _random_partition(F, topo.num_towers, rng)
    names = _names(F)
    kinds = {names[f]: rng.choice(SHARDING_KINDS) for f in range(F)}
    plan = _plan(topo, towers, dim=dim, rows=[1000] * F, kinds=kinds)
    T, KL, TB = topo.num_towers, topo.tower_size, topo.num_towers * B
    for t in range(T):
        mates = topo.tower_ranks(t)
        splits = {r: step_d_split_sizes(plan, r, TB) for r in mates}
        for i, r in enumerate(mates):
            received, sent = splits[r]
            assert len(received) == len(sent) == KL
            assert sent == [TB * plan.all_to_all_width(r)] * KL
            assert [splits[q][1][i] for q in mates] == received  # q sends r what r receives
            block = step_d_reduce_scatter_block(plan, r, TB)
            assert sum(received) + block == TB * len(towers[t]) * dim
            assert block == TB * len(plan.row_wise_features(t)) * dim
    dims = [(rng.randint(1, 4), rng.randint(5, 9)) for _ in range(T)]
    for p in range(KL):
        peers = topo.peer_group(p)
        f_splits = [step_f_split_sizes(dims, t, B) for t in range(T)]
        for t in range(T):
            received, sent = f_splits[t]
            assert sent == [B * dims[t][0] * dims[t][1]] * T
            assert [f_splits[u][1][t] for u in range(T)] == received
            assert sum(received) == B * sum(v * d for v, d in dims)
        assert len(peers) == T


@pytest.mark.parametrize(
    ("nbytes", "group_size"),
    [(1000, 1), (1000, 2), (1200, 4), (64, 8), (1000, 3), (10, 4), (7, 8)],
)
def test_ring_allreduce_bytes_simulated(nbytes: int, group_size: int) -> None:
    """A ring all-reduce (reduce-scatter then all-gather, ``n - 1`` steps each) of ``nbytes``
    split in ``n`` near-equal chunks: at step ``s`` rank ``k`` sends its successor chunk
    ``k - s`` (reduce-scatter), then chunk ``k + 1 - s`` (all-gather). Uneven chunks: ranks send
    different bytes; the count is their mean, rounded down."""
    n = group_size
    q, r = divmod(nbytes, n)
    chunk = [q + (1 if c < r else 0) for c in range(n)]
    sent = [
        sum(chunk[(k - s) % n] + chunk[(k + 1 - s) % n] for s in range(n - 1)) for k in range(n)
    ]
    assert ring_allreduce_bytes(nbytes, group_size) == sum(sent) // n


def _one_tower_plan(**fields: object) -> SPTTPlan:
    """Features ``a`` (on rank 0) and ``b`` (on rank 1) of one tower of two ranks, 10 x 4
    tables, table-wise, with ``fields`` replaced."""
    plan: dict[str, object] = {
        "topology": Topology(world_size=2, local_world_size=2),
        "feature_names": ("a", "b"),
        "tower_features": ((0, 1),),
        "embedding_dim": 4,
        "num_embeddings": (10, 10),
        "sharding_types": ("table_wise", "table_wise"),
        "shards": (TableShard(0, 0, 0, 10, 0, 4), TableShard(1, 1, 0, 10, 0, 4)),
    }
    return SPTTPlan(**{**plan, **fields})  # type: ignore[arg-type]


_B = TableShard(1, 1, 0, 10, 0, 4)  # feature b, table-wise on rank 1
_COLUMN_WISE = ("column_wise", "table_wise")
_ROW_WISE = ("row_wise", "table_wise")


@pytest.mark.parametrize(
    ("fields", "match"),
    [
        ({"embedding_dim": 0}, "embedding_dim must be positive, got 0"),
        ({"num_embeddings": (10, 0)}, r"need 2 positive num_embeddings, got \[10, 0\]"),
        ({"num_embeddings": (10, 10, 10)}, r"need 2 positive num_embeddings"),
        ({"sharding_types": ("table_wise", "data_parallel")}, "need 2 sharding_types out of"),
        ({"sharding_types": ("table_wise",) * 3}, "need 2 sharding_types out of"),
        (
            {"shards": (TableShard(0, 0, 0, 10, 0, 4), _B, TableShard(2, 1, 0, 10, 0, 4))},
            r"outside range\(2\)",
        ),
        ({"sparse_optimizer": "lamb"}, "sparse_optimizer 'lamb' is not one of"),
        # table-wise: one shard, all rows and columns
        (
            {"shards": (TableShard(0, 0, 0, 10, 0, 4), TableShard(0, 1, 0, 10, 0, 4), _B)},
            "'a' .*needs one shard of the whole table",
        ),
        (
            {"shards": (TableShard(0, 0, 0, 9, 0, 4), _B)},
            "'a' .*needs one shard of the whole table",
        ),
        # column-wise: all rows, column blocks tiling [0, N), none empty, none overlapping
        (
            {
                "sharding_types": _COLUMN_WISE,
                "shards": (TableShard(0, 0, 0, 9, 0, 2), TableShard(0, 1, 0, 10, 2, 4), _B),
            },
            r"'a' \(column_wise, tower 0\) needs all rows and columns tiling \[0, 4\)",
        ),
        (
            {
                "sharding_types": _COLUMN_WISE,
                "shards": (TableShard(0, 0, 0, 10, 0, 3), TableShard(0, 1, 0, 10, 2, 4), _B),
            },
            r"'a' \(column_wise, tower 0\) needs all rows and columns tiling",
        ),
        (
            {
                "sharding_types": _COLUMN_WISE,
                "shards": (TableShard(0, 0, 0, 10, 0, 4), TableShard(0, 1, 0, 10, 4, 4), _B),
            },
            r"'a' \(column_wise, tower 0\) needs all rows and columns tiling",
        ),
        (
            {
                "sharding_types": _COLUMN_WISE,
                "shards": (TableShard(0, 0, 0, 10, 0, 2), TableShard(0, 1, 0, 10, 2, 5), _B),
            },
            r"'a' \(column_wise, tower 0\) needs all rows and columns tiling",
        ),
        # row-wise: all columns, one row block per rank by position, tiling [0, rows)
        (
            {
                "sharding_types": _ROW_WISE,
                "shards": (TableShard(0, 0, 0, 5, 0, 4), TableShard(0, 1, 5, 10, 0, 3), _B),
            },
            r"'a' \(row_wise, tower 0\) needs one row block on every rank",
        ),
        (
            {
                "sharding_types": _ROW_WISE,
                "shards": (TableShard(0, 0, 0, 5, 0, 4), TableShard(0, 1, 6, 10, 0, 4), _B),
            },
            r"'a' \(row_wise, tower 0\) needs one row block on every rank",
        ),
        (
            {
                "sharding_types": _ROW_WISE,
                "shards": (TableShard(0, 0, 0, 5, 0, 4), TableShard(0, 1, 4, 10, 0, 4), _B),
            },
            r"'a' \(row_wise, tower 0\) needs one row block on every rank",
        ),
        (
            {
                "sharding_types": _ROW_WISE,
                "shards": (TableShard(0, 0, 0, 10, 0, 4), TableShard(0, 1, 10, 10, 0, 4), _B),
            },
            r"'a' \(row_wise, tower 0\) needs one row block on every rank",
        ),
        # the dataflow sends id i to the rank whose row block holds it, blocks by position
        (
            {
                "sharding_types": _ROW_WISE,
                "shards": (TableShard(0, 0, 5, 10, 0, 4), TableShard(0, 1, 0, 5, 0, 4), _B),
            },
            r"'a' \(row_wise, tower 0\) needs one row block on every rank of its tower, by position",
        ),
    ],
)
def test_hand_made_plan_validation(fields: dict[str, object], match: str) -> None:
    with pytest.raises(ValueError, match=match):
        _one_tower_plan(**fields)


def test_hand_made_plan_of_every_kind_is_accepted() -> None:
    plan = _one_tower_plan(
        sharding_types=("row_wise", "column_wise"),
        shards=(
            TableShard(0, 0, 0, 5, 0, 4),
            TableShard(0, 1, 5, 10, 0, 4),
            TableShard(1, 1, 0, 10, 0, 1),
            TableShard(1, 0, 0, 10, 1, 4),
        ),
    )
    assert [s.row_start for s in plan.feature_shards(0)] == [0, 5]
