"""The flat baseline's TorchRec planner under the ``sharding`` memory budget (dmt.sharding).

Planning needs no process group and no GPU: a CUDA topology is planned here on CPU (the kernels
it picks cannot run here; scripts/gpu_acceptance.sh runs them).
"""

from __future__ import annotations

import logging

import pytest
import torch

from dmt.memory import MemoryBudget
from dmt.models import build_model
from dmt.sharding import (
    SHARDED_TYPES,
    place_on_devices,
    plan_tables,
    planner_topology,
    table_constraints,
)
from dmt.trainer import TrainTask
from tests.conftest import typed_config

ROWS = 100_000  # 8 tables of 100k x 16 fp32: 6.4 MB each, 6.8 MB with row-wise Adagrad


def _task(num_tables: int) -> TrainTask:
    cfg = typed_config("logger=disabled")
    model = build_model(
        cfg.model,
        feature_names=[f"cat_{i}" for i in range(num_tables)],
        cardinalities=[ROWS] * num_tables,
        num_dense=13,
        table_device="meta",
        dense_device=torch.device("cpu"),
    )
    return TrainTask(model)


@pytest.fixture(scope="module")
def task() -> TrainTask:
    return _task(8)


@pytest.fixture(scope="module")
def four_tables() -> TrainTask:
    """Half the tables: a budget that only just fits 8 tables sends TorchRec's planner through
    thousands of proposals (4 s alone, 27 s late in the suite); 4 tables plan in 0.05 s."""
    return _task(4)


def _kernels(plan) -> dict[str, str]:
    (module_plan,) = plan.plan.values()
    return {name: p.compute_kernel for name, p in module_plan.items()}


def test_topology_comes_from_the_factory_with_the_budget(caplog):
    cuda = MemoryBudget("cuda", hbm_bytes=3 * 1024**3, ddr_bytes=5 * 1024**3)
    with caplog.at_level(logging.WARNING):
        topo = planner_topology(cuda, world_size=4, local_world_size=2)
    assert "constructed directly" not in caplog.text
    assert topo.compute_device == "cuda" and topo.local_world_size == 2
    assert [(d.storage.hbm, d.storage.ddr) for d in topo.devices] == [
        (3 * 1024**3, 5 * 1024**3)
    ] * 4
    cpu = planner_topology(
        MemoryBudget("cpu", hbm_bytes=3, ddr_bytes=5), world_size=2, local_world_size=1
    )
    assert [(d.storage.hbm, d.storage.ddr) for d in cpu.devices] == [(0, 5)] * 2


def test_constraints_keep_tables_sharded_and_allow_uvm_caching_on_cuda_only(task):
    cuda = table_constraints(task, MemoryBudget("cuda", 1, 1, uvm_cache_load_factor=0.3))
    cpu = table_constraints(task, MemoryBudget("cpu", 1, 1))
    assert sorted(cuda) == sorted(cpu) == sorted(f"t_cat_{i}" for i in range(8))
    for c in cuda.values():
        assert c.sharding_types == SHARDED_TYPES
        assert c.compute_kernels == ["fused", "fused_uvm_caching"]
        assert c.cache_params is not None and c.cache_params.load_factor == 0.3
    for c in cpu.values():
        assert c.compute_kernels == ["fused"] and c.cache_params is None


def test_cuda_plan_uvm_caches_when_hbm_is_short(task):
    roomy = MemoryBudget("cuda", hbm_bytes=1024**3, ddr_bytes=1024**3)
    kernels = _kernels(plan_tables(task, roomy, world_size=2, local_world_size=2, batch_size=512))
    assert set(kernels.values()) == {"fused"}
    short = MemoryBudget("cuda", hbm_bytes=12 * 10**6, ddr_bytes=1024**3)
    plan = plan_tables(task, short, world_size=2, local_world_size=2, batch_size=512)
    assert "fused_uvm_caching" in set(_kernels(plan).values())
    (module_plan,) = plan.plan.values()
    for p in module_plan.values():
        assert p.sharding_type in SHARDED_TYPES
        if p.compute_kernel == "fused_uvm_caching":
            assert p.cache_params is not None and p.cache_params.load_factor == 0.2


def test_plan_fails_with_the_budget_when_tables_do_not_fit(four_tables):
    tiny = MemoryBudget("cpu", hbm_bytes=1, ddr_bytes=10 * 10**6)  # 27 MB of tables
    with pytest.raises(ValueError) as err:
        plan_tables(four_tables, tiny, world_size=2, local_world_size=2, batch_size=512)
    assert str(err.value).startswith(
        "TorchRec's planner found no sharding of the tables within the memory budget (cpu: host "
        "memory 9.54 MiB (10000000 bytes) per rank (no HBM); sharding.hbm_gb, sharding.ddr_gb): "
        "Unable to find a plan for this model because of insufficient storage."
    )
    # the same tables fit in 20 MB per rank: two ranks hold them
    roomy = MemoryBudget("cpu", hbm_bytes=1, ddr_bytes=20 * 10**6)
    plan = plan_tables(four_tables, roomy, world_size=2, local_world_size=2, batch_size=512)
    assert set(_kernels(plan).values()) == {"fused"}


def _placements(plan) -> list[tuple[str, int, str, list[int], list[int]]]:
    (module_plan,) = plan.plan.values()
    return [
        (name, m.placement.rank(), str(m.placement.device()), m.shard_offsets, m.shard_sizes)
        for name, p in sorted(module_plan.items())
        for m in p.sharding_spec.shards
    ]


@pytest.mark.parametrize(
    "devices",
    [
        ["cuda:0"] * 4,  # one GPU per task (SLURM --gpus-per-task=1): every rank's cuda:0
        ["cuda:0", "cuda:0", "cuda:1", "cuda:1"],  # ranks numbered round-robin over 2 hosts
    ],
    ids=["one-gpu-per-task", "cyclic"],
)
def test_plan_places_each_rank_on_its_own_device(task, devices):
    """TorchRec's planner places rank r on cuda:<r % local_world_size>; the plan dmt shards with
    puts every shard on the device its rank uses, and changes nothing else."""
    cuda = MemoryBudget("cuda", hbm_bytes=1024**3, ddr_bytes=1024**3)
    plan = plan_tables(task, cuda, world_size=4, local_world_size=4, batch_size=512)
    before = _placements(plan)
    assert {(r, d) for _, r, d, _, _ in before} == {(r, f"cuda:{r}") for r in range(4)}
    after = _placements(place_on_devices(plan, [torch.device(d) for d in devices]))
    assert after == [(n, r, devices[r], o, s) for n, r, _, o, s in before]
