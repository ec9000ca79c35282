"""Per-rank memory of a plan: tables, optimizer state, UVM caches, dense state, activations.

Pure arithmetic on a plan (:class:`~dmt.sptt.plan.SPTTPlan` or the flat
:class:`~dmt.planning.collectives.FlatTable` s), with the byte counts of :mod:`dmt.memory`
(fp32 tables, :func:`dmt.memory.table_bytes` / :func:`dmt.memory.optimizer_state_bytes`).

What counts against a GPU's memory (``device_bytes``):

* the rank's table shards and their fused optimizer state, except the UVM-cached ones, which live
  in host memory (``uvm_host_bytes``) and take only their cache in HBM
  (``uvm_cache_bytes``: the cache and its bookkeeping, :meth:`dmt.memory.MemoryBudget.cached_hbm_bytes`);
* the dense state: every dense parameter the rank holds (the dense arch, replicated over the world,
  and its tower module's replica under DMT) with its gradient and the dense optimizer's state,
  ``P (2 + s)`` bytes for ``P`` bytes of parameters and ``s`` state tensors of a parameter's
  shape (:func:`dense_optimizer_states`, from ``optim.dense``'s class and kwargs: SGD 0, with
  momentum 1; Adam, AdamW 2, with amsgrad 3; Adagrad 1; RMSprop 1, +1 with momentum, +1
  centered; per-parameter scalars such as Adam's ``step`` left out; ``dmt-plan`` adds 1 for
  ``trainer.ema_decay``'s average of the dense weights);
* an activations estimate, ``2 x 4 x E`` bytes: every fp32 element the step keeps for the
  backward, counted once for the activation and once for its gradient, where ``E`` is

  - the embedding elements of the step: the pooled lookup output of the rank's shards, the
    pooled embeddings the exchanges deliver and (DMT) the tower module's output
    (:func:`sptt_embedding_elements`, :func:`flat_embedding_elements`), plus
  - ``B x dense_activations_per_sample`` (the widths of the dense layers' outputs per sample,
    from the model: :func:`dense_activations_per_sample`) and, for a tower module,
    ``T B x`` its layers' widths.

  Framework workspaces (cuBLAS, NCCL buffers, the allocator's fragmentation) are not counted:
  keep a margin.
"""

from __future__ import annotations

import inspect
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any

import torch
from torch.utils._python_dispatch import TorchDispatchMode

from dmt.memory import (
    FUSED_UVM_CACHING,
    GIB,
    MemoryBudget,
    optimizer_state_bytes,
    resident_state_bytes,
)
from dmt.planning.collectives import TABLE_WISE_LIKE, FlatTable
from dmt.sptt.plan import SPTTPlan
from dmt.sptt.topology import Topology

VALUE_BYTES = 4


def _flag(kwargs: Mapping[str, Any], name: str) -> int:
    return 1 if kwargs[name] else 0


def _positive(kwargs: Mapping[str, Any], name: str) -> int:
    return 1 if kwargs[name] > 0 else 0


DENSE_OPTIMIZER_STATES: dict[type, Callable[[Mapping[str, Any]], int]] = {
    # momentum_buffer when momentum > 0
    torch.optim.SGD: lambda kw: _positive(kw, "momentum"),
    # exp_avg, exp_avg_sq (+ max_exp_avg_sq with amsgrad)
    torch.optim.Adam: lambda kw: 2 + _flag(kw, "amsgrad"),
    torch.optim.AdamW: lambda kw: 2 + _flag(kw, "amsgrad"),
    # sum
    torch.optim.Adagrad: lambda kw: 1,
    # square_avg (+ momentum_buffer when momentum > 0, + grad_avg when centered)
    torch.optim.RMSprop: lambda kw: 1 + _positive(kw, "momentum") + _flag(kw, "centered"),
}
"""Tensors of a parameter's shape each dense optimizer keeps (``torch.optim`` classes; the
function takes the optimizer's kwargs, defaults filled in)."""


def dense_optimizer_states(optimizer_class: type, kwargs: Mapping[str, Any]) -> int:
    """State tensors of a parameter's shape that ``optimizer_class`` (``optim.dense._target_``)
    built with ``kwargs`` (``optim.dense``'s other fields; the class's defaults fill in the rest)
    keeps per dense parameter (:data:`DENSE_OPTIMIZER_STATES`); scalars per parameter (Adam's
    ``step``) are left out. ``ValueError`` naming ``optim.dense._target_`` for another class."""
    name = f"{optimizer_class.__module__}.{optimizer_class.__qualname__}"
    count = DENSE_OPTIMIZER_STATES.get(optimizer_class)  # exact: a subclass may keep more
    if count is None:
        known = [f"{c.__module__}.{c.__qualname__}" for c in DENSE_OPTIMIZER_STATES]
        raise ValueError(
            f"optim.dense._target_={name}: dmt-plan counts the dense optimizer state of {known} "
            "only (an unknown optimizer's state would be guessed); plan with the one of these "
            "whose state matches yours"
        )
    defaults = {
        k: p.default
        for k, p in inspect.signature(optimizer_class).parameters.items()
        if p.default is not inspect.Parameter.empty
    }
    return count({**defaults, **kwargs})


@dataclass(frozen=True)
class RankMemory:
    """Bytes one rank needs (see the module docstring for what each holds)."""

    rank: int
    table_bytes: int
    """Table shards' weights in the rank's device memory (UVM-cached ones excluded)."""
    optimizer_state_bytes: int
    """Their fused optimizer state."""
    uvm_cache_bytes: int
    """HBM caches of the UVM-cached shards, with FBGEMM's cache bookkeeping."""
    uvm_host_bytes: int
    """Host memory of the UVM-cached shards (weights and state; not device memory)."""
    dense_bytes: int
    """Dense parameters, gradients and optimizer state."""
    activation_bytes: int
    """Activations and their gradients (estimate)."""

    @property
    def device_bytes(self) -> int:
        """Everything in device memory."""
        return (
            self.table_bytes
            + self.optimizer_state_bytes
            + self.uvm_cache_bytes
            + self.dense_bytes
            + self.activation_bytes
        )


def dense_state_bytes(param_bytes: int, optimizer_states: int) -> int:
    """Parameters, gradients and ``optimizer_states`` state tensors per parameter
    (:func:`dense_optimizer_states`) of ``param_bytes`` of dense parameters."""
    if optimizer_states < 0:
        raise ValueError(f"optimizer_states={optimizer_states} must be >= 0")
    return param_bytes * (2 + optimizer_states)


_LAYER_PRODUCTS = (torch.ops.aten.mm.default, torch.ops.aten.addmm.default)
"""The matrix products of dense layers (a ``Linear``'s, a CrossNet's, a tower module's own
weights'); the dot interaction's batched products (``bmm``) are not layers."""


class _LayerOutputs(TorchDispatchMode):
    """Counts the output elements of the :data:`_LAYER_PRODUCTS` run under it."""

    def __init__(self) -> None:
        super().__init__()
        self.elements = 0

    def __torch_dispatch__(
        self,
        func: Any,
        types: Any,
        args: tuple[Any, ...] = (),
        kwargs: dict[str, Any] | None = None,
    ) -> Any:
        out = func(*args, **(kwargs or {}))
        if func in _LAYER_PRODUCTS:
            self.elements += out.numel()
        return out


def dense_activations_per_sample(
    forward: Callable[..., object] | None, *inputs: torch.Tensor
) -> int:
    """Output widths of the dense layers ``forward(*inputs)`` runs, summed: the dense
    activations of one sample (works on meta modules).

    A layer is a matrix product with weights (``mm``/``addmm``: every ``Linear``'s output width,
    a CrossNet's low-rank products, a tower module's products with weights of its own), counted
    as it runs, so any module counts, however its layers are written. ``inputs[0]``'s first
    dimension is the batch."""
    if forward is None:
        return 0
    with _LayerOutputs() as layers:
        forward(*inputs)
    return layers.elements // inputs[0].shape[0]


def _table_split(
    shards: Sequence[tuple[int, int, str]], optimizer: str, budget: MemoryBudget | None
) -> tuple[int, int, int, int]:
    """``(table, state, cache, host)`` bytes of ``(rows, cols, kernel)`` shards."""
    table = state = cache = host = 0
    for rows, cols, kernel in shards:
        weights = VALUE_BYTES * rows * cols
        extra = optimizer_state_bytes(optimizer, rows, cols)
        if kernel == FUSED_UVM_CACHING and budget is not None:
            stays = resident_state_bytes(optimizer, rows)  # row-wise state: in HBM all the same
            host += weights + extra - stays
            cache += budget.cached_hbm_bytes(weights + extra, rows, stays)
        else:
            table += weights
            state += extra
    return table, state, cache, host


def sptt_embedding_elements(
    plan: SPTTPlan,
    rank: int,
    local_batch: int,
    tower_output_dims: Sequence[tuple[int, int]] | None = None,
) -> int:
    """Embedding elements of one SPTT step on ``rank``: the lookup output ``(G B, W_r + R_t
    N)``, what step d delivers ``(T B, F_t N)``, the tower output ``(T B, V_t D_t)`` (if not
    pass-through) and what step f delivers ``(B, sum_u V_u D_u)``."""
    topo, B = plan.topology, local_batch
    tower = topo.tower_of(rank)
    F_t = len(plan.tower_features[tower])
    dims = tower_output_dims or [(len(fs), plan.embedding_dim) for fs in plan.tower_features]
    V, D = dims[tower]
    passthrough = (V, D) == (F_t, plan.embedding_dim)
    return (
        topo.world_size * B * plan.lookup_width(rank)
        + topo.num_towers * B * F_t * plan.embedding_dim
        + (0 if passthrough else topo.num_towers * B * V * D)
        + B * sum(v * d for v, d in dims)
    )


def flat_embedding_elements(
    tables: Sequence[FlatTable], hosts: Topology, rank: int, local_batch: int
) -> int:
    """Embedding elements of one flat step on ``rank``: the lookup output of its shards for
    the ``G B`` samples they see (``(G B, W_r)`` for table/column/row-wise shards, also for
    table-row-wise ones, whose host's ranks see every rank's ids) and the pooled embeddings of
    all features the output dist delivers, ``(B, sum of dims)``."""
    G, B = hosts.world_size, local_batch
    lookup = sum(
        s.col_stop - s.col_start
        for t in tables
        if t.sharding_type != "data_parallel"
        for s in t.shards
        if s.rank == rank
    )
    dp = sum(t.embedding_dim for t in tables if t.sharding_type == "data_parallel")
    delivered = sum(t.embedding_dim for t in tables)
    return G * B * lookup + B * dp + B * delivered


def sptt_rank_memory(
    plan: SPTTPlan,
    rank: int,
    *,
    local_batch: int,
    dense_param_bytes: int,
    dense_optimizer_states: int = 0,
    dense_activations: int = 0,
    tower_param_bytes: Sequence[int] | None = None,
    tower_activations: Sequence[int] | None = None,
    tower_output_dims: Sequence[tuple[int, int]] | None = None,
) -> RankMemory:
    """Memory of ``rank`` under the SPTT plan (tables placed with ``plan.memory``'s kernels).

    Args:
        plan: the SPTT plan (with ``sparse_optimizer`` for the state bytes).
        rank: global rank.
        local_batch: ``B``.
        dense_param_bytes: bytes of the dense arch's parameters (replicated on every rank).
        dense_optimizer_states: state tensors per dense parameter (:func:`dense_optimizer_states`).
        dense_activations: dense activations per sample (:func:`dense_activations_per_sample`).
        tower_param_bytes: bytes of each tower module's parameters (its replica on this rank).
        tower_activations: activations per sample of each tower module.
        tower_output_dims: ``(V_t, D_t)`` per tower; ``None``: pass-through.
    """
    tower = plan.topology.tower_of(rank)
    shards = [(s.num_rows, s.num_cols, s.compute_kernel) for s in plan.rank_shards(rank)]
    table, state, cache, host = _table_split(shards, plan.sparse_optimizer or "sgd", plan.memory)
    params = dense_param_bytes + (tower_param_bytes[tower] if tower_param_bytes else 0)
    elements = (
        sptt_embedding_elements(plan, rank, local_batch, tower_output_dims)
        + local_batch * dense_activations
        + plan.topology.num_towers * local_batch * (tower_activations or [0] * (tower + 1))[tower]
    )
    return RankMemory(
        rank,
        table,
        state,
        cache,
        host,
        dense_state_bytes(params, dense_optimizer_states),
        2 * VALUE_BYTES * elements,
    )


def flat_rank_memory(
    tables: Sequence[FlatTable],
    hosts: Topology,
    rank: int,
    *,
    local_batch: int,
    sparse_optimizer: str,
    dense_param_bytes: int,
    dense_optimizer_states: int = 0,
    dense_activations: int = 0,
    budget: MemoryBudget | None = None,
) -> RankMemory:
    """Memory of ``rank`` under flat TorchRec sharding (``budget`` gives the UVM cache load
    factor of UVM-cached tables; data-parallel tables are replicated with a dense optimizer's
    state)."""
    shards = [
        (s.row_stop - s.row_start, s.col_stop - s.col_start, t.compute_kernel)
        for t in tables
        if t.sharding_type in (*TABLE_WISE_LIKE, "row_wise", "table_row_wise")
        for s in t.shards
        if s.rank == rank
    ]
    table, state, cache, host = _table_split(shards, sparse_optimizer, budget)
    dp = sum(
        VALUE_BYTES * t.num_embeddings * t.embedding_dim
        for t in tables
        if t.sharding_type == "data_parallel"
    )
    elements = flat_embedding_elements(tables, hosts, rank, local_batch)
    return RankMemory(
        rank,
        table,
        state,
        cache,
        host,
        dense_state_bytes(dense_param_bytes + dp, dense_optimizer_states),
        2 * VALUE_BYTES * (elements + local_batch * dense_activations),
    )


def check_fits(memory: Sequence[RankMemory], device_bytes: int, *, what: str) -> RankMemory:
    """The rank that needs the most device memory; ``ValueError`` if it exceeds
    ``device_bytes``, naming the rank, the bytes it needs (by part) and the bytes available."""
    worst = max(memory, key=lambda m: (m.device_bytes, -m.rank))
    if worst.device_bytes > device_bytes:
        raise ValueError(
            f"{what}: rank {worst.rank} needs {worst.device_bytes} bytes "
            f"({worst.device_bytes / GIB:.2f} GiB) of GPU memory, {device_bytes} bytes "
            f"({device_bytes / GIB:.2f} GiB) are available (tables {worst.table_bytes}, "
            f"optimizer state {worst.optimizer_state_bytes}, UVM caches {worst.uvm_cache_bytes}, "
            f"dense {worst.dense_bytes}, activations {worst.activation_bytes} bytes)"
        )
    return worst
