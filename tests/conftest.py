"""Shared test helpers: the tiny run shape, the CLI invoker, run records, in-memory backends, the OOM test backend."""

from __future__ import annotations

import json
import os
import re
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest
from click.testing import CliRunner

# The tests read llmb's console as a pipe sees it (llmb.terminal.console: wide, unless COLUMNS says otherwise). A
# shell's COLUMNS, or pytest-xdist's workers (they set COLUMNS=80), would narrow every table they check; llmb's
# consoles are made on import, so this comes first.
os.environ.pop("COLUMNS", None)

from llmb import Backend, hookimpl
from llmb.registry.plugins import pm

TESTS = Path(__file__).parent
# The smallest run that exercises everything: the tiny preset, a couple of steps (a debug run, never official).
TINY = ["--preset", "tiny", "--steps", "2", "--warmup-steps", "1"]
TINY_CPU = ["--device", "cpu", *TINY]


def invoke(*args, **kwargs):
    """`llmb ARGS` in this process; exceptions propagate (an llmb error is still exit code and one line)."""
    from llmb.cli import cli

    kwargs.setdefault("catch_exceptions", False)
    return CliRunner().invoke(cli, [str(a) for a in args], **kwargs)


def markdown_table_widths(lines: list[str]) -> list[list[int]]:
    """Per Markdown table (consecutive lines starting with |), each row's count of unescaped cell boundaries: a
    record's text that broke out of its cell shows as a row of another width."""
    blocks, block = [], []
    for line in [*lines, ""]:
        if line.startswith("|"):
            block.append(len(re.findall(r"(?<!\\)\|", line)))
        elif block:
            blocks.append(block)
            block = []
    return blocks


def only_record(out: Path) -> dict:
    (path,) = Path(out).glob("*.json")
    return json.loads(path.read_text())


def run_record(out: Path, *args) -> dict:
    """`llmb run` on the tiny shape into `out`, which must end up holding exactly one result: that record."""
    result = invoke("run", *TINY, "--out", out, *args)
    assert result.exit_code == 0, result.output
    return only_record(out)


class _OneBackend:
    """A plugin object registering one backend: what an installed plugin module does, in memory."""

    def __init__(self, backend: Backend) -> None:
        self.backend = backend

    @hookimpl
    def register_backends(self, register):
        register(self.backend)


@pytest.fixture
def register_backend(monkeypatch):
    """Register in-memory backends for one test, each as a plugin named after it; unregistered afterwards. A
    backend in memory exists in this process only, so `llmb run` runs in process (its records are never valid)."""
    monkeypatch.setenv("LLMB_IN_PROCESS", "1")
    names = []

    def register(backend: Backend, name: str | None = None) -> Backend:
        if name is not None:
            backend.name = name
        pm.register(_OneBackend(backend), name=backend.name)
        names.append(backend.name)
        return backend

    yield register
    for name in names:
        pm.unregister(name=name)


@pytest.fixture(scope="session")
def oomtest_site(tmp_path_factory) -> Path:
    """A folder that, on PYTHONPATH, installs tests/llmb_oomtest.py as plugin "oomtest": a dist-info with its entry
    point, found by the real discovery (a subprocess cannot see an in-memory backend)."""
    site = tmp_path_factory.mktemp("oomtest-site")
    write_dist_info(site, "llmb-oomtest", "0.0.0", "oomtest", "llmb_oomtest")
    return site


def write_dist_info(site: Path, distribution: str, version: str, entry_point: str, module: str) -> None:
    """What pip leaves for an installed plugin, minus the code: its metadata and its llmb entry point."""
    info = site / f"{distribution.replace('-', '_')}-{version}.dist-info"
    info.mkdir(parents=True)
    (info / "METADATA").write_text(f"Metadata-Version: 2.1\nName: {distribution}\nVersion: {version}\n")
    (info / "entry_points.txt").write_text(f"[llmb]\n{entry_point} = {module}\n")


def install_plugin(parent: Path, name: str, source: str, version: str = "0.1") -> Path:
    """An installed plugin for one test, as pip lays it out: module `llmb_<name>` from `source` and a dist-info
    `llmb-<name>` with the entry point `name`, in a folder of `parent` to put on PYTHONPATH (returned)."""
    site = parent / f"site-{name}"
    write_dist_info(site, f"llmb-{name}", version, name, f"llmb_{name}")
    (site / f"llmb_{name}.py").write_text(textwrap.dedent(source))
    return site


def plugin_env(site: Path) -> dict:
    """The environment of a subprocess that finds the plugin `install_plugin` laid out in `site` before any other."""
    return dict(os.environ, PYTHONPATH=os.pathsep.join(p for p in (str(site), os.environ.get("PYTHONPATH")) if p))


def oomtest_env(site: Path) -> dict:
    paths = [str(site), str(TESTS), os.environ.get("PYTHONPATH", "")]
    return dict(os.environ, PYTHONPATH=os.pathsep.join(p for p in paths if p))


# A finished sweep shared by tests/test_sweep.py and tests/test_report.py (it takes six `llmb run` subprocesses).
# The out-of-memory points are simulated by the oomtest backend: the CPU has no device memory limit.
TINY_SWEEP = ["--preset", "tiny", "--device", "cpu", "--steps", "2", "--warmup-steps", "1"]


@pytest.fixture(scope="session")
def tiny_sweep(tmp_path_factory, oomtest_site):
    out = tmp_path_factory.mktemp("sweep")
    args = ["--precision", "all", "--batch-sizes", "auto", "--max-batch-size", "4", "--repeats", "0"]
    args += ["--plugin", "oomtest", "-O", "oom_above_batch_size=1", "--out", str(out)]
    proc = subprocess.run(
        [sys.executable, "-m", "llmb", "sweep", *TINY_SWEEP, *args],
        capture_output=True,
        text=True,
        timeout=600,
        env=oomtest_env(oomtest_site),
    )
    assert proc.returncode == 0, proc.stderr[-2000:]
    return out


@pytest.fixture(scope="session", autouse=True)
def first_imports_done():
    """A process's first AdamW imports torch._dynamo (1.5 s on this 2-core host), and its first call into the cpu
    plugin imports the toolkit: both done once per test process before any test, so a test that bounds a command by
    a short limit (--time-limit 1, --trial-timeout 0.5) never stops one of them half-way. An import stopped there
    leaves torch._dynamo half-initialised, and every later test of that process failed on it ("partially
    initialized module 'torch._dynamo' has no attribute 'utils'"; found 2026-11-28). A run's first resolve (loading
    the cpu plugin and its toolkit, its settings, its device) is warmed too: 0.26 s the first time, over half a 0.5 s
    trial limit."""
    import torch

    from llmb.run.options import RunOptions, resolve
    from llmb.spec.presets import PRESETS

    torch.optim.AdamW([torch.zeros(1, requires_grad=True)])
    resolve(RunOptions(config=PRESETS["tiny"], preset="tiny", plugin="cpu", device="cpu"))


# Tests that need a finished sweep or a packaged bundle build it first (minutes of subprocess runs): the slow layer.
SLOW_FIXTURES = {"tiny_sweep", "made", "inputs"}


# Under pytest-xdist (tox runs `pytest -n logical --dist loadgroup`), the tests that share a session fixture costing
# minutes run on one worker, which builds it once; every other test runs on the worker of its file's group, as
# --dist loadfile would place it (module fixtures built once, a file's tests one after another).
SHARED_SESSION_FIXTURES = ("tiny_sweep",)


@pytest.hookimpl(tryfirst=True)  # before xdist's own hook reads the groups
def pytest_collection_modifyitems(items):
    for item in items:
        fixtures = set(getattr(item, "fixturenames", ()))
        if SLOW_FIXTURES & fixtures:
            item.add_marker(pytest.mark.slow)
        shared = [name for name in SHARED_SESSION_FIXTURES if name in fixtures]
        item.add_marker(pytest.mark.xdist_group(shared[0] if shared else item.nodeid.split("::")[0]))


def _signal_state() -> dict:
    """The process's signal dispositions and the main thread's blocked set: what every process a test starts
    inherits (an ignored or blocked SIGINT survives exec, and a child Python then never raises KeyboardInterrupt)."""
    import signal

    state: dict = {"blocked": frozenset(signal.pthread_sigmask(signal.SIG_BLOCK, []))}
    for number in signal.valid_signals():
        try:
            state[signal.Signals(number).name] = signal.getsignal(number)
        except (ValueError, OSError):  # SIGKILL, SIGSTOP, real-time numbers without a name
            continue
    return state


@pytest.fixture(autouse=True)
def signals_left_as_found():
    """A test that changes the process's signal handling and leaves it so fails, and the state is put back: every
    later test of that pytest worker would otherwise start its subprocesses with it. A SIGINT left ignored would make
    a test that interrupts a sweep see it finish and exit 0, as one CI run of 2026-11-29 did; a full run with this
    fixture found no test that leaves it so (the sweep now also remembers an interrupt CPython drops)."""
    import signal

    before = _signal_state()
    yield
    after = _signal_state()
    if after == before:
        return
    changed = sorted(k for k in before if after.get(k) != before[k])
    signal.pthread_sigmask(signal.SIG_SETMASK, before["blocked"])
    for name in changed:
        if name != "blocked" and before[name] is not None:
            signal.signal(getattr(signal, name), before[name])
    pytest.fail(f"the test left the process's signal handling changed: {', '.join(changed)}")
