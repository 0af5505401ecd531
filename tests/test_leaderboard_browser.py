"""The leaderboard as a reviewer's browser runs it: a real headless Chromium loads the site (its inline script run)
and dumps the DOM; the table, its filter and sort, a submission page and the forged bundle's verdict are read from
what the browser built. CI installs Debian's chromium (.ci/run); without a browser the test is skipped and says why."""

from __future__ import annotations

import subprocess
from html.parser import HTMLParser
from pathlib import Path

from test_leaderboard import REFERENCE, forged_copy, renamed_copy
from test_report_browser import FLAGS, browser

from llmb.submit import leaderboard


def dump_dom(chrome: str, url: str, profile: Path) -> str:
    command = [chrome, *FLAGS, f"--user-data-dir={profile}", "--dump-dom", url]
    done = subprocess.run(command, capture_output=True, text=True, timeout=120)
    assert done.returncode == 0 and done.stdout.strip(), done.stderr[-2000:]
    return done.stdout


class Rows(HTMLParser):
    """The board's body rows as the browser left them: each row's cells' text, and whether it is hidden."""

    def __init__(self) -> None:
        super().__init__()
        self.rows: list[tuple[list[str], bool]] = []
        self.in_body = False
        self.cell: list[str] | None = None

    def handle_starttag(self, tag, attrs):
        if tag == "tbody":
            self.in_body = True
        elif tag == "tr" and self.in_body:
            self.rows.append(([], "hidden" in dict(attrs)))
        elif tag == "td" and self.in_body:
            self.cell = []

    def handle_endtag(self, tag):
        if tag == "tbody":
            self.in_body = False
        elif tag == "td" and self.cell is not None:
            self.rows[-1][0].append("".join(self.cell).strip())
            self.cell = None

    def handle_data(self, data):
        if self.cell is not None:
            self.cell.append(data)


def board(dom: str) -> list[tuple[dict[str, str], bool]]:
    parser = Rows()
    parser.feed(dom)
    return [(dict(zip(leaderboard.COLUMNS, cells, strict=True)), hidden) for cells, hidden in parser.rows]


def test_the_leaderboard_renders_sorts_and_filters_in_a_headless_browser(tmp_path):
    chrome = browser()
    second = renamed_copy(tmp_path / "second", "acme", "second-system")
    forged = forged_copy(tmp_path / "forged")
    out = tmp_path / "site"
    entries = leaderboard.build([REFERENCE, second, forged], out)
    profile = tmp_path / "profile"
    profile.mkdir()
    index = (out / "index.html").as_uri()

    rows = board(dump_dom(chrome, index, profile))
    assert len(rows) == sum(len(e.headlines) for e in entries) and not any(hidden for _, hidden in rows)
    systems = {row["System"] for row, _ in rows}
    assert {"cpu-reference", "second-system"} <= systems
    forged_rows = [row for row, _ in rows if row["Verdict"] == "failed"]
    assert forged_rows and all("throughput recomputed" in row["Why"] for row in forged_rows)
    assert all(row["Verdict"] == "debug" for row, _ in rows if row["System"] in ("cpu-reference", "second-system"))

    # The script's filter and sort, driven by the page's query string.
    shown = board(dump_dom(chrome, f"{index}?verdict=failed&sort=Tokens/s&order=down", profile))
    visible = [row for row, hidden in shown if not hidden]
    assert visible and all(row["Verdict"] == "failed" for row in visible)
    assert len(visible) == len(forged_rows)
    speeds = [float(row["Tokens/s"].replace(",", "")) for row in visible]
    assert speeds == sorted(speeds, reverse=True)
    fp32 = [row for row, hidden in board(dump_dom(chrome, f"{index}?precision=FP32", profile)) if not hidden]
    assert len(fp32) == 3 and {row["Precision"] for row in fp32} == {"FP32"}

    page = dump_dom(chrome, (out / entries[0].page).as_uri(), profile)
    assert "Verdict: <b>debug</b>" in page and "<h2>Precision audit</h2>" in page
    assert "data:image/png;base64," in page
    forged_page = dump_dom(chrome, (out / entries[2].page).as_uri(), profile)
    assert "Verdict: <b>failed</b>" in forged_page and "throughput recomputed" in forged_page
    assert "<img src=x" not in forged_page  # the forged names stay text in the browser's DOM too
