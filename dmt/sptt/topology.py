"""Topology math of SPTT: hosts, towers, peers and the rank lists of every step's process group.

Pure integer functions; nothing here touches ``torch.distributed``, so the whole module is unit
tested for hundreds of ranks in milliseconds (:mod:`dmt.sptt.process_groups` turns the rank lists
into process groups).

Shape legend: ``G`` world size, ``L`` ranks per host, ``K`` hosts per tower, ``T = G / (K L)``
towers.

Layout. Ranks are numbered host-major (host ``h`` holds ranks ``h L .. h L + L - 1``), and a tower
is ``K`` consecutive hosts, so tower ``t`` holds the ``K L`` consecutive ranks
``t K L .. t K L + K L - 1``. The *position* of a rank is its index inside its tower,
``g % (K L)``.

Peers. The paper (section 3.1.1, ``K = 1``) calls ranks with equal ``g % L`` peers: the ranks at
the same position of every tower. For ``K`` hosts per tower the position is ``g % (K L)``, so a
peer group holds exactly one rank per tower and has ``T`` members; it is the group of the
concurrent peer all-to-alls of step f.

Peer order. The paper sorts all ranks by the key ``(g % T, g // L)`` and gives ``(0, 2, 1, 3)``
for ``G = 4, L = 2``. Its example has ``T = L``, where ``g % T == g % L``; the key that keeps peer
groups contiguous for every ``T`` and ``L`` is ``(g % L, g // L)``, i.e. (position, tower). With
``K`` hosts per tower this generalises to::

    key(g) = (g % (K L), g // (K L))      # (position in tower, tower)

so the peer order lists peer group 0 (one rank per tower, by tower), then peer group 1, and so on.
Block ``p`` of ``T`` consecutive entries is exactly the peer group of position ``p``; step d sends
block ``p`` of the peer-permuted global batch to the tower rank at position ``p``.
"""

from __future__ import annotations

from dataclasses import dataclass
from functools import cached_property


@dataclass(frozen=True)
class Topology:
    """Hosts, towers and peers of a ``G``-rank job with ``L`` ranks per host and ``K`` hosts per tower.

    Args:
        world_size: ``G``, the number of ranks in the job.
        local_world_size: ``L``, ranks (accelerators) per host.
        hosts_per_tower: ``K``, hosts that form one tower (paper section 3.1.3; ``1`` pins every
            tower to a single host).

    Example::

        >>> topo = Topology(world_size=4, local_world_size=2)
        >>> topo.num_towers, topo.peer_order
        (2, (0, 2, 1, 3))
        >>> topo.tower_groups, topo.peer_groups
        (((0, 1), (2, 3)), ((0, 2), (1, 3)))
    """

    world_size: int
    local_world_size: int
    hosts_per_tower: int = 1

    def __post_init__(self) -> None:
        for name in ("world_size", "local_world_size", "hosts_per_tower"):
            value = getattr(self, name)
            if isinstance(value, bool) or not isinstance(value, int):
                raise TypeError(f"Topology.{name} must be an int, got {value!r}")
            if value <= 0:
                raise ValueError(f"Topology.{name} must be positive, got {value}")
        if self.world_size % self.local_world_size:
            raise ValueError(
                f"world_size G={self.world_size} must be a multiple of local_world_size "
                f"L={self.local_world_size} (every host holds L ranks)"
            )
        if self.world_size % self.tower_size:
            raise ValueError(
                f"world_size G={self.world_size} must be a multiple of K*L="
                f"{self.hosts_per_tower}*{self.local_world_size}={self.tower_size} "
                f"(every tower spans K={self.hosts_per_tower} hosts of L ranks); "
                f"the number of hosts {self.num_hosts} is not divisible by K"
            )

    # ---- sizes -------------------------------------------------------------------------------

    @property
    def num_hosts(self) -> int:
        """``G / L``."""
        return self.world_size // self.local_world_size

    @property
    def tower_size(self) -> int:
        """``K L``: ranks per tower, the size of each intra-tower group (step d)."""
        return self.hosts_per_tower * self.local_world_size

    @property
    def num_towers(self) -> int:
        """``T = G / (K L)``: towers, the size of each peer group (step f)."""
        return self.world_size // self.tower_size

    # ---- maps of one rank --------------------------------------------------------------------

    def _check_rank(self, rank: int) -> None:
        if not 0 <= rank < self.world_size:
            raise ValueError(f"rank {rank} is outside [0, {self.world_size})")

    def host_of(self, rank: int) -> int:
        """Host that holds ``rank``."""
        self._check_rank(rank)
        return rank // self.local_world_size

    def local_rank_of(self, rank: int) -> int:
        """Index of ``rank`` on its host."""
        self._check_rank(rank)
        return rank % self.local_world_size

    def tower_of(self, rank: int) -> int:
        """Tower that ``rank`` belongs to."""
        self._check_rank(rank)
        return rank // self.tower_size

    def position_of(self, rank: int) -> int:
        """Index of ``rank`` inside its tower (and of its peer group among the peer groups)."""
        self._check_rank(rank)
        return rank % self.tower_size

    def rank_at(self, tower: int, position: int) -> int:
        """The rank at ``position`` of ``tower``."""
        if not 0 <= tower < self.num_towers:
            raise ValueError(f"tower {tower} is outside [0, {self.num_towers})")
        if not 0 <= position < self.tower_size:
            raise ValueError(f"position {position} is outside [0, {self.tower_size})")
        return tower * self.tower_size + position

    def crosses_host(self, src: int, dst: int) -> bool:
        """Whether a message from ``src`` to ``dst`` leaves the host."""
        return self.host_of(src) != self.host_of(dst)

    # ---- groups ------------------------------------------------------------------------------

    def host_ranks(self, host: int) -> tuple[int, ...]:
        """Ranks of ``host``."""
        if not 0 <= host < self.num_hosts:
            raise ValueError(f"host {host} is outside [0, {self.num_hosts})")
        start = host * self.local_world_size
        return tuple(range(start, start + self.local_world_size))

    def tower_ranks(self, tower: int) -> tuple[int, ...]:
        """Ranks of ``tower``, by position."""
        if not 0 <= tower < self.num_towers:
            raise ValueError(f"tower {tower} is outside [0, {self.num_towers})")
        return self.tower_groups[tower]

    def peer_group(self, position: int) -> tuple[int, ...]:
        """Ranks at ``position`` of every tower, by tower (one rank per tower)."""
        if not 0 <= position < self.tower_size:
            raise ValueError(f"position {position} is outside [0, {self.tower_size})")
        return self.peer_groups[position]

    def peers_of(self, rank: int) -> tuple[int, ...]:
        """The peer group of ``rank`` (including ``rank``), by tower."""
        return self.peer_group(self.position_of(rank))

    @property
    def world_ranks(self) -> tuple[int, ...]:
        """All ranks: the group of the sparse-input all-to-all (step a)."""
        return tuple(range(self.world_size))

    @cached_property
    def tower_groups(self) -> tuple[tuple[int, ...], ...]:
        """Rank lists of the ``T`` intra-tower groups of size ``K L`` (step d), by tower."""
        KL = self.tower_size
        return tuple(tuple(range(t * KL, (t + 1) * KL)) for t in range(self.num_towers))

    @cached_property
    def peer_groups(self) -> tuple[tuple[int, ...], ...]:
        """Rank lists of the ``K L`` peer groups of size ``T`` (step f), by position."""
        return tuple(tuple(self.world_ranks[p :: self.tower_size]) for p in range(self.tower_size))

    @cached_property
    def peer_order(self) -> tuple[int, ...]:
        """All ranks sorted by ``(g % (K L), g // (K L))``: the peer groups, concatenated.

        Step c permutes the global batch (ordered by source rank after step a) into this order.
        """
        return tuple(sorted(range(self.world_size), key=self.peer_order_key))

    def peer_order_key(self, rank: int) -> tuple[int, int]:
        """Sort key of the peer order: ``(position in tower, tower)``."""
        return self.position_of(rank), self.tower_of(rank)
