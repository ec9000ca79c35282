"""One rank's SPTT dataflow (dmt.sptt.dataflow) without collectives: its checks of the tables,
inputs and tower outputs, and step a's bucketing of row-wise ids. A fake process group of 4
ranks lets one process build rank 1's view; every case here fails or returns before a
collective would run."""

from __future__ import annotations

import math
from collections.abc import Iterator

import pytest
import torch
import torch.distributed as dist
from torch.testing._internal.distributed.fake_pg import FakeStore
from torchrec.modules.embedding_configs import DataType, EmbeddingBagConfig, PoolingType
from torchrec.sparse.jagged_tensor import KeyedJaggedTensor

from dmt.sptt.dataflow import SPTTDataflow, _check_tables, _shard_table
from dmt.sptt.plan import SPTTPlan, build_plan
from dmt.sptt.process_groups import SPTTProcessGroups, create_process_groups
from dmt.sptt.topology import Topology

NAMES = ["a", "b", "c"]
ROWS = [10, 6, 8]
N = 4


def _plan(topology: Topology) -> SPTTPlan:
    """Tower 0 (ranks 0, 1) reads ``a`` (row-wise: rows 0-4 on rank 0, 5-9 on rank 1) and
    ``c`` (column-wise: columns 0-1 on rank 0, 2-3 on rank 1); tower 1 (ranks 2, 3) reads
    ``b``."""
    return build_plan(
        topology,
        NAMES,
        [[0, 2], [1]],
        embedding_dim=N,
        num_embeddings=ROWS,
        sharding_types={"a": "row_wise", "c": "column_wise"},
    )


def _tables(**changes: object) -> list[EmbeddingBagConfig]:
    tables = [
        EmbeddingBagConfig(
            name=f"t_{n}",
            feature_names=[n],
            embedding_dim=N,
            num_embeddings=r,
            pooling=PoolingType.SUM,
        )
        for n, r in zip(NAMES, ROWS)
    ]
    for field, value in changes.items():
        setattr(tables[0], field, value)
    return tables


@pytest.fixture
def rank_1() -> Iterator[SPTTProcessGroups]:
    dist.init_process_group("fake", store=FakeStore(), rank=1, world_size=4)
    try:
        yield create_process_groups(Topology(4, 2))
    finally:
        dist.destroy_process_group()


@pytest.mark.parametrize(
    ("tables", "message"),
    [
        (_tables()[:2], "got 2 tables for 3 features"),
        (
            _tables(feature_names=["b"]),
            "table 't_a' reads features ['b']; SPTT needs one table per feature, in model order "
            "(expected ['a'])",
        ),
        (_tables(num_embeddings=11), "table 't_a' is 11 x 4, the plan says 10 x 4"),
        (_tables(embedding_dim=8), "table 't_a' is 10 x 8, the plan says 10 x 4"),
        (_tables(data_type=DataType.FP16), "table 't_a' has data_type FP16; SPTT's lookup takes"),
        (
            _tables(pooling=PoolingType.MEAN),
            "row-wise table 't_a' needs SUM pooling (step d adds partial sums), got "
            "PoolingType.MEAN",
        ),
    ],
)
def test_tables_that_do_not_fit_the_plan_are_refused(
    tables: list[EmbeddingBagConfig], message: str
) -> None:
    with pytest.raises(ValueError) as error:
        _check_tables(_plan(Topology(4, 2)), tables)
    assert str(error.value).startswith(message)


def test_a_shard_keeps_the_init_range_of_its_whole_table() -> None:
    """FBGEMM's fused tables draw their initial rows from ``get_weight_init_min/max``: a shard
    of 5 of the 10 rows must draw from ``+-sqrt(1 / 10)``, not ``+-sqrt(1 / 5)``."""
    plan = _plan(Topology(4, 2))
    table, shard = _tables()[0], plan.feature_shards(0)[1]
    config = _shard_table(table, shard)
    assert (config.num_embeddings, config.embedding_dim) == (5, N)
    bound = math.sqrt(1 / 10)
    assert (config.get_weight_init_min(), config.get_weight_init_max()) == (-bound, bound)


def test_reset_tables_draws_the_column_shards_of_a_table_apart() -> None:
    """Ranks 0 and 1 hold columns 0-1 and 2-3 of ``c``, whose rows start at 0 on both: their
    streams differ (the first column is in the seed), and each is the same for the same seed."""
    weights = []
    for rank in (0, 1, 1):
        dist.init_process_group("fake", store=FakeStore(), rank=rank, world_size=4)
        try:
            groups = create_process_groups(Topology(4, 2))
        finally:
            dist.destroy_process_group()
        dataflow = SPTTDataflow(_plan(Topology(4, 2)), _tables(), groups=groups)
        dataflow.reset_tables(seed=3)
        [weight] = [w for s, w in dataflow.shard_parameters() if s.feature == 2]
        assert weight.shape == (8, 2) and weight.abs().max() <= math.sqrt(1 / 8)
        weights.append(weight.detach())
    assert not torch.equal(weights[0], weights[1]) and torch.equal(weights[1], weights[2])


def test_row_wise_ids_go_to_the_rank_of_their_row_block(rank_1: SPTTProcessGroups) -> None:
    """Step a's bucketing: rows 0-4 of ``a`` to position 0 as they are, rows 5-9 to position 1
    as ids 0-4; a bag's ids keep their order, and an id on a block's first row (5) goes to that
    block."""
    dataflow = SPTTDataflow(_plan(Topology(4, 2)), _tables(), groups=rank_1)
    ids = torch.tensor([0, 5, 4, 9, 5, 3])  # samples: [0, 5], [4], [9, 5, 3]
    jagged = KeyedJaggedTensor.from_lengths_sync(["a"], ids, torch.tensor([2, 1, 3])).to_dict()
    buckets = dataflow._bucket_row_wise(jagged)
    assert list(buckets) == [0]
    got = [(lengths.tolist(), local.tolist(), n) for lengths, local, n in buckets[0]]
    assert got == [([1, 1, 1], [0, 4, 3], 3), ([1, 0, 2], [0, 4, 0], 3)]


def _kjt(batch: int, weights: torch.Tensor | None = None) -> KeyedJaggedTensor:
    lengths = torch.ones(3 * batch, dtype=torch.int64)
    values = torch.zeros(3 * batch, dtype=torch.int64)
    return KeyedJaggedTensor.from_lengths_sync(NAMES, values, lengths, weights)


def test_inputs_and_outputs_that_do_not_fit_are_refused(rank_1: SPTTProcessGroups) -> None:
    """Each check raises before the collective the input would have gone into."""
    plan = _plan(Topology(4, 2))
    with pytest.raises(ValueError) as error:  # 2 towers of 2 ranks, 1 rank per host
        SPTTDataflow(_plan(Topology(4, 1, 2)), _tables(), groups=rank_1)
    assert str(error.value) == (
        "groups were built for Topology(world_size=4, local_world_size=2, hosts_per_tower=1), "
        "the plan for Topology(world_size=4, local_world_size=1, hosts_per_tower=2)"
    )
    with pytest.raises(ValueError, match=r"^tower_output_dims has 1 entries for 2 towers$"):
        SPTTDataflow(plan, _tables(), groups=rank_1, tower_output_dims=[(2, N)])
    dataflow = SPTTDataflow(plan, _tables(), groups=rank_1)
    with pytest.raises(ValueError, match=r"^features have keys \['a', 'b'\], the plan \['a', "):
        dataflow.start_input_dist(
            KeyedJaggedTensor.from_lengths_sync(
                ["a", "b"], torch.zeros(2, dtype=torch.int64), torch.ones(2, dtype=torch.int64)
            )
        )
    with pytest.raises(ValueError, match=r"^weighted features are not supported$"):
        dataflow.start_input_dist(_kjt(2, weights=torch.ones(6)))
    dataflow.check_received(_kjt(8), local_batch=2)  # G B = 4 * 2 samples
    with pytest.raises(ValueError) as error:
        dataflow.check_received(_kjt(6), local_batch=2)
    assert str(error.value) == (
        "rank 1: received a global batch of 6 samples, expected G*B = 8; every rank must use "
        "the same local batch size"
    )
    # tower 0 has 2 features of N columns; its module returned 3 of them
    with pytest.raises(ValueError) as error:
        dataflow.start_peer_exchange(torch.zeros(4, 3, N))
    assert str(error.value) == (
        "tower 0's module returned shape (4, 3, 4), expected (T*B, 2, 4) from tower_output_dims"
    )
    with pytest.raises(ValueError, match=r"^tower 0's module returned shape \(8, 4\), "):
        dataflow.start_peer_exchange(torch.zeros(8, 4))
    with pytest.raises(ValueError, match=r"^no weights for table 't_a' \(got \['t_b', 't_c'\]\)$"):
        dataflow.load_table_weights({"t_b": torch.zeros(6, N), "t_c": torch.zeros(8, N)})
    towers = SPTTDataflow(plan, _tables(), groups=rank_1, tower_output_dims=[(3, N), (1, N)])
    with pytest.raises(ValueError, match=r"^pooled_embeddings needs pass-through "):
        towers.pooled_embeddings(_kjt(2))


def test_the_input_permute_passes_an_empty_batch(rank_1: SPTTProcessGroups) -> None:
    """Step c on the received ids of ``G B = 0`` samples: nothing to move (a view of the
    lengths as ``(-1, 0)`` would raise)."""
    dataflow = SPTTDataflow(_plan(Topology(4, 2)), _tables(), groups=rank_1, peer_permute="input")
    assert dataflow.peer_permute_site(_kjt(8)) == "input"
    none = torch.zeros(0, dtype=torch.int64)
    empty = KeyedJaggedTensor(keys=["c", "a"], values=none, lengths=none, stride=0)
    out = dataflow.peer_permute_input(empty)
    assert out.keys() == ["c", "a"] and out.stride() == 0 and out.lengths().numel() == 0
