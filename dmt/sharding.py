"""Flat TorchRec sharding of a model's embedding tables (the baseline every DMT run compares to).

TorchRec's planner places every table (table-, column- or row-wise, whatever the device and world
allow) within the per-rank memory budget (``sharding.*``, :class:`dmt.memory.MemoryBudget`): on
CUDA in HBM, or UVM-cached (``FUSED_UVM_CACHING``) when HBM is short, as the SPTT plan does; on
CPU in host memory. ``DistributedModelParallel`` wraps the dense part in DDP.
:func:`sharding_plan_text` is the plan of either path as ``sharding_plan.txt`` shows it.
"""

from __future__ import annotations

from pathlib import Path

import torch.distributed as dist
from torch import nn
from torchrec.distributed.embedding_types import EmbeddingComputeKernel
from torchrec.distributed.model_parallel import DistributedModelParallel, get_default_sharders
from torchrec.distributed.planner import EmbeddingShardingPlanner, ParameterConstraints, Topology
from torchrec.distributed.planner.types import KernelConfig, PlannerError, TopologyFactory
from torchrec.distributed.planner.types import TrainerConfig as PlannerTrainerConfig
from torchrec.distributed.types import CacheParams, ShardingPlan, ShardingType
from torchrec.modules.embedding_modules import EmbeddingBagCollection

from dmt.config import ShardingConfig
from dmt.memory import MemoryBudget
from dmt.runtime import Runtime
from dmt.sptt.dmt_sharding import ShardedDMT

PLAN_FILE = "sharding_plan.txt"

# Tables are never data-parallel: a replica per rank does not scale, and its optimizer state has
# another layout than a sharded table's, which would tie a checkpoint to the world size that
# chose it (DCP reshards table-, row- and column-wise shards into one another).
SHARDED_TYPES = [
    ShardingType.TABLE_WISE.value,
    ShardingType.ROW_WISE.value,
    ShardingType.COLUMN_WISE.value,
    ShardingType.TABLE_ROW_WISE.value,
    ShardingType.TABLE_COLUMN_WISE.value,
]


def memory_budget(cfg: ShardingConfig, compute_device: str) -> MemoryBudget:
    """The per-rank budget of the ``sharding`` config group on ``compute_device``."""
    return MemoryBudget.from_gib(
        compute_device,
        hbm_gb=cfg.hbm_gb,
        ddr_gb=cfg.ddr_gb,
        uvm_cache_load_factor=cfg.uvm_cache_load_factor,
    )


def compute_kernels(memory: MemoryBudget | None) -> list[str] | None:
    """Kernels the planner may pick, the same choice as the SPTT plan: the table in the rank's
    memory (``FUSED``) or, on CUDA, UVM-cached (``FUSED_UVM_CACHING``). ``None``: TorchRec's."""
    if memory is None:
        return None
    kernels = [EmbeddingComputeKernel.FUSED.value]
    if memory.compute_device == "cuda":
        kernels.append(EmbeddingComputeKernel.FUSED_UVM_CACHING.value)
    return kernels


def table_constraints(
    module: nn.Module, memory: MemoryBudget | None = None
) -> dict[str, ParameterConstraints]:
    """Planner constraints that keep every table of ``module`` sharded (never data-parallel)
    and, given ``memory``, limit the kernels to :func:`compute_kernels` with its cache load
    factor."""
    cuda = memory is not None and memory.compute_device == "cuda"
    cache = CacheParams(load_factor=memory.uvm_cache_load_factor) if cuda else None
    return {
        table.name: ParameterConstraints(
            sharding_types=list(SHARDED_TYPES),
            compute_kernels=compute_kernels(memory),
            cache_params=cache,
        )
        for m in module.modules()
        if isinstance(m, EmbeddingBagCollection)
        for table in m.embedding_bag_configs()
    }


def planner_topology(memory: MemoryBudget, *, world_size: int, local_world_size: int) -> Topology:
    """TorchRec's planner ``Topology``, built by ``TopologyFactory`` from the budget (on
    ``memory.compute_device``; TorchRec gives CPU ranks no HBM)."""
    return TopologyFactory.create_topology(
        trainer_config=PlannerTrainerConfig(
            world_size=world_size,
            local_world_size=local_world_size,
            hbm_cap_bytes=memory.hbm_bytes,
            ddr_cap_bytes=memory.ddr_bytes,
        ),
        kernel_config=KernelConfig(compute_device=memory.compute_device),
    )


def plan_tables(
    module: nn.Module,
    memory: MemoryBudget,
    *,
    world_size: int,
    local_world_size: int,
    batch_size: int,
) -> ShardingPlan:
    """TorchRec's plan of ``module``'s tables (no collective): never data-parallel, kernels of
    :func:`compute_kernels`, within ``memory`` per rank. ``batch_size`` is the global batch.

    Raises ``ValueError`` naming the budget when the planner finds no plan within it.
    """
    planner = EmbeddingShardingPlanner(
        topology=planner_topology(memory, world_size=world_size, local_world_size=local_world_size),
        batch_size=max(batch_size // world_size, 1),
        constraints=table_constraints(module, memory),
    )
    try:
        return planner.plan(module, get_default_sharders())
    except PlannerError as e:
        raise ValueError(
            f"TorchRec's planner found no sharding of the tables within the memory budget "
            f"({memory.describe()}; sharding.hbm_gb, sharding.ddr_gb): {e}"
        ) from e


def shard_model(
    module: nn.Module,
    runtime: Runtime,
    *,
    batch_size: int,
    memory: MemoryBudget | None = None,
) -> DistributedModelParallel:
    """Plan and shard ``module`` (tables on the meta device) over the default process group,
    within ``memory`` per rank (``None``: the ``sharding`` group's defaults).

    Raises ``ValueError`` on every rank when the planner finds no plan within the budget.
    """
    if memory is None:
        memory = memory_budget(ShardingConfig(), runtime.device.type)
    # rank 0 plans; its plan, or its error, reaches every rank (TorchRec's collective_plan
    # would leave the other ranks waiting for a plan that never comes)
    found: list[ShardingPlan | str | None] = [None]
    if runtime.rank == 0:
        try:
            found[0] = plan_tables(
                module,
                memory,
                world_size=runtime.world_size,
                local_world_size=runtime.local_world_size,
                batch_size=batch_size,
            )
        except ValueError as e:
            found[0] = str(e)
    if runtime.world_size > 1:
        dist.broadcast_object_list(found, src=0)
    if isinstance(found[0], str):
        raise ValueError(found[0])
    assert isinstance(found[0], ShardingPlan)
    return DistributedModelParallel(
        module, device=runtime.device, plan=found[0], sharders=get_default_sharders()
    )


def sharding_plan_text(model: nn.Module, memory: MemoryBudget | None = None) -> str:
    """The plan of a sharded model, readable: TorchRec's plan of a flat model (per table:
    sharding type, compute kernel, ranks, then its shards) under ``memory``, or the SPTT plan
    (:meth:`dmt.sptt.plan.SPTTPlan.describe`) of the ``ShardedDMT`` in ``model`` or
    ``model.model``."""
    if isinstance(model, DistributedModelParallel):
        budget = memory.describe() if memory else "not given"
        return f"flat TorchRec plan (EmbeddingShardingPlanner)\nmemory budget: {budget}\n{model.plan}\n"
    sharded = model if isinstance(model, ShardedDMT) else getattr(model, "model", None)
    if not isinstance(sharded, ShardedDMT):
        raise TypeError(f"{type(model).__name__} is neither a DMP nor holds a ShardedDMT")
    return sharded.dataflow.plan.describe()


def write_sharding_plan(
    model: nn.Module, run_dir: Path, *, rank: int, memory: MemoryBudget | None = None
) -> None:
    """Rank 0 writes :func:`sharding_plan_text` to ``run_dir / sharding_plan.txt``."""
    if rank == 0:
        run_dir.mkdir(parents=True, exist_ok=True)
        (run_dir / PLAN_FILE).write_text(sharding_plan_text(model, memory))
