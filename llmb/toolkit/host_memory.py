"""Host memory for training on the CPU: keep what a step frees for the next step instead of handing it back.

PyTorch's CPU allocator is the C library's malloc. glibc serves every block above its mmap threshold (32 MiB at most)
with a fresh mmap and unmaps it on free, so every step's large tensors (activations, logits, gradients) come back
from the kernel as new pages: faulted in one 4 KiB page at a time and zeroed. Measured on a 2-core EPYC VM
(benchmarks/RESULTS.md section 18), that kernel time was 38% of a small-preset step at batch 64 (4.5 million faults,
21 of 55 s); a performance engineer would preload jemalloc or tcmalloc, which a plugin cannot do for a process that
is already running. `keep_freed_memory` asks glibc (mallopt) for the same effect: no mmap for large blocks, and no
trimming of the heap's top below 2 GiB, so the steady state reuses the first steps' pages. What it costs: the
process keeps its freed blocks, so its resident memory (the cpu plugin's peak memory) is higher than without it, and
it need not settle: torch asks for aligned blocks (posix_memalign), which a freed block of exactly the same size cannot
hold once a small allocation has taken its neighbour, so such a block grows the heap again. By hand the heap settled
(batch 16: 4.5 GB); in llmb's loop, which allocates between steps too, it grew on (3.6 -> 7.1 GB over 9 steps). Hence
the cpu plugin's `keep_freed_memory` setting is off by default.
"""

from __future__ import annotations

import ctypes
import ctypes.util
import platform

# glibc's mallopt parameters (malloc.h) and its documented defaults (mallopt(3)).
M_TRIM_THRESHOLD = -1
M_MMAP_MAX = -4
DEFAULT_TRIM_THRESHOLD_BYTES = 128 * 1024
DEFAULT_MMAP_MAX = 65536
# The largest trim threshold mallopt takes (an int): the heap's top is handed back only past 2 GiB free.
TRIM_THRESHOLD_BYTES = 2**31 - 1

KEPT = "glibc malloc, freed memory kept (mallopt: M_MMAP_MAX=0, M_TRIM_THRESHOLD=2 GiB)"
DEFAULT = "the C library's defaults"
_kept_in_this_process = False


def keep_freed_memory(keep: bool = True) -> str:
    """Ask the C library to keep freed blocks for reuse (process-wide, from now on), or, with ``keep`` false after
    this process asked for it, to go back to glibc's documented defaults. Returns what the host allocator now does,
    in words for the record: KEPT, DEFAULT, or why it could not (not glibc, or mallopt refused)."""
    global _kept_in_this_process
    if not keep and not _kept_in_this_process:
        return DEFAULT
    library, _ = platform.libc_ver()
    if library != "glibc":
        return f"{DEFAULT}: the C library is {library or 'not glibc'}, and only glibc's mallopt is known here"
    libc = ctypes.CDLL(ctypes.util.find_library("c") or "libc.so.6")
    mmap_max, trim = (0, TRIM_THRESHOLD_BYTES) if keep else (DEFAULT_MMAP_MAX, DEFAULT_TRIM_THRESHOLD_BYTES)
    # mallopt returns 1 on success, 0 on error.
    if libc.mallopt(M_MMAP_MAX, mmap_max) != 1 or libc.mallopt(M_TRIM_THRESHOLD, trim) != 1:
        return f"{DEFAULT}: glibc's mallopt refused M_MMAP_MAX={mmap_max} or M_TRIM_THRESHOLD={trim}"
    _kept_in_this_process = keep
    return KEPT if keep else DEFAULT
