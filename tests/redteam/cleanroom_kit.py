"""Adversarial plugins for the clean-room tests: each a real distribution with an `llmb` entry point, laid out in its
own site folder as pip would (a dist-info with METADATA and entry_points.txt beside the module), reached by
`python -m llmb` subprocesses through PYTHONPATH. Every attack lives alone in its folder, so attacks never mix.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import textwrap
from pathlib import Path

TINY = ["--device", "cpu", "--preset", "tiny", "--steps", "3", "--warmup-steps", "2"]

# What an attack may define besides its import-time code, and the plugin API entry each one becomes.
FUNCTIONS = {  # attack function -> (old hook, Backend method, arguments)
    "_process_model": ("process_model", "process_model", "model, optimizer, device, precision, settings"),
    "_new_event": ("device_event", "new_event", "device"),
}


def plugin_api(code: str) -> str:
    """The plugin around an attack, in this llmb's API: a `llmb.Backend` subclass where llmb has one, else hooks."""
    import llmb

    defined = [fn for fn in FUNCTIONS if f"def {fn}(" in code]
    if hasattr(llmb, "Backend"):
        methods = "".join(
            f"\n    def {FUNCTIONS[fn][1]}(self, {FUNCTIONS[fn][2]}):\n        return {fn}({FUNCTIONS[fn][2]})\n"
            for fn in defined
        )
        return f"""

import llmb as _llmb


class _Attack(_llmb.Backend):
    name = _NAME

    def device_types(self):
        return ["cpu"]

    def precisions(self):
        return ["FP32", "FP16", "BF16"]
{methods}

@_llmb.hookimpl
def register_backends(register):
    register(_Attack())
"""
    hooks = "".join(
        f"\n\n@_hookimpl\ndef {FUNCTIONS[fn][0]}({FUNCTIONS[fn][2]}):\n    return {fn}({FUNCTIONS[fn][2]})\n"
        for fn in defined
    )
    return f"""

from llmb import hookimpl as _hookimpl


@_hookimpl
def device_types():
    return ["cpu"]


@_hookimpl
def supported_precisions():
    return ["FP32", "FP16", "BF16"]
{hooks}"""


def install(site: Path, name: str, code: str) -> Path:
    """Lay out distribution llmb-<name> with entry point <name> = llmb_attack_<name> in `site`."""
    module = f"llmb_attack_{name}"
    info = site / f"llmb_attack_{name}-6.6.6.dist-info"
    info.mkdir(parents=True)
    (info / "METADATA").write_text(f"Metadata-Version: 2.1\nName: llmb-attack-{name}\nVersion: 6.6.6\n")
    (info / "entry_points.txt").write_text(f"[llmb]\n{name} = {module}\n")
    code = textwrap.dedent(code)
    source = f"_NAME = {name!r}\n" + code + plugin_api(code)
    compile(source, module, "exec")  # an attack that cannot even import would pass vacuously
    (site / f"{module}.py").write_text(source)
    return site


def llmb(site: Path | None, args: list[str], cwd: Path, timeout: float = 900) -> subprocess.CompletedProcess:
    env = dict(os.environ)
    env.pop("LLMB_IN_PROCESS", None)
    if site is not None:
        env["PYTHONPATH"] = os.pathsep.join([str(site), env.get("PYTHONPATH", "")]).rstrip(os.pathsep)
    return subprocess.run(
        [sys.executable, "-m", "llmb", *args], capture_output=True, text=True, timeout=timeout, cwd=cwd, env=env
    )


def run(site: Path | None, tmp_path: Path, *args: str) -> tuple[subprocess.CompletedProcess, dict | None]:
    out = tmp_path / "out"
    proc = llmb(site, ["run", *TINY, *args, "--out", str(out)], tmp_path)
    records = [json.loads(p.read_text()) for p in sorted(out.glob("*.json"))] if out.exists() else []
    return proc, (records[0] if records else None)


def reasons(record: dict, prefix: str) -> list[str]:
    return [r for r in record["invalid_reasons"] if r.startswith(prefix)]
