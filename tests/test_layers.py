"""Layers point one way: every folder of llmb is a layer of .importlinter's contracts, which hold; what reads records
never imports what runs plugins (checked in fresh interpreters); `import llmb` and every `--help` import no torch."""

from __future__ import annotations

import ast
import importlib.util
import resource
import subprocess
import sys
from pathlib import Path

import pytest

from llmb.cli import cli
from llmb.spec import vocab as names

PACKAGE = Path(__file__).resolve().parents[1] / "llmb"


def layers() -> list[str]:
    """The packages of .importlinter's layers contract, highest layer first, read by the one reader the docs use
    (scripts/gen_docs.py's layer_order)."""
    spec = importlib.util.spec_from_file_location("gen_docs", PACKAGE.parent / "scripts" / "gen_docs.py")
    gen_docs = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(gen_docs)
    return [package for layer in gen_docs.layer_order(gen_docs.contracts()) for package in layer]


def test_every_folder_of_llmb_is_a_layer():
    """A new folder (or a module at llmb's top) cannot escape the contracts: each is a layer of the layers contract.
    The cpu plugin (default_plugins) is a plugin, not a layer: the judge contract keeps the judge out of it."""
    folders = {f"llmb.{p.parent.name}" for p in PACKAGE.glob("*/__init__.py")} - {"llmb.default_plugins"}
    modules = {f"llmb.{p.stem}" for p in PACKAGE.glob("*.py")} - {"llmb.__init__", "llmb.__main__"}
    assert folders | modules == set(layers()), sorted((folders | modules) ^ set(layers()))


def test_the_distributed_job_sits_below_the_runner():
    order = layers()
    assert order.index("llmb.run") < order.index("llmb.distributed") and order.index("llmb.judge") < order.index(
        "llmb.distributed"
    )


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
    assert not {"llmb.run.runner", "llmb.distributed.job", "llmb.registry.plugins"} & loaded


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
    from llmb.distributed import job as distributed

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
    loaded = modules_after(
        "import llmb.records, llmb.report, llmb.verify, llmb.submit.leaderboard, llmb.submit.reproduce"
    )
    assert {"llmb.records", "llmb.report", "llmb.verify", "llmb.submit.leaderboard"} <= loaded
    assert "torch" not in loaded
    run_side = ("llmb.run", "llmb.training", "llmb.judge", "llmb.audit", "llmb.distributed", "llmb.toolkit")
    assert not {m for m in loaded if m.startswith(run_side)}


def test_no_module_of_llmb_is_over_500_lines():
    """Modules small with one job: a module past 500 lines holds more than one and is split into its package."""
    lines = {str(p.relative_to(PACKAGE)): len(p.read_text().splitlines()) for p in PACKAGE.rglob("*.py")}
    assert not {name: n for name, n in lines.items() if n > 500}


def _import_runs_in_functions(path: Path) -> list[tuple[int, bool]]:
    """Each run of consecutive import statements inside a function: its first line, and whether a comment says why
    (on one of its lines, or on the line above it)."""
    source = path.read_text().splitlines()
    runs = []
    for function in ast.walk(ast.parse("\n".join(source))):
        if not isinstance(function, (ast.FunctionDef, ast.AsyncFunctionDef)):
            continue
        for node in ast.walk(function):
            for name in ("body", "orelse", "finalbody"):
                statements = getattr(node, name, None)
                if not isinstance(statements, list):
                    continue
                run: list[ast.stmt] = []
                for statement in [*statements, None]:
                    if isinstance(statement, (ast.Import, ast.ImportFrom)):
                        run.append(statement)
                        continue
                    if run:
                        first, last = run[0].lineno, run[-1].end_lineno or run[-1].lineno
                        above = source[first - 2].strip() if first > 1 else ""
                        said = above.startswith("#") or any("#" in line for line in source[first - 1 : last])
                        runs.append((first, said))
                        run = []
    return runs


def test_an_import_inside_a_function_is_lazy_on_purpose_and_says_why():
    """The layers hold by every import (lint-imports reads them all), so an import inside a function is there only
    where loading late is the point (torch for --help, an optional extra, a job-only torch.distributed part), and a
    comment says which; anything else goes at the top of its module."""
    silent = [
        f"{path.relative_to(PACKAGE.parent)}:{line}"
        for path in sorted(PACKAGE.rglob("*.py"))
        for line, said in _import_runs_in_functions(path)
        if not said
    ]
    assert silent == [], silent
