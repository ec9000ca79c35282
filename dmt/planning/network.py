"""Alpha-beta time of one collective on a two-level cluster: hosts of ``L`` ranks joined by a
fast intra-host link (NVLink; loopback on an emulated host), one NIC per ``ranks_per_nic`` ranks,
and a full-bisection network between the NICs (no switch is a bottleneck, only a NIC is).

A link is a :class:`LinkSpec`: a start-up latency ``alpha`` per message and a bandwidth ``beta^-1``
per direction. What one rank sends is given per collective as the bytes it sends to ranks on its
own host and to ranks on other hosts (:class:`dmt.planning.collectives.CollectiveBytes`, the same
counts :class:`~dmt.sptt.comm_stats.CommStats` measures). Every rank is assumed to run a
collective of the same size at the same time (SPMD: the other groups of a step run alongside), so
a NIC carries the cross-host bytes of all ``ranks_per_nic`` ranks behind it.

Shape legend: ``n`` ranks in the group (``group_size``), ``L`` of them per host
(``ranks_per_host``), ``H = n / L`` hosts it spans, ``r`` ranks per NIC.

Per op (``a`` latency, ``b`` bandwidth, in seconds and bytes/s):

* ``all_to_all``, ``reduce_scatter``, ``all_gather`` (direct exchanges: each rank sends its
  blocks to their owners, the logical exchange :class:`~dmt.sptt.comm_trace.CommTrace` counts):
  intra-host and cross-host traffic flow at the same time over different links, so
  ``t = max((L - 1) a_intra + intra / b_intra, m a_inter + r cross / b_inter)``, where ``m`` is the
  number of sequential cross-host start-ups: ``n - L`` remote peers for the all-to-all (one
  message each), ``H - 1`` ring steps between hosts for reduce-scatter and all-gather.
* ``all_reduce``: hierarchical (NCCL's tree/ring-of-rings shape, and what a multi-channel ring
  achieves): reduce-scatter inside the host, all-reduce of the ``S / L`` shards across hosts (ring
  over ``H`` hosts), all-gather inside the host, one phase after the other. From the ring volume
  ``V = intra + cross = 2 (n - 1) / n S`` a rank sends (CommTrace's ring convention) the buffer is
  ``S = V n / (2 (n - 1))`` and
  ``t = 2 (L - 1) (a_intra + S / (L b_intra)) + 2 (H - 1) (a_inter + r S / (L H b_inter))``.

Example::

    >>> nvlink, nic = LinkSpec(300.0, 1.0), LinkSpec(50.0, 5.0)
    >>> t = collective_time_s("all_to_all", group_size=16, ranks_per_host=8,
    ...     intra_host_bytes=7e6, cross_host_bytes=8e6, intra=nvlink, inter=nic, ranks_per_nic=1)
    >>> round(t * 1e6)  # NIC bound: 8 remote peers x 5 us + 8 MB / 50 GB/s
    200
"""

from __future__ import annotations

from dataclasses import dataclass

COLLECTIVE_OPS = ("all_to_all", "reduce_scatter", "all_gather", "all_reduce")
GB = 1e9  # bytes per GB (link bandwidths are in decimal gigabytes per second)


@dataclass(frozen=True)
class LinkSpec:
    """One link, per direction."""

    bandwidth_gbps: float
    """Bandwidth in GB/s (gigaBYTES, 1e9 bytes, per second), per direction."""
    latency_us: float
    """Start-up latency of one message (or one ring hop), microseconds."""

    def __post_init__(self) -> None:
        if not self.bandwidth_gbps > 0:
            raise ValueError(f"LinkSpec.bandwidth_gbps={self.bandwidth_gbps!r} must be > 0 (GB/s)")
        if not self.latency_us >= 0:
            raise ValueError(f"LinkSpec.latency_us={self.latency_us!r} must be >= 0 (us)")

    @property
    def bytes_per_s(self) -> float:
        """Bandwidth in bytes per second."""
        return self.bandwidth_gbps * GB

    @property
    def latency_s(self) -> float:
        """Latency in seconds."""
        return self.latency_us * 1e-6


def _check(
    op: str,
    group_size: int,
    ranks_per_host: int,
    intra_host_bytes: float,
    cross_host_bytes: float,
    ranks_per_nic: int,
) -> None:
    if op not in COLLECTIVE_OPS:
        raise ValueError(
            f"op={op!r} is not a collective the model knows; expected one of {list(COLLECTIVE_OPS)}"
        )
    if group_size < 1 or ranks_per_host < 1 or ranks_per_nic < 1:
        raise ValueError(
            f"group_size={group_size}, ranks_per_host={ranks_per_host} and "
            f"ranks_per_nic={ranks_per_nic} must all be >= 1"
        )
    if group_size % ranks_per_host:
        raise ValueError(
            f"group_size={group_size} is not a multiple of ranks_per_host={ranks_per_host} "
            "(a group spans whole hosts, the same number of its ranks on each)"
        )
    if intra_host_bytes < 0 or cross_host_bytes < 0:
        raise ValueError(
            f"{op}: intra_host_bytes={intra_host_bytes} and cross_host_bytes={cross_host_bytes} "
            "must be >= 0"
        )
    if ranks_per_host == 1 and intra_host_bytes > 0:
        raise ValueError(
            f"{op}: intra_host_bytes={intra_host_bytes} > 0 but the group has one rank per host "
            "(ranks_per_host=1): there is no same-host peer to send to"
        )
    if group_size == ranks_per_host and cross_host_bytes > 0:
        raise ValueError(
            f"{op}: cross_host_bytes={cross_host_bytes} > 0 but the group of {group_size} ranks "
            f"lies on one host (ranks_per_host={ranks_per_host})"
        )


def collective_time_s(
    op: str,
    *,
    group_size: int,
    ranks_per_host: int,
    intra_host_bytes: float,
    cross_host_bytes: float,
    intra: LinkSpec,
    inter: LinkSpec,
    ranks_per_nic: int,
) -> float:
    """Seconds one collective takes (see the module docstring for the formulas).

    Args:
        op: ``"all_to_all"``, ``"reduce_scatter"``, ``"all_gather"`` or ``"all_reduce"``.
        group_size: ``n``, ranks in the process group.
        ranks_per_host: ``L``, members of the group on each of its hosts (``n % L == 0``).
        intra_host_bytes: bytes one rank sends to group members on its own host.
        cross_host_bytes: bytes one rank sends to group members on other hosts.
        intra: the intra-host link of one rank (NVLink port; loopback).
        inter: one NIC.
        ranks_per_nic: ``r``, ranks (of any group) whose traffic shares one NIC.

    Returns:
        Seconds; 0 for a group of one rank or a collective that moves no bytes.
    """
    _check(op, group_size, ranks_per_host, intra_host_bytes, cross_host_bytes, ranks_per_nic)
    n, local = group_size, ranks_per_host
    hosts = n // local
    if n == 1 or intra_host_bytes + cross_host_bytes == 0:
        return 0.0
    if op == "all_reduce":
        buffer = (intra_host_bytes + cross_host_bytes) * n / (2 * (n - 1))  # S
        t_intra = 2 * (local - 1) * (intra.latency_s + buffer / (local * intra.bytes_per_s))
        shard = buffer / local  # what each rank all-reduces across hosts
        t_inter = (
            2
            * (hosts - 1)
            * (inter.latency_s + ranks_per_nic * shard / (hosts * inter.bytes_per_s))
        )
        return t_intra + t_inter
    starts_inter = n - local if op == "all_to_all" else hosts - 1
    t_intra = (local - 1) * intra.latency_s + intra_host_bytes / intra.bytes_per_s
    t_inter = starts_inter * inter.latency_s + ranks_per_nic * cross_host_bytes / inter.bytes_per_s
    return max(t_intra, t_inter)
