"""Model accounting: parameter count and training FLOPs per sample, on the meta device.

Training FLOPs count the dense part (everything after the embedding lookup: bottom MLP,
interaction, tower modules, top MLP), forward plus backward, as PyTorch's FLOP counter sees them.
The dense input needs no gradient, so the first bottom layer's backward computes only its weight
gradient; embeddings do need one. Embedding pooling (additions) is not counted, as in the paper's
profiler numbers.

DMT models also report their towers' output sizes ``O_t = V_t D`` and the compression ratio of
the embeddings that cross hosts, ``CR = |F| N / sum_t O_t`` (paper Table 5: ``D = 64, 32, 16, 8``
on 8 DLRM towers with ``c=1, p=0`` give 2, 4, 8, 16; pass-through towers give 1). The paper's §4
writes the inverse fraction; Table 5 reports this one.
"""

from __future__ import annotations

from collections.abc import Callable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from functools import partial
from typing import Any

import torch
from torch import nn
from torch.utils.flop_counter import FlopCounterMode

from dmt.models.dmt import DMTModel
from dmt.models.factory import embedding_parameters
from dmt.models.interaction import DotInteraction
from dmt.models.rec_model import RecModel
from dmt.models.tower_modules import TowerModule


@dataclass(frozen=True)
class ModelStats:
    """What ``dmt-inspect`` reports (the tower fields stay ``None`` for base models)."""

    num_parameters: int
    num_embedding_parameters: int
    num_dense_parameters: int
    train_mflops_per_sample: float
    forward_mflops_per_sample: float
    num_towers: int | None = None  # DMT models only
    tower_output_sizes: list[int] | None = None  # DMT: O_t of every tower
    compression_ratio: float | None = None  # DMT: |F| N / sum_t O_t


def count_parameters(model: nn.Module) -> tuple[int, int]:
    """``(embedding parameters, other parameters)``; works on meta tensors.

    Embedding parameters are those of the model's tables, by module type, whatever their names:
    :func:`~dmt.models.factory.embedding_parameters`, what the sparse optimizer trains (a user
    module's own ``nn.Embedding`` is trained and replicated as the dense part is, and counted
    with it)."""
    tables = {id(p) for p in embedding_parameters(model)}
    emb = dense = 0
    for p in model.parameters():
        if id(p) in tables:
            emb += p.numel()
        else:
            dense += p.numel()
    return emb, dense


def dense_flops(model: RecModel | DMTModel, batch_size: int = 4) -> tuple[float, float]:
    """``(forward FLOPs, forward + backward FLOPs)`` per sample of ``model.dense_forward``
    (for DMT models: tower modules, global interaction and MLPs).

    ``model``'s dense part may live on the meta device; inputs are made where it lives. The
    backward is counted in the paper's convention, autograd's: two products for each product of
    the forward, the dot interaction's too (:class:`~dmt.models.interaction.DotInteraction`
    computes its backward in one, so it trains with fewer FLOPs than counted).
    """
    dense, pooled = dense_inputs(model, batch_size)
    return _counted(lambda: model.dense_forward(dense, pooled), model, batch_size)


def dense_inputs(
    model: RecModel | DMTModel, batch_size: int = 4
) -> tuple[torch.Tensor, torch.Tensor]:
    """Zero inputs of ``model.dense_forward`` (dense features; pooled embeddings, which need a
    gradient), made where its dense part lives: the tables may sit on meta while the rest is
    real."""
    first = model.bottom[0]  # a dense layer
    assert isinstance(first, nn.Linear)
    device = first.weight.device
    dense = torch.zeros(batch_size, first.in_features, device=device)
    pooled = torch.zeros(
        batch_size, model.num_features, model.embedding_dim, device=device, requires_grad=True
    )
    return dense, pooled


def tower_inputs(module: TowerModule, batch_size: int = 4) -> torch.Tensor:
    """A zero batch of tower embeddings for tower module ``module`` (needing a gradient), where
    its parameters live (on the CPU for a pass-through module, which has none)."""
    param = next(module.parameters(), None)
    device = param.device if param is not None else torch.device("cpu")
    return torch.zeros(
        batch_size, module.num_features, module.embedding_dim, device=device, requires_grad=True
    )


def bottom_flops(model: RecModel | DMTModel, batch_size: int = 4) -> tuple[float, float]:
    """``(forward FLOPs, forward + backward FLOPs)`` per sample of ``model.bottom``, the bottom
    MLP, counted as :func:`dense_flops` counts them (a part of them): its input, the dense
    features, needs no gradient, so its first layer's backward computes the weight gradient
    alone. ``model``'s bottom MLP may live on the meta device."""
    first = model.bottom[0]
    assert isinstance(first, nn.Linear)
    dense = torch.zeros(batch_size, first.in_features, device=first.weight.device)
    return _counted(lambda: model.bottom(dense), model.bottom, batch_size)


def _counted(
    forward: Callable[[], torch.Tensor], module: nn.Module, batch_size: int
) -> tuple[float, float]:
    """``(forward FLOPs, forward + backward FLOPs)`` per sample of ``forward()`` (a batch of
    ``batch_size``), ``module``'s dot interactions' backward counted as autograd's."""
    fwd = FlopCounterMode(display=False)
    with fwd:
        forward()
    total = FlopCounterMode(display=False)
    with _autograd_backward(module), total:
        forward().sum().backward()
    return fwd.get_total_flops() / batch_size, total.get_total_flops() / batch_size


@contextmanager
def _autograd_backward(module: nn.Module) -> Iterator[None]:
    """``module``'s dot interactions backward as autograd computes it (the counted convention),
    not in their one fused product."""
    fused = [m for m in module.modules() if isinstance(m, DotInteraction) and m.fused_backward]
    try:
        for m in fused:
            m.fused_backward = False
        yield
    finally:
        for m in fused:
            m.fused_backward = True


def tower_train_flops(model: DMTModel, batch_size: int = 4) -> list[float]:
    """Forward + backward FLOPs of each tower module per sample of its tower's batch, counted
    as :func:`dense_flops` counts them (their sum is the towers' part of its training FLOPs).
    Works on meta modules; a pass-through tower has none."""
    return [train for _, train in tower_flops(model, batch_size)]


def tower_flops(model: DMTModel, batch_size: int = 4) -> list[tuple[float, float]]:
    """``(forward FLOPs, forward + backward FLOPs)`` of each tower module per sample of its
    tower's batch (:func:`tower_train_flops`, with the forward alone beside it)."""
    out = []
    for tower in model.towers:
        module = tower.tower_module  # a pass-through one has no FLOPs anywhere
        out.append(_counted(partial(module, tower_inputs(module, batch_size)), module, batch_size))
    return out


def tower_output_sizes(model: DMTModel) -> list[int]:
    """``O_t = V_t D`` of every tower: values per sample that leave tower ``t``."""
    return [v * d for v, d in model.tower_output_dims]


def compression_ratio(model: DMTModel) -> float:
    """``|F| N / sum_t O_t``: pooled embedding values per sample over what the towers send."""
    return model.num_features * model.embedding_dim / sum(tower_output_sizes(model))


def model_stats(model: RecModel | DMTModel) -> ModelStats:
    emb, dense = count_parameters(model)
    fwd, train = dense_flops(model)
    towers: dict[str, Any] = {}
    if isinstance(model, DMTModel):
        towers = {
            "num_towers": model.num_towers,
            "tower_output_sizes": tower_output_sizes(model),
            "compression_ratio": compression_ratio(model),
        }
    return ModelStats(
        num_parameters=emb + dense,
        num_embedding_parameters=emb,
        num_dense_parameters=dense,
        train_mflops_per_sample=train / 1e6,
        forward_mflops_per_sample=fwd / 1e6,
        **towers,
    )
