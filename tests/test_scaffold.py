"""`llmb new-plugin`: the package it writes, checked without installing it (tests/test_plugin_packages.py installs)."""

import ast
import importlib.util
import typing

import pytest
from click.testing import CliRunner

from llmb.api.backend import overridden, public_methods
from llmb.cli import cli
from llmb.registry.plugins import get_backend, resolve_settings
from llmb.run.scaffold import contract


def new_plugin(*args):
    return CliRunner().invoke(cli, ["new-plugin", *args])


def test_writes_an_installable_package_with_every_method_stubbed(tmp_path):
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
    (cls,) = [node for node in tree.body if isinstance(node, ast.ClassDef)]
    assert (cls.name, [ast.unparse(b) for b in cls.bases]) == ("AcmeGpuBackend", ["Backend"])
    methods = {node.name: node for node in cls.body if isinstance(node, ast.FunctionDef)}
    assert list(methods) == public_methods()
    for name, signature, doc in contract():
        func = methods[name]
        assert [a.arg for a in func.args.args] == list(signature.parameters), name
        assert ast.get_docstring(func) == doc, name
    (hook,) = [node for node in tree.body if isinstance(node, ast.FunctionDef)]
    assert (hook.name, [ast.unparse(d) for d in hook.decorator_list]) == ("register_backends", ["hookimpl"])
    readme = (target / "README.md").read_text()
    assert all(f"`{name}`" in readme for name in public_methods())
    assert not [p for p in tmp_path.iterdir() if p.name.startswith(".")], "no staging folder left behind"


def test_generated_module_registers_a_backend_overriding_what_it_changes(tmp_path, register_backend):
    target = tmp_path / "pkg"
    assert new_plugin("acme_gpu", "--dir", str(target)).exit_code == 0
    spec = importlib.util.spec_from_file_location("llmb_acme_gpu", target / "llmb_acme_gpu.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    found = []
    module.register_backends(found.append)
    (backend,) = found
    register_backend(backend)
    assert get_backend("acme_gpu").backend is backend
    # Only the stubs that change something count; the rest hand their arguments to llmb's default (super()).
    assert overridden(backend) == ["device_types", "precisions", "available", "settings", "distributed_backend"]
    assert (backend.device_types(), backend.precisions(), backend.available()) == (["cpu"], ["FP32"], False)
    assert resolve_settings(backend, {"example": "true"}) == {"example": True}
    # What a vendor starts from is typed as llmb is, and every name its annotations use is imported (evaluated here:
    # an annotation is a string under `from __future__ import annotations`, so a missing import shows only to a tool).
    for function in [module.register_backends, *(getattr(type(backend), name) for name in public_methods())]:
        hints = typing.get_type_hints(function, vars(module))
        assert "return" in hints, function.__name__


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
