"""The clean room's judge and worker are different modules: the judge's (llmb.cleanroom, llmb.clean_verdict and the
link they share, llmb.clean_link) never import the worker side or what runs a plugin, anywhere in their source; the
worker is named to the spawned process by its module's name only."""

from __future__ import annotations

import ast
import subprocess
import sys
from pathlib import Path

import pytest

PACKAGE = Path(__file__).resolve().parents[1] / "llmb"
JUDGE = ("cleanroom", "clean_verdict", "clean_link")
WORKER_SIDE = {"llmb.clean_worker", "llmb.runner", "llmb.run_jobs", "llmb.conformance", "llmb.default_plugins"}


def imports_of(module: str) -> set[str]:
    """Every llmb module a module's source imports, at the top or inside functions."""
    found = set()
    for node in ast.walk(ast.parse((PACKAGE / f"{module}.py").read_text())):
        if isinstance(node, ast.Import):
            found |= {alias.name for alias in node.names}
        elif isinstance(node, ast.ImportFrom) and node.module:
            found |= {node.module} if node.module != "llmb" else {f"llmb.{alias.name}" for alias in node.names}
    return {name for name in found if name.startswith("llmb")}


@pytest.mark.parametrize("module", JUDGE)
def test_the_judge_side_imports_nothing_of_the_worker_side(module):
    assert not imports_of(module) & WORKER_SIDE


def test_importing_the_judge_loads_no_worker_side():
    code = "import sys, llmb.cleanroom; print(' '.join(sys.modules))"
    proc = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    loaded = set(proc.stdout.split())
    assert "llmb.cleanroom" in loaded
    assert not loaded & (WORKER_SIDE | {"llmb.plugins"})


def test_the_worker_the_judge_names_exists():
    from llmb import clean_worker, cleanroom

    assert cleanroom.WORKER_MODULE == clean_worker.__name__
    assert clean_worker.task_named(cleanroom.RUN_TASK) is clean_worker.run_task
