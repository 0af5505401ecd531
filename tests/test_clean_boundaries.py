"""The clean room's judge and worker are different modules: the judge's (llmb.judge.cleanroom, llmb.judge.verdict and
the link they share, llmb.judge.link) load nothing of the worker side or what runs a plugin when imported (their
imports,
anywhere in their source, are .importlinter's judge-no-plugin contract); the worker is named to the spawned process
by its module's name only."""

from __future__ import annotations

import subprocess
import sys

# .importlinter's judge-no-plugin contract checks the judge's imports, transitively and inside functions too (the lint
# env and tests/test_layers.py run it); this checks what importing the judge really loads.
WORKER_SIDE = {
    "llmb.run.clean_worker",
    "llmb.run.runner",
    "llmb.run.jobs",
    "llmb.conformance.check",
    "llmb.default_plugins",
}


def test_importing_the_judge_loads_no_worker_side():
    code = "import sys, llmb.judge.cleanroom; print(' '.join(sys.modules))"
    proc = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    loaded = set(proc.stdout.split())
    assert "llmb.judge.cleanroom" in loaded
    assert not loaded & (WORKER_SIDE | {"llmb.registry.plugins"})


def test_the_worker_the_judge_names_exists():
    from llmb.judge import cleanroom
    from llmb.run import clean_worker

    assert cleanroom.WORKER_MODULE == clean_worker.__name__
    assert clean_worker.task_named(cleanroom.RUN_TASK) is clean_worker.run_task
