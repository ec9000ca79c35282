"""Communication accounting of SPTT: bytes each rank sends per step and process group.

The dataflow (:mod:`dmt.sptt.dataflow`) records every collective it issues into a
:class:`CommStats`: how many bytes this rank sent to *other* ranks (a message to itself never
touches a wire), and how many of those crossed a host boundary under the topology's host map.
Backward collectives are recorded separately, so a training step shows both directions.

Steps (paper Figure 7): ``"a"`` sparse-input all-to-all over the world, ``"d"`` intra-tower
exchange of pooled embeddings, ``"f"`` peer all-to-all of tower outputs. KJT all-to-all payloads
count lengths, values and weights; the small split-size exchange TorchRec does first is not
counted.

The local peer permute of step c is counted too, as a shuffle (:meth:`CommStats.record_shuffle`):
in ``bytes_shuffled``, never in ``bytes_sent``, keyed by what it permuted instead of a group:
``("c", "output" | "input" | "none", direction)`` (``"none"``: the blocks arrived in peer order,
nothing moved; see :mod:`dmt.sptt.peer_permute`).
"""

from __future__ import annotations

from collections.abc import Iterable, Sequence
from dataclasses import dataclass, field

from dmt.sptt.topology import Topology


@dataclass
class CommCounter:
    """Totals of one (step, group, direction)."""

    calls: int = 0
    """Collectives issued."""
    bytes_sent: int = 0
    """Bytes this rank sent to other ranks."""
    bytes_cross_host: int = 0
    """The part of ``bytes_sent`` whose destination is on another host."""
    bytes_shuffled: int = 0
    """Bytes a local shuffle (step c) moved in this rank's memory; no wire."""


@dataclass
class CommStats:
    """Per-rank counters keyed by ``(step, group, direction)``.

    Args:
        topology: gives the host of every rank.
        rank: this rank (global).

    Example::

        stats = CommStats(topology, rank)
        outputs = dataflow(features)          # dataflow built with stats=stats
        stats.counters[("f", "peer", "forward")].bytes_cross_host
    """

    topology: Topology
    rank: int
    counters: dict[tuple[str, str, str], CommCounter] = field(default_factory=dict)

    def record(
        self,
        step: str,
        group: str,
        dst_ranks: Sequence[int],
        bytes_per_dst: Iterable[int],
        *,
        direction: str = "forward",
    ) -> None:
        """Add one collective in which this rank sends ``bytes_per_dst[i]`` to ``dst_ranks[i]``."""
        counter = self.counters.setdefault((step, group, direction), CommCounter())
        counter.calls += 1
        for dst, nbytes in zip(dst_ranks, bytes_per_dst, strict=True):
            if dst == self.rank:
                continue
            counter.bytes_sent += nbytes
            if self.topology.crosses_host(self.rank, dst):
                counter.bytes_cross_host += nbytes

    def record_shuffle(
        self, step: str, what: str, nbytes: int, *, direction: str = "forward"
    ) -> None:
        """Add one local shuffle of ``nbytes`` of ``what`` (e.g. step ``"c"`` of the ``"input"``)."""
        counter = self.counters.setdefault((step, what, direction), CommCounter())
        counter.calls += 1
        counter.bytes_shuffled += nbytes

    def total(self, *, direction: str | None = None) -> CommCounter:
        """Sum over all counters (of one ``direction`` if given)."""
        out = CommCounter()
        for (_, _, d), c in self.counters.items():
            if direction is None or d == direction:
                out.calls += c.calls
                out.bytes_sent += c.bytes_sent
                out.bytes_cross_host += c.bytes_cross_host
                out.bytes_shuffled += c.bytes_shuffled
        return out

    def reset(self) -> None:
        """Forget all counts (e.g. after a warm-up step)."""
        self.counters.clear()

    def as_dict(self) -> dict[str, int]:
        """Flat ``{"<step>/<group>/<direction>/<field>": value}`` for loggers."""
        out: dict[str, int] = {}
        for (step, group, direction), c in sorted(self.counters.items()):
            prefix = f"{step}/{group}/{direction}"
            out[f"{prefix}/calls"] = c.calls
            out[f"{prefix}/bytes_sent"] = c.bytes_sent
            out[f"{prefix}/bytes_cross_host"] = c.bytes_cross_host
            out[f"{prefix}/bytes_shuffled"] = c.bytes_shuffled
        return out
