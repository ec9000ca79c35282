"""The ``ShardedTensor`` s of SPTT's state (checkpoints, dmt-eval, dmt-export): a rank's own
shards are placed on the devices their tensors are on, whatever the plan's host layout says.

Torch refuses a local shard whose placement names another device ("Local shard tensor device
does not match with local Shard's placement!"): with ``sptt.local_world_size`` emulating hosts, or one GPU per
SLURM task (every rank's ``cuda:0``), ``cuda:<rank % L>`` is not the rank's GPU. A fake process
group of 4 ranks lets one process build rank 1's view; ``meta`` tensors stand for a device other
than the one the plan's layout would name."""

from __future__ import annotations

from collections.abc import Iterator

import pytest
import torch
import torch.distributed as dist
from torch.testing._internal.distributed.fake_pg import FakeStore

from dmt.sptt.plan import build_plan
from dmt.sptt.sharded_state import sharded_table
from dmt.sptt.topology import Topology


@pytest.fixture
def rank_1_of_4() -> Iterator[None]:
    dist.init_process_group("fake", store=FakeStore(), rank=1, world_size=4)
    try:
        yield
    finally:
        dist.destroy_process_group()


@pytest.mark.parametrize("kind", ["row_wise", "column_wise"])
@pytest.mark.parametrize("device", [torch.device("cuda", 0), torch.device("cpu")])
def test_own_shards_are_placed_on_their_tensors_device(
    rank_1_of_4: None, kind: str, device: torch.device
) -> None:
    # 2 hosts of 2 ranks, 2 towers: rank 1 is position 1 of tower 0 (ranks 0 and 1)
    plan = build_plan(
        Topology(4, 2),
        ["a", "b"],
        [[0], [1]],
        embedding_dim=8,
        num_embeddings=[10, 6],
        sharding_types={"a": kind},
    )
    shards = plan.feature_shards(0)
    mine = [i for i, s in enumerate(shards) if s.rank == 1]
    assert len(mine) == 1 and len(shards) == 2
    own = shards[mine[0]]
    tensor = torch.empty(own.num_rows, own.num_cols, device="meta")
    table = sharded_table(
        plan, 0, local={mine[0]: tensor}, rank=1, device=device, group=None, rows=10
    )
    [local] = table.local_shards()
    assert local.tensor is tensor
    placements = {str(m.placement) for m in table.metadata().shards_metadata}
    other = "rank:0/cuda:0" if device.type == "cuda" else "rank:0/cpu"
    assert placements == {"rank:1/meta", other}
    assert table.size() == torch.Size([10, 8])


def test_state_without_local_shards_names_every_rank(rank_1_of_4: None) -> None:
    plan = build_plan(
        Topology(4, 2), ["a", "b"], [[0], [1]], embedding_dim=8, num_embeddings=[10, 6]
    )
    [shard] = plan.feature_shards(1)  # table-wise in tower 1 (ranks 2 and 3)
    table = sharded_table(
        plan, 1, local={}, rank=1, device=torch.device("cuda", 1), group=None, rows=6
    )
    assert table.local_shards() == []
    [meta] = table.metadata().shards_metadata
    assert str(meta.placement) == f"rank:{shard.rank}/cuda:{shard.rank % 2}"
