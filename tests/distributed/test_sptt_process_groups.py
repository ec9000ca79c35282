"""Process groups of SPTT on gloo: membership, validation, and timeouts instead of hangs."""

from __future__ import annotations

import re
from datetime import timedelta

import pytest
import torch
import torch.distributed as dist

from dmt.sptt.process_groups import create_process_groups
from dmt.sptt.topology import Topology
from tests.distributed.distributed_harness import run_on_ranks


def _membership_worker(rank: int, world_size: int, local_world_size: int, hosts_per_tower: int):
    topo = Topology(world_size, local_world_size, hosts_per_tower)
    groups = create_process_groups(topo)
    return (
        dist.get_process_group_ranks(groups.world),
        dist.get_process_group_ranks(groups.tower),
        dist.get_process_group_ranks(groups.peer),
        groups.tower_index,
        groups.position,
    )


@pytest.mark.parametrize(
    ("world_size", "local_world_size", "hosts_per_tower"), [(8, 2, 1), (8, 2, 2)]
)
def test_membership(world_size: int, local_world_size: int, hosts_per_tower: int) -> None:
    topo = Topology(world_size, local_world_size, hosts_per_tower)
    results = run_on_ranks(_membership_worker, world_size, local_world_size, hosts_per_tower)
    for rank, (world, tower, peer, tower_index, position) in enumerate(results):
        assert world == list(range(world_size))
        assert tower == list(topo.tower_ranks(topo.tower_of(rank)))
        assert peer == list(topo.peers_of(rank))
        assert (tower_index, position) == (topo.tower_of(rank), topo.position_of(rank))


def _wrong_size_worker(rank: int, world_size: int) -> str:
    try:
        create_process_groups(Topology(world_size * 2, 1))
    except ValueError as e:
        return str(e)
    return ""


def test_world_size_mismatch() -> None:
    for message in run_on_ranks(_wrong_size_worker, 2):
        assert "world_size=4" in message


def _timeout_worker(rank: int, world_size: int) -> str:
    groups = create_process_groups(Topology(world_size, 1), timeout=timedelta(seconds=1))
    message = ""
    if rank == 0:  # rank 1 never joins this all-reduce
        with pytest.raises(RuntimeError) as e:
            dist.all_reduce(torch.ones(1), group=groups.peer)
        message = str(e.value)
    dist.barrier()
    return message


def test_missing_rank_times_out() -> None:
    """The groups' own timeout, not the default group's (gloo names the one it waited)."""
    message = run_on_ranks(_timeout_worker, 2)[0]
    assert re.search(r"\bTimed out waiting 1000ms\b", message), message
