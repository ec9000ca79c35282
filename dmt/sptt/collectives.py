"""Autograd-aware collectives of the SPTT dataflow; the backward is the exact adjoint.

TorchRec's pooled-embedding collectives (``PooledEmbeddingsAllToAll`` and friends) divide the
gradient by the group size in the backward when the process-wide flag
``torchrec.distributed.comm_ops.GRADIENT_DIVISION`` is on (its default), to match DDP's gradient
averaging over the world. In SPTT the groups of steps d and f are sub-groups of sizes ``K L`` and
``T``, so that division would depend on the topology and on a global. The dataflow therefore uses
these small wrappers around ``torch.distributed.all_to_all_single`` (steps d and f) and
``reduce_scatter_tensor`` (step d, row-wise shards; its backward is ``all_gather_into_tensor``):
the backward sends every gradient back where its activation came from, unscaled. The scaling to
the gradient of the global mean loss is :class:`~dmt.sptt.dmt_sharding.ShardedDMT`'s business.

Every rank of ``group`` must call a collective, and later backprop through its output, in the
same order; an input that does not require grad on one rank while it does on another would leave
the other ranks waiting, so callers make empty inputs require grad too.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence

import torch
import torch.distributed as dist

Recorder = Callable[[list[int], str], None]
"""``record(bytes_sent_to_each_group_rank, direction)``, called once per collective."""


class _AllToAllSingle(torch.autograd.Function):
    @staticmethod
    def forward(  # type: ignore[override]
        ctx: torch.autograd.function.FunctionCtx,
        input: torch.Tensor,
        output_split_sizes: list[int],
        input_split_sizes: list[int],
        group: dist.ProcessGroup,
        record: Recorder | None,
    ) -> torch.Tensor:
        ctx.output_split_sizes = output_split_sizes  # type: ignore[attr-defined]
        ctx.input_split_sizes = input_split_sizes  # type: ignore[attr-defined]
        ctx.group = group  # type: ignore[attr-defined]
        ctx.record = record  # type: ignore[attr-defined]
        return _all_to_all(input, output_split_sizes, input_split_sizes, group, record, "forward")

    @staticmethod
    def backward(  # type: ignore[override]
        ctx: torch.autograd.function.FunctionCtx, grad_output: torch.Tensor
    ) -> tuple[torch.Tensor | None, ...]:
        grad_input = _all_to_all(
            grad_output,
            ctx.input_split_sizes,  # type: ignore[attr-defined]
            ctx.output_split_sizes,  # type: ignore[attr-defined]
            ctx.group,  # type: ignore[attr-defined]
            ctx.record,  # type: ignore[attr-defined]
            "backward",
        )
        return grad_input, None, None, None, None


def _all_to_all(
    input: torch.Tensor,
    output_split_sizes: list[int],
    input_split_sizes: list[int],
    group: dist.ProcessGroup,
    record: Recorder | None,
    direction: str,
) -> torch.Tensor:
    output = input.new_empty(sum(output_split_sizes))
    dist.all_to_all_single(
        output,
        input.contiguous(),
        output_split_sizes=output_split_sizes,
        input_split_sizes=input_split_sizes,
        group=group,
    )
    if record is not None:
        record([n * input.element_size() for n in input_split_sizes], direction)
    return output


def all_to_all_single(
    input: torch.Tensor,
    *,
    output_split_sizes: Sequence[int],
    input_split_sizes: Sequence[int],
    group: dist.ProcessGroup,
    record: Recorder | None = None,
) -> torch.Tensor:
    """All-to-all of a flat tensor with uneven splits, differentiable.

    Args:
        input: 1-D tensor; its ``input_split_sizes[i]`` consecutive elements go to group rank ``i``.
        output_split_sizes: elements received from each group rank.
        input_split_sizes: elements sent to each group rank (sums to ``input.numel()``).
        group: the process group.
        record: optional callback told the bytes sent to each group rank, forward and backward.

    Returns:
        1-D tensor of ``sum(output_split_sizes)`` elements, ordered by source group rank.
    """
    if input.dim() != 1:
        raise ValueError(f"all_to_all_single expects a 1-D tensor, got shape {tuple(input.shape)}")
    if sum(input_split_sizes) != input.numel():
        raise ValueError(
            f"input_split_sizes sum to {sum(input_split_sizes)}, input has {input.numel()} elements"
        )
    out = _AllToAllSingle.apply(
        input, list(output_split_sizes), list(input_split_sizes), group, record
    )
    assert isinstance(out, torch.Tensor)
    return out


class _ReduceScatter(torch.autograd.Function):
    @staticmethod
    def forward(  # type: ignore[override]
        ctx: torch.autograd.function.FunctionCtx,
        input: torch.Tensor,
        group: dist.ProcessGroup,
        record: Recorder | None,
    ) -> torch.Tensor:
        ctx.group = group  # type: ignore[attr-defined]
        ctx.record = record  # type: ignore[attr-defined]
        size = dist.get_world_size(group)
        output = input.new_empty(input.numel() // size)
        dist.reduce_scatter_tensor(output, input.contiguous(), group=group)
        if record is not None:
            record([output.numel() * output.element_size()] * size, "forward")
        return output

    @staticmethod
    def backward(  # type: ignore[override]
        ctx: torch.autograd.function.FunctionCtx, grad_output: torch.Tensor
    ) -> tuple[torch.Tensor | None, ...]:
        group = ctx.group  # type: ignore[attr-defined]
        size = dist.get_world_size(group)
        grad_input = grad_output.new_empty(grad_output.numel() * size)
        dist.all_gather_into_tensor(grad_input, grad_output.contiguous(), group=group)
        record = ctx.record  # type: ignore[attr-defined]
        if record is not None:
            record([grad_output.numel() * grad_output.element_size()] * size, "backward")
        return grad_input, None, None


def reduce_scatter(
    input: torch.Tensor, *, group: dist.ProcessGroup, record: Recorder | None = None
) -> torch.Tensor:
    """Sum ``input`` over ``group`` and keep block ``i`` on group rank ``i``, differentiable.

    The backward is an all-gather. Bytes are recorded as the logical exchange (each rank sends
    block ``i`` to group rank ``i``), whatever algorithm the backend runs.

    Args:
        input: 1-D tensor of ``group size`` equal blocks.
        group: the process group.
        record: optional callback told the bytes sent to each group rank, forward and backward.

    Returns:
        1-D tensor, the sum over ranks of this rank's block.
    """
    size = dist.get_world_size(group)
    if input.dim() != 1 or input.numel() % size:
        raise ValueError(
            f"reduce_scatter expects a 1-D tensor of {size} equal blocks, got {tuple(input.shape)}"
        )
    out = _ReduceScatter.apply(input, group, record)
    assert isinstance(out, torch.Tensor)
    return out


# ---- asynchronous all-to-all (step f as TorchRec's output dist) -----------------------------


class AllToAllRequest:
    """One asynchronous, differentiable all-to-all: :func:`all_to_all_single_async` starts it,
    :meth:`wait` returns its output.

    The forward runs as two autograd nodes, like TorchRec's ``All2All_Pooled_Req`` /
    ``All2All_Pooled_Wait``: *start* sends the input and returns a placeholder; *wait* waits and
    returns the received tensor. Their backward runs the other way round: *wait*'s backward starts
    the gradient's all-to-all, *start*'s backward waits for it. Whatever autograd runs between the
    two (the bottom MLP's backward, say) overlaps with the communication, in the forward and in the
    backward.
    """

    def __init__(
        self,
        output_split_sizes: list[int],
        input_split_sizes: list[int],
        group: dist.ProcessGroup,
        record: Recorder | None,
    ) -> None:
        self.output_split_sizes = output_split_sizes
        self.input_split_sizes = input_split_sizes
        self.group = group
        self.record = record
        self.work: dist.Work | None = None
        self.output: torch.Tensor | None = None
        self.grad_work: dist.Work | None = None
        self.grad_input: torch.Tensor | None = None
        self._placeholder: torch.Tensor | None = None

    @property
    def in_flight(self) -> bool:
        """The forward all-to-all was started and not yet waited for."""
        return self._placeholder is not None

    @property
    def grad_in_flight(self) -> bool:
        """The backward's all-to-all was started and not yet waited for."""
        return self.grad_work is not None

    def wait(self) -> torch.Tensor:
        """The received tensor, 1-D, ordered by source group rank; call it once.

        The request keeps no reference to the tensors it returns (whose autograd nodes refer to
        the request): no reference cycle through autograd."""
        if self._placeholder is None:
            raise RuntimeError("the all-to-all was not started or was already waited for")
        placeholder, self._placeholder = self._placeholder, None
        out = _AllToAllWait.apply(placeholder, self)
        assert isinstance(out, torch.Tensor)
        return out


def _start_all_to_all(
    input: torch.Tensor,
    output_split_sizes: list[int],
    input_split_sizes: list[int],
    group: dist.ProcessGroup,
    record: Recorder | None,
    direction: str,
) -> tuple[dist.Work, torch.Tensor]:
    input = input.contiguous()
    output = input.new_empty(sum(output_split_sizes))
    work = dist.all_to_all_single(
        output,
        input,
        output_split_sizes=output_split_sizes,
        input_split_sizes=input_split_sizes,
        group=group,
        async_op=True,
    )
    assert work is not None
    if record is not None:
        record([n * input.element_size() for n in input_split_sizes], direction)
    return work, output


class _AllToAllStart(torch.autograd.Function):
    @staticmethod
    def forward(  # type: ignore[override]
        ctx: torch.autograd.function.FunctionCtx, input: torch.Tensor, request: AllToAllRequest
    ) -> torch.Tensor:
        ctx.request = request  # type: ignore[attr-defined]
        request.work, request.output = _start_all_to_all(
            input,
            request.output_split_sizes,
            request.input_split_sizes,
            request.group,
            request.record,
            "forward",
        )
        return input.new_empty(0)

    @staticmethod
    def backward(  # type: ignore[override]
        ctx: torch.autograd.function.FunctionCtx, grad_placeholder: torch.Tensor
    ) -> tuple[torch.Tensor | None, None]:
        request: AllToAllRequest = ctx.request  # type: ignore[attr-defined]
        assert request.grad_work is not None and request.grad_input is not None
        request.grad_work.wait()
        grad_input, request.grad_work, request.grad_input = request.grad_input, None, None
        return grad_input, None


class _AllToAllWait(torch.autograd.Function):
    @staticmethod
    def forward(  # type: ignore[override]
        ctx: torch.autograd.function.FunctionCtx,
        placeholder: torch.Tensor,
        request: AllToAllRequest,
    ) -> torch.Tensor:
        ctx.request = request  # type: ignore[attr-defined]
        assert request.work is not None and request.output is not None
        request.work.wait()
        output, request.work, request.output = request.output, None, None
        return output

    @staticmethod
    def backward(  # type: ignore[override]
        ctx: torch.autograd.function.FunctionCtx, grad_output: torch.Tensor
    ) -> tuple[torch.Tensor, None]:
        request: AllToAllRequest = ctx.request  # type: ignore[attr-defined]
        request.grad_work, request.grad_input = _start_all_to_all(
            grad_output,
            request.input_split_sizes,
            request.output_split_sizes,
            request.group,
            request.record,
            "backward",
        )
        return grad_output.new_empty(0), None


def all_to_all_single_async(
    input: torch.Tensor,
    *,
    output_split_sizes: Sequence[int],
    input_split_sizes: Sequence[int],
    group: dist.ProcessGroup,
    record: Recorder | None = None,
) -> AllToAllRequest:
    """Start :func:`all_to_all_single` without waiting; ``request.wait()`` gives its output.

    The same result and gradient as :func:`all_to_all_single`; the backward's all-to-all also
    runs asynchronously (see :class:`AllToAllRequest`). Every rank of ``group`` must start, wait
    and backprop its requests in the same order.
    """
    if input.dim() != 1:
        raise ValueError(f"all_to_all_single expects a 1-D tensor, got shape {tuple(input.shape)}")
    if sum(input_split_sizes) != input.numel():
        raise ValueError(
            f"input_split_sizes sum to {sum(input_split_sizes)}, input has {input.numel()} elements"
        )
    request = AllToAllRequest(list(output_split_sizes), list(input_split_sizes), group, record)
    placeholder = _AllToAllStart.apply(input, request)
    assert isinstance(placeholder, torch.Tensor)
    request._placeholder = placeholder
    return request
