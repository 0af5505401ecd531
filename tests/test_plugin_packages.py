"""Plugin packages installed with pip are found through their entry point and used, without touching llmb.

Each package is built and installed with `pip install --target` into a temporary folder (no network: no deps, no
build isolation, no index) and reached through PYTHONPATH by `python -m llmb` subprocesses.
"""

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest
from conftest import TINY, only_record

from llmb.run.scaffold import write_plugin

pytest.importorskip("hatchling", reason="building a plugin package offline needs hatchling (the test extra)")
pytestmark = pytest.mark.slow  # each builds and installs a package, then runs llmb in subprocesses


THROWAWAY_MODULE = '''
"""A throwaway third-party plugin: the host CPU under another name, with one setting and one run fact."""

from llmb import Backend, Setting, hookimpl


class Throwaway(Backend):
    name = "throwaway"

    def settings(self):
        return [Setting("greeting", str, "hello", "recorded with the run")]

    def run_facts(self, device):
        return {"throwaway_marker": "installed with pip"}


@hookimpl
def register_backends(register):
    register(Throwaway())
'''

THROWAWAY_PYPROJECT = """
[build-system]
requires = ["hatchling"]
build-backend = "hatchling.build"

[project]
name = "llmb-throwaway"
version = "0.3.1"
dependencies = ["llmb"]

[project.entry-points.llmb]
throwaway = "llmb_throwaway"

[tool.hatch.build.targets.wheel]
include = ["llmb_throwaway.py"]
"""


def pip_install(package: Path, target: Path) -> None:
    args = ["install", "-q", "--no-deps", "--no-build-isolation", "--no-index", "--target", str(target), str(package)]
    proc = subprocess.run([sys.executable, "-m", "pip", *args], capture_output=True, text=True, timeout=300)
    assert proc.returncode == 0, proc.stderr[-2000:]


def run_with(site: Path, args: list[str], cwd: Path) -> subprocess.CompletedProcess:
    env = dict(os.environ, PYTHONPATH=os.pathsep.join([str(site), os.environ.get("PYTHONPATH", "")]).rstrip(os.pathsep))
    return subprocess.run([sys.executable, *args], capture_output=True, text=True, timeout=600, cwd=cwd, env=env)


def test_a_pip_installed_plugin_is_listed_and_runs(tmp_path):
    package = tmp_path / "llmb-throwaway"
    package.mkdir()
    (package / "pyproject.toml").write_text(THROWAWAY_PYPROJECT)
    (package / "llmb_throwaway.py").write_text(THROWAWAY_MODULE)
    site = tmp_path / "site"
    pip_install(package, site)

    listed = run_with(site, ["-m", "llmb", "plugins", "--json"], tmp_path)
    assert listed.returncode == 0, listed.stderr
    described = {p["name"]: p for p in json.loads(listed.stdout)}
    assert described["throwaway"]["distribution"] == "llmb-throwaway"
    assert described["throwaway"]["version"] == "0.3.1"
    assert described["throwaway"]["methods_overridden"] == ["settings", "run_facts"]
    assert described["throwaway"]["settings"][0]["name"] == "greeting"

    out = tmp_path / "out"
    args = ["-m", "llmb", "run", "--plugin", "throwaway", *TINY, "-O", "greeting=hi", "--out", str(out)]
    ran = run_with(site, args, tmp_path)
    assert ran.returncode == 0, ran.stderr
    record = only_record(out)
    assert record["plugin"] == {
        "name": "throwaway",
        "version": "0.3.1",
        "distribution": "llmb-throwaway",
        "settings": {"greeting": "hi"},
        "defaults": {"greeting": "hello"},
        "precisions": ["FP32"],
    }
    assert record["facts"]["throwaway_marker"] == "installed with pip"
    assert record["invalid_reasons"] == []


def test_new_plugin_package_installs_passes_its_own_test_and_runs(tmp_path):
    package = write_plugin("acme", tmp_path / "llmb-acme")
    site = tmp_path / "site"
    pip_install(package, site)

    tested = run_with(site, ["-m", "pytest", "-q", "-p", "no:cacheprovider", "tests"], package)
    assert tested.returncode == 0, tested.stdout[-3000:]
    written = sum(path.read_text().count("\ndef test_") for path in (package / "tests").glob("test_*.py"))
    assert written >= 2 and f"{written} passed" in tested.stdout  # every test the scaffold wrote ran and passed

    out = tmp_path / "out"
    ran = run_with(site, ["-m", "llmb", "run", "--plugin", "acme", *TINY, "--out", str(out)], tmp_path)
    assert ran.returncode == 0, ran.stderr
    record = only_record(out)
    assert record["plugin"]["name"] == "acme" and record["plugin"]["distribution"] == "llmb-acme"
    assert record["plugin"]["settings"] == {"example": False}
    assert record["invalid_reasons"] == []
