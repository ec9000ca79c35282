"""Host memory for asynchronous checkpoints: what DCP's ``async_save`` stages, and what is free.

``trainer.checkpoint_async=true`` saves through ``torch.distributed.checkpoint.async_save``,
staged by :class:`dmt.checkpoint.HostStager`: it first copies every tensor of the rank's state,
GPU and CPU alike, into new host memory (:func:`staged_bytes`, and nothing more on the way), and
keeps that copy until the background write has finished. A rank holding 60 GiB of tables and
optimizer state therefore needs 60 GiB more host memory at every checkpoint, and all ranks of a
host stage at once. Where that is not free the kernel's OOM killer ends the job, hours in and
without a message. :class:`dmt.checkpoint.Checkpointer` checks each save against
:func:`staging_shortfall` first and writes a checkpoint that would not fit synchronously instead
(no copy), saying so.

Free memory is the smaller of the host's (``MemAvailable`` in ``/proc/meminfo``) and the
headroom of every memory cgroup above the process (cgroup v2 ``memory.max``, v1
``memory.limit_in_bytes``, as SLURM's ``ConstrainRAMSpace`` and container runtimes set them): the
limit, less the usage, plus the usage's file-backed page cache (the inactive and active file
LRUs, clean pages of which the kernel reclaims before it kills, as ``MemAvailable`` counts them; a
memory-mapped dataset fills them). Each bound holds the copies of the ranks it bounds
(:func:`staging_shortfall`): a machine's ``MemAvailable`` those of all its ranks (grouped by
:func:`machine_id`, the boot id, not host name, which containers of one node may each have their
own of), a cgroup those of the ranks inside it."""

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


def local_tensors(value: Any) -> list[torch.Tensor]:
    """This rank's part of a state entry: a ``ShardedTensor``'s local shards, a ``DTensor``'s
    local tensor, a tensor itself; nothing for other values."""
    if isinstance(value, ShardedTensor):
        return [shard.tensor for shard in value.local_shards()]
    if isinstance(value, DTensor):
        return [value.to_local()]
    return [value] if isinstance(value, torch.Tensor) else []


def staged_bytes(state: Any) -> int:
    """Bytes :class:`dmt.checkpoint.HostStager` copies into host memory for this rank's
    ``state`` (a nested dict/list of tensors, as :meth:`Checkpointer.save` hands to DCP): every
    tensor's own elements, the local shards of a ``ShardedTensor`` or ``DTensor``; other values
    count 0. Also the most it holds at once while it copies."""
    if isinstance(state, ShardedTensor | DTensor | torch.Tensor):
        return sum(_nbytes(t) for t in local_tensors(state))
    if isinstance(state, Mapping):
        return sum(staged_bytes(v) for v in state.values())
    if isinstance(state, list | tuple):
        return sum(staged_bytes(v) for v in state)
    return 0


def _nbytes(t: torch.Tensor) -> int:
    return t.numel() * t.element_size()


HOST = "host"
"""The key of the machine's own bound (``MemAvailable``) in :func:`memory_bounds`."""


def memory_bounds(root: Path = Path("/")) -> dict[str, int]:
    """What bounds the host memory this process can still take: ``{"host": MemAvailable}`` and,
    for every limited memory cgroup from the process's up to the root, its headroom under a key
    naming that cgroup (``"cgroup <dev>:<inode>"`` of its directory: the same for every process
    in it, whatever cgroup namespace it sees it through). ``root``: where ``/proc`` and
    ``/sys/fs/cgroup`` are read, for tests."""
    bounds = {HOST: max(_meminfo_available(root / "proc" / "meminfo"), 0)}
    for key, headroom in _cgroup_headrooms(root):
        bounds[key] = max(headroom, 0)
    return bounds


def available_bytes(root: Path = Path("/")) -> int:
    """Host memory this process alone can still take: the least of :func:`memory_bounds`."""
    return min(memory_bounds(root).values())


def _meminfo_available(path: Path) -> int:
    for line in path.read_text().splitlines():
        name, _, value = line.partition(":")
        if name == "MemAvailable":
            amount, *unit = value.split()
            return int(amount) * (1024 if unit == ["kB"] else 1)
    raise ValueError(f"{path} has no MemAvailable line")


#: where the memory hierarchies are mounted unless ``/proc/self/mountinfo`` says otherwise
_DEFAULT_MOUNTS = {"v2": ("/", "sys/fs/cgroup"), "v1": ("/", "sys/fs/cgroup/memory")}
#: per hierarchy: the limit, the usage, and the ``memory.stat`` keys of the file-backed LRUs
_FILES = {
    "v2": ("memory.max", "memory.current", ("inactive_file", "active_file")),
    "v1": (
        "memory.limit_in_bytes",
        "memory.usage_in_bytes",
        ("total_inactive_file", "total_active_file"),
    ),
}


def _cgroup_mounts(root: Path) -> dict[str, list[tuple[str, Path]]]:
    """Per hierarchy (``"v2"``: the unified one; ``"v1"``: the memory controller's), its mounts
    as (the cgroup at the mount's root, the mount point), from ``/proc/self/mountinfo``: a
    hybrid systemd host mounts v2 at ``/sys/fs/cgroup/unified``, some hosts elsewhere. A
    hierarchy not found there is looked for where it usually is."""
    mounts: dict[str, list[tuple[str, Path]]] = {"v2": [], "v1": []}
    try:
        lines = (root / "proc" / "self" / "mountinfo").read_text().splitlines()
    except OSError:
        lines = []
    for line in lines:
        before, sep, after = line.partition(" - ")
        fields, tail = before.split(), after.split()
        if not sep or len(fields) < 5 or len(tail) < 3:
            continue
        fstype, options = tail[0], tail[2].split(",")
        kind = "v2" if fstype == "cgroup2" else "v1" if fstype == "cgroup" else None
        if kind is None or (kind == "v1" and "memory" not in options):
            continue
        cgroup, point = (_unescape(f) for f in fields[3:5])
        mounts[kind].append((cgroup, root / point.lstrip("/")))
    for kind, (cgroup, point) in _DEFAULT_MOUNTS.items():
        if not mounts[kind]:
            mounts[kind].append((cgroup, root / point))
    return mounts


def _unescape(field: str) -> str:
    """A mountinfo path: the kernel writes space, tab, newline and backslash as octal escapes."""
    for code in ("\\040", "\\011", "\\012", "\\134"):
        field = field.replace(code, chr(int(code[1:], 8)))
    return field


def _cgroup_headrooms(root: Path) -> Iterable[tuple[str, int]]:
    """Key and headroom of each limited memory cgroup of this process, from its own to the
    root of every mount of its hierarchy."""
    try:
        lines = (root / "proc" / "self" / "cgroup").read_text().splitlines()
    except OSError:
        return
    mounts = _cgroup_mounts(root)
    for line in lines:
        fields = line.split(":", 2)
        if len(fields) != 3:
            continue
        _, controllers, path = fields
        if controllers == "":  # v2, unified: memory.max, memory.current, memory.stat
            kind = "v2"
        elif "memory" in controllers.split(","):
            kind = "v1"
        else:
            continue
        limit, usage, cache = _FILES[kind]
        for mount_cgroup, point in mounts[kind]:
            below = _below(path, mount_cgroup)
            if below is None:  # the mount shows another part of the hierarchy
                continue
            for level in _levels(point, below):
                headroom = _headroom(level, limit, usage, cache)
                if headroom is not None:
                    try:
                        st = level.stat()
                    except OSError:
                        continue
                    yield f"cgroup {st.st_dev}:{st.st_ino}", headroom


def _below(path: str, mount_cgroup: str) -> str | None:
    """``path`` relative to the cgroup a mount shows at its root, or ``None`` if outside it."""
    inner = mount_cgroup.rstrip("/")
    if inner == "" or path == inner:
        return path.removeprefix(inner)
    return path[len(inner) :] if path.startswith(inner + "/") else None


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
    the host memory its staging would take (:func:`staged_bytes`), and what bounds its
    free memory (:func:`memory_bounds`; ``None``: it could not tell)."""

    machine: str
    host: str
    staged: int
    bounds: Mapping[str, int] | None


def staging_shortfall(ranks: Sequence[RankMemory]) -> str | None:
    """Why the ranks' staging copies do not fit, or ``None`` if they fit everywhere. Each bound
    holds the copies of the ranks it bounds: a machine's ``MemAvailable`` all its ranks' (the
    containers of a node share it), a memory cgroup those of the ranks inside it (each pod its
    own). A rank that could not read its bounds is judged by its neighbours' only."""
    shared: dict[tuple[str, str], list[tuple[int, RankMemory, int]]] = {}
    for r, m in enumerate(ranks):
        for key, free in (m.bounds or {}).items():
            shared.setdefault((m.machine, key), []).append((r, m, free))
    for (machine, key), members in shared.items():
        if key == HOST:  # every rank of the machine stages into its memory
            staged = sum(m.staged for m in ranks if m.machine == machine)
            names = [r for r, m in enumerate(ranks) if m.machine == machine]
        else:
            staged = sum(m.staged for _, m, _ in members)
            names = [r for r, _, _ in members]
        free = min(f for _, _, f in members)
        if staged <= free:
            continue
        which = f"ranks {', '.join(map(str, names))}" if len(names) > 1 else f"rank {names[0]}"
        hosts = " / ".join(dict.fromkeys(ranks[r].host for r in names))
        where = "free" if key == HOST else "free under their memory cgroup's limit"
        return (
            f"host {hosts} ({which}) would stage {_gib(staged)} of checkpoint state "
            f"in host memory with {_gib(free)} {where}"
        )
    return None


def _gib(nbytes: int) -> str:
    return f"{nbytes / 1024**3:.3g} GiB" if nbytes >= 1024**2 else f"{math.ceil(nbytes)} bytes"
