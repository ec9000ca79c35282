"""Flat TorchRec sharding of a model's embedding tables (the baseline every DMT run compares to).

TorchRec's planner places every table (table-, column-, row-wise or data-parallel, whatever the
device and world allow) and ``DistributedModelParallel`` wraps the dense part in DDP.
"""

from __future__ import annotations

import torch.distributed as dist
from torch import nn
from torchrec.distributed.model_parallel import DistributedModelParallel, get_default_sharders
from torchrec.distributed.planner import EmbeddingShardingPlanner, ParameterConstraints, Topology
from torchrec.distributed.types import ShardingType
from torchrec.modules.embedding_modules import EmbeddingBagCollection

from dmt.runtime import Runtime

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


def table_constraints(module: nn.Module) -> dict[str, ParameterConstraints]:
    """Planner constraints that keep every table of ``module`` sharded (never data-parallel)."""
    return {
        table.name: ParameterConstraints(sharding_types=list(SHARDED_TYPES))
        for m in module.modules()
        if isinstance(m, EmbeddingBagCollection)
        for table in m.embedding_bag_configs()
    }


def shard_model(module: nn.Module, runtime: Runtime, *, batch_size: int) -> DistributedModelParallel:
    """Plan and shard ``module`` (tables on the meta device) over the default process group."""
    topology = Topology(
        world_size=runtime.world_size,
        local_world_size=runtime.local_world_size,
        compute_device=runtime.device.type,
    )
    planner = EmbeddingShardingPlanner(
        topology=topology,
        batch_size=max(batch_size // runtime.world_size, 1),
        constraints=table_constraints(module),
    )
    sharders = get_default_sharders()
    plan = planner.collective_plan(module, sharders, dist.GroupMember.WORLD)
    return DistributedModelParallel(module, device=runtime.device, plan=plan, sharders=sharders)
