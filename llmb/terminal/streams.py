"""Where outside code's prints go while llmb's stdout carries data (the JSON of `plugins --json`, `peak --json`, the
auto-selection probe's answer): to stderr, from Python and from C alike."""

from __future__ import annotations

import contextlib
import ctypes
import os
import sys
from collections.abc import Iterator

STDOUT_FD, STDERR_FD = 1, 2


@contextlib.contextmanager
def stdout_to_stderr() -> Iterator[None]:
    """Everything written to stdout for the duration goes to stderr: Python's sys.stdout (print), and the process's
    file descriptor 1 where it has one, so a C library's printf or an os.write(1, ...) in a plugin cannot mix into
    llmb's data either. C stdio's buffers are flushed before descriptor 1 is given back: a printf without a newline
    would otherwise reach stdout at exit, after llmb's JSON."""
    _flush_python()
    saved = _descriptor_1_to_stderr()
    try:
        with contextlib.redirect_stdout(sys.stderr):
            yield
    finally:
        _flush_python()
        _flush_c_stdio()
        if saved is not None:
            os.dup2(saved, STDOUT_FD)
            os.close(saved)


def _descriptor_1_to_stderr() -> int | None:
    """A copy of descriptor 1, which now writes to stderr; None where the process has no such descriptors (closed)."""
    try:
        saved = os.dup(STDOUT_FD)
    except OSError:
        return None
    try:
        os.dup2(STDERR_FD, STDOUT_FD)
    except OSError:
        os.close(saved)
        return None
    return saved


def _flush_python() -> None:
    for stream in {id(s): s for s in (sys.stdout, sys.__stdout__, sys.stderr) if s is not None}.values():
        with contextlib.suppress(OSError, ValueError):  # a stream closed or without a file behind it
            stream.flush()


def _flush_c_stdio() -> None:
    with contextlib.suppress(Exception):  # no C library to ask (another platform): nothing buffered there to lose
        ctypes.CDLL(None).fflush(None)
