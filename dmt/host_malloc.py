"""Host memory that a training process frees between steps, kept for the next step (glibc).

A training step allocates the same tensors every step and frees them at its end. glibc's
``malloc`` adapts two thresholds as it goes: allocations above ``M_MMAP_THRESHOLD`` get their own
mapping, returned at ``free``, and free memory above ``M_TRIM_THRESHOLD`` at the top of the heap
goes back to the system. Both start small (128 KiB) and rise with the largest chunk freed so far
(the trim threshold to twice it), so a step whose temporaries add up to more than twice its
largest one returns memory every step and takes it back in the next, page fault by page fault,
each page zeroed by the kernel. Measured on dmt's DLRM at batch 512 on one CPU thread (the
configuration of ``benchmarks/bench_torchrec_dlrm.py``): about 1,200-1,900 minor page faults
per step, and 8 with :func:`reuse_host_memory`, whose step is about 1.1x as fast.

:func:`reuse_host_memory` fixes both thresholds (``mallopt``, which also stops their adaptation):
allocations below :data:`MMAP_THRESHOLD` come from the heap, and up to :data:`TRIM_THRESHOLD` of
free memory stays there. The process then keeps about its peak host memory until it ends. The
setting is the process's, as ``MALLOC_MMAP_THRESHOLD_`` / ``MALLOC_TRIM_THRESHOLD_`` in the
environment would make it; ``dmt-train`` applies it unless ``trainer.reuse_host_memory=false``.
Another C library (macOS, musl) or another allocator preloaded (jemalloc, tcmalloc: they keep
freed memory themselves) is left as it is.
"""

from __future__ import annotations

import ctypes
import logging

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


def reuse_host_memory() -> bool:
    """Fix glibc's ``M_MMAP_THRESHOLD`` and ``M_TRIM_THRESHOLD`` at :data:`MMAP_THRESHOLD` and
    :data:`TRIM_THRESHOLD` for this process (see the module). Returns whether glibc took both;
    ``False`` where the C library has no ``mallopt`` (nothing changes)."""
    try:
        mallopt = ctypes.CDLL(None).mallopt
    except (OSError, AttributeError):
        log.debug("no mallopt in this process's C library: host memory is managed as it is")
        return False
    mallopt.argtypes = [ctypes.c_int, ctypes.c_int]
    mallopt.restype = ctypes.c_int
    # the trim threshold first: setting either stops glibc adapting both
    taken = mallopt(M_TRIM_THRESHOLD, TRIM_THRESHOLD) == 1
    taken = mallopt(M_MMAP_THRESHOLD, MMAP_THRESHOLD) == 1 and taken
    if taken:
        log.info(
            "host memory: freed memory is kept for reuse (glibc M_MMAP_THRESHOLD %d MiB, "
            "M_TRIM_THRESHOLD %d MiB; trainer.reuse_host_memory=false keeps glibc's defaults)",
            MMAP_THRESHOLD // MIB,
            TRIM_THRESHOLD // MIB,
        )
    else:
        log.warning("host memory: the C library's mallopt refused dmt's thresholds; left as is")
    return taken
