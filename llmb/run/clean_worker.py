"""The clean room's worker side: the only process that imports a plugin. It trains (or runs check-plugin's
candidate), asks the judge (llmb.judge.cleanroom) to open and close each measured window, and hands each result over
through the link; the judge imports nothing of this module.
"""

from __future__ import annotations

import contextlib
import ctypes
import importlib
import json
import signal
import sys
from collections.abc import Callable, Iterator
from dataclasses import replace
from multiprocessing.connection import Client
from typing import TYPE_CHECKING, Any

from llmb.api.errors import LlmbError
from llmb.judge.link import error_line
from llmb.spec.vocab import ALL_PRECISIONS, expand_precision

if TYPE_CHECKING:  # annotations only: torch loads in the worker's process only (see worker_main)
    from llmb.distributed.job import World


class Link:
    """The worker's side: the judge's window edges, and the run's progress, notes, records and errors."""

    clean = True

    def __init__(self, address: tuple[str, int], key: bytes) -> None:
        self.connection = Client(tuple(address), authkey=key)

    def setup(self, device: str) -> None:
        """The run's backend is set up on `device`: the judge may begin its own preparation for the run (the
        replay's initial model, where it replays on that device)."""
        self.connection.send(("setup", str(device)))

    def ready(self) -> None:
        """The run is set up: wait, before its first warmup step, until the judge's preparation is done."""
        self.connection.send(("ready", None))
        kind, _ = self.connection.recv()
        if kind != "go":
            raise LlmbError("the judge answered out of turn")

    def open(self, digest_start: list[list[float]]) -> int:
        self.connection.send(("open", None))
        kind, challenge = self.connection.recv()
        if kind != "challenge":
            raise LlmbError("the judge answered out of turn")
        return int(challenge)

    def close(self, answer: dict) -> int:
        """The window's answer; the judge stops its clock on it and answers with the seal's key."""
        self.connection.send(("close", answer))
        kind, key = self.connection.recv()
        if kind != "seal_key":
            raise LlmbError("the judge answered out of turn")
        return int(key)

    def seal(self, evidence: dict) -> None:
        """The window's digests, computed after the judge's clock stopped (llmb.training.loop.Trainer.measure)."""
        self.connection.send(("seal", evidence))

    def send(self, *message: Any) -> None:
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


def task_named(task: Callable | str) -> Callable:
    """A task as the judge named it: a module-level function of llmb, or its dotted name (the judge names this
    module's run_task without importing it)."""
    if callable(task):
        return task
    module, name = str(task).rsplit(".", 1)
    return getattr(importlib.import_module(module), name)


def worker_main(
    task: Callable | str, jobs: list, address: tuple[str, int], key: bytes, every_rank: bool = True
) -> list | None:
    """The worker: the only process that imports a plugin. Sends what ``task(jobs, link, world)`` yields to the
    judge (and any error, as one line). ``task`` is a module-level function of llmb or its dotted name: run_task
    for `llmb run`, conformance.candidate_task for `llmb check-plugin`."""
    from llmb.distributed import job as distributed  # lazy: torch, imported in the worker's process only

    _die_with_parent()
    world = distributed.current_world()
    talks = every_rank or world is None or world.rank == 0
    link = Link(address, key) if talks else None
    try:
        for result in task_named(task)(jobs, link, world):
            if link is not None:
                link.result(result)
    except BaseException as exc:
        if link is not None:
            link.send("error", *error_line(exc))
        if world is not None and not every_rank:
            raise  # torch's launcher (llmb.run.rank_worker) reports which rank failed
        # A worker of its own judge (a plain run, or each rank of an srun job) has told the judge, which prints the
        # one line: raising would only add multiprocessing's traceback.
        return None
    finally:
        if link is not None:
            link.send("done")
        if not every_rank:
            distributed.shutdown()
    return None


def run_task(runs: list, link: Link | None, world: World | None) -> Iterator:
    """`llmb run`'s work in the worker: each RunOptions trained, its windows judged through the link."""
    from llmb.run import runner  # lazy: the runner (torch, the plugins) loads in the worker's process only

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
            ctypes.CDLL(None).prctl(1, int(signal.SIGKILL))  # PR_SET_PDEATHSIG


def expand_all(runs: list, link: Link | None) -> list:
    """`--precision all` becomes one run per precision the plugin supports (asked here, in the worker)."""
    from llmb.registry.plugins import call, select_backend  # lazy: plugins load in the worker, once it started

    expanded = []
    for options in runs:
        if options.precision != ALL_PRECISIONS:
            expanded.append(options)
            continue
        backend = select_backend(options.plugin, options.device).backend
        supported = call(backend.precisions)  # its type checked, as everywhere
        wanted, unsupported = expand_precision(options.precision, supported)
        for name in unsupported if link is not None else []:
            link.send("note", f"{name}: unsupported by this plugin")
        expanded += [replace(options, precision=name) for name in wanted]
    return expanded
