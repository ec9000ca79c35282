"""A DMT model in its distributed form: SPTT for the towers, data parallelism for the rest.

:class:`DMTSharder` turns a plain DMT model (``dmt.models.dmt.DMTModel``: ``feature_names``,
``partition``, ``towers[t].embedding_bag_collection``, ``towers[t].tower_module``,
``interact``) into a :class:`ShardedDMT`; :func:`shard_dmt` is the trainer's entry point.

Shape legend: ``B`` local batch, ``F_t`` features of tower ``t``, ``N`` embedding dim, ``(V_t,
D_t)`` tower ``t``'s module output, ``T`` towers, ``K L`` ranks per tower, ``G = T K L``.

What runs where (paper sections 3.1-3.2):

* the tables of tower ``t`` are sharded over the ``K L`` ranks of tower ``t``
  (:func:`dmt.sptt.plan.build_plan`); each rank looks up its shards with FBGEMM TBE kernels that
  apply the sparse optimizer in the backward (TorchRec ``FusedEmbeddingBagCollection``);
* steps a-e (:class:`~dmt.sptt.dataflow.SPTTDataflow`) bring every rank the tower's embeddings of
  its ``T`` peers' samples, ``(T B, F_t, N)``;
* the tower module, replicated on the ``K L`` ranks of the tower, maps them to ``(T B, V_t,
  D_t)``; its gradients are averaged over the tower group only (DDP on the tower group);
* step f returns every tower's output for the rank's own ``B`` samples;
* ``interact`` (bottom MLP, interaction, top MLP) runs data-parallel over the world (DDP).

Gradients. Each rank's loss is the mean over its local batch, as under DDP. The SPTT
collectives' backward is unscaled (:mod:`dmt.sptt.collectives`), so the module scales the
gradient at three points to give every parameter the gradient of the mean loss over the global
batch, exactly as the single-process model on the concatenated batch would:

* the tower output (entering step f) by ``1 / T``: tower-module replica ``q`` then holds
  ``1/T`` times the summed gradient of its ``T`` peers' losses, and DDP's average over the
  ``K L`` replicas gives ``1/(T K L) = 1/G`` times the sum over all ranks, i.e. the gradient of
  the global mean; the tower input (leaving step e) is scaled by ``T``, which undoes it there;
* the lookup's output (entering step d) by ``1 / G``, so that the tables get ``1/G`` in total.

Towers without trainable parameters (pass-through) get only the ``1/G``. The scales sit where
the backward has already crossed the wire: steps f and d send unscaled gradients of the ranks'
losses (step f a rank's own, step d the sum of its ``T`` peers' through the tower module), as
TorchRec's pooled-embedding collectives do (they divide after decoding), so a
16-bit ``comm_precision`` rounds it at its own magnitude. Scaled before the wire, a gradient
``G`` times smaller would lose ``log2 G`` bits to fp16's underflow.

Optimizers. The tables' optimizer (SGD, Adagrad or row-wise Adagrad on CPU; Adam too on CUDA)
is fused into the lookup's backward and touches only the rows a batch used, exactly as in the
flat TorchRec model. Row-wise Adagrad keeps one accumulator per row *and shard*: for
column-wise shards its statistics cover the shard's columns only (TorchRec's column-wise
sharding behaves the same), so only table- and row-wise sharding match the single-process model
exactly there.
"""

from __future__ import annotations

import copy
import warnings
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from datetime import timedelta
from typing import TYPE_CHECKING, Any, TypeGuard

import torch
import torch.distributed as dist
from torch import nn
from torch.distributed._shard.sharded_tensor import ShardedTensor
from torch.distributed.algorithms.ddp_comm_hooks.default_hooks import allreduce_hook
from torch.nn.parallel import DistributedDataParallel
from torchrec.distributed.types import LazyAwaitable
from torchrec.modules.embedding_configs import EmbeddingBagConfig
from torchrec.modules.embedding_modules import EmbeddingBagCollection
from torchrec.optim import RowWiseAdagrad
from torchrec.optim.keyed import CombinedOptimizer, KeyedOptimizer
from torchrec.sparse.jagged_tensor import KeyedJaggedTensor

from dmt.config import OptimConfig
from dmt.memory import MemoryBudget
from dmt.optim import (
    check_sparse_optimizer,
    keyed_dense_optimizer,
    sparse_optimizer_name,
    sparse_optimizer_spec,
)
from dmt.runtime import Runtime
from dmt.sptt.collectives import comm_dtype_of
from dmt.sptt.comm_stats import CommStats
from dmt.sptt.dataflow import SparseOptimizer, SPTTDataflow, check_fp32
from dmt.sptt.peer_permute import DEFAULT_PEER_PERMUTE, check_peer_permute
from dmt.sptt.plan import SHARDING_KINDS, SPTTPlan, TableShard, build_plan
from dmt.sptt.process_groups import DEFAULT_TIMEOUT, SPTTProcessGroups, create_process_groups
from dmt.sptt.sharded_state import TABLE_KEY, column_blocks, plain_name, sharded_table
from dmt.sptt.sharded_towers import ShardedTowers
from dmt.sptt.splits import ring_allreduce_bytes
from dmt.sptt.topology import Topology

if TYPE_CHECKING:
    from dmt.models.dmt import DMTModel, Tower

__all__ = [
    "DMTSharder",
    "ShardedDMT",
    "check_dmt_model",
    "check_num_towers",
    "build_sptt_optimizer",
    "shard_dmt",
    "sparse_optimizer_spec",
    "topology_from",
]


# ---- validation (pure, before any collective) ----------------------------------------------


_DMT_ATTRIBUTES = ("feature_names", "partition", "towers", "interact")


def check_num_towers(num_towers: int, topology: Topology) -> None:
    """Raise ``ValueError`` unless a model's partition into ``num_towers`` towers has one tower
    per SPTT tower of ``topology`` (``T = G / (K L)``)."""
    T = topology.num_towers
    if num_towers != T:
        where = (
            f"G={topology.world_size} ranks, L={topology.local_world_size} per host, "
            f"K={topology.hosts_per_tower} hosts per tower"
        )
        fix = "more" if num_towers > T else "fewer"
        raise ValueError(
            f"the model's partition has {num_towers} towers but the topology has T={T} "
            f"towers ({where}: T = G / (K L)); SPTT needs exactly one model tower per "
            f"topology tower. Partition the features into {T} towers, or use {fix} ranks or "
            f"change sptt.hosts_per_tower so that G / (K L) = {num_towers}"
        )


def check_dmt_model(model: nn.Module, topology: Topology, *, dense_on_meta: bool = False) -> None:
    """Raise ``ValueError`` if ``model`` cannot be trained with SPTT on ``topology``.

    Checks that the model has one tower per SPTT tower (``T = G / (K L)``), that its partition
    is a partition of its features that matches its towers, that every tower's embedding
    tables read exactly the tower's features, one table per feature, all of one dim ``N``, that
    no tables sit outside the towers and that only tables are on the meta device (unless
    ``dense_on_meta``: a model that is only planned, never trained, as in ``dmt-plan``).
    Pure and the same on every rank, so every rank fails alike before any collective.
    """
    for attr in _DMT_ATTRIBUTES:
        if not hasattr(model, attr):
            raise TypeError(
                f"{type(model).__name__} is not a DMT model: it has no {attr!r} (SPTT needs "
                "feature_names, partition, towers and interact; see dmt.models.dmt.DMTModel)"
            )
    if not _is_dmt_model(model):  # narrows the type: the loop above checked the attributes
        raise TypeError(f"{type(model).__name__} is not an nn.Module")
    partition = [list(p) for p in model.partition]
    check_num_towers(len(partition), topology)
    if len(model.towers) != len(partition):
        raise ValueError(
            f"the model has {len(model.towers)} towers but its partition has {len(partition)}"
        )
    features = list(model.feature_names)
    flat = [f for p in partition for f in p]
    duplicates = sorted({f for f in flat if flat.count(f) > 1})
    missing = [f for f in features if f not in flat]
    unknown = sorted(set(flat) - set(features))
    if duplicates or missing or unknown or len(set(features)) != len(features):
        raise ValueError(
            "the model's partition does not match its features: "
            f"in several towers {duplicates}, in no tower {missing}, unknown {unknown} "
            f"(feature_names {features}, partition {partition})"
        )
    if any(not p for p in partition):
        raise ValueError(f"every tower needs at least one feature, got partition {partition}")
    dims: set[int] = set()
    table_tower: dict[str, int] = {}  # SPTT keys weights and optimizer state by table name
    for t, (tower, names) in enumerate(zip(model.towers, partition)):
        if list(tower.feature_names) != names:
            raise ValueError(
                f"tower {t} has features {list(tower.feature_names)}, the partition says {names}"
            )
        ebc = tower.embedding_bag_collection
        if not isinstance(ebc, EmbeddingBagCollection):
            raise TypeError(
                f"tower {t}'s embedding_bag_collection is a {type(ebc).__name__}, expected a "
                "torchrec EmbeddingBagCollection (shard the plain model, not a sharded one)"
            )
        read = [f for table in ebc.embedding_bag_configs() for f in table.feature_names]
        if read != names or any(
            len(table.feature_names) != 1 for table in ebc.embedding_bag_configs()
        ):
            raise ValueError(
                f"tower {t}'s tables read {read}; SPTT needs one table per feature, in the "
                f"tower's order {names}"
            )
        for table in ebc.embedding_bag_configs():
            if table.name in table_tower:
                raise ValueError(
                    f"towers {table_tower[table.name]} and {t} both have a table named "
                    f"{table.name!r}; SPTT finds tables by name: give every table its own "
                    "(dmt's towers name them t_<feature>)"
                )
            table_tower[table.name] = t
            check_fp32(table, owner=f"tower {t}'s ")
        dims.update(table.embedding_dim for table in ebc.embedding_bag_configs())
        if ebc.is_weighted():
            raise ValueError(f"tower {t}'s EBC is weighted; SPTT supports unweighted features")
    if len(dims) != 1:
        raise ValueError(f"all tables need one embedding dim N, got {sorted(dims)}")
    for name, module in [
        *_dense_children(model),
        *((f"towers.{t}", tw) for t, tw in enumerate(model.towers)),
    ]:
        tables = {
            id(p)
            for m in module.modules()
            if isinstance(m, EmbeddingBagCollection)
            for p in m.parameters()
        }
        if not dense_on_meta and any(p.is_meta for p in module.parameters() if id(p) not in tables):
            raise ValueError(
                f"the model's {name} has dense parameters on the meta device; build dense "
                "modules on the training device (only tables may be on meta)"
            )


def check_dense_device(model: DMTModel, device: torch.device) -> None:
    """Raise ``ValueError`` if ``device`` is a GPU and a dense parameter of ``model`` (outside
    its tables) is not on it: :class:`ShardedDMT` wraps the dense modules in
    ``DistributedDataParallel`` where they are, and DDP with CUDA ``device_ids`` refuses CPU
    modules, in a message that names neither the module nor the fix. (Shards on ``meta`` with
    a CPU dense part are ``dmt-plan``'s dry run.)"""
    if device.type != "cuda":
        return
    tables = {
        id(p)
        for m in model.modules()
        if isinstance(m, EmbeddingBagCollection)
        for p in m.parameters()
    }
    for name, p in model.named_parameters():
        if id(p) in tables:
            continue
        if p.device.type != "cuda" or device.index not in (None, p.device.index):
            raise ValueError(
                f"the model's dense parameter {name} is on {p.device}, the SPTT shards on "
                f"{device}: build the dense modules on the training device (dense_device), or "
                "move them there (.to(device)) before sharding"
            )


def _dense_children(model: DMTModel) -> list[tuple[str, nn.Module]]:
    """The model's children outside ``towers`` that hold its dense part (bottom, interaction,
    top), skipping aliases of tower modules. Raises if tables or tower parameters hide there."""
    tower_params = {id(p) for p in model.towers.parameters()}
    children = []
    for name, child in model.named_children():
        if name == "towers":
            continue
        if any(isinstance(m, EmbeddingBagCollection) for m in child.modules()):
            raise ValueError(
                f"the model's {name!r} holds embedding tables outside its towers; SPTT shards "
                "only towers[t].embedding_bag_collection"
            )
        params = list(child.parameters())
        if params and all(id(p) in tower_params for p in params):
            continue  # an alias of tower modules
        if any(id(p) in tower_params for p in params):
            raise ValueError(f"the model's {name!r} shares some parameters with its towers")
        children.append((name, child))
    return children


def _tables(model: DMTModel) -> list[EmbeddingBagConfig]:
    """One config per feature, in the model's feature order."""
    by_feature = {
        table.feature_names[0]: table
        for tower in model.towers
        for table in tower.embedding_bag_collection.embedding_bag_configs()
    }
    return [by_feature[f] for f in model.feature_names]


def _tower_output_dims(tower: Tower, num_features: int, dim: int) -> tuple[int, int]:
    """``(V_t, D_t)`` of a tower's module, from a forward of a copy on the meta device."""
    module = tower.tower_module
    if module is None:
        return num_features, dim
    probe = copy.deepcopy(module).to("meta").eval()
    with torch.no_grad():
        out = probe(torch.zeros(2, num_features, dim, device="meta"))
    if out.dim() != 3 or out.size(0) != 2:
        raise ValueError(
            f"a tower module must map (B, F_t, N) to (B, V_t, D_t); {type(module).__name__} "
            f"maps (2, {num_features}, {dim}) to {tuple(out.shape)}"
        )
    return int(out.size(1)), int(out.size(2))


def _has_trainable(module: nn.Module | None) -> bool:
    return module is not None and any(p.requires_grad for p in module.parameters())


# ---- accounting ----------------------------------------------------------------------------


@dataclass
class _AllReduceRecord:
    """State of the DDP comm hook that counts a gradient all-reduce in :class:`CommStats`.

    Bytes follow the ring model: each of the ``n`` group ranks sends ``2 (n - 1) / n`` times the
    bucket to its successor in the group (whatever algorithm the backend runs).
    """

    group: dist.ProcessGroup
    stats: CommStats
    step: str
    group_name: str
    successor: int
    size: int

    def __call__(
        self, bucket: dist.GradBucket
    ) -> torch.futures.Future[torch.Tensor]:  # pragma: no cover - called by DDP
        nbytes = bucket.buffer().numel() * bucket.buffer().element_size()
        sent = ring_allreduce_bytes(nbytes, self.size)
        self.stats.record(
            self.step, self.group_name, [self.successor], [sent], direction="backward"
        )
        return allreduce_hook(self.group, bucket)


def _record_hook(state, bucket):  # type: ignore[no-untyped-def]
    # Unannotated on purpose: DDP compares the annotations with dist.GradBucket and Future, which
    # `from __future__ import annotations` would turn into strings.
    return state(bucket)


def _data_parallel(
    module: nn.Module,
    group: dist.ProcessGroup,
    device: torch.device,
    stats: CommStats | None,
    step: str,
    group_name: str,
) -> DistributedDataParallel:
    # gradients as views into DDP's buckets, as TorchRec's DMP wraps the flat baseline's dense
    # part: otherwise the buckets hold a second copy of every gradient, which the memory plan
    # (dmt.planning.memory, parameters + gradients + optimizer state) does not count
    ddp = DistributedDataParallel(
        module,
        device_ids=[device] if device.type == "cuda" else None,
        process_group=group,
        forward_sync_buffers=False,
        gradient_as_bucket_view=True,
    )
    if stats is not None:
        ranks = dist.get_process_group_ranks(group)
        me = ranks.index(stats.rank)
        state = _AllReduceRecord(
            group, stats, step, group_name, ranks[(me + 1) % len(ranks)], len(ranks)
        )
        ddp.register_comm_hook(state, _record_hook)
    return ddp


# ---- the sharded model ---------------------------------------------------------------------


class _DenseArch(nn.Module):
    """The DMT model's parameters outside its towers (bottom, interaction, top) and its
    ``interact``, as one module that DDP can wrap.

    Shares the model's submodules; keeps a reference to the model for ``interact``.
    """

    def __init__(self, model: DMTModel) -> None:
        super().__init__()
        for name, child in _dense_children(model):
            self.add_module(name, child)
        for name, param in model.named_parameters(recurse=False):
            self.register_parameter(name, param)
        # The model's own buffers stay the model's: interact reads them, DDP does not sync them.
        self._interact: Callable[[torch.Tensor, Sequence[torch.Tensor]], torch.Tensor] = (
            model.interact
        )

    def forward(
        self,
        dense_features: torch.Tensor,
        tower_outputs: list[torch.Tensor] | LazyAwaitable[list[torch.Tensor]],
    ) -> Any:
        if not isinstance(tower_outputs, list):  # step f in flight: interact waits last
            tower_outputs = _Deferred(tower_outputs)
        return self._interact(dense_features, tower_outputs)


class _Deferred(Sequence[torch.Tensor]):
    """The towers' outputs of a step f in flight, waited for at the first access."""

    def __init__(self, awaitable: LazyAwaitable[list[torch.Tensor]]) -> None:
        self._awaitable = awaitable

    def __len__(self) -> int:
        return len(self._awaitable.wait())

    def __getitem__(self, index: Any) -> Any:
        return self._awaitable.wait()[index]


class ShardedDMT(nn.Module):
    """A DMT model trained with SPTT on this rank; build with :class:`DMTSharder`.

    ``forward(dense_features (B, num_dense), sparse_features: KJT of the F features) -> logits
    (B,)`` on this rank's local batch, like the plain model's. Every rank must call it in step
    (it runs collectives); ``B`` may differ between ranks (see :meth:`forward`).

    Submodules: ``towers``, a TorchRec sharded module (:class:`~dmt.sptt.sharded_towers.
    ShardedTowers`: step a as its input dist, steps b-e and this rank's replica of its tower's
    module as its compute, step f as its output dist), which holds ``dataflow`` (this rank's
    table shards and steps a-f) and ``tower_module`` (DDP over the tower group when it has
    parameters, ``None`` for a pass-through tower); and ``dense_arch`` (DDP over the world of
    everything outside the towers). TorchRec's ``TrainPipelineSparseDist`` pipelines ``towers``
    like a sharded EBC.

    Args:
        model: the plain DMT model; checked with :func:`check_dmt_model`. Its dense modules are
            shared, not copied. Tables may be on ``meta``: the shards are then initialized by
            :meth:`SPTTDataflow.reset_tables` (``init_seed``); otherwise they are copied.
        plan: table shards of every rank (:meth:`DMTSharder.plan`).
        groups: this rank's SPTT process groups, built from ``plan.topology``.
        sparse_optimizer: ``(class, kwargs)`` of the fused table optimizer; ``None`` keeps plain
            tables whose gradients land in ``.grad`` (scaled as described in the module doc).
        device: device of the shards; the dense modules must already be there
            (:func:`check_dense_device`).
        stats: optional :class:`CommStats`; counts steps a, d, f and, with the ring model, the
            tower-module (``"tm"``/``"tower"``) and dense (``"dense"``/``"world"``) all-reduces.
        init_seed: seed of :meth:`SPTTDataflow.reset_tables` for ``meta`` tables.
        peer_permute: where step c permutes (``"output"``, ``"input"``, ``"auto"``, ``"skip"``;
            :mod:`dmt.sptt.peer_permute`); the same training either way.
        comm_precision: dtype of steps d and f on the wire, ``"fp32"``, ``"bf16"`` or
            ``"fp16"`` (``sptt.comm_precision``; :class:`SPTTDataflow`).
        even_batches: every rank trains on the same local batch size (no padding collective
            in training; see :meth:`forward`).
    """

    def __init__(
        self,
        model: DMTModel,
        plan: SPTTPlan,
        *,
        groups: SPTTProcessGroups,
        sparse_optimizer: SparseOptimizer | None = None,
        device: torch.device | None = None,
        stats: CommStats | None = None,
        init_seed: int = 0,
        peer_permute: str = DEFAULT_PEER_PERMUTE,
        comm_precision: str = "fp32",
        even_batches: bool = False,
    ) -> None:
        super().__init__()
        topo = plan.topology
        self.even_batches = even_batches
        check_dmt_model(model, topo)
        device = device if device is not None else torch.device("cpu")
        check_dense_device(model, device)
        self.topology = topo
        self._world = groups.world
        self.tower = topo.tower_of(groups.rank)
        dims = getattr(model, "tower_output_dims", None) or [
            _tower_output_dims(tower, len(names), plan.embedding_dim)
            for tower, names in zip(model.towers, model.partition)
        ]
        dataflow = SPTTDataflow(
            plan,
            _tables(model),
            groups=groups,
            tower_output_dims=dims,
            stats=stats,
            device=device,
            sparse_optimizer=sparse_optimizer,
            peer_permute=peer_permute,
            comm_precision=comm_precision,
        )
        weights = {
            name.removeprefix("embedding_bags.").removesuffix(".weight"): weight
            for tower in model.towers
            for name, weight in tower.embedding_bag_collection.state_dict().items()
        }
        if all(w.is_meta for w in weights.values()):
            dataflow.reset_tables(init_seed)
        elif any(w.is_meta for w in weights.values()):
            raise ValueError("either all or none of the model's tables may be on meta")
        else:
            dataflow.load_table_weights(weights)

        dense_arch = _DenseArch(model)
        # every tower's, not only this rank's: optim.tower_lr_scale acts if any tower has some
        self.has_tower_parameters = any(_has_trainable(t.tower_module) for t in model.towers)
        own = model.towers[self.tower].tower_module
        trainable = _has_trainable(own)
        tower_module: nn.Module | None = own
        if trainable:
            assert own is not None
            tower_module = _data_parallel(own, groups.tower, device, stats, "tm", "tower")
        self.towers = ShardedTowers(dataflow, tower_module, trainable=trainable)
        self.dense_arch = _data_parallel(dense_arch, groups.world, device, stats, "dense", "world")

        # The state dict speaks the plain model's names (dmt.sptt.sharded_state).
        self._plan = plan
        self._table_configs = _tables(model)
        self._device = device
        internal = list(nn.Module.state_dict(self).keys())
        self._internal_of = {
            name: key for key in internal if (name := plain_name(key, self.tower)) is not None
        }
        self._table_param_key = {
            key.split(".")[-2]: key
            for key in internal
            if key.startswith("towers.dataflow.") and key.endswith(".weight")
        }
        self.register_state_dict_post_hook(_to_plain_state_dict)
        self.register_load_state_dict_pre_hook(_from_plain_state_dict)
        self.register_load_state_dict_post_hook(_after_load)
        self._tables_loaded = False  # by the load in progress (_from_plain, _after_load)

    @property
    def dataflow(self) -> SPTTDataflow:
        """This rank's table shards and steps a-f."""
        return self.towers.dataflow

    @property
    def tower_module(self) -> nn.Module | None:
        """This rank's replica of its tower's module (DDP when trainable; ``None``: pass-through)."""
        return self.towers.tower_module

    # ---- state under the plain model's names (DCP checkpoints, dmt-eval, dmt-export) ----------

    def _table_key(self, feature: int) -> str:
        return TABLE_KEY.format(
            tower=self._plan.tower_of_feature(feature), table=self._table_configs[feature].name
        )

    def _local_shards(self, flush: bool = True) -> dict[int, tuple[int, TableShard, torch.Tensor]]:
        """``feature -> (index in plan.feature_shards, shard, weight)`` of this rank's shards,
        the UVM cache flushed into them (what checkpoints, ``dmt-eval`` and ``dmt-export`` read;
        ``flush=False`` where they are written: a flush would write the cache's rows over what
        was loaded)."""
        if flush:
            self.dataflow.flush_cache()
        local: dict[int, tuple[int, TableShard, torch.Tensor]] = {}
        for shard, param in self.dataflow.shard_parameters():
            assert shard.feature not in local, "one shard of a table per rank"
            index = self._plan.feature_shards(shard.feature).index(shard)
            local[shard.feature] = (index, shard, param.detach())
        return local

    def _sharded(
        self, feature: int, local: dict[int, torch.Tensor], cols: tuple[int, int] | None = None
    ) -> ShardedTensor:
        return sharded_table(
            self._plan,
            feature,
            local=local,
            rank=self.dataflow.rank,
            device=self._device,
            group=self._world,
            rows=self._table_configs[feature].num_embeddings,
            rowwise_cols=cols,
        )

    def sharded_tables(self) -> dict[str, ShardedTensor]:
        """Every table as a ``ShardedTensor`` under the plain model's key (no collective)."""
        local = self._local_shards()
        return {
            self._table_key(f): self._sharded(f, {local[f][0]: local[f][2]} if f in local else {})
            for f in range(len(self._table_configs))
        }

    def optimizer_state_dict(self, optimizer: torch.optim.Optimizer) -> dict[str, Any]:
        """``optimizer``'s per-parameter state under the plain model's names: the fused
        tables' state as ``ShardedTensor`` s laid out like the tables (row-wise states of a
        column-split table per column block), the dense state as it is. The tensors are the
        optimizer's own, so loading into them in place restores it."""
        local = self._local_shards()
        table_of = {f"{t.name}.weight": f for f, t in enumerate(self._table_configs)}
        out: dict[str, Any] = {}
        for key, states in optimizer.state_dict()["state"].items():
            if key not in table_of:
                name = plain_name(key, self.tower)
                assert name is not None, key
                out[name] = states
                continue
            feature = table_of[key]
            index, shard, _ = local[feature]
            single_block = len(column_blocks(self._plan.feature_shards(feature))) == 1
            entry: dict[str, ShardedTensor] = {}
            for state_name, tensor in states.items():
                name = state_name.removeprefix(f"{key}.")
                if tensor.dim() == 2:
                    entry[name] = self._sharded(feature, {index: tensor})
                else:
                    cols = (shard.col_start, shard.col_stop)
                    suffix = "" if single_block else f".cols_{cols[0]}_{cols[1]}"
                    entry[name + suffix] = self._sharded(feature, {index: tensor}, cols)
            out[self._table_key(feature)] = entry
        return out

    def _to_plain(self, state: dict[str, Any], prefix: str) -> None:
        for key in [k for k in state if k.startswith(prefix)]:
            value = state.pop(key)
            name = plain_name(key[len(prefix) :], self.tower)
            if name is not None:
                state[prefix + name] = value
        for name, table in self.sharded_tables().items():
            state[prefix + name] = table

    def _from_plain(self, state: dict[str, Any], prefix: str) -> None:
        tables = {self._table_key(f): f for f in range(len(self._table_configs))}
        # loaded tables may already hold the state (DCP writes into them): no cache written over
        # them, and the cache dropped after the load (_after_load); a load without tables keeps
        # the cache's unwritten updates, written back here
        self._tables_loaded = any(k[len(prefix) :] in tables for k in state if k.startswith(prefix))
        local = self._local_shards(flush=not self._tables_loaded)
        for key in [k for k in state if k.startswith(prefix)]:
            name = key[len(prefix) :]
            if name in tables:
                value = state.pop(key)
                feature = tables[name]
                if feature in local:
                    _, shard, _ = local[feature]
                    param_key = self._table_param_key[self._table_configs[feature].name]
                    state[prefix + param_key] = _local_piece(value, shard, key)
            elif name in self._internal_of:
                state[prefix + self._internal_of[name]] = state.pop(key)
            elif name.startswith("towers.") and ".tower_module." in name:
                state.pop(key)  # another tower's module

    @property
    def fused_optimizer(self) -> KeyedOptimizer | None:
        """The tables' in-backward optimizer on this rank (``None`` if it holds no shard)."""
        return self.dataflow.fused_optimizer

    def named_dense_parameters(self) -> list[tuple[str, nn.Parameter]]:
        """Parameters a dense optimizer updates: this rank's tower-module replica and the dense
        arch (after their gradient all-reduces). Excludes the tables."""
        fused = {id(p) for _, p in self.dataflow.shard_parameters()}
        return [
            (name, p)
            for name, p in self.named_parameters()
            if p.requires_grad and id(p) not in fused and not name.startswith("towers.dataflow.")
        ]

    def tower_outputs(self, sparse_features: KeyedJaggedTensor) -> list[torch.Tensor]:
        """Every tower's output for the local samples, ``T`` tensors ``(B, V_t, D_t)``; every
        rank must pass the same ``B``."""
        return self.towers(sparse_features).wait()

    def forward(
        self, dense_features: torch.Tensor, sparse_features: KeyedJaggedTensor
    ) -> torch.Tensor:
        """Logits ``(B,)`` of the local batch. In evaluation ranks may hold different ``B``
        (the last, partial batch of a split), and in training too unless ``even_batches``:
        smaller batches are padded with empty samples to the largest (one scalar all-reduce and
        a host sync per call), whose outputs are dropped. With ``even_batches`` (announced once,
        at construction: the trainer's sources split whole global batches evenly) training
        needs neither."""
        if self.training and self.even_batches:
            return self.dense_arch(dense_features, self.towers(sparse_features))
        size = dense_features.size(0)
        largest = torch.tensor([size], device=dense_features.device)
        dist.all_reduce(largest, op=dist.ReduceOp.MAX, group=self._world)
        padded = int(largest.item())
        if padded != size:
            dense_features, sparse_features = _pad_batch(dense_features, sparse_features, padded)
        logits = self.dense_arch(dense_features, self.towers(sparse_features))
        return logits[:size] if padded != size else logits


def _to_plain_state_dict(
    module: ShardedDMT, state: dict[str, Any], prefix: str, local_metadata: Any
) -> None:
    module._to_plain(state, prefix)


def _from_plain_state_dict(
    module: ShardedDMT, state: dict[str, Any], prefix: str, *args: Any
) -> None:
    module._from_plain(state, prefix)


def _after_load(module: nn.Module, incompatible_keys: Any) -> None:
    """Loaded tables are what lookups read: the UVM cache's rows (of the weights before) are
    dropped."""
    assert isinstance(module, ShardedDMT)
    if module._tables_loaded:
        module.dataflow.drop_cache()
        module._tables_loaded = False


def _local_piece(value: torch.Tensor, shard: TableShard, key: str) -> torch.Tensor:
    """This rank's ``shard`` of a table given whole or as a ``ShardedTensor``."""
    if isinstance(value, ShardedTensor):
        for piece in value.local_shards():
            if list(piece.metadata.shard_offsets) == [shard.row_start, shard.col_start]:
                return piece.tensor
        raise ValueError(
            f"{key}: the sharded tensor holds no local shard at rows {shard.row_start}, "
            f"columns {shard.col_start} (this rank's shard)"
        )
    return value[shard.row_start : shard.row_stop, shard.col_start : shard.col_stop]


def _pad_batch(
    dense_features: torch.Tensor, sparse_features: KeyedJaggedTensor, size: int
) -> tuple[torch.Tensor, KeyedJaggedTensor]:
    """Append ``size - B`` samples with zero dense features and empty bags."""
    B = dense_features.size(0)
    F = len(sparse_features.keys())
    lengths = sparse_features.lengths().view(F, B)
    padded_lengths = torch.cat([lengths, lengths.new_zeros(F, size - B)], dim=1).view(-1)
    padded_dense = torch.cat(
        [dense_features, dense_features.new_zeros(size - B, *dense_features.shape[1:])]
    )
    if sparse_features.weights_or_none() is not None:
        raise ValueError("weighted features are not supported")
    # empty bags add no ids: every key keeps its total (no device-to-host copy in input dist)
    return padded_dense, KeyedJaggedTensor(
        keys=sparse_features.keys(),
        values=sparse_features.values(),
        lengths=padded_lengths,
        stride=size,
        length_per_key=sparse_features.length_per_key(),
        offset_per_key=sparse_features.offset_per_key(),
    )


class DMTSharder:
    """Plans and builds the :class:`ShardedDMT` of a DMT model on a topology.

    Args:
        topology: hosts, towers and peers; ``topology.num_towers`` must equal the model's.
        sharding_type: how tables are sharded inside their tower: one of ``"table_wise"``,
            ``"column_wise"``, ``"row_wise"`` for all, or ``{feature: kind}`` (others table-wise).
        sparse_optimizer: ``(class, kwargs)`` of the fused table optimizer, or ``None``.
        init_seed: seed for tables built on ``meta``.
        peer_permute: where step c permutes: ``"output"`` (pooled output, the paper's Figure 7),
            ``"input"`` (sparse input, before the lookup), ``"auto"`` (fewer bytes, per batch)
            or ``"skip"`` (step a delivers peer order; the default); see
            :mod:`dmt.sptt.peer_permute`.
        comm_precision: dtype of the pooled embeddings and their gradients on the wire in
            steps d and f: ``"fp32"``, ``"bf16"`` or ``"fp16"`` (``sptt.comm_precision``).
        memory: every rank's budget for its shards plus the sparse optimizer's state
            (``sharding.*``); ``None`` leaves memory unchecked. On CUDA, shards of a rank short
            of HBM are UVM-cached (:func:`dmt.memory.choose_kernels`).

    Example::

        sharder = DMTSharder(Topology(8, 2), sparse_optimizer=(RowWiseAdagrad, {"lr": 0.1}))
        plan = sharder.plan(model)              # validates; no collective
        groups = create_process_groups(plan.topology)
        sharded = sharder.shard(model, groups)  # ShardedDMT
    """

    def __init__(
        self,
        topology: Topology,
        *,
        sharding_type: str | Mapping[str, str] = "table_wise",
        sparse_optimizer: SparseOptimizer | None = None,
        init_seed: int = 0,
        peer_permute: str = DEFAULT_PEER_PERMUTE,
        comm_precision: str = "fp32",
        even_batches: bool = False,
        memory: MemoryBudget | None = None,
    ) -> None:
        if isinstance(sharding_type, str) and sharding_type not in SHARDING_KINDS:
            raise ValueError(
                f"sptt sharding_type={sharding_type!r} is not one of {list(SHARDING_KINDS)}"
            )
        self.topology = topology
        self.sharding_type = sharding_type
        self.sparse_optimizer = sparse_optimizer
        self.init_seed = init_seed
        self.peer_permute = check_peer_permute(peer_permute, "sptt.peer_permute")
        comm_dtype_of(comm_precision)  # validates before any collective
        self.comm_precision = comm_precision
        self.even_batches = even_batches
        self.memory = memory

    def plan(self, model: DMTModel, *, dense_on_meta: bool = False) -> SPTTPlan:
        """Validate ``model`` and place its tables (pure; the same on every rank).
        ``dense_on_meta``: the dense modules may be on meta too (planning only, ``dmt-plan``)."""
        check_dmt_model(model, self.topology, dense_on_meta=dense_on_meta)
        tables = _tables(model)
        names = list(model.feature_names)
        kinds = (
            dict.fromkeys(names, self.sharding_type)
            if isinstance(self.sharding_type, str)
            else dict(self.sharding_type)
        )
        kinds = {f: k for f, k in kinds.items() if k != "table_wise"}
        if (
            self.sparse_optimizer is not None
            and self.sparse_optimizer[0] is RowWiseAdagrad
            and "column_wise" in kinds.values()
        ):
            warnings.warn(
                "row-wise Adagrad on column-wise shards keeps one accumulator per row and "
                "shard, not per row of the whole table (as in TorchRec); training differs "
                "slightly from the unsharded model",
                stacklevel=2,
            )
        index = {f: i for i, f in enumerate(names)}
        N = tables[0].embedding_dim
        fused = self.sparse_optimizer is not None
        if fused and N % 4:
            raise ValueError(
                f"embedding_dim N={N} must be a multiple of 4 for FBGEMM's fused embedding "
                "kernels (the sparse optimizer runs in them)"
            )
        return build_plan(
            self.topology,
            names,
            [[index[f] for f in p] for p in model.partition],
            embedding_dim=N,
            num_embeddings=[t.num_embeddings for t in tables],
            sharding_types=kinds,
            costs=[float(t.num_embeddings * N) for t in tables],
            column_multiple=4 if fused else 1,
            sparse_optimizer=(
                sparse_optimizer_name(self.sparse_optimizer[0]) if self.sparse_optimizer else None
            ),
            memory=self.memory,
        )

    def shard(
        self,
        model: DMTModel,
        groups: SPTTProcessGroups,
        *,
        plan: SPTTPlan | None = None,
        device: torch.device | None = None,
        stats: CommStats | None = None,
    ) -> ShardedDMT:
        """Build this rank's :class:`ShardedDMT` (collective over the groups' ranks)."""
        if groups.topology != self.topology:
            raise ValueError(f"groups were built for {groups.topology}, not {self.topology}")
        return ShardedDMT(
            model,
            plan if plan is not None else self.plan(model),
            groups=groups,
            sparse_optimizer=self.sparse_optimizer,
            device=device,
            stats=stats,
            init_seed=self.init_seed,
            peer_permute=self.peer_permute,
            comm_precision=self.comm_precision,
            even_batches=self.even_batches,
        )


# ---- the trainer's entry point -------------------------------------------------------------


def _is_dmt_model(module: Any) -> TypeGuard[DMTModel]:
    """Whether ``module`` has what SPTT reads of a DMT model (duck-typed, as documented above)."""
    return isinstance(module, nn.Module) and all(hasattr(module, a) for a in _DMT_ATTRIBUTES)


def build_sptt_optimizer(module: ShardedDMT, cfg: OptimConfig) -> CombinedOptimizer:
    """The fused table optimizer plus ``cfg.dense`` over the tower-module replica and dense arch.

    Mirrors ``dmt.optim.build_optimizer``: ``zero_grad`` pushes the fused optimizer's LR (from
    its ``param_groups``) into the kernels.
    """
    dense = dict(module.named_dense_parameters())
    optimizers: list[KeyedOptimizer] = [
        keyed_dense_optimizer(dense, cfg, model_has_tower_parameters=module.has_tower_parameters)
    ]
    fused = module.fused_optimizer
    return CombinedOptimizer([fused, *optimizers] if fused is not None else optimizers)


def shard_dmt(
    task_or_model: nn.Module,
    runtime: Runtime,
    *,
    topology: Topology,
    optim_cfg: OptimConfig,
    groups: SPTTProcessGroups | None = None,
    sharding_type: str | Mapping[str, str] = "table_wise",
    stats: CommStats | None = None,
    init_seed: int = 0,
    timeout: timedelta = DEFAULT_TIMEOUT,
    peer_permute: str = DEFAULT_PEER_PERMUTE,
    comm_precision: str = "fp32",
    even_batches: bool = False,
    memory: MemoryBudget | None = None,
) -> tuple[nn.Module, CombinedOptimizer]:
    """Shard a DMT model (or the DMT model inside a task module) with SPTT and build its
    optimizer.

    Everything that can be wrong with the model, the topology or the optimizer is checked
    before the first collective, identically on every rank.

    Args:
        task_or_model: a DMT model, or a module whose ``model`` attribute is one (the trainer's
            ``TrainTask``); the latter's ``model`` is replaced by the :class:`ShardedDMT`.
        runtime: this process's rank, world and device.
        topology: ``Topology(G, L, K)``; ``G`` must be ``runtime.world_size``.
        optim_cfg: ``optim.sparse`` for the fused tables, ``optim.dense`` for the tower
            modules and dense arch.
        groups: SPTT process groups of ``topology``; ``None`` creates them (collective).
        sharding_type: see :class:`DMTSharder`.
        stats: optional :class:`CommStats` to count bytes.
        init_seed: seed for tables built on ``meta``.
        timeout: timeout of the process groups created here.
        peer_permute: where step c permutes (``sptt.peer_permute``); see :class:`DMTSharder`.
        comm_precision: steps d and f on the wire (``sptt.comm_precision``); see
            :class:`DMTSharder`.
        even_batches: see :class:`ShardedDMT`.
        memory: every rank's budget for tables plus optimizer state (``sharding.*``); see
            :class:`DMTSharder`.

    Returns:
        ``(module, optimizer)``: ``task_or_model`` with its DMT model sharded (or the
        :class:`ShardedDMT`), and a ``CombinedOptimizer`` (fused tables + dense).
    """
    inner = getattr(task_or_model, "model", None)
    task: nn.Module | None
    if _is_dmt_model(task_or_model):
        model, task = task_or_model, None
    elif _is_dmt_model(inner):
        model, task = inner, task_or_model
    else:
        raise TypeError(
            f"shard_dmt needs a DMT model or a module with one in .model, got "
            f"{type(task_or_model).__name__}"
        )
    if topology.world_size != runtime.world_size:
        raise ValueError(
            f"the SPTT topology has G={topology.world_size} ranks, the job has {runtime.world_size}"
        )
    check_sparse_optimizer(optim_cfg, runtime.device.type)
    sharder = DMTSharder(
        topology,
        sharding_type=sharding_type,
        sparse_optimizer=sparse_optimizer_spec(optim_cfg),
        init_seed=init_seed,
        peer_permute=peer_permute,
        comm_precision=comm_precision,
        even_batches=even_batches,
        memory=memory,
    )
    plan = sharder.plan(model)
    if groups is None:
        groups = create_process_groups(topology, timeout=timeout)
    sharded = sharder.shard(model, groups, plan=plan, device=runtime.device, stats=stats)
    optimizer = build_sptt_optimizer(sharded, optim_cfg)
    if task is None:
        return sharded, optimizer
    task.model = sharded
    return task, optimizer


def topology_from(
    runtime: Runtime, *, hosts_per_tower: int = 1, local_world_size: int | None = None
) -> Topology:
    """The SPTT topology of a job: ``L`` from ``local_world_size`` or torchrun's
    ``LOCAL_WORLD_SIZE`` (``runtime.local_world_size``), ``K = hosts_per_tower``.

    Raises ``ValueError`` (no collective) when ``G`` is not a multiple of ``K L``.
    """
    return Topology(
        world_size=runtime.world_size,
        local_world_size=local_world_size or runtime.local_world_size,
        hosts_per_tower=hosts_per_tower,
    )
