"""`llmb new-plugin`: the package it writes, checked without installing it (tests/test_plugin_packages.py installs)."""

import ast
import importlib.util

import pytest
from click.testing import CliRunner

from llmb.cli import cli
from llmb.plugins import Plugin
from llmb.scaffold import hook_specs


def new_plugin(*args):
    return CliRunner().invoke(cli, ["new-plugin", *args])


def test_writes_an_installable_package_with_every_hook_stubbed(tmp_path):
    target = tmp_path / "pkg"
    result = new_plugin("acme_gpu", "--dir", str(target))
    assert result.exit_code == 0, result.output
    assert sorted(p.relative_to(target).as_posix() for p in target.rglob("*") if p.is_file()) == [
        "README.md",
        "llmb_acme_gpu.py",
        "pyproject.toml",
        "tests/test_llmb_acme_gpu.py",
    ]
    pyproject = (target / "pyproject.toml").read_text()
    assert 'build-backend = "hatchling.build"' in pyproject
    assert 'name = "llmb-acme-gpu"' in pyproject
    assert '[project.entry-points.llmb]\nacme_gpu = "llmb_acme_gpu"' in pyproject

    tree = ast.parse((target / "llmb_acme_gpu.py").read_text())
    functions = {node.name: node for node in tree.body if isinstance(node, ast.FunctionDef)}
    for name, signature, doc in hook_specs():
        assert name in functions, name
        func = functions[name]
        assert [a.arg for a in func.args.args] == list(signature.parameters), name
        assert ast.get_docstring(func) == doc, name
        assert [ast.unparse(d) for d in func.decorator_list] == ["hookimpl"], name
    readme = (target / "README.md").read_text()
    assert all(f"`{name}`" in readme for name, _, _ in hook_specs())
    assert not [p for p in tmp_path.iterdir() if p.name.startswith(".")], "no staging folder left behind"


def test_generated_module_registers_every_hook(tmp_path, register_plugin):
    target = tmp_path / "pkg"
    assert new_plugin("acme_gpu", "--dir", str(target)).exit_code == 0
    spec = importlib.util.spec_from_file_location("llmb_acme_gpu", target / "llmb_acme_gpu.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    register_plugin(module, "acme_gpu")
    plugin = Plugin("acme_gpu")
    assert plugin.hooks() == sorted(name for name, _, _ in hook_specs())
    assert (plugin.device_types(), plugin.precisions(), plugin.available()) == (["cpu"], ["FP32"], False)
    assert plugin.resolve_settings({"example": "true"}) == {"example": True}


def test_default_directory_is_named_after_the_distribution(tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    result = new_plugin("acme")
    assert result.exit_code == 0, result.output
    assert (tmp_path / "llmb-acme" / "llmb_acme.py").is_file()


def test_an_empty_directory_may_be_filled(tmp_path):
    (tmp_path / "empty").mkdir()
    assert new_plugin("acme", "--dir", str(tmp_path / "empty")).exit_code == 0
    assert (tmp_path / "empty" / "pyproject.toml").is_file()


def test_an_existing_directory_is_refused(tmp_path):
    target = tmp_path / "pkg"
    assert new_plugin("acme", "--dir", str(target)).exit_code == 0
    before = (target / "llmb_acme.py").read_text()
    result = new_plugin("other", "--dir", str(target))
    assert result.exit_code == 2
    assert result.output.strip() == f"error: {target} already exists; choose another --dir"
    assert (target / "llmb_acme.py").read_text() == before


@pytest.mark.parametrize(
    "name, message",
    [
        ("Acme", "must be lower case letters, digits and _"),
        ("my-plugin", "must be lower case letters, digits and _"),
        ("9lives", "must be lower case letters, digits and _"),
        ("class", "must be lower case letters, digits and _"),
        ("cpu", "taken by llmb's built-in plugin"),
    ],
)
def test_bad_names_are_refused(tmp_path, name, message):
    result = new_plugin(name, "--dir", str(tmp_path / "pkg"))
    assert result.exit_code == 2
    assert message in result.output and "Traceback" not in result.output
    assert not (tmp_path / "pkg").exists()
