"""The clean room: `llmb run` judges from a process that has imported no plugin.

The process the user starts (the judge) never loads a plugin. It listens on a local socket with a random key and
starts the worker (a fresh interpreter: multiprocessing's spawn, or torch's launcher for a job), which imports the
selected plugin and trains. For each measured window the worker says it is ready; the judge reads its own clock,
draws a fresh challenge and hands it over; the worker draws the window's batch from it, trains, and answers with the
window's losses and the device-computed digest of the trained parameters; the judge reads its clock again on the
answer. The headline comes from those two readings, so nothing in the plugin's process (a patched clock, loop or
timer, fake device events) can shorten the window, and no work can start before the judge's clock does. The worker's
own figures stay in the record as information, checked against the judge's. The judge then replays the headline
window's first steps on the CPU (llmb.audit.evidence) before it writes the record. `llmb check-plugin` uses the same
worker (`serve`): the candidate is traced there and the reference is computed and compared here
(llmb.conformance.check).

This module is the judge's side; the worker's is llmb.run.clean_worker, which the judge names to the spawned process
and never imports; the verdict on a worker's record is llmb.judge.verdict's; what both sides share, llmb.judge.link.
"""

from __future__ import annotations

import importlib
import io
import multiprocessing
import os
import pickle
import queue
import secrets
import shutil
import signal
import tempfile
import threading
import time
from collections.abc import Callable, Iterator
from multiprocessing.connection import Listener, Pipe, wait
from typing import TYPE_CHECKING, Any, NoReturn

from llmb.api.errors import LlmbError, describe, message
from llmb.api.settings import env_flag
from llmb.audit import evidence
from llmb.judge.initial import InitialModels
from llmb.judge.link import ERRORS, KEY_ENV, error_line
from llmb.judge.replay import replay_device
from llmb.judge.verdict import (  # noqa: F401  (finish, JudgedWindow, installed_plugins: importable from here as before)
    AskedRuns,
    JudgedWindow,
    finish,
    installed_plugins,
    result_of,
)
from llmb.toolkit import host_memory

if TYPE_CHECKING:  # annotations only: the job launcher loads only when a job runs (see _launch_ranks)
    from multiprocessing.connection import Connection
    from multiprocessing.process import BaseProcess

    from llmb.api.protocols import RunProgress
    from llmb.distributed.job import LaunchSpec
    from llmb.records import Result

# What a window's seal may add to its answer: the digests at its two edges, and what they cover (a job's).
SEALED_KEYS = ("digest_start", "digest_end", "moments_end", "moments_projection", "digest_scope")
# The worker side, named and imported only in the worker's own process: this one imports no plugin, and nothing
# that runs one.
WORKER_MODULE = "llmb.run.clean_worker"
RUN_TASK = f"{WORKER_MODULE}.run_task"


def in_process() -> bool:
    """LLMB_IN_PROCESS=1: run and judge in this process (tests with plugins registered in memory); such a record
    says clean_room false and is never valid."""
    return env_flag("LLMB_IN_PROCESS")


class Judge:
    """The clean side of the link: serves one worker connection in a thread of the clean process."""

    clean = True

    def __init__(
        self,
        progress: RunProgress | None = None,
        notes: Callable[[str], None] | None = None,
        on_result: Callable[[object, list[JudgedWindow], float], None] | None = None,
        preparation: ReplayPreparation | None = None,
    ) -> None:
        self.key = secrets.token_bytes(32)
        # Called here with each result and its windows as it arrives, while the worker waits (the replay must not
        # share the CPU with the next measurement): `llmb run --precision all` keeps each precision at once.
        self.on_result = on_result
        # The judge's own work for the next run (llmb.judge.initial, the replay's initial model): begun as the worker
        # says it sets a run up (`setup()`), finished before it may start its warmup (`ready()`).
        self.preparation = preparation
        self.listener = Listener(("127.0.0.1", 0), authkey=self.key)
        self.progress = progress
        self.notes = notes or (lambda text: None)
        self.windows: list[JudgedWindow] = []
        self.results: list[tuple[dict | None, list[JudgedWindow], float]] = []
        # Each run's wall time on this clock: from the worker's start (or the run before's result) to its result.
        self.run_started = time.perf_counter()
        self.error: tuple[str, str] | None = None
        self.connected = threading.Event()
        self.finished = threading.Event()
        self.done = False  # the worker said it finished (its results and any error sent before)
        self.thread = threading.Thread(target=self._serve, name="llmb-judge", daemon=True)
        # Each result's on_result runs in the thread that waits on the worker (`keep_results`, serve's: the main
        # thread), handed over here with a wake-up on a pipe: a signal or the time limit then interrupts a replay
        # where it stands. Run in this thread, a replay went on inside torch while the interpreter exited, and the
        # process aborted ("terminate called without an active exception", exit 134, not 143 or 124).
        self.handoff: queue.Queue = queue.Queue()
        self.wake_reader, self.wake_writer = Pipe(duplex=False)

    @property
    def address(self) -> tuple[str, int]:
        return self.listener.address

    def start(self) -> Judge:
        self.thread.start()
        return self

    def _serve(self) -> None:
        try:
            connection = self.listener.accept()
        except OSError:
            return
        self.connected.set()
        with connection:
            while True:
                try:
                    done = self._handle(connection, receive(connection))
                except (EOFError, OSError):
                    break
                except Exception as exc:  # not plain data, or not a message of llmb's: the worker is not llmb's
                    detail = message(exc) if isinstance(exc, RefusedMessage) else describe(exc)
                    self.error = ("LlmbError", f"the worker process sent what llmb never sends ({detail})")
                    break
                if done:
                    break
        self.finished.set()

    def _handle(self, connection, message: tuple) -> bool:
        """One message from the worker; True when it is done."""
        kind = message[0]
        if kind == "open":
            opened = time.perf_counter()  # the clock starts before the challenge exists anywhere
            challenge = secrets.randbits(evidence.CHALLENGE_BITS)
            self.windows.append(JudgedWindow(challenge, opened))
            connection.send(("challenge", challenge))
        elif kind == "close":
            closed = time.perf_counter()
            # The seal's key exists only once the clock has stopped: the directions of the moments' projection.
            key = secrets.randbits(evidence.CHALLENGE_BITS)
            if self.windows and self.windows[-1].closed is None:
                self.windows[-1].closed = closed
                self.windows[-1].answer = message[1] if isinstance(message[1], dict) else {}
                self.windows[-1].seal_key = key
            connection.send(("seal_key", key))
        elif kind == "seal":
            # The digests of the window just closed; they come after its clock stopped, and only once.
            arrived = time.perf_counter()  # how long after the close: work before the seal is no clock's
            window = self.windows[-1] if self.windows else None
            sealed = isinstance(message[1], dict) and window is not None and window.closed is not None
            if sealed and "digest_end" not in window.answer:
                window.answer.update({k: message[1][k] for k in SEALED_KEYS if k in message[1]})
                window.sealed = arrived
        elif kind == "setup":
            if self.preparation is not None:
                self.preparation.setup(str(message[1]) if len(message) > 1 else "")
        elif kind == "ready":
            # The worker waits for this answer before its first warmup step: nothing of the judge's preparation runs
            # beside a step the run times.
            if self.preparation is not None:
                self.preparation.ready()
            connection.send(("go", None))
        elif kind == "phase" and self.progress is not None:
            self.progress.phase(str(message[1]), int(message[2]))
        elif kind == "advance" and self.progress is not None:
            self.progress.advance()
        elif kind == "note":
            self.notes(str(message[1]))
        elif kind == "result":
            windows, self.windows = self.windows, []
            run_seconds = time.perf_counter() - self.run_started
            self.results.append((message[1], windows, run_seconds))
            if self.on_result is not None:
                kept = threading.Event()
                self.handoff.put((message[1], windows, run_seconds, kept))
                self.wake_writer.send_bytes(b"result")
                kept.wait()  # never set where the waiting thread was interrupted: the worker is stopped then
            self.run_started = time.perf_counter()  # the next run's starts when this one is kept
            connection.send(("kept", None))
        elif kind == "error":
            self.error = (str(message[1]), str(message[2]))
        elif kind == "done":
            self.done = True
            return True
        return False

    def keep_results(self, worker: BaseProcess) -> None:
        """Until `worker` (a process) ends, run on_result here for each result it hands over, the worker waiting.
        Blocks on the worker's sentinel and the wake-up pipe: nothing wakes while a window runs."""
        while True:
            ready = wait([worker.sentinel, self.wake_reader])
            if self.wake_reader not in ready:
                return
            self.wake_reader.recv_bytes()
            result, windows, run_seconds, kept = self.handoff.get_nowait()
            try:
                self.on_result(result, windows, run_seconds)
            except Exception as exc:
                self.error = error_line(exc)
            kept.set()

    def close(self) -> None:
        self.listener.close()
        self.wake_reader.close()
        self.wake_writer.close()

    def exception(self) -> LlmbError | None:
        """The worker's error as the one-line exception it stands for, or None."""
        if self.error is None:
            return None
        kind, text = self.error
        return ERRORS.get(kind, LlmbError)(text)

    def raise_error(self) -> None:
        error = self.exception()
        if error is not None:
            raise error


class PlainUnpickler(pickle.Unpickler):
    """What the judge accepts from the worker: data that pickle builds without naming anything (None, booleans,
    numbers, strings, bytes, lists, tuples, dicts, sets). The worker is the plugin's process, and unpickling runs
    whatever callable a pickle names: a plugin that found the link could otherwise run code in the judge."""

    def find_class(self, module: str, name: str) -> NoReturn:
        raise pickle.UnpicklingError(f"{module}.{name} instead of plain data")


class RefusedMessage(ValueError):
    """What the worker sent is not a message of llmb's."""


def receive(connection: Connection) -> tuple:
    """One message from the worker, as plain data: a non-empty tuple (EOFError when the worker has gone)."""
    data = connection.recv_bytes()
    try:
        message = PlainUnpickler(io.BytesIO(data)).load()
    except Exception as exc:
        raise RefusedMessage(f"{type(exc).__name__}: {exc}") from None
    if not isinstance(message, tuple) or not message:
        raise RefusedMessage(f"a {type(message).__name__} instead of a message")
    return message


def start_worker(*args: Any) -> None:
    """The spawned worker's first call, in its own process: llmb.run.clean_worker.worker_main, imported there."""
    importlib.import_module(WORKER_MODULE).worker_main(*args)


def serve(
    task: Callable[..., Iterator[object]] | str,
    jobs: list,
    launch: LaunchSpec | None = None,
    progress: RunProgress | None = None,
    notes: Callable[[str], None] | None = None,
    on_result: Callable[[object, list[JudgedWindow], float], None] | None = None,
    preparation: ReplayPreparation | None = None,
) -> tuple[list, LlmbError | None]:
    """Run ``task`` over ``jobs`` in a worker judged from this process, which imports no plugin. Returns what the
    worker sent, each result with the windows the judge's clock timed for it, and the worker's error (one line), if
    it failed after them: the caller keeps what was finished before raising it. ``on_result(result, windows,
    run_seconds)`` is called as each result arrives (run_seconds: the run's wall time), the worker waiting;
    ``preparation`` (setup(), ready(), close()) is the judge's own work for each run, done while the worker sets the
    run up (see Judge), and closed before this returns."""

    if launch is not None and on_result is not None:
        raise ValueError("on_result is for a single worker: a launched job's results are kept after it ends")
    judge = Judge(progress, notes, on_result, preparation).start()
    try:
        if launch is not None:
            _launch_ranks(launch, task, jobs, judge)
        else:
            context = multiprocessing.get_context("spawn")
            worker = context.Process(
                target=start_worker, args=(task, jobs, judge.address, judge.key), name="llmb-worker"
            )
            oom_kills = host_memory.oom_kills()
            worker.start()
            try:
                judge.keep_results(worker)
                worker.join()
            except BaseException:
                # Interrupted here (a SIGINT sent to this process alone): the worker, which would train on to the
                # end of its window or its stalled setup, and keep this process waiting at exit, stops now. What
                # was finished was kept as it arrived (on_result).
                stop(worker)
                raise
            if not judge.connected.is_set() and worker.exitcode:
                raise LlmbError(f"the worker process exited with code {worker.exitcode} before it started")
        judge.finished.wait(timeout=30)
    finally:
        judge.close()
        if preparation is not None:
            preparation.close()  # its threads end before this process can: see InitialModels.close
    error = judge.exception()
    if error is None and judge.connected.is_set() and not judge.done:
        # Ended before it said it was done, without a word of its own (an error it meets is sent over the link
        # first): a signal, most often the kernel's out-of-memory killer, or an exit from inside a plugin. Never a
        # silent exit 0 with nothing measured. (A launched job's failed rank is the launcher's to name.)
        if launch is None:
            error = worker_death(worker.exitcode, oom_kills, host_memory.oom_kills())
        else:
            error = LlmbError("the job's rank 0 ended before it finished, without a result or an error")
    return judge.results, error


def stop(worker: BaseProcess, grace: float = 5.0) -> None:
    """End the worker process: SIGTERM, then SIGKILL if it is still there after `grace` seconds (a plugin may catch
    SIGTERM)."""
    worker.terminate()
    worker.join(grace)
    if worker.is_alive():
        worker.kill()
        worker.join()


def worker_death(exitcode: int, oom_kills_before: int | None, oom_kills_after: int | None) -> LlmbError:
    """The one-line error for a worker that ended before it finished and said nothing: by signal (SIGKILL while the
    host's out-of-memory kill count rose: out of memory, in words the sweep reads as such) or by its exit code."""
    if exitcode < 0:
        name = signal.Signals(-exitcode).name if -exitcode in signal.valid_signals() else f"signal {-exitcode}"
        rose = None not in (oom_kills_before, oom_kills_after) and oom_kills_after > oom_kills_before
        if -exitcode == signal.SIGKILL and rose:
            return LlmbError(
                "out of memory: the kernel's out-of-memory killer ended the worker process (SIGKILL) during the run; "
                "it needed more host memory than was free (a smaller batch size or preset fits)"
            )
        return LlmbError(f"the worker process was killed by {name} during the run, before it finished")
    return LlmbError(f"the worker process exited with code {exitcode} during the run, before it finished")


def _launch_ranks(launch, task, jobs: list, judge: Judge) -> None:
    """The job's ranks as commands (llmb.run.rank_worker), not functions: torch's launcher would unpickle a function's
    return value here, and a plugin in a rank can write to that queue. The jobs go in a file only this user can read,
    the key in the environment."""
    # Lazy: the job launcher, and the plugin registry it calls through, load only when the judge runs; importing the
    # judge loads none of the plugin machinery (tests/test_clean_boundaries.py).
    from llmb.distributed import job as distributed

    folder = tempfile.mkdtemp(prefix="llmb-jobs-")
    try:
        jobs_file = os.path.join(folder, "jobs.pickle")
        with open(jobs_file, "wb") as file:
            pickle.dump((task, jobs), file)
        host, port = judge.address
        os.environ[KEY_ENV] = judge.key.hex()
        try:
            distributed.launch_module(launch, "llmb.run.rank_worker", jobs_file, str(host), str(port))
        finally:
            os.environ.pop(KEY_ENV, None)
    finally:
        shutil.rmtree(folder, ignore_errors=True)


def run_clean(
    runs: list,
    launch: LaunchSpec | None = None,
    progress: RunProgress | None = None,
    notes: Callable[[str], None] | None = None,
    replay_steps: int = evidence.DEFAULT_REPLAY_STEPS,
    replay_whole: float = evidence.DEFAULT_REPLAY_WHOLE,
    replay_budget: float = evidence.DEFAULT_REPLAY_BUDGET,
) -> list[Result]:
    """Run each RunOptions in a worker judged from this process; returns the finished records (none on the other
    ranks of a torchrun job)."""
    records, error = run_clean_keeping(
        runs, launch, progress, notes, replay_steps, replay_whole=replay_whole, replay_budget=replay_budget
    )
    if error is not None:
        raise error
    return records


def run_clean_keeping(
    runs: list,
    launch: LaunchSpec | None = None,
    progress: RunProgress | None = None,
    notes: Callable[[str], None] | None = None,
    replay_steps: int = evidence.DEFAULT_REPLAY_STEPS,
    on_record: Callable[[Result], None] | None = None,
    on_pending: Callable[[Result], None] | None = None,
    replay_whole: float = evidence.DEFAULT_REPLAY_WHOLE,
    replay_budget: float = evidence.DEFAULT_REPLAY_BUDGET,
) -> tuple[list[Result], LlmbError | None]:
    """`run_clean` that also returns, judged, the records finished before the worker failed (`--precision all`: BF16
    failing must not lose the FP32 result already measured), with the failure for the caller to raise after saving.
    ``on_record(record)`` gets each judged record as soon as it exists: in a single worker, while the worker waits
    before its next run, so a run stopped later (a signal, a job's time limit) has kept the precisions before it.
    ``on_pending(record)`` gets it first, before its replay (finish), to keep while the replay runs (at the official
    shape a minute or more of the host's CPU and 23 GB of its memory)."""
    # Lazy: the job launcher, and the plugin registry it calls through, load only when the judge runs; importing the
    # judge loads none of the plugin machinery (tests/test_clean_boundaries.py).
    from llmb.distributed import job as distributed

    world = distributed.current_world()
    judged: list[Result] = []
    asked = AskedRuns(runs, launch, world)
    replays = replay_steps > 0 and (world is None or world.rank == 0)
    preparation = ReplayPreparation(asked) if replays else None

    def keep(result: object, windows: list[JudgedWindow], run_seconds: float) -> None:
        if result is None or (world is not None and world.rank != 0):
            return
        typed = result_of(result)
        initial = preparation.models if preparation is not None else None
        figures = asked.figures_for(typed.to_dict())
        record = finish(
            typed, windows, replay_steps, on_pending, figures, replay_whole, initial, run_seconds, replay_budget
        )
        judged.append(record)
        if on_record is not None:
            on_record(record)

    # A launched job's ranks go on together: rank 0 cannot wait for a replay while its peers wait in a collective.
    streamed = launch is None
    results, error = serve(RUN_TASK, runs, launch, progress, notes, keep if streamed else None, preparation)
    if not streamed:
        for result, windows, run_seconds in results:
            keep(result, windows, run_seconds)
    return judged, error


class ReplayPreparation:
    """The judge's preparation for `llmb run`: the replay's initial model, built from the next asked run's shape and
    seed while the worker sets that run up (llmb.judge.initial), where the replay runs on an accelerator.

    Not where it runs on the CPU: there the two builds share the same cores, so nothing is gained, and the load the
    judge's build leaves steers what the worker reads of the host (the cpu plugin's thread count and the busy-host
    check read the 1-minute load average). Measured on 2 cores, a 2-layer run at the official width and batch 1 fell
    from 39.7 to 31-33 tokens/s when the judge built beside it (the plugin then chose one thread). There the judge
    only warms torch's AdamW (its first imports torch._dynamo: 1.8 s on a 2-core Xeon, which a replay of the small
    preset paid inside its 3.4 s), a thread that starts after the plugin chose its threads (`setup`) and has ended
    before the busy-host check and the first warmup step (`ready`), and leaves no load behind (that check counts the
    threads running then)."""

    def __init__(self, asked: AskedRuns) -> None:
        self.asked = asked
        self.models = InitialModels()

    def worth(self, device: str) -> bool:
        """Whether a run on `device` (the worker's resolved device, as its `setup` names it) is replayed on an
        accelerator. A worker that names another device only moves the build to after its run, or beside it."""
        return replay_device(device).type != "cpu"

    def setup(self, device: str) -> None:
        if self.worth(device):
            options = self.asked.upcoming()
            self.models.start(options.config, options.seed)
        else:
            self.models.warm()

    def ready(self) -> float:
        return self.models.ready()

    def close(self) -> None:
        self.models.close()
