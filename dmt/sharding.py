"""Flat TorchRec sharding of a model's embedding tables (the baseline every DMT run compares to).

TorchRec's planner places every table (table-, column-, row-wise or data-parallel, whatever the
device and world allow) and ``DistributedModelParallel`` wraps the dense part in DDP.
"""

from __future__ import annotations

import torch.distributed as dist
from torch import nn
from torchrec.distributed.model_parallel import DistributedModelParallel, get_default_sharders
from torchrec.distributed.planner import EmbeddingShardingPlanner, Topology

from dmt.runtime import Runtime


def shard_model(module: nn.Module, runtime: Runtime, *, batch_size: int) -> DistributedModelParallel:
    """Plan and shard ``module`` (tables on the meta device) over the default process group."""
    topology = Topology(
        world_size=runtime.world_size,
        local_world_size=runtime.local_world_size,
        compute_device=runtime.device.type,
    )
    planner = EmbeddingShardingPlanner(
        topology=topology, batch_size=max(batch_size // runtime.world_size, 1)
    )
    sharders = get_default_sharders()
    plan = planner.collective_plan(module, sharders, dist.GroupMember.WORLD)
    return DistributedModelParallel(module, device=runtime.device, plan=plan, sharders=sharders)
