"""Building adversarial plugins: each attack is a real distribution with an `llmb` entry point, laid out in its own
site folder (never beside another attack: every installed plugin is imported, so attacks would mix), and reached by
`python -m llmb` subprocesses through PYTHONPATH, as tests/test_plugin_packages.py does with an honest one.

Two ways to lay one out: `build` pip-installs a package built from a pyproject (a wheel install, RECORD and all);
`install` writes what pip leaves (tests/conftest.py's dist-info beside the module), with no build step.

An attack is module-level code (what runs at import: the global monkeypatching) plus optional functions the
generated plugin calls from its hooks: ``_setup(device, precision, settings)``, ``_process_model(model, optimizer,
device, precision, settings)``, ``_optimizer_options(device, precision, settings)``, ``_step_end(device)``,
``_peak(device, precision)``, ``_device_name(device)``, ``_new_event(device)``, ``_vendor_libraries()``. The
generator writes them as this llmb's plugin API wants them (module hooks, or a `llmb.Backend` subclass where llmb has
one), so the attacks stay the same when the API changes.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import textwrap
from dataclasses import dataclass
from pathlib import Path

from conftest import write_dist_info

import llmb as _llmb

TINY = ["--device", "cpu", "--preset", "tiny", "--steps", "3", "--warmup-steps", "2"]
HOOKS = {  # attack function -> (old hook name, Backend method name, arguments)
    "_setup": ("setup_backend", "setup", "device, precision, settings"),
    "_process_model": ("process_model", "process_model", "model, optimizer, device, precision, settings"),
    "_step_end": ("step_end", "step_end", "device"),
    "_peak": ("peak_flops", "peak_flops", "device, precision"),
    "_device_name": ("device_name", "device_name", "device"),
    "_new_event": ("device_event", "new_event", "device"),
    "_vendor_libraries": ("vendor_libraries", "vendor_libraries", ""),
    "_optimizer_options": ("optimizer_options", "optimizer_options", "device, precision, settings"),
}
PEAK_SHIM = """
try:  # the Backend API's peak carries its source; older llmb takes any object with flops and source
    from llmb import Peak
except ImportError:
    import types as _types

    def Peak(flops, source):
        return _types.SimpleNamespace(flops=flops, source=source)
"""


@dataclass(frozen=True)
class Attack:
    name: str
    code: str

    def module_source(self) -> str:
        code = textwrap.dedent(self.code)
        defined = [fn for fn in HOOKS if f"def {fn}(" in code]
        head = f'"""red-team attack {self.name}: an adversarial plugin, built by tests/redteam."""\n{PEAK_SHIM}\n'
        if hasattr(_llmb, "Backend"):
            methods = "".join(
                f"\n    def {HOOKS[fn][1]}(self, {HOOKS[fn][2]}):\n        return {fn}({HOOKS[fn][2]})\n"
                for fn in defined
            )
            tail = f"""

import llmb as _llmb


class AttackBackend(_llmb.Backend):
    name = "{self.name}"

    def device_types(self):
        return ["cpu"]

    def precisions(self):
        return ["FP32", "FP16", "BF16"]
{methods}

@_llmb.hookimpl
def register_backends(register):
    register(AttackBackend())
"""
        else:
            hooks = "".join(
                f"\n\n@_hookimpl\ndef {HOOKS[fn][0]}({HOOKS[fn][2]}):\n    return {fn}({HOOKS[fn][2]})\n"
                for fn in defined
            )
            tail = f"""

from llmb import hookimpl as _hookimpl


@_hookimpl
def device_types():
    return ["cpu"]


@_hookimpl
def supported_precisions():
    return ["FP32", "FP16", "BF16"]
{hooks}"""
        source = head + code + tail
        compile(source, self.module, "exec")  # an attack that cannot even import would pass vacuously
        return source

    @property
    def module(self) -> str:
        return f"llmb_attack_{self.name}"


def install(site: Path, name: str, code: str) -> Path:
    """Lay out distribution llmb-attack-<name> with entry point <name> = llmb_attack_<name> in `site`, return it."""
    attack = Attack(name, code)
    write_dist_info(site, f"llmb-attack-{name}", "6.6.6", name, attack.module)
    (site / f"{attack.module}.py").write_text(attack.module_source())
    return site


def build(attack: Attack, folder: Path) -> Path:
    """Write the attack's package, pip-install it into its own site folder, return that folder."""
    package = folder / f"pkg-{attack.name}"
    package.mkdir(parents=True)
    (package / f"{attack.module}.py").write_text(attack.module_source())
    (package / "pyproject.toml").write_text(
        f"""
[build-system]
requires = ["hatchling"]
build-backend = "hatchling.build"

[project]
name = "llmb-attack-{attack.name.replace("_", "-")}"
version = "6.6.6"
dependencies = ["llmb"]

[project.entry-points.llmb]
{attack.name} = "{attack.module}"

[tool.hatch.build.targets.wheel]
include = ["{attack.module}.py"]
"""
    )
    site = folder / f"site-{attack.name}"
    args = ["install", "-q", "--no-deps", "--no-build-isolation", "--no-index", "--target", str(site), str(package)]
    proc = subprocess.run([sys.executable, "-m", "pip", *args], capture_output=True, text=True, timeout=300)
    assert proc.returncode == 0, proc.stderr[-2000:]
    return site


def llmb(site: Path | None, args: list[str], cwd: Path, timeout: float = 900) -> subprocess.CompletedProcess:
    """`python -m llmb ARGS` in a subprocess that sees the plugins in `site` (None: only the installed ones)."""
    env = dict(os.environ)
    env.pop("LLMB_IN_PROCESS", None)
    if site is not None:
        env["PYTHONPATH"] = os.pathsep.join([str(site), env.get("PYTHONPATH", "")]).rstrip(os.pathsep)
    return subprocess.run(
        [sys.executable, "-m", "llmb", *args], capture_output=True, text=True, timeout=timeout, cwd=cwd, env=env
    )


def run(
    site: Path | None, tmp_path: Path, *args: str, timeout: float = 900
) -> tuple[subprocess.CompletedProcess, dict | None]:
    """`llmb run` on the tiny preset with the plugins in `site`; the record, if one was written."""
    out = tmp_path / "out"
    proc = llmb(site, ["run", *TINY, *args, "--out", str(out)], tmp_path, timeout)
    records = [json.loads(p.read_text()) for p in sorted(out.glob("*.json"))] if out.exists() else []
    return proc, (records[0] if records else None)


def run_attack(attack: Attack, tmp_path: Path, *extra: str) -> tuple[subprocess.CompletedProcess, dict | None]:
    """`llmb run` with the attack's pip-installed plugin on the tiny preset; the record, if one was written."""
    return run(build(attack, tmp_path), tmp_path, "--plugin", attack.name, *extra)


def check_attack(attack: Attack, tmp_path: Path, *extra: str) -> tuple[subprocess.CompletedProcess, dict | None]:
    """`llmb check-plugin` with the attack's plugin; the conformance record, if one was written."""
    site = build(attack, tmp_path)
    out = tmp_path / "conformance.json"
    args = ["check-plugin", "--plugin", attack.name, "--device", "cpu", "--steps", "2", *extra, "--out", str(out)]
    proc = llmb(site, args, tmp_path)
    return proc, (json.loads(out.read_text()) if out.exists() else None)


def reasons(record: dict, prefix: str) -> list[str]:
    return [r for r in record["invalid_reasons"] if r.startswith(prefix)]


DIRECTIONS = "replay: AdamW's first moments projected onto the judge's random directions"


def assert_caught_by_directions(proc: subprocess.CompletedProcess, record: dict | None) -> dict:
    """A pure BF16 window drawn whole failed the moments' projection onto the judge's random directions (against the
    BF16 replay); its replay section."""
    assert record is not None, proc.stderr[-2000:]
    replay = record["evidence"]["replay"]
    assert replay["drawn"]["whole"] is True and replay["passed"] is False, replay
    caught = reasons(record, DIRECTIONS)
    assert caught and all(r.endswith("against a BF16 replay)") for r in caught), record["invalid_reasons"]
    return replay
