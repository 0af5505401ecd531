"""The clean room: `llmb run` judges from a process that has imported no plugin.

The process the user starts (the judge) never loads a plugin. It listens on a local socket with a random key and
starts the worker (a fresh interpreter: multiprocessing's spawn, or torch's launcher for a job), which imports the
selected plugin and trains. For each measured window the worker says it is ready; the judge reads its own clock,
draws a fresh challenge and hands it over; the worker draws the window's batch from it, trains, and answers with the
window's losses and the device-computed digest of the trained parameters; the judge reads its clock again on the
answer. The headline comes from those two readings, so nothing in the plugin's process (a patched clock, loop or
timer, fake device events) can shorten the window, and no work can start before the judge's clock does. The worker's
own figures stay in the record as information, checked against the judge's. The judge then replays the headline
window's first steps on the CPU (llmb.evidence) before it writes the record. `llmb check-plugin` uses the same
worker (`serve`): the candidate is traced there and the reference is computed and compared here (llmb.conformance).
"""

from __future__ import annotations

import contextlib
import io
import json
import math
import multiprocessing
import os
import pickle
import secrets
import shutil
import signal
import sys
import tempfile
import threading
import time
from collections.abc import Iterator
from dataclasses import dataclass, field
from multiprocessing.connection import Client, Listener

from llmb import energy, evidence, flops
from llmb.errors import LlmbError, UsageError
from llmb.records import RecordError, Result, median_index

# perf_counter is CLOCK_MONOTONIC, one clock for every process of the host: the worker's window must lie inside the
# judge's. Slack for the two clock reads' own granularity.
NESTING_SLACK_SECONDS = 1e-4
KEY_ENV = "LLMB_JUDGE_KEY"  # how the judge's key reaches a job's ranks (llmb.rank_worker)
_ERRORS = {"UsageError": UsageError, "LlmbError": LlmbError}
# What a window's seal may add to its answer: the digests at its two edges, and what they cover (a job's).
SEALED_KEYS = ("digest_start", "digest_end", "moments_end", "digest_scope")


def in_process() -> bool:
    """LLMB_IN_PROCESS=1: run and judge in this process (tests with plugins registered in memory); such a record
    says clean_room false and is never valid."""
    return os.environ.get("LLMB_IN_PROCESS") == "1"


def installed_plugins() -> list[dict]:
    """Every installed llmb plugin with its distribution and version, read from metadata (nothing is imported):
    llmb.plugins.installed, the one list of installed plugins."""
    from llmb.plugins import installed_records

    return installed_records()


@dataclass
class JudgedWindow:
    challenge: int
    opened: float
    closed: float | None = None
    answer: dict = field(default_factory=dict)

    @property
    def seconds(self) -> float:
        return (self.closed or math.nan) - self.opened


class Judge:
    """The clean side of the link: serves one worker connection in a thread of the clean process."""

    clean = True

    def __init__(self, progress=None, notes=None, on_result=None) -> None:
        self.key = secrets.token_bytes(32)
        # Called here with each result and its windows as it arrives, while the worker waits (the replay must not
        # share the CPU with the next measurement): `llmb run --precision all` keeps each precision at once.
        self.on_result = on_result
        self.listener = Listener(("127.0.0.1", 0), authkey=self.key)
        self.progress = progress
        self.notes = notes or (lambda text: None)
        self.windows: list[JudgedWindow] = []
        self.results: list[tuple[dict | None, list[JudgedWindow]]] = []
        self.error: tuple[str, str] | None = None
        self.connected = threading.Event()
        self.finished = threading.Event()
        self.thread = threading.Thread(target=self._serve, name="llmb-judge", daemon=True)

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
                    detail = str(exc) if isinstance(exc, RefusedMessage) else f"{type(exc).__name__}: {exc}"
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
            if self.windows and self.windows[-1].closed is None:
                self.windows[-1].closed = closed
                self.windows[-1].answer = message[1] if isinstance(message[1], dict) else {}
        elif kind == "seal":
            # The digests of the window just closed; they come after its clock stopped, and only once.
            window = self.windows[-1] if self.windows else None
            sealed = isinstance(message[1], dict) and window is not None and window.closed is not None
            if sealed and "digest_end" not in window.answer:
                window.answer.update({k: message[1][k] for k in SEALED_KEYS if k in message[1]})
        elif kind == "phase" and self.progress is not None:
            self.progress.phase(str(message[1]), int(message[2]))
        elif kind == "advance" and self.progress is not None:
            self.progress.advance()
        elif kind == "note":
            self.notes(str(message[1]))
        elif kind == "result":
            windows, self.windows = self.windows, []
            self.results.append((message[1], windows))
            if self.on_result is not None:
                try:
                    self.on_result(message[1], windows)
                except Exception as exc:
                    self.error = error_line(exc)
            connection.send(("kept", None))
        elif kind == "error":
            self.error = (str(message[1]), str(message[2]))
        elif kind == "done":
            return True
        return False

    def close(self) -> None:
        self.listener.close()

    def exception(self) -> LlmbError | None:
        """The worker's error as the one-line exception it stands for, or None."""
        if self.error is None:
            return None
        kind, text = self.error
        return _ERRORS.get(kind, LlmbError)(text)

    def raise_error(self) -> None:
        error = self.exception()
        if error is not None:
            raise error


class PlainUnpickler(pickle.Unpickler):
    """What the judge accepts from the worker: data that pickle builds without naming anything (None, booleans,
    numbers, strings, bytes, lists, tuples, dicts, sets). The worker is the plugin's process, and unpickling runs
    whatever callable a pickle names: a plugin that found the link could otherwise run code in the judge."""

    def find_class(self, module: str, name: str):
        raise pickle.UnpicklingError(f"{module}.{name} instead of plain data")


class RefusedMessage(ValueError):
    """What the worker sent is not a message of llmb's."""


def receive(connection) -> tuple:
    """One message from the worker, as plain data: a non-empty tuple (EOFError when the worker has gone)."""
    data = connection.recv_bytes()
    try:
        message = PlainUnpickler(io.BytesIO(data)).load()
    except Exception as exc:
        raise RefusedMessage(f"{type(exc).__name__}: {exc}") from None
    if not isinstance(message, tuple) or not message:
        raise RefusedMessage(f"a {type(message).__name__} instead of a message")
    return message


class Link:
    """The worker's side: the judge's window edges, and the run's progress, notes, records and errors."""

    clean = True

    def __init__(self, address, key: bytes) -> None:
        self.connection = Client(tuple(address), authkey=key)

    def open(self, digest_start: list[list[float]]) -> int:
        self.connection.send(("open", None))
        kind, challenge = self.connection.recv()
        if kind != "challenge":
            raise LlmbError("the judge answered out of turn")
        return int(challenge)

    def close(self, answer: dict) -> None:
        self.connection.send(("close", answer))

    def seal(self, evidence: dict) -> None:
        """The window's digests, computed after the judge's clock stopped (llmb.train.Trainer.measure)."""
        self.connection.send(("seal", evidence))

    def send(self, *message) -> None:
        self.connection.send(message)

    def result(self, result: object) -> None:
        """Hand a finished result over and wait while the judge keeps it (replays and saves it)."""
        self.connection.send(("result", result))
        kind, _ = self.connection.recv()
        if kind != "kept":
            raise LlmbError("the judge answered out of turn")


class LinkProgress:
    """runner.Progress over the link, so the clean process draws the worker's progress."""

    def __init__(self, link: Link) -> None:
        self.link = link

    def phase(self, name: str, total: int) -> None:
        self.link.send("phase", name, total)

    def advance(self) -> None:
        self.link.send("advance")

    def note(self, text: str) -> None:
        self.link.send("note", text)


def worker_main(task, jobs: list, address, key: bytes, every_rank: bool = True) -> list | None:
    """The worker: the only process that imports a plugin. Sends what ``task(jobs, link, world)`` yields to the
    judge (and any error, as one line). ``task`` is a module-level function of llmb: run_task for `llmb run`,
    conformance.candidate_task for `llmb check-plugin`."""
    from llmb import distributed

    _die_with_parent()
    world = distributed.current_world()
    talks = every_rank or world is None or world.rank == 0
    link = Link(address, key) if talks else None
    try:
        for result in task(jobs, link, world):
            if link is not None:
                link.result(result)
    except BaseException as exc:
        if link is not None:
            link.send("error", *error_line(exc))
        if world is not None and not every_rank:
            raise  # torch's launcher (llmb.rank_worker) reports which rank failed
        # A worker of its own judge (a plain run, or each rank of an srun job) has told the judge, which prints the
        # one line: raising would only add multiprocessing's traceback.
        return None
    finally:
        if link is not None:
            link.send("done")
        if not every_rank:
            distributed.shutdown()
    return None


def run_task(runs: list, link: Link | None, world) -> Iterator:
    """`llmb run`'s work in the worker: each RunOptions trained, its windows judged through the link."""
    from llmb import runner

    for options in expand_all(runs, link):
        progress = LinkProgress(link) if link is not None and (world is None or world.rank == 0) else None
        record = runner.run(options, progress, judge=link)
        # Plain data, as the record file will hold it (str subclasses such as torch's version become str): the judge
        # loads nothing else.
        yield json.loads(json.dumps(record.to_dict())) if record is not None else None


def _die_with_parent() -> None:
    """Linux: the worker gets SIGKILL when the judging process dies, so no orphan keeps the device busy."""
    if sys.platform.startswith("linux"):
        with contextlib.suppress(Exception):
            import ctypes

            ctypes.CDLL(None).prctl(1, int(signal.SIGKILL))  # PR_SET_PDEATHSIG


def error_line(exc: BaseException) -> tuple[str, str]:
    if isinstance(exc, UsageError):
        return "UsageError", str(exc)
    if isinstance(exc, LlmbError):
        return "LlmbError", str(exc)
    if isinstance(exc, KeyboardInterrupt):
        return "LlmbError", "interrupted"
    first = (str(exc).strip().splitlines() or [""])[0]
    return "LlmbError", f"{type(exc).__name__}: {first}"


def expand_all(runs: list, link: Link | None) -> list:
    """`--precision all` becomes one run per precision the plugin supports (asked here, in the worker)."""
    from dataclasses import replace

    from llmb.names import ALL_PRECISIONS, expand_precision
    from llmb.plugins import select_backend

    expanded = []
    for options in runs:
        if options.precision != ALL_PRECISIONS:
            expanded.append(options)
            continue
        wanted, unsupported = expand_precision(options.precision, select_backend(options.plugin).backend.precisions())
        for name in unsupported if link is not None else []:
            link.send("note", f"{name}: unsupported by this plugin")
        expanded += [replace(options, precision=name) for name in wanted]
    return expanded


def serve(task, jobs: list, launch=None, progress=None, notes=None, on_result=None) -> tuple[list, LlmbError | None]:
    """Run ``task`` over ``jobs`` in a worker judged from this process, which imports no plugin. Returns what the
    worker sent, each result with the windows the judge's clock timed for it, and the worker's error (one line), if
    it failed after them: the caller keeps what was finished before raising it. ``on_result(result, windows)`` is
    called as each result arrives, the worker waiting (see Judge)."""

    judge = Judge(progress, notes, on_result).start()
    try:
        if launch is not None:
            _launch_ranks(launch, task, jobs, judge)
        else:
            context = multiprocessing.get_context("spawn")
            worker = context.Process(
                target=worker_main, args=(task, jobs, judge.address, judge.key), name="llmb-worker"
            )
            worker.start()
            worker.join()
            if not judge.connected.is_set() and worker.exitcode:
                raise LlmbError(f"the worker process exited with code {worker.exitcode} before it started")
        judge.finished.wait(timeout=30)
    finally:
        judge.close()
    return judge.results, judge.exception()


def _launch_ranks(launch, task, jobs: list, judge: Judge) -> None:
    """The job's ranks as commands (llmb.rank_worker), not functions: torch's launcher would unpickle a function's
    return value here, and a plugin in a rank can write to that queue. The jobs go in a file only this user can
    read, the key in the environment."""
    from llmb import distributed

    folder = tempfile.mkdtemp(prefix="llmb-jobs-")
    try:
        jobs_file = os.path.join(folder, "jobs.pickle")
        with open(jobs_file, "wb") as file:
            pickle.dump((task, jobs), file)
        host, port = judge.address
        os.environ[KEY_ENV] = judge.key.hex()
        try:
            distributed.launch_module(launch, "llmb.rank_worker", jobs_file, str(host), str(port))
        finally:
            os.environ.pop(KEY_ENV, None)
    finally:
        shutil.rmtree(folder, ignore_errors=True)


def run_clean(
    runs: list,
    launch=None,
    progress=None,
    notes=None,
    replay_steps: int = evidence.DEFAULT_REPLAY_STEPS,
    replay_whole: float = evidence.DEFAULT_REPLAY_WHOLE,
):
    """Run each RunOptions in a worker judged from this process; returns the finished records (none on the other
    ranks of a torchrun job)."""
    records, error = run_clean_keeping(runs, launch, progress, notes, replay_steps, replay_whole=replay_whole)
    if error is not None:
        raise error
    return records


def run_clean_keeping(
    runs: list,
    launch=None,
    progress=None,
    notes=None,
    replay_steps: int = evidence.DEFAULT_REPLAY_STEPS,
    on_record=None,
    on_pending=None,
    replay_whole: float = evidence.DEFAULT_REPLAY_WHOLE,
) -> tuple[list[dict], LlmbError | None]:
    """`run_clean` that also returns, judged, the records finished before the worker failed (`--precision all`: BF16
    failing must not lose the FP32 result already measured), with the failure for the caller to raise after saving.
    ``on_record(record)`` gets each judged record as soon as it exists: in a single worker, while the worker waits
    before its next run, so a run stopped later (a signal, a job's time limit) has kept the precisions before it.
    ``on_pending(record)`` gets it first, before its replay (finish), to keep while the replay runs (at the official
    shape a minute or more of the host's CPU and 23 GB of its memory)."""
    from llmb import distributed

    world = distributed.current_world()
    judged: list[dict] = []
    asked = AskedRuns(runs, launch, world)

    def keep(result: object, windows: list[JudgedWindow]) -> None:
        if result is None or (world is not None and world.rank != 0):
            return
        typed = _result(result)
        record = finish(typed, windows, replay_steps, on_pending, asked.figures_for(typed.to_dict()), replay_whole)
        judged.append(record)
        if on_record is not None:
            on_record(record)

    # A launched job's ranks go on together: rank 0 cannot wait for a replay while its peers wait in a collective.
    streamed = launch is None
    results, error = serve(run_task, runs, launch, progress, notes, keep if streamed else None)
    if not streamed:
        for result, windows in results:
            keep(result, windows)
    return judged, error


class AskedRuns:
    """What the judge asked the worker for, run by run: the figures a headline is made of are the judge's own (the
    options it sent, the job it launched), never fields of the worker's record. `--precision all` is one request
    that the worker answers with one record per precision the plugin supports, in llmb's order."""

    def __init__(self, runs: list, launch=None, world=None) -> None:
        self.runs = list(runs)
        if launch is not None:
            self.world_size, self.nodes, self.job = launch.nproc_per_node * launch.nnodes, launch.nnodes, True
        elif world is not None:
            self.world_size, self.nodes, self.job = world.world_size, world.nodes, True
        else:
            self.world_size, self.nodes, self.job = 1, 1, False
        self.index = 0
        self.last_precision: str | None = None

    def figures_for(self, record: dict) -> dict:
        """The judge's figures for the next record the worker sent."""
        from llmb import precision

        options = self.runs[min(self.index, len(self.runs) - 1)]
        got = str((record.get("precision") or {}).get("requested"))
        if options.precision == "ALL":
            order = list(precision.PRECISIONS)
            earlier = self.last_precision is not None and (
                got not in order or order.index(got) <= order.index(self.last_precision)
            )
            if earlier and self.index + 1 < len(self.runs):  # this ALL request is answered; the next one starts
                self.index += 1
                self.last_precision = None
                return self.figures_for(record)
            self.last_precision = got
            requested = got if got in order else None  # None: any benchmark precision, the worker's choice
        else:
            requested = options.precision
            self.index += 1
        return judge_figures(options, requested, self.world_size, self.nodes, self.job)


def judge_figures(options, requested: str | None, world_size: int, nodes: int, job: bool) -> dict:
    """The figures of one asked run, from the options and the job's size alone (`requested` None: `--precision
    all` asked for whichever benchmark precision the worker ran)."""
    from llmb.config import official_reasons

    dp = world_size // max(1, options.tp * options.pp)
    microbatches = options.microbatches or math.gcd(options.pp, options.batch_size)
    return {
        "steps": options.steps,
        "repeats": options.repeats,
        "warmup_steps": options.warmup_steps,
        "batch_size": options.batch_size,
        "seed": options.seed,
        "preset": options.preset,
        "config": options.config.to_dict(),
        "official": not official_reasons(options.config),
        "world_size": world_size,
        "nodes": nodes,
        # Each data-parallel rank trains batch_size x grad_accum sequences a step; tensor and pipeline peers add none.
        "global_batch_size": options.batch_size * options.grad_accum * dp,
        "tp": options.tp,
        "pp": options.pp,
        "dp": dp,
        "grad_accum": options.grad_accum,
        "microbatches": microbatches,
        "parallel": (options.parallel if options.parallel not in (None, "none") else "ddp") if job else "none",
        "precision": requested,
        "mode": options.mode,
        # The FLOPs a token costs, from the shape the judge asked for (flops.parameter_count, tested against the
        # model itself): the record's TFLOP/s, MFU and matmul-peak efficiency never rest on the worker's count.
        "model_flops_per_token": flops.model_flops_per_token(options.config),
    }


# The record's fields that the judge's own figures replace once compared (figure_problems): the headline, its FLOPs
# and the replay are made of these. The layout's are replaced inside the record's layout too.
JUDGED_LAYOUT = ("world_size", "tp", "pp", "dp", "grad_accum", "microbatches", "nodes")
JUDGED_FIELDS = (
    *("steps", "repeats", "batch_size", "seed", "global_batch_size", "parallel", "model_flops_per_token"),
    *JUDGED_LAYOUT,
)


def figure_problems(record: dict, asked: dict) -> list[str]:
    """Every field of the worker's record that disagrees with what the judge asked for, named."""
    layout = record.get("layout") or {}
    said = {
        **{key: record.get(key) for key in ("steps", "repeats", "warmup_steps", "batch_size", "seed", "preset")},
        "config": record.get("config"),
        "official": record.get("official"),
        "global_batch_size": record.get("global_batch_size"),
        **{key: record.get(key) for key in JUDGED_LAYOUT},
        "parallel": record.get("parallel"),
        "precision": (record.get("precision") or {}).get("requested"),
        "mode": (record.get("precision") or {}).get("mode"),
        "model_flops_per_token": record.get("model_flops_per_token"),
    }
    for key in JUDGED_LAYOUT:
        if key in layout:
            said[f"layout.{key}"] = layout[key]
            asked = {**asked, f"layout.{key}": asked[key]}
    problems = []
    for key, value in said.items():
        expected = asked[key]
        if key == "precision" and expected is None:
            continue  # --precision all: the precision is the worker's choice among the benchmark's
        if value != expected:
            problems.append(f"judge: the worker's record says {key} {value!r}; the judge asked for {expected!r}")
    return problems


def _result(record: object) -> Result:
    """The worker's record as a typed Result, checked field by field: it comes from the plugin's process."""
    try:
        return Result.from_dict(record)
    except (RecordError, TypeError, ValueError) as exc:
        raise LlmbError(f"the worker process sent a malformed result: {exc}") from None


# The reason a record saved before its replay carries until the replay's verdict replaces it.
REPLAY_PENDING = (
    "replay: not finished (the run stopped while the judge replayed its window): the run's function is unchecked"
)


def finish(
    record: dict,
    windows: list[JudgedWindow],
    replay_steps: int,
    on_pending=None,
    asked=None,
    replay_whole: float = evidence.DEFAULT_REPLAY_WHOLE,
) -> dict:
    """The judge's part of the record: the headline from its own clock, the evidence of every window, the checks of
    the worker's figures against its own, and the replay. ``asked`` (judge_figures) is what the judge asked for:
    the steps, batch, job and shape the headline is computed from, and a record that says otherwise is invalid,
    naming the field. Without it (a record finished again from its own fields) the record's figures are used.
    The replay covers the first `replay_steps` steps of the headline window, or with probability `replay_whole`
    (drawn after every window was answered) the whole of it.
    ``on_pending`` gets the record as it stands before the replay (marked REPLAY_PENDING), to keep while the replay
    runs."""
    result = record
    record = record.to_dict() if hasattr(record, "to_dict") else dict(record)  # a typed Result, or its dict
    invalid = list(record.get("invalid_reasons", []))
    if asked is not None:
        invalid += figure_problems(record, asked)
        # From here on the record carries the judge's figures: what the headline and the replay are made of.
        record.update({key: asked[key] for key in JUDGED_FIELDS})
        if isinstance(record.get("layout"), dict):
            record["layout"] = {**record["layout"], **{k: asked[k] for k in JUDGED_LAYOUT if k in record["layout"]}}
        record["config"] = asked["config"]
        record["sequence_length"] = asked["config"]["sequence_length"]
        if not asked["official"]:
            record["official"] = False
    repeats = int(record["repeats"])
    closed = [w for w in windows if w.closed is not None]
    if len(closed) != repeats or len(windows) != repeats:
        invalid.append(
            f"judge: {len(closed)} of {repeats} measured windows were opened and closed through the clean clock"
        )
    for index, window in enumerate(closed):
        invalid += nesting_problems(index, window)
    invalid += record_problems(record, closed)
    evidence_windows = [
        evidence.Window(
            challenge=w.challenge,
            clean_seconds=w.seconds,
            losses=list(w.answer.get("losses") or []),
            digest_start=list(w.answer.get("digest_start") or []),
            digest_end=list(w.answer.get("digest_end") or []),
            worker_seconds=_number(w.answer.get("worker_window_seconds")),
            moments_end=list(w.answer.get("moments_end") or []),
        ).to_dict()
        | {"digest_scope": str(w.answer.get("digest_scope", "model"))}
        for w in closed
    ]
    steps = int(record["steps"])
    for index, window in enumerate(evidence_windows):
        if len(window["losses"]) != steps:
            invalid.append(f"judge: window {index + 1} answered {len(window['losses'])} losses for {steps} steps")
    record = dict(record)
    if closed:
        seconds = [w.seconds for w in closed]
        headline = median_index([1 / s for s in seconds])  # by throughput: the headline rule
        timing = dict(record["timing"])
        timing["worker_window_seconds"] = timing.get("window_seconds")
        timing["worker_repeat_window_seconds"] = timing.get("repeat_window_seconds")
        timing.update(
            window_seconds=seconds[headline],
            repeat_window_seconds=seconds,
            clock="judge",
        )
        record["timing"] = timing
        record.update(headline_figures(record, seconds[headline]))
        chosen = evidence_windows[headline]["losses"]
        if chosen:
            record["loss"] = {**record["loss"], "first": chosen[0], "last": chosen[-1]}
    else:
        headline = 0
    # The energy over the judge's own windows, from the counter readings the worker answered at each close.
    tokens = int(record.get("global_batch_size") or record["batch_size"]) * int(record["config"]["sequence_length"])
    record["energy"], problems = energy.summarise(
        record.get("energy"),
        [w.answer.get("energy_joules") for w in closed],
        [w.seconds for w in closed],
        tokens * steps / int(record.get("world_size") or 1),
    )
    invalid += problems
    record["evidence"] = {
        "schema": evidence.SCHEMA,
        "digest": "per parameter, in the model's order: [sum, sum of squares] of its elements in float64",
        "windows": evidence_windows,
        "headline_window": headline,
    }
    record["judge"] = {
        "clean_room": True,
        "clock": "time.perf_counter of a process that imported no plugin",
        "pid": os.getpid(),
        "installed_plugins": installed_plugins(),
    }
    if evidence_windows and replay_steps > 0 and len(closed) == repeats:
        if on_pending is not None:
            pending = {**record, "evidence": {**record["evidence"], "replay": None}}
            on_pending(_sealed(result, pending, [*invalid, REPLAY_PENDING]))
        # Drawn now, after the worker answered for every step of every window: any step may be checked.
        depth, whole = evidence.draw_replay_steps(replay_steps, steps, replay_whole)
        # On the run's own accelerator where torch drives it without a plugin (evidence.replay_device), else the CPU.
        replayed = evidence.replay_record(record, depth, device=(record.get("device") or {}).get("spec"))
        replayed["drawn"] = {"floor_steps": replay_steps, "whole_window_probability": replay_whole, "whole": whole}
        record["evidence"]["replay"] = replayed
        invalid += [f"replay: {detail}" for detail in evidence.failed(replayed)]
    elif replay_steps <= 0:
        record["evidence"]["replay"] = None
        invalid.append("replay: not run (--replay-steps 0): the run's function is unchecked")
    return _sealed(result, record, invalid)


def _sealed(result, record: dict, invalid: list[str]):
    """The judged record with its invalid reasons and verdict, typed as the worker's record came (Result or dict)."""
    record = {**record, "invalid_reasons": invalid, "valid": bool(record.get("official")) and not invalid}
    return type(result).from_dict(record) if hasattr(result, "to_dict") else record


def nesting_problems(index: int, window: JudgedWindow) -> list[str]:
    """The worker's window, read on the same host clock, must lie inside the judge's."""
    start, end = _number(window.answer.get("worker_start")), _number(window.answer.get("worker_end"))
    if not (math.isfinite(start) and math.isfinite(end)):
        return [f"judge: window {index + 1}'s answer carries no worker clock readings"]
    slack = NESTING_SLACK_SECONDS
    if start < window.opened - slack or end > window.closed + slack or end < start:
        return [
            f"clock: the plugin's process timed window {index + 1} from {start:.6f} to {end:.6f}, outside the clean "
            f"clock's {window.opened:.6f} to {window.closed:.6f} (its clock is not the host's)"
        ]
    return []


def record_problems(record: dict, closed: list[JudgedWindow]) -> list[str]:
    """The worker's own figures against what it answered at each close and the judge's clock: its record's
    windows must be the ones it timed, and its step times must fill the judged window."""
    timing = record.get("timing") or {}
    claimed = timing.get("repeat_window_seconds") or []
    problems = []
    for index, window in enumerate(closed[: len(claimed)]):
        own, said = _number(window.answer.get("worker_window_seconds")), _number(claimed[index])
        if not (math.isfinite(said) and own * (1 - 1e-9) <= said <= window.seconds + NESTING_SLACK_SECONDS):
            problems.append(
                f"timing: the plugin's process recorded window {index + 1} as {said:.6f} s; it timed {own:.6f} s "
                f"and the clean clock {window.seconds:.6f} s"
            )
    if closed:
        headline = median_index([1 / w.seconds for w in closed])
        steps = [_number(s) for s in timing.get("step_seconds") or []]
        window = closed[headline].seconds
        # The headline repeat's step times, from the plugin's process (device events or host clock): information,
        # but a set that leaves most of the judged window unexplained says the plugin's timer is not the device's.
        worker_headline = median_index([1 / _number(w) for w in claimed]) if len(claimed) == len(closed) else headline
        if worker_headline == headline and steps and sum(steps) < evidence.MIN_STEP_SHARE_OF_WINDOW * window:
            problems.append(
                f"timing: the plugin's step times add up to {sum(steps):.6f} s, under "
                f"{evidence.MIN_STEP_SHARE_OF_WINDOW:.0%} of the {window:.6f} s the clean clock measured"
            )
    return problems


def _number(value) -> float:
    return float(value) if isinstance(value, (int, float)) and not isinstance(value, bool) else math.nan


def headline_figures(record: dict, window_seconds: float) -> dict:
    """Every figure derived from the window, from the record's own shape, batch and job."""
    from llmb.model import ModelConfig

    config = ModelConfig(**record["config"])
    world_size = int(record.get("world_size") or 1)
    # What the data-parallel ranks ran, as the run recorded it (tensor and pipeline peers add no samples).
    global_batch = int(record.get("global_batch_size") or int(record["batch_size"]) * world_size)
    steps = int(record["steps"])
    tokens_per_second = global_batch * config.sequence_length * steps / window_seconds
    tflops = flops.achieved_tflops(tokens_per_second / world_size, record["model_flops_per_token"])
    # The matmul rate the run measured after its window (llmb.roofline): the efficiency from the judge's figure.
    matmul_peak = _number(record.get("measured_matmul_peak"))
    matmul_peak = matmul_peak if math.isfinite(matmul_peak) else 0.0
    return {
        "tokens_per_second": tokens_per_second,
        "tokens_per_second_per_device": tokens_per_second / world_size,
        "samples_per_second": global_batch * steps / window_seconds,
        "tflops": tflops,
        "mfu": flops.mfu(tflops, record.get("peak_flops")),
        "fom": flops.fom(config, global_batch, window_seconds / steps),
        "matmul_peak_efficiency": tflops * 1e12 / matmul_peak if matmul_peak > 0 else None,
    }
