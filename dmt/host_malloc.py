"""Host memory that a training process frees between steps, kept for the next step (glibc).

A training step allocates the same tensors every step and frees them at its end. glibc's
``malloc`` adapts two thresholds as it goes: allocations above ``M_MMAP_THRESHOLD`` get their own
mapping, returned at ``free``, and free memory above ``M_TRIM_THRESHOLD`` at the top of the heap
goes back to the system. Both start at 128 KiB and rise with the largest mapped chunk freed so
far (up to 32 MiB; the trim threshold to twice it), so a step whose temporaries add up to more
than twice its largest one can return memory every step and take it back in the next, page
fault by page fault, each page zeroed by the kernel. Measured on dmt's DLRM at batch 512 on one
CPU thread (the configuration of ``benchmarks/bench_torchrec_dlrm.py``), in a process of its
own: 1,200-1,900 minor page faults per step, 8-11 with the same thresholds; ``dmt-train``
ran 1.12x as fast with :func:`reuse_host_memory`. How much it gives depends on what the
process allocated before, as glibc's adaptation does.

:func:`reuse_host_memory` fixes both thresholds (``mallopt``, which also stops their adaptation):
allocations below :data:`MMAP_THRESHOLD` come from the heap, and up to :data:`TRIM_THRESHOLD` of
free memory stays there. The process then keeps about its peak host memory until it ends: the
setting is the process's, for the rest of it (``mallopt`` cannot restore glibc's adaptation), as
``MALLOC_MMAP_THRESHOLD_`` / ``MALLOC_TRIM_THRESHOLD_`` in the environment would make it.
``dmt-train`` applies it unless ``trainer.reuse_host_memory=false``. It leaves the process as it
is where the user set those thresholds (:data:`USER_SETTINGS`, :data:`USER_TUNABLES` in the
environment the process started with), where the C library is not glibc (macOS, musl), and where
another allocator serves ``malloc`` (jemalloc or tcmalloc preloaded).
"""

from __future__ import annotations

import ctypes
import logging
import os
from collections.abc import Callable, Mapping
from pathlib import Path

log = logging.getLogger(__name__)

MIB = 1 << 20
#: allocations at least this large get their own mapping (glibc's default: 128 KiB, adapting)
MMAP_THRESHOLD = 32 * MIB
#: free memory at the top of the heap kept for later allocations (glibc's default: 128 KiB,
#: adapting to twice the mmap threshold)
TRIM_THRESHOLD = 256 * MIB
#: glibc's ``mallopt`` parameters (``malloc.h``)
M_TRIM_THRESHOLD = -1
M_MMAP_THRESHOLD = -3
#: environment variables through which a user sets the thresholds that dmt sets (any of them
#: also stops glibc adapting them); dmt then leaves malloc alone
USER_SETTINGS = (
    "MALLOC_MMAP_THRESHOLD_",
    "MALLOC_TRIM_THRESHOLD_",
    "MALLOC_TOP_PAD_",
    "MALLOC_MMAP_MAX_",
)
#: the same settings as ``GLIBC_TUNABLES`` entries
USER_TUNABLES = tuple(
    f"glibc.malloc.{name}" for name in ("mmap_threshold", "trim_threshold", "top_pad", "mmap_max")
)

_applied = False


def applied() -> bool:
    """Whether :func:`reuse_host_memory` changed this process's malloc (it stays so)."""
    return _applied


def user_settings(env: Mapping[str, str]) -> list[str]:
    """The thresholds ``env`` sets itself (``NAME=value``), which dmt does not override."""
    found = [f"{name}={env[name]}" for name in USER_SETTINGS if name in env]
    tunables = [
        entry
        for entry in env.get("GLIBC_TUNABLES", "").split(":")
        if entry.split("=", 1)[0] in USER_TUNABLES
    ]
    if tunables:
        found.append(f"GLIBC_TUNABLES={':'.join(tunables)}")
    return found


def startup_environ() -> Mapping[str, str]:
    """The environment this process started with, which glibc read (``/proc/self/environ``;
    ``os.environ`` where there is none): a variable set later from Python does not reach it."""
    try:
        raw = Path("/proc/self/environ").read_bytes()
    except OSError:
        return os.environ
    pairs = (entry.split(b"=", 1) for entry in _whole_tunables(raw.split(b"\0")) if b"=" in entry)
    return {k.decode(errors="replace"): v.decode(errors="replace") for k, v in pairs}


def _whole_tunables(entries: list[bytes]) -> list[bytes]:
    """``/proc/self/environ``'s entries with ``GLIBC_TUNABLES`` whole: glibc before 2.39 ends
    each tunable it takes from it with a NUL there, over the ``:`` before the next
    (``a=1:b=2`` reads ``a=1``, then ``b=2``), and hands the process the whole value, which the
    pieces spell unless the process changed it since."""
    whole = b"GLIBC_TUNABLES=" + os.environb.get(b"GLIBC_TUNABLES", b"")
    for i, entry in enumerate(entries):
        if entry.startswith(b"GLIBC_TUNABLES="):
            for j in range(i + 1, len(entries) + 1):
                if b":".join(entries[i:j]) == whole:
                    return [*entries[:i], whole, *entries[j:]]
            break
    return entries


class _MallInfo(ctypes.Structure):
    """glibc's ``struct mallinfo`` (``int`` fields; ``mallinfo2`` has ``size_t``)."""

    _fields_ = [
        (name, ctypes.c_int)
        for name in ("arena", "ordblks", "smblks", "hblks", "hblkhd", "usmblks", "fsmblks")
        + ("uordblks", "fordblks", "keepcost")
    ]


def _glibc_mallopt() -> Callable[[int, int], int] | None:
    """glibc's ``mallopt``, when glibc's allocator serves this process's ``malloc``; else
    ``None`` (another C library, or a preloaded allocator such as jemalloc or tcmalloc, whose
    memory glibc's settings would not reach)."""
    try:
        process = ctypes.CDLL(None)
        if not hasattr(process, "gnu_get_libc_version"):
            return None  # not glibc
        libc = ctypes.CDLL("libc.so.6")
        mallopt, mallinfo = libc.mallopt, libc.mallinfo
    except (OSError, AttributeError):
        return None
    # whether glibc's own counters see a block that the process's malloc hands out (the
    # process's malloc may be another allocator's, preloaded; an address comparison would
    # also refuse a non-PIE executable's PLT entry for glibc's malloc)
    mallinfo.restype = _MallInfo
    process.malloc.restype, process.malloc.argtypes = ctypes.c_void_p, [ctypes.c_size_t]
    process.free.restype, process.free.argtypes = None, [ctypes.c_void_p]
    size = 64 * 1024  # below glibc's mmap threshold: counted in uordblks
    before = mallinfo().uordblks
    block = process.malloc(size)
    if not block:
        return None
    served = (mallinfo().uordblks - before) % 2**32 >= size  # int fields wrap
    process.free(block)
    if not served:
        return None
    mallopt.argtypes = [ctypes.c_int, ctypes.c_int]
    mallopt.restype = ctypes.c_int
    return mallopt


def reuse_host_memory(env: Mapping[str, str] | None = None, *, announce: bool = True) -> bool:
    """Fix glibc's ``M_MMAP_THRESHOLD`` and ``M_TRIM_THRESHOLD`` at :data:`MMAP_THRESHOLD` and
    :data:`TRIM_THRESHOLD` for the rest of this process (see the module). Returns whether it
    did; ``False``, with nothing changed, where the environment (``env``, default: the one
    the process started with, :func:`startup_environ`) sets those thresholds itself, or the
    process's ``malloc`` is not glibc's. ``announce``: say so at INFO (else DEBUG: every rank
    of a job sets the same, which rank 0 says for all)."""
    global _applied
    own = user_settings(startup_environ() if env is None else env)
    if own:
        log.info(
            "host memory: malloc's thresholds as the environment sets them (%s)", ", ".join(own)
        )
        return False
    if _applied:  # a multirun's later job: nothing to probe or set again
        return True
    mallopt = _glibc_mallopt()
    if mallopt is None:
        log.debug("host memory: malloc is not glibc's; left as it is")
        return False
    # the mmap threshold first: a refused value changes nothing, while setting either threshold
    # stops glibc adapting both
    if mallopt(M_MMAP_THRESHOLD, MMAP_THRESHOLD) != 1:
        log.warning("host memory: glibc refused M_MMAP_THRESHOLD %d; left as it is", MMAP_THRESHOLD)
        return False
    if mallopt(M_TRIM_THRESHOLD, TRIM_THRESHOLD) != 1:  # glibc takes any value
        log.warning("host memory: glibc refused M_TRIM_THRESHOLD %d", TRIM_THRESHOLD)
    _applied = True
    log.log(
        logging.INFO if announce else logging.DEBUG,
        "host memory: freed memory is kept for reuse for the rest of the process (glibc "
        "M_MMAP_THRESHOLD %d MiB, M_TRIM_THRESHOLD %d MiB; glibc's defaults: "
        "trainer.reuse_host_memory=false in a process of its own)",
        MMAP_THRESHOLD // MIB,
        TRIM_THRESHOLD // MIB,
    )
    return True
