"""The process groups of SPTT, created once from a :class:`~dmt.sptt.topology.Topology`.

``torch.distributed.new_group`` is collective over the whole world: every rank must create every
group, in the same order, even the groups it is not a member of. :func:`create_process_groups`
does that and keeps the three groups this rank uses:

* ``world`` (all ``G`` ranks): the sparse-input all-to-all of step a;
* ``tower`` (the ``K L`` ranks of this rank's tower): step d, and the gradient all-reduce of the
  replicated tower module;
* ``peer`` (the ``T`` ranks at this rank's position in every tower): the peer all-to-all of step f.

Every group gets a timeout, so a rank that fails makes the others fail instead of hanging.
"""

from __future__ import annotations

from dataclasses import dataclass
from datetime import timedelta

import torch.distributed as dist

from dmt.sptt.topology import Topology

DEFAULT_TIMEOUT = timedelta(minutes=5)


@dataclass(frozen=True)
class SPTTProcessGroups:
    """The process groups one rank needs for SPTT; build with :func:`create_process_groups`.

    Args:
        topology: the topology the groups were built from.
        rank: this rank (global).
        world: group of all ranks (step a).
        tower: this rank's intra-tower group, ranks ``topology.tower_ranks(tower)`` (step d).
        peer: this rank's peer group, ranks ``topology.peers_of(rank)`` (step f).
    """

    topology: Topology
    rank: int
    world: dist.ProcessGroup
    tower: dist.ProcessGroup
    peer: dist.ProcessGroup

    @property
    def tower_index(self) -> int:
        """The tower of this rank."""
        return self.topology.tower_of(self.rank)

    @property
    def position(self) -> int:
        """This rank's position in its tower: its rank in ``tower`` and its peer group index."""
        return self.topology.position_of(self.rank)


def create_process_groups(
    topology: Topology,
    *,
    backend: str | None = None,
    timeout: timedelta = DEFAULT_TIMEOUT,
) -> SPTTProcessGroups:
    """Create the world, intra-tower and peer groups of ``topology`` on every rank.

    Must be called by every rank of an initialized default process group whose world size is
    ``topology.world_size``, and once only (each call creates new communicators).

    Args:
        topology: hosts, towers and peers of the job.
        backend: backend of the new groups; ``None`` uses the default group's backend.
        timeout: timeout of every collective on the new groups.

    Returns:
        The groups this rank is a member of.
    """
    if not dist.is_initialized():
        raise ValueError("create_process_groups needs an initialized default process group")
    if dist.get_world_size() != topology.world_size:
        raise ValueError(
            f"the default process group has {dist.get_world_size()} ranks, but the topology "
            f"expects world_size={topology.world_size}"
        )
    rank = dist.get_rank()

    def new_group(ranks: tuple[int, ...]) -> dist.ProcessGroup | None:
        group = dist.new_group(list(ranks), timeout=timeout, backend=backend)
        return group if rank in ranks else None

    world = new_group(topology.world_ranks)
    towers = [new_group(ranks) for ranks in topology.tower_groups]
    peers = [new_group(ranks) for ranks in topology.peer_groups]
    tower = towers[topology.tower_of(rank)]
    peer = peers[topology.position_of(rank)]
    assert world is not None and tower is not None and peer is not None
    # new_group numbers members by ascending global rank: the tower group rank is the position,
    # the peer group rank the tower, which is what the split sizes of steps d and f assume.
    assert dist.get_rank(tower) == topology.position_of(rank)
    assert dist.get_rank(peer) == topology.tower_of(rank)
    return SPTTProcessGroups(topology=topology, rank=rank, world=world, tower=tower, peer=peer)
