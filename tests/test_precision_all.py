"""`--precision all` is expanded once (llmb.spec.vocab.expand_precision): the run, the clean room's worker and the sweep
ask it, and no other llmb module writes its own loop over the precisions a plugin supports."""

from __future__ import annotations

import ast
from dataclasses import dataclass
from pathlib import Path
from types import SimpleNamespace

from llmb.spec import vocab as names

PACKAGE = Path(__file__).resolve().parents[1] / "llmb"
SUPPORTED = ("BF16", "FP32")  # out of llmb's order: the expansion's order is llmb's, never the plugin's


def test_all_is_every_supported_precision_in_llmbs_order():
    assert names.expand_precision("all", SUPPORTED) == (["FP32", "BF16"], ["TF32", "FP16"])
    assert names.expand_precision("ALL", names.PRECISIONS) == (list(names.PRECISIONS), [])
    assert names.expand_precision("bf16", SUPPORTED) == (["BF16"], [])
    assert names.expand_precision("TF32", SUPPORTED) == (["TF32"], [])  # the backend refuses it, not this


@dataclass(frozen=True)
class Job:
    plugin: str
    precision: str
    device: str | None = None


def test_the_sweep_and_the_clean_room_expand_alike(monkeypatch):
    from llmb.registry import plugins
    from llmb.run import clean_worker, sweep

    plugin = SimpleNamespace(backend=SimpleNamespace(precisions=lambda: SUPPORTED))
    monkeypatch.setattr(plugins, "select_backend", lambda name, device=None: plugin)
    notes = []
    link = SimpleNamespace(send=lambda kind, text: notes.append((kind, text)))

    expanded = clean_worker.expand_all([Job("fake", "ALL"), Job("fake", "FP16")], link)
    wanted, unsupported = names.expand_precision("all", SUPPORTED)
    assert [job.precision for job in expanded] == [*wanted, "FP16"]  # a named precision passes as it is
    assert notes == [("note", f"{name}: unsupported by this plugin") for name in unsupported]
    assert sweep.precisions_to_sweep(plugin, "all") == (wanted, unsupported)


def precision_filters(tree: ast.AST) -> list[int]:
    """Lines of comprehensions over PRECISIONS filtered by membership (`p for p in PRECISIONS if p in supported`):
    an `all` expansion written out."""
    found = []
    for node in ast.walk(tree):
        if not isinstance(node, (ast.ListComp, ast.GeneratorExp, ast.SetComp)):
            continue
        for generator in node.generators:
            source = generator.iter
            named = source.attr if isinstance(source, ast.Attribute) else getattr(source, "id", None)
            membership = any(
                isinstance(test, ast.Compare) and any(isinstance(op, (ast.In, ast.NotIn)) for op in test.ops)
                for test in generator.ifs
            )
            if named == "PRECISIONS" and membership:
                found.append(node.lineno)
    return found


def test_one_definition_of_the_expansion():
    sources = {str(path.relative_to(PACKAGE)): path.read_text() for path in sorted(PACKAGE.rglob("*.py"))}
    written = {name: lines for name, source in sources.items() if (lines := precision_filters(ast.parse(source)))}
    assert set(written) == {"spec/vocab.py"}, written
    # The three places that take `all` ask for it: the run (in the CLI), the clean room's worker and the sweep.
    asking = {name.removesuffix(".py") for name, text in sources.items() if "expand_precision(" in text}
    assert {"run/clean_worker", "run/sweep"} <= asking and any(name.startswith("cli/") for name in asking), asking
