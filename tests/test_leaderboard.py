"""`llmb leaderboard`: the site built from the reference bundle, a second bundle (a re-signed copy under another
name, as an archive), a forged one and an archive that is no bundle at all. The browser test is
tests/test_leaderboard_browser.py."""

from __future__ import annotations

import json
import re
import shutil
from pathlib import Path

import pytest
from conftest import invoke

from llmb.records import Result
from llmb.submit import leaderboard
from llmb.submit import package as submission

REFERENCE = Path(__file__).resolve().parent.parent / "submissions" / "llmb" / "cpu-reference"
HOSTILE = "<script>alert('owned')</script><img src=x onerror=alert(1)>"


def edit_json(path: Path, change) -> None:
    data = json.loads(path.read_text())
    change(data)
    path.write_text(json.dumps(data, indent=2))


def renamed_copy(folder: Path, submitter: str, system_name: str) -> Path:
    """The reference bundle under another submitter and system name, its summary re-rendered and re-signed: a
    second bundle that verifies as the reference does."""
    shutil.copytree(REFERENCE, folder)
    for name in (submission.SUBMISSION_JSON, submission.SYSTEM_JSON):
        edit_json(folder / name, lambda d: d.update(submitter=submitter, system_name=system_name))
    sub = json.loads((folder / submission.SUBMISSION_JSON).read_text())
    records = [Result.from_dict(json.loads((folder / p).read_text())) for p in sub["results"]]
    (folder / submission.SUMMARY_MD).write_text(submission.render_summary(sub, records))
    submission.write_manifest(folder)
    return folder


def forged_copy(folder: Path) -> Path:
    """The reference bundle with a doubled headline and markup in every name a page shows, re-signed (a forger can
    always re-sign the manifest: the recomputed figures are what catch it)."""
    shutil.copytree(REFERENCE, folder)
    edit_json(folder / submission.SUBMISSION_JSON, lambda d: d.update(system_name=HOSTILE, note=HOSTILE))
    edit_json(folder / submission.SYSTEM_JSON, lambda d: d.update(system_name=HOSTILE, hw_notes=HOSTILE))
    for path in (folder / "results").rglob("*.json"):

        def forge(record: dict) -> None:
            record["tokens_per_second"] *= 2
            record["device"]["name"] = HOSTILE

        edit_json(path, forge)
    (folder / submission.CODE_DIFF).write_text(f"--- a/llmb/x.py\n+++ b/llmb/x.py\n@@ -1 +1 @@\n-old\n+{HOSTILE}\n")
    submission.write_manifest(folder)
    return folder


@pytest.fixture(scope="module")
def bundles(tmp_path_factory) -> list[Path]:
    work = tmp_path_factory.mktemp("bundles")
    second = renamed_copy(work / "second", "acme", "second-system")
    archive = submission.write_archive(second, work / "second.tar.gz", "second-system")
    junk = work / "junk.tar.gz"
    junk.write_bytes(b"not a gzip stream at all")
    return [REFERENCE, archive, forged_copy(work / "forged"), junk]


@pytest.fixture(scope="module")
def site(bundles, tmp_path_factory) -> tuple[Path, list[leaderboard.Entry]]:
    out = tmp_path_factory.mktemp("site")
    return out, leaderboard.build(bundles, out)


def test_each_bundle_gets_its_verdict_and_the_forged_ones_fail_with_why(site):
    _, (reference, second, forged, junk) = site
    assert (reference.verdict, reference.system) == ("debug", "cpu-reference")
    assert (second.verdict, second.system, second.submitter) == ("debug", "second-system", "acme")
    assert [h.precision for h in second.headlines] == [h.precision for h in reference.headlines]
    assert forged.verdict == "failed" and "throughput recomputed" in forged.why
    assert (
        junk.verdict == "failed"
        and junk.why.startswith("archive: refused: not a readable tar archive")
        and not junk.headlines
    )


def test_the_index_holds_one_row_per_submission_and_precision_with_every_column(site):
    out, entries = site
    page = (out / "index.html").read_text()
    rows = re.findall(r"<tr data-precision='([^']*)' data-verdict='(\w+)'>", page)
    assert len(rows) == sum(max(1, len(e.headlines)) for e in entries)
    assert rows.count(("", "failed")) == 1  # the junk archive: one row, no figures
    for column in leaderboard.COLUMNS:
        assert f"<th>{column}</th>" in page
    for entry in entries:
        assert f"<a href='{entry.page}'>" in page and (out / entry.page).is_file()
    reference = entries[0]
    assert f"{reference.headlines[0].tokens_per_second:,.1f}" in page


def test_a_bundles_text_is_escaped_everywhere(site):
    out, entries = site
    for page in [out / "index.html", *(out / e.page for e in entries)]:
        text = page.read_text()
        assert "<img src=x" not in text and "alert('owned')</script>" not in text, page.name
        assert text.count("<script>") <= 1  # only the index's own script
    forged = (out / entries[2].page).read_text()
    assert html_escaped(HOSTILE) in forged


def html_escaped(text: str) -> str:
    import html

    return html.escape(text, quote=True)


def test_a_submission_page_shows_the_evidence(site):
    out, entries = site
    page = (out / entries[0].page).read_text()
    for heading in ("Verify verdict", "System", "Code changes", "Precision audit", "Sweep plots", "Conformance"):
        assert f"<h2>{heading}</h2>" in page, heading
    assert page.count("data:image/png;base64,") >= 2  # throughput and TFLOP/s against the batch, at least
    assert "summary.md</td><td>pass" in page and "forward-loss</td><td>pass" in page
    forged = (out / entries[2].page).read_text()
    assert "<span class='add'>+&lt;script&gt;" in forged  # the diff rendered as a diff, its text as text
    assert "Verdict: <b>failed</b>" in forged


def test_the_command_builds_the_site_and_says_each_verdict(bundles, tmp_path):
    result = invoke("leaderboard", *bundles, "--out", tmp_path / "site")
    assert result.exit_code == 0, result.output
    assert "debug: cpu-reference" in result.output and "failed: " in result.output
    assert (tmp_path / "site" / "index.html").is_file()
    blocked = tmp_path / "file"
    blocked.write_text("")
    refused = invoke("leaderboard", REFERENCE, "--out", blocked)
    assert refused.exit_code == 2 and "is not a writable folder" in refused.output


@pytest.mark.slow
def test_replay_replays_each_headline_window_as_verify_does(tmp_path):
    result = invoke("leaderboard", REFERENCE, "--out", tmp_path, "--replay")
    assert result.exit_code == 0, result.output
    page = (tmp_path / "submission-1.html").read_text()
    assert re.search(r"<td>replay</td><td>pass</td><td>9 headline windows replayed here", page)


def test_a_bundle_of_the_wrong_shapes_is_listed_as_failed_and_the_site_builds(tmp_path):
    """Every JSON file a page reads, with the wrong types where llmb writes objects, lists and strings."""
    bad = shutil.copytree(REFERENCE, tmp_path / "bad")
    edit_json(
        bad / submission.SUBMISSION_JSON,
        lambda d: d.update(plugins="cpu", results={"a": 1}, conformance=[7, None], system_name=5, debug=[]),
    )
    (bad / submission.SYSTEM_JSON).write_text("[1, 2]")
    (bad / submission.CODE_STATUS).write_text('{"files": "all"}')
    (bad / submission.CODE_DIFF).write_bytes(b"\xff\xfe not utf-8")
    submission.write_manifest(bad)
    (entry,) = leaderboard.build([bad], tmp_path / "site")
    assert entry.verdict == "failed" and "submission.json" in entry.why and not entry.headlines
    page = (tmp_path / "site" / entry.page).read_text()
    assert "system.json unreadable: system.json is not a JSON object" in page
    assert "code/llmb.diff unreadable" in page and "No plot: no readable result." in page
    assert (tmp_path / "site" / "index.html").read_text().count("<tr data-precision=") == 1


@pytest.mark.parametrize("where", ["inside", "same", "holds"])
def test_the_site_never_enters_replaces_or_holds_a_bundle(tmp_path, where):
    """A page written into a bundle breaks its manifest: `--out` inside a bundle, equal to it, or a folder that holds
    it is a one-line usage error, and nothing on disk changes."""
    bundle = shutil.copytree(REFERENCE, tmp_path / "bundles" / "reference")
    out = {"inside": bundle / "site", "same": bundle, "holds": tmp_path / "bundles"}[where]
    listed = {p: p.read_bytes() for p in sorted(tmp_path.rglob("*")) if p.is_file()}
    result = invoke("leaderboard", bundle, "--out", out)
    assert result.exit_code == 2, result.output
    assert "never replaces, enters or holds" in result.output
    assert {p: p.read_bytes() for p in sorted(tmp_path.rglob("*")) if p.is_file()} == listed
    assert not (bundle / "site").exists()


def test_an_efficiency_over_the_measured_matmul_peak_is_struck_through_with_why_and_not_sorted():
    from llmb.records import over_peak_warning

    def row(efficiency: float) -> str:
        headline = leaderboard.Headline(
            precision="FP32", device="cpu", tokens_per_second=1.0, per_device=1.0, mfu=None,
            matmul_peak_efficiency=efficiency, tokens_per_joule=None, energy="n/a", runs=3,
            over_peak=over_peak_warning(efficiency, "3.10"),
        )  # fmt: skip
        entry = leaderboard.Entry(source="x", page="submission-1.html", headlines=[headline])
        return leaderboard._index_rows(entry)[0]

    over, under = row(1.18), row(0.62)
    assert "<s>118.0%</s> over peak" in over and "data-v=''" in over and "load average 3.10" in over
    assert "62.0%" in under and "over peak" not in under and "data-v='0.62'" in under


def test_copies_of_one_bundle_are_listed_once_and_each_copy_named(tmp_path):
    """The same files in a second folder and in an archive are one submission: listed once, each copy named."""
    copy = shutil.copytree(REFERENCE, tmp_path / "copy")
    archive = submission.write_archive(copy, tmp_path / "copy.tar.gz", "cpu-reference")
    second = renamed_copy(tmp_path / "second", "acme", "second-system")  # other files: its own row
    result = invoke("leaderboard", REFERENCE, copy, archive, second, "--out", tmp_path / "site")
    assert result.exit_code == 0, result.output
    named = [line for line in result.output.splitlines() if line.startswith("skipped: ")]
    assert len(named) == 2 and all(f"the same bundle as {REFERENCE}" in line for line in named), result.output
    assert "2 submission(s)" in result.output
    index = (tmp_path / "site" / "index.html").read_text()
    assert index.count("second-system") >= 1 and not (tmp_path / "site" / "submission-3.html").exists()
