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

What the performance engineer's way gives, measured on a 2-core Xeon VM whose balloon reports freed guest pages to
the host (virtio-balloon free page reporting, so a page handed back and faulted in again is backed anew by the host):
tcmalloc or jemalloc (with its decay off) preloaded into the whole benchmark, both arms alike, ran small-preset batch
16 steps at 4.8-5.1 s with no faults after the second step, against 5.5-7.0 s, alternating, with glibc's defaults
(benchmarks/RESULTS.md section 19). Such an allocator replaces malloc for the whole process before Python starts, so
llmb states it (`malloc_library`) rather than sets it: whoever starts `llmb run` preloads it, and the worker, which
inherits the environment, runs on it.
"""

from __future__ import annotations

import ctypes
import ctypes.util
import os
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


def malloc_library(maps: str = "/proc/self/maps") -> str | None:
    """The file of the library whose ``malloc`` this process calls, where it is not the C library's own (an allocator
    preloaded with LD_PRELOAD: tcmalloc, jemalloc, mimalloc); None where it is the C library's, or where the OS does
    not say (no /proc). Read from the dynamic linker's answer, not from LD_PRELOAD's text: the name a process was
    started with proves nothing, the address ``malloc`` resolves to does."""
    try:
        default = ctypes.cast(ctypes.CDLL(None).malloc, ctypes.c_void_p).value
        libc = ctypes.CDLL(ctypes.util.find_library("c") or "libc.so.6")
        own = ctypes.cast(libc.malloc, ctypes.c_void_p).value
        if default is None or default == own:
            return None
        with open(maps) as lines:
            for line in lines:
                fields = line.split(maxsplit=5)
                low, high = (int(bound, 16) for bound in fields[0].split("-"))
                if low <= default < high and len(fields) == 6:
                    return os.path.realpath(fields[5].strip())
    except (OSError, AttributeError, ValueError):
        return None
    return "an unnamed mapping"


def keep_freed_memory(keep: bool = True) -> str:
    """Ask the C library to keep freed blocks for reuse (process-wide, from now on), or, with ``keep`` false after
    this process asked for it, to go back to glibc's documented defaults. Returns what the host allocator now does,
    in words for the record: KEPT, DEFAULT, a preloaded allocator (which glibc's mallopt does not reach), or why it
    could not (not glibc, or mallopt refused)."""
    global _kept_in_this_process
    preloaded = malloc_library()
    if preloaded is not None:
        said = f"{os.path.basename(preloaded)}, preloaded ({preloaded})"
        return f"{said}; keep_freed_memory not applied: glibc's mallopt does not reach it" if keep else said
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


def oom_kills(vmstat: str = "/proc/vmstat") -> int | None:
    """How many processes the kernel's out-of-memory killer has ended on this host since it booted (Linux's
    /proc/vmstat `oom_kill`, 4.13 and later); None where the OS does not say. A process ended by SIGKILL while this
    count rose was, in all likelihood, its victim: the one way to tell "out of memory" from any other SIGKILL
    without privileges (the kernel's log needs them)."""
    try:
        with open(vmstat) as lines:
            for line in lines:
                name, _, value = line.partition(" ")
                if name == "oom_kill":
                    return int(value)
    except (OSError, ValueError):
        return None
    return None
