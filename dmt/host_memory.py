"""Host memory for asynchronous checkpoints: what DCP's ``async_save`` stages, and what is free.

``trainer.checkpoint_async=true`` saves through ``torch.distributed.checkpoint.async_save``, whose
stager (``FileSystemWriter``, a ``BlockingAsyncStager``) first copies every tensor of the rank's
state, GPU and CPU alike, into new host memory, and keeps that copy until the background write
has finished. A rank holding 60 GiB of tables and optimizer state therefore needs 60 GiB more host
memory at every checkpoint, and all ranks of a host stage at once. Where that is not free the
kernel's OOM killer ends the job, hours in and without a message. :class:`dmt.checkpoint.
Checkpointer` checks each save against :func:`staging_shortfall` first and writes a checkpoint
that would not fit synchronously instead (no copy), saying so.

Free memory is the smaller of the host's (``MemAvailable`` in ``/proc/meminfo``) and the
headroom of every memory cgroup above the process (cgroup v2 ``memory.max``, v1
``memory.limit_in_bytes``, as SLURM's ``ConstrainRAMSpace`` and container runtimes set them): the
limit, less the usage, plus the usage's file-backed page cache (the inactive and active file
LRUs, clean pages of which the kernel reclaims before it kills, as ``MemAvailable`` counts them; a
memory-mapped dataset fills them). Ranks are grouped by machine (:func:`machine_id`, the boot id),
not host name, which containers of one node may each have their own of.
"""

from __future__ import annotations

import math
import socket
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import torch
from torch.distributed._shard.sharded_tensor import ShardedTensor
from torch.distributed.tensor import DTensor

#: cgroup v1 reports "no limit" as a page-rounded maximum of a signed 64-bit value
_V1_UNLIMITED = 1 << 62


def staged_bytes(state: Any) -> int:
    """Bytes DCP's stager copies into host memory for this rank's ``state`` (a nested
    dict/list of tensors, as :meth:`Checkpointer.save` hands to DCP): every tensor's own
    elements, the local shards of a ``ShardedTensor`` or ``DTensor``; other values count 0."""
    if isinstance(state, ShardedTensor):
        return sum(_nbytes(shard.tensor) for shard in state.local_shards())
    if isinstance(state, DTensor):
        return _nbytes(state.to_local())
    if isinstance(state, torch.Tensor):
        return _nbytes(state)
    if isinstance(state, Mapping):
        return sum(staged_bytes(v) for v in state.values())
    if isinstance(state, list | tuple):
        return sum(staged_bytes(v) for v in state)
    return 0


def _nbytes(t: torch.Tensor) -> int:
    return t.numel() * t.element_size()


def available_bytes(root: Path = Path("/")) -> int:
    """Host memory this process can still take: the smaller of ``MemAvailable`` and every
    memory cgroup's headroom from the process's cgroup up to the root (``root``: where ``/proc``
    and ``/sys/fs/cgroup`` are read, for tests)."""
    free = _meminfo_available(root / "proc" / "meminfo")
    for headroom in _cgroup_headrooms(root):
        free = min(free, headroom)
    return max(free, 0)


def _meminfo_available(path: Path) -> int:
    for line in path.read_text().splitlines():
        name, _, value = line.partition(":")
        if name == "MemAvailable":
            amount, *unit = value.split()
            return int(amount) * (1024 if unit == ["kB"] else 1)
    raise ValueError(f"{path} has no MemAvailable line")


def _cgroup_headrooms(root: Path) -> Iterable[int]:
    """Headroom of each limited memory cgroup of this process, from its own to the root."""
    try:
        lines = (root / "proc" / "self" / "cgroup").read_text().splitlines()
    except OSError:
        return
    for line in lines:
        fields = line.split(":", 2)
        if len(fields) != 3:
            continue
        _, controllers, path = fields
        if controllers == "":  # v2, unified: memory.max, memory.current, memory.stat
            base, limit, usage, cache = (
                root / "sys" / "fs" / "cgroup",
                "memory.max",
                "memory.current",
                ("inactive_file", "active_file"),
            )
        elif "memory" in controllers.split(","):  # v1
            base, limit, usage, cache = (
                root / "sys" / "fs" / "cgroup" / "memory",
                "memory.limit_in_bytes",
                "memory.usage_in_bytes",
                ("total_inactive_file", "total_active_file"),
            )
        else:
            continue
        for level in _levels(base, path):
            headroom = _headroom(level, limit, usage, cache)
            if headroom is not None:
                yield headroom


def _levels(base: Path, path: str) -> list[Path]:
    """``base/path`` and its ancestors up to ``base``, those that exist (a container may see
    only the part of the hierarchy from its own cgroup down)."""
    parts = [p for p in path.split("/") if p and p != ".."]
    dirs = [base.joinpath(*parts[:i]) for i in range(len(parts), -1, -1)]
    found = []
    for d in dirs:
        try:
            if d.is_dir():
                found.append(d)
        except OSError:  # e.g. EACCES on a parent
            continue
    return found


def _headroom(
    level: Path, limit_file: str, usage_file: str, cache_keys: tuple[str, ...]
) -> int | None:
    """The cgroup's limit less its usage, plus its file-backed page cache (``cache_keys``: the
    inactive and active file LRUs; clean pages the kernel reclaims before it kills, as
    ``MemAvailable`` counts them; a memory-mapped dataset fills them); ``None`` without a limit
    or when unreadable."""
    try:
        limit_text = (level / limit_file).read_text().strip()
        usage = int((level / usage_file).read_text())
        limit = int(limit_text) if limit_text != "max" else None
    except (OSError, ValueError):
        return None
    if limit is None or limit >= _V1_UNLIMITED:
        return None
    cache = 0
    try:
        for line in (level / "memory.stat").read_text().splitlines():
            key, _, value = line.partition(" ")
            if key in cache_keys:
                cache += int(value)
    except (OSError, ValueError):
        cache = 0
    return limit - usage + cache


def machine_id(root: Path = Path("/")) -> str:
    """This machine's boot id (``/proc/sys/kernel/random/boot_id``): the same in every container
    of a node whatever their host names, and different on two nodes that share a host name;
    the host name where it cannot be read."""
    try:
        return (root / "proc" / "sys" / "kernel" / "random" / "boot_id").read_text().strip()
    except OSError:
        return socket.gethostname()


@dataclass(frozen=True)
class RankMemory:
    """One rank's side of an asynchronous save: its machine (:func:`machine_id`) and host name,
    the bytes it would stage, and the host memory it sees free (``None``: it could not tell)."""

    machine: str
    host: str
    staged: int
    available: int | None


def staging_shortfall(ranks: Sequence[RankMemory]) -> str | None:
    """Why the ranks' staging copies do not fit (the first machine where the sum of its ranks'
    copies exceeds the least free memory they see), or ``None`` if they fit everywhere. A
    machine none of whose ranks could read its free memory is not judged."""
    by_machine: dict[str, list[tuple[int, RankMemory]]] = {}
    for r, m in enumerate(ranks):
        by_machine.setdefault(m.machine, []).append((r, m))
    for members in by_machine.values():
        staged = sum(m.staged for _, m in members)
        seen = [m.available for _, m in members if m.available is not None]
        if not seen or staged <= min(seen):
            continue
        names = ", ".join(str(r) for r, _ in members)
        which = f"ranks {names}" if len(members) > 1 else f"rank {names}"
        hosts = " / ".join(dict.fromkeys(m.host for _, m in members))
        return (
            f"host {hosts} ({which}) would stage {_gib(staged)} of checkpoint state "
            f"in host memory with {_gib(min(seen))} free"
        )
    return None


def _gib(nbytes: int) -> str:
    return f"{nbytes / 1024**3:.3g} GiB" if nbytes >= 1024**2 else f"{math.ceil(nbytes)} bytes"
