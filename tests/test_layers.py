"""Layers point one way: what reads records never imports what runs plugins (checked in fresh interpreters);
`import llmb` and every `--help` import no torch; the runner and distributed do not import each other."""

from __future__ import annotations

import ast
import resource
import subprocess
import sys
from pathlib import Path

import pytest

from llmb import names
from llmb.cli import cli

PACKAGE = Path(__file__).resolve().parents[1] / "llmb"


def imported_llmb_modules(module: str) -> set[str]:
    """The llmb modules a module imports anywhere in its source (top level or inside functions)."""
    tree = ast.parse((PACKAGE / f"{module}.py").read_text())
    found = set()
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            found |= {alias.name for alias in node.names if alias.name.startswith("llmb.")}
        elif isinstance(node, ast.ImportFrom) and node.module and node.module.startswith("llmb"):
            found |= {node.module} if node.module != "llmb" else {f"llmb.{alias.name}" for alias in node.names}
    return {name.removeprefix("llmb.") for name in found}


def test_distributed_does_not_import_the_runner():
    assert "runner" in imported_llmb_modules("runner") or "distributed" in imported_llmb_modules("runner")
    assert "runner" not in imported_llmb_modules("distributed")


def modules_after(code: str) -> set[str]:
    proc = subprocess.run(
        [sys.executable, "-c", f"{code}\nimport sys\nprint('MODULES:' + ' '.join(sys.modules))"],
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert proc.returncode == 0, proc.stderr
    return set(proc.stdout.rsplit("MODULES:", 1)[1].split())


def test_import_llmb_imports_no_torch():
    loaded = modules_after("import llmb\nfrom llmb import Backend, Peak, PrecisionFact, Setting, hookimpl")
    assert "torch" not in loaded
    assert not {"llmb.runner", "llmb.distributed", "llmb.plugins"} & loaded


def test_every_help_answers_without_importing_torch():
    commands = sorted(cli.commands)
    code = "\n".join(
        [
            "from llmb.cli import cli",
            f"for command in {[[]] + [[c] for c in commands]!r}:",
            "    try:",
            "        cli.main([*command, '--help'], prog_name='llmb')",
            "    except SystemExit as exc:",
            "        assert exc.code == 0, (command, exc.code)",
        ]
    )
    loaded = modules_after(code)
    assert "torch" not in loaded, "a --help imported torch"
    assert len(commands) >= 10


def test_llmb_help_takes_under_a_second():
    # CPU seconds of the child, not wall time: on a shared 2-core machine the wall clock measures the neighbours.
    # Importing torch alone costs several CPU seconds, so this fails the moment a --help imports it.
    for args in (["--help"], ["run", "--help"], ["sweep", "--help"], ["check-plugin", "--help"]):
        before = resource.getrusage(resource.RUSAGE_CHILDREN)
        proc = subprocess.run([sys.executable, "-m", "llmb", *args], capture_output=True, timeout=120)
        after = resource.getrusage(resource.RUSAGE_CHILDREN)
        assert proc.returncode == 0
        cpu = (after.ru_utime - before.ru_utime) + (after.ru_stime - before.ru_stime)
        assert cpu < 1.0, (args, cpu)


def test_the_cli_vocabulary_matches_what_the_modules_build():
    from llmb import distributed

    assert distributed.PARALLEL is names.PARALLEL


@pytest.mark.parametrize("command", ["run", "sweep"])
def test_preset_choices_are_offered(command):
    from click.testing import CliRunner

    result = CliRunner().invoke(cli, [command, "--help"])
    assert result.exit_code == 0 and "official|small|tiny" in result.output


def test_the_layers_contracts_hold():
    """.importlinter's contracts (the lint env runs them too): every import counts, inside functions as well."""
    code = "import sys; from importlinter.cli import lint_imports_command; sys.exit(lint_imports_command())"
    proc = subprocess.run(
        [sys.executable, "-c", code, "--config", ".importlinter", "--no-cache"],
        cwd=PACKAGE.parent,
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert proc.returncode == 0, proc.stdout[-4000:] + proc.stderr[-2000:]
    assert "0 broken" in proc.stdout


def test_what_reads_records_imports_no_torch():
    """The check the issue names: `python -c "import llmb.records, llmb.report, llmb.verify"` loads no torch (a
    fresh interpreter: the contracts see imports, this sees what really loads)."""
    loaded = modules_after("import llmb.records, llmb.report, llmb.verify, llmb.leaderboard, llmb.reproduce")
    assert {"llmb.records", "llmb.report", "llmb.verify", "llmb.leaderboard"} <= loaded
    assert "torch" not in loaded
    assert not {m for m in loaded if m.startswith(("llmb.runner", "llmb.plugins", "llmb.train", "llmb.cleanroom"))}
