"""Checkpoints: model, optimizers (fused sparse state included), step, data position, RNG.

Layout: ``<root>/step_<N>/rank_<r>.pt`` per rank (each rank saves its own shards),
``<root>/step_<N>/config.yaml`` (the resolved training config, when the trainer passes it) and
``<root>/step_<N>/meta.json`` (step, data position, world size, working directory), written last
so a checkpoint without it is incomplete and ignored. Resume needs the same world size and
sharding plan; :func:`load_model_state` reassembles the full model state of a flat-sharded
checkpoint of any world size in one process (what ``dmt-eval`` needs).
"""

from __future__ import annotations

import json
import os
import pickle
import random
import re
import types
from pathlib import Path
from typing import Any

import numpy as np
import torch
import torch.distributed as dist
from torch import nn
from torch.distributed._shard.sharded_tensor import ShardedTensor

_STEP_DIR = re.compile(r"^step_(\d+)$")
META_FILE = "meta.json"
CONFIG_FILE = "config.yaml"


def _rng_state() -> dict[str, Any]:
    return {"torch": torch.get_rng_state(), "numpy": np.random.get_state(), "python": random.getstate()}


def _set_rng_state(state: dict[str, Any]) -> None:
    torch.set_rng_state(state["torch"])
    np.random.set_state(state["numpy"])
    random.setstate(state["python"])


def _sub_optimizers(optimizer: torch.optim.Optimizer) -> list[Any]:
    # TorchRec's CombinedOptimizer hands its whole state to every part on load, so each part
    # (fused sparse, dense) is saved and restored on its own.
    return [opt for _, opt in optimizer.optimizers] if hasattr(optimizer, "optimizers") else [optimizer]


def _optimizer_states(optimizer: torch.optim.Optimizer) -> list[dict[str, Any]]:
    return [opt.state_dict() for opt in _sub_optimizers(optimizer)]


def save(
    root: Path, model: nn.Module, optimizer: torch.optim.Optimizer, *, step: int, epoch: int,
    batch_in_epoch: int, rank: int, world_size: int, config: str | None = None,
) -> Path:
    """Save this rank's state under ``<root>/step_<step>``; ``config`` (YAML text of the resolved
    training config) is written by rank 0 beside the weights."""
    path = Path(root) / f"step_{step}"
    path.mkdir(parents=True, exist_ok=True)
    state = {
        "model": model.state_dict(),
        "optimizer": _optimizer_states(optimizer),
        "step": step,
        "epoch": epoch,
        "batch_in_epoch": batch_in_epoch,
        "rng": _rng_state(),
    }
    tmp = path / f".rank_{rank}.pt.tmp"
    torch.save(state, tmp)
    os.replace(tmp, path / f"rank_{rank}.pt")
    if dist.is_initialized() and world_size > 1:
        dist.barrier()
    if rank == 0:
        if config is not None:
            tmp = path / f".{CONFIG_FILE}.tmp"
            tmp.write_text(config)
            os.replace(tmp, path / CONFIG_FILE)
        meta = {"step": step, "epoch": epoch, "batch_in_epoch": batch_in_epoch, "world_size": world_size,
                "cwd": os.getcwd()}  # relative data paths in the config are relative to it
        (path / META_FILE).write_text(json.dumps(meta) + "\n")
    return path


def resolve(path: Path, *, setting: str = "trainer.resume_from") -> Path:
    """``path`` itself if it is a complete checkpoint, else its latest complete ``step_N`` child.
    ``setting`` names where the path came from in the error message."""
    path = Path(path)
    if (path / META_FILE).exists():
        return path
    steps = [
        (int(m.group(1)), p) for p in path.glob("step_*")
        if (m := _STEP_DIR.match(p.name)) and (p / META_FILE).exists()
    ] if path.is_dir() else []
    if not steps:
        raise ValueError(f"{setting}={str(path)!r}: no complete checkpoint (step_N/meta.json) there")
    return max(steps)[1]


def read_meta(path: Path) -> dict[str, Any]:
    """``meta.json`` of a complete checkpoint directory ``step_N``."""
    return json.loads((Path(path) / META_FILE).read_text())


def load(path: Path, model: nn.Module, optimizer: torch.optim.Optimizer | None, *, rank: int) -> dict[str, Any]:
    path = resolve(path)
    meta = read_meta(path)
    world = dist.get_world_size() if dist.is_initialized() else 1
    if meta["world_size"] != world:
        raise ValueError(
            f"checkpoint {path} was saved by {meta['world_size']} ranks; this job has {world}"
        )
    state = torch.load(path / f"rank_{rank}.pt", weights_only=False)
    model.load_state_dict(state["model"])
    if optimizer is not None:
        parts = _sub_optimizers(optimizer)
        if len(parts) != len(state["optimizer"]):
            raise ValueError(f"checkpoint {path} holds {len(state['optimizer'])} optimizer states; "
                             f"this job has {len(parts)} optimizers")
        for opt, sd in zip(parts, state["optimizer"]):
            if not opt.state and sd["state"] and hasattr(opt, "init_state"):
                opt.init_state()  # materialize lazy (dense) optimizer state so it can be loaded in place
            opt.load_state_dict(sd)
    _set_rng_state(state["rng"])
    return state


# -- reading a checkpoint without its process group -------------------------------------------


class _Shards:
    """The pickled state of a ``ShardedTensor``: this rank's shards and the global metadata."""

    def __init__(self, local_shards: list[Any], metadata: Any) -> None:
        self.local_shards = local_shards
        self.metadata = metadata


def _rebuild_from_type_v2(func: Any, new_type: type, args: Any, state: Any) -> Any:
    if isinstance(new_type, type) and issubclass(new_type, ShardedTensor):
        return _Shards(state[0], state[1])
    return torch._tensor._rebuild_from_type_v2(func, new_type, args, state)


class _Unpickler(pickle.Unpickler):
    # ShardedTensor.__setstate__ needs a process group in which this process has the rank that
    # saved it; the shards and their offsets are all that is needed to reassemble a table.
    def find_class(self, module: str, name: str) -> Any:
        if (module, name) == ("torch._tensor", "_rebuild_from_type_v2"):
            return _rebuild_from_type_v2
        return super().find_class(module, name)


_portable_pickle = types.ModuleType("dmt_checkpoint_pickle")
_portable_pickle.Unpickler = _Unpickler  # type: ignore[attr-defined]
_portable_pickle.load = pickle.load  # type: ignore[attr-defined]


def _assemble(key: str, parts: list[_Shards], path: Path) -> torch.Tensor:
    """The full tensor of ``key`` from every rank's local shards."""
    md = parts[0].metadata
    full = torch.empty(tuple(md.size), dtype=md.tensor_properties.dtype)
    wanted = {tuple(s.shard_offsets) for s in md.shards_metadata}
    found: set[tuple[int, ...]] = set()
    for part in parts:
        for shard in part.local_shards:
            offsets, sizes = shard.metadata.shard_offsets, shard.metadata.shard_sizes
            full[tuple(slice(o, o + n) for o, n in zip(offsets, sizes))] = shard.tensor.to("cpu")
            found.add(tuple(offsets))
    if wanted - found:
        raise ValueError(
            f"checkpoint {path} is incomplete: {key} has shards at offsets {sorted(wanted - found)} "
            "that no rank_<r>.pt holds"
        )
    return full


def load_model_state(path: Path) -> dict[str, torch.Tensor]:
    """The full, unsharded model state of a flat-sharded checkpoint of any world size.

    Runs in one process without a process group: every ``rank_<r>.pt`` is read (memory-mapped),
    each table is put together from its shards (table-, row- or column-wise), and replicated
    (dense, data-parallel) tensors are taken from rank 0. Keys are those of the sharded module's
    ``state_dict`` (``TrainTask``: ``model.``-prefixed).

    Raises:
        ValueError: a rank file is missing, a table's shards are incomplete, or the checkpoint
            holds tensors of another kind (e.g. DTensor) that cannot be reassembled here.
    """
    path = resolve(path, setting="checkpoint")
    world = int(read_meta(path)["world_size"])
    files = [path / f"rank_{r}.pt" for r in range(world)]
    for f in files:
        if not f.is_file():
            raise ValueError(f"checkpoint {path} is incomplete: {f.name} is missing "
                             f"({META_FILE} says {world} ranks saved it)")
    states = [
        torch.load(f, map_location="cpu", weights_only=False, mmap=True,
                   pickle_module=_portable_pickle)["model"]
        for f in files
    ]
    out: dict[str, torch.Tensor] = {}
    for key, first in states[0].items():
        parts = [s.get(key) for s in states]
        if isinstance(first, _Shards):
            if not all(isinstance(p, _Shards) for p in parts):
                raise ValueError(f"checkpoint {path}: {key} is sharded on some ranks only")
            out[key] = _assemble(key, parts, path)  # type: ignore[arg-type]
        elif type(first) is torch.Tensor or type(first) is nn.Parameter:
            out[key] = first.detach()
        else:
            raise ValueError(
                f"checkpoint {path}: {key} is a {type(first).__name__}; only ShardedTensor and "
                "plain tensors can be reassembled without the job's process group"
            )
    return out
