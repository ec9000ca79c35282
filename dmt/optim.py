"""Optimizers: fused sparse optimizers applied in backward (FBGEMM TBE) and torch dense ones,
combined into one TorchRec ``CombinedOptimizer``; plus the LR schedule.

Each is built from its config's ``_target_`` (``optim.sparse``, ``optim.dense``,
``optim.schedule``); this module is the edge where those configs become objects, so a new
optimizer or schedule is a config, not code:

- ``optim.dense``: ``instantiate(cfg, _partial_=True)(params)``, any ``torch.optim.Optimizer``.
- ``optim.sparse``: ``(class, kwargs)`` from ``hydra.utils.get_class(cfg._target_)`` and its other
  fields, handed to TorchRec (``apply_optimizer_in_backward``, the fused EBCs), which fuses it into
  FBGEMM's embedding kernels: the class must be one TorchRec maps to an FBGEMM ``EmbOptimType``
  (``torch.optim.SGD``/``Adagrad``/``Adam``, ``torchrec.optim.RowWiseAdagrad``, ...) and the
  kwargs are the kernel's (``lr``, ``eps``, ``weight_decay``, ``beta1``/``beta2``, ...).
- ``optim.schedule``: ``instantiate(cfg, optimizer=..., total_steps=...)``, a factory returning a
  ``torch.optim.lr_scheduler.LRScheduler`` whose LRs are a function of its step count.
"""

from __future__ import annotations

import difflib
import inspect
import logging
import math
import warnings
from collections.abc import Collection
from dataclasses import dataclass
from typing import Any

import torch
from fbgemm_gpu.split_embedding_configs import EmbOptimType
from fbgemm_gpu.split_table_batched_embeddings_ops_training import (
    SplitTableBatchedEmbeddingBagsCodegen,
    WeightDecayMode,
)
from hydra.errors import InstantiationException
from hydra.utils import get_class, instantiate
from omegaconf import DictConfig, OmegaConf
from torch import nn
from torch.optim.lr_scheduler import LambdaLR, LRScheduler
from torchrec.distributed.utils import optimizer_type_to_emb_opt_type
from torchrec.optim.apply_optimizer_in_backward import apply_optimizer_in_backward
from torchrec.optim.keyed import CombinedOptimizer, KeyedOptimizerWrapper
from torchrec.optim.optimizers import in_backward_optimizer_filter
from torchrec.optim.rowwise_adagrad import RowWiseAdagrad

from dmt.config import LR_DECAYS, OptimConfig

log = logging.getLogger(__name__)

#: FBGEMM optimizer types its CPU embedding kernels implement (the rest need CUDA)
CPU_FUSED_OPTIMIZERS = (
    EmbOptimType.EXACT_SGD,
    EmbOptimType.EXACT_ADAGRAD,
    EmbOptimType.EXACT_ROWWISE_ADAGRAD,
)
# dmt.memory's names of the optimizer-state layouts it accounts for (plan.py stays torch-free)
_STATE_LAYOUT = {
    EmbOptimType.EXACT_SGD: "sgd",
    EmbOptimType.EXACT_ADAGRAD: "adagrad",
    EmbOptimType.EXACT_ROWWISE_ADAGRAD: "rowwise_adagrad",
    EmbOptimType.ADAM: "adam",
}
_HYDRA_KEYS = ("_target_", "_partial_", "_convert_", "_recursive_", "_args_")
#: ``optim.sparse.weight_decay_mode`` names: how FBGEMM's GPU kernels apply ``weight_decay``
SPARSE_WEIGHT_DECAY_MODES = {"none": WeightDecayMode.NONE, "l2": WeightDecayMode.L2,
                             "decouple": WeightDecayMode.DECOUPLE}  # fmt: skip
# arguments of FBGEMM's kernel that TorchRec or dmt set per table, or that _target_ sets
_KERNEL_SET_BY_CALLER = frozenset({
    "self", "embedding_specs", "feature_table_map", "pooling_mode", "weights_precision", "device",
    "table_names", "embedding_shard_info", "res_params", "enable_raw_embedding_streaming",
    "optimizer",
})  # fmt: skip
# fields TorchRec's sharded kernels read themselves (raw embedding streaming) before FBGEMM's
_TORCHREC_SETTINGS = frozenset({
    "res_store_shards", "res_enabled_tables", "enable_raw_embedding_streaming"
})  # fmt: skip


def sparse_kernel_settings() -> frozenset[str]:
    """The ``optim.sparse`` fields that reach FBGEMM's fused embedding kernel: the keyword
    arguments of ``SplitTableBatchedEmbeddingBagsCodegen`` that nobody else sets, ``lr`` (which
    TorchRec renames ``learning_rate``) and the raw-embedding-streaming fields TorchRec reads."""
    kernel = inspect.signature(SplitTableBatchedEmbeddingBagsCodegen.__init__).parameters
    return frozenset(kernel).difference(_KERNEL_SET_BY_CALLER) | {"lr"} | _TORCHREC_SETTINGS


def _check_sparse_kwargs(spec: dict[str, Any]) -> None:
    """Raise ``ValueError`` naming an ``optim.sparse`` field FBGEMM's kernel does not take: it
    would fail only when the model is sharded, inside FBGEMM, as an unexpected keyword."""
    known = sparse_kernel_settings()
    for key in spec:
        if key == "learning_rate":  # a kernel argument, but TorchRec sets it from lr
            raise ValueError(
                "optim.sparse.learning_rate would be replaced by optim.sparse.lr (TorchRec "
                "passes lr as FBGEMM's learning_rate): set the tables' rate with optim.sparse_lr"
            )
        if key in known:
            continue
        hint = difflib.get_close_matches(key, sorted(known), n=1)
        if key == "betas":
            hint = ["beta1 and beta2"]
        raise ValueError(
            f"optim.sparse.{key} is not a setting of FBGEMM's fused embedding kernel "
            "(SplitTableBatchedEmbeddingBagsCodegen)"
            + (f"; did you mean {hint[0]}?" if hint else ".")
            + f" It takes {sorted(known)}"
        )


def _component(cfg: OptimConfig, key: str) -> DictConfig:
    """``cfg.<key>`` with its interpolations (``${..lr}``) resolved against ``cfg``, so that a
    config built in Python (``OptimConfig(lr=...)``) reads like a composed one."""
    node = OmegaConf.structured(cfg)[key]
    setting = f"optim.{key}"
    if not isinstance(node, DictConfig) or not isinstance(node.get("_target_"), str):
        raise ValueError(f"{setting} needs a _target_ (the class or factory to build), got {node}")
    resolved = OmegaConf.create(OmegaConf.to_container(node, resolve=True))
    assert isinstance(resolved, DictConfig)
    return resolved


def _build(cfg: OptimConfig, key: str, *args: Any, **kwargs: Any) -> Any:
    """``instantiate(cfg.<key>, **kwargs)`` (called with ``args`` if partial), its errors as a
    ``ValueError`` naming the setting."""
    node = _component(cfg, key)
    try:
        built = instantiate(node, _convert_="all", **kwargs)
        return built(*args) if args else built
    except InstantiationException as e:
        cause = e.__cause__
        if isinstance(cause, ValueError | TypeError):
            raise ValueError(f"optim.{key}: {cause}") from cause
        raise ValueError(f"optim.{key}: cannot build _target_={node._target_!r}: {e}") from e
    except (ValueError, TypeError) as e:  # raised by the optimizer given the params
        raise ValueError(f"optim.{key} (_target_={node._target_}): {e}") from e


# --- sparse (fused) ----------------------------------------------------------------------------


def sparse_optimizer_spec(cfg: OptimConfig) -> tuple[type, dict[str, Any]]:
    """The optimizer class and kwargs (``optim.sparse``: ``_target_`` and its other fields) that
    TorchRec fuses into the embedding kernels."""
    node = _component(cfg, "sparse")
    try:
        cls = get_class(node._target_)
    except Exception as e:  # hydra raises ImportError/ValueError variants
        raise ValueError(f"optim.sparse: cannot import _target_={node._target_!r}: {e}") from e
    kwargs = OmegaConf.to_container(node, resolve=True)
    assert isinstance(kwargs, dict)
    spec = {str(k): v for k, v in kwargs.items() if k not in _HYDRA_KEYS}
    _check_sparse_kwargs(spec)
    mode = spec.get("weight_decay_mode")
    if isinstance(mode, str):  # FBGEMM takes its enum; a config holds its name
        if mode not in SPARSE_WEIGHT_DECAY_MODES:
            raise ValueError(
                f"optim.sparse.weight_decay_mode={mode!r} is not one of "
                f"{list(SPARSE_WEIGHT_DECAY_MODES)}"
            )
        spec["weight_decay_mode"] = SPARSE_WEIGHT_DECAY_MODES[mode]
    return cls, spec


def fused_optimizer_type(optimizer_class: type) -> EmbOptimType:
    """FBGEMM's optimizer type of a sparse optimizer class, as TorchRec fuses it."""
    try:
        fused = optimizer_type_to_emb_opt_type(optimizer_class)
    except ValueError:
        fused = None
    if fused is None:
        raise ValueError(
            f"optim.sparse._target_={optimizer_class.__module__}.{optimizer_class.__qualname__} "
            "cannot be fused into the embedding kernels: TorchRec maps only some optimizer "
            "classes to FBGEMM's (torch.optim.SGD/Adagrad/Adam, torchrec.optim.RowWiseAdagrad, "
            "torchrec.optim.SGD/Adagrad/Adam/LAMB/LarsSGD/PartialRowWiseAdam/PartialRowWiseLAMB)"
        )
    return fused


#: the classes TorchRec's FusedEmbeddingBagCollection (SPTT's lookup) fuses, by FBGEMM type;
#: it passes the kwargs to FBGEMM as they are, so the class only names the optimizer
_FUSED_EBC_CLASSES: dict[EmbOptimType, type[torch.optim.Optimizer]] = {
    EmbOptimType.EXACT_SGD: torch.optim.SGD,
    EmbOptimType.EXACT_ADAGRAD: torch.optim.Adagrad,
    EmbOptimType.EXACT_ROWWISE_ADAGRAD: RowWiseAdagrad,
    EmbOptimType.ADAM: torch.optim.Adam,
}


def fused_ebc_class(optimizer_class: type) -> type[torch.optim.Optimizer]:
    """The class of ``optimizer_class``'s FBGEMM optimizer that TorchRec's
    ``FusedEmbeddingBagCollection`` takes (it knows four classes; e.g. ``torchrec.optim.Adam``,
    which takes FBGEMM's ``beta1``/``beta2``, is ``torch.optim.Adam`` there)."""
    fused = fused_optimizer_type(optimizer_class)
    if fused not in _FUSED_EBC_CLASSES:
        raise ValueError(
            f"optim.sparse._target_={optimizer_class.__module__}.{optimizer_class.__qualname__} "
            f"(FBGEMM {fused.value}): SPTT's fused lookup (TorchRec's FusedEmbeddingBagCollection) "
            f"takes {[t.value for t in _FUSED_EBC_CLASSES]} only"
        )
    return _FUSED_EBC_CLASSES[fused]


def sparse_optimizer_name(optimizer_class: type) -> str:
    """The state layout of a fused sparse optimizer class as :mod:`dmt.memory` names it
    (``"sgd"``, ``"adagrad"``, ``"rowwise_adagrad"``, ``"adam"``)."""
    fused = fused_optimizer_type(optimizer_class)
    if fused not in _STATE_LAYOUT:
        raise ValueError(
            f"optim.sparse._target_={optimizer_class.__qualname__} (FBGEMM {fused.value}): dmt's "
            f"memory plan accounts for the state of {[t.value for t in _STATE_LAYOUT]} only"
        )
    return _STATE_LAYOUT[fused]


def check_sparse_optimizer(cfg: OptimConfig, device_type: str) -> None:
    """Raise ``ValueError`` unless ``optim.sparse`` can be fused on ``device_type``: FBGEMM's CPU
    embedding kernels implement only some optimizers, and its kernels drop some settings
    (:func:`check_sparse_weight_decay`; ``max_norm`` is applied by the CUDA row-wise Adagrad
    kernel only: ``tests/integration/test_sparse_weight_decay.py``)."""
    cls, kwargs = sparse_optimizer_spec(cfg)
    fused = fused_optimizer_type(cls)
    sparse_optimizer_name(cls)
    if device_type == "cpu" and fused not in CPU_FUSED_OPTIMIZERS:
        supported = [t.value for t in CPU_FUSED_OPTIMIZERS]
        raise ValueError(
            f"optim.sparse._target_={_component(cfg, 'sparse')._target_} (FBGEMM {fused.value}) "
            f"needs a CUDA device: FBGEMM's CPU embedding kernels support {supported} "
            "(e.g. torchrec.optim.RowWiseAdagrad, torch.optim.Adagrad, torch.optim.SGD)"
        )
    check_sparse_weight_decay(kwargs, device_type, fused)
    max_norm = kwargs.get("max_norm", 0.0) or 0.0
    if max_norm and (device_type == "cpu" or fused != EmbOptimType.EXACT_ROWWISE_ADAGRAD):
        raise ValueError(
            f"optim.sparse.max_norm={max_norm} would do nothing: FBGEMM clips the rows to "
            f"max_norm in its CUDA row-wise Adagrad kernel only, not in its {fused.value} kernel "
            f"on {device_type}; set it to 0, or train on CUDA with "
            "optim.sparse._target_=torchrec.optim.RowWiseAdagrad"
        )


def check_sparse_weight_decay(
    kwargs: dict[str, Any], device_type: str, fused: EmbOptimType
) -> None:
    """Raise ``ValueError`` on an ``optim.sparse.weight_decay`` that FBGEMM's ``fused`` kernel
    would ignore, or apply otherwise than its ``weight_decay_mode`` says.

    FBGEMM's SGD and Adagrad kernels take no weight decay, on any device (their lookups pass
    none: ``tests/unit/test_generalisation_levers.py`` reads them). Its CPU row-wise Adagrad
    leaves the update unchanged whatever the weight decay and its mode
    (``tests/integration/test_sparse_weight_decay.py`` checks it); its GPU row-wise Adagrad
    applies it in mode ``l2`` or ``decouple`` only (TorchRec passes NONE otherwise); its Adam
    (GPU only) always decouples it (``w -= lr * weight_decay * w``, AdamW's), whatever the
    mode."""
    decay = kwargs.get("weight_decay", 0.0) or 0.0
    if not decay:
        return
    if fused in (EmbOptimType.EXACT_SGD, EmbOptimType.EXACT_ADAGRAD):
        raise ValueError(
            f"optim.sparse.weight_decay={decay} would do nothing: FBGEMM's {fused.value} "
            "embedding kernel takes no weight decay, on CPU or CUDA; set it to 0 (regularise the "
            "dense part with optim.dense.weight_decay), or on CUDA use "
            "optim.sparse._target_=torchrec.optim.RowWiseAdagrad with "
            "+optim.sparse.weight_decay_mode=l2 or decouple"
        )
    if device_type == "cpu":
        raise ValueError(
            f"optim.sparse.weight_decay={decay} would do nothing: FBGEMM's CPU embedding kernels "
            "ignore weight decay; set it to 0 (regularise the dense part with "
            "optim.dense.weight_decay), or train on CUDA with +optim.sparse.weight_decay_mode=l2 "
            "or decouple"
        )
    mode = kwargs.get("weight_decay_mode", WeightDecayMode.NONE)
    if fused == EmbOptimType.ADAM:
        if mode != WeightDecayMode.DECOUPLE:
            raise ValueError(
                f"optim.sparse.weight_decay={decay} with weight_decay_mode "
                f"{WeightDecayMode(mode).name.lower()}: FBGEMM's Adam kernel applies it decoupled "
                "(w -= lr * weight_decay * w, AdamW's) whatever the mode; say so with "
                "optim.sparse._target_=torchrec.optim.Adam +optim.sparse.weight_decay_mode=decouple"
            )
        return
    if mode == WeightDecayMode.NONE:
        raise ValueError(
            f"optim.sparse.weight_decay={decay} needs +optim.sparse.weight_decay_mode=l2 or "
            "decouple (FBGEMM's kernels ignore the weight decay under mode none; the mode is a "
            "kwarg of the torchrec.optim classes, e.g. torchrec.optim.RowWiseAdagrad)"
        )


def apply_sparse_optimizer(embedding_params: list[nn.Parameter], cfg: OptimConfig) -> None:
    """Attach the sparse optimizer to the tables before sharding, so the sharder fuses it."""
    cls, kwargs = sparse_optimizer_spec(cfg)
    apply_optimizer_in_backward(cls, embedding_params, kwargs)


# --- dense -------------------------------------------------------------------------------------


#: the device types whose parameters torch's fused optimizers update (those dmt trains on)
FUSED_DEVICE_TYPES = ("cpu", "cuda")


def dense_fused_kwargs(cfg: OptimConfig, params: Collection[torch.Tensor]) -> dict[str, Any]:
    """``{"fused": True}`` where ``optim.dense_fused`` is set, ``optim.dense``'s class takes
    ``fused`` (torch's Adam, AdamW, Adagrad, SGD), ``optim.dense`` itself sets neither ``fused``
    nor ``foreach`` (the user's choice stands) and every parameter is a floating-point tensor on
    a device of :data:`FUSED_DEVICE_TYPES`; ``{}`` otherwise (the class's default).

    One kernel then updates every parameter, where torch's default on the CPU loops over them
    with several kernels each (measured on dmt's DLRM, batch 512, one thread: Adagrad's step
    1.5 ms -> 0.37 ms). The update is the same to float rounding."""
    if not cfg.dense_fused:
        return {}
    node = _component(cfg, "dense")
    if "fused" in node or "foreach" in node:
        return {}
    try:
        cls = get_class(node._target_)
    except Exception:  # hydra raises ImportError/ValueError variants; _build names the setting
        return {}
    if not isinstance(cls, type) or "fused" not in inspect.signature(cls).parameters:
        return {}
    if not all(p.device.type in FUSED_DEVICE_TYPES and p.is_floating_point() for p in params):
        return {}
    return {"fused": True}


def dense_optimizer(
    params: list[nn.Parameter], cfg: OptimConfig, scaled: Collection[nn.Parameter] = ()
) -> torch.optim.Optimizer:
    """``optim.dense`` (``_target_``: a ``torch.optim.Optimizer`` class, partial) over ``params``;
    those also in ``scaled`` form a second param group at ``optim.tower_lr_scale`` times its LR
    (one group when the scale is 1 or ``scaled`` is empty)."""
    if cfg.tower_lr_scale < 0:
        raise ValueError(f"optim.tower_lr_scale must be >= 0, got {cfg.tower_lr_scale}")
    ids = {id(p) for p in scaled}
    groups: list[Any] = params
    if cfg.tower_lr_scale != 1 and any(id(p) in ids for p in params):
        groups = [
            {"params": [p for p in params if id(p) not in ids]},
            {"params": [p for p in params if id(p) in ids], "tower_lr_scale": cfg.tower_lr_scale},
        ]
        groups = [g for g in groups if g["params"]]
    opt = _build(cfg, "dense", groups, _partial_=True, **dense_fused_kwargs(cfg, params))
    if not isinstance(opt, torch.optim.Optimizer):
        raise TypeError(f"optim.dense built a {type(opt).__name__}, not a torch.optim.Optimizer")
    for group in opt.param_groups:  # the optimizer set every group's lr from optim.dense.lr
        if "tower_lr_scale" in group:
            group["lr"] = group["lr"] * group["tower_lr_scale"]
    return opt


#: a parameter of a DMT tower module has this in its name (unsharded ``towers.<t>.tower_module.``,
#: sharded ``towers.tower_module.``, under DDP ``towers.tower_module.module.``)
TOWER_MODULE_NAME = ".tower_module."


def keyed_dense_optimizer(
    params: dict[str, nn.Parameter], cfg: OptimConfig, *, model_has_tower_parameters: bool = False
) -> KeyedOptimizerWrapper:
    """:func:`dense_optimizer` over named ``params`` as a TorchRec keyed optimizer (its state
    dict keyed by name), the tower modules' parameters (by name) at ``optim.tower_lr_scale``.

    ``model_has_tower_parameters``: some tower module of the model has trainable parameters even
    if ``params`` holds none (an SPTT rank holds its own tower's module only, which may have
    none: a one-feature tower whose square linear ``skip_square`` left out), so the setting acts
    and no warning says otherwise."""
    tower = [p for name, p in params.items() if TOWER_MODULE_NAME in f".{name}"]
    if cfg.tower_lr_scale != 1 and not tower and not model_has_tower_parameters:
        log.warning(
            "optim.tower_lr_scale=%g does nothing: the model has no tower-module parameters "
            "(a base model, pass-through towers or tower modules without parameters)",
            cfg.tower_lr_scale,
        )
    return KeyedOptimizerWrapper(params, lambda ps: dense_optimizer(list(ps), cfg, tower))


def build_optimizer(model: nn.Module, cfg: OptimConfig) -> CombinedOptimizer:
    """The sharded model's fused (sparse) optimizer plus a dense optimizer over the rest (the
    tower modules' parameters at ``optim.tower_lr_scale`` times the dense LR)."""
    dense = dict(in_backward_optimizer_filter(model.named_parameters()))
    opts = [keyed_dense_optimizer(dense, cfg)]
    fused = getattr(model, "fused_optimizer", None)
    return CombinedOptimizer([fused, *opts] if fused is not None else opts)


# --- LR schedule -------------------------------------------------------------------------------


@dataclass(frozen=True)
class LRSchedule:
    """Multiplier of the peak LR at a step: linear warmup over ``warmup_steps``, then constant
    (``decay="none"``), ``"linear"`` or ``"cosine"`` decay to ``min_lr_ratio`` over
    ``decay_steps`` (0: until ``total_steps``).

    Decay starts at ``max(decay_start, warmup_steps)``: the LR reaches its peak at the end of the
    warmup and only then decays."""

    total_steps: int
    warmup_steps: int = 0
    decay: str = "none"
    decay_start: int = 0
    decay_steps: int = 0
    min_lr_ratio: float = 0.0

    def __post_init__(self) -> None:
        if self.decay not in LR_DECAYS:
            raise ValueError(f"decay={self.decay!r} is not one of {list(LR_DECAYS)}")
        if self.warmup_steps < 0 or self.decay_start < 0 or self.decay_steps < 0:
            raise ValueError(
                f"warmup_steps={self.warmup_steps}, decay_start={self.decay_start} and "
                f"decay_steps={self.decay_steps} must be >= 0"
            )
        # a fraction is no share of the run: warmup_steps=0.1 made step 0's LR 10x the peak
        fractional = [
            f"{name}={value}"
            for name, value in (
                ("warmup_steps", self.warmup_steps),
                ("decay_start", self.decay_start),
                ("decay_steps", self.decay_steps),
            )
            if not math.isfinite(value) or value != int(value)
        ]
        if fractional:
            raise ValueError(
                f"{', '.join(fractional)}: warmup_steps, decay_start and decay_steps are counts "
                "of steps and must be whole numbers"
            )
        if not 0.0 <= self.min_lr_ratio <= 1.0:
            raise ValueError(f"min_lr_ratio={self.min_lr_ratio} must be in [0, 1]")
        unread = [
            f"{name}={value}"
            for name, value in (
                ("decay_start", self.decay_start),
                ("decay_steps", self.decay_steps),
                ("min_lr_ratio", self.min_lr_ratio),
            )
            if value
        ]
        if self.decay == "none" and unread:
            raise ValueError(
                f"{', '.join(unread)} set, but decay='none' reads none of decay_start, "
                "decay_steps and min_lr_ratio (the LR stays at its peak after the warmup): set "
                "decay=linear or decay=cosine, or leave them at 0"
            )

    def __call__(self, step: int) -> float:
        if self.warmup_steps and step < self.warmup_steps:
            return (step + 1) / self.warmup_steps
        start = max(self.decay_start, self.warmup_steps)
        if self.decay == "none" or step < start:
            return 1.0
        span = self.decay_steps or max(self.total_steps - start, 1)
        t = min((step - start) / span, 1.0)
        shape = 1.0 - t if self.decay == "linear" else 0.5 * (1.0 + math.cos(math.pi * t))
        return self.min_lr_ratio + (1.0 - self.min_lr_ratio) * shape


def warmup_decay_schedule(
    optimizer: torch.optim.Optimizer,
    total_steps: int,
    *,
    warmup_steps: int = 0,
    decay: str = "none",
    decay_start: int = 0,
    decay_steps: int = 0,
    min_lr_ratio: float = 0.0,
) -> LambdaLR:
    """:class:`LRSchedule` as a ``LambdaLR`` (``optim.schedule``'s default ``_target_``): every
    param group's LR is its peak (its LR now) times the factor at the scheduler's step."""
    factor = LRSchedule(
        total_steps, warmup_steps, decay, decay_start, decay_steps, float(min_lr_ratio)
    )
    # a plain function: LambdaLR keeps no state of it (the schedule is the config's)
    return LambdaLR(optimizer, lambda step: factor(step))


def build_lr_scheduler(
    optimizer: torch.optim.Optimizer, cfg: OptimConfig, total_steps: int
) -> LRScheduler:
    """``optimizer``'s LR schedule, ``optim.schedule`` built with the optimizer and the run's
    ``total_steps``. Step it after every optimizer step; the fused sparse optimizer reads its
    group's LR at the next ``zero_grad``. Its ``state_dict`` goes into checkpoints. A schedule
    that sets the groups' peak LRs itself (``base_lrs``) is refused unless they keep the
    proportion of the groups' own (``optim.sparse_lr``, ``optim.lr``, ``optim.tower_lr_scale``);
    a group at LR 0 (tables frozen by ``optim.sparse.lr=0``) must stay at 0."""
    peaks = [group["lr"] for group in optimizer.param_groups]  # what the schedule should scale
    scheduler = _build(cfg, "schedule", optimizer=optimizer, total_steps=total_steps)
    if not isinstance(scheduler, LRScheduler):
        raise TypeError(
            f"optim.schedule built a {type(scheduler).__name__}, not a "
            "torch.optim.lr_scheduler.LRScheduler"
        )
    for group, peak, base in zip(optimizer.param_groups, peaks, scheduler.base_lrs):
        if "tower_lr_scale" in group and not math.isclose(base, peak):
            raise ValueError(
                f"optim.schedule (_target_={_component(cfg, 'schedule')._target_}) sets the "
                f"param groups' peak LRs itself (the tower modules' group {base:g}, not "
                f"optim.tower_lr_scale={cfg.tower_lr_scale:g} times the dense LR: "
                f"{peak:g}); optim.tower_lr_scale needs a schedule that "
                "multiplies each group's own LR, such as dmt.optim.warmup_decay_schedule"
            )
    # OneCycleLR's one max_lr trained the tables at the dense LR: optim.sparse_lr went unread
    # (and tables frozen at LR 0 at max_lr: a group at 0 stays there, the others keep the
    # proportion of the first one above 0)
    scaled = [(peak, base) for peak, base in zip(peaks, scheduler.base_lrs) if peak]
    # (rel_tol: FBGEMM keeps the tables' LR in float32)
    close = [
        math.isclose(base * scaled[0][0], scaled[0][1] * peak, rel_tol=1e-6) if peak else not base
        for peak, base in zip(peaks, scheduler.base_lrs)
    ]
    if not all(close):
        tables_lr = float(_component(cfg, "sparse").get("lr", cfg.sparse_lr))
        tables = (
            f"optim.sparse_lr={cfg.sparse_lr:g}"
            if tables_lr == cfg.sparse_lr
            else f"optim.sparse.lr={tables_lr:g}"
        )
        raise ValueError(
            f"optim.schedule (_target_={_component(cfg, 'schedule')._target_}) sets the "
            f"param groups' peak LRs itself ({', '.join(f'{b:g}' for b in scheduler.base_lrs)}), "
            f"not in the proportion of theirs ({', '.join(f'{p:g}' for p in peaks)}: the "
            f"tables' {tables}, the dense optim.lr={cfg.lr:g}); use a "
            "schedule that multiplies each group's own LR, such as "
            "dmt.optim.warmup_decay_schedule, "
            + (
                "which keeps a group at LR 0 (frozen) at 0"
                if not all(peaks)
                else "or set optim.sparse_lr equal to optim.lr"
            )
            + " (how many param groups the tables have depends on the model and its sharding: "
            "one LR per group cannot be given before they are sharded)"
        )
    return scheduler


def schedule_beyond_run(cfg: OptimConfig, total_steps: int) -> list[str]:
    """What of dmt's LR schedule (``optim.schedule``, :func:`warmup_decay_schedule`) a run of
    ``total_steps`` steps never reaches, one message each: the peak LR after a warmup longer
    than the run, a decay that starts at or after its last step. Empty for another
    ``_target_``."""
    node = _component(cfg, "schedule")
    if node._target_ != f"{__name__}.{warmup_decay_schedule.__name__}":
        return []
    settings = OmegaConf.to_container(node)
    assert isinstance(settings, dict)
    s = LRSchedule(total_steps, **{str(k): v for k, v in settings.items() if k not in _HYDRA_KEYS})
    out = []
    if s.warmup_steps > total_steps:
        out.append(
            f"optim.schedule.warmup_steps={s.warmup_steps} is longer than the run "
            f"({total_steps} steps: trainer.epochs, trainer.max_steps): the LR never reaches its "
            f"peak (optim.lr, optim.sparse_lr), {s(total_steps - 1):.3g} of it at the last step"
        )
    start = max(s.decay_start, s.warmup_steps)
    if s.decay != "none" and start >= total_steps - 1:
        out.append(
            f"optim.schedule.decay={s.decay} starts at step {start} (the later of decay_start="
            f"{s.decay_start} and warmup_steps={s.warmup_steps}), but the run's last step is "
            f"{total_steps - 1} ({total_steps} steps: trainer.epochs, trainer.max_steps): the LR "
            "never decays"
        )
    return out


def check_optim(cfg: OptimConfig) -> None:
    """Build ``cfg``'s dense optimizer and LR schedule over a dummy parameter and resolve its
    sparse optimizer, so that their own checks fail before any data is read
    (:func:`dmt.config.validate`)."""
    cls, kwargs = sparse_optimizer_spec(cfg)
    sparse_optimizer_name(cls)
    try:  # the flat model builds it so (TorchRec's apply_optimizer_in_backward)
        cls([nn.Parameter(torch.zeros(1, 1))], **kwargs)
    except TypeError as e:
        raise ValueError(
            f"optim.sparse._target_={cls.__module__}.{cls.__qualname__} does not take the "
            f"settings {sorted(kwargs)}: {e}. The torchrec.optim classes take FBGEMM's settings "
            "(e.g. torchrec.optim.Adam for beta1/beta2, torchrec.optim.RowWiseAdagrad for "
            "weight_decay_mode)"
        ) from None
    except ValueError as e:  # the class's own range checks ("Invalid weight_decay value: -0.1")
        target = _component(cfg, "sparse")._target_
        raise ValueError(f"optim.sparse (_target_={target}): {e}") from None
    # combined as the trainer combines them: a schedule is built over a CombinedOptimizer
    tables_lr = float(kwargs.get("lr", cfg.sparse_lr))
    build_lr_scheduler(_combined_like_the_trainers(cfg, tables_lr, 1), cfg, total_steps=1)
    # a sharded model's tables have one group per fused kernel, as many as its sharding makes
    try:
        build_lr_scheduler(_combined_like_the_trainers(cfg, tables_lr, 2), cfg, total_steps=1)
    except ValueError as e:
        raise ValueError(
            f"optim.schedule (_target_={_component(cfg, 'schedule')._target_}) takes one value "
            "per param group, but how many param groups the tables have is known only once they "
            "are sharded (TorchRec makes one per fused embedding kernel: it depends on the "
            "model, its sharding and the world size; over two table groups and the dense one: "
            f"{e.__cause__ or e}); give one value for all groups (with optim.sparse_lr equal to "
            "optim.lr) or use a schedule that multiplies each group's own LR, such as "
            "dmt.optim.warmup_decay_schedule"
        ) from None


def _combined_like_the_trainers(
    cfg: OptimConfig, tables_lr: float, table_groups: int
) -> CombinedOptimizer:
    """A ``CombinedOptimizer`` laid out as the trainer's: ``table_groups`` groups of the tables
    (here SGDs at their LR) first, then the dense optimizer's. Its defaults hold no
    hyperparameters, as the trainer's do not."""
    tables = [
        KeyedOptimizerWrapper(
            {f"table_{i}": nn.Parameter(torch.zeros(1, 1))},
            lambda ps: torch.optim.SGD(list(ps), lr=tables_lr),
        )
        for i in range(table_groups)
    ]
    dense = KeyedOptimizerWrapper(
        {"dense": nn.Parameter(torch.zeros(1))}, lambda ps: dense_optimizer(list(ps), cfg)
    )
    return CombinedOptimizer([*tables, dense])


def restore_lr_scheduler(scheduler: LRScheduler, state: dict[str, Any] | None, step: int) -> None:
    """Put ``scheduler``, fresh from :func:`build_lr_scheduler`, at ``step``, where a checkpoint's
    ``state`` (``None``: a checkpoint without one) left it. It is stepped there from this run's
    peak LRs (a resume may change ``optim.lr``): the schedule is the config's, a function of the
    step."""
    saved = int(state["last_epoch"]) if state else step
    if saved != step:
        raise ValueError(f"the checkpoint's LR schedule is at step {saved}, its training at {step}")
    assert scheduler.last_epoch == 0, "restore a scheduler fresh from build_lr_scheduler"
    # the LRs at step 0 (loading the optimizer's state may have put the checkpoint's there)
    for group, lr in zip(scheduler.optimizer.param_groups, scheduler.get_last_lr()):
        group["lr"] = lr
    with warnings.catch_warnings():
        # "lr_scheduler.step() before optimizer.step()": a replay, no update is skipped
        warnings.simplefilter("ignore", UserWarning)
        for _ in range(step - scheduler.last_epoch):
            scheduler.step()


def set_lr(optimizer: torch.optim.Optimizer, peaks: list[float], factor: float) -> None:
    for group, peak in zip(optimizer.param_groups, peaks):
        group["lr"] = peak * factor
