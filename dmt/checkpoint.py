"""Checkpoints on ``torch.distributed.checkpoint`` (DCP): save at one world size, resume at another.

Layout of ``<root>/step_<N>/``:

* DCP's files (``__<r>_0.distcp`` per rank and ``.metadata``): ``model`` (the sharded module's
  state dict: TorchRec ``ShardedTensor`` tables for flat runs, :mod:`dmt.sptt.sharded_state` for
  SPTT runs, under the plain model's names either way), ``optim`` (the per-parameter optimizer
  state, fused sparse state included, laid out like the tables), ``rng.rank_<r>`` (each
  rank's random state) and, with ``trainer.ema_decay``, ``ema`` (the moving average of the dense
  weights, under the keys of the weights it averages);
* ``config.yaml``: the resolved training config;
* ``meta.json``, written last (after every other file is fsynced, atomically, then the directory
  fsynced): step, data position, world size, working directory, the EMA's update count
  (``ema_updates``, with an ``ema``), the fused sparse optimizer's step count
  (``fused_optimizer_step``: FBGEMM keeps Adam's bias-correction step outside every state
  dict), what identifies the training rows (``train_data``: for Criteo, the preprocessed
  directory's settings, rows and sampled input fingerprints, no paths), the LR scheduler's
  state (``lr_scheduler``), the saving attempt's training figures so
  far (``training``: ``train_samples_per_s``, ``train_loss_last``) and the size of every
  file. A ``step_N`` without it is incomplete; one whose files do not match it is damaged. Both are
  skipped, with a warning naming the file, when the newest checkpoint is looked for.

Resuming at another world size works because DCP reshards every ``ShardedTensor`` by its global
offsets and every world size sees the same global batches (the data position is a step count).
:func:`load_model_state` reads the whole, unsharded model state in one process without a process
group (``dmt-eval``, ``dmt-partition --checkpoint``, ``dmt-export``).
"""

from __future__ import annotations

import contextlib
import copy
import json
import logging
import math
import os
import random
import re
import shutil
import socket
import time
import warnings
from collections.abc import Callable, Collection, Iterable, Iterator, Mapping
from concurrent.futures import Future
from dataclasses import dataclass
from datetime import timedelta
from pathlib import Path
from typing import Any

import numpy as np
import torch
import torch.distributed as dist
import torch.distributed.checkpoint as dcp
import yaml
from fbgemm_gpu.split_embedding_configs import EmbOptimType as OptimType
from fbgemm_gpu.split_table_batched_embeddings_ops_training import (
    SplitTableBatchedEmbeddingBagsCodegen,
)
from torch import nn
from torch.distributed._shard.sharded_tensor import ShardedTensor
from torch.distributed.checkpoint.api import CheckpointException
from torch.distributed.checkpoint.metadata import TensorStorageMetadata
from torch.distributed.checkpoint.staging import AsyncStager

from dmt.config import NO_DEFAULT, OptimConfig, component_default, schema_default
from dmt.ema import DenseEMA
from dmt.host_memory import (
    RankMemory,
    local_tensors,
    machine_id,
    memory_bounds,
    staged_bytes,
    staging_shortfall,
)
from dmt.models.partition import describe_towers_change
from dmt.optim import sparse_optimizer_name, sparse_optimizer_spec
from dmt.sptt.dmt_sharding import ShardedDMT, check_num_towers
from dmt.sptt.plan import column_split
from dmt.sptt.sharded_state import plain_name
from dmt.sptt.topology import Topology

log = logging.getLogger(__name__)

_STEP_DIR = re.compile(r"^step_(\d+)$")
META_FILE = "meta.json"
CONFIG_FILE = "config.yaml"
#: in ``meta.json``: what identifies the rows the run trained on (:func:`check_data_fingerprint`)
DATA_KEY = "train_data"
#: in ``meta.json``: the saving attempt's ``train_samples_per_s`` and ``train_loss_last`` so far
#: (``null``: none), which an attempt that resumes the checkpoint and trains nothing reports
TRAINING_KEY = "training"
FORMAT = "dcp-1"
#: torch's deprecation of ``ShardedTensor`` (TorchRec's sharded tables), warned by DCP's reads
SHARDED_TENSOR_DEPRECATED = "Please use DTensor instead and we are deprecating ShardedTensor"
#: what ``dcp.load`` warns of in a single process, whether or not the caller said ``no_dist``
_NO_DIST_ASSUMED = "torch.distributed is disabled, unavailable or uninitialized"

# Config keys a resume may change freely: how the job runs, not what it computes. ``optim.*``,
# and the run's length when the LR schedule spans it, may change only with
# trainer.resume_allow_config_change=true; everything else must match.
_FREE_KEYS = (
    "trainer.eval_every",
    "trainer.log_every",
    "trainer.checkpoint_every",
    "trainer.checkpoint",
    "trainer.checkpoint_dir",
    "trainer.checkpoint_keep",
    "trainer.checkpoint_async",
    "trainer.resume_from",
    "trainer.resume_allow_config_change",
    "trainer.progress_bar",
    "trainer.device",
    "trainer.optimize_metric",
    "trainer.eval_max_batches",
    "trainer.ema_decay",  # what evaluation reads; the trained weights are the same
    "trainer.collective_timeout_s",
    "trainer.pipeline",  # pipelined and plain loops compute the same (tests/distributed/test_pipeline.py)
    "trainer.pipeline_world_of_one",
    "trainer.reuse_host_memory",  # where freed host memory goes; the numbers are the same
    "optim.dense_fused",  # the dense optimizer's implementation; the same update, to rounding
    "sptt.local_world_size",
    "sptt.hosts_per_tower",
    "sptt.sharding_type",
    "sptt.peer_permute",
    "sptt.comm_precision",  # the wire's dtype; the state is fp32 either way
    "sptt.timeout_s",
    "data.criteo.raw_path",
    "data.criteo.preprocessed_dir",
    "data.criteo.auto_preprocess",
    "data.criteo.test_path",
    "data.eval_batch_size",  # evaluation's sums do not depend on how its rows are batched
    "data.criteo.in_memory",
    "data.criteo.prefetch_batches",
    "data.criteo.num_workers",  # preprocessing's processes
)
_FREE_PREFIXES = ("logger.", "sharding.")  # the budget: DCP reshards any placement
_RUN_LENGTH_KEYS = ("trainer.epochs", "trainer.max_steps")
_CHANGEABLE_PREFIXES = ("optim.", *_RUN_LENGTH_KEYS)


def _rng_state() -> dict[str, Any]:
    """This rank's generators: CPU torch, numpy, python, and the rank's GPU's (``cuda``, when
    CUDA is in use: dropout on a GPU draws from it)."""
    state: dict[str, Any] = {
        "torch": torch.get_rng_state(),
        "numpy": np.random.get_state(),
        "python": random.getstate(),
    }
    if torch.cuda.is_available() and torch.cuda.is_initialized():
        state["cuda"] = torch.cuda.get_rng_state()  # the current device: the rank's GPU
    return state


def _set_rng_state(state: dict[str, Any]) -> None:
    torch.set_rng_state(state["torch"])
    np.random.set_state(state["numpy"])
    random.setstate(state["python"])
    if "cuda" in state:
        torch.cuda.set_rng_state(state["cuda"])


def fused_table_modules(model: nn.Module) -> list[SplitTableBatchedEmbeddingBagsCodegen]:
    """FBGEMM's table-batched embedding modules of ``model``: the kernels that apply the fused
    sparse optimizer. TorchRec keeps them out of ``modules()``: its sharded collections (flat
    runs) hold their lookups in a plain list ``_lookups``, and its ``FusedEmbeddingBagCollection``
    (SPTT's shards) its kernels in a plain list ``_emb_modules``; both lists are searched."""
    found: list[SplitTableBatchedEmbeddingBagsCodegen] = []
    seen: set[int] = set()

    def visit(root: nn.Module) -> None:
        for module in root.modules():
            if id(module) in seen:
                continue
            seen.add(id(module))
            if isinstance(module, SplitTableBatchedEmbeddingBagsCodegen):
                found.append(module)
            for attribute in ("_lookups", "_emb_modules"):
                for inner in getattr(module, attribute, None) or ():
                    if isinstance(inner, nn.Module):
                        visit(inner)

    visit(model)
    return found


def _fused_optimizer_step(model: nn.Module) -> int | None:
    """The step count FBGEMM's fused optimizers keep (``iter``: Adam's and LAMB's bias
    correction; every forward counts, but :class:`~dmt.trainer.Trainer` keeps evaluation's out:
    :func:`fused_optimizer_step_kept`), the same in every kernel of a run; it is
    in no state dict, so a checkpoint carries it in ``meta.json``. ``None``: no kernel here."""
    steps = [int(m.iter.item()) for m in fused_table_modules(model)]
    return max(steps) if steps else None


def _restore_fused_optimizer_step(model: nn.Module, step: int) -> None:
    for module in fused_table_modules(model):
        _set_kernel_step(module, step)


def _set_kernel_step(module: SplitTableBatchedEmbeddingBagsCodegen, step: int) -> None:
    if module.optimizer != OptimType.NONE:
        module.set_optimizer_step(step)
        # the kernel counts in iter_cpu, refilled from iter at its next forward only while 0
        module.iter_cpu.fill_(0)


@contextlib.contextmanager
def fused_optimizer_step_kept(model: nn.Module) -> Iterator[None]:
    """Keep the step count of FBGEMM's fused optimizers (:func:`_fused_optimizer_step`) as it
    is while the block runs the model without training it: their Adam and LAMB count every
    forward, evaluation too (``SplitTableBatchedEmbeddingBagsCodegen.forward``, whatever
    ``training``), so each evaluated batch would move the bias correction of every later
    update, and a run's weights would depend on how often, and on how much, it evaluates. One
    host read per kernel, before and after."""
    kernels = [(m, int(m.iter.item())) for m in fused_table_modules(model)]
    try:
        yield
    finally:
        for module, step in kernels:
            if int(module.iter.item()) != step:
                _set_kernel_step(module, step)


def _sharded_dmt(model: nn.Module) -> ShardedDMT | None:
    inner = getattr(model, "model", model)
    return inner if isinstance(inner, ShardedDMT) else None


def _prefix(model: nn.Module) -> str:
    return "model." if getattr(model, "model", None) is not None else ""


def _optimizer_state(model: nn.Module, optimizer: torch.optim.Optimizer) -> dict[str, Any]:
    """Per-parameter optimizer state, keyed like the model's state dict, in the optimizer's own
    tensors (DCP loads into them in place)."""
    sharded = _sharded_dmt(model)
    if sharded is None:
        return dict(optimizer.state_dict()["state"])
    prefix = _prefix(model)
    return {prefix + k: v for k, v in sharded.optimizer_state_dict(optimizer).items()}


def checkpoint_state(
    model: nn.Module, optimizer: torch.optim.Optimizer, *, rank: int, ema: DenseEMA | None = None
) -> dict[str, Any]:
    """What this rank hands DCP to save: the model's state dict, the per-parameter optimizer
    state, the rank's RNG and the ``ema`` (if given), in the live tensors (no copy)."""
    state = {
        "model": model.state_dict(),
        "optim": _optimizer_state(model, optimizer),
        "rng": {f"rank_{rank}": _rng_state()},
    }
    if ema is not None:
        state["ema"] = _ema_state(model, ema)
    return state


def _ema_state(model: nn.Module, ema: DenseEMA) -> dict[str, torch.Tensor]:
    """The EMA's averages under the model's state-dict keys of the weights they average (as
    the dense optimizer state is keyed), in the EMA's own tensors (DCP loads into them)."""
    sharded = _sharded_dmt(model)
    if sharded is None:
        return dict(zip(ema.names, ema.averages))
    prefix = _prefix(model)
    names = [plain_name(name, sharded.tower) for name in ema.names]
    assert None not in names, ema.names
    return {f"{prefix}{name}": avg for name, avg in zip(names, ema.averages)}


def _materialize_optimizer_state(optimizer: torch.optim.Optimizer) -> None:
    # Dense optimizers create their state at the first step; a resume loads into it in place.
    parts = (
        [opt for _, opt in optimizer.optimizers]
        if hasattr(optimizer, "optimizers")
        else [optimizer]
    )
    for opt in parts:
        if not opt.state and hasattr(opt, "init_state"):
            opt.init_state()


def _clear_dense_state(optimizer: torch.optim.Optimizer, fresh: list[Any]) -> None:
    """Reset to a new optimizer's the dense state the checkpoint lacks (``fresh``, made by
    :func:`_materialize_optimizer_state`'s dummy step: Adam's at step 1). A parameter all of
    whose state is new (another optimizer) loses it: torch's optimizers make it again at their
    next step, exactly a new optimizer's whatever its initial values (NAdam's ``mu_product``,
    ASGD's ``eta``, SGD's first momentum buffer). One whose state is only partly new
    (``amsgrad`` added: the loaded moments keep their step) has the new entries zeroed in place
    (Adagrad's ``sum``: its group's ``initial_accumulator_value``).
    ``tests/unit/test_checkpoint_state.py`` trains both against new optimizers."""
    ids = {id(t) for t in fresh}
    parts = (
        [opt for _, opt in optimizer.optimizers]
        if hasattr(optimizer, "optimizers")
        else [optimizer]
    )
    for opt in parts:
        for group in opt.param_groups:
            for param in group["params"]:
                state = opt.state.get(param, {})
                new = {k for k, v in state.items() if id(v) in ids}
                if not new:
                    continue
                if all(k in new for k in state if k != "step"):
                    del opt.state[param]
                    continue
                for key in new:
                    value = state[key]
                    if isinstance(value, torch.Tensor):
                        fill = group.get("initial_accumulator_value", 0.0) if key == "sum" else 0
                        value.fill_(fill)


def _fsync(path: Path) -> None:
    fd = os.open(path, os.O_RDONLY)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)


def _barrier() -> None:
    """A barrier of the world on this rank's own GPU under NCCL (``device_ids``: without it torch
    guesses the device from earlier collectives and warns), plain on gloo."""
    if dist.get_backend() == "nccl":
        dist.barrier(device_ids=[torch.cuda.current_device()])
    else:
        dist.barrier()


def _write_atomic(path: Path, text: str) -> None:
    tmp = path.with_name(f".{path.name}.tmp")
    with open(tmp, "w") as f:
        f.write(text)
        f.flush()
        os.fsync(f.fileno())
    os.replace(tmp, path)


@torch.no_grad()
def host_copy(state: Any) -> Any:
    """A copy of ``state`` (a nested dict/list/tuple, as :meth:`Checkpointer.save` hands to DCP)
    in new host memory: each tensor's own elements, contiguous, a ``ShardedTensor``'s local
    shards alike (``ShardedTensor.to``: a shard that is a view into FBGEMM's buffer of all its
    kernel's tables is copied alone); other values deep-copied, as DCP's stager does."""
    if isinstance(state, ShardedTensor):
        return state.to(device="cpu", copy=True) if state.local_shards() else state
    if isinstance(state, torch.Tensor):
        return state.to(device="cpu", copy=True, memory_format=torch.contiguous_format)
    if isinstance(state, dict):
        return {k: host_copy(v) for k, v in state.items()}
    if isinstance(state, list):
        return [host_copy(v) for v in state]
    if isinstance(state, tuple):
        return tuple(host_copy(v) for v in state)
    return copy.deepcopy(state)


class HostStager(AsyncStager):
    """Stages an asynchronous save in host memory (:func:`host_copy`), once, before
    ``dcp.async_save`` returns: :func:`~dmt.host_memory.staged_bytes`, nothing on the way.
    ``FileSystemWriter``'s own stager (``_create_cpu_state_dict``) first deep-copies each CPU
    ``ShardedTensor``, with the whole storage its shard is a view of (for FBGEMM's tables, every
    table of the kernel: up to twice the state at its peak, and a kernel's buffer copied once
    per table), and copies a GPU one's shards to the host twice, dropping the first copy."""

    _synchronize_after_execute = False  # staged before stage() returns

    def stage(self, state_dict: dict[str, Any]) -> dict[str, Any]:
        staged: dict[str, Any] = host_copy(state_dict)
        return staged

    def synchronize_staging(self) -> None:
        return None  # staged already

    def close(self) -> None:
        return None  # holds nothing


@dataclass
class _Pending:
    path: Path
    future: Future[Any]
    meta: dict[str, Any]
    config: str | None


class Checkpointer:
    """Saves DCP checkpoints of one job; every rank calls :meth:`save` and :meth:`wait` alike.

    With ``async_save`` the tensors are staged in host memory (:class:`HostStager`) and written
    by a background thread over a dedicated gloo group while training goes on
    (``torch.distributed.checkpoint.async_save``);
    the marker ``meta.json`` is written once the write has finished (at the next save, at
    :meth:`wait`, or at :meth:`close`). A save whose staging copies would not fit in some host's
    free memory (:mod:`dmt.host_memory`; ``host_memory`` reads this rank's) is written
    synchronously instead, with a warning.

    ``keep`` (``trainer.checkpoint_keep``; 0: all): once a checkpoint is complete, rank 0
    deletes the complete checkpoints of ``root`` older than the newest ``keep``
    (:func:`prune`): ``root`` is the run's own checkpoint directory, which no other live run
    writes (:mod:`dmt.run_dir`). ``run_dir`` (the run's output directory) is recorded in each
    ``meta.json``; where ``root`` is outside it (an absolute ``trainer.checkpoint_dir``, which a
    resume in another run directory may adopt), only the checkpoints that record ``run_dir`` are
    deleted: an earlier run's stay.
    """

    def __init__(
        self,
        root: Path,
        *,
        rank: int,
        world_size: int,
        async_save: bool = False,
        timeout: timedelta | None = None,
        host_memory: Callable[[], Mapping[str, int]] = memory_bounds,
        keep: int = 0,
        run_dir: Path | None = None,
    ) -> None:
        self.root = Path(root)
        self.keep = keep
        self.run_dir = None if run_dir is None else str(Path(run_dir).resolve())
        # whose checkpoints prune may delete: all of a root inside the run directory
        self._owner = (
            None
            if self.run_dir is None or self.root.resolve().is_relative_to(self.run_dir)
            else self.run_dir
        )
        self.rank = rank
        self.world_size = world_size
        self.async_save = async_save
        self.host_memory = host_memory
        self._warned = False
        self._pending: _Pending | None = None
        self._group = (
            dist.new_group(backend="gloo", timeout=timeout)
            if async_save and dist.is_initialized()
            else None
        )
        # poll()'s own: DCP's background thread runs the pending save's collectives on _group
        # meanwhile, and collectives that two threads issue on one group may pair up
        # differently on different ranks
        self._poll_group = (
            dist.new_group(backend="gloo", timeout=timeout)
            if async_save and dist.is_initialized()
            else None
        )

    def save(
        self,
        model: nn.Module,
        optimizer: torch.optim.Optimizer,
        *,
        step: int,
        epoch: int,
        batch_in_epoch: int,
        config: str | None = None,
        lr_scheduler: dict[str, Any] | None = None,
        ema: DenseEMA | None = None,
        data: dict[str, Any] | None = None,
        training: dict[str, float] | None = None,
    ) -> Path:
        """Save model, optimizer, data position, RNG and ``ema`` (if given) as
        ``<root>/step_<step>``, and the LR scheduler's (small, rank-independent) ``state_dict``,
        the training data's fingerprint ``data`` (:attr:`dmt.data.DataBundle.train_fingerprint`,
        checked by :func:`check_data_fingerprint`) and the attempt's ``training`` figures
        (:data:`TRAINING_KEY`; not finite: ``null``) in ``meta.json``."""
        self.wait()
        path = self.root / f"step_{step}"
        # Rank 0 decides (the other ranks may look while it moves a damaged one aside) and every
        # rank raises its error alike.
        verdict: list[str | None] = [None]
        if self.rank == 0:
            try:
                verdict[0] = _make_way(path)
            except OSError as e:
                verdict[0] = f"cannot write checkpoint {path}: {e}"
        if dist.is_initialized() and self.world_size > 1:
            dist.broadcast_object_list(verdict, src=0)
        if verdict[0] is not None:
            raise ValueError(verdict[0])
        path.mkdir(parents=True, exist_ok=True)
        state = checkpoint_state(model, optimizer, rank=self.rank, ema=ema)
        meta = {
            "format": FORMAT,
            "step": step,
            "epoch": epoch,
            "batch_in_epoch": batch_in_epoch,
            "world_size": self.world_size,
            "cwd": os.getcwd(),
        }
        if self.run_dir is not None:
            meta["run_dir"] = self.run_dir
        fused_step = _fused_optimizer_step(model)
        if dist.is_initialized() and self.world_size > 1:  # a rank may hold no fused table
            steps: list[int | None] = [None] * self.world_size
            dist.all_gather_object(steps, fused_step)
            fused_step = max((v for v in steps if v is not None), default=None)
        if fused_step is not None:
            meta["fused_optimizer_step"] = fused_step
        if lr_scheduler is not None:
            meta["lr_scheduler"] = lr_scheduler
        if ema is not None:
            meta["ema_updates"] = ema.num_updates
        if data is not None:
            meta[DATA_KEY] = data
        if training is not None:
            meta[TRAINING_KEY] = {k: v if math.isfinite(v) else None for k, v in training.items()}
        if self.async_save and self._staging_fits(state, path):
            # no copying ahead from a GPU, as FileSystemWriter's own stager sets: the staged copy
            # is on the host, and with CUDA the copying-ahead loader would sync a stream of the
            # writer thread's current device (cuda:0, not necessarily this rank's GPU)
            writer = dcp.FileSystemWriter(path, sync_files=True, per_thread_copy_ahead=0)
            with _write_errors_named(path):
                response = dcp.async_save(
                    state,
                    storage_writer=writer,
                    process_group=self._group,
                    async_stager=HostStager(),
                )
            # a Future, or (with an asynchronous stager) the staging and upload futures
            future = response if isinstance(response, Future) else response.upload_completion
            self._pending = _Pending(path, future, meta, config)
        else:
            with _write_errors_named(path):
                dcp.save(state, storage_writer=dcp.FileSystemWriter(path, sync_files=True))
            self._finish(path, meta, config)
        return path

    def _staging_fits(self, state: dict[str, Any], path: Path) -> bool:
        """Whether every host has the free memory for its ranks' staging copies of ``state``;
        every rank reaches the same answer (one small gather over the checkpoint group)."""
        try:
            bounds: Mapping[str, int] | None = self.host_memory()
        except Exception as e:  # noqa: BLE001 - advisory: every rank must still reach the gather
            log.warning("rank %d cannot read its free host memory (%s); not checked", self.rank, e)
            bounds = None
        ranks: list[Any] = [
            RankMemory(machine_id(), socket.gethostname(), staged_bytes(state), bounds)
        ]
        if dist.is_initialized() and self.world_size > 1:
            mine, ranks = ranks[0], [None] * self.world_size
            dist.all_gather_object(ranks, mine, group=self._group)
        why = staging_shortfall(ranks)
        if why is None:
            return True
        if self.rank == 0:
            (log.warning if not self._warned else log.info)(
                "checkpoint %s: %s; writing it synchronously (trainer.checkpoint_async=true "
                "copies every rank's state into host memory until it is written: free host "
                "memory, or set trainer.checkpoint_async=false)",
                path,
                why,
            )
        self._warned = True
        return False

    def wait(self) -> None:
        """Block until the pending asynchronous save is written and marked complete."""
        if self._pending is None:
            return
        pending, self._pending = self._pending, None
        with _write_errors_named(pending.path):
            pending.future.result()
        self._finish(pending.path, pending.meta, pending.config)

    def poll(self) -> bool:
        """Mark the pending asynchronous save complete (``meta.json``) if every rank has written
        its part, without waiting for a rank that has not; every rank reaches the same answer
        (one small all-reduce over the checkpoint group), so call it on all ranks at the same
        steps. Until it is marked, a restart cannot resume from that checkpoint. Returns whether
        no save is pending any more. The all-reduce has a gloo group of its own
        (``_poll_group``): the pending save's own collectives run on ``_group`` in DCP's
        background thread at the same time."""
        if self._pending is None:
            return True
        done = torch.tensor([int(self._pending.future.done())], dtype=torch.int32)
        if dist.is_initialized() and self.world_size > 1:
            dist.all_reduce(done, op=dist.ReduceOp.MIN, group=self._poll_group)
        if int(done.item()):
            self.wait()  # raises the write's error, if it failed
        return self._pending is None

    def close(self) -> None:
        self.wait()

    def _finish(self, path: Path, meta: dict[str, Any], config: str | None) -> None:
        if dist.is_initialized() and self.world_size > 1:
            _barrier()  # every rank's files are written and fsynced
        if self.rank == 0:
            if config is not None:
                _write_atomic(path / CONFIG_FILE, config)
            files = sorted(
                p
                for p in path.iterdir()
                if p.is_file() and (not p.name.startswith(".") or p.name == DCP_METADATA)
            )
            # config.yaml is left out: a user may edit it (dmt-eval reads the model from it)
            sizes = {
                p.name: p.stat().st_size for p in files if p.name not in (META_FILE, CONFIG_FILE)
            }
            meta = {**meta, "files": sizes}
            _write_atomic(path / META_FILE, json.dumps(meta, indent=1) + "\n")
            _fsync(path)
            log.info("checkpoint of step %d written to %s", meta["step"], path)
            if self.keep:  # every rank's files are written (the barrier above)
                prune(self.root, self.keep, int(meta["step"]), owner=self._owner)
        if dist.is_initialized() and self.world_size > 1:
            _barrier()  # no rank goes on before the checkpoint is complete


def prune(root: Path, keep: int, step: int, *, owner: str | None = None) -> list[Path]:
    """Delete the complete checkpoints (``step_N`` with a ``meta.json`` that dmt wrote and whose
    files match it: :func:`damage`; with ``owner``, only those whose ``meta.json`` records it as
    their ``run_dir``) of ``root`` before ``step``, the one just completed, but
    the newest ``keep - 1`` of them (``keep >= 1``: with it, ``keep`` are kept; it and any newer
    one are never deleted); returns those deleted. Incomplete and damaged ones, those moved
    aside (``step_N.damaged-*``, ``step_N.incomplete-*``), a ``step_N`` that is a link (the
    user's, to a checkpoint elsewhere) and any other file are left as they are. Each is renamed
    (``step_N.deleting``, where what a deletion cut short left goes first) before its files go,
    so one whose deletion fails or is cut short is never taken for a checkpoint; a failure is a
    warning naming it (training goes on)."""
    older = [
        p
        for p, meta in ((p, read_meta(p)) for p in _complete_before(root, step))
        if not p.is_symlink()
        and meta.get("format") == FORMAT
        and (owner is None or meta.get("run_dir") == owner)
    ]
    deleted = []
    for path in older[keep - 1 :]:
        aside = path.with_name(f"{path.name}.deleting")
        try:
            if aside.is_dir() and not aside.is_symlink():
                shutil.rmtree(aside)
            os.replace(path, aside)
            shutil.rmtree(aside)
        except OSError as e:
            log.warning(
                "cannot delete checkpoint %s (trainer.checkpoint_keep=%d): %s", path, keep, e
            )
            continue
        log.info("deleted checkpoint %s (trainer.checkpoint_keep=%d keeps the newer)", path, keep)
        deleted.append(path)
    return deleted


@contextlib.contextmanager
def _write_errors_named(path: Path) -> Iterator[None]:
    """Raise DCP's failure to write checkpoint ``path`` as a ``ValueError`` naming it and the
    free space of its file system: DCP gathers the ranks' errors into a
    ``CheckpointException``, a ``BaseException`` (past ``except Exception``: Hydra's record of
    a failed job, a sweep's next job), whose text names neither, and for a full disk not even
    the cause (torch's zip writer reports it as "unexpected pos 704 vs 598")."""
    try:
        yield
    except (Exception, CheckpointException) as e:
        try:
            free = f"{shutil.disk_usage(path).free:,} bytes free"
        except OSError:
            free = "its free space unknown"
        raise ValueError(
            f"cannot write checkpoint {path} ({free} on its file system; "
            f"trainer.checkpoint_dir sets where checkpoints go): {e}"
        ) from e


def _make_way(path: Path) -> str | None:
    """Clear ``path`` for a new checkpoint: a damaged one (e.g. from before a restart) is moved
    aside, never deleted; returns the error if a complete one is there. So is a directory an
    unfinished save left without ``meta.json`` (a crash mid-save, perhaps of another world
    size): its files would otherwise be listed as part of the new checkpoint."""
    if not (path / META_FILE).exists():
        if path.is_dir() and any(path.iterdir()):
            aside = path.with_name(f"{path.name}.incomplete-{int(time.time())}")
            log.warning(
                "checkpoint %s is incomplete (no %s: a save that did not finish); moved to %s",
                path,
                META_FILE,
                aside,
            )
            os.replace(path, aside)
        return None
    why = damage(path)
    if why is None:
        return f"checkpoint {path} exists already; dmt never overwrites a complete checkpoint"
    aside = path.with_name(f"{path.name}.damaged-{int(time.time())}")
    log.warning("checkpoint %s is damaged (%s); moved to %s", path, why, aside)
    os.replace(path, aside)
    return None


def save(
    root: Path,
    model: nn.Module,
    optimizer: torch.optim.Optimizer,
    *,
    step: int,
    epoch: int,
    batch_in_epoch: int,
    rank: int,
    world_size: int,
    config: str | None = None,
) -> Path:
    """Synchronous :meth:`Checkpointer.save` (collective over the default group)."""
    return Checkpointer(root, rank=rank, world_size=world_size).save(
        model, optimizer, step=step, epoch=epoch, batch_in_epoch=batch_in_epoch, config=config
    )


# -- finding a complete checkpoint -----------------------------------------------------------


#: DCP's index of the saved tensors (a dotfile: ``cp step_N/*`` would leave it behind)
DCP_METADATA = ".metadata"


def damage(path: Path) -> str | None:
    """Why ``step_N`` directory ``path`` is not a usable checkpoint, or ``None`` if it is."""
    meta_path = Path(path) / META_FILE
    if not meta_path.is_file():
        return f"{meta_path} is missing (the save did not finish)"
    try:
        meta = json.loads(meta_path.read_text())
    except (OSError, ValueError) as e:
        return f"{meta_path} is unreadable ({e})"
    for name, size in meta.get("files", {}).items():
        f = Path(path) / name
        if not f.is_file():
            copy = "; a copy that skips dotfiles (cp dir/*) leaves it behind"
            return f"{f} is missing{copy if name.startswith('.') else ''}"
        if f.stat().st_size != size:
            return f"{f} has {f.stat().st_size} bytes, {META_FILE} says {size}"
    if "files" not in meta:
        return f"{meta_path} lists no files (written by an older dmt; not a DCP checkpoint)"
    if not (Path(path) / DCP_METADATA).is_file():  # checkpoints from before it was listed
        return (
            f"{Path(path) / DCP_METADATA} (DCP's index of the tensors) is missing; a copy that "
            "skips dotfiles (cp dir/*) leaves it behind"
        )
    return None


def step_dirs(root: Path) -> list[tuple[int, Path]]:
    """``(N, step_N)`` children of ``root``, newest first."""
    root = Path(root)
    if not root.is_dir():
        return []
    found = [
        (int(m.group(1)), p)
        for p in root.iterdir()
        if (m := _STEP_DIR.match(p.name)) and p.is_dir()
    ]
    return sorted(found, reverse=True)


def latest(root: Path) -> Path | None:
    """The newest usable ``step_N`` under ``root``; damaged or incomplete newer ones are skipped
    with a warning naming the file; ``None`` if there is none."""
    for _, p in step_dirs(root):
        why = damage(p)
        if why is None:
            return p
        log.warning("skipping checkpoint %s: %s", p, why)
    return None


def check_not_going_back(path: Path, root: Path) -> None:
    """Raise if the checkpoint ``path`` is in ``root`` (this run's checkpoint directory) and
    ``root`` holds newer complete checkpoints: training on from ``path`` would reach their steps
    and could not write its own there (dmt never overwrites a complete checkpoint), and a later
    ``resume_from=auto`` would pick them up, from the other history."""
    path, root = Path(path), Path(root)
    m = _STEP_DIR.match(path.name)
    if m is None or not root.is_dir() or path.parent.resolve() != root.resolve():
        return
    newer = [p.name for n, p in step_dirs(root) if n > int(m.group(1)) and damage(p) is None]
    if newer:
        raise ValueError(
            f"trainer.resume_from={str(path)!r} goes back in this run: its checkpoint directory "
            f"holds the newer {', '.join(reversed(newer))}, which training on would reach and "
            "may not overwrite; resume into a new run (another hydra.run.dir, and another "
            f"trainer.checkpoint_dir if yours is absolute) or move them out of {str(root)!r}"
        )


def resolve(path: Path, *, setting: str = "trainer.resume_from") -> Path:
    """``path`` itself if it is a checkpoint (``step_N``), else its newest usable ``step_N``
    child. ``setting`` names where the path came from in the error message. A ``step_N`` that
    is not there (a typo, or deleted since: ``trainer.checkpoint_keep``) is named as such, with
    the newest complete checkpoint beside it."""
    path = Path(path)
    if _STEP_DIR.match(path.name) and not path.exists():
        newest = latest(path.parent)
        raise ValueError(
            f"{setting}={str(path)!r}: no such directory"
            + ("" if newest is None else f" (the newest complete checkpoint there: {newest.name})")
        )
    if _STEP_DIR.match(path.name) or (path / META_FILE).exists():
        why = damage(path)
        if why is not None:
            raise ValueError(f"{setting}={str(path)!r} is not a usable checkpoint: {why}")
        return path
    found = latest(path)
    if found is None:
        inner = path / "checkpoints"  # a run directory given for its checkpoint directory
        steps = step_dirs(path)
        if steps:  # only damaged or incomplete ones: the newest one's reason
            hint = f" (the newest, {steps[0][1].name}: {damage(steps[0][1])})"
        elif inner.is_dir() and latest(inner) is not None:
            hint = f" (a run directory? its checkpoints are in {inner})"
        else:
            hint = ""
        raise ValueError(
            f"{setting}={str(path)!r}: no complete checkpoint (step_N/{META_FILE}) there{hint}"
        )
    return found


def resume_checkpoint(resume_from: str, root: Path) -> Path | None:
    """The checkpoint ``trainer.resume_from`` names: with ``auto`` the newest complete one under
    ``root`` (the run's checkpoint directory; ``None`` if there is none), else that path
    resolved (:func:`resolve`)."""
    return latest(root) if resume_from == "auto" else resolve(Path(resume_from))


def check_data_position(path: Path, batches_per_epoch: int, batch_size: int) -> None:
    """Raise ``ValueError`` if the data position of checkpoint ``path`` (its ``meta.json``:
    step, epoch, batch in the epoch) is not one that training data of ``batches_per_epoch``
    global batches of ``batch_size`` gives: the data is not the checkpoint's (a resume may move
    it, ``data.criteo.raw_path`` and ``preprocessed_dir``, not change its rows), and training on
    would start in an epoch at a batch that is not there (a negative one: empty batches and NaN
    losses). The trainer saves an epoch's last step as the next epoch's start, so the batch is
    always below ``batches_per_epoch``."""
    meta = read_meta(path)
    step, epoch, batch = int(meta["step"]), int(meta["epoch"]), int(meta["batch_in_epoch"])
    if batch < batches_per_epoch and step == epoch * batches_per_epoch + batch:
        return
    here = divmod(step, batches_per_epoch)
    raise ValueError(
        f"cannot resume from {path}: it is at step {step}, batch {batch} of epoch {epoch}, and "
        f"this run's training data ({batches_per_epoch} global batches of data.batch_size="
        f"{batch_size} per epoch) at batch {here[1]} of epoch {here[0]}: it is not the "
        "checkpoint's data (a resume may move the data, data.criteo.raw_path and "
        "data.criteo.preprocessed_dir, not change its rows)"
    )


def check_data_fingerprint(
    path: Path, fingerprint: dict[str, Any] | None, where: str, *, allow_change: bool
) -> None:
    """Raise ``ValueError`` if checkpoint ``path`` trained on other rows than this run's
    training data (``fingerprint``: :attr:`dmt.data.DataBundle.train_fingerprint` of the data
    ``where`` names), listing what differs: a resume may move the data, not change it. With
    ``allow_change`` (``trainer.resume_allow_config_change``: e.g. the same rows in a file that
    was decompressed since, whose size and sampled fingerprint differ) a warning instead. A
    checkpoint of an older dmt, without the record, resumes with a warning."""
    if fingerprint is None:  # rows fixed by the config (synthetic), which check_config compares
        return
    saved = read_meta(path).get(DATA_KEY)
    if saved is None:
        log.warning(
            "checkpoint %s was saved by a dmt that did not record its training data: %s is not "
            "checked against it (only against its batch position)",
            path,
            where,
        )
        return
    was, now = flatten_keys(_indexed(saved)), flatten_keys(_indexed(fingerprint))
    differences = [
        f"{k}: {was.get(k, '<absent>')!r} -> {now.get(k, '<absent>')!r}"
        for k in sorted(set(was) | set(now))
        if was.get(k) != now.get(k)
    ]
    if not differences:
        return
    if len(differences) > 5:
        differences[5:] = [f"and {len(differences) - 5} more"]
    what = f"other rows than this run's {where} holds ({'; '.join(differences)})"
    if allow_change:
        log.warning(
            "checkpoint %s trained on %s; trainer.resume_allow_config_change=true: training on "
            "with this run's rows",
            path,
            what,
        )
        return
    raise ValueError(
        f"cannot resume from {path}: it trained on {what}: a resume may move the data "
        "(data.criteo.raw_path and data.criteo.preprocessed_dir), not change its rows; point "
        "them at the checkpoint's data, or set trainer.resume_allow_config_change=true to train "
        "on with these rows"
    )


def _indexed(tree: Any) -> Any:
    """``tree`` with every list as a dict of its indexes (for :func:`flatten_keys`)."""
    if isinstance(tree, dict):
        return {k: _indexed(v) for k, v in tree.items()}
    if isinstance(tree, list | tuple):
        return {str(i): _indexed(v) for i, v in enumerate(tree)}
    return tree


def check_ends_after(step: int, end: int, path: str | Path, trainer: Any) -> None:
    """Raise ``ValueError`` if a run that ends at step ``end`` would resume the checkpoint
    ``path`` of step ``step`` past it: it would train nothing and report the figures of none
    (``trainer``: the run's ``trainer`` settings, named in the message)."""
    if step > end:
        raise ValueError(
            f"trainer.resume_from={str(path)!r} is at step {step}, past this run's end at step "
            f"{end} (trainer.max_steps={trainer.max_steps}, trainer.epochs={trainer.epochs}): a "
            "run cannot train back to an earlier step; raise trainer.max_steps (or "
            "trainer.epochs), or score the checkpoint with dmt-eval"
        )


def end_known_from(meta: dict[str, Any], trainer: Any) -> int | None:
    """The step a run with ``trainer``'s settings ends at, as far as a checkpoint's ``meta``
    tells without the data: ``trainer.max_steps``, and ``trainer.epochs`` times the steps per
    epoch that its position gives once it is past its first epoch (the data and the batch size
    are settings a resume may not change); ``None``: only ``trainer.epochs`` bounds the run and
    the checkpoint is in its first epoch, before the end of any run of one epoch or more
    (its ``batch_in_epoch`` is below the steps per epoch: the trainer saves an epoch's last
    step as the next epoch's start)."""
    ends = [trainer.max_steps] if trainer.max_steps > 0 else []
    epoch, batch = int(meta.get("epoch", 0)), int(meta.get("batch_in_epoch", 0))
    if epoch >= 1:
        ends.append((int(meta["step"]) - batch) // epoch * trainer.epochs)
    return min(ends) if ends else None


def read_meta(path: Path) -> dict[str, Any]:
    """``meta.json`` of a complete checkpoint directory ``step_N``."""
    return dict(json.loads((Path(path) / META_FILE).read_text()))


# -- resuming ---------------------------------------------------------------------------------


def flatten_keys(tree: Any, prefix: str = "") -> dict[str, Any]:
    """A nested dict as one dict of dotted keys (``prefix`` before each)."""
    if isinstance(tree, dict):
        out: dict[str, Any] = {}
        for k, v in tree.items():
            out.update(flatten_keys(v, f"{prefix}{k}."))
        return out
    return {prefix[:-1]: tree}


_DEFAULT_SCHEDULE = "dmt.optim.warmup_decay_schedule"
#: a tp partition file's towers as the run trained them (its checkpoints' config.yaml)
RECORDED_TOWERS = "model.partition.recorded_towers"


def config_differences(
    saved: dict[str, Any], current: dict[str, Any], *, allow_change: bool
) -> list[str]:
    """Keys whose values differ between a checkpoint's config and this run's and that a resume
    may not change: everything but how the job runs (``_FREE_KEYS``, ``logger.*``,
    ``sharding.*``); ``optim.*`` only with ``allow_change``, and so the run's length (``trainer.epochs``/``max_steps``) when
    the saved LR schedule decays until the end of training, or is another factory than dmt's
    (given the run's ``total_steps``, it may span the run). Each as
    ``key: saved -> current``."""
    a, b = flatten_keys(saved), flatten_keys(current)
    # dmt's own schedule spans the run when it decays to the end; any other factory is given
    # the run's total_steps and may use them
    target = a.get("optim.schedule._target_", _DEFAULT_SCHEDULE)
    schedule_spans_run = target != _DEFAULT_SCHEDULE or (
        a.get("optim.schedule.decay", "none") != "none" and not a.get("optim.schedule.decay_steps")
    )
    out = []
    for key in sorted(set(a) | set(b)):
        if key == RECORDED_TOWERS:
            # compared where both sides hold them: an older dmt's checkpoint does not, nor a
            # config whose file was not read yet
            was, now = a.get(key), b.get(key)
            if was is not None and now is not None and was != now:
                out.append(
                    f"{key}: partition file {b.get('model.partition.path')!r} holds other "
                    f"towers than the checkpoint trained ({describe_towers_change(was, now)})"
                )
            continue
        if key in _FREE_KEYS or key.startswith(_FREE_PREFIXES):
            continue
        if key in _RUN_LENGTH_KEYS and not schedule_spans_run:
            continue
        if allow_change and key.startswith(_CHANGEABLE_PREFIXES):
            continue
        was = a[key] if key in a else _added_default(key, a)
        now = b.get(key, "<absent>")
        if was != now:
            out.append(f"{key}: {was!r} -> {now!r}")
    return out


def _added_default(key: str, saved: dict[str, Any]) -> Any:
    """What a checkpoint saved before ``key`` existed had: its schema default (a setting is added
    with the default that keeps the earlier behaviour), for a key of a component
    (``model.tower.bias``) the default of the schema of the saved ``_target_``, else
    ``"<absent>"``."""
    value = schema_default(key)
    if value is NO_DEFAULT and "." in key:
        target = saved.get(f"{key.rsplit('.', 1)[0]}._target_")
        if isinstance(target, str):
            value = component_default(key, target)
    return "<absent>" if value is NO_DEFAULT else value


def check_config(path: Path, current_yaml: str, *, allow_change: bool) -> None:
    """Raise ``ValueError`` listing the keys in which this run's config differs from the one
    saved with checkpoint ``path`` in a way a resume may not."""
    saved_file = Path(path) / CONFIG_FILE
    if not saved_file.is_file():
        raise ValueError(
            f"checkpoint {path} has no {CONFIG_FILE}; cannot check that it fits this run"
        )
    try:  # a user may edit it (dmt-eval reads the model from it)
        saved = yaml.safe_load(saved_file.read_text()) or {}
    except (OSError, UnicodeDecodeError, yaml.YAMLError) as e:
        raise ValueError(f"cannot read checkpoint {path}'s {CONFIG_FILE}: {e}") from e
    if not isinstance(saved, dict):
        raise ValueError(
            f"checkpoint {path}'s {CONFIG_FILE} holds a {type(saved).__name__}, not a config"
        )
    current = yaml.safe_load(current_yaml) or {}
    diffs = config_differences(saved, current, allow_change=allow_change)
    flat_saved, flat_current = flatten_keys(saved), flatten_keys(current)
    if (
        flat_saved.get("model.partition.kind") == "tp"
        and flat_saved.get(RECORDED_TOWERS) is None
        and flat_current.get(RECORDED_TOWERS) is not None
    ):
        log.warning(
            "checkpoint %s was saved by a dmt that did not record the towers of its partition "
            "file: %s is not checked against them (other towers fail at the tensor names; the "
            "same towers in another feature order would go unnoticed)",
            path,
            flat_current.get("model.partition.path"),
        )
    if diffs:
        hint = (
            " (optimizer and schedule keys, optim.*, trainer.epochs and trainer.max_steps, may "
            "change with trainer.resume_allow_config_change=true)"
            if any(d.startswith(_CHANGEABLE_PREFIXES) for d in diffs)
            else ""
        )
        raise ValueError(
            f"cannot resume from {path}: this run's config differs from the checkpoint's "
            f"{saved_file} in " + "; ".join(diffs) + hint
        )


def load(
    path: Path,
    model: nn.Module,
    optimizer: torch.optim.Optimizer | None,
    *,
    rank: int,
    partial_optimizer: bool = False,
    ema: DenseEMA | None = None,
) -> dict[str, Any]:
    """Restore ``model`` and ``optimizer`` (and, at the same world size, this rank's RNG) from
    checkpoint ``path`` (or its newest complete ``step_N``), at any world size; returns the
    checkpoint's ``meta.json``. Collective over the default group.

    ``partial_optimizer``: optimizer state the checkpoint lacks (another optimizer was chosen)
    starts fresh, with a warning, instead of failing. The model must be complete either way.

    ``ema``: restored too when the checkpoint holds one; one saved without (``trainer.ema_decay``
    was off) leaves it to start from the resumed weights, with a warning.

    A loaded value that is not finite, on any rank, is a ``ValueError`` on every rank
    (:func:`_check_finite`).
    """
    path = resolve(path)
    meta = read_meta(path)
    world = dist.get_world_size() if dist.is_initialized() else 1
    state: dict[str, Any] = {"model": model.state_dict()}
    fresh_fused = False  # the fused tables' state starts fresh (another sparse optimizer)
    fresh_dense: list[Any] = []  # dense state tensors the checkpoint lacks
    saved = tensor_keys(path, prefix="")
    missing = [k for k in flatten_keys(state["model"], "model.") if k not in saved]
    if missing:
        raise ValueError(
            f"checkpoint {path} does not fit this model: {len(missing)} tensors are not in it "
            f"(e.g. {missing[0].removeprefix('model.')})"
        )
    if optimizer is not None:
        _materialize_optimizer_state(optimizer)
        state["optim"] = _optimizer_state(model, optimizer)
        entries = flatten_keys(state["optim"], "optim.")
        unnamed = [k for k in entries if k not in saved]
        # row-wise per column block, checked: full-shape state is never a block's
        _check_column_blocks(path, [k for k in unnamed if len(_size(entries[k])) < 2], saved)
        # a name another optimizer's state has too (exact and row-wise Adagrad's momentum1:
        # (rows, cols) and (rows,)) is absent state all the same
        absent = unnamed + [
            k for k in entries if k in saved and _size(entries[k]) != tuple(saved[k].size)
        ]
        if absent and not partial_optimizer:
            raise ValueError(
                f"checkpoint {path} holds no optimizer state for {len(absent)} entries (e.g. "
                f"{absent[0]}): was another optimizer used? (trainer.resume_allow_config_change=true "
                "starts such state fresh)"
            )
        if absent:
            # the fused tables' state is sharded like the tables; the dense state is not
            fresh_fused = any(isinstance(entries[k], ShardedTensor) for k in absent)
            fresh_dense = [entries[k] for k in absent if not isinstance(entries[k], ShardedTensor)]
            log.warning(
                "checkpoint %s: %d optimizer state entries start fresh (e.g. %s)",
                path,
                len(absent),
                absent[0],
            )
            state["optim"] = _drop(state["optim"], set(absent), "optim.")
    has_ema = ema is not None and "ema_updates" in meta
    if ema is not None and not has_ema:
        log.warning(
            "checkpoint %s holds no moving average of the weights (saved with "
            "trainer.ema_decay=null): the average starts from the resumed weights",
            path,
        )
    if has_ema:
        assert ema is not None
        state["ema"] = _ema_state(model, ema)
        absent = [k for k in flatten_keys(state["ema"], "ema.") if k not in saved]
        if absent:
            raise ValueError(
                f"checkpoint {path} holds no moving average of {len(absent)} weights "
                f"(e.g. {absent[0].removeprefix('ema.')}) that this run averages"
            )
    same_world = int(meta["world_size"]) == world
    if same_world:
        rng = _rng_state()
        if f"rng.rank_{rank}.cuda" not in saved:  # saved on the CPU, or by an older dmt
            rng.pop("cuda", None)
        state["rng"] = {f"rank_{rank}": rng}
    if "optim" in state and not state["optim"]:
        # this rank's optimizer holds no state (no table shard here and a dense optimizer
        # without any, as SGD): left as {}, DCP's load plan takes it for a saved value to load
        # ("Missing key in checkpoint state_dict: optim", while the other ranks load theirs)
        del state["optim"]
    try:
        with warnings.catch_warnings():
            # DCP reads TorchRec's sharded tables, ShardedTensors, through calls torch
            # deprecates: every rank printed "Please use DTensor instead ..." at every resume,
            # of TorchRec's state, which nothing a user sets changes
            warnings.filterwarnings(
                "ignore", message=SHARDED_TENSOR_DEPRECATED, category=FutureWarning
            )
            dcp.load(state, checkpoint_id=path)
    # DCP gathers every rank's error into one CheckpointException, a BaseException
    except (Exception, CheckpointException) as e:
        raise ValueError(f"cannot load checkpoint {path} into this model: {e}") from e
    # under DCP's keys: TorchRec's load_state_dict renames them in place (DDP's "module.")
    _check_finite(path, int(meta["step"]), state, world, skip=_buffer_keys(model, state["model"]))
    result = model.load_state_dict(state["model"], strict=False)
    if result.missing_keys or result.unexpected_keys:
        raise ValueError(
            f"checkpoint {path} does not fit this model: missing {list(result.missing_keys)[:5]}, "
            f"unexpected {list(result.unexpected_keys)[:5]}"
        )
    if same_world:
        _set_rng_state(state["rng"][f"rank_{rank}"])
    if fresh_dense:
        assert optimizer is not None
        _clear_dense_state(optimizer, fresh_dense)
    if "fused_optimizer_step" in meta and optimizer is not None and not fresh_fused:
        # before the first forward after resuming; fused state started fresh starts at step 0
        # (a change of the dense optimizer alone keeps the tables' loaded state and its step)
        _restore_fused_optimizer_step(model, int(meta["fused_optimizer_step"]))
    if has_ema:
        assert ema is not None
        ema.num_updates = int(meta["ema_updates"])
    return meta


#: elements of a tensor :func:`_finite` checks at once (its temporary memory: as many bools)
_FINITE_CHUNK = 1 << 24


def _check_finite(
    path: Path, step: int, state: dict[str, Any], world: int, *, skip: Collection[str] = ()
) -> None:
    """Raise ``ValueError`` on every rank if any rank loaded a value that is not finite (NaN or
    inf) from checkpoint ``path`` into ``state``: a run that had diverged saved it, and training
    on would start from it (with ``resume_from=auto`` after a restart, silently). The error
    names the checkpoint, its step, the first such tensor (its key in the checkpoint: ``model.``,
    ``optim.`` or ``ema.`` and the state-dict key; of the lowest rank that holds one) and the
    newest complete checkpoint before it, which the user may resume from instead: it is not
    taken in its place (nor checked: that happens when it loads). The keys of ``skip`` are not
    checked (the model's buffers, :func:`_buffer_keys`). One small collective."""
    bad = _first_not_finite(state, world, skip=skip)
    if bad is None:
        return
    root = path.parent
    earlier = newest_before(root, step)
    instead = (
        f"resume from an earlier checkpoint by its path (the newest before it: "
        f"trainer.resume_from={str(earlier)!r})"
        if earlier is not None
        else f"no complete checkpoint before it is in {str(root)!r}: start afresh"
    )
    raise ValueError(
        f"checkpoint {path} (step {step}) holds values that are not finite (NaN or inf), "
        f"first in {bad}: the run that saved it had diverged, and training on would start from "
        f"them; {instead}, in a new run directory (another hydra.run.dir, and another "
        "trainer.checkpoint_dir if yours is absolute), perhaps with a lower learning rate "
        "(optim.lr, optim.sparse_lr)"
    )


def _first_not_finite(
    state: dict[str, Any], world: int, *, skip: Collection[str] = ()
) -> str | None:
    """The key (``model.``, ``optim.`` or ``ema.`` and the state-dict key) of the first tensor
    of ``state`` that holds a value that is not finite, of the lowest rank that holds one
    (``None``: none on any rank); the keys of ``skip`` and each rank's RNG are not checked. Every
    rank gets the same answer (one small collective: call it on every rank)."""
    bad = next(
        (
            key
            for key, value in flatten_keys(state).items()
            if not key.startswith("rng.")
            and key not in skip
            and not all(map(_finite, local_tensors(value)))
        ),
        None,
    )
    if dist.is_initialized() and world > 1:
        found: list[str | None] = [None] * world
        dist.all_gather_object(found, bad)
        bad = next((k for k in found if k is not None), None)
    return bad


def not_finite_key(
    model: nn.Module,
    optimizer: torch.optim.Optimizer,
    *,
    rank: int,
    world_size: int,
    ema: DenseEMA | None = None,
) -> str | None:
    """The key of the first value that is not finite (NaN or inf: the run has diverged) in the
    state a checkpoint of ``model``, ``optimizer`` and ``ema`` would hold, as a resume's
    :func:`_check_finite` would name it (the model's buffers not checked); ``None``: every value
    is finite on every rank. The same answer on every rank (one small collective)."""
    state = checkpoint_state(model, optimizer, rank=rank, ema=ema)
    return _first_not_finite(state, world_size, skip=_buffer_keys(model, state["model"]))


def _complete_before(root: Path, step: int) -> Iterator[Path]:
    """The complete checkpoints (``step_N``, ``N < step``, :func:`damage` finds nothing) in
    ``root``, newest first."""
    return (p for n, p in step_dirs(root) if n < step and damage(p) is None)


def newest_before(root: Path, step: int) -> Path | None:
    """The newest complete checkpoint (``step_N``, ``N < step``) in ``root``; ``None``: none."""
    return next(_complete_before(root, step), None)


def _buffer_keys(model: nn.Module, model_state: dict[str, Any]) -> set[str]:
    """The checkpoint keys (``model.<state-dict key>``) of ``model``'s buffers: values a module
    set, not learned ones, which may be infinite by design (a user tower module's attention
    mask of ``-inf``). Found by storage, as a sharded model's state-dict keys need not be its
    buffers' names (SPTT's towers); its tables (sharded tensors) are never among them."""

    def storage(t: Any) -> int | None:  # plain tensors' (a sharded tensor is no buffer)
        plain = type(t) is torch.Tensor and t.numel() > 0
        return t.untyped_storage().data_ptr() if plain else None

    buffers = {storage(b) for b in model.buffers()} - {None}
    return {f"model.{k}" for k, v in model_state.items() if storage(v) in buffers}


def _finite(t: torch.Tensor) -> bool:
    """Whether every value of ``t`` is finite (integers are), checked in slices along its first
    dimension of about :data:`_FINITE_CHUNK` elements (views: no copy of a table): a slice whose
    sum is finite holds no NaN or inf (either makes any sum NaN or inf), and only one whose sum
    is not (those, or finite values whose sum overflows) is checked value by value. On CPU the
    sum reads about 25x as fast as ``isfinite(...).all()`` (22 against 0.9 GB/s, one thread):
    every resume checks every table."""
    if not t.is_floating_point() or t.numel() == 0:
        return True
    if t.dim() == 0:
        return bool(torch.isfinite(t))
    rows = max(1, _FINITE_CHUNK // max(1, t[0].numel()))
    return all(
        bool(torch.isfinite(part.sum())) or bool(torch.isfinite(part).all())
        for part in t.split(rows)
    )


def _size(entry: Any) -> tuple[int, ...]:
    """The global size of a state entry (a ``ShardedTensor``'s whole tensor); ``()`` for a
    number."""
    if isinstance(entry, ShardedTensor):  # its metadata: size() is a deprecated torch function
        return tuple(entry.metadata().size)
    size = getattr(entry, "size", None)
    return tuple(size()) if callable(size) else ()


def _check_column_blocks(path: Path, absent: list[str], saved: Iterable[str]) -> None:
    """Raise if optimizer state is absent only because a column-wise table is split into other
    column blocks than when it was saved (row-wise state is kept per block: it cannot be
    resharded across blocks, see dmt.sptt.sharded_state)."""
    for key in absent:
        base = key.split(".cols_")[0]
        blocks = sorted(
            k.removeprefix(base) or "(whole table)"
            for k in saved
            if k == base or k.startswith(base + ".cols_")
        )
        if blocks:
            raise ValueError(
                f"cannot resume from {path}: {base.removeprefix('optim.')} (row-wise optimizer "
                f"state of a column-wise table) was saved for column blocks {blocks}, and this run "
                f"needs {key.removeprefix(base) or '(whole table)'}; resume with the same "
                "sptt.sharding_type and ranks per tower (sptt.local_world_size x "
                "sptt.hosts_per_tower), or train with optim.sparse._target_=torch.optim.Adagrad "
                "or torch.optim.SGD, whose state reshards freely"
            )


def check_sptt_towers(path: Path, topology: Topology) -> None:
    """Raise ``ValueError`` (:func:`dmt.sptt.dmt_sharding.check_num_towers`'s, as the trainer
    raises it once Hydra has written the run's record) if the model of checkpoint ``path``,
    resumed as it was saved, has other towers than ``topology`` (``T = G / (K L)``), found from
    the checkpoint's metadata before the run writes anything."""
    saved = tensor_keys(path)  # the trainer's task: the model under "model."
    towers = {m.group(1) for key in saved if (m := re.match(r"model\.towers\.(\d+)\.", key))}
    if towers:  # a DMT model's checkpoint
        try:
            check_num_towers(len(towers), topology)
        except ValueError as e:
            raise ValueError(f"cannot resume from {path}: {e}") from None


def check_sptt_column_blocks(
    path: Path, *, sharding_type: str, tower_size: int, optim: OptimConfig
) -> None:
    """Raise ``ValueError`` (:func:`load`'s) if the SPTT checkpoint ``path`` keeps the row-wise
    optimizer state of a table in other column blocks than a run with ``sptt.sharding_type``
    ``sharding_type`` and ``tower_size`` ranks per tower (``K L``) splits it into
    (:func:`dmt.sptt.plan.column_split`; such state exists only with a fused optimizer, whose
    blocks are multiples of 4 columns): a resume that :func:`load` would refuse, found from the
    checkpoint's metadata before the run writes anything. Only a run whose sparse optimizer
    (``optim``: its settings) keeps row-wise state reads it: another one (exact
    Adagrad, SGD, Adam; with ``trainer.resume_allow_config_change``) starts its state afresh,
    as :func:`load` does."""
    if sparse_optimizer_name(sparse_optimizer_spec(optim)[0]) != "rowwise_adagrad":
        return
    saved = tensor_keys(path, prefix="")  # one read of the checkpoint's index
    for key, md in saved.items():
        model_key = key.removeprefix("model.")  # the model's tensors, under their state-dict keys
        table = model_key != key and ".embedding_bags." in key and key.endswith(".weight")
        if not table or len(md.size) != 2:
            continue
        base, N = f"optim.{model_key}.", md.size[1]
        states = {
            k.removeprefix(base).split(".cols_")[0]
            for k, v in saved.items()
            if k.startswith(base) and len(v.size) == 1
        }
        blocks = column_split(N, tower_size, 4) if sharding_type == "column_wise" else [(0, N)]
        needed = [""] if len(blocks) == 1 else [f".cols_{a}_{b}" for a, b in blocks]
        for state in sorted(states):
            wanted = [f"{base}{state}{block}" for block in needed]
            _check_column_blocks(path, [k for k in wanted if k not in saved][:1], saved)


def _drop(tree: Any, keys: set[str], prefix: str) -> Any:
    """``tree`` without the leaves whose flattened key is in ``keys``."""
    if not isinstance(tree, dict):
        return tree
    out = {}
    for k, v in tree.items():
        key = f"{prefix}{k}"
        if isinstance(v, dict):
            inner = _drop(v, keys, key + ".")
            # a subtree all of whose leaves went goes too: left as {}, DCP's load plan on a rank
            # that does not ask for every saved key takes it for a tensor to load ("Missing key
            # in checkpoint state_dict", at 2+ ranks)
            if inner or not v:
                out[k] = inner
        elif key not in keys:
            out[k] = v
    return out


# -- reading a checkpoint without its process group -------------------------------------------


def tensor_keys(path: Path, prefix: str = "model.") -> dict[str, TensorStorageMetadata]:
    """The tensors under ``prefix`` of a DCP checkpoint, by key (prefix removed), with their
    global size and dtype."""
    try:
        md = dcp.FileSystemReader(path).read_metadata()
    except Exception as e:  # a damaged index: pickle's or the file system's error
        raise ValueError(f"cannot read {Path(path) / DCP_METADATA}: {e}") from e
    return {
        k.removeprefix(prefix): v
        for k, v in md.state_dict_metadata.items()
        if k.startswith(prefix) and isinstance(v, TensorStorageMetadata)
    }


def row_wise_state_blocks(path: Path) -> dict[str, int]:
    """Per table name, the column blocks a flat (TorchRec-sharded) checkpoint keeps the table's
    row-wise optimizer state in (row-wise Adagrad's ``momentum1``).

    TorchRec keeps that state per row and column block: ``rows x k`` values for a table it split
    column-wise into ``k`` blocks, ``rows`` for one it kept whole. DCP cannot reshard it into
    another number of blocks, so a resume plans each table into the same ``k``
    (:func:`dmt.sharding.table_constraints`). Tables without row-wise state (SGD, exact Adagrad,
    Adam) and SPTT checkpoints (whose keys name their blocks) give no entry.

    Raises:
        ValueError: the checkpoint's ``.metadata`` cannot be read (the file is named).
    """
    tensors = tensor_keys(path, prefix="")  # its ValueError names the damaged .metadata
    tables = {}  # TorchRec's key of a table's fused optimizer state, less the state's name
    for key, md in tensors.items():
        fqn = key.removeprefix("model.")
        if fqn == key or ".embedding_bags." not in fqn or not fqn.endswith(".weight"):
            continue
        if len(md.size) == 2 and md.size[0] > 0:
            table = fqn.removesuffix(".weight").rsplit(".", 1)[-1]
            tables[f"optim.{fqn}.{table}"] = (table, md.size[0])
    out: dict[str, int] = {}
    for key, md in tensors.items():
        found = tables.get(key.rsplit(".", 1)[0]) if key.startswith("optim.") else None
        if found is not None and len(md.size) == 1 and md.size[0] % found[1] == 0:
            table, rows = found
            out[table] = max(out.get(table, 1), md.size[0] // rows)
    return out


def load_model_state(path: Path, *, ema: bool = True) -> dict[str, torch.Tensor]:
    """The full, unsharded model state of a checkpoint of any world size, flat or SPTT.

    Runs in one process without a process group: DCP reads every table's shards into one tensor
    of its global size. Keys are those of the training module's state dict (``TrainTask``:
    ``model.``-prefixed), which are the plain model's.

    ``ema``: a checkpoint of a run with ``trainer.ema_decay`` gives the moving average of its
    dense weights in their place, the weights the run's own evaluation scored (``False``: the
    raw weights, those training goes on from).

    Raises:
        ValueError: the checkpoint is missing, incomplete or damaged (the file is named).
    """
    path = resolve(path, setting="checkpoint")
    if read_meta(path).get("format") != FORMAT:
        raise ValueError(
            f"checkpoint {path} is not a DCP checkpoint ({META_FILE} has no format {FORMAT!r})"
        )
    averaged = ema and read_meta(path).get("ema_updates", 0) > 0
    prefixes = ("model.", "ema.") if averaged else ("model.",)
    shapes = tensor_keys(path, prefix="")
    state = {
        k: torch.empty(v.size, dtype=v.properties.dtype)
        for k, v in shapes.items()
        if k.startswith(prefixes)
    }
    try:
        with warnings.catch_warnings():
            # torch warns that it is "assuming the intent is to load in a single process" even
            # when, as here, that intent is stated (no_dist=True)
            warnings.filterwarnings("ignore", message=_NO_DIST_ASSUMED, category=UserWarning)
            dcp.load(state, checkpoint_id=path, no_dist=True)
    except (Exception, CheckpointException) as e:  # the latter is a BaseException
        raise ValueError(f"cannot read checkpoint {path}: {e}") from e
    weights = {k.removeprefix("model."): v for k, v in state.items() if k.startswith("model.")}
    for k, v in state.items():  # ema.<the model's state-dict key>
        if k.startswith("ema."):
            weights[k.removeprefix("ema.")] = v
    return weights
