"""Style the brief asks for and a tool checks: type hints on every public function of llmb and of the first-party
plugins (what a vendor copies), read from the source, so a new function without them fails here, not in review."""

from __future__ import annotations

import ast
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
PUBLIC_SOURCES = [ROOT / "llmb", *sorted((ROOT / "plugins").glob("*/llmb_*.py"))]
# Files whose bytes are a released fact, edited only with a release of their own: the model's definition is its
# fingerprint (llmb/spec/fingerprint.py), so a hint added there would be a new model release and void every result.
FROZEN = {ROOT / "llmb" / "model.py"}


def _python_files(source: Path) -> list[Path]:
    return sorted(source.rglob("*.py")) if source.is_dir() else [source]


def _is_public(name: str) -> bool:
    return not name.startswith("_") or (name.startswith("__") and name.endswith("__"))


def unhinted(path: Path, root: Path = ROOT) -> list[str]:
    """The public functions of a module (module level, and methods of its public classes) with a parameter or a
    return left without a type: ``file:line name (what is missing)``. ``self`` and ``cls`` need none, nor
    ``__init__`` a return; nested functions are private to the one that holds them."""
    missing = []

    def visit(body: list[ast.stmt], owner: str) -> None:
        for node in body:
            if isinstance(node, ast.ClassDef) and _is_public(node.name):
                visit(node.body, f"{owner}{node.name}.")
            elif isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef)) and _is_public(node.name):
                arguments = node.args.posonlyargs + node.args.args + node.args.kwonlyargs
                if owner and arguments and arguments[0].arg in ("self", "cls"):
                    arguments = arguments[1:]
                absent = [a.arg for a in arguments if a.annotation is None]
                absent += [f"*{a.arg}" for a in (node.args.vararg, node.args.kwarg) if a and a.annotation is None]
                if node.returns is None and node.name != "__init__":
                    absent.append("return")
                if absent:
                    missing.append(f"{path.relative_to(root)}:{node.lineno} {owner}{node.name} ({', '.join(absent)})")

    visit(ast.parse(path.read_text()).body, "")
    return missing


def test_every_public_function_has_type_hints():
    paths = [path for source in PUBLIC_SOURCES for path in _python_files(source) if path not in FROZEN]
    missing = [line for path in paths for line in unhinted(path)]
    assert missing == [], "\n".join(missing)


def test_the_check_sees_a_missing_hint(tmp_path):
    """The walker itself: a public function, a public method and a return without types are named; private ones,
    self and nested functions are not."""
    module = tmp_path / "m.py"
    module.write_text(
        "def f(a, b: int) -> int: ...\n"
        "def g(a: int): ...\n"
        "def _h(a): ...\n"
        "class C:\n"
        "    def __init__(self, x) -> None:\n"
        "        def inner(y): ...\n"
        "    def m(self, *args: int, **kwargs) -> None: ...\n"
        "class _P:\n"
        "    def m(self, a): ...\n"
    )
    named = ["m.py:1 f (a)", "m.py:2 g (return)", "m.py:5 C.__init__ (x)", "m.py:7 C.m (*kwargs)"]
    assert unhinted(module, root=tmp_path) == named
