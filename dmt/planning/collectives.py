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

``overlappable`` marks what the pipelined schedule can hide behind compute: the sparse-input
all-to-alls (step a, ``flat_input_a2a``: TorchRec's ``TrainPipelineSparseDist`` runs them for the
next batch), step f (started before the bottom MLP, :meth:`SPTTDataflow.start_peer_exchange`,
and asynchronous in the backward) and the DDP all-reduces (bucketed during the backward). Step d
and the flat pooled-embedding exchanges sit on the critical path.

Shape legend: ``G`` ranks, ``L`` per host, ``K`` hosts per tower, ``T = G / (K L)`` towers,
``B`` local batch, ``N`` embedding dim.
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field, replace
from typing import Any, cast

from torch import nn
from torchrec.modules.embedding_modules import EmbeddingBagCollection

from dmt.sptt.plan import SPTTPlan, TableShard
from dmt.sptt.splits import (
    ring_allreduce_bytes,
    step_a_bytes_per_dst,
    step_d_reduce_scatter_block,
    step_d_split_sizes,
    step_f_split_sizes,
)
from dmt.sptt.topology import Topology

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
    received_intra_host_bytes: int = 0
    """Bytes the busiest *receiver* gets from other ranks on its host, for all-to-alls whose
    receivers can get more than any sender sends and that have no transposed backward to bound
    them (step a, ``flat_input_a2a``: a rank holding more tables than its peers receives more
    ids); filled by :func:`sptt_collectives` and :func:`flat_collectives`, 0 elsewhere."""
    received_cross_host_bytes: int = 0
    """As :attr:`received_intra_host_bytes`, from ranks on other hosts."""

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


def busiest_receiver(
    to: Sequence[float], ranks: Sequence[int], host_of: Callable[[int], int]
) -> tuple[int, int]:
    """``(intra-host, cross-host)`` bytes of the rank of ``ranks`` that receives the most
    cross-host bytes (ties: the most bytes) in an all-to-all where *every* rank sends ``to[r]``
    bytes to rank ``r`` (the sparse input when all ranks hold one workload): rank ``r`` gets
    ``to[r]`` from each other rank, those on its host intra-host, the others cross-host."""
    per_host = Counter(host_of(r) for r in ranks)
    best = (0, 0)
    for r in ranks:
        mates = per_host[host_of(r)] - 1
        intra, cross = round(to[r] * mates), round(to[r] * (len(ranks) - 1 - mates))
        if (cross, intra + cross) > (best[1], best[0] + best[1]):
            best = (intra, cross)
    return best


def _with_received(
    summary: list[CollectiveBytes], step: str, received: tuple[int, int]
) -> list[CollectiveBytes]:
    return [
        replace(c, received_intra_host_bytes=received[0], received_cross_host_bytes=received[1])
        if c.step == step
        else c
        for c in summary
    ]


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


def sptt_lookup_rows(plan: SPTTPlan, workload: Workload) -> list[float]:
    """Rows of ``N`` columns each rank looks up per step under SPTT, by rank: for every shard it
    holds, the ids all ``G`` sources send it in step a (a column-wise shard's as its share of
    ``N``). The busiest rank's sets the step's lookup time; they add up to the ids of the
    ``G`` local batches."""
    ids = step_a_ids(plan, workload)
    G, N = plan.topology.world_size, plan.embedding_dim
    return [G * sum(ids(s) * s.num_cols for s in plan.rank_shards(r)) / N for r in range(G)]


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
    # a tower of row-wise tables only moves nothing in this all-to-all: left out, since below
    # fp32 its reduce-scatter is an all-to-all too, which the summary would merge with this one
    # and the time model time again as its transposed backward (beside the all-gather)
    if any(received):
        for direction, elements in (("forward", sent), ("backward", received)):
            out.append(
                CollectiveBytes(
                    "d", "all_to_all", "tower", direction, KL,
                    *_split(rank, mates, [e * size for e in elements], host_of), False,
                )
            )  # fmt: skip
    block = step_d_reduce_scatter_block(plan, rank, T * B)
    if block:
        # below fp32 the reduce-scatter runs as an all-to-all of the blocks and a local sum
        # (dmt.sptt.collectives), the same bytes
        scatter = "reduce_scatter" if size == 4 else "all_to_all"
        for direction, op in (("forward", scatter), ("backward", "all_gather")):
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
    are computed once (``O(shards)``) and each rank's split in ``O(G)``; its entry also carries
    the busiest receiver's bytes (:func:`busiest_receiver`).
    """
    a = _step_a_bytes(plan, workload)
    topo = plan.topology
    summary = busiest(
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
            for rank in range(topo.world_size)
        ]
    )
    return _with_received(summary, "a", busiest_receiver(a, topo.world_ranks, topo.host_of))


# ---- flat TorchRec sharding -----------------------------------------------------------------

TABLE_WISE_LIKE = ("table_wise", "column_wise", "table_column_wise")
"""TorchRec sharding types whose shards act like whole tables on their rank: the input KJT
all-to-all sends each shard its feature, the output all-to-all returns the pooled columns."""
FLAT_SHARDING_TYPES = (*TABLE_WISE_LIKE, "row_wise", "table_row_wise", "data_parallel")


@dataclass(frozen=True)
class FlatShard:
    """Rows ``[row_start, row_stop)`` and columns ``[col_start, col_stop)`` on ``rank``."""

    rank: int
    row_start: int
    row_stop: int
    col_start: int
    col_stop: int


@dataclass(frozen=True)
class FlatTable:
    """One table of a TorchRec ``ShardingPlan``: the feature it reads and its shards."""

    name: str
    feature: int
    """Index of the feature it reads (the :class:`Workload`'s order)."""
    feature_name: str
    num_embeddings: int
    embedding_dim: int
    sharding_type: str
    """A TorchRec ``ShardingType`` value, one of :data:`FLAT_SHARDING_TYPES`."""
    shards: tuple[FlatShard, ...]
    """By row offset then rank (empty for ``data_parallel``)."""
    compute_kernel: str = "fused"
    """TorchRec's ``EmbeddingComputeKernel`` value of the table's shards."""


def flat_tables(plan: Any, module: nn.Module, feature_names: Sequence[str]) -> list[FlatTable]:
    """The tables of TorchRec's ``ShardingPlan`` ``plan`` of ``module``'s
    ``EmbeddingBagCollection`` s, each reading one feature of ``feature_names``.

    Raises:
        ValueError: for a table that reads several features or a sharding type this module
            does not count (naming it).
    """
    index = {name: f for f, name in enumerate(feature_names)}
    out = []
    for path, module_plan in plan.plan.items():
        ebc = cast(EmbeddingBagCollection, module.get_submodule(path))
        configs = {c.name: c for c in ebc.embedding_bag_configs()}
        for name, sharding in module_plan.items():
            config = configs[name]
            if len(config.feature_names) != 1:
                raise ValueError(
                    f"table {name!r} reads {len(config.feature_names)} features; the planner "
                    "counts one feature per table"
                )
            kind = sharding.sharding_type
            if kind not in FLAT_SHARDING_TYPES:
                raise ValueError(
                    f"table {name!r} is sharded {kind!r}, not one of {list(FLAT_SHARDING_TYPES)}"
                )
            shards = []
            if sharding.sharding_spec is not None:
                for m in sharding.sharding_spec.shards:
                    (r, c), (h, w) = m.shard_offsets, m.shard_sizes
                    shards.append(FlatShard(m.placement.rank(), r, r + h, c, c + w))
            feature = config.feature_names[0]
            out.append(
                FlatTable(
                    name,
                    index[feature],
                    feature,
                    config.num_embeddings,
                    config.embedding_dim,
                    kind,
                    tuple(sorted(shards, key=lambda s: (s.row_start, s.col_start, s.rank))),
                    sharding.compute_kernel,
                )
            )
    return out


def _row_block_ids(table: FlatTable, workload: Workload) -> list[float]:
    """Ids of the local batch in each row shard of ``table`` (by row offset)."""
    return [
        workload.block_ids(
            table.feature_name,
            table.feature,
            i,
            (s.row_start, s.row_stop),
            table.num_embeddings,
        )
        for i, s in enumerate(table.shards)
    ]


def flat_lookup_rows(
    tables: Sequence[FlatTable], world_size: int, workload: Workload
) -> list[float]:
    """Rows of ``N`` columns each rank looks up per step under flat TorchRec sharding, by rank:
    a table-, column- or table-column-wise shard the feature's ids of all ``G`` local batches
    (as its share of the table's columns), a row-wise or table-row-wise shard those of its row
    block, a data-parallel table this rank's own."""
    G = world_size
    out = [0.0] * G
    for t in tables:
        if t.sharding_type == "data_parallel":
            for r in range(G):
                out[r] += workload.ids_per_feature[t.feature]
        elif t.sharding_type in TABLE_WISE_LIKE:
            for s in t.shards:
                share = (s.col_stop - s.col_start) / t.embedding_dim
                out[s.rank] += G * workload.ids_per_feature[t.feature] * share
        else:
            for s, n in zip(t.shards, _row_block_ids(t, workload), strict=True):
                out[s.rank] += G * n * (s.col_stop - s.col_start) / t.embedding_dim
    return out


def flat_input_bytes(
    tables: Sequence[FlatTable], world_size: int, workload: Workload
) -> dict[str, list[float]]:
    """Bytes one source rank with ``workload`` sends to each rank in the input KJT all-to-all
    of every sharding type: ``B`` lengths and the ids each shard looks up (all of the
    feature's for table/column-wise shards, those of its row block for row-wise ones)."""
    B, ls, ids = workload.local_batch, workload.length_size, workload.id_size
    out: dict[str, list[float]] = {}
    for t in tables:
        if t.sharding_type == "data_parallel":
            continue
        to = out.setdefault(t.sharding_type, [0.0] * world_size)
        if t.sharding_type in TABLE_WISE_LIKE:
            for s in t.shards:
                to[s.rank] += B * ls + workload.ids_per_feature[t.feature] * ids
        else:
            for s, n in zip(t.shards, _row_block_ids(t, workload), strict=True):
                to[s.rank] += B * ls + n * ids
    return out


def flat_rank_collectives(
    tables: Sequence[FlatTable],
    hosts: Topology,
    rank: int,
    workload: Workload,
    *,
    dense_param_bytes: int = 0,
    input_bytes: Sequence[float] | None = None,
) -> list[CollectiveBytes]:
    """The collectives ``rank`` runs in one step of flat TorchRec sharding and its bytes.

    Per sharding type, as TorchRec's sharded ``EmbeddingBagCollection`` runs them:

    * table-, column- and table-column-wise: the input KJT all-to-all over the world
      (``flat_input_a2a``: TorchRec runs one per sharding type, one after another; they are one
      entry here, their sum), then the pooled all-to-all (``flat_output_a2a``): ``rank`` sends
      ``B W_r`` values to every rank (``W_r`` its shards' columns), and gets ``B W_q`` gradients
      back from each rank ``q`` in the backward;
    * row-wise: the bucketized input all-to-all, then a reduce-scatter over the world of the
      ``(G B, W)`` partial sums (``W`` the row-wise tables' columns; the backward all-gathers);
    * table-row-wise: the input all-to-all to the host holding the table, then a reduce-scatter
      over the host (group ``"host"``, blocks of ``G B / L`` rows of the host's ``W_h``
      columns) and an all-to-all over the ranks of equal local rank (group ``"cross"``, ``B
      W_h`` to each host); the backward reverses both;
    * data-parallel: its weights join the dense all-reduce.

    The dense all-reduce (DDP over the world) of ``dense_param_bytes`` plus the data-parallel
    tables ends the backward.

    Args:
        tables: :func:`flat_tables` of TorchRec's plan.
        hosts: ``Topology(G, L)``: the host of every rank.
        rank: global rank.
        workload: this rank's local batch.
        dense_param_bytes: bytes of the parameters DDP all-reduces.
        input_bytes: bytes to each rank over every sharding type's input all-to-all, if already
            computed (:func:`flat_input_bytes` of ``workload``, summed over types).
    """
    G, L, B = hosts.world_size, hosts.local_world_size, workload.local_batch
    host_of, size, world = hosts.host_of, workload.comm_size, hosts.world_ranks
    to = input_bytes if input_bytes is not None else _summed(flat_input_bytes(tables, G, workload))
    out: list[CollectiveBytes] = []
    if to:  # one all-to-all per sharding type, one after another: one entry, their sum
        out.append(
            CollectiveBytes(
                "flat_input_a2a", "all_to_all", "world", "forward", G,
                *_split(rank, world, to, host_of), True,
            )
        )  # fmt: skip
    kinds = list(dict.fromkeys(t.sharding_type for t in tables))
    dp_bytes = 0
    for kind in kinds:
        of_kind = [t for t in tables if t.sharding_type == kind]
        if kind == "data_parallel":
            dp_bytes += sum(4 * t.num_embeddings * t.embedding_dim for t in of_kind)
            continue
        if kind in TABLE_WISE_LIKE:
            width = [0] * G
            for t in of_kind:
                for s in t.shards:
                    width[s.rank] += s.col_stop - s.col_start
            for direction, sent in (
                ("forward", [B * width[rank] * size] * G),
                ("backward", [B * w * size for w in width]),
            ):
                out.append(
                    CollectiveBytes(
                        "flat_output_a2a", "all_to_all", "world", direction, G,
                        *_split(rank, world, sent, host_of), False,
                    )
                )  # fmt: skip
        elif kind == "row_wise":
            block = B * sum(t.embedding_dim for t in of_kind) * size
            for direction, op in (("forward", "reduce_scatter"), ("backward", "all_gather")):
                out.append(
                    CollectiveBytes(
                        "flat_output_a2a", op, "world", direction, G,
                        *_split(rank, world, [block] * G, host_of), False,
                    )
                )  # fmt: skip
        else:  # table_row_wise
            host_width = [0] * hosts.num_hosts
            for t in of_kind:
                host_width[host_of(t.shards[0].rank)] += t.embedding_dim
            mine = host_of(rank)
            local = hosts.host_ranks(mine)
            cross = world[hosts.local_rank_of(rank) :: L]
            block = (G // L) * B * host_width[mine] * size
            a2a = {
                "forward": [B * host_width[mine] * size] * len(cross),
                "backward": [B * w * size for w in host_width],
            }
            for direction, op in (("forward", "reduce_scatter"), ("backward", "all_gather")):
                out.append(
                    CollectiveBytes(
                        "flat_output_a2a", op, "host", direction, L,
                        *_split(rank, local, [block] * L, host_of), False,
                    )
                )  # fmt: skip
                out.append(
                    CollectiveBytes(
                        "flat_output_a2a", "all_to_all", "cross", direction, len(cross),
                        *_split(rank, cross, a2a[direction], host_of), False,
                    )
                )  # fmt: skip
    if dense_param_bytes + dp_bytes > 0:
        out.append(
            _allreduce(
                "dense_allreduce", "world", world, rank, dense_param_bytes + dp_bytes, host_of
            )
        )
    return out


def flat_collectives(
    tables: Sequence[FlatTable],
    hosts: Topology,
    workload: Workload,
    *,
    dense_param_bytes: int = 0,
) -> list[CollectiveBytes]:
    """The busiest rank's bytes of every collective of a flat TorchRec step, every rank
    holding ``workload`` (see :func:`flat_rank_collectives`); the input all-to-all's entry also
    carries the busiest receiver's bytes (:func:`busiest_receiver`, over every sharding type)."""
    to = _summed(flat_input_bytes(tables, hosts.world_size, workload))
    summary = busiest(
        [
            flat_rank_collectives(
                tables,
                hosts,
                rank,
                workload,
                dense_param_bytes=dense_param_bytes,
                input_bytes=to,
            )
            for rank in range(hosts.world_size)
        ]
    )
    if not to:
        return summary
    received = busiest_receiver(to, hosts.world_ranks, hosts.host_of)
    return _with_received(summary, "flat_input_a2a", received)


def _summed(per_kind: Mapping[str, Sequence[float]]) -> list[float]:
    """Bytes to each rank over every sharding type's input all-to-all (empty: none)."""
    return [sum(column) for column in zip(*per_kind.values(), strict=True)]


__all__ = [
    "MODES",
    "FlatShard",
    "FlatTable",
    "flat_collectives",
    "flat_input_bytes",
    "flat_rank_collectives",
    "flat_tables",
    "CollectiveBytes",
    "Workload",
    "busiest",
    "busiest_receiver",
    "sptt_collectives",
    "sptt_rank_collectives",
    "step_a_ids",
]
