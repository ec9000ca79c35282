"""Per-rank memory budget of the embedding tables and their optimizer state (pure).

A rank's tables, with the fused sparse optimizer's state, must fit in its memory: on CUDA in HBM
(``hbm_bytes``), or, for tables placed with UVM caching (TorchRec's ``FUSED_UVM_CACHING`` kernel,
FBGEMM's ``EmbeddingLocation.MANAGED_CACHING``), in host memory (``ddr_bytes``) with a cache of
``uvm_cache_load_factor`` of their rows in HBM; on CPU every table lives in host memory. The flat
baseline hands the same budget to TorchRec's planner (:mod:`dmt.sharding`); the SPTT plan checks
it with :func:`choose_kernels` (:func:`dmt.sptt.plan.build_plan`).

Bytes are fp32: a table of ``rows x cols`` takes ``4 rows cols`` bytes, plus its optimizer state
(:func:`optimizer_state_bytes`).
"""

from __future__ import annotations

import logging
import math
from collections.abc import Sequence
from dataclasses import dataclass
from fractions import Fraction

import numpy as np

log = logging.getLogger(__name__)

GIB = 1024**3
VALUE_BYTES = 4  # fp32 weights and optimizer state

# TorchRec's ``EmbeddingComputeKernel`` values (plan.py stays free of torch imports)
FUSED = "fused"
"""The table in the rank's own memory: HBM on CUDA, host memory on CPU."""
FUSED_UVM_CACHING = "fused_uvm_caching"
"""The table in host memory (UVM), ``uvm_cache_load_factor`` of its rows cached in HBM (CUDA)."""
COMPUTE_KERNELS = (FUSED, FUSED_UVM_CACHING)
COMPUTE_DEVICES = ("cpu", "cuda")
AUTO_HBM_SHARE = 0.8
"""Share of a GPU's memory for tables plus optimizer state when ``sharding.hbm_gb`` is unset: the
rest is for the dense model, activations and communication buffers."""
NEAR_FULL = 0.9
"""A budget above this share of the GPU's memory is warned about."""

#: optimizer-state values per table element (``rows x cols``) and per row, fp32
_STATE_PER_ELEMENT = {"sgd": 0, "rowwise_adagrad": 0, "adagrad": 1, "adam": 2}
_STATE_PER_ROW = {"sgd": 0, "rowwise_adagrad": 1, "adagrad": 0, "adam": 0}
SPARSE_OPTIMIZERS = tuple(_STATE_PER_ELEMENT)


def optimizer_state_bytes(optimizer: str, rows: int, cols: int) -> int:
    """Bytes of the fused sparse optimizer's state of a ``rows x cols`` table (shard): row-wise
    Adagrad one value per row, Adagrad one per element, Adam two per element, SGD none."""
    if optimizer not in _STATE_PER_ELEMENT:
        raise ValueError(f"sparse optimizer {optimizer!r} is not one of {list(SPARSE_OPTIMIZERS)}")
    values = _STATE_PER_ELEMENT[optimizer] * rows * cols + _STATE_PER_ROW[optimizer] * rows
    return VALUE_BYTES * values


def resident_state_bytes(optimizer: str, rows: int) -> int:
    """Bytes of a UVM-cached table's optimizer state that stay in HBM all the same: the
    row-wise state (row-wise Adagrad's one value per row), which FBGEMM places on the device
    whatever the table's location (``construct_split_state``: "if optimizer state is rowwise,
    optimizer is on device"); per-element state (Adagrad, Adam) goes to host memory with the
    table."""
    return optimizer_state_bytes(optimizer, rows, cols=0)  # the per-row part


def table_bytes(optimizer: str, rows: int, cols: int) -> int:
    """Bytes of a ``rows x cols`` fp32 table (shard) plus its optimizer state."""
    return VALUE_BYTES * rows * cols + optimizer_state_bytes(optimizer, rows, cols)


@dataclass(frozen=True)
class MemoryBudget:
    """Memory of every rank for tables plus optimizer state.

    Args:
        compute_device: ``"cuda"`` (HBM, UVM caching possible) or ``"cpu"`` (host memory only;
            ``hbm_bytes`` is not used).
        hbm_bytes: GPU memory per rank (0 on CPU, which has none).
        ddr_bytes: host memory per rank.
        uvm_cache_load_factor: fraction of a UVM-cached table's rows kept in HBM, in ``(0, 1)``.
        hbm_source: the setting, with its value, whose :data:`AUTO_HBM_SHARE` ``hbm_bytes`` is
            when ``sharding.hbm_gb`` is unset (``"cluster.gpu_memory_gb=80"``): errors name it
            as what to change. ``None``: ``sharding.hbm_gb`` gave ``hbm_bytes``, or ``hbm_gpu``
            did.
        hbm_gpu: the real GPU whose memory ``hbm_bytes`` is :data:`AUTO_HBM_SHARE` of when
            ``sharding.hbm_gb`` is unset (the smallest of the job, ``"rank 1's cuda:1"``): errors
            and :meth:`describe` name it, as no setting gives it. ``None``: a setting did.
    """

    compute_device: str
    hbm_bytes: int
    ddr_bytes: int
    uvm_cache_load_factor: float = 0.2
    hbm_source: str | None = None
    hbm_gpu: str | None = None

    def __post_init__(self) -> None:
        if self.compute_device not in COMPUTE_DEVICES:
            raise ValueError(
                f"compute_device={self.compute_device!r} is not one of {list(COMPUTE_DEVICES)}"
            )
        if self.hbm_bytes < 0 or (self.hbm_bytes == 0 and self.compute_device == "cuda"):
            raise ValueError(f"hbm_bytes={self.hbm_bytes} must be positive on CUDA")
        if self.ddr_bytes <= 0:
            raise ValueError(f"ddr_bytes={self.ddr_bytes} must be positive")
        if not 0.0 < self.uvm_cache_load_factor < 1.0:
            raise ValueError(
                f"uvm_cache_load_factor={self.uvm_cache_load_factor} must be strictly between 0 "
                "and 1"
            )

    @classmethod
    def from_gib(
        cls,
        compute_device: str,
        *,
        hbm_gb: float | None,
        ddr_gb: float,
        uvm_cache_load_factor: float,
        gpu_bytes: int | None = None,
        gpu_setting: str | None = None,
        gpu_name: str | None = None,
    ) -> MemoryBudget:
        """The budget of the ``sharding`` config group (sizes in GiB). ``hbm_gb=None`` on CUDA:
        :data:`AUTO_HBM_SHARE` of ``gpu_bytes`` (the smallest GPU of the job), which errors
        attribute to ``gpu_setting`` when a setting gave it (``hbm_source``), else to the GPU
        ``gpu_name`` (``hbm_gpu``); on CPU, no HBM."""
        source = gpu = None
        if hbm_gb is not None:
            hbm = int(hbm_gb * GIB)
        elif compute_device != "cuda":
            hbm = 0
        elif gpu_bytes is None:
            raise ValueError(
                "sharding.hbm_gb=null on CUDA takes a share of the GPU's memory: pass gpu_bytes"
            )
        else:
            hbm = int(AUTO_HBM_SHARE * gpu_bytes)
            source = gpu_setting
            gpu = gpu_name if gpu_setting is None else None
        return cls(
            compute_device=compute_device,
            hbm_bytes=hbm,
            ddr_bytes=int(ddr_gb * GIB),
            uvm_cache_load_factor=uvm_cache_load_factor,
            hbm_source=source,
            hbm_gpu=gpu,
        )

    @property
    def hbm_setting(self) -> str:
        """The HBM budget as errors name it: ``sharding.hbm_gb = 2 GiB (...)``, or, unset,
        ``sharding.hbm_gb (unset: 80% of cluster.gpu_memory_gb=1e-07 GiB = 85 bytes)``, or, unset
        on a real GPU, ``sharding.hbm_gb (unset: 80% of the memory of rank 1's cuda:1 = ...)``."""
        if self.hbm_gpu is not None:
            return (
                f"sharding.hbm_gb (unset: {AUTO_HBM_SHARE:.0%} of the memory of {self.hbm_gpu} = "
                f"{_gib(self.hbm_bytes)})"
            )
        if self.hbm_source is None:
            return f"sharding.hbm_gb = {_gib(self.hbm_bytes)}"
        return (
            f"sharding.hbm_gb (unset: {AUTO_HBM_SHARE:.0%} of {self.hbm_source} GiB = "
            f"{_gib(self.hbm_bytes)})"
        )

    @property
    def hbm_remedy(self) -> str:
        """What to change for more HBM: ``raise sharding.hbm_gb``, or, unset, the setting it is
        a share of, or set it (at most the memory of the real GPU it is a share of)."""
        if self.hbm_gpu is not None:
            return f"set sharding.hbm_gb (at most the memory of {self.hbm_gpu})"
        if self.hbm_source is None:
            return "raise sharding.hbm_gb"
        return f"raise {self.hbm_source.partition('=')[0]} or set sharding.hbm_gb"

    def cached_hbm_bytes(self, nbytes: int, rows: int, resident: int = 0) -> int:
        """HBM a UVM-cached table (shard) of ``nbytes`` with its optimizer state and ``rows``
        rows takes: as TorchRec's planner counts it, the cache, ``load factor x nbytes``, plus
        FBGEMM's cache bookkeeping, ``rows x (4 + 16 x load factor)`` bytes (a table index per
        row, an index and an LRU time per cache slot); and the ``resident`` optimizer state
        that FBGEMM keeps in HBM for every row (:func:`resident_state_bytes`), which TorchRec's
        planner leaves out."""
        lf = self.uvm_cache_load_factor
        return math.ceil(nbytes * lf) + math.ceil(rows * (4 + 16 * lf)) + resident

    def check_device(self, device: str, total_bytes: int) -> None:
        """Refuse an HBM budget larger than the GPU ``device`` has (``total_bytes`` in all): a
        plan that counts on memory that is not there fails only when the tables are allocated,
        or later. No check on CPU, where ``hbm_bytes`` is not used."""
        if self.compute_device != "cuda":
            return
        if self.hbm_bytes <= total_bytes:
            if self.hbm_bytes > NEAR_FULL * total_bytes:
                log.warning(
                    "sharding.hbm_gb = %s is more than %.0f%% of %s (%s): the tables may leave "
                    "too little for the dense model, activations and communication buffers",
                    _gib(self.hbm_bytes),
                    100 * NEAR_FULL,
                    device,
                    _gib(total_bytes),
                )
            return
        raise ValueError(
            f"sharding.hbm_gb = {_gib(self.hbm_bytes)} is more than {device} has "
            f"({_gib(total_bytes)} in all): sharding.hbm_gb is the share of the GPU's memory for "
            "the embedding tables and their optimizer state, which must leave room for the "
            "dense model, the activations and the communication buffers; leave it unset "
            f"(sharding.hbm_gb=null: {AUTO_HBM_SHARE:.0%} of the GPU's memory) or set it "
            f"lower (sharding.hbm_gb={math.floor(AUTO_HBM_SHARE * total_bytes / GIB)})"
        )

    def describe(self) -> str:
        if self.compute_device == "cpu":
            return f"cpu: host memory {_gib(self.ddr_bytes)} per rank (no HBM)"
        share = ""
        if self.hbm_source is not None:
            share = f" ({AUTO_HBM_SHARE:.0%} of {self.hbm_source} GiB: sharding.hbm_gb unset)"
        elif self.hbm_gpu is not None:
            share = (
                f" ({AUTO_HBM_SHARE:.0%} of the memory of {self.hbm_gpu}: sharding.hbm_gb unset)"
            )
        return (
            f"cuda: HBM {_gib(self.hbm_bytes)}{share}, host memory {_gib(self.ddr_bytes)} per "
            f"rank, UVM cache load factor {self.uvm_cache_load_factor}"
        )


def _gib(nbytes: int) -> str:
    """``nbytes`` readable, e.g. ``"1.5 GiB (1610612736 bytes)"``."""
    for unit, size in (("GiB", GIB), ("MiB", 1024**2), ("KiB", 1024)):
        if nbytes >= size:
            return f"{nbytes / size:.3g} {unit} ({nbytes} bytes)"
    return f"{nbytes} bytes"


def choose_kernels(
    tables: Sequence[tuple[str, int, int]],
    budget: MemoryBudget,
    *,
    rank: int,
    resident: Sequence[int] = (),
) -> tuple[str, ...]:
    """The compute kernel of each of one rank's tables (shards) under ``budget``.

    CUDA: every table in HBM (:data:`FUSED`) if they fit in ``hbm_bytes``; otherwise the largest
    tables (ties: first listed) are UVM-cached (:data:`FUSED_UVM_CACHING`) one by one until the
    rest plus the caches fit, and the cached tables must fit in ``ddr_bytes``: a table whose
    caching would overflow it is passed over for the next smaller one. Where that largest-first
    choice runs out of host memory, the set of cached tables that needs the least host memory
    is searched exactly (:func:`least_host_memory`): a layout is refused only when no set of
    cached tables meets both budgets, and the error says the least ``ddr_bytes`` one needs.
    For more than :data:`EXACT_TABLES` cacheable tables on the rank (40), or where that search
    gives up, host memory is counted on a grid (:func:`least_host_memory_on_grid`): a layout is
    then refused only when no set of cached tables fits, or when the least host memory a set
    needs lies between the search's bounds (at most one cell per table apart: 0.24% of the
    tables' host memory at 200 tables) and the set found does not fit; the error says between
    what bounds that least host memory lies. A
    table whose cache (:meth:`MemoryBudget.cached_hbm_bytes`) would take as much HBM as the
    table itself (narrow tables: FBGEMM's bookkeeping is per row) stays in HBM. CPU: every
    table is :data:`FUSED` and all must fit in ``ddr_bytes``.

    Args:
        tables: ``(name, bytes of the table plus its optimizer state, rows)`` of the rank's
            tables (shards).
        budget: the rank's memory.
        rank: the rank (for the error message).
        resident: per table, the bytes of its optimizer state that stay in HBM when it is
            UVM-cached (:func:`resident_state_bytes`); none when empty.

    Raises:
        ValueError: naming the table that does not fit, its bytes, the rank and the budget.
    """
    sizes = [int(b) for _, b, _ in tables]
    largest_first = sorted(range(len(tables)), key=lambda i: (-sizes[i], i))
    total = sum(sizes)
    if budget.compute_device == "cpu":
        used = 0
        for i in largest_first:
            used += sizes[i]
            if used > budget.ddr_bytes:
                raise ValueError(
                    _no_room(tables, i, rank, total)
                    + f"; the budget is sharding.ddr_gb = {_gib(budget.ddr_bytes)} of host "
                    "memory per rank (on CPU every table lives there): raise sharding.ddr_gb "
                    "or use more ranks"
                )
        return (FUSED,) * len(tables)

    kernels = [FUSED] * len(tables)
    stays = list(resident) or [0] * len(tables)
    hbm, ddr = total, 0
    no_host_room: list[int] = []  # tables whose caching would overflow host memory
    for i in largest_first:
        if hbm <= budget.hbm_bytes:
            break
        cache = budget.cached_hbm_bytes(sizes[i], tables[i][2], stays[i])
        if cache >= sizes[i]:
            continue  # a narrow table's bookkeeping outweighs what caching saves
        if ddr + sizes[i] - stays[i] > budget.ddr_bytes:
            no_host_room.append(i)  # a smaller table may still fit in host memory: try it
            continue
        kernels[i] = FUSED_UVM_CACHING
        hbm += cache - sizes[i]
        ddr += sizes[i] - stays[i]
    if hbm > budget.hbm_bytes and no_host_room:
        # the largest-first choice ran out of host memory: the set of cached tables that needs
        # the least host memory, searched exactly, may fit both budgets
        saves = {
            i: sizes[i] - budget.cached_hbm_bytes(sizes[i], tables[i][2], stays[i])
            for i in largest_first
        }
        cacheable = [i for i in largest_first if saves[i] > 0]
        need = total - budget.hbm_bytes
        if sum(saves[i] for i in cacheable) < need:
            hbm = total - sum(saves[i] for i in cacheable)  # HBM rules it out (below)
        else:
            items = [(saves[i], sizes[i] - stays[i]) for i in cacheable]
            least = least_host_memory(items, need) if len(items) <= EXACT_TABLES else None
            gridded = None
            if least is None:  # too many tables to search exactly: host memory on a grid
                gridded = least_host_memory_on_grid(items, need)
                assert gridded is not None  # every cacheable table together saves enough
                fits = gridded.host <= budget.ddr_bytes
                chosen: tuple[int, ...] | None = gridded.chosen if fits else None
            else:
                chosen = least[1] if least[0] <= budget.ddr_bytes else None
            if chosen is not None:
                cached = {cacheable[k] for k in chosen}
                return tuple(
                    FUSED_UVM_CACHING if j in cached else FUSED for j in range(len(tables))
                )
            if least is not None:
                host = f"would take {_gib(least[0])} of host memory"
            else:
                assert gridded is not None
                host = (
                    f"would take {_gib(gridded.lower)} to {_gib(gridded.host)} of host memory "
                    f"(counted on a grid of {gridded.cell:,} bytes: {len(cacheable)} tables, "
                    "too many to search exactly)"
                    if gridded.lower <= budget.ddr_bytes
                    else f"would take at least {_gib(gridded.lower)} of host memory (counted on a "
                    f"grid: {len(cacheable)} tables, too many to search exactly)"
                )
            raise ValueError(
                _no_room(tables, no_host_room[0], rank, total)
                + f"; it would be UVM-cached, but the budget is {budget.hbm_setting} of HBM "
                f"and sharding.ddr_gb = {_gib(budget.ddr_bytes)} of host memory per rank, and "
                f"the UVM-cached tables {host}: raise sharding.ddr_gb or "
                f"{budget.hbm_remedy.removeprefix('raise ')}, or use more ranks"
            )
    if hbm > budget.hbm_bytes:
        i = largest_first[0]
        raise ValueError(
            _no_room(tables, i, rank, total)
            + f"; even with every table that caching shrinks UVM-cached "
            f"(sharding.uvm_cache_load_factor = {budget.uvm_cache_load_factor}) the rank's "
            f"tables and caches take {_gib(hbm)} of HBM, more than {budget.hbm_setting} per "
            f"rank: {budget.hbm_remedy}, lower sharding.uvm_cache_load_factor, or use more ranks"
        )
    return tuple(kernels)


#: the most partial choices :func:`least_host_memory` keeps before it gives up
MAX_CHOICES = 100_000
#: the most cacheable tables on one rank that :func:`choose_kernels` searches exactly; beyond,
#: the grid (:func:`least_host_memory_on_grid`, about 0.1 s). With HBM saved about 0.79 of the
#: host bytes, as caching's is, the exact search took up to 0.5 s at 40 tables, 1-3 s at 60 and
#: gave up after about 4 s at 100, while the grid found the same least host memory wherever the
#: exact search finished (2026-12-06)
EXACT_TABLES = 40


def least_host_memory(
    items: Sequence[tuple[int, int]], need: int, *, max_choices: int | None = None
) -> tuple[int, tuple[int, ...]] | None:
    """The least host memory of a set of tables to cache that saves at least ``need`` bytes of
    HBM, and that set (indices into ``items``, ascending); ``items[k]``: ``(HBM saved, host
    memory taken)`` by caching table ``k`` (both positive). Exact: the Pareto front of (host
    memory, HBM saved) over the tables, one table at a time, without the choices that another
    beats on both or that cannot reach ``need`` with every table still to come. ``(0, ())``
    when ``need <= 0``; ``None`` when no set saves enough, or when the front grows past
    ``max_choices`` (default :data:`MAX_CHOICES`; the search gives up: with savings about
    proportional to host memory, as caching's are, from about 60 tables on)."""
    if need <= 0:
        return 0, ()
    limit = MAX_CHOICES if max_choices is None else max_choices
    # still to come after table k: what the remaining tables could save at most
    rest = [sum(saved for saved, _ in items[k + 1 :]) for k in range(len(items))]
    # (host memory, saved, tables); sorted by host memory, saved strictly rising
    front: list[tuple[int, int, tuple[int, ...]]] = [(0, 0, ())]
    best: tuple[int, tuple[int, ...]] | None = None
    for k, (saved, host) in enumerate(items):
        grown = [(h + host, s + saved, chosen + (k,)) for h, s, chosen in front]
        for h, s, chosen in grown:
            if s >= need and (best is None or h < best[0]):
                best = (h, chosen)
        merged = sorted(front + grown, key=lambda c: (c[0], -c[1]))
        front = []
        for h, s, chosen in merged:
            if best is not None and h >= best[0]:
                break  # no cheaper set can follow
            if s + rest[k] < need:
                continue  # cannot save enough with every table still to come
            if not front or s > front[-1][1]:
                front.append((h, s, chosen))
        if len(front) > limit:
            return None
    return best


#: the most cells times tables of :func:`least_host_memory_on_grid` (one byte each)
GRID_ENTRIES = 1 << 24


@dataclass(frozen=True)
class GriddedChoice:
    """What :func:`least_host_memory_on_grid` found: ``chosen`` saves enough and takes ``host``
    bytes of host memory; no set that saves enough takes less than ``lower``
    (``host - lower <= cell * len(items)``)."""

    chosen: tuple[int, ...]
    host: int
    lower: int
    cell: int


def least_host_memory_on_grid(
    items: Sequence[tuple[int, int]], need: int, *, entries: int | None = None
) -> GriddedChoice | None:
    """For more tables than :func:`least_host_memory` can search: a set of tables (indices into
    ``items``: ``(HBM saved, host memory taken)``, both positive) that saves at least ``need``
    bytes of HBM, with host memory counted in cells of ``cell`` bytes, and a lower bound on
    the least host memory of any such set; ``None`` when no set saves enough.

    Two knapsack dynamic programs over the cells (``entries`` bounds cells times tables,
    default :data:`GRID_ENTRIES`): each table's host memory rounded up to whole cells gives
    a set whose true host memory is at most its cells' (so a set that fits on the grid fits),
    rounded down a bound that the least set cannot beat. The two differ by at most one cell
    per table: with 200 tables, 0.24% of their host memory together. The relaxation that
    may cache part of a table (tables taken by host memory per byte saved, the last in part)
    bounds the least from below too, closer with many small tables, and taking that last table
    whole gives a third set (with both, 0.002% apart at 1,000 tables, where the grid's own
    bounds lie 5% apart). Each set
    saves enough (HBM saved is never rounded); the one of the least true host memory is chosen,
    without any table it does not need."""
    if need <= 0:
        return GriddedChoice((), 0, 0, 1)
    if sum(saved for saved, _ in items) < need:
        return None
    n = len(items)
    total = sum(host for _, host in items)
    cells = max(1, (GRID_ENTRIES if entries is None else entries) // n)
    cell = max(1, -(-total // cells))
    saved = np.array([s for s, _ in items], dtype=np.int64)
    up = [-(-host // cell) for _, host in items]
    down = [host // cell for _, host in items]

    def most_saved(weights: list[int]) -> tuple[np.ndarray, np.ndarray]:
        """The most HBM saved within each count of cells, and which table the best set at each
        count took last (per table, whether it is in the best set of that count)."""
        width = sum(weights) + 1
        best = np.zeros(width, dtype=np.int64)
        took = np.zeros((n, width), dtype=bool)
        for k, w in enumerate(weights):
            candidate = best[: width - w] + saved[k]
            better = candidate > best[w:]
            took[k, w:] = better
            best[w:] = np.where(better, candidate, best[w:])
        return best, took

    def least_set(weights: list[int]) -> tuple[list[int], int]:
        """The set of the fewest cells that saves enough, and its count of cells."""
        best, took = most_saved(weights)
        count = first = int(np.argmax(best >= need))
        chosen = []
        for k in range(n - 1, -1, -1):  # back through the tables: was k in the set of `count`?
            if took[k, count]:
                chosen.append(k)
                count -= weights[k]
        return chosen, first

    def needed(chosen: list[int]) -> list[int]:
        """``chosen`` without the tables it does not need, dropped the largest first (tables
        of no cells rounded down come free on the grid)."""
        surplus = sum(items[k][0] for k in chosen) - need
        kept = set(chosen)
        for k in sorted(chosen, key=lambda k: -items[k][1]):
            if items[k][0] <= surplus:
                kept.remove(k)
                surplus -= items[k][0]
        return sorted(kept)

    from_down, lowest = least_set(down)
    from_up, _ = least_set(up)
    # the relaxation, in exact arithmetic (an order off by rounding would overstate its bound)
    by_ratio = sorted(range(n), key=lambda k: Fraction(items[k][1], items[k][0]))
    greedy: list[int] = []
    got = whole = 0
    for k in by_ratio:
        greedy.append(k)
        if got + items[k][0] >= need:
            relaxed = whole + -(-(need - got) * items[k][1] // items[k][0])  # the least is whole
            break
        got += items[k][0]
        whole += items[k][1]
    lower = max(lowest * cell, relaxed)
    sets = [needed(c) for c in (from_up, from_down, greedy)]
    chosen = min(sets, key=lambda c: sum(items[k][1] for k in c))
    host = sum(items[k][1] for k in chosen)
    return GriddedChoice(tuple(chosen), host, min(lower, host), cell)


def _no_room(tables: Sequence[tuple[str, int, int]], i: int, rank: int, total: int) -> str:
    name, nbytes, _ = tables[i]
    return (
        f"table {name!r} ({_gib(nbytes)} with its optimizer state) does not fit on rank {rank}, "
        f"whose {len(tables)} table(s) take {_gib(total)}"
    )
