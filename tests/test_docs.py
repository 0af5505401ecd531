"""The documentation: the generated reference pages are what the code makes now, the README is short and its links
land, and (where mkdocs is installed, as in `tox -e docs`) the site builds with every link and anchor checked."""

from __future__ import annotations

import importlib.util
import re
import subprocess
import sys
import unicodedata
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent
README = ROOT / "README.md"


def gen_docs():
    spec = importlib.util.spec_from_file_location("gen_docs", ROOT / "scripts" / "gen_docs.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def test_the_committed_reference_pages_are_what_the_generator_makes_now():
    module = gen_docs()
    for name, make in module.PAGES.items():
        committed = (ROOT / "docs" / "reference" / name).read_text()
        assert committed == make(), f"docs/reference/{name} is stale: run `python scripts/gen_docs.py` and commit it"


def test_a_docstring_changed_without_regenerating_fails_the_check(tmp_path, monkeypatch, capsys):
    from llmb import Backend

    module = gen_docs()
    monkeypatch.setattr(module, "REFERENCE", tmp_path)
    assert module.main([]) == 0 and module.main(["--check"]) == 0
    monkeypatch.setattr(Backend.setup, "__doc__", "A contract someone changed.")
    assert module.main(["--check"]) == 1
    err = capsys.readouterr().err
    assert "backend.md" in err and "records.md" not in err


def test_the_reference_covers_every_export_method_hook_and_record():
    import llmb
    from llmb import records
    from llmb.api import hookspecs
    from llmb.api.backend import Backend

    module = gen_docs()
    api, schema = module.api_page(), module.schema_page()
    assert all(f"## {name}\n" in api for name in llmb.__all__ if not name.startswith("_"))
    assert all(f"### `{name}(" in api for name, v in vars(Backend).items() if callable(v) and not name[0] == "_")
    assert "### `register_backends(register: Callable[[Backend], None]) -> None`" in api
    assert hookspecs.register_backends.__doc__.strip() in api
    for cls in (records.Result, records.Conformance, records.Commbench):
        assert f"schema id `{cls.SCHEMA}`" in schema and f"<!-- fields:{cls.__name__} -->" in schema
    assert "| `timing` | [Timing](#timing) |" in schema and "| `window_seconds` | number |" in schema


def test_the_readme_is_under_200_lines_and_keeps_the_quick_start():
    text = README.read_text()
    assert len(text.splitlines()) < 200
    blocks = re.findall(r"```bash\n(.*?)```", text, re.S)
    assert [b.strip() for b in blocks] == [
        "pip install torch==2.13.0 -e . && llmb run --device cpu --preset small --steps 10 --warmup-steps 2",
        "pip install tox && tox",
    ]


def slug(heading: str) -> str:
    """An anchor as mkdocs (Python-Markdown's toc) makes it from a heading's text."""
    text = re.sub(r"[`*]", "", heading)
    text = unicodedata.normalize("NFKD", text).encode("ascii", "ignore").decode()
    return re.sub(r"[-\s]+", "-", re.sub(r"[^\w\s-]", "", text).strip().lower())


def anchors(page: Path) -> set[str]:
    text = re.sub(r"```.*?```", "", page.read_text(), flags=re.S)
    return {slug(h) for h in re.findall(r"^#+ (.+)$", text, re.M)}


def test_every_link_of_the_readme_lands_on_a_page_and_an_anchor_that_exist():
    links = re.findall(r"\]\(([^)\s]+)\)", README.read_text())
    assert any(link.startswith("docs/") for link in links)
    for link in links:
        assert not re.match(r"\w+://", link), f"{link}: the README links inside the repository only"
        path, _, anchor = link.partition("#")
        target = ROOT / path
        assert target.is_file(), f"README links to {link}, which does not exist"
        if path.startswith("docs/"):
            assert target.suffix in (".md", ".png"), f"{link}: link to the Markdown page, as mkdocs does"
        if anchor:
            assert anchor in anchors(target), f"README links to {link}: {path} has no heading #{anchor}"


def test_every_docs_page_is_in_the_site_navigation():
    nav = (ROOT / "mkdocs.yml").read_text()
    pages = sorted(p.relative_to(ROOT / "docs").as_posix() for p in (ROOT / "docs").rglob("*.md"))
    assert [p for p in pages if f": {p}\n" not in nav] == []


def test_the_site_builds_with_every_link_and_anchor_checked(tmp_path):
    pytest.importorskip("mkdocs", reason="mkdocs is installed by `tox -e docs`")
    built = subprocess.run(
        [sys.executable, "-m", "mkdocs", "build", "--strict", "--site-dir", str(tmp_path / "site")],
        cwd=ROOT,
        capture_output=True,
        text=True,
    )
    assert built.returncode == 0, built.stderr[-3000:]
