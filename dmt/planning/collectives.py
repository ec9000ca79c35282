"""Bytes per step, collective and process group of one training step, at any scale, no process.

Counts follow :class:`~dmt.sptt.comm_stats.CommStats`' conventions, so that the counts of a plan
equal what the real dataflow records (``tests/distributed/test_plan_bytes.py``): the bytes a rank
sends to *other* ranks of the group (a message to itself is free), split by whether the
destination is on the sender's host; an all-to-all sends split ``i`` to group rank ``i``, a
reduce-scatter block ``i`` to group rank ``i``, an all-gather its input to every group rank, an
all-reduce ``2 (n - 1) / n`` of the buffer to its successor in the group (ring model; per DDP
bucket, rounded down, which is exact for fp32 buckets and groups of at most 8 ranks). KJT
all-to-alls count lengths and ids, not TorchRec's small exchange of split sizes.

* SPTT (modes ``"sptt"``, pass-through towers, and ``"dmt"``, tower modules):
  :func:`sptt_rank_collectives` gives one rank's steps a, d, f (forward, and backward where
  autograd sends gradients), the tower-module all-reduce (``tower_allreduce``, DDP over the
  tower) and the dense all-reduce (``dense_allreduce``, DDP over the world), from the split sizes
  the dataflow itself uses (:mod:`dmt.sptt.splits`); :func:`sptt_collectives` the busiest rank
  of each.
* flat TorchRec sharding: :func:`flat_collectives` from TorchRec's ``ShardingPlan``
  (input KJT all-to-all and pooled-embedding output all-to-all or reduce-scatter per sharding
  type, plus DDP's dense all-reduce).

"Busiest rank": of each collective (step, op, group, direction), the rank that sends the most
cross-host bytes, ties broken by the most bytes in all.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field

from dmt.sptt.plan import SPTTPlan, TableShard
from dmt.sptt.splits import (
    step_a_bytes_per_dst,
    step_d_reduce_scatter_block,
    step_d_split_sizes,
    step_f_split_sizes,
)

MODES: tuple[str, ...] = ("flat", "sptt", "dmt")


@dataclass(frozen=True)
class CollectiveBytes:
    """Bytes that one rank (the busiest) sends in one collective of one training step."""

    step: str
    """``"a"``, ``"d"``, ``"f"`` (SPTT steps), ``"tower_allreduce"``, ``"dense_allreduce"``,
    ``"flat_input_a2a"``, ``"flat_output_a2a"``."""
    op: str
    """``"all_to_all"``, ``"reduce_scatter"``, ``"all_reduce"`` or ``"all_gather"``."""
    group: str
    """``"world"``, ``"tower"``, ``"peer"`` (CommStats' group names)."""
    direction: str
    """``"forward"`` or ``"backward"``."""
    group_size: int
    """Ranks in the process group."""
    intra_host_bytes: int
    """Bytes the rank sends to other ranks on its own host per step."""
    cross_host_bytes: int
    """Bytes the rank sends to ranks on other hosts per step."""
    overlappable: bool
    """Whether the pipelined schedule can hide it behind compute."""

    @property
    def total_bytes(self) -> int:
        return self.intra_host_bytes + self.cross_host_bytes


@dataclass(frozen=True)
class Workload:
    """What every rank's local batch holds, for the bytes of the sparse input (step a).

    Args:
        local_batch: ``B``, samples per rank and step.
        ids_per_feature: ids of the local batch per feature, model order (``B`` times the ids
            per sample: ``B`` for one-hot features, more for multi-hot). May be fractional
            (an expectation); the bytes are rounded per destination.
        length_size: bytes of one KJT length. dmt's loaders give ``int32`` lengths
            (:func:`dmt.data.source.make_kjt`).
        id_size: bytes of one id. dmt's loaders give ``int64`` ids.
        row_block_ids: ``{feature name: ids per row block}``: how a row-wise feature's ids of
            the local batch fall into its row blocks (SPTT: by tower position; flat: by TorchRec
            shard). Default: uniform over rows (a block gets its share of the rows).
        comm_size: bytes of one pooled-embedding element on the wire (``sptt.comm_precision``:
            4 for fp32, 2 for bf16/fp16).
    """

    local_batch: int
    ids_per_feature: tuple[float, ...]
    length_size: int = 4
    id_size: int = 8
    row_block_ids: Mapping[str, Sequence[float]] = field(default_factory=dict)
    comm_size: int = 4

    def __post_init__(self) -> None:
        if self.local_batch <= 0:
            raise ValueError(f"local_batch must be positive, got {self.local_batch}")
        if any(n < 0 for n in self.ids_per_feature):
            raise ValueError(f"ids_per_feature must be >= 0, got {list(self.ids_per_feature)}")

    @classmethod
    def uniform(
        cls, local_batch: int, num_features: int, ids_per_sample: float = 1.0, **kwargs: object
    ) -> Workload:
        """Every feature with ``ids_per_sample`` ids per sample (1: one-hot, as Criteo)."""
        return cls(local_batch, (local_batch * ids_per_sample,) * num_features, **kwargs)  # type: ignore[arg-type]

    def block_ids(
        self, name: str, feature: int, block: int, rows: tuple[int, int], total: int
    ) -> float:
        """Ids of feature ``feature`` (``name``) in row block ``block`` spanning ``rows`` of
        ``total`` rows."""
        given = self.row_block_ids.get(name)
        if given is not None:
            return float(given[block])
        return self.ids_per_feature[feature] * (rows[1] - rows[0]) / total


# ---- helpers -------------------------------------------------------------------------------


def _split(
    src: int, dsts: Sequence[int], nbytes: Sequence[float], host_of: Callable[[int], int]
) -> tuple[int, int]:
    """``(intra-host, cross-host)`` bytes ``src`` sends, ``nbytes[i]`` to ``dsts[i]``."""
    intra = cross = 0.0
    home = host_of(src)
    for dst, n in zip(dsts, nbytes, strict=True):
        if dst == src:
            continue
        if host_of(dst) == home:
            intra += n
        else:
            cross += n
    return round(intra), round(cross)


def ring_allreduce_bytes(nbytes: int, group_size: int) -> int:
    """Bytes a rank sends to its ring successor in an all-reduce of ``nbytes`` (CommStats'
    ring model, :class:`dmt.sptt.dmt_sharding._AllReduceRecord`)."""
    return 2 * (group_size - 1) * nbytes // group_size


def _allreduce(
    step: str,
    group: str,
    ranks: Sequence[int],
    rank: int,
    nbytes: int,
    host_of: Callable[[int], int],
) -> CollectiveBytes:
    n = len(ranks)
    successor = ranks[(ranks.index(rank) + 1) % n]
    intra, cross = _split(rank, [successor], [ring_allreduce_bytes(nbytes, n)], host_of)
    return CollectiveBytes(step, "all_reduce", group, "backward", n, intra, cross, True)


def busiest(per_rank: Sequence[Sequence[CollectiveBytes]]) -> list[CollectiveBytes]:
    """Per collective (step, op, group, direction), the entry of the rank that sends the most
    cross-host bytes (ties: most bytes), in first-seen order."""
    best: dict[tuple[str, str, str, str], CollectiveBytes] = {}
    for entries in per_rank:
        for c in entries:
            key = (c.step, c.op, c.group, c.direction)
            old = best.get(key)
            if old is None or (c.cross_host_bytes, c.total_bytes) > (
                old.cross_host_bytes,
                old.total_bytes,
            ):
                best[key] = c
    return list(best.values())


# ---- SPTT ----------------------------------------------------------------------------------


def step_a_ids(plan: SPTTPlan, workload: Workload) -> Callable[[TableShard], float]:
    """Ids a source with ``workload`` sends to each shard in step a."""

    def ids_of(shard: TableShard) -> float:
        f = shard.feature
        if not plan.is_row_wise(f):
            return workload.ids_per_feature[f]
        position = plan.topology.position_of(shard.rank)
        return workload.block_ids(
            plan.feature_names[f],
            f,
            position,
            (shard.row_start, shard.row_stop),
            plan.num_embeddings[f],
        )

    return ids_of


def _step_a_bytes(plan: SPTTPlan, workload: Workload) -> list[float]:
    return step_a_bytes_per_dst(
        plan,
        workload.local_batch,
        step_a_ids(plan, workload),
        length_size=workload.length_size,
        id_size=workload.id_size,
    )


def sptt_rank_collectives(
    plan: SPTTPlan,
    rank: int,
    workload: Workload,
    *,
    tower_output_dims: Sequence[tuple[int, int]] | None = None,
    tower_param_bytes: Sequence[int] | None = None,
    dense_param_bytes: int = 0,
    step_a_bytes: Sequence[float] | None = None,
) -> list[CollectiveBytes]:
    """The collectives ``rank`` runs in one SPTT training step and the bytes it sends.

    Args:
        plan: the SPTT plan (:func:`dmt.sptt.plan.build_plan`).
        rank: global rank.
        workload: this rank's local batch (its ids decide step a).
        tower_output_dims: ``(V_t, D_t)`` per tower; ``None``: pass-through, ``(F_t, N)``.
        tower_param_bytes: bytes of each tower module's trainable parameters (DDP over the
            tower group; ``0`` or ``None``: no tower all-reduce).
        dense_param_bytes: bytes of the dense arch's trainable parameters (DDP over the world;
            ``0``: none).
        step_a_bytes: this rank's step a bytes per destination if already computed.

    Returns:
        Steps a (forward), d and f (forward and backward), ``tower_allreduce`` and
        ``dense_allreduce`` (backward) as this rank sends them.
    """
    topo = plan.topology
    host_of = topo.host_of
    B, T, KL = workload.local_batch, topo.num_towers, topo.tower_size
    tower = topo.tower_of(rank)
    mates, peers = topo.tower_ranks(tower), topo.peers_of(rank)
    size = workload.comm_size
    if tower_output_dims is None:
        tower_output_dims = [(len(fs), plan.embedding_dim) for fs in plan.tower_features]
    out: list[CollectiveBytes] = []

    a = step_a_bytes if step_a_bytes is not None else _step_a_bytes(plan, workload)
    out.append(
        CollectiveBytes(
            "a", "all_to_all", "world", "forward", topo.world_size,
            *_split(rank, topo.world_ranks, a, host_of), True,
        )
    )  # fmt: skip

    received, sent = step_d_split_sizes(plan, rank, T * B)
    for direction, elements in (("forward", sent), ("backward", received)):
        out.append(
            CollectiveBytes(
                "d", "all_to_all", "tower", direction, KL,
                *_split(rank, mates, [e * size for e in elements], host_of), False,
            )
        )  # fmt: skip
    block = step_d_reduce_scatter_block(plan, rank, T * B)
    if block:
        for direction, op in (("forward", "reduce_scatter"), ("backward", "all_gather")):
            out.append(
                CollectiveBytes(
                    "d", op, "tower", direction, KL,
                    *_split(rank, mates, [block * size] * KL, host_of), False,
                )
            )  # fmt: skip

    received, sent = step_f_split_sizes(tower_output_dims, tower, B)
    for direction, elements in (("forward", sent), ("backward", received)):
        out.append(
            CollectiveBytes(
                "f", "all_to_all", "peer", direction, T,
                *_split(rank, peers, [e * size for e in elements], host_of), True,
            )
        )  # fmt: skip

    if tower_param_bytes is not None and tower_param_bytes[tower] > 0:
        out.append(
            _allreduce("tower_allreduce", "tower", mates, rank, tower_param_bytes[tower], host_of)
        )
    if dense_param_bytes > 0:
        out.append(
            _allreduce(
                "dense_allreduce", "world", topo.world_ranks, rank, dense_param_bytes, host_of
            )
        )
    return out


def sptt_collectives(
    plan: SPTTPlan,
    workload: Workload,
    *,
    tower_output_dims: Sequence[tuple[int, int]] | None = None,
    tower_param_bytes: Sequence[int] | None = None,
    dense_param_bytes: int = 0,
) -> list[CollectiveBytes]:
    """The busiest rank's bytes of every collective of an SPTT step, every rank holding
    ``workload`` (see :func:`sptt_rank_collectives` for the arguments).

    Step a's bytes to each destination do not depend on the source under one workload, so they
    are computed once (``O(shards)``) and each rank's split in ``O(G)``.
    """
    a = _step_a_bytes(plan, workload)
    return busiest(
        [
            sptt_rank_collectives(
                plan,
                rank,
                workload,
                tower_output_dims=tower_output_dims,
                tower_param_bytes=tower_param_bytes,
                dense_param_bytes=dense_param_bytes,
                step_a_bytes=a,
            )
            for rank in range(plan.topology.world_size)
        ]
    )


__all__ = [
    "MODES",
    "CollectiveBytes",
    "Workload",
    "busiest",
    "ring_allreduce_bytes",
    "sptt_collectives",
    "sptt_rank_collectives",
    "step_a_ids",
]
