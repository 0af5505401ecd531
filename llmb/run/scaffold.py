"""`llmb new-plugin NAME`: write a vendor's starting point, an installable plugin package that runs as written.

The module it writes subclasses `llmb.Backend` and stubs every public method, each documented with the method's own
docstring, so the template cannot fall behind the contract. The stubs run the benchmark on the host CPU (most call
the base class, whose body is llmb's default); a vendor replaces them and deletes the ones it does not need.
"""

from __future__ import annotations

import inspect
import json
import keyword
import os
import re
import shlex
import shutil
import tempfile
import textwrap
from pathlib import Path

from llmb.api.backend import Backend, public_methods
from llmb.api.errors import UsageError
from llmb.api.settings import Setting
from llmb.registry.plugins import BUILTIN

NAME_PATTERN = re.compile(r"[a-z][a-z0-9_]*")
# The stub's one setting; the generated README's table is made from the settings as the module declares them.
EXAMPLE_SETTING = _EX = Setting("example", bool, False, "an example setting: -O example=true")

# Stub bodies that keep a fresh backend runnable on the CPU. A method not listed here, or listed with comments only,
# calls the base class, which holds llmb's default: a method added to llmb later still stubs cleanly, and `llmb
# plugins` counts only the stubs that change something as overridden (llmb.api.backend.overridden).
STUB_BODIES = {
    "device_types": "return [DEVICE_TYPE]",
    "precisions": """
        # Add "TF32", "FP16", "BF16" as your hardware runs them; the audit checks what ran.
        return ["FP32"]
    """,
    "available": """
        # Detect your hardware here. True makes llmb pick this backend when --plugin is not given.
        return False
    """,
    # Double-quoted, as ruff format writes them: the package a vendor starts from is formatted as it would format it.
    "settings": "return [Setting({})]".format(
        ", ".join([json.dumps(_EX.name), _EX.type.__name__, repr(_EX.default), json.dumps(_EX.help)])
    ),
    "setup": "# e.g. torch.backends flags, environment variables, vendor library initialisation.",
    "process_model": "# e.g. torch.compile, fused kernels, wrappers. Keep the parameters: the optimizer holds them.",
    "optimizer_options": '# Only "foreach", "fused" and "capturable" are accepted; anything else is refused.',
    "synchronize": """
        # Asynchronous devices block here (e.g. torch.cuda.synchronize(device)); eager CPU ops are done.
        super().synchronize(device)
    """,
    "new_event": "# e.g. torch.cuda.Event(enable_timing=True); None: steps are timed on the host with a sync.",
    "peak_flops": '# A dense vendor-published figure with its source, e.g. Peak(989.4e12, "https://..."), or None.',
    "precision_facts": '# e.g. [PrecisionFact("mylib.fast_math", True, implies="BF16")].',
    "run_facts": "# e.g. vendor library and driver versions.",
    "distributed_backend": 'return "gloo"',
}


def first_sentence(doc: str) -> str:
    """A docstring's first sentence, whole however many lines it spans (a table cell cut at a line's end reads as a
    sentence that stops mid-way): up to the first full stop outside brackets that is no "e.g." or "i.e."; a `|` is
    escaped for the Markdown table."""
    text = " ".join(doc.split("\n\n", 1)[0].split())
    depth = 0
    for i, char in enumerate(text):
        depth += {"(": 1, ")": -1}.get(char, 0)
        if (
            char == "."
            and depth <= 0
            and text[i + 1 : i + 2] in ("", " ")
            and not text[: i + 1].endswith(ABBREVIATIONS)
        ):
            text = text[: i + 1]
            break
    return text.replace("|", "\\|")


ABBREVIATIONS = ("e.g.", "i.e.", "etc.")


def contract() -> list[tuple[str, inspect.Signature, str]]:
    """Every public Backend method, in definition order: (name, signature, docstring)."""
    return [
        (name, inspect.signature(getattr(Backend, name)), inspect.getdoc(getattr(Backend, name)) or "")
        for name in public_methods()
    ]


def _source_parts(signature: inspect.Signature) -> tuple[list[str], str]:
    """The parameters and the return annotation as written in source (annotations are strings here, under
    postponed evaluation)."""

    def annotation(value) -> str:
        return value if isinstance(value, str) else inspect.formatannotation(value)

    params = [
        p.name if p.annotation is inspect.Parameter.empty else f"{p.name}: {annotation(p.annotation)}"
        for p in signature.parameters.values()
    ]
    empty = signature.return_annotation is inspect.Signature.empty
    return params, "" if empty else f" -> {annotation(signature.return_annotation)}"


def _def_line(name: str, signature: inspect.Signature) -> str:
    params, returns = _source_parts(signature)
    line = f"    def {name}({', '.join(params)}){returns}:"
    if len(line) <= 120:
        return line
    lines = "".join(f"        {p},\n" for p in params)  # one parameter a line, as a formatter would
    return f"    def {name}(\n{lines}    ){returns}:"


def _default_body(name: str, signature: inspect.Signature) -> str:
    args = ", ".join(p for p in signature.parameters if p != "self")
    call = f"super().{name}({args})"
    return call if signature.return_annotation == "None" else f"return {call}"


def package_names(name: str) -> dict[str, str]:
    """The plugin's entry point name, distribution name and module name."""
    return {"name": name, "distribution": f"llmb-{name.replace('_', '-')}", "module": f"llmb_{name}"}


def check_name(name: str) -> None:
    if not NAME_PATTERN.fullmatch(name) or keyword.iskeyword(name):
        raise UsageError(f"plugin name {name!r} must be lower case letters, digits and _, starting with a letter")
    if name in BUILTIN:
        raise UsageError(f"plugin name {name!r} is taken by llmb's built-in plugin")


def render_module(name: str) -> str:
    methods = []
    for method, signature, doc in contract():
        body = textwrap.dedent(STUB_BODIES.get(method, "")).strip()
        if all(line.lstrip().startswith("#") for line in body.splitlines()):  # comments only: the default runs
            body = "\n".join(filter(None, [body, _default_body(method, signature)]))
        body = textwrap.indent(body, "        ")
        docstring = textwrap.indent(f'"""{doc}"""', "        ").lstrip()
        methods.append(f"{_def_line(method, signature)}\n        {docstring}\n{body}\n")
    class_name = "".join(part.title() for part in name.split("_")) + "Backend"
    header = f'''"""llmb plugin {name!r}: a `llmb.Backend` with every method stubbed, so the package runs on the host.

Generated by `llmb new-plugin {name}`. Each docstring is llmb's contract for the method (llmb's docs,
docs/vendors/backend-methods.md, document each with its parameters). Replace the stubs for your hardware and delete
the methods you do not need: a method a backend does not define is `llmb.Backend`'s default.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import torch
from llmb import Backend, EnergyCounter, Peak, PrecisionFact, Setting, hookimpl

DEVICE_TYPE = "cpu"  # your torch device type, e.g. "cuda", "xpu", "hpu"


class {class_name}(Backend):
    # What `llmb run --plugin` takes: the entry point's name (or "{name}-..." for more backends in one plugin).
    name = "{name}"

'''
    footer = f"""

@hookimpl
def register_backends(register: Callable[[Backend], None]) -> None:
    register({class_name}())
"""
    return header + "\n".join(methods) + footer


def render_pyproject(names: dict[str, str]) -> str:
    return f'''[build-system]
requires = ["hatchling"]
build-backend = "hatchling.build"

[project]
name = "{names["distribution"]}"
version = "0.1.0"
description = "llmb plugin {names["name"]}"
readme = "README.md"
requires-python = ">=3.10"
dependencies = ["llmb"]

[project.optional-dependencies]
test = ["pytest"]

# llmb finds plugins through this entry point group: the name is what `llmb run --plugin` takes.
[project.entry-points.llmb]
{names["name"]} = "{names["module"]}"

[tool.hatch.build.targets.wheel]
include = ["{names["module"]}.py"]
dev-mode-dirs = ["."]

[tool.ruff]
line-length = 120
'''


def render_test(names: dict[str, str]) -> str:
    name = names["name"]
    return f'''"""The plugin is found through its entry point and runs llmb's tiny preset to a result file."""

import json

from click.testing import CliRunner
from llmb.cli import cli

PLUGIN = "{name}"
TINY = ["--preset", "tiny", "--steps", "2", "--warmup-steps", "1"]


def test_plugin_is_listed():
    result = CliRunner().invoke(cli, ["plugins", "--json"])
    assert result.exit_code == 0, result.output
    plugins = {{p["name"]: p for p in json.loads(result.stdout)}}
    assert plugins[PLUGIN]["distribution"] == "{names["distribution"]}"


def test_readme_lists_the_settings():
    from pathlib import Path

    from llmb.registry.plugins import get_backend
    from llmb.run.scaffold import settings_table

    table = settings_table(get_backend(PLUGIN).backend.settings())
    readme = (Path(__file__).resolve().parent.parent / "README.md").read_text()
    assert table in readme, "README.md's settings table is stale; the table for settings() is:\\n" + table


def test_tiny_run_writes_a_result(tmp_path):
    args = ["run", "--plugin", PLUGIN, *TINY, "--out", str(tmp_path)]
    result = CliRunner().invoke(cli, args)
    assert result.exit_code == 0, result.output
    (path,) = tmp_path.glob("*.json")
    record = json.loads(path.read_text())
    assert record["plugin"]["name"] == PLUGIN
    assert record["invalid_reasons"] == []
'''


def settings_table(settings: list[Setting]) -> str:
    """The Markdown table of a backend's settings, as a plugin's README lists them (its generated test checks it)."""
    rows = [
        f"| `{s['name']}` | {s['type']} | {str(s['default']).lower() if s['type'] == 'bool' else s['default']} | "
        f"{s['help']} |"
        for s in (setting.describe() for setting in settings)
    ]
    return "\n".join(["| setting | type | default | help |", "| --- | --- | --- | --- |", *rows])


def install_command(target: Path | str) -> str:
    """How to install a generated package with what its tests need (the test extra brings pytest)."""
    return f"pip install -e {shlex.quote(f'{target}[test]')}"


def render_readme(names: dict[str, str]) -> str:
    rows = "\n".join(f"| `{method}` | {first_sentence(doc)} |" for method, _, doc in contract())
    return f"""# {names["distribution"]}

An llmb hardware plugin (entry point `{names["name"]}`, module `{names["module"]}`), generated by
`llmb new-plugin {names["name"]}`. As generated it runs the benchmark on the host CPU.

```bash
{install_command(".")}    # the test extra brings pytest
llmb plugins
llmb run --plugin {names["name"]} --preset tiny
pytest tests
```

## Settings

Given as `llmb run --plugin {names["name"]} -O key=value`, validated against `settings()` and recorded in
the result JSON.

{settings_table([EXAMPLE_SETTING])}

`pytest tests` checks this table against `settings()`: after an edit, paste the table it prints.

## Backend methods

Override the ones your hardware needs; each stub's docstring is its contract, and llmb's docs
(docs/vendors/backend-methods.md, and the reference generated from the docstrings, docs/reference/backend.md)
document each method with its parameters and an example.

| method | contract |
| --- | --- |
{rows}
"""


def write_plugin(name: str, directory: Path | None = None) -> Path:
    """Write the package for plugin `name` into `directory` (default ./llmb-NAME); return the directory."""
    check_name(name)
    names = package_names(name)
    target = Path(directory) if directory is not None else Path(names["distribution"])
    if target.exists() and not (target.is_dir() and not any(target.iterdir())):
        raise UsageError(f"{target} already exists; choose another --dir")
    files = {
        "pyproject.toml": render_pyproject(names),
        f"{names['module']}.py": render_module(name),
        "README.md": render_readme(names),
        f"tests/test_{names['module']}.py": render_test(names),
    }
    # Written next to the target and renamed into place, so a failure never leaves half a package.
    target.parent.mkdir(parents=True, exist_ok=True)
    staging = Path(tempfile.mkdtemp(prefix=f".{target.name}.", dir=target.parent))
    try:
        for relative, text in files.items():
            path = staging / relative
            path.parent.mkdir(parents=True, exist_ok=True)
            path.write_text(text)
        staging.chmod(0o755)  # mkdtemp makes it private; a package folder is not
        os.replace(staging, target)
    except BaseException:
        shutil.rmtree(staging, ignore_errors=True)
        raise
    return target
