"""Measure the bytes any code sends through ``torch.distributed``, per collective and group.

:class:`CommTrace` is a ``TorchDispatchMode`` that sees every c10d collective this process issues
while it is active: ``dist.*`` calls from Python, the ``ProcessGroup`` calls TorchRec and DDP's
reducer make from C++ (they dispatch the same ``c10d::*`` ops), forward and backward. For each it
records into a :class:`~dmt.sptt.comm_stats.CommStats` the bytes this rank sends to every *other*
rank of the collective's process group, with the same conventions as the SPTT dataflow's own
counts, so the two agree (``tests/distributed/test_comm_trace.py``):

* all-to-all: split ``i`` of the input goes to group rank ``i`` (equal splits when none are
  given), in the input's dtype;
* reduce-scatter: block ``i`` of the input goes to group rank ``i`` (the logical exchange,
  whatever algorithm the backend runs);
* all-gather: the input goes to every group rank;
* all-reduce: the ring model, ``2 (n - 1) / n`` of the buffer to the next group rank;
* broadcast: the root sends the tensor to every group rank;
* barriers move no payload.

Counters are keyed ``(op, "g" + group ranks, "traced")``, e.g. ``("alltoall_base_", "g0,1,2,3",
"traced")``, and :attr:`CommTrace.calls` lists every collective (op, group, dtype, bytes per group
rank); a collective of another kind is counted in :attr:`CommTrace.unaccounted`. This is
how the flat baseline's bytes are measured (``benchmarks/bench_sptt.py``): the TorchRec modules
send what they send, nothing is copied from another mode and nothing is patched. The mode adds
Python overhead to every op: trace a few steps, not timed ones.

Example::

    trace = CommTrace(CommStats(Topology(G, L), rank))
    with trace:
        loss, _ = model(batch)
        loss.backward()
    trace.stats.total().bytes_cross_host
"""

from __future__ import annotations

from collections import Counter
from dataclasses import dataclass
from typing import Any

import torch
import torch.distributed as dist
from torch.utils._python_dispatch import TorchDispatchMode

from dmt.sptt.comm_stats import CommStats
from dmt.sptt.splits import ring_allreduce_bytes

DIRECTION = "traced"


@dataclass(frozen=True)
class TracedCall:
    """One collective as this rank issued it."""

    op: str
    """c10d op, e.g. ``"alltoall_base_"``."""
    ranks: tuple[int, ...]
    """Global ranks of its process group."""
    dtype: torch.dtype
    """dtype of what this rank sent."""
    bytes_per_rank: tuple[int, ...]
    """Bytes to each group rank (this rank's own entry included)."""
    split_sizes: bool
    """An all-to-all given its split sizes (False: equal splits, e.g. TorchRec's exchange of
    the split sizes themselves)."""


class CommTrace(TorchDispatchMode):
    """Count the c10d collectives issued while active into ``stats`` (see the module doc).

    Args:
        stats: receives one ``record`` per collective; its topology gives the hosts.
    """

    def __init__(self, stats: CommStats) -> None:
        super().__init__()
        self.stats = stats
        self.calls: list[TracedCall] = []
        """Every collective counted, in issue order."""
        self.unaccounted: Counter[str] = Counter()
        """Collectives of a kind without a byte model here, by op name."""
        self._groups: dict[int, list[int]] = {}

    def __torch_dispatch__(
        self,
        func: Any,
        types: Any,
        args: tuple[Any, ...] = (),
        kwargs: dict[str, Any] | None = None,
    ) -> Any:
        kwargs = kwargs or {}
        if func.namespace == "c10d":
            named = _named_arguments(func, args, kwargs)
            group = named.get("process_group")
            if group is not None:
                self._record(func._schema.name.split("::")[-1], named, self._ranks(group))
        return func(*args, **kwargs)

    def _ranks(self, script_group: torch.ScriptObject) -> list[int]:
        group = dist.ProcessGroup.unbox(script_group)
        key = id(group)
        if key not in self._groups:
            self._groups[key] = dist.get_process_group_ranks(group)
        return self._groups[key]

    def _record(self, op: str, a: dict[str, Any], ranks: list[int]) -> None:
        n = len(ranks)
        me = ranks.index(self.stats.rank)
        tensors = _flat_tensors(a)
        split_sizes = bool(a.get("input_split_sizes"))
        sent: list[int]
        if op == "alltoall_base_":
            inp = a["input"]
            splits = list(a["input_split_sizes"]) or [inp.size(0) // n] * n
            row = _nbytes(inp) // inp.size(0) if inp.dim() and inp.size(0) else 0
            sent = [s * row for s in splits]
        elif op == "alltoall_":
            sent = [_nbytes(t) for t in a["input_tensors"]]
        elif op == "_reduce_scatter_base_":
            sent = [_nbytes(a["input_tensor"]) // n] * n
        elif op == "reduce_scatter_":
            sent = [sum(_nbytes(t) for t in ts) for ts in zip(*a["input_tensors"])]
        elif op == "reduce_scatter_tensor_coalesced_":
            sent = [sum(_nbytes(t) for t in a["inputs"]) // n] * n
        elif op == "_allgather_base_":
            sent = [_nbytes(a["input_tensor"])] * n
        elif op in ("allgather_", "allgather_coalesced_"):
            key = "input_tensors" if op == "allgather_" else "input_list"
            sent = [sum(_nbytes(t) for t in a[key])] * n
        elif op == "allgather_into_tensor_coalesced_":
            sent = [sum(_nbytes(t) for t in a["inputs"])] * n
        elif op in ("allreduce_", "allreduce_coalesced_"):
            nbytes = sum(_nbytes(t) for t in a["tensors"])
            sent = [0] * n
            sent[(me + 1) % n] = ring_allreduce_bytes(nbytes, n)
        elif op == "broadcast_":
            nbytes = sum(_nbytes(t) for t in a["tensors"])
            sent = [nbytes if ranks[a["root_rank"]] == self.stats.rank else 0] * n
        elif op in ("barrier", "monitored_barrier_"):
            sent = [0] * n
        else:
            self.unaccounted[op] += 1
            return
        group = "g" + ",".join(map(str, ranks))
        self.stats.record(op, group, ranks, sent, direction=DIRECTION)
        dtype = tensors[-1].dtype if tensors else torch.float32
        self.calls.append(TracedCall(op, tuple(ranks), dtype, tuple(sent), split_sizes))


def _named_arguments(func: Any, args: tuple[Any, ...], kwargs: dict[str, Any]) -> dict[str, Any]:
    names = [arg.name for arg in func._schema.arguments]
    return {**dict(zip(names, args)), **kwargs}


def _flat_tensors(named: dict[str, Any]) -> list[torch.Tensor]:
    """The tensors of the sent argument (``input``/``inputs``/``tensors``...), flattened."""
    for key in ("input", "input_tensor", "input_tensors", "inputs", "input_list", "tensors"):
        if key in named:
            value = named[key]
            if isinstance(value, torch.Tensor):
                return [value]
            out: list[torch.Tensor] = []
            for v in value:
                out.extend([v] if isinstance(v, torch.Tensor) else list(v))
            return out
    return []


def _nbytes(tensor: torch.Tensor) -> int:
    return tensor.numel() * tensor.element_size()
