"""Split sizes and byte counts of the SPTT collectives (steps a, d, f), as pure functions.

The dataflow (:mod:`dmt.sptt.dataflow`) sizes its collectives with these functions, and the
planner (:mod:`dmt.planning.collectives`) counts the bytes of a plan at any scale with the same
ones, so the two cannot drift apart. Pure integer arithmetic on an :class:`~dmt.sptt.plan.SPTTPlan`.

Shape legend: ``B`` local batch, ``T`` towers, ``K L`` ranks per tower, ``T B`` samples a rank
holds after step c (its ``T`` peers' local batches), ``N`` embedding dim, ``W_q`` pooled
table/column-wise columns of tower rank ``q`` (:meth:`SPTTPlan.all_to_all_width`), ``R_t``
row-wise features of tower ``t``, ``(V_t, D_t)`` tower ``t``'s module output.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Sequence
from typing import NamedTuple, TypeVar

from dmt.sptt.plan import SPTTPlan, TableShard

Count = TypeVar("Count", int, float)
"""Ids counted exactly (``int``) or as an expectation (``float``, the planner's default)."""


def step_a_bytes_per_dst(
    plan: SPTTPlan,
    local_batch: int,
    ids_of: Callable[[TableShard], Count],
    *,
    length_size: int,
    id_size: int,
) -> list[Count]:
    """Bytes one source rank sends to each rank in step a (its own entry included).

    Every shard of rank ``r`` receives one jagged feature: ``B`` lengths and the ids of the
    source's local batch that the shard looks up (all of the feature's ids for a table- or
    column-wise shard, those in its row block for a row-wise one).

    Args:
        plan: the SPTT plan.
        local_batch: ``B``.
        ids_of: ids the source sends to a shard.
        length_size: bytes of one length (the KJT's lengths dtype).
        id_size: bytes of one id (the KJT's values dtype).

    Returns:
        ``G`` byte counts, by destination rank.
    """
    return [
        sum(local_batch * length_size + ids_of(s) * id_size for s in plan.rank_shards(rank))
        for rank in range(plan.topology.world_size)
    ]


def step_d_split_sizes(plan: SPTTPlan, rank: int, tower_batch: int) -> tuple[list[int], list[int]]:
    """``(output_split_sizes, input_split_sizes)`` in elements of ``rank``'s step d all-to-all.

    ``rank`` sends the ``T B`` rows of its ``W_r`` table/column-wise columns of block ``p`` to
    the tower rank at position ``p`` and receives ``T B W_q`` from every tower-mate ``q``; the
    backward sends the gradients the other way (input and output splits swap).

    Args:
        plan: the SPTT plan.
        rank: global rank.
        tower_batch: ``T B``.
    """
    topo = plan.topology
    mates = topo.tower_ranks(topo.tower_of(rank))
    widths = [plan.all_to_all_width(q) for q in mates]
    width = widths[topo.position_of(rank)]
    return [tower_batch * w for w in widths], [tower_batch * width] * topo.tower_size


def step_d_reduce_scatter_block(plan: SPTTPlan, rank: int, tower_batch: int) -> int:
    """Elements of each block of ``rank``'s step d reduce-scatter (row-wise partial sums,
    ``T B R_t N``): one block goes to every tower rank; the backward all-gathers blocks of the
    same size. ``0``: the tower has no row-wise feature (no reduce-scatter)."""
    tower = plan.topology.tower_of(rank)
    return tower_batch * len(plan.row_wise_features(tower)) * plan.embedding_dim


def step_f_split_sizes(
    tower_output_dims: Sequence[tuple[int, int]], tower: int, local_batch: int
) -> tuple[list[int], list[int]]:
    """``(output_split_sizes, input_split_sizes)`` in elements of step f's all-to-all on a rank
    of ``tower``: it sends ``B V_t D_t`` to each of its ``T`` peers and receives ``B V_u D_u``
    from the peer in tower ``u``; the backward swaps the two."""
    V, D = tower_output_dims[tower]
    T = len(tower_output_dims)
    return [local_batch * v * d for v, d in tower_output_dims], [local_batch * V * D] * T


def ring_allreduce_bytes(nbytes: int, group_size: int) -> int:
    """Bytes a rank sends to its ring successor in an all-reduce of ``nbytes`` over
    ``group_size`` ranks: ``2 (n - 1) / n`` of the buffer (the ring model every byte count of
    dmt uses for all-reduces, whatever algorithm the backend runs)."""
    return 2 * (group_size - 1) * nbytes // group_size


class ColumnBlock(NamedTuple):
    """One ``(T B, width)`` block of what step d delivered, and where step e puts its columns."""

    source: int
    """Which of step d's outputs holds it: ``0`` the all-to-all's, ``1`` the reduce-scatter's."""
    start: int
    """Its first column within that output: the block's elements start at ``T B start``."""
    dest: tuple[int, ...]
    """The tower-order column (of ``F_t N``) of each of its ``width = len(dest)`` columns."""


class ColumnRun(NamedTuple):
    """Columns of one :class:`ColumnBlock` that land side by side in tower order."""

    block: int
    """The block's index in :func:`step_e_blocks`' tuple."""
    start: int
    """The run's first column within the block."""
    dest: int
    """The tower-order column of its first column."""
    width: int


def column_runs(blocks: Sequence[ColumnBlock]) -> tuple[ColumnRun, ...]:
    """``blocks`` cut into maximal runs of columns whose tower-order columns are consecutive:
    step e is one copy per run. A table's columns stay together, so a tower of table-wise
    features has at most one run per feature."""
    runs = []
    for i, b in enumerate(blocks):
        first = 0
        for j in range(1, len(b.dest) + 1):
            if j == len(b.dest) or b.dest[j] != b.dest[j - 1] + 1:
                runs.append(ColumnRun(i, first, b.dest[first], j - first))
                first = j
    return tuple(runs)


def run_unit(runs: Sequence[ColumnRun]) -> int:
    """The widest ``u`` that divides every run's width and offsets: step e can move columns
    ``u`` at a time (``(T B, columns / u, u)`` views; a multiple of ``N`` when no table is split
    across ranks). ``1`` for no runs."""
    return math.gcd(*(v for r in runs for v in (r.start, r.dest, r.width))) or 1


def step_e_blocks(plan: SPTTPlan, rank: int) -> tuple[ColumnBlock, ...]:
    """Step e of ``rank`` as blocks: every tower-mate's all-to-all block by position, then the
    tower's summed row-wise features, each with the tower-order columns it fills
    (:meth:`SPTTPlan.tower_column_index`, inverted). Empty blocks are left out; together the
    blocks fill each of the ``F_t N`` columns once."""
    topo = plan.topology
    tower = topo.tower_of(rank)
    where = {c: j for j, c in enumerate(plan.tower_column_index(tower))}
    sources = [[plan.all_to_all_width(q) for q in topo.tower_ranks(tower)]]
    if plan.row_wise_features(tower):
        sources.append([len(plan.row_wise_features(tower)) * plan.embedding_dim])
    blocks, column = [], 0  # column: of the blocks glued side by side in this order
    for source, widths in enumerate(sources):
        start = 0
        for width in widths:
            if width:
                dest = tuple(where[c] for c in range(column, column + width))
                blocks.append(ColumnBlock(source, start, dest))
            start, column = start + width, column + width
    return tuple(blocks)
