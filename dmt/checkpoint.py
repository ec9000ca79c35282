"""Checkpoints: model, optimizers (fused sparse state included), step, data position, RNG.

Layout: ``<root>/step_<N>/rank_<r>.pt`` per rank (each rank saves its own shards) and
``<root>/step_<N>/meta.json``, written last so a checkpoint without it is incomplete and ignored.
Resume needs the same world size and sharding plan.
"""

from __future__ import annotations

import json
import os
import random
import re
from pathlib import Path
from typing import Any

import numpy as np
import torch
import torch.distributed as dist
from torch import nn

_STEP_DIR = re.compile(r"^step_(\d+)$")


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
    batch_in_epoch: int, rank: int, world_size: int,
) -> Path:
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
        meta = {"step": step, "epoch": epoch, "batch_in_epoch": batch_in_epoch, "world_size": world_size}
        (path / "meta.json").write_text(json.dumps(meta) + "\n")
    return path


def resolve(path: Path) -> Path:
    """``path`` itself if it is a complete checkpoint, else its latest complete ``step_N`` child."""
    path = Path(path)
    if (path / "meta.json").exists():
        return path
    steps = [
        (int(m.group(1)), p) for p in path.glob("step_*")
        if (m := _STEP_DIR.match(p.name)) and (p / "meta.json").exists()
    ] if path.is_dir() else []
    if not steps:
        raise ValueError(f"trainer.resume_from={str(path)!r}: no complete checkpoint (step_N/meta.json) there")
    return max(steps)[1]


def load(path: Path, model: nn.Module, optimizer: torch.optim.Optimizer | None, *, rank: int) -> dict[str, Any]:
    path = resolve(path)
    meta = json.loads((path / "meta.json").read_text())
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
