"""What shard_dmt / DMTSharder reject, before any collective (no process group exists here)."""

from __future__ import annotations

import pytest
import torch
import torch.distributed as dist
from torchrec.modules.embedding_configs import DataType
from torchrec.sparse.jagged_tensor import KeyedJaggedTensor

from dmt.config import (
    DLRMTowerConfig,
    DotInteractionConfig,
    ModelConfig,
    OptimConfig,
    PartitionConfig,
    PassThroughTowerConfig,
)
from dmt.models import build_dmt_model
from dmt.runtime import Runtime
from dmt.sptt.dmt_sharding import (
    DMTSharder,
    _pad_batch,
    check_dense_device,
    check_dmt_model,
    shard_dmt,
    topology_from,
)
from dmt.sptt.topology import Topology

NAMES = [f"cat_{i}" for i in range(6)]


def _model(partition: list[list[str]], *, dim: int = 8, tower: str = "dlrm"):
    cfg = ModelConfig(
        name="dlrm",
        interaction=DotInteractionConfig(),
        embedding_dim=dim,
        bottom_mlp=[4, dim if tower == "passthrough" else 2],
        top_mlp=[4, 1],
        tower=PassThroughTowerConfig()
        if tower == "passthrough"
        else DLRMTowerConfig(dim=2, c=1, p=0),
        partition=PartitionConfig(kind="explicit"),
    )
    return build_dmt_model(cfg, partition, feature_names=NAMES, cardinalities=[10] * 6, num_dense=3)


def _runtime(world_size: int, local_world_size: int = 2) -> Runtime:
    return Runtime(0, world_size, 0, local_world_size, torch.device("cpu"), "gloo")


TWO_TOWERS = [["cat_0", "cat_2", "cat_4"], ["cat_1", "cat_3", "cat_5"]]


def test_accepts_a_matching_model() -> None:
    model = _model(TWO_TOWERS)
    check_dmt_model(model, Topology(4, 2))
    plan = DMTSharder(Topology(4, 2)).plan(model)
    assert plan.tower_features == ((0, 2, 4), (1, 3, 5))


def test_world_size_not_divisible_by_hosts_per_tower_times_ranks_per_host() -> None:
    with pytest.raises(ValueError, match="multiple of K\\*L"):
        topology_from(_runtime(6), hosts_per_tower=2)  # 3 hosts of 2 ranks, towers of 2 hosts
    with pytest.raises(ValueError, match="multiple of local_world_size"):
        topology_from(_runtime(6), local_world_size=4)
    assert topology_from(_runtime(8), hosts_per_tower=2).num_towers == 2


@pytest.mark.parametrize(
    ("world_size", "hosts_per_tower", "match"),
    [
        (8, 1, "partition has 2 towers but the topology has T=4"),  # the model has fewer towers
        (2, 1, "partition has 2 towers but the topology has T=1"),  # the model has more towers
        (8, 4, "partition has 2 towers but the topology has T=1"),
    ],
)
def test_tower_count_must_match_the_topology(world_size: int, hosts_per_tower: int, match: str):
    with pytest.raises(ValueError, match=match):
        check_dmt_model(_model(TWO_TOWERS), Topology(world_size, 2, hosts_per_tower))


@pytest.mark.parametrize(
    ("partition", "match"),
    [
        ([["cat_0", "cat_2"], ["cat_1", "cat_3", "cat_5"]], r"in no tower \['cat_4'\]"),
        ([["cat_0", "cat_2", "cat_4", "cat_1"], ["cat_1", "cat_3", "cat_5"]], "in several"),
        ([["cat_0", "cat_2", "cat_4", "cat_9"], ["cat_1", "cat_3", "cat_5"]], "unknown"),
        ([["cat_0", "cat_4", "cat_2"], ["cat_1", "cat_3", "cat_5"]], "tower 0 has features"),
        ([["cat_1", "cat_3", "cat_5"], ["cat_0", "cat_2", "cat_4"]], "tower 0 has features"),
    ],
)
def test_partition_must_match_the_model(partition: list[list[str]], match: str) -> None:
    model = _model(TWO_TOWERS)
    model.partition = partition  # a partition that is not the one the model was built with
    with pytest.raises(ValueError, match=match):
        check_dmt_model(model, Topology(4, 2))


def test_tables_must_be_fp32_and_named_once() -> None:
    """Reproduced bugs: a table named as one of another tower's got that table's weights and
    optimizer state (both are found by name); a non-FP32 table among FP32 ones had its columns
    read as another table's (TorchRec's fused lookup groups its tables by data type)."""
    model = _model(TWO_TOWERS)
    tables = [tw.embedding_bag_collection.embedding_bag_configs() for tw in model.towers]
    tables[1][2].name = tables[0][1].name
    with pytest.raises(ValueError, match=r"^towers 0 and 1 both have a table named 't_cat_2'; "):
        check_dmt_model(model, Topology(4, 2))
    model = _model(TWO_TOWERS)
    model.towers[0].embedding_bag_collection.embedding_bag_configs()[1].data_type = DataType.FP16
    with pytest.raises(
        ValueError, match=r"^tower 0's table 't_cat_2' has data_type FP16; SPTT's lookup takes FP32"
    ):
        check_dmt_model(model, Topology(4, 2))


def test_not_a_dmt_model() -> None:
    with pytest.raises(TypeError, match="not a DMT model"):
        check_dmt_model(torch.nn.Linear(2, 2), Topology(2, 2))
    with pytest.raises(TypeError, match="needs a DMT model"):
        shard_dmt(
            torch.nn.Linear(2, 2), _runtime(2), topology=Topology(2, 2), optim_cfg=OptimConfig()
        )


def test_sharder_settings() -> None:
    with pytest.raises(ValueError, match="sharding_type='diagonal'"):
        DMTSharder(Topology(4, 2), sharding_type="diagonal")
    with pytest.raises(ValueError, match="multiple of 4"):  # FBGEMM's fused kernels
        DMTSharder(Topology(4, 2), sparse_optimizer=(torch.optim.SGD, {"lr": 0.1})).plan(
            _model(TWO_TOWERS, dim=6)
        )
    with pytest.raises(ValueError, match="unknown feature"):
        DMTSharder(Topology(4, 2), sharding_type={"cat_9": "row_wise"}).plan(_model(TWO_TOWERS))


def test_shard_dmt_fails_before_any_collective() -> None:
    """No process group is initialized here: reaching a collective would raise another error."""
    assert not dist.is_initialized()
    model = _model(TWO_TOWERS)
    with pytest.raises(ValueError, match="the job has 2"):
        shard_dmt(model, _runtime(2), topology=Topology(4, 2), optim_cfg=OptimConfig())
    with pytest.raises(ValueError, match="topology has T=4"):
        shard_dmt(model, _runtime(8), topology=Topology(8, 2), optim_cfg=OptimConfig())
    with pytest.raises(ValueError, match="needs a CUDA device"):
        shard_dmt(
            model,
            _runtime(4),
            topology=Topology(4, 2),
            optim_cfg=OptimConfig(sparse={"_target_": "torch.optim.Adam", "lr": 0.1}),
        )
    assert not dist.is_initialized()


def test_dense_parts_must_not_be_on_meta() -> None:
    model = _model(TWO_TOWERS)
    model.top.to("meta")
    with pytest.raises(ValueError, match="model's top has dense parameters on the meta device"):
        check_dmt_model(model, Topology(4, 2))
    tables_on_meta = build_dmt_model(
        ModelConfig(
            name="dlrm",
            interaction=DotInteractionConfig(),
            embedding_dim=8,
            bottom_mlp=[4, 2],
            top_mlp=[4, 1],
            tower=DLRMTowerConfig(dim=2, c=1, p=0),
            partition=PartitionConfig(kind="explicit"),
        ),
        TWO_TOWERS,
        feature_names=NAMES,
        cardinalities=[10] * 6,
        num_dense=3,
        table_device="meta",
    )
    check_dmt_model(tables_on_meta, Topology(4, 2))  # tables on meta are what the trainer builds


def test_padding_adds_empty_samples_and_keeps_every_keys_total() -> None:
    """An uneven evaluation batch is padded with empty samples; the padded KJT carries each
    key's total, so step a's input dist needs no device-to-host copy to find it."""
    kjt = KeyedJaggedTensor.from_lengths_sync(
        keys=["a", "b"], values=torch.arange(5), lengths=torch.tensor([1, 2, 0, 2])
    )
    dense, padded = _pad_batch(torch.ones(2, 3), kjt, 4)
    assert torch.equal(dense, torch.cat([torch.ones(2, 3), torch.zeros(2, 3)]))
    assert padded.stride() == 4 and padded.keys() == ["a", "b"]
    assert padded.lengths().tolist() == [1, 2, 0, 0, 0, 2, 0, 0]
    assert torch.equal(padded.values(), torch.arange(5))
    assert padded.length_per_key_or_none() == [3, 2]
    assert padded.offset_per_key_or_none() == [0, 3, 5]


def test_dense_modules_off_the_shards_device_are_refused_by_name() -> None:
    # a reproduced bug: the throughput benchmark built its dense layers on the CPU and SPTT on
    # cuda:N then failed in DistributedDataParallel ("device_ids ... only work with ... GPU
    # modules"), on every machine with 2+ GPUs
    model = _model(TWO_TOWERS)  # dense and tables on the CPU
    check_dense_device(model, torch.device("cpu"))
    check_dense_device(model, torch.device("meta"))  # dmt-plan's dry run: tables on meta
    for device in ("cuda", "cuda:1"):
        with pytest.raises(ValueError) as refused:
            check_dense_device(model, torch.device(device))
        assert str(refused.value) == (
            f"the model's dense parameter towers.0.tower_module.feature_linear.weight is on cpu, the "
            f"SPTT shards on {device}: build the dense modules on the training device (dense_device), or move "
            "them there (.to(device)) before sharding"
        )
    tables_on_meta = _model(TWO_TOWERS)
    for tower in tables_on_meta.towers:  # tables elsewhere (meta) are not dense parameters
        tower.embedding_bag_collection.to("meta")
    check_dense_device(tables_on_meta, torch.device("cpu"))
