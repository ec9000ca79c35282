"""Optimizers: fused sparse optimizers applied in backward (FBGEMM TBE) and torch dense ones,
combined into one TorchRec ``CombinedOptimizer``; plus the LR schedule."""

from __future__ import annotations

import math
import warnings
from typing import Any

import torch
from torch import nn
from torch.optim.lr_scheduler import LambdaLR
from torchrec.optim import RowWiseAdagrad
from torchrec.optim.apply_optimizer_in_backward import apply_optimizer_in_backward
from torchrec.optim.keyed import CombinedOptimizer, KeyedOptimizerWrapper
from torchrec.optim.optimizers import in_backward_optimizer_filter

from dmt.config import OptimConfig

_SPARSE = {
    "rowwise_adagrad": RowWiseAdagrad,
    "adagrad": torch.optim.Adagrad,
    "adam": torch.optim.Adam,
    "sgd": torch.optim.SGD,
}


def _sparse_kwargs(cfg: OptimConfig) -> dict[str, Any]:
    kw: dict[str, Any] = {"lr": cfg.sparse_lr}
    if cfg.sparse in ("rowwise_adagrad", "adagrad"):
        kw["eps"] = cfg.eps
    elif cfg.sparse == "adam":
        kw["eps"] = cfg.eps
        if list(cfg.betas) != [0.9, 0.999]:
            # TorchRec forwards only lr/eps-style kwargs to the fused kernel, whose betas are fixed.
            warnings.warn(
                f"optim.betas={list(cfg.betas)} applies to the dense Adam only; the fused sparse "
                "Adam uses betas (0.9, 0.999)",
                stacklevel=2,
            )
    return kw


CPU_SPARSE_OPTIMIZERS = ("rowwise_adagrad", "adagrad", "sgd")


def sparse_optimizer_name(optimizer_class: type) -> str:
    """The ``optim.sparse`` name of a fused sparse optimizer class."""
    for name, cls in _SPARSE.items():
        if cls is optimizer_class:
            return name
    raise ValueError(
        f"{optimizer_class.__name__} is not one of the fused sparse optimizers {list(_SPARSE)}"
    )


def check_sparse_optimizer(cfg: OptimConfig, device_type: str) -> None:
    """FBGEMM's CPU embedding kernels implement only some fused optimizers."""
    if device_type == "cpu" and cfg.sparse not in CPU_SPARSE_OPTIMIZERS:
        raise ValueError(
            f"optim.sparse={cfg.sparse!r} needs a CUDA device: FBGEMM's CPU embedding kernels "
            f"support {list(CPU_SPARSE_OPTIMIZERS)}"
        )


def sparse_optimizer_spec(cfg: OptimConfig) -> tuple[type, dict[str, Any]]:
    """The optimizer class and kwargs a sharder fuses into the embedding kernels."""
    return _SPARSE[cfg.sparse], _sparse_kwargs(cfg)


def apply_sparse_optimizer(embedding_params: list[nn.Parameter], cfg: OptimConfig) -> None:
    """Attach the sparse optimizer to the tables before sharding, so the sharder fuses it."""
    apply_optimizer_in_backward(_SPARSE[cfg.sparse], embedding_params, _sparse_kwargs(cfg))


def dense_optimizer(params: list[nn.Parameter], cfg: OptimConfig) -> torch.optim.Optimizer:
    if cfg.dense == "adagrad":
        return torch.optim.Adagrad(params, lr=cfg.lr, eps=cfg.eps, weight_decay=cfg.weight_decay)
    if cfg.dense == "adam":
        beta1, beta2 = cfg.betas
        return torch.optim.Adam(
            params, lr=cfg.lr, betas=(beta1, beta2), eps=cfg.eps, weight_decay=cfg.weight_decay
        )
    return torch.optim.SGD(params, lr=cfg.lr, weight_decay=cfg.weight_decay)


def build_optimizer(model: nn.Module, cfg: OptimConfig) -> CombinedOptimizer:
    """The sharded model's fused (sparse) optimizer plus a dense optimizer over the rest."""
    dense = dict(in_backward_optimizer_filter(model.named_parameters()))
    opts = [KeyedOptimizerWrapper(dense, lambda ps: dense_optimizer(list(ps), cfg))]
    fused = getattr(model, "fused_optimizer", None)
    return CombinedOptimizer([fused, *opts] if fused is not None else opts)


class LRSchedule:
    """Multiplier of the peak LR at a step: linear warmup over ``warmup_steps``, then constant,
    linear or cosine decay to ``min_lr_ratio`` over ``decay_steps`` (0: until ``total_steps``).

    Decay starts at ``max(decay_start, warmup_steps)``: the LR reaches its peak at the end of the
    warmup and only then decays."""

    def __init__(self, cfg: OptimConfig, total_steps: int) -> None:
        self.cfg = cfg
        self.total_steps = total_steps

    def __call__(self, step: int) -> float:
        c = self.cfg
        if c.warmup_steps and step < c.warmup_steps:
            return (step + 1) / c.warmup_steps
        start = max(c.decay_start, c.warmup_steps)
        if c.decay == "none" or step < start:
            return 1.0
        span = c.decay_steps or max(self.total_steps - start, 1)
        t = min((step - start) / span, 1.0)
        shape = 1.0 - t if c.decay == "linear" else 0.5 * (1.0 + math.cos(math.pi * t))
        return c.min_lr_ratio + (1.0 - c.min_lr_ratio) * shape


def build_lr_scheduler(
    optimizer: torch.optim.Optimizer, cfg: OptimConfig, total_steps: int
) -> LambdaLR:
    """``optimizer``'s LR schedule as a ``torch.optim.lr_scheduler.LambdaLR`` of
    :class:`LRSchedule`: every param group's LR is its peak (its LR now) times the factor at the
    scheduler's step. Step it after every optimizer step; the fused sparse optimizer reads its
    group's LR at the next ``zero_grad``. Its ``state_dict`` goes into checkpoints."""
    factor = LRSchedule(cfg, total_steps)
    # a plain function: LambdaLR keeps no state of it (the schedule is the config's)
    return LambdaLR(optimizer, lambda step: factor(step))


def restore_lr_scheduler(scheduler: LambdaLR, state: dict[str, Any] | None, step: int) -> None:
    """Put ``scheduler`` where a checkpoint's ``state`` (``None``: a checkpoint without one) left
    it, at ``step``; the peak LRs stay this run's (a resume may change ``optim.lr``)."""
    state = dict(state) if state else {"last_epoch": step, "_step_count": step + 1}
    if int(state["last_epoch"]) != step:
        raise ValueError(
            f"the checkpoint's LR schedule is at step {state['last_epoch']}, its training at {step}"
        )
    state["base_lrs"] = list(scheduler.base_lrs)
    state.pop("_last_lr", None)
    scheduler.load_state_dict({**scheduler.state_dict(), **state})
    factors = [f(scheduler.last_epoch) for f in scheduler.lr_lambdas]
    for group, base, factor in zip(scheduler.optimizer.param_groups, scheduler.base_lrs, factors):
        group["lr"] = base * factor


def set_lr(optimizer: torch.optim.Optimizer, peaks: list[float], factor: float) -> None:
    for group, peak in zip(optimizer.param_groups, peaks):
        group["lr"] = peak * factor
