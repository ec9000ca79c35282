"""The state of a :class:`~dmt.sptt.dmt_sharding.ShardedDMT` under the plain DMT model's names.

TorchRec's sharded modules keep the unsharded module's state-dict keys and store each table as a
``ShardedTensor`` (the global shape, this rank's shards, where every other shard lives); that is
what lets ``torch.distributed.checkpoint`` (DCP) save a job of ``G`` ranks and load it into one
of another size. SPTT keeps the same contract:

* table ``x`` of tower ``t`` is ``towers.<t>.embedding_bag_collection.embedding_bags.x.weight``,
  a ``ShardedTensor`` ``(rows, N)`` laid out by the :class:`~dmt.sptt.plan.SPTTPlan` (every rank
  lists every table; a rank without a shard of it holds no local shard);
* the replicated tower module of tower ``t`` is ``towers.<t>.tower_module.*`` (only its tower's
  ranks hold it; DCP writes one copy);
* the dense arch (bottom, interaction, top) keeps its plain names (every rank holds it).

The fused sparse optimizer's per-table state follows the tables: an ``(rows, cols)`` state (e.g.
Adagrad's) is laid out like the weight; a row-wise ``(rows,)`` state (row-wise Adagrad) like the
rows. A table split into column blocks (column-wise) has one row-wise state *per column block*
(as in TorchRec), named ``<state>.cols_<first>_<stop>``: it can only be restored into the same
column split.

The local shard of every ``ShardedTensor`` here *is* the parameter's (or optimizer state's)
storage, so DCP's in-place load restores the module without a copy.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence

import torch
import torch.distributed as dist
from torch.distributed._shard.metadata import ShardMetadata
from torch.distributed._shard.sharded_tensor import (
    Shard,
    ShardedTensor,
    ShardedTensorMetadata,
    TensorProperties,
)

from dmt.sptt.plan import SPTTPlan, TableShard

__all__ = ["TABLE_KEY", "column_blocks", "plain_name", "shard_placement", "sharded_table"]

TABLE_KEY = "towers.{tower}.embedding_bag_collection.embedding_bags.{table}.weight"


def plain_name(internal: str, tower: int) -> str | None:
    """The plain DMT model's name of a :class:`ShardedDMT` state key or parameter name
    (``None`` for the dataflow's, whose tables are handled as sharded tensors).

    ``towers.tower_module[.module].x`` -> ``towers.<tower>.tower_module.x``;
    ``dense_arch.module.x`` -> ``x`` (``module.`` is DDP's wrapper)."""
    if internal.startswith("towers.dataflow."):
        return None
    if internal.startswith("towers.tower_module."):
        rest = internal.removeprefix("towers.tower_module.")
        return f"towers.{tower}.tower_module.{rest.removeprefix('module.')}"
    if internal.startswith("dense_arch."):
        return internal.removeprefix("dense_arch.").removeprefix("module.")
    raise AssertionError(f"unexpected ShardedDMT state key {internal!r}")


def shard_placement(rank: int, device: torch.device, local_world_size: int) -> str:
    """``rank:<r>/<device>`` of a shard on global rank ``r`` that this rank does not hold: the
    device is nominal (CUDA: ``r``'s index on a host of ``local_world_size`` ranks). Torch checks
    a placement's device only against the local shard's tensor, and this rank's own shards are
    placed on their tensors' devices (:func:`sharded_table`)."""
    if device.type == "cuda":
        return f"rank:{rank}/cuda:{rank % local_world_size}"
    return f"rank:{rank}/{device.type}"


def column_blocks(shards: Sequence[TableShard]) -> list[tuple[int, int]]:
    """The distinct column ranges of a table's shards, in column order."""
    return sorted({(s.col_start, s.col_stop) for s in shards})


def sharded_table(
    plan: SPTTPlan,
    feature: int,
    *,
    local: Mapping[int, torch.Tensor],
    rank: int,
    device: torch.device,
    group: dist.ProcessGroup | None,
    rows: int,
    rowwise_cols: tuple[int, int] | None = None,
) -> ShardedTensor:
    """A ``ShardedTensor`` of a table's weight ``(rows, N)``, or of a row-wise state ``(rows,)``
    of the column block ``rowwise_cols`` (all shards of the table when ``None`` and 1-D).

    ``local`` maps the index of each of this rank's shards (in ``plan.feature_shards(feature)``)
    to its tensor; they are used as they are (no copy). Pure but for the process group handle:
    the global layout comes from the plan, not from a collective.
    """
    shards = plan.feature_shards(feature)
    L = plan.topology.local_world_size
    one_dim = rowwise_cols is not None
    metas: list[ShardMetadata] = []
    local_shards: list[Shard] = []
    for i, s in enumerate(shards):
        if one_dim and (s.col_start, s.col_stop) != rowwise_cols:
            continue
        offsets = [s.row_start] if one_dim else [s.row_start, s.col_start]
        sizes = [s.num_rows] if one_dim else [s.num_rows, s.num_cols]
        if s.rank == rank and i in local:
            # the device the tensor is on: the plan's host layout (sptt.local_world_size, which
            # may emulate hosts) or the launcher's (one GPU per task: every rank's cuda:0) need
            # not say which GPU a rank uses
            tensor = local[i]
            assert list(tensor.shape) == sizes, (tensor.shape, sizes)
            meta = ShardMetadata(offsets, sizes, f"rank:{s.rank}/{tensor.device}")
            local_shards.append(Shard(tensor, meta))
        else:
            meta = ShardMetadata(offsets, sizes, shard_placement(s.rank, device, L))
        metas.append(meta)
    dtype = next(iter(local.values())).dtype if local else torch.float32
    size = torch.Size([rows] if one_dim else [rows, plan.embedding_dim])
    global_meta = ShardedTensorMetadata(metas, size, TensorProperties(dtype=dtype))
    # The layout is known on every rank (the plan), so no metadata all-gather is needed: the
    # constructor TorchRec's own sharded modules use for their state dicts.
    return ShardedTensor._init_from_local_shards_and_global_metadata(
        local_shards, global_meta, process_group=group
    )
