"""Placement of embedding tables inside towers, and the feature layouts of SPTT steps a-f.

Pure functions of integers and names (no ``torch``, no process groups), unit tested in
milliseconds.

Every feature has one table (``N`` columns), sharded inside the feature's tower in one of three
ways (paper section 3.1.3 and section 4; the names are TorchRec's ``ShardingType`` values):

* ``"table_wise"``: the whole table on one rank of the tower;
* ``"column_wise"``: column blocks on distinct ranks of the tower; every block sees all of the
  feature's ids, step d moves the blocks like small tables and step e glues the columns back;
* ``"row_wise"``: one row block on every rank of the tower; step a sends each id to the rank of
  its row, the lookups give partial sums, and step d adds them up with one reduce-scatter over the
  tower (so SUM pooling only).

A :class:`SPTTPlan` holds the shards and derives the orders the dataflow needs:

* step a sends, to each rank in turn, one jagged feature per shard it holds
  (:meth:`SPTTPlan.rank_shards`; :attr:`SPTTPlan.input_splits` counts them);
* step b looks up those shards; their pooled columns come out in the same order, the table- and
  column-wise ones (:meth:`SPTTPlan.all_to_all_width` columns) before the row-wise ones;
* step d sends the table/column-wise columns by all-to-all and reduce-scatters the row-wise ones;
* step e picks, for every feature of the tower in tower order and every embedding column, its
  column in what step d received (:meth:`SPTTPlan.tower_column_index`);
* step f returns the towers' outputs by tower; for pass-through towers
  :attr:`SPTTPlan.output_permutation` puts the concatenated features back into model order.

Given a :class:`~dmt.memory.MemoryBudget`, :func:`build_plan` checks every rank's shards plus
their optimizer state against it and gives each shard its compute kernel
(:attr:`TableShard.compute_kernel`): in the rank's own memory, or, on CUDA, UVM-cached when the
rank's HBM is short (:func:`dmt.memory.choose_kernels`). :meth:`SPTTPlan.describe` is the plan
as ``sharding_plan.txt`` shows it.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass, replace
from functools import cached_property
from typing import Literal

from dmt.memory import (
    COMPUTE_KERNELS,
    FUSED,
    FUSED_UVM_CACHING,
    SPARSE_OPTIMIZERS,
    MemoryBudget,
    choose_kernels,
    resident_state_bytes,
    table_bytes,
)
from dmt.sptt.topology import Topology

ShardingKind = Literal["table_wise", "column_wise", "row_wise"]
SHARDING_KINDS: tuple[str, ...] = ("table_wise", "column_wise", "row_wise")


@dataclass(frozen=True)
class TableShard:
    """Rows ``[row_start, row_stop)`` and columns ``[col_start, col_stop)`` of one feature's table."""

    feature: int
    """Index of the feature (model order)."""
    rank: int
    """Global rank holding the shard."""
    row_start: int
    row_stop: int
    col_start: int
    col_stop: int
    compute_kernel: str = FUSED
    """TorchRec ``EmbeddingComputeKernel`` value: ``"fused"`` (HBM on CUDA, host memory on CPU)
    or ``"fused_uvm_caching"`` (host memory with an HBM cache, CUDA)."""

    @property
    def num_rows(self) -> int:
        return self.row_stop - self.row_start

    @property
    def num_cols(self) -> int:
        return self.col_stop - self.col_start


@dataclass(frozen=True)
class SPTTPlan:
    """Shards of ``F`` features' tables on the ranks of their towers.

    Build with :func:`build_plan`; the constructor validates a hand-made plan.

    Args:
        topology: hosts, towers and peers.
        feature_names: the ``F`` sparse feature names, in model order (the KJT key order).
        tower_features: ``T`` tuples of feature indices, a partition of ``range(F)``; tower
            ``t``'s order is the order its tower module sees.
        embedding_dim: ``N``, the columns of every table.
        num_embeddings: rows of each feature's table.
        sharding_types: each feature's sharding kind (see the module docstring).
        shards: every shard of every table.
        sparse_optimizer: the fused optimizer whose state the shards carry (its state layout
            as :mod:`dmt.memory` names it, :func:`dmt.optim.sparse_optimizer_name`; ``None``: none), for the bytes of :meth:`shard_bytes`.
        memory: the budget the compute kernels were chosen for (``None``: unchecked).
    """

    topology: Topology
    feature_names: tuple[str, ...]
    tower_features: tuple[tuple[int, ...], ...]
    embedding_dim: int
    num_embeddings: tuple[int, ...]
    sharding_types: tuple[str, ...]
    shards: tuple[TableShard, ...]
    sparse_optimizer: str | None = None
    memory: MemoryBudget | None = None

    def __post_init__(self) -> None:
        topo = self.topology
        F = len(self.feature_names)
        if len(set(self.feature_names)) != F:
            raise ValueError(f"feature_names has duplicates: {list(self.feature_names)}")
        if len(self.tower_features) != topo.num_towers:
            raise ValueError(
                f"tower_features has {len(self.tower_features)} towers, the topology has "
                f"T={topo.num_towers} (G={topo.world_size} / (K={topo.hosts_per_tower} * "
                f"L={topo.local_world_size}))"
            )
        flat = [f for tower in self.tower_features for f in tower]
        if sorted(flat) != list(range(F)):
            raise ValueError(
                f"tower_features must partition range({F}) (every feature in exactly one "
                f"tower), got {[list(t) for t in self.tower_features]}"
            )
        if any(len(tower) == 0 for tower in self.tower_features):
            raise ValueError(
                "every tower needs at least one feature, got "
                f"{[list(t) for t in self.tower_features]}"
            )
        _check_sizes(F, self.embedding_dim, self.num_embeddings)
        if len(self.sharding_types) != F or any(
            s not in SHARDING_KINDS for s in self.sharding_types
        ):
            raise ValueError(
                f"need {F} sharding_types out of {SHARDING_KINDS}, got {list(self.sharding_types)}"
            )
        if any(not 0 <= s.feature < F for s in self.shards):
            raise ValueError(f"shards name features outside range({F})")
        if self.sparse_optimizer is not None and self.sparse_optimizer not in SPARSE_OPTIMIZERS:
            raise ValueError(
                f"sparse_optimizer {self.sparse_optimizer!r} is not one of {list(SPARSE_OPTIMIZERS)}"
            )
        for s in self.shards:
            if s.compute_kernel not in COMPUTE_KERNELS:
                raise ValueError(
                    f"a shard of {self.feature_names[s.feature]!r} has compute kernel "
                    f"{s.compute_kernel!r}, not one of {list(COMPUTE_KERNELS)}"
                )
            cuda = self.memory is not None and self.memory.compute_device == "cuda"
            if s.compute_kernel == FUSED_UVM_CACHING and not (cuda and self.sparse_optimizer):
                raise ValueError(
                    f"a shard of {self.feature_names[s.feature]!r} is UVM-cached, which needs "
                    "a CUDA memory budget and a fused sparse optimizer"
                )
        for f in range(F):
            self._check_shards(f, self.feature_shards(f))

    def _check_shards(self, f: int, shards: tuple[TableShard, ...]) -> None:
        topo, N, rows = self.topology, self.embedding_dim, self.num_embeddings[f]
        kind, tower = self.sharding_types[f], self.tower_of_feature(f)
        what = f"feature {self.feature_names[f]!r} ({kind}, tower {tower})"
        if not shards:
            raise ValueError(f"{what} has no shard")
        for s in shards:
            if s.rank not in topo.tower_ranks(tower):
                raise ValueError(
                    f"{what} has a shard on rank {s.rank}, which is not in its tower "
                    f"(ranks {topo.tower_ranks(tower)})"
                )
        ranks = [s.rank for s in shards]
        if len(set(ranks)) != len(ranks):
            raise ValueError(f"{what} has two shards on one rank: {ranks}")
        full_rows = all((s.row_start, s.row_stop) == (0, rows) for s in shards)
        full_cols = all((s.col_start, s.col_stop) == (0, N) for s in shards)
        if kind == "table_wise" and not (len(shards) == 1 and full_rows and full_cols):
            raise ValueError(f"{what} needs one shard of the whole table, got {shards}")
        if kind == "column_wise" and not (
            full_rows and _tiles([(s.col_start, s.col_stop) for s in shards], N)
        ):
            raise ValueError(f"{what} needs all rows and columns tiling [0, {N}), got {shards}")
        if kind == "row_wise":
            if self.num_embeddings[f] < topo.tower_size:
                raise ValueError(
                    f"{what} has {rows} row{'' if rows == 1 else 's'}, fewer than the K*L={topo.tower_size} ranks of a tower"
                )
            if not (
                full_cols
                and ranks == list(topo.tower_ranks(tower))
                and _tiles([(s.row_start, s.row_stop) for s in shards], rows, in_order=True)
            ):
                raise ValueError(
                    f"{what} needs one row block on every rank of its tower, by position, "
                    f"tiling [0, {rows}), got {shards}"
                )

    # ---- features and shards -----------------------------------------------------------------

    @property
    def num_features(self) -> int:
        """``F``."""
        return len(self.feature_names)

    @cached_property
    def _feature_tower(self) -> tuple[int, ...]:
        out = [0] * self.num_features
        for t, tower in enumerate(self.tower_features):
            for f in tower:
                out[f] = t
        return tuple(out)

    def tower_of_feature(self, feature: int) -> int:
        """Tower of feature index ``feature``."""
        return self._feature_tower[feature]

    def feature_shards(self, feature: int) -> tuple[TableShard, ...]:
        """The shards of ``feature``'s table, by rank."""
        return tuple(sorted((s for s in self.shards if s.feature == feature), key=_by_rank))

    @cached_property
    def _rank_shards(self) -> tuple[tuple[TableShard, ...], ...]:
        held: list[list[TableShard]] = [[] for _ in range(self.topology.world_size)]
        order = {f: i for tower in self.tower_features for i, f in enumerate(tower)}
        for s in self.shards:
            held[s.rank].append(s)
        return tuple(
            tuple(sorted(h, key=lambda s: (self.is_row_wise(s.feature), order[s.feature])))
            for h in held
        )

    def rank_shards(self, rank: int) -> tuple[TableShard, ...]:
        """Shards ``rank`` holds, in lookup order: table/column-wise ones first, each group in
        tower order. At most one shard per feature."""
        return self._rank_shards[rank]

    def is_row_wise(self, feature: int) -> bool:
        return self.sharding_types[feature] == "row_wise"

    @property
    def input_splits(self) -> tuple[int, ...]:
        """Jagged features (one per shard) sent to each rank in step a."""
        return tuple(len(s) for s in self._rank_shards)

    def all_to_all_width(self, rank: int) -> int:
        """Pooled columns of ``rank``'s table- and column-wise shards (moved by step d's a2a)."""
        return sum(s.num_cols for s in self.rank_shards(rank) if not self.is_row_wise(s.feature))

    def lookup_width(self, rank: int) -> int:
        """Pooled columns of ``rank``'s lookup (step b), ``W_r + R_t N``: all its shards' columns."""
        return sum(s.num_cols for s in self.rank_shards(rank))

    def row_wise_features(self, tower: int) -> tuple[int, ...]:
        """Row-wise features of ``tower``, in tower order (reduce-scattered in step d)."""
        return tuple(f for f in self.tower_features[tower] if self.is_row_wise(f))

    def tower_column_index(self, tower: int) -> tuple[int, ...]:
        """Step e: for each feature of ``tower`` (tower order) and each of its ``N`` columns, the
        column of the received row ``[a2a columns from each tower-mate by position | row-wise
        features]`` that holds it."""
        where: dict[tuple[int, int], int] = {}
        col = 0
        for rank in self.topology.tower_ranks(tower):
            for s in self.rank_shards(rank):
                if not self.is_row_wise(s.feature):
                    for c in range(s.col_start, s.col_stop):
                        where[(s.feature, c)] = col
                        col += 1
        for f in self.row_wise_features(tower):
            for c in range(self.embedding_dim):
                where[(f, c)] = col
                col += 1
        return tuple(
            where[(f, c)] for f in self.tower_features[tower] for c in range(self.embedding_dim)
        )

    # ---- memory ------------------------------------------------------------------------------

    def shard_bytes(self, shard: TableShard) -> int:
        """Bytes of ``shard`` plus its optimizer state (fp32)."""
        return table_bytes(self.sparse_optimizer or "sgd", shard.num_rows, shard.num_cols)

    def location(self, shard: TableShard) -> str:
        """Where ``shard`` lives: ``"hbm"``, ``"uvm_caching"`` (host memory, cached in HBM),
        ``"ddr"`` (CPU) or ``"device"`` (no budget given: the training device's memory)."""
        if shard.compute_kernel == FUSED_UVM_CACHING:
            return "uvm_caching"
        if self.memory is None:
            return "device"
        return "hbm" if self.memory.compute_device == "cuda" else "ddr"

    def describe(self) -> str:
        """The plan, readable: the topology and budget, then per table its tower, sharding type
        and shards (rank, rows, cols, compute kernel, location, bytes with optimizer state)."""
        topo = self.topology
        lines = [
            f"SPTT plan: G={topo.world_size} ranks, L={topo.local_world_size} per host, "
            f"K={topo.hosts_per_tower} hosts per tower, T={topo.num_towers} towers, "
            f"N={self.embedding_dim}",
            f"sparse optimizer: {self.sparse_optimizer or 'none'} (bytes: fp32 table + state)",
            "memory budget: " + (self.memory.describe() if self.memory else "not checked"),
            "",
        ]
        for f, name in enumerate(self.feature_names):
            lines.append(
                f"table {name}: tower {self.tower_of_feature(f)}, {self.sharding_types[f]}, "
                f"{self.num_embeddings[f]} x {self.embedding_dim}"
            )
            for s in self.feature_shards(f):
                lines.append(
                    f"  rank {s.rank}: rows [{s.row_start}, {s.row_stop}) cols "
                    f"[{s.col_start}, {s.col_stop}) kernel {s.compute_kernel} location "
                    f"{self.location(s)} bytes {self.shard_bytes(s)}"
                )
        lines.append("")
        for rank in range(topo.world_size):
            held = self.rank_shards(rank)
            total = sum(self.shard_bytes(s) for s in held)
            cached = sum(self.shard_bytes(s) for s in held if s.compute_kernel == FUSED_UVM_CACHING)
            lines.append(
                f"rank {rank}: {len(held)} shard(s), {total} bytes, {cached} of them UVM-cached"
            )
        return "\n".join(lines) + "\n"

    @property
    def output_permutation(self) -> tuple[int, ...]:
        """Indices into the towers' features concatenated by tower that give model order."""
        index = {f: i for i, f in enumerate(f for tower in self.tower_features for f in tower)}
        return tuple(index[f] for f in range(self.num_features))


def _by_rank(shard: TableShard) -> int:
    return shard.rank


def _check_sizes(num_features: int, embedding_dim: int, num_embeddings: Sequence[int]) -> None:
    """Raise ``ValueError`` unless ``N`` and the rows of each of the ``F`` tables are positive."""
    if embedding_dim <= 0:
        raise ValueError(f"embedding_dim must be positive, got {embedding_dim}")
    if len(num_embeddings) != num_features or any(n <= 0 for n in num_embeddings):
        raise ValueError(f"need {num_features} positive num_embeddings, got {list(num_embeddings)}")


def _tiles(ranges: list[tuple[int, int]], size: int, *, in_order: bool = False) -> bool:
    """Whether non-empty ``[start, stop)`` ranges tile ``[0, size)`` (``in_order``: one after
    the other in the order given)."""
    position = 0
    for start, stop in ranges if in_order else sorted(ranges):
        if start != position or stop <= start:
            return False
        position = stop
    return position == size


def _least_loaded(load: list[float]) -> int:
    return min(range(len(load)), key=lambda p: (load[p], p))


def _blocks(size: int, parts: int) -> list[tuple[int, int]]:
    """``[0, size)`` split into ``parts`` contiguous blocks whose sizes differ by at most one."""
    q, r = divmod(size, parts)
    bounds = [0]
    for i in range(parts):
        bounds.append(bounds[-1] + q + (1 if i < r else 0))
    return list(zip(bounds[:-1], bounds[1:]))


def column_split(
    embedding_dim: int, tower_size: int, column_multiple: int = 1
) -> list[tuple[int, int]]:
    """The column blocks ``[start, stop)`` of a column-wise table of ``embedding_dim`` (``N``)
    columns in a tower of ``tower_size`` (``K L``) ranks: ``min(K L, N / column_multiple)``
    near-equal blocks, each a multiple of ``column_multiple`` wide (:func:`build_plan`'s)."""
    units = embedding_dim // column_multiple
    return [
        (column_multiple * a, column_multiple * b)
        for a, b in _blocks(units, min(tower_size, units))
    ]


def build_plan(
    topology: Topology,
    feature_names: Sequence[str],
    tower_features: Sequence[Sequence[int]],
    *,
    embedding_dim: int,
    num_embeddings: Sequence[int],
    sharding_types: Mapping[str, str] | None = None,
    costs: Sequence[float] | None = None,
    column_multiple: int = 1,
    sparse_optimizer: str | None = None,
    memory: MemoryBudget | None = None,
) -> SPTTPlan:
    """Shard every feature's table inside its tower, balancing ``costs``.

    Row-wise tables get one near-equal row block per tower rank. Column-wise tables get
    ``min(K L, N / column_multiple)`` near-equal column blocks, each a multiple of
    ``column_multiple`` wide, on consecutive positions starting at the least loaded one.
    Table-wise tables then go, in decreasing cost (equal costs: in tower order), to the least
    loaded rank of the tower (ties: lowest position). A shard's load is the table's cost times
    its share of the table. Deterministic, so every rank computes the same plan.

    Args:
        topology: hosts, towers and peers.
        feature_names: the ``F`` sparse feature names in model order.
        tower_features: ``T`` sequences of feature indices partitioning ``range(F)``.
        embedding_dim: ``N``.
        num_embeddings: rows of each feature's table.
        sharding_types: ``{feature name: kind}`` for features that are not table-wise.
        costs: per-feature cost (e.g. rows x N, or lookups per sample); ``None`` counts tables.
        column_multiple: width unit of column-wise blocks (FBGEMM's kernels need 4); must
            divide ``N``.
        sparse_optimizer: the fused optimizer (:mod:`dmt.memory`'s state-layout names) whose state counts
            against ``memory``; ``None``: no state.
        memory: every rank's budget; ``None`` places every shard in the device's memory
            unchecked. Given, each rank's shards plus optimizer state must fit (on CUDA,
            UVM-caching the largest ones when HBM is short; :func:`dmt.memory.choose_kernels`).

    Returns:
        The plan.

    Raises:
        ValueError: on an impossible layout, or a rank whose shards do not fit in ``memory``
            (naming the table, its bytes, the rank and the budget).
    """
    F = len(feature_names)
    kinds = ["table_wise"] * F
    index = {name: f for f, name in enumerate(feature_names)}
    for name, kind in (sharding_types or {}).items():
        if name not in index:
            raise ValueError(f"sharding_types names unknown feature {name!r}")
        if kind not in SHARDING_KINDS:
            raise ValueError(f"sharding type {kind!r} of {name!r} is not one of {SHARDING_KINDS}")
        kinds[index[name]] = kind
    costs = [1.0] * F if costs is None else list(costs)
    if len(costs) != F or len(num_embeddings) != F:
        raise ValueError(
            f"costs ({len(costs)}) and num_embeddings ({len(num_embeddings)}) need {F} entries"
        )
    towers = tuple(tuple(int(f) for f in tower) for tower in tower_features)
    if len(towers) != topology.num_towers:
        raise ValueError(
            f"tower_features has {len(towers)} towers, the topology has T={topology.num_towers}"
        )
    _check_sizes(F, embedding_dim, num_embeddings)
    KL, N = topology.tower_size, embedding_dim
    if column_multiple <= 0 or N % column_multiple:
        raise ValueError(
            f"column_multiple={column_multiple} must be positive and divide embedding_dim={N}"
        )
    shards: list[TableShard] = []
    for t, tower in enumerate(towers):
        if any(not 0 <= f < F for f in tower):
            raise ValueError(f"tower {t} has feature indices outside range({F})")
        load = [0.0] * KL
        for f in (f for f in tower if kinds[f] == "row_wise"):
            rows = num_embeddings[f]
            for p, (start, stop) in enumerate(_blocks(rows, KL)):
                load[p] += costs[f] * (stop - start) / rows
                shards.append(TableShard(f, topology.rank_at(t, p), start, stop, 0, N))
        for f in (f for f in tower if kinds[f] == "column_wise"):
            first = _least_loaded(load)
            for i, (start, stop) in enumerate(column_split(N, KL, column_multiple)):
                p = (first + i) % KL
                load[p] += costs[f] * (stop - start) / N
                shards.append(
                    TableShard(f, topology.rank_at(t, p), 0, num_embeddings[f], start, stop)
                )
        table_wise = [f for f in tower if kinds[f] == "table_wise"]
        for f in sorted(table_wise, key=lambda f: (-costs[f], tower.index(f))):
            p = _least_loaded(load)
            load[p] += costs[f]
            shards.append(TableShard(f, topology.rank_at(t, p), 0, num_embeddings[f], 0, N))
    if memory is not None:
        shards = _place(shards, feature_names, num_embeddings, N, sparse_optimizer, memory)
    return SPTTPlan(
        topology=topology,
        feature_names=tuple(feature_names),
        tower_features=towers,
        embedding_dim=embedding_dim,
        num_embeddings=tuple(num_embeddings),
        sharding_types=tuple(kinds),
        shards=tuple(shards),
        sparse_optimizer=sparse_optimizer,
        memory=memory,
    )


def _place(
    shards: list[TableShard],
    feature_names: Sequence[str],
    num_embeddings: Sequence[int],
    embedding_dim: int,
    sparse_optimizer: str | None,
    memory: MemoryBudget,
) -> list[TableShard]:
    """``shards`` with the compute kernel :func:`choose_kernels` gives them on their rank."""
    by_rank: dict[int, list[int]] = {}
    for i, s in enumerate(shards):
        by_rank.setdefault(s.rank, []).append(i)
    out = list(shards)
    for rank, held in sorted(by_rank.items()):
        tables, resident = [], []
        for i in held:
            s = shards[i]
            name = feature_names[s.feature]
            if (s.num_rows, s.num_cols) != (num_embeddings[s.feature], embedding_dim):
                name += f" rows [{s.row_start}, {s.row_stop}) cols [{s.col_start}, {s.col_stop})"
            nbytes = table_bytes(sparse_optimizer or "sgd", s.num_rows, s.num_cols)
            tables.append((name, nbytes, s.num_rows))
            resident.append(resident_state_bytes(sparse_optimizer or "sgd", s.num_rows))
        kernels = choose_kernels(tables, memory, rank=rank, resident=resident)
        for i, kernel in zip(held, kernels):
            out[i] = replace(shards[i], compute_kernel=kernel)
    return out
