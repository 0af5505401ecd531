"""Auto-selection's throwaway process: started, its answer read, and kept for the life of this process.

Knowing whose hardware is present means importing every installed plugin, which no benchmark process may do
(llmb.registry.plugins), so a fresh interpreter does it (`plugins.probe`) and names the choice on its last stdout
line. One command asks once: the answer is kept for each device type, PYTHONPATH and set of installed plugins
(what the probe process would see), so every precision of `--precision all`, every planning step of a sweep
and every combination of a settings search run on one backend, chosen by one probe, where each of them asked again
before (a fresh interpreter importing torch and every plugin: 4 probes for one `--precision all` run on the CPU,
about 7 s each on a 2-core host with the four first-party plugins; benchmarks/RESULTS.md section 38). Hardware is
taken as fixed while one process runs.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from collections.abc import Hashable

from llmb.api.errors import LlmbError
from llmb.terminal import console as term

PROBE = "from llmb.registry import plugins; plugins.probe()"  # argument: the device type asked for, if any

# (device type, PYTHONPATH, installed plugins) -> the backend the probe chose.
_answers: dict[tuple, str] = {}


def chosen_backend(device_type: str | None, installed: Hashable) -> str:
    """The backend auto-selection takes for `device_type` (any, for None), asked of a fresh process the first time
    in this process for this device type and these installed plugins; its warnings are said that once."""
    key = (device_type, os.environ.get("PYTHONPATH"), installed)
    if key not in _answers:
        _answers[key] = ask(device_type)
    return _answers[key]


def ask(device_type: str | None = None) -> str:
    """Start the probe process, always: its choice, with each plugin it took as without hardware said as a warning."""
    command = [sys.executable, "-c", PROBE, device_type or ""]
    try:
        proc = subprocess.run(command, capture_output=True, text=True, timeout=600)
    except (OSError, subprocess.TimeoutExpired) as exc:
        raise LlmbError(f"auto-selecting a plugin failed ({type(exc).__name__}); name one with --plugin") from None
    answer = answer_of(proc.stdout) if proc.returncode == 0 else None
    if answer is None:
        last = (proc.stderr.strip().splitlines() or ["no output"])[-1]
        raise LlmbError(f"auto-selecting a plugin failed ({last}); name one with --plugin")
    chosen, unanswered = answer
    for reason in unanswered:  # said here: the probe's stderr is not shown
        term.warning(reason)
    return chosen


def answer_of(stdout: str) -> tuple[str, list[str]] | None:
    """The probe's choice and warnings from its last stdout line; None where that line is not the probe's answer."""
    try:
        answer = json.loads((stdout.strip().splitlines() or [""])[-1])
        chosen, unanswered = answer["chosen"], answer["unanswered"]
    except (ValueError, TypeError, KeyError):
        return None
    if not isinstance(chosen, str) or not chosen or not isinstance(unanswered, list):
        return None
    return chosen, [str(reason) for reason in unanswered]
