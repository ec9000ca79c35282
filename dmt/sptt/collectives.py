"""Autograd-aware collectives of the SPTT dataflow; the backward is the exact adjoint.

TorchRec's pooled-embedding collectives (``PooledEmbeddingsAllToAll`` and friends) divide the
gradient by the group size in the backward when the process-wide flag
``torchrec.distributed.comm_ops.GRADIENT_DIVISION`` is on (its default), to match DDP's gradient
averaging over the world. In SPTT the groups of steps d and f are sub-groups of sizes ``K L`` and
``T``, so that division would depend on the topology and on a global. The dataflow therefore uses
these small wrappers around ``torch.distributed.all_to_all_single`` (steps d and f) and
``reduce_scatter_tensor`` (step d, row-wise shards; its backward is ``all_gather_into_tensor``):
the backward sends every gradient back where its activation came from, unscaled. The scaling to
the gradient of the global mean loss is :class:`~dmt.sptt.dmt_sharding.ShardedDMT`'s business:
``grad_scale`` of :func:`all_to_all_single` and :func:`reduce_scatter` multiplies the gradient
once the backward has crossed the wire, in place on the buffer it arrived in (no second
allocation), and :func:`scale_grad` elsewhere.

Compressed communication (``sptt.comm_precision``): with ``comm_dtype`` (``torch.bfloat16`` or
``torch.float16``) a collective rounds what it sends to ``comm_dtype`` once, moves it, and casts
what it received back to the input's dtype (``all_to_all_single(cast_back=False)`` leaves that
cast to its caller); the backward does the same to the gradient. Nothing
is summed in the low precision: the reduce-scatter then runs as an all-to-all of the
low-precision blocks followed by a local sum in the input's dtype, which sends the same bytes as
a bandwidth-optimal reduce-scatter (``(S - 1) / S`` of the input per rank) and rounds every
partial sum exactly once, whatever algorithm the backend would have used. The block a rank keeps
for itself is rounded too (also in a group of one), so the numbers do not depend on which rank
holds what. The recorded bytes are those of ``comm_dtype``. gloo (torch 2.13) and NCCL move bf16
and fp16 natively in ``all_to_all_single``, ``reduce_scatter_tensor`` and
``all_gather_into_tensor``, so no bit-cast is needed.

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

COMM_PRECISIONS: dict[str, torch.dtype] = {
    "fp32": torch.float32,
    "bf16": torch.bfloat16,
    "fp16": torch.float16,
}
"""``sptt.comm_precision`` values and the dtype the pooled-embedding collectives send."""


def comm_dtype_of(precision: str) -> torch.dtype | None:
    """The ``comm_dtype`` of a ``comm_precision`` setting: ``None`` for ``"fp32"`` (send the
    tensors as they are), ``torch.bfloat16`` / ``torch.float16`` for ``"bf16"`` / ``"fp16"``.

    Raises ``ValueError`` naming the setting for any other value.
    """
    if precision not in COMM_PRECISIONS:
        raise ValueError(
            f"sptt.comm_precision={precision!r} is not supported; "
            f"expected one of {list(COMM_PRECISIONS)}"
        )
    return None if precision == "fp32" else COMM_PRECISIONS[precision]


FP16_MAX = torch.finfo(torch.float16).max
"""The largest finite fp16 value (65504): what a larger value becomes on an fp16 wire."""


def saturate_(tensor: torch.Tensor) -> torch.Tensor:
    """``tensor``, in place: an fp16 tensor's infinities (values that overflowed in the cast to
    fp16) clamped to +-65504, as TorchRec's fp16 codec does for the flat baseline (FBGEMM's
    ``fp32_to_fp16_with_clamp``), so that both sides compare at equal precision and a large
    pooled sum or gradient arrives large rather than infinite; NaN stays NaN. Other dtypes are
    returned as they are (bf16 has fp32's range)."""
    if tensor.dtype == torch.float16:
        tensor.clamp_(-FP16_MAX, FP16_MAX)
    return tensor


def _to_wire(tensor: torch.Tensor, comm_dtype: torch.dtype | None) -> torch.Tensor:
    """``tensor`` as it goes on the wire: contiguous, in ``comm_dtype`` if given (fp16
    saturated, see :func:`saturate_`)."""
    if comm_dtype is not None and tensor.dtype != comm_dtype:
        tensor = saturate_(tensor.to(comm_dtype))
    return tensor.contiguous()


class _AllToAllSingle(torch.autograd.Function):
    @staticmethod
    def forward(
        ctx: torch.autograd.function.FunctionCtx,
        input: torch.Tensor,
        output_split_sizes: list[int],
        input_split_sizes: list[int],
        group: dist.ProcessGroup,
        record: Recorder | None,
        comm_dtype: torch.dtype | None,
        grad_scale: float,
        cast_back: bool,
    ) -> torch.Tensor:
        ctx.output_split_sizes = output_split_sizes  # type: ignore[attr-defined]
        ctx.input_split_sizes = input_split_sizes  # type: ignore[attr-defined]
        ctx.group = group  # type: ignore[attr-defined]
        ctx.record = record  # type: ignore[attr-defined]
        ctx.comm_dtype = comm_dtype  # type: ignore[attr-defined]
        ctx.grad_scale = grad_scale  # type: ignore[attr-defined]
        ctx.input_dtype = input.dtype  # type: ignore[attr-defined]
        output_dtype = input.dtype if cast_back or comm_dtype is None else comm_dtype
        return _all_to_all(
            input,
            output_split_sizes,
            input_split_sizes,
            group,
            record,
            "forward",
            comm_dtype,
            output_dtype,
        )

    @staticmethod
    def backward(
        ctx: torch.autograd.function.FunctionCtx, grad_output: torch.Tensor
    ) -> tuple[torch.Tensor | None, ...]:
        grad_input = _all_to_all(
            grad_output,
            ctx.input_split_sizes,  # type: ignore[attr-defined]
            ctx.output_split_sizes,  # type: ignore[attr-defined]
            ctx.group,  # type: ignore[attr-defined]
            ctx.record,  # type: ignore[attr-defined]
            "backward",
            ctx.comm_dtype,  # type: ignore[attr-defined]
            ctx.input_dtype,  # type: ignore[attr-defined]
        )
        _scale_in_place(grad_input, ctx.grad_scale)  # type: ignore[attr-defined]
        return grad_input, None, None, None, None, None, None, None


def _all_to_all(
    input: torch.Tensor,
    output_split_sizes: list[int],
    input_split_sizes: list[int],
    group: dist.ProcessGroup,
    record: Recorder | None,
    direction: str,
    comm_dtype: torch.dtype | None = None,
    output_dtype: torch.dtype | None = None,
) -> torch.Tensor:
    """``input`` sent in ``comm_dtype``; what arrived, cast to ``output_dtype`` (default:
    ``input``'s)."""
    wire = _to_wire(input, comm_dtype)
    output = wire.new_empty(sum(output_split_sizes))
    dist.all_to_all_single(
        output,
        wire,
        output_split_sizes=output_split_sizes,
        input_split_sizes=input_split_sizes,
        group=group,
    )
    if record is not None:
        record([n * wire.element_size() for n in input_split_sizes], direction)
    return output.to(input.dtype if output_dtype is None else output_dtype)


def _scale_in_place(received: torch.Tensor, scale: float) -> None:
    """``received *= scale``: ``received`` is a buffer the collective allocated (the values that
    came off the wire, or their cast back to the input's dtype), nobody else's."""
    if scale != 1.0:
        received.mul_(scale)


def _check_all_to_all_input(input: torch.Tensor, input_split_sizes: Sequence[int]) -> None:
    if input.dim() != 1:
        raise ValueError(f"all_to_all_single expects a 1-D tensor, got shape {tuple(input.shape)}")
    if sum(input_split_sizes) != input.numel():
        raise ValueError(
            f"input_split_sizes sum to {sum(input_split_sizes)}, input has {input.numel()} elements"
        )


def all_to_all_single(
    input: torch.Tensor,
    *,
    output_split_sizes: Sequence[int],
    input_split_sizes: Sequence[int],
    group: dist.ProcessGroup,
    record: Recorder | None = None,
    comm_dtype: torch.dtype | None = None,
    grad_scale: float = 1.0,
    cast_back: bool = True,
) -> torch.Tensor:
    """All-to-all of a flat tensor with uneven splits, differentiable.

    Args:
        input: 1-D tensor; its ``input_split_sizes[i]`` consecutive elements go to group rank ``i``.
        output_split_sizes: elements received from each group rank.
        input_split_sizes: elements sent to each group rank (sums to ``input.numel()``).
        group: the process group.
        record: optional callback told the bytes sent to each group rank, forward and backward.
        comm_dtype: dtype on the wire (``None``: ``input``'s); the input, and in the backward the
            gradient, are rounded to it once and the received values cast back to ``input``'s
            dtype.
        grad_scale: multiplies the gradient for ``input`` after it has crossed the wire (the
            wire carries it unscaled): what :func:`scale_grad` on ``input`` would do, in place.
        cast_back: ``False`` returns what came off the wire, in ``comm_dtype``, for a caller
            that casts it while it copies it anyway (SPTT's step e); the gradient of the output
            is then in ``comm_dtype`` too (the caller rounds it once, as this function would),
            and goes on the wire as it is. The same values either way.

    Returns:
        1-D tensor of ``sum(output_split_sizes)`` elements (``input``'s dtype; ``comm_dtype``
        if given and not ``cast_back``), ordered by source group rank.
    """
    _check_all_to_all_input(input, input_split_sizes)
    out = _AllToAllSingle.apply(
        input,
        list(output_split_sizes),
        list(input_split_sizes),
        group,
        record,
        comm_dtype,
        grad_scale,
        cast_back,
    )
    assert isinstance(out, torch.Tensor)
    return out


class _ReduceScatter(torch.autograd.Function):
    @staticmethod
    def forward(
        ctx: torch.autograd.function.FunctionCtx,
        input: torch.Tensor,
        group: dist.ProcessGroup,
        record: Recorder | None,
        comm_dtype: torch.dtype | None,
        grad_scale: float,
    ) -> torch.Tensor:
        ctx.group = group  # type: ignore[attr-defined]
        ctx.record = record  # type: ignore[attr-defined]
        ctx.comm_dtype = comm_dtype  # type: ignore[attr-defined]
        ctx.grad_scale = grad_scale  # type: ignore[attr-defined]
        size = dist.get_world_size(group)
        block = input.numel() // size
        wire = _to_wire(input, comm_dtype)
        if wire.dtype == input.dtype:
            output = input.new_empty(block)
            dist.reduce_scatter_tensor(output, wire, group=group)
        else:
            # the low-precision blocks travel, the sum runs in the input's dtype
            received = wire.new_empty(input.numel())
            dist.all_to_all_single(
                received,
                wire,
                output_split_sizes=[block] * size,
                input_split_sizes=[block] * size,
                group=group,
            )
            output = received.view(size, block).to(input.dtype).sum(dim=0)
        if record is not None:
            record([block * wire.element_size()] * size, "forward")
        return output

    @staticmethod
    def backward(
        ctx: torch.autograd.function.FunctionCtx, grad_output: torch.Tensor
    ) -> tuple[torch.Tensor | None, ...]:
        group = ctx.group  # type: ignore[attr-defined]
        size = dist.get_world_size(group)
        wire = _to_wire(grad_output, ctx.comm_dtype)  # type: ignore[attr-defined]
        grad_input = wire.new_empty(wire.numel() * size)
        dist.all_gather_into_tensor(grad_input, wire, group=group)
        record = ctx.record  # type: ignore[attr-defined]
        if record is not None:
            record([wire.numel() * wire.element_size()] * size, "backward")
        grad_input = grad_input.to(grad_output.dtype)
        _scale_in_place(grad_input, ctx.grad_scale)  # type: ignore[attr-defined]
        return grad_input, None, None, None, None


def reduce_scatter(
    input: torch.Tensor,
    *,
    group: dist.ProcessGroup,
    record: Recorder | None = None,
    comm_dtype: torch.dtype | None = None,
    grad_scale: float = 1.0,
) -> torch.Tensor:
    """Sum ``input`` over ``group`` and keep block ``i`` on group rank ``i``, differentiable.

    The backward is an all-gather. Bytes are recorded as the logical exchange (each rank sends
    block ``i`` to group rank ``i``), whatever algorithm the backend runs.

    Args:
        input: 1-D tensor of ``group size`` equal blocks.
        group: the process group.
        record: optional callback told the bytes sent to each group rank, forward and backward.
        comm_dtype: dtype on the wire (``None``: ``input``'s). Every rank's block is rounded to
            it once, exchanged all-to-all and summed in ``input``'s dtype; the backward rounds the
            gradient once and all-gathers it in ``comm_dtype``.
        grad_scale: multiplies the gradient for ``input`` after the all-gather, in place (as
            :func:`all_to_all_single`'s).

    Returns:
        1-D tensor (``input``'s dtype), the sum over ranks of this rank's block.
    """
    size = dist.get_world_size(group)
    if input.dim() != 1 or input.numel() % size:
        raise ValueError(
            f"reduce_scatter expects a 1-D tensor of {size} equal blocks, got {tuple(input.shape)}"
        )
    out = _ReduceScatter.apply(input, group, record, comm_dtype, grad_scale)
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
        comm_dtype: torch.dtype | None = None,
    ) -> None:
        self.output_split_sizes = output_split_sizes
        self.input_split_sizes = input_split_sizes
        self.group = group
        self.record = record
        self.comm_dtype = comm_dtype
        self.dtype: torch.dtype | None = None  # the input's, which output and gradient get back
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
    comm_dtype: torch.dtype | None,
) -> tuple[dist.Work, torch.Tensor]:
    input = _to_wire(input, comm_dtype)
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


def _used_here(received: torch.Tensor) -> torch.Tensor:
    """``received``, marked on CUDA as used by the stream that waits for it (TorchRec's
    ``comm_ops`` does the same): it was allocated on the stream that started the all-to-all, and
    a pipeline may wait on another, whose reads the caching allocator must not overtake."""
    if received.device.type == "cuda":
        received.record_stream(torch.cuda.current_stream(received.device))
    return received


class _AllToAllStart(torch.autograd.Function):
    @staticmethod
    def forward(
        ctx: torch.autograd.function.FunctionCtx, input: torch.Tensor, request: AllToAllRequest
    ) -> torch.Tensor:
        ctx.request = request  # type: ignore[attr-defined]
        request.dtype = input.dtype
        request.work, request.output = _start_all_to_all(
            input,
            request.output_split_sizes,
            request.input_split_sizes,
            request.group,
            request.record,
            "forward",
            request.comm_dtype,
        )
        return input.new_empty(0)

    @staticmethod
    def backward(
        ctx: torch.autograd.function.FunctionCtx, grad_placeholder: torch.Tensor
    ) -> tuple[torch.Tensor | None, None]:
        request: AllToAllRequest = ctx.request  # type: ignore[attr-defined]
        assert request.grad_work is not None and request.grad_input is not None
        request.grad_work.wait()
        grad_input, request.grad_work, request.grad_input = request.grad_input, None, None
        return _used_here(grad_input).to(request.dtype), None


class _AllToAllWait(torch.autograd.Function):
    @staticmethod
    def forward(
        ctx: torch.autograd.function.FunctionCtx,
        placeholder: torch.Tensor,
        request: AllToAllRequest,
    ) -> torch.Tensor:
        ctx.request = request  # type: ignore[attr-defined]
        assert request.work is not None and request.output is not None
        request.work.wait()
        output, request.work, request.output = request.output, None, None
        return _used_here(output).to(request.dtype)

    @staticmethod
    def backward(
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
            request.comm_dtype,
        )
        return grad_output.new_empty(0), None


def all_to_all_single_async(
    input: torch.Tensor,
    *,
    output_split_sizes: Sequence[int],
    input_split_sizes: Sequence[int],
    group: dist.ProcessGroup,
    record: Recorder | None = None,
    comm_dtype: torch.dtype | None = None,
) -> AllToAllRequest:
    """Start :func:`all_to_all_single` without waiting; ``request.wait()`` gives its output.

    The same result and gradient as :func:`all_to_all_single` (with the same ``comm_dtype``
    rounding); the backward's all-to-all also
    runs asynchronously (see :class:`AllToAllRequest`). Every rank of ``group`` must start, wait
    and backprop its requests in the same order.
    """
    _check_all_to_all_input(input, input_split_sizes)
    request = AllToAllRequest(
        list(output_split_sizes), list(input_split_sizes), group, record, comm_dtype
    )
    placeholder = _AllToAllStart.apply(input, request)
    assert isinstance(placeholder, torch.Tensor)
    request._placeholder = placeholder
    return request


# ---- gradient scaling -----------------------------------------------------------------------


class _ScaleGrad(torch.autograd.Function):
    """Identity forward; multiplies the gradient by ``scale`` in the backward."""

    @staticmethod
    def forward(
        ctx: torch.autograd.function.FunctionCtx, input: torch.Tensor, scale: float
    ) -> torch.Tensor:
        ctx.scale = scale  # type: ignore[attr-defined]
        return input.view_as(input)

    @staticmethod
    def backward(
        ctx: torch.autograd.function.FunctionCtx, grad: torch.Tensor
    ) -> tuple[torch.Tensor, None]:
        return grad * ctx.scale, None  # type: ignore[attr-defined]


def scale_grad(input: torch.Tensor, scale: float) -> torch.Tensor:
    """``input`` unchanged; its gradient multiplied by ``scale``."""
    if scale == 1.0:
        return input
    out = _ScaleGrad.apply(input, scale)
    assert isinstance(out, torch.Tensor)
    return out
