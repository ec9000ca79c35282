"""The process's place in the job: built once at the entry point and passed in.

``torchrun`` (or SLURM through submitit) sets ``RANK``/``WORLD_SIZE``/``LOCAL_RANK``/
``LOCAL_WORLD_SIZE``; without them dmt runs as a world of one on an in-process store, so the same
TorchRec sharded code path (DistributedModelParallel, fused kernels) serves a laptop run.
"""

from __future__ import annotations

import os
from dataclasses import dataclass
from datetime import timedelta

import torch
import torch.distributed as dist


@dataclass(frozen=True)
class Runtime:
    """Rank, world and device of this process."""

    rank: int
    world_size: int
    local_rank: int
    local_world_size: int
    device: torch.device
    backend: str

    @property
    def is_main(self) -> bool:
        return self.rank == 0


def _env_int(name: str, default: int) -> int:
    value = os.environ.get(name)
    return default if value is None else int(value)


def init_runtime(device: str = "auto", *, timeout_s: float = 600.0) -> Runtime:
    """Initialize the default process group (gloo on CPU, nccl on CUDA) and return the runtime."""
    use_cuda = device == "cuda" or (device == "auto" and torch.cuda.is_available())
    if device == "cuda" and not torch.cuda.is_available():
        raise ValueError("trainer.device=cuda but no CUDA device is available")
    rank = _env_int("RANK", 0)
    world_size = _env_int("WORLD_SIZE", 1)
    local_rank = _env_int("LOCAL_RANK", 0)
    local_world_size = _env_int("LOCAL_WORLD_SIZE", world_size)
    backend = "nccl" if use_cuda else "gloo"
    dev = torch.device("cuda", local_rank) if use_cuda else torch.device("cpu")
    if use_cuda:
        torch.cuda.set_device(dev)
    if not dist.is_initialized():
        timeout = timedelta(seconds=timeout_s)
        if os.environ.get("TORCHELASTIC_USE_AGENT_STORE") == "True":
            dist.init_process_group(backend, store=_elastic_store(world_size, timeout), rank=rank,
                                    world_size=world_size, timeout=timeout)
        elif "MASTER_ADDR" in os.environ or world_size > 1:
            dist.init_process_group(backend, rank=rank, world_size=world_size, timeout=timeout)
        else:
            dist.init_process_group(backend, store=dist.HashStore(), rank=0, world_size=1, timeout=timeout)
    return Runtime(rank, world_size, local_rank, local_world_size, dev, backend)


def _elastic_store(world_size: int, timeout: timedelta) -> dist.Store:
    """The torchrun agent's store, with this restart's keys apart from earlier attempts'.

    After ``torchrun --max-restarts`` restarts the workers, they meet again in the agent's
    store, which still holds the previous attempt's keys; a worker that starts before its peer
    would read the peer's *old* gloo/NCCL address and fail with "Connection refused". The
    restart count (``TORCHELASTIC_RESTART_COUNT``) as a key prefix keeps the attempts apart.
    """
    store = dist.TCPStore(
        os.environ["MASTER_ADDR"], int(os.environ["MASTER_PORT"]), world_size,
        is_master=False, timeout=timeout,
    )
    return dist.PrefixStore(f"dmt/attempt_{os.environ.get('TORCHELASTIC_RESTART_COUNT', '0')}", store)


def close_runtime() -> None:
    if dist.is_initialized():
        dist.destroy_process_group()
