"""The busiest receiver of the sparse-input all-to-alls (step a, flat input): planted asymmetry.

Under one workload every rank sends the same bytes to each destination, so a rank that holds more
tables than its peers receives more than any rank sends. The plan's summary carries that rank's
bytes, counted here by brute force (every source's sends to every rank), and the time model
times the all-to-all by it.
"""

from __future__ import annotations

import pytest

from dmt.planning.collectives import CollectiveBytes as Coll
from dmt.planning.collectives import (
    FlatShard,
    FlatTable,
    Workload,
    busiest_receiver,
    flat_collectives,
    flat_input_bytes,
    flat_lookup_rows,
    flat_rank_collectives,
    sptt_collectives,
    sptt_lookup_rows,
    step_a_ids,
)
from dmt.planning.timing import ComputeLoad, predict_step_time
from dmt.sptt.plan import build_plan
from dmt.sptt.splits import step_a_bytes_per_dst
from dmt.sptt.topology import Topology
from tests.unit.test_plan_timing import CLUSTER, _wire_ms


def _brute_force(to: list[float], hosts: Topology) -> tuple[int, int]:
    """Per receiver, the bytes every other source sends it; the receiver with the most
    cross-host bytes (ties: most bytes)."""
    received = []
    for r in hosts.world_ranks:
        intra = sum(
            to[r] for s in hosts.world_ranks if s != r and hosts.host_of(s) == hosts.host_of(r)
        )
        cross = sum(to[r] for s in hosts.world_ranks if hosts.host_of(s) != hosts.host_of(r))
        received.append((round(intra), round(cross)))
    return max(received, key=lambda x: (x[1], x[0] + x[1]))


def test_busiest_receiver_of_a_uniform_all_to_all() -> None:
    hosts = Topology(6, 2)  # hosts {0,1} {2,3} {4,5}
    to = [10.0, 70.0, 20.0, 30.0, 0.0, 5.0]
    # rank 1 gets 70 from rank 0 (its host) and from the 4 ranks of the other hosts
    assert busiest_receiver(to, hosts.world_ranks, hosts.host_of) == (70, 280)
    assert busiest_receiver(to, hosts.world_ranks, hosts.host_of) == _brute_force(to, hosts)


def test_sptt_step_a_carries_its_busiest_receiver() -> None:
    # 2 towers of one host each; tower 0 has 3 tables on its 2 ranks: one rank holds two
    topo = Topology(4, 2)
    names = [f"f{i}" for i in range(5)]
    plan = build_plan(topo, names, [[0, 1, 2], [3, 4]], embedding_dim=4, num_embeddings=[100] * 5)
    held = [len(plan.rank_shards(r)) for r in topo.world_ranks]
    assert sorted(held[:2]) == [1, 2] and held[2:] == [1, 1]
    workload = Workload.uniform(16, 5)
    to = step_a_bytes_per_dst(plan, 16, step_a_ids(plan, workload), length_size=4, id_size=8)
    (a,) = [c for c in sptt_collectives(plan, workload) if c.step == "a"]
    assert (a.received_intra_host_bytes, a.received_cross_host_bytes) == _brute_force(to, topo)
    # one feature is 16 lengths x 4 B + 16 ids x 8 B = 192 B. The busiest sender sends 3
    # features to the other host; the rank with two tables receives 2 from each of 2 ranks there
    assert a.cross_host_bytes == 3 * 192
    assert a.received_cross_host_bytes == 4 * 192
    # every other step: no receiver side
    assert all(
        c.received_intra_host_bytes == c.received_cross_host_bytes == 0
        for c in sptt_collectives(plan, workload)
        if c.step != "a"
    )


def test_step_a_bytes_count_lengths_and_ids_at_their_own_sizes() -> None:
    """Each destination gets, for every shard it holds, ``B`` lengths of 4 bytes and that
    shard's ids of 8 bytes (``10 (f + 1)`` ids for feature ``f``, not ``B``, so that the two
    sizes cannot be swapped unnoticed); counted here feature by feature."""
    topo = Topology(4, 2)
    names = [f"f{i}" for i in range(5)]
    plan = build_plan(topo, names, [[0, 1, 2], [3, 4]], embedding_dim=4, num_embeddings=[100] * 5)
    expected = [0] * topo.world_size
    for f in range(5):
        for shard in plan.feature_shards(f):
            expected[shard.rank] += 16 * 4 + 10 * (f + 1) * 8
    to = step_a_bytes_per_dst(plan, 16, lambda s: 10 * (s.feature + 1), length_size=4, id_size=8)
    assert to == expected


def test_flat_input_carries_its_busiest_receiver() -> None:
    # table-wise: rank 0 holds 3 of the 4 tables; 2 hosts of 2 ranks
    hosts = Topology(4, 2)
    tables = [
        FlatTable(f"t{i}", i, f"f{i}", 100, 8, "table_wise", (FlatShard(rank, 0, 100, 0, 8),))
        for i, rank in enumerate([0, 0, 0, 3])
    ]
    workload = Workload.uniform(16, 4)
    to = flat_input_bytes(tables, 4, workload)["table_wise"]
    (a,) = [c for c in flat_collectives(tables, hosts, workload) if c.step == "flat_input_a2a"]
    assert (a.received_intra_host_bytes, a.received_cross_host_bytes) == _brute_force(to, hosts)
    assert a.cross_host_bytes == 3 * 192  # a rank of host 1 sends rank 0's three features
    assert a.received_cross_host_bytes == 2 * 3 * 192  # rank 0 gets them from both


def test_the_time_model_times_step_a_by_its_busiest_receiver() -> None:
    topo = Topology(4, 2)
    names = [f"f{i}" for i in range(5)]
    plan = build_plan(topo, names, [[0, 1, 2], [3, 4]], embedding_dim=4, num_embeddings=[100] * 5)
    (a,) = [c for c in sptt_collectives(plan, Workload.uniform(16, 5)) if c.step == "a"]
    t = predict_step_time("sptt", [a], ComputeLoad(0.0), 16, CLUSTER, pipelined=False)
    wire = _wire_ms(
        type(a)(
            "a", "all_to_all", "world", "forward", 4,
            a.received_intra_host_bytes, a.received_cross_host_bytes, True,
        )
    )  # fmt: skip
    assert t.collectives[0].time_ms == pytest.approx(wire)
    assert t.collectives[0].time_ms > _wire_ms(a)  # the sender's bytes alone: less


def test_flat_input_of_several_sharding_types_is_their_sum() -> None:
    # a table-wise table on rank 0 and a row-wise one in 4 blocks of 25 rows, 2 hosts of 2 ranks:
    # every source sends rank 0 192 + 96 B and every other rank 96 B (16 lengths x 4 B + 4 ids x 8 B)
    hosts = Topology(4, 2)
    tables = [
        FlatTable("t0", 0, "f0", 100, 8, "table_wise", (FlatShard(0, 0, 100, 0, 8),)),
        FlatTable(
            "t1", 1, "f1", 100, 8, "row_wise",
            tuple(FlatShard(r, 25 * r, 25 * (r + 1), 0, 8) for r in range(4)),
        ),
    ]  # fmt: skip
    workload = Workload.uniform(16, 2)
    for rank, sent in ((0, (96, 192)), (3, (96, 384))):
        inputs = [
            c
            for c in flat_rank_collectives(tables, hosts, rank, workload)
            if c.step == "flat_input_a2a"
        ]
        assert [(c.intra_host_bytes, c.cross_host_bytes) for c in inputs] == [sent]
    (a,) = [c for c in flat_collectives(tables, hosts, workload) if c.step == "flat_input_a2a"]
    assert (a.intra_host_bytes, a.cross_host_bytes) == (96, 384)  # ranks 2 and 3
    assert (a.received_intra_host_bytes, a.received_cross_host_bytes) == (288, 576)  # rank 0


def test_each_link_class_takes_the_larger_of_sender_and_receiver() -> None:
    # more sent across hosts, more received inside the host: each class's maximum counts, so the
    # time is the sender's here (timing the receiver's bytes alone would be 10x shorter)
    a = Coll("a", "all_to_all", "world", "forward", 4, 0, 1_000_000, True, 500_000, 100_000)
    t = predict_step_time("sptt", [a], ComputeLoad(0.0), 16, CLUSTER, pipelined=False)
    both = Coll("a", "all_to_all", "world", "forward", 4, 500_000, 1_000_000, True)
    received = Coll("a", "all_to_all", "world", "forward", 4, 500_000, 100_000, True)
    assert t.collectives[0].time_ms == pytest.approx(_wire_ms(both))
    assert t.collectives[0].time_ms > 5 * _wire_ms(received)


def test_a_busiest_receiver_on_the_host_bounds_the_intra_host_link() -> None:
    # the intra-host link alone: the receiver's 100 MB, not the sender's 1 kB, time it
    a = Coll("a", "all_to_all", "world", "forward", 4, 1_000, 0, True, 100_000_000, 0)
    t = predict_step_time("sptt", [a], ComputeLoad(0.0), 16, CLUSTER, pipelined=False)
    received = Coll("a", "all_to_all", "world", "forward", 4, 100_000_000, 0, True)
    assert t.collectives[0].time_ms == pytest.approx(_wire_ms(received))
    assert t.collectives[0].time_ms > 100 * _wire_ms(a)


# -- the lookups of the busiest rank (a reproduced bug: dmt-plan charged every rank the average,
# F ids per sample, 26 where a rank holding one table of 64 GPUs' batches looks up 64) --------


def test_sptt_lookup_rows_of_each_rank() -> None:
    # tower 0: 3 tables on 2 ranks (one rank holds two); tower 1: a row-wise table in 2 blocks
    # of 60 and 40 rows, and a column-wise one in 2 halves; 4 ranks, local batch 16, 2 ids each
    topo = Topology(4, 2)
    names = [f"f{i}" for i in range(5)]
    plan = build_plan(
        topo, names, [[0, 1, 2], [3, 4]], embedding_dim=4, num_embeddings=[100] * 5,
        sharding_types={"f3": "row_wise", "f4": "column_wise"},
    )  # fmt: skip
    workload = Workload.uniform(16, 5, ids_per_sample=2)
    rows = sptt_lookup_rows(plan, workload)
    per_table = 4 * 16 * 2  # the ids of 4 local batches
    tower0 = sorted(len(plan.rank_shards(r)) * per_table for r in (0, 1))
    assert sorted(rows[:2]) == tower0 == [per_table, 2 * per_table]
    blocks = [
        s.row_stop - s.row_start for r in (2, 3) for s in plan.rank_shards(r) if s.feature == 3
    ]
    halves = [s.num_cols for r in (2, 3) for s in plan.rank_shards(r) if s.feature == 4]
    assert halves == [2, 2] and sum(blocks) == 100
    assert rows[2:] == pytest.approx(
        [per_table * (b / 100 + c / 4) for b, c in zip(blocks, halves, strict=True)]
    )
    assert sum(rows) == pytest.approx(5 * per_table)  # every id looked up once


def test_flat_lookup_rows_of_each_rank() -> None:
    # table-wise t0, t1 on rank 0; t2 column-wise on ranks 1 (6 of 8 columns) and 2 (2); t3
    # row-wise in blocks of 25 rows on every rank; t4 data-parallel
    tables = [
        FlatTable("t0", 0, "f0", 100, 8, "table_wise", (FlatShard(0, 0, 100, 0, 8),)),
        FlatTable("t1", 1, "f1", 100, 8, "table_wise", (FlatShard(0, 0, 100, 0, 8),)),
        FlatTable("t2", 2, "f2", 100, 8, "column_wise",
                  (FlatShard(1, 0, 100, 0, 6), FlatShard(2, 0, 100, 6, 8))),
        FlatTable("t3", 3, "f3", 100, 8, "row_wise",
                  tuple(FlatShard(r, 25 * r, 25 * r + 25, 0, 8) for r in range(4))),
        FlatTable("t4", 4, "f4", 100, 8, "data_parallel", ()),
    ]  # fmt: skip
    B = 16
    rows = flat_lookup_rows(tables, 4, Workload.uniform(B, 5))
    G = 4
    assert rows == pytest.approx(
        [2 * G * B + G * B / 4 + B, 0.75 * G * B + G * B / 4 + B,
         0.25 * G * B + G * B / 4 + B, G * B / 4 + B]
    )  # fmt: skip
