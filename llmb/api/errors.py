"""Errors the CLI turns into one line on stderr and an exit code, never a traceback; and how any exception is said
in one line."""

from __future__ import annotations

import contextlib
import os
import signal
import subprocess
import sys
import threading
from collections.abc import Callable, Iterator

from llmb.spec.printable import one_line

# The longest value a message repeats whole: no number, name or choice llmb takes is longer.
LONGEST_SHOWN = 64


def shown(value: object) -> str:
    """A value from outside as a message repeats it: quoted (a string's repr, so a line break is \\n), whole where
    short, else its start and its length (a megabyte given as a batch size is not echoed back)."""
    text = repr(value) if isinstance(value, str) else text_of(value)  # an int of 5,000 digits has no str()
    length = len(value) if isinstance(value, str) else len(text)
    return text if len(text) <= LONGEST_SHOWN else f"{text[:LONGEST_SHOWN]}... ({length} characters)"


def text_of(value: object) -> str:
    """str(value), where outside code's __str__ (or a structure too deep to print) lets it be read; else a line
    saying it could not be, never the failure itself ending the command that shows it."""
    try:
        text = str(value)
    except Exception as inner:  # noqa: BLE001 - any failure of outside code's __str__
        return f"(a {type(value).__name__} whose text could not be read: {type(inner).__name__})"
    return text if isinstance(text, str) else f"(a {type(value).__name__})"


def message(exc: BaseException) -> str:
    """An exception's message (text_of: one whose __str__ raises is said as unreadable)."""
    return text_of(exc)


def first_line(exc: BaseException) -> str:
    """An exception's message, first line only (a traceback or a forged line never follows it): '' where it has none."""
    return (message(exc).strip().splitlines() or [""])[0]


def describe(exc: BaseException) -> str:
    """An exception as one line of data: its type's name and its message's first line ("KeyError: 'steps'")."""
    said = first_line(exc)
    return f"{type(exc).__name__}: {said}" if said else type(exc).__name__


class LlmbError(Exception):
    """A run failed (exit code 1)."""

    exit_code = 1


class UsageError(LlmbError):
    """The user asked for something that cannot be done (exit code 2)."""

    exit_code = 2


class PluginError(LlmbError):
    """A backend raised inside one of its methods; the message names the backend and the method."""

    def __init__(self, backend: str, method: str, error: BaseException) -> None:
        self.backend, self.method, self.error = backend, method, error
        super().__init__(f"backend {backend!r} failed in {method}: {describe(error)}")


class Terminated(KeyboardInterrupt):
    """SIGTERM (a job scheduler's time limit, `kill`), raised where the process is, as Ctrl-C's KeyboardInterrupt is."""


def _interrupt(signum: int) -> KeyboardInterrupt:
    """What a signal raises where the process is: Terminated for SIGTERM, KeyboardInterrupt for Ctrl-C."""
    return Terminated() if signum == signal.SIGTERM else KeyboardInterrupt()


@contextlib.contextmanager
def sigterm_raises() -> Iterator[None]:
    """SIGTERM raises Terminated in the main thread for the duration: the process unwinds instead of dying where it
    stands, so every `finally` on the way out runs (a worker process is stopped, a file being written is removed, what
    was finished stays) and the command can say in one line why it ended. Elsewhere than the main thread, where no
    handler can be set, SIGTERM is left as it is."""
    with _raising([signal.SIGTERM], []):
        yield


@contextlib.contextmanager
def interrupts_remembered() -> Iterator[Callable[[], None]]:
    """SIGTERM raises Terminated and Ctrl-C KeyboardInterrupt, as outside, and each is remembered; the check yielded
    raises a remembered one again. CPython drops an exception raised inside a finalizer (a __del__, a weakref
    callback, a generator the collector closes: "Exception ignored in ...") and the process goes on as if no signal
    came, so a loop of long steps (a sweep's trials) calls the check before and after each step: an interrupt the
    interpreter lost stops it there. SIGINT is taken only from Python's own handler: an ignored one (nohup, a
    shell's background job) stays ignored. Elsewhere than the main thread nothing is set and the check never raises."""
    received: list[int] = []

    def check() -> None:
        if received:
            raise _interrupt(received[0])

    numbers = [signal.SIGTERM]
    if signal.getsignal(signal.SIGINT) is signal.default_int_handler:
        numbers.append(signal.SIGINT)
    with _raising(numbers, received):
        yield check


@contextlib.contextmanager
def _raising(numbers: list[int], received: list[int]) -> Iterator[None]:
    """Each of ``numbers`` appends itself to ``received`` and raises its _interrupt in the main thread for the
    duration; the handlers before are put back after. Elsewhere than the main thread nothing is set."""

    def handler(signum, frame):
        received.append(signum)
        raise _interrupt(signum)

    if threading.current_thread() is not threading.main_thread():
        yield
        return
    previous = {number: signal.signal(number, handler) for number in numbers}
    try:
        yield
    finally:
        for number, was in previous.items():
            signal.signal(number, was)


class TimeLimitReached(KeyboardInterrupt):
    """A command ran past the time it was given (`llmb run --time-limit`, the sweep's own calls into a plugin under
    --trial-timeout): raised in the main thread where the process is, as Terminated is, so every `finally` on the way
    out runs (a worker process is stopped, what was judged before stays saved). Its message is the one line said."""

    exit_code = 124  # as coreutils' timeout(1) exits when its command timed out


# How long past its limit a command goes on when the limit cannot reach its main thread (a call into C that does not
# return, or one that blocks SIGALRM) before it is ended where it stands: long enough that a slow but finite call
# (one large GEMM on a CPU at the official shape takes tens of seconds) returns and unwinds cleanly first.
HUNG_GRACE_SECONDS = 30.0


@contextlib.contextmanager
def time_limit(seconds: float | None, said: str) -> Iterator[None]:
    """Raise TimeLimitReached(``said``) in the main thread once ``seconds`` of wall time have passed (None, 0 or
    less: no limit), so every `finally` on the way out runs. Where the main thread does not come back to Python
    within HUNG_GRACE_SECONDS more (a plugin hung inside a C call that never returns, or with SIGALRM blocked), a
    watchdog thread ends the process: the worker processes it started are killed, ``said`` is the one line, exit 124.
    Records judged before are saved already (written whole, atomically). A C call that also holds the GIL stops the
    watchdog too (no Python runs in the process at all): for it a process of its own (llmb/api/last_resort.py,
    started here, waiting on a pipe) says the same line HUNG_GRACE_SECONDS later still, kills the worker processes
    and then the command (SIGKILL, exit 137). Elsewhere than the main thread (llmb as a library, in a thread), or
    without setitimer, no limit is set."""
    main = threading.current_thread() is threading.main_thread()
    if not seconds or seconds <= 0 or not main or not hasattr(signal, "setitimer"):
        yield
        return
    last_resort = _start_last_resort(seconds + 2 * HUNG_GRACE_SECONDS, said)
    try:  # from here on, however the block is left (an interrupt while the limit is set up too), the last resort goes
        watchdog = threading.Timer(seconds + HUNG_GRACE_SECONDS, _end_hung_process, args=(said, last_resort))
        watchdog.daemon = True

        def handler(signum: int, frame: object) -> None:
            # The main thread is back in Python: it unwinds, every `finally` runs, however long that takes.
            watchdog.cancel()
            _stop(last_resort)
            raise TimeLimitReached(said)

        previous = signal.signal(signal.SIGALRM, handler)
        try:
            signal.setitimer(signal.ITIMER_REAL, seconds)
            watchdog.start()
            yield
        finally:
            watchdog.cancel()
            signal.setitimer(signal.ITIMER_REAL, 0)
            signal.signal(signal.SIGALRM, previous)
    finally:
        _stop(last_resort)


def _start_last_resort(seconds: float, said: str) -> subprocess.Popen | None:
    """llmb/api/last_resort.py, waiting ``seconds`` on a pipe from this process: by path, with site and the
    environment ignored (-S -I: the standard library only, started in milliseconds), in a session of its own (a
    Ctrl-C at the terminal is this process's to handle, not its). None where it cannot be started: the limit and the
    watchdog still hold."""
    line = (
        f"error: {one_line(said)} (its main thread held the interpreter {2 * HUNG_GRACE_SECONDS:g} s more, inside a "
        "call that did not return; killed)"
    )
    script = os.path.join(os.path.dirname(os.path.abspath(__file__)), "last_resort.py")
    try:
        return subprocess.Popen(
            [sys.executable, "-S", "-I", script, f"{seconds:.3f}", line],
            stdin=subprocess.PIPE,
            stdout=subprocess.DEVNULL,
            start_new_session=True,
        )
    except OSError:
        return None


def _stop(last_resort: subprocess.Popen | None) -> None:
    if last_resort is not None:
        last_resort.kill()
        last_resort.wait()
        last_resort.stdin.close()


def _end_hung_process(said: str, last_resort: subprocess.Popen | None = None) -> None:
    """The watchdog's end of a process whose main thread is hung: no `finally` can run, so what it would stop is
    stopped here (the last resort, the worker processes started through multiprocessing), then one line and exit
    124 at once."""
    import multiprocessing  # lazy: loaded by the process that started workers already; llmb.api stays light

    if last_resort is not None:
        last_resort.kill()
    for child in multiprocessing.active_children():
        child.kill()
    sys.stderr.write(
        f"error: {one_line(said)} (its main thread was hung {HUNG_GRACE_SECONDS:g} s more, inside a call that did not "
        "return; ended there)\n"
    )
    sys.stderr.flush()
    os._exit(TimeLimitReached.exit_code)
