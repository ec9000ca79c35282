"""The SPTT embedding dataflow of one rank: paper Figure 7, steps a-f.

Shape legend: ``B`` local batch (the same on every rank), ``F`` sparse features, ``N`` embedding
dim, ``T`` towers, ``K L`` ranks per tower, ``G = T K L`` world size, ``W_r`` pooled columns of
this rank's table- and column-wise shards, ``R_t`` row-wise features of this rank's tower,
``F_t`` features of the tower, ``(V_t, D_t)`` tower ``t``'s module output.

=====  =====================================================================  ==================
step   what                                                                   group (size)
=====  =====================================================================  ==================
a      KJT all-to-all: every feature of the local batch goes to the           world (``G``)
       rank(s) of its tower holding its table's shards; row-wise ids are
       first bucketed by row block (TorchRec ``KJTAllToAll``)
b      pooled lookup of this rank's shards for the global batch,              --
       ``(G B, W_r + R_t N)``, samples by source rank (TorchRec EBC)
c      peer permute: sample blocks into peer order, so the block of peer      --
       group ``p`` (``T B`` samples) is contiguous; of the pooled output
       (Figure 7), of the input before b, or skipped (``peer_permute``,
       the default)
d      table/column-wise columns: all-to-all, block ``p`` to the tower        tower (``K L``)
       rank at position ``p``; row-wise partial sums: reduce-scatter of
       the same blocks. Every rank then holds, for its ``T`` peers'
       samples, the tower's features, by source
e      shuffle ``(features, peers)`` to ``(peers, features)``: glue the       --
       received columns into the tower's feature order, ``(T B, F_t, N)``
TM     tower module, ``(T B, F_t, N) -> (T B, V_t, D_t)`` (hook; identity     --
       by default), replicated inside the tower
f      peer all-to-all: the ``B`` rows of peer ``t'`` go back to it; every    peer (``T``)
       rank receives each tower's output for its own samples
=====  =====================================================================  ==================

Step c (paper section 3.1.3, :mod:`dmt.sptt.peer_permute`): ``peer_permute="output"`` permutes
the pooled output as in Figure 7; ``"input"`` swaps b and c and permutes the received ids and
lengths instead; ``"auto"`` picks, per batch, whichever moves fewer bytes; ``"skip"`` (the
default) has step a's all-to-all deliver the blocks in peer order (TorchRec's ``stagger``), so
there is nothing to permute. All four give the same outputs and gradients.

The backward runs the same collectives in reverse through autograd
(:mod:`dmt.sptt.collectives`), unscaled: a table's gradient equals that of the single-process
model on the concatenated global batch for the sum of the per-rank losses.

Each rank keeps one TorchRec module with one table per shard it holds, named like the unsharded
table (``t_<feature>``) and shaped like the shard: a plain ``EmbeddingBagCollection`` (gradients
in ``.grad``), or, given ``sparse_optimizer``, a ``FusedEmbeddingBagCollection`` (FBGEMM TBE that
applies the optimizer inside the backward, like TorchRec's sharded tables; no ``.grad``).
:meth:`SPTTDataflow.load_tables_from` copies the shards out of the unsharded tables,
:meth:`SPTTDataflow.reset_tables` initializes them where no unsharded copy exists.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Callable, Mapping, Sequence
from typing import Any, cast

import numpy as np
import torch
from fbgemm_gpu.split_table_batched_embeddings_ops_common import EmbeddingLocation
from torch import nn
from torchrec.distributed.dist_data import KJTAllToAll
from torchrec.distributed.types import Awaitable, LazyAwaitable
from torchrec.modules.embedding_configs import DataType, EmbeddingBagConfig, PoolingType
from torchrec.modules.embedding_modules import EmbeddingBagCollection
from torchrec.modules.fused_embedding_modules import FusedEmbeddingBagCollection
from torchrec.optim.keyed import CombinedOptimizer, KeyedOptimizer
from torchrec.sparse.jagged_tensor import JaggedTensor, KeyedJaggedTensor

from dmt.memory import FUSED_UVM_CACHING
from dmt.optim import fused_ebc_class
from dmt.sptt.collectives import (
    AllToAllRequest,
    all_to_all_single,
    all_to_all_single_async,
    comm_dtype_of,
    reduce_scatter,
    saturate_,
)
from dmt.sptt.comm_stats import CommStats
from dmt.sptt.peer_permute import (
    DEFAULT_PEER_PERMUTE,
    block_permutation,
    check_peer_permute,
    input_permute_bytes,
    is_identity,
    output_permute_bytes,
    peer_permute_site,
    step_a_stagger,
)
from dmt.sptt.plan import SPTTPlan, TableShard
from dmt.sptt.process_groups import SPTTProcessGroups
from dmt.sptt.splits import (
    ColumnBlock,
    ColumnRun,
    column_runs,
    run_unit,
    step_a_bytes_per_dst,
    step_d_split_sizes,
    step_e_blocks,
    step_f_split_sizes,
)

TowerModule = Callable[[torch.Tensor], torch.Tensor]
SparseOptimizer = tuple[type[torch.optim.Optimizer], Mapping[str, Any]]
"""``(optimizer class, kwargs)`` as for ``apply_optimizer_in_backward``: ``torch.optim.SGD``,
``torch.optim.Adagrad``, ``torchrec.optim.RowWiseAdagrad`` or ``torch.optim.Adam`` (CUDA)."""


class SPTTDataflow(nn.Module):
    """Steps a-f of SPTT for one rank, with a tower-module hook between e and f.

    Args:
        plan: table sharding and feature layout; the same on every rank.
        tables: one ``EmbeddingBagConfig`` per feature, in model order, each reading exactly that
            feature, shaped as in the plan. Only this rank's shards are built. Row-wise tables
            need SUM pooling.
        groups: this rank's world, tower and peer groups, built from ``plan.topology``.
        tower_output_dims: ``(V_t, D_t)`` of every tower's module output, by tower; ``None`` means
            pass-through towers, ``(F_t, N)``. Every rank must know all towers' dims (step f).
        stats: optional counter filled with the bytes of steps a, d and f (forward and backward)
            and those step c shuffles.
        device: device of this rank's shards and buffers.
        sparse_optimizer: ``(optimizer class, kwargs)``; when given, this rank's shards live in
            TorchRec ``FusedEmbeddingBagCollection`` s (FBGEMM TBE) that apply the optimizer
            to the rows a batch touched during the backward (:attr:`fused_optimizer` exposes
            its LR and state). ``None``: a plain ``EmbeddingBagCollection`` with ``.grad``.
        peer_permute: where step c permutes the blocks into peer order, one of ``"output"``
            (the pooled lookup output, Figure 7), ``"input"`` (the received sparse input, before
            the lookup), ``"auto"`` (the one that moves fewer bytes, per batch) or ``"skip"``
            (step a delivers peer order; the default); see :mod:`dmt.sptt.peer_permute`.
            Every rank may choose differently: step c is local.
        comm_precision: dtype of the pooled embeddings (and their gradients) on the wire in
            steps d and f: ``"fp32"`` (as computed), ``"bf16"`` or ``"fp16"`` (rounded once per
            collective, received values cast back; bytes halve). Step a's ids are never cast.
            See :mod:`dmt.sptt.collectives`.

    Example::

        groups = create_process_groups(Topology(world_size=4, local_world_size=2))
        plan = build_plan(groups.topology, names, [[0, 2], [1, 3]], embedding_dim=N,
                          num_embeddings=rows)
        dataflow = SPTTDataflow(plan, tables, groups=groups)
        dataflow.load_tables_from(model_ebc)            # copy this rank's shards
        tower_outputs = dataflow(local_kjt)             # T tensors (B, F_t, N)
        pooled = dataflow.pooled_embeddings(local_kjt)  # (B, F, N), model order
    """

    _block_order: torch.Tensor
    _block_inverse: torch.Tensor
    _input_rows: torch.Tensor
    _output_permutation: torch.Tensor

    def __init__(
        self,
        plan: SPTTPlan,
        tables: Sequence[EmbeddingBagConfig],
        *,
        groups: SPTTProcessGroups,
        tower_output_dims: Sequence[tuple[int, int]] | None = None,
        stats: CommStats | None = None,
        device: torch.device | None = None,
        sparse_optimizer: SparseOptimizer | None = None,
        peer_permute: str = DEFAULT_PEER_PERMUTE,
        comm_precision: str = "fp32",
    ) -> None:
        super().__init__()
        topo = plan.topology
        self.peer_permute_setting = check_peer_permute(peer_permute)
        self.comm_precision = comm_precision
        self.comm_dtype = comm_dtype_of(comm_precision)
        if groups.topology != topo:
            raise ValueError(f"groups were built for {groups.topology}, the plan for {topo}")
        _check_tables(plan, tables)
        self.plan = plan
        self.groups = groups
        self.stats = stats
        self.embedding_dim = plan.embedding_dim
        self.rank = groups.rank
        self.tower = topo.tower_of(self.rank)

        self.shards: tuple[TableShard, ...] = plan.rank_shards(self.rank)
        self._table_names = tuple(tables[s.feature].name for s in self.shards)
        shard_tables = [_shard_table(tables[s.feature], s) for s in self.shards]
        self.embedding_bag_collection: EmbeddingBagCollection | _FusedShards | None = None
        if shard_tables and sparse_optimizer is None:
            self.embedding_bag_collection = EmbeddingBagCollection(shard_tables, device=device)
        elif shard_tables and sparse_optimizer is not None:
            self.embedding_bag_collection = _FusedShards(
                shard_tables,
                sparse_optimizer,
                device,
                cached=[s.compute_kernel == FUSED_UVM_CACHING for s in self.shards],
                cache_load_factor=plan.memory.uvm_cache_load_factor if plan.memory else None,
            )
        if tower_output_dims is None:
            tower_output_dims = [(len(fs), self.embedding_dim) for fs in plan.tower_features]
        if len(tower_output_dims) != topo.num_towers:
            raise ValueError(
                f"tower_output_dims has {len(tower_output_dims)} entries for "
                f"{topo.num_towers} towers"
            )
        self.tower_output_dims: tuple[tuple[int, int], ...] = tuple(
            (int(v), int(d)) for v, d in tower_output_dims
        )

        stagger = step_a_stagger(topo, peer_permute)
        self._input_dist = KJTAllToAll(groups.world, list(plan.input_splits), stagger=stagger)
        order = block_permutation(topo, stagger)
        self._permutes = not is_identity(order)
        # "skip" relies on step a's order: check it rather than assume it
        assert not (peer_permute == "skip" and self._permutes), (stagger, order, topo)
        G, k = topo.world_size, len(self.shards)
        self._lookup_width = plan.lookup_width(self.rank)
        weights = self.shard_parameters()
        self._value_size = weights[0][1].element_size() if weights else 4
        self.register_buffer("_block_order", torch.tensor(order, device=device), persistent=False)
        self.register_buffer(
            "_block_inverse",
            torch.tensor(sorted(range(G), key=order.__getitem__), device=device),
            persistent=False,
        )
        # rows (shard, block) of the received lengths viewed as (k G, B), in peer order
        self.register_buffer(
            "_input_rows",
            torch.tensor(
                [i * G + b for i in range(k) for b in order], dtype=torch.int32, device=device
            ),
            persistent=False,
        )
        self._row_wise = [f for f in range(plan.num_features) if plan.is_row_wise(f)]
        for f in self._row_wise:
            starts = [s.row_start for s in plan.feature_shards(f)]
            self.register_buffer(
                f"_row_starts_{f}", torch.tensor(starts, device=device), persistent=False
            )
        self._step_e = _StepE(step_e_blocks(plan, self.rank), device)
        self.register_buffer(
            "_output_permutation",
            torch.tensor(plan.output_permutation, device=device),
            persistent=False,
        )

    # ---- weights -----------------------------------------------------------------------------

    def shard_parameters(self) -> list[tuple[TableShard, nn.Parameter]]:
        """This rank's shards and their weights ``(rows, cols)``, in lookup order (UVM-cached
        ones as their tables hold them: :meth:`flush_cache` first to read them up to date)."""
        if self.embedding_bag_collection is None:
            return []
        bags = self.embedding_bag_collection.embedding_bags
        # ModuleDict items are typed nn.Module; an embedding bag's weight is a Parameter.
        return [
            (s, cast(nn.Parameter, bags[name].weight))
            for s, name in zip(self.shards, self._table_names)
        ]

    def flush_cache(self) -> None:
        """Write the UVM-cached shards' rows held in HBM back to their tables
        (:meth:`_FusedShards.flush`); a no-op without cached shards."""
        if isinstance(self.embedding_bag_collection, _FusedShards):
            self.embedding_bag_collection.flush()

    def drop_cache(self) -> None:
        """Forget the UVM-cached shards' rows held in HBM, unwritten updates included
        (:meth:`_FusedShards.drop_cache`): after their tables were loaded; a no-op without
        cached shards."""
        if isinstance(self.embedding_bag_collection, _FusedShards):
            self.embedding_bag_collection.drop_cache()

    def load_tables_from(self, source: EmbeddingBagCollection) -> None:
        """Copy this rank's shards out of an EBC holding the whole tables under the same names."""
        self.load_table_weights(
            {
                name.removeprefix("embedding_bags.").removesuffix(".weight"): weight
                for name, weight in source.state_dict().items()
            }
        )

    def load_table_weights(self, weights: Mapping[str, torch.Tensor]) -> None:
        """Copy this rank's shards out of whole tables ``{table name: (rows, N)}``."""
        with torch.no_grad():
            for (shard, param), table in zip(self.shard_parameters(), self._table_names):
                if table not in weights:
                    raise ValueError(f"no weights for table {table!r} (got {sorted(weights)})")
                param.copy_(
                    weights[table][
                        shard.row_start : shard.row_stop, shard.col_start : shard.col_stop
                    ]
                )

    def reset_tables(self, seed: int) -> None:
        """Initialize this rank's shards with their tables' ``init_fn`` (TorchRec's default:
        uniform in ``+-sqrt(1 / rows of the whole table)``), from a random stream per shard.

        The stream of a shard is seeded by ``(seed, feature, first row, first column)``, so
        shards are decorrelated (ranks usually share one global seed) and the result depends on
        ``seed`` and the plan only. It is not the single-process model's initialization; use
        :meth:`load_table_weights` for that.
        """
        with torch.no_grad():
            for (shard, param), table in zip(self.shard_parameters(), self._shard_configs):
                entropy = [seed, shard.feature, shard.row_start, shard.col_start]
                shard_seed = int(np.random.SeedSequence(entropy).generate_state(1)[0])
                devices = [param.device] if param.device.type == "cuda" else []
                with torch.random.fork_rng(devices=devices):
                    torch.manual_seed(shard_seed)
                    assert table.init_fn is not None
                    table.init_fn(param)

    @property
    def _shard_configs(self) -> list[EmbeddingBagConfig]:
        ebc = self.embedding_bag_collection
        if ebc is None:
            return []
        by_name = {t.name: t for t in ebc.embedding_bag_configs()}
        return [by_name[name] for name in self._table_names]

    @property
    def fused_optimizer(self) -> KeyedOptimizer | None:
        """The in-backward optimizer of this rank's shards (``None`` without ``sparse_optimizer``
        or shards). Its ``param_groups[0]["lr"]`` reaches the kernel at ``zero_grad``/``step``."""
        ebc = self.embedding_bag_collection
        return ebc.fused_optimizer() if isinstance(ebc, _FusedShards) else None

    # ---- steps -------------------------------------------------------------------------------

    def distribute_input(self, features: KeyedJaggedTensor) -> KeyedJaggedTensor:
        """Step a: one jagged feature per shard of this rank, ``G B`` samples by source rank."""
        received = self.start_input_dist(features).wait().wait()
        self.check_received(received, features.stride())
        return received

    def start_input_dist(
        self, features: KeyedJaggedTensor
    ) -> Awaitable[Awaitable[KeyedJaggedTensor]]:
        """Start step a (TorchRec's two-stage ``KJTAllToAll``: the first ``wait`` exchanges the
        per-key sizes, the second the ids); :meth:`check_received` checks what arrives."""
        plan, topo = self.plan, self.plan.topology
        if sorted(features.keys()) != sorted(plan.feature_names):
            raise ValueError(
                f"features have keys {features.keys()}, the plan {list(plan.feature_names)}"
            )
        if features.weights_or_none() is not None:
            raise ValueError("weighted features are not supported")
        jagged = features.to_dict()
        # ids per key, known on the host when the data pipeline gave the KJT its per-key sizes
        # (dmt's loaders do): TorchRec's KJTAllToAll needs them, and computing them would sync
        ids_per_feature = dict(zip(features.keys(), features.length_per_key()))
        buckets = self._bucket_row_wise(jagged)
        keys: list[str] = []
        lengths: list[torch.Tensor] = []
        values: list[torch.Tensor] = []
        ids_per_key: list[int] = []
        ids_of_shard: dict[TableShard, int] = {}
        for rank in range(topo.world_size):
            for shard in plan.rank_shards(rank):
                name = plan.feature_names[shard.feature]
                if shard.feature in buckets:
                    piece = buckets[shard.feature][topo.position_of(rank)]
                else:
                    piece = (jagged[name].lengths(), jagged[name].values(), ids_per_feature[name])
                keys.append(name)
                lengths.append(piece[0])
                values.append(piece[1])
                ids_per_key.append(piece[2])
                ids_of_shard[shard] = piece[2]
        kjt = KeyedJaggedTensor(
            keys=keys,
            values=torch.cat(values),
            lengths=torch.cat(lengths),
            stride=features.stride(),
            length_per_key=ids_per_key,
        )
        if self.stats is not None:
            bytes_per_dst = step_a_bytes_per_dst(
                plan,
                features.stride(),
                ids_of_shard.__getitem__,
                length_size=features.lengths().element_size(),
                id_size=features.values().element_size(),
            )
            self.stats.record("a", "world", topo.world_ranks, bytes_per_dst)
        return self._input_dist(kjt)

    def check_received(self, received: KeyedJaggedTensor, local_batch: int) -> None:
        """Raise ``ValueError`` unless step a brought ``G B`` samples (``B = local_batch``).

        Only a rank whose batch differs from the mean of all ranks' can tell (it sees its own
        batch and the sum): with uneven batches, a rank whose batch is the mean goes on and
        waits in step d until the group's timeout (``trainer.collective_timeout_s``). The
        trainer never gives uneven batches here (``even_batches``: the loaders drop the last,
        partial one); code that calls the dataflow itself must keep every rank's batch the
        same size, or pad through ``ShardedDMT(even_batches=False)``."""
        expected = local_batch * self.plan.topology.world_size
        if received.stride() != expected:
            raise ValueError(
                f"rank {self.rank}: received a global batch of {received.stride()} samples, "
                f"expected G*B = {expected}; every rank must use the same local batch size"
            )

    def _bucket_row_wise(
        self, jagged: Mapping[str, JaggedTensor]
    ) -> dict[int, list[tuple[torch.Tensor, torch.Tensor, int]]]:
        """Split every row-wise feature's bags by row block: ``(lengths, local ids, number of
        ids)`` per position. One host sync for all of them (the blocks' sizes, which TorchRec's
        ``KJTAllToAll`` needs on the host, as for its own row-wise sharding); none without
        row-wise features."""
        if not self._row_wise:
            return {}
        per_feature = []
        for f in self._row_wise:
            starts = getattr(self, f"_row_starts_{f}")
            piece = jagged[self.plan.feature_names[f]]
            ids, lengths = piece.values(), piece.lengths()
            num_blocks, B = starts.numel(), lengths.numel()
            block = torch.bucketize(ids, starts[1:], right=True)
            sample = torch.repeat_interleave(
                torch.arange(B, device=ids.device), lengths, output_size=ids.numel()
            )
            key = block * B + sample
            order = torch.argsort(key, stable=True)
            counts = torch.zeros(num_blocks * B, dtype=lengths.dtype, device=ids.device)
            counts.index_add_(0, key, torch.ones_like(key, dtype=lengths.dtype))
            local = (ids - starts[block]).to(ids.dtype)[order]
            per_feature.append((counts.view(num_blocks, B), local))
        sizes = torch.cat([counts.sum(1) for counts, _ in per_feature]).tolist()
        out: dict[int, list[tuple[torch.Tensor, torch.Tensor, int]]] = {}
        for f, (counts, local) in zip(self._row_wise, per_feature):
            block_sizes, sizes = sizes[: counts.size(0)], sizes[counts.size(0) :]
            out[f] = [
                (counts[p], piece, n)
                for p, (piece, n) in enumerate(zip(local.split(block_sizes), block_sizes))
            ]
        return out

    def lookup(self, received: KeyedJaggedTensor) -> torch.Tensor:
        """Step b: pooled embeddings of this rank's shards, ``(G B, W_r + R_t N)``."""
        if self.embedding_bag_collection is None:
            # requires_grad keeps the backward collectives of steps d and f in step with the
            # tower-mates that do hold tables.
            return torch.zeros(
                received.stride(), 0, device=self._block_order.device, requires_grad=True
            )
        if isinstance(self.embedding_bag_collection, _FusedShards):
            return self.embedding_bag_collection(received)
        return self.embedding_bag_collection(received).values()

    def peer_permute_site(self, received: KeyedJaggedTensor) -> str:
        """Where step c permutes this batch: ``"none"`` (step a delivered peer order),
        ``"input"`` or ``"output"`` (``"auto"``: the fewer bytes, :mod:`dmt.sptt.peer_permute`)."""
        if not self._permutes:
            return "none"
        lengths, ids = received.lengths(), received.values()
        return peer_permute_site(
            self.peer_permute_setting,
            input_bytes=input_permute_bytes(
                lengths.numel(),
                ids.numel(),
                length_size=lengths.element_size(),
                id_size=ids.element_size(),
            ),
            output_bytes=output_permute_bytes(
                received.stride(),
                self._lookup_width,
                value_size=self._value_size,
                backward=torch.is_grad_enabled(),
            ),
        )

    def peer_permute_input(self, received: KeyedJaggedTensor) -> KeyedJaggedTensor:
        """Step c before step b (section 3.1.3): every shard's ``G`` sample blocks from the order
        step a delivered into peer order, with TorchRec's own KJT permute kernel."""
        stride = received.stride()
        if not received.keys() or stride == 0:
            self._record_shuffle("input", 0)
            return received
        lengths, ids = received.lengths(), received.values()
        self._record_shuffle("input", _nbytes(lengths) + _nbytes(ids))
        # the permutation keeps the number of ids: passing it avoids a device sync
        permuted_lengths, permuted_ids, _ = torch.ops.fbgemm.permute_2D_sparse_data(
            self._input_rows,
            lengths.view(-1, stride // self.plan.topology.world_size),
            ids,
            None,
            ids.numel(),
        )
        # blocks move within each key: its total is the received one (step a's KJT has it), so
        # TorchRec's to_dict in the lookup needs no device-to-host copy to find it
        return KeyedJaggedTensor(
            keys=received.keys(),
            values=permuted_ids,
            lengths=permuted_lengths.view(-1),
            stride=stride,
            length_per_key=received.length_per_key(),
            offset_per_key=received.offset_per_key(),
        )

    def peer_permute(self, pooled: torch.Tensor) -> torch.Tensor:
        """Step c after step b (Figure 7): pooled sample blocks from the order step a delivered
        into peer order, same shape; the backward permutes the gradient back."""
        G = self.plan.topology.world_size
        blocks = pooled.view(G, pooled.size(0) // G, pooled.size(1))
        out = _PermuteBlocks.apply(
            blocks, self._block_order, self._block_inverse, self._recorder_shuffle("output")
        )
        assert isinstance(out, torch.Tensor)
        return out.view(pooled.shape)

    def intra_tower_exchange(
        self, pooled: torch.Tensor, grad_scale: float = 1.0
    ) -> list[torch.Tensor]:
        """Step d: all-to-all of the table/column-wise columns and reduce-scatter of the row-wise
        partial sums inside the tower; ``grad_scale`` multiplies ``pooled``'s gradient once it
        has come back over the wire.

        Returns:
            1-D: the ``(T B, W_q)`` blocks from each tower-mate ``q`` by position, one after
            the other (with compressed communication in ``comm_dtype``, as they came off the
            wire: step e casts them), then the ``(T B, R_t N)`` summed row-wise features if the
            tower has any.
        """
        plan, topo = self.plan, self.plan.topology
        TB = pooled.size(0) // topo.tower_size
        mates = topo.tower_ranks(self.tower)
        output_sizes, input_sizes = step_d_split_sizes(plan, self.rank, TB)
        width = plan.all_to_all_width(self.rank)
        received = [
            all_to_all_single(
                pooled[:, :width].reshape(-1),
                output_split_sizes=output_sizes,
                input_split_sizes=input_sizes,
                group=self.groups.tower,
                record=self._recorder("d", "tower", mates),
                comm_dtype=self.comm_dtype,
                grad_scale=grad_scale,
                cast_back=False,  # step e casts while it places the columns
            )
        ]
        if plan.row_wise_features(self.tower):
            received.append(
                reduce_scatter(
                    pooled[:, width:].reshape(-1),
                    group=self.groups.tower,
                    record=self._recorder("d", "tower", mates),
                    comm_dtype=self.comm_dtype,
                    grad_scale=grad_scale,
                )
            )
        return received

    def shuffle_to_tower_layout(
        self,
        received: list[torch.Tensor],
        grad_scale: float = 1.0,
        dtype: torch.dtype = torch.float32,
    ) -> torch.Tensor:
        """Step e: ``(features, peers)`` to ``(peers, features)`` in tower order, ``(T B, F_t, N)``,
        from what :meth:`intra_tower_exchange` returned; ``grad_scale`` multiplies the gradient
        before it goes back over step d's wire. ``dtype``: the lookup's (FP32 tables), which a
        compressed all-to-all's wire values are cast to."""
        out = _PlaceColumns.apply(self._step_e, grad_scale, dtype, *received)
        assert isinstance(out, torch.Tensor)
        return out.view(out.size(0), -1, self.embedding_dim)

    def peer_exchange(self, tower_output: torch.Tensor) -> list[torch.Tensor]:
        """Step f: all-to-all among peers; returns every tower's ``(B, V_t, D_t)``, by tower."""
        return self.start_peer_exchange(tower_output).wait()

    def start_peer_exchange(self, tower_output: torch.Tensor) -> PeerExchange:
        """Step f without waiting (TorchRec's output dist): the all-to-all runs while the caller
        computes what does not need the towers' outputs (the bottom MLP); ``wait()`` gives what
        :meth:`peer_exchange` returns. Its backward is asynchronous too."""
        B, sizes, input_sizes = self._peer_splits(tower_output)
        request = all_to_all_single_async(
            tower_output.reshape(-1),
            output_split_sizes=sizes,
            input_split_sizes=input_sizes,
            group=self.groups.peer,
            record=self._recorder("f", "peer", self.plan.topology.peers_of(self.rank)),
            comm_dtype=self.comm_dtype,
        )
        return PeerExchange(request, lambda received: self.split_peer_output(received, B))

    def _peer_splits(self, tower_output: torch.Tensor) -> tuple[int, list[int], list[int]]:
        """``(B, elements received from each peer, elements sent to each peer)`` of step f."""
        T = self.plan.topology.num_towers
        V, D = self.tower_output_dims[self.tower]
        if tower_output.dim() != 3 or tower_output.shape[1:] != (V, D):
            raise ValueError(
                f"tower {self.tower}'s module returned shape {tuple(tower_output.shape)}, "
                f"expected (T*B, {V}, {D}) from tower_output_dims"
            )
        B = tower_output.size(0) // T
        return B, *step_f_split_sizes(self.tower_output_dims, self.tower, B)

    def split_peer_output(self, received: torch.Tensor, B: int) -> list[torch.Tensor]:
        """Step f's received elements as every tower's ``(B, V_t, D_t)``, by tower."""
        sizes = [B * v * d for v, d in self.tower_output_dims]
        return [
            chunk.view(B, v, d)
            for chunk, (v, d) in zip(received.split(sizes), self.tower_output_dims)
        ]

    # ---- composition -------------------------------------------------------------------------

    def forward(
        self, features: KeyedJaggedTensor, tower_module: TowerModule | None = None
    ) -> list[torch.Tensor]:
        """Steps a-f on this rank's local batch.

        Args:
            features: KJT of the ``F`` sparse features of the local batch (``B`` samples).
            tower_module: this rank's replica of its tower's module, applied after step e,
                ``(T B, F_t, N) -> (T B, V_t, D_t)``; ``None`` passes embeddings through.

        Returns:
            ``T`` tensors ``(B, V_t, D_t)``: every tower's output for the local samples.
        """
        tower_input = self.tower_input(self.distribute_input(features))
        tower_output = tower_input if tower_module is None else tower_module(tower_input)
        return self.peer_exchange(tower_output)

    def tower_input(
        self,
        received: KeyedJaggedTensor,
        lookup_grad_scale: float = 1.0,
        grad_scale: float = 1.0,
    ) -> torch.Tensor:
        """Steps b-e on what step a delivered: the tower's embeddings of its ``T`` peers'
        samples, ``(T B, F_t, N)``, in the tower's feature order.

        ``lookup_grad_scale`` multiplies the gradient of the lookup's output, i.e. after step
        d's backward: its wire carries the gradient unscaled, as TorchRec's collectives do (they
        divide after decoding), so a low ``comm_precision`` rounds it at its own magnitude.
        ``grad_scale`` multiplies the gradient of the returned embeddings, before that wire.
        Both are applied in place on buffers the backward made (steps e and d), as exactly as
        :func:`~dmt.sptt.collectives.scale_grad` would, without its copy."""
        site = self.peer_permute_site(received)
        if site == "input":
            received = self.peer_permute_input(received)
        pooled = self.lookup(received)
        if site == "output":
            pooled = self.peer_permute(pooled)
        elif site == "none":
            self._record_shuffle("none", 0)
        exchanged = self.intra_tower_exchange(pooled, grad_scale=lookup_grad_scale)
        return self.shuffle_to_tower_layout(exchanged, grad_scale=grad_scale, dtype=pooled.dtype)

    def pooled_embeddings(self, features: KeyedJaggedTensor) -> torch.Tensor:
        """Pass-through towers: the pooled embeddings ``(B, F, N)`` of all features, model order.

        Equal to the unsharded EBC's lookup of the local batch.
        """
        if self.tower_output_dims != tuple(
            (len(fs), self.embedding_dim) for fs in self.plan.tower_features
        ):
            raise ValueError("pooled_embeddings needs pass-through tower_output_dims")
        by_tower = torch.cat(self(features), dim=1)
        return by_tower.index_select(1, self._output_permutation)

    # ---- accounting --------------------------------------------------------------------------

    def _recorder(
        self, step: str, group: str, dst_ranks: Sequence[int]
    ) -> Callable[[list[int], str], None] | None:
        stats = self.stats
        if stats is None:
            return None

        def record(bytes_per_dst: list[int], direction: str) -> None:
            stats.record(step, group, dst_ranks, bytes_per_dst, direction=direction)

        return record

    def _record_shuffle(self, what: str, nbytes: int, direction: str = "forward") -> None:
        if self.stats is not None:
            self.stats.record_shuffle("c", what, nbytes, direction=direction)

    def _recorder_shuffle(self, what: str) -> Callable[[int, str], None] | None:
        if self.stats is None:
            return None
        return lambda nbytes, direction: self._record_shuffle(what, nbytes, direction)


class PeerExchange(LazyAwaitable[list[torch.Tensor]]):
    """Step f in flight (:meth:`SPTTDataflow.start_peer_exchange`); ``wait()`` returns every
    tower's ``(B, V_t, D_t)``, by tower (the same list however often it is called)."""

    def __init__(
        self, request: AllToAllRequest, split: Callable[[torch.Tensor], list[torch.Tensor]]
    ) -> None:
        super().__init__()
        self._request = request
        self._split = split
        self._outputs: list[torch.Tensor] | None = None

    @property
    def request(self) -> AllToAllRequest:
        """The all-to-all in flight (its ``in_flight``, ``grad_in_flight``)."""
        return self._request

    def _wait_impl(self) -> list[torch.Tensor]:
        if self._outputs is None:
            self._outputs = self._split(self._request.wait())
        return self._outputs


def _nbytes(tensor: torch.Tensor) -> int:
    return tensor.numel() * tensor.element_size()


class _PermuteBlocks(torch.autograd.Function):
    """``blocks[order]`` along dim 0; the backward gathers the gradient with the inverse
    permutation (an exact copy, cheaper than ``index_select``'s scatter-add into zeros)."""

    @staticmethod
    def forward(
        ctx: torch.autograd.function.FunctionCtx,
        blocks: torch.Tensor,
        order: torch.Tensor,
        inverse: torch.Tensor,
        record: Callable[[int, str], None] | None,
    ) -> torch.Tensor:
        ctx.inverse = inverse  # type: ignore[attr-defined]
        ctx.record = record  # type: ignore[attr-defined]
        if record is not None:
            record(_nbytes(blocks), "forward")
        return blocks.index_select(0, order)

    @staticmethod
    def backward(
        ctx: torch.autograd.function.FunctionCtx, grad: torch.Tensor
    ) -> tuple[torch.Tensor, None, None, None]:
        if ctx.record is not None:  # type: ignore[attr-defined]
            ctx.record(_nbytes(grad), "backward")  # type: ignore[attr-defined]
        return grad.index_select(0, ctx.inverse), None, None, None  # type: ignore[attr-defined]


MAX_STEP_E_COPIES = 32
"""Step e's forward copies each run of columns into place (one pass over the embeddings) when
there are at most this many runs; with more (tables split across many ranks) it glues the blocks
and gathers, two ops whatever the number of runs (fewer kernel launches on a GPU)."""


class _StepE(nn.Module):
    """:func:`~dmt.sptt.splits.step_e_blocks` ready to copy, moving columns ``unit`` at a time
    (:func:`~dmt.sptt.splits.run_unit`: ``N`` when no table is split): per block its source,
    first column, width and tower-order columns (a slice's first column when they are
    contiguous, else an index buffer of ``unit``-column groups); the runs the forward copies
    (``runs``, :func:`~dmt.sptt.splits.column_runs`), or, with more than ``max_copies`` of them,
    the gather of the tower's groups from the blocks glued side by side (``gather``; ``None``:
    they already are in tower order). Buffers, so they move with the dataflow; not saved."""

    gather: torch.Tensor | None

    def __init__(
        self,
        blocks: Sequence[ColumnBlock],
        device: torch.device | None,
        max_copies: int = MAX_STEP_E_COPIES,
    ) -> None:
        super().__init__()
        runs = column_runs(blocks)
        self.unit = u = run_unit(runs)
        self.source_widths: list[int] = []
        self.blocks: list[tuple[int, int, int, int | str]] = []
        glued: list[int] = []  # the tower column of each glued column
        for i, b in enumerate(blocks):
            width = len(b.dest)
            while len(self.source_widths) <= b.source:
                self.source_widths.append(0)
            self.source_widths[b.source] = max(self.source_widths[b.source], b.start + width)
            dest: int | str = b.dest[0]
            if b.dest != tuple(range(b.dest[0], b.dest[0] + width)):
                dest = f"dest_{i}"
                groups = torch.tensor(b.dest[::u], device=device) // u
                self.register_buffer(dest, groups, persistent=False)
            self.blocks.append((b.source, b.start, width, dest))
            glued.extend(b.dest)
        self.num_columns = len(glued)
        self.runs: tuple[ColumnRun, ...] | None = runs if len(runs) <= max_copies else None
        order = sorted(range(len(glued)), key=glued.__getitem__)  # tower column -> glued one
        gather = None
        if self.runs is None and order != list(range(len(glued))):
            gather = torch.tensor(order[::u], device=device) // u
        self.register_buffer("gather", gather, persistent=False)

    def rows(self, sources: Sequence[torch.Tensor]) -> int:
        """``T B``: the rows of step d's outputs."""
        for source, width in zip(sources, self.source_widths):
            if width:
                return source.numel() // width
        return 0

    def dest(self, dest: int | str) -> int | torch.Tensor:
        """A block's tower columns: the first of a contiguous run, or the index buffer of its
        ``unit``-column groups."""
        return dest if isinstance(dest, int) else cast(torch.Tensor, getattr(self, dest))


class _PlaceColumns(torch.autograd.Function):
    """Step e: step d's outputs (1-D, ``(T B, width)`` blocks one after the other) into one
    ``(T B, F_t N)`` tensor of ``dtype`` in tower order: each run of columns copied into place
    (or, with many runs, the blocks glued side by side and the tower's columns gathered),
    ``unit`` columns at a time. The backward gathers each block's gradient straight into the
    buffer step d sends back (no scatter into zeros, no split and concatenation) and multiplies
    it by ``grad_scale`` there.

    A source in a lower precision than ``dtype`` (step d's all-to-all with compressed
    communication, which hands over what came off the wire) is cast by the same copies, and its
    gradient is rounded to that precision by the copies that place it, already scaled: the
    values of a cast back after the wire and a cast before it, with two passes over the
    embeddings fewer."""

    @staticmethod
    def forward(
        ctx: torch.autograd.function.FunctionCtx,
        layout: _StepE,
        grad_scale: float,
        dtype: torch.dtype,
        *sources: torch.Tensor,
    ) -> torch.Tensor:
        ctx.layout = layout  # type: ignore[attr-defined]
        ctx.grad_scale = grad_scale  # type: ignore[attr-defined]
        ctx.sources = [(s.numel(), s.dtype) for s in sources]  # type: ignore[attr-defined]
        rows, u, columns = layout.rows(sources), layout.unit, layout.num_columns
        blocks = [
            sources[source][rows * start : rows * (start + width)].view(rows, width)
            for source, start, width, _ in layout.blocks
        ]
        if layout.runs is not None:
            out = blocks[0].new_empty(rows, columns, dtype=dtype)
            for block, start, dest, width in layout.runs:
                out[:, dest : dest + width].copy_(blocks[block][:, start : start + width])
            return out
        glued = torch.cat(blocks, dim=1)  # a tower has a feature: there is a block
        if layout.gather is not None:
            glued = glued.view(rows, columns // u, u).index_select(1, layout.gather)
        return glued.view(rows, columns).to(dtype)

    @staticmethod
    def backward(
        ctx: torch.autograd.function.FunctionCtx, grad: torch.Tensor
    ) -> tuple[torch.Tensor | None, ...]:
        layout: _StepE = ctx.layout  # type: ignore[attr-defined]
        scale: float = ctx.grad_scale  # type: ignore[attr-defined]
        rows, u = grad.size(0), layout.unit
        sources: list[tuple[int, torch.dtype]] = ctx.sources  # type: ignore[attr-defined]
        grads = [grad.new_empty(n, dtype=d) for n, d in sources]
        blocks = [
            grads[source][rows * start : rows * (start + width)].view(rows, width)
            for source, start, width, _ in layout.blocks
        ]
        if layout.runs is not None and any(d != grad.dtype for _, d in sources):
            # scaled and cast in one pass: the fp32 product rounded to the wire's dtype, the
            # values of mul_ followed by .to()
            for index, start, first, width in layout.runs:
                view = blocks[index][:, start : start + width]
                piece = grad[:, first : first + width]
                if scale != 1.0:
                    torch.mul(piece, scale, out=view)
                else:
                    view.copy_(piece)
            for g in grads:
                saturate_(g)
            return (None, None, None, *grads)
        groups = grad.reshape(rows, layout.num_columns // u, u)
        for (_, _, width, name), block in zip(layout.blocks, blocks):
            dest = layout.dest(name)
            if block.dtype != grad.dtype:  # many runs: gather, scale, then round
                piece = (
                    grad[:, dest : dest + width]
                    if isinstance(dest, int)
                    else groups.index_select(1, dest).view(rows, width)
                )
                block.copy_(piece * scale if scale != 1.0 else piece)
            elif isinstance(dest, int):
                block.copy_(grad[:, dest : dest + width])
            else:
                torch.index_select(groups, 1, dest, out=block.view(rows, width // u, u))
        for g in grads:
            if scale != 1.0 and g.dtype == grad.dtype:
                g.mul_(scale)
            saturate_(g)
        return (None, None, None, *grads)


def check_fp32(table: EmbeddingBagConfig, owner: str = "") -> None:
    """Raise ``ValueError`` unless ``table`` is FP32 (``owner``: who has it, e.g. ``"tower 0's "``)."""
    if table.data_type != DataType.FP32:
        raise ValueError(
            f"{owner}table {table.name!r} has data_type {table.data_type.value}; SPTT's lookup "
            "takes FP32 tables (TorchRec's fused lookup groups tables by data type, which would "
            "change the order of their columns)"
        )


def _check_tables(plan: SPTTPlan, tables: Sequence[EmbeddingBagConfig]) -> None:
    if len(tables) != plan.num_features:
        raise ValueError(f"got {len(tables)} tables for {plan.num_features} features")
    for f, (name, table) in enumerate(zip(plan.feature_names, tables)):
        if list(table.feature_names) != [name]:
            raise ValueError(
                f"table {table.name!r} reads features {table.feature_names}; SPTT needs one "
                f"table per feature, in model order (expected [{name!r}])"
            )
        if (table.num_embeddings, table.embedding_dim) != (
            plan.num_embeddings[f],
            plan.embedding_dim,
        ):
            raise ValueError(
                f"table {table.name!r} is {table.num_embeddings} x {table.embedding_dim}, the "
                f"plan says {plan.num_embeddings[f]} x {plan.embedding_dim}"
            )
        check_fp32(table)
        if plan.is_row_wise(f) and table.pooling != PoolingType.SUM:
            raise ValueError(
                f"row-wise table {table.name!r} needs SUM pooling (step d adds partial sums), "
                f"got {table.pooling}"
            )


def _shard_table(table: EmbeddingBagConfig, shard: TableShard) -> EmbeddingBagConfig:
    """The config of one shard; the init range stays that of the whole table."""
    return dataclasses.replace(
        table,
        num_embeddings=shard.num_rows,
        embedding_dim=shard.num_cols,
        weight_init_min=table.get_weight_init_min(),
        weight_init_max=table.get_weight_init_max(),
    )


def kernel_groups(
    widths: Sequence[int], poolings: Sequence[object], cached: Sequence[bool]
) -> list[list[int]]:
    """The shards (indices) of each ``FusedEmbeddingBagCollection`` of a rank, in output order:
    those in the device's memory in one, then the UVM-cached ones in one per width (first
    appearance first), each ordered by pooling (first appearance first).

    FBGEMM gives all the cached tables of one kernel one HBM cache whose slots are as wide as the
    widest of them (``max_D_cache``): a column shard cached beside a whole table would take the
    table's width in every slot, several times the memory the plan counts
    (:meth:`dmt.memory.MemoryBudget.cached_hbm_bytes`, per shard). One kernel per width keeps
    each cache as wide as its shards."""
    order = list(dict.fromkeys(poolings))
    cached_widths = list(dict.fromkeys(w for w, c in zip(widths, cached) if c))
    in_device = [i for i in range(len(widths)) if not cached[i]]
    groups = [in_device] if in_device else []
    for width in cached_widths:
        groups.append([i for i in range(len(widths)) if cached[i] and widths[i] == width])
    return [sorted(g, key=lambda i: order.index(poolings[i])) for g in groups]


class _FusedShards(nn.Module):
    """This rank's shards in TorchRec ``FusedEmbeddingBagCollection`` s: ``fused`` for those in
    the device's memory, ``fused_cached`` (CUDA only) for the UVM-cached ones (FBGEMM
    ``EmbeddingLocation.MANAGED_CACHING``, ``cache_load_factor`` of their rows in HBM), one per
    shard width (:func:`kernel_groups`).

    ``FusedEmbeddingBagCollection`` batches its tables by pooling type and concatenates the
    batches' outputs, so with mixed pooling its columns are not in table order. Handing each
    module its tables grouped by pooling (first appearance first), and concatenating ``fused``
    before the ``fused_cached`` ones, gives a known column order, which one ``index_select``
    maps back to shard order.

    Parameters are named ``embedding_bags.<table>.weight`` like a plain EBC's.
    """

    _columns: torch.Tensor

    def __init__(
        self,
        tables: Sequence[EmbeddingBagConfig],
        sparse_optimizer: SparseOptimizer,
        device: torch.device | None,
        *,
        cached: Sequence[bool] = (),
        cache_load_factor: float | None = None,
    ) -> None:
        super().__init__()
        optimizer_class, kwargs = sparse_optimizer
        optimizer_class = fused_ebc_class(optimizer_class)  # e.g. torchrec.optim.Adam: its kwargs
        cached = list(cached) or [False] * len(tables)
        groups = kernel_groups(
            [t.embedding_dim for t in tables], [t.pooling for t in tables], cached
        )
        grouped = [i for g in groups for i in g]
        self._configs = [tables[i] for i in grouped]
        self.fused: FusedEmbeddingBagCollection | None = None
        self.fused_cached = nn.ModuleList()
        for group in groups:
            if not cached[group[0]]:
                self.fused = FusedEmbeddingBagCollection(
                    [tables[i] for i in group],
                    optimizer_type=optimizer_class,
                    optimizer_kwargs=dict(kwargs),
                    device=device,
                )
                continue
            # CUDA only (FBGEMM's managed memory); the plan allows it only for a CUDA budget,
            # so no CPU test reaches this line (see scripts/gpu_acceptance.sh).
            self.fused_cached.append(
                FusedEmbeddingBagCollection(
                    [tables[i] for i in group],
                    optimizer_type=optimizer_class,
                    optimizer_kwargs={**kwargs, "cache_load_factor": cache_load_factor},
                    device=device,
                    location=EmbeddingLocation.MANAGED_CACHING,
                )
            )
        # columns of table i in the fused output, in shard order
        starts, start = {}, 0
        for i in grouped:
            starts[i] = start
            start += tables[i].embedding_dim
        columns = [
            starts[i] + c for i in range(len(tables)) for c in range(tables[i].embedding_dim)
        ]
        self._in_order = columns == list(range(len(columns)))
        self.register_buffer("_columns", torch.tensor(columns, device=device), persistent=False)
        # One FBGEMM kernel holds every shard (no cache, one pooling): look up straight from the
        # KJT, as FusedEmbeddingBagCollection.forward does less directly (a dict of its
        # features, their values and lengths concatenated again, an offsets cumsum, and a copy
        # of its one output by torch.cat); the same kernel call and values.
        self._direct_keys: list[str] | None = None
        if self.fused is not None and not self.fused_cached:
            batches = self.fused._key_to_tables  # (pooling, data type) -> its tables, in order
            if len(batches) == 1:  # one kernel per (pooling, data type)
                (batch,) = batches.values()
                self._direct_keys = [f for t in batch for f in t.feature_names]

    @property
    def _cached_modules(self) -> list[FusedEmbeddingBagCollection]:
        modules: list[FusedEmbeddingBagCollection] = list(self.fused_cached)
        return modules

    @property
    def _modules_in_order(self) -> list[FusedEmbeddingBagCollection]:
        return ([self.fused] if self.fused is not None else []) + self._cached_modules

    @property
    def embedding_bags(self) -> nn.ModuleDict:
        modules = self._modules_in_order
        if len(modules) == 1:
            return modules[0].embedding_bags
        return nn.ModuleDict({k: v for m in modules for k, v in m.embedding_bags.items()})

    def embedding_bag_configs(self) -> list[EmbeddingBagConfig]:
        return list(self._configs)

    def flush(self) -> None:
        """Write the UVM-cached tables' rows held in the HBM cache back to the tables.

        FBGEMM applies the fused optimizer's updates to a cached row in the cache; the table
        (the registered ``weight``, in UVM) gets them only when the row is evicted or the cache is
        flushed. TorchRec's sharded kernels flush in ``state_dict``; this module must too, before
        its weights are read for a checkpoint, ``dmt-eval`` or ``dmt-export``. No-op without
        cached tables. CUDA only, so no CPU test reaches the loop (``scripts/gpu_acceptance.sh``).
        """
        # FusedEmbeddingBagCollection keeps its FBGEMM lookups in a plain list and has no flush
        for module in self._cached_modules:
            for lookup in module._emb_modules:
                lookup.flush()

    def drop_cache(self) -> None:
        """Empty the UVM-cached tables' HBM cache without writing it back (FBGEMM's
        ``reset_cache_states``): after the tables were loaded, lookups read them, not the rows
        cached before. No-op without cached tables; CUDA only, as :meth:`flush`."""
        for module in self._cached_modules:
            for lookup in module._emb_modules:
                lookup._emb_module.reset_cache_states()

    def fused_optimizer(self) -> KeyedOptimizer:
        optimizers = [m.fused_optimizer() for m in self._modules_in_order]
        optimizer = (
            optimizers[0]
            if len(optimizers) == 1
            else CombinedOptimizer([("", o) for o in optimizers])
        )
        assert isinstance(optimizer, CombinedOptimizer | KeyedOptimizer)
        return optimizer

    def forward(self, features: KeyedJaggedTensor) -> torch.Tensor:
        """Pooled embeddings ``(samples, sum of shard columns)``, in shard order."""
        # The kernel reads the KJT's own tensors (TorchRec's forward copies them): FBGEMM's
        # bounds check may clamp out-of-range ids in place, as in TorchRec's sharded lookups.
        if self.fused is not None and features.keys() == self._direct_keys:
            (kernel,) = self.fused._emb_modules
            weights = features.weights_or_none() if self.fused._is_weighted else None
            values = kernel(features.values(), features.offsets(), weights)
        else:
            outputs = [m(features).values() for m in self._modules_in_order]
            values = outputs[0] if len(outputs) == 1 else torch.cat(outputs, dim=1)
        return values if self._in_order else values.index_select(1, self._columns)
