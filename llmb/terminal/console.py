"""All of llmb's terminal output goes through here.

Text that llmb did not write (exceptions, plugin names and settings, device names, paths, the fields of results and
bundles) is data: it is never parsed as rich markup, its control characters are shown as ``\\xNN`` (an ESC sequence
from a competitor's bundle must not retitle, clear or write to a reviewer's terminal) and each piece is capped so
that a 60 MB string costs one short line. The consoles themselves are built with markup, emoji and highlighting off,
so even a string that slipped past ``text()`` is printed as the characters it holds.
"""

from __future__ import annotations

import os
import re
import sys
from typing import Any

from rich.console import Console
from rich.table import Table
from rich.text import Text

from llmb.spec.printable import DETAIL_LIMIT, clean, one_line

# Off a terminal nothing is truncated to fit 80 columns: a pasted path or number must be whole (rich's default there).
_WIDE = 240


# What Markdown (CommonMark, GitHub's tables) could read as markup in the records' text: each is backslash-escaped,
# so a device named "<img src=x>" or "**fast**" is shown as written, never rendered. An underscore between two
# letters or digits opens no emphasis, so setting names (oom_above_batch_size) stay readable.
MARKDOWN_SPECIAL = frozenset("\\`*_[]<>|&~#$")  # $: GitHub's inline math ($\\color{red}{...}$)
# At the start of a line of its own (a note in summary.md), these open a list, a rule or a heading: escaped there.
_MARKDOWN_BLOCK_START = re.compile(r"^(\s*)([-+](?=\s|$)|\d{1,9}(?=[.)](\s|$))|[-=](?=[-=\s]*$))")
# Line breaks and tabs are shown as \n and \t: text from a record never starts a line of its own (a heading, a rule,
# a list, a table row of its own) nor ends a table's row.
_MARKDOWN_BREAKS = {"\n": "\\n", "\t": "\\t"}
# A spreadsheet evaluates a cell starting with one of these as a formula (OWASP's CSV injection rule).
CSV_FORMULA_START = ("=", "+", "-", "@", "\t", "\r")


def markdown(value: object) -> str:
    """Text from records as Markdown shows it literally, on one line: printable (``clean``), every markup character
    escaped, line breaks shown as \\n."""
    text = clean(value, limit=None)
    out = []
    for i, c in enumerate(text):
        intraword = c == "_" and 0 < i < len(text) - 1 and text[i - 1].isalnum() and text[i + 1].isalnum()
        out.append(_MARKDOWN_BREAKS.get(c) or ("\\" + c if c in MARKDOWN_SPECIAL and not intraword else c))
    shown = "".join(out)
    block = _MARKDOWN_BLOCK_START.match(shown)
    if block:  # "- x", "+ x", "===", "1. x": the marker escaped ("1\\. x"), so the line stays a paragraph
        at = block.end() if block.group(2).isdigit() else block.start(2)
        shown = shown[:at] + "\\" + shown[at:]
    return shown


# What a spreadsheet skips before it looks for a formula: blanks of any kind and quotes (a cell '"=1+1' or " =1+1"
# is a formula to some), and the characters that draw as nothing.
_CSV_LEAD = re.compile(r"""^[\s"'`\u200b-\u200f\u2028-\u202f\u2060-\u206f\ufeff]*""")


def csv_cell(value: str) -> str:
    """Text from records as a CSV cell: printable (``clean``), and a leading formula character (also after blanks,
    quotes or invisible characters) neutralised with a ``'`` so that a spreadsheet shows the text instead of
    evaluating it."""
    text = clean(value, limit=None)
    formula = value.startswith(CSV_FORMULA_START) or any(
        _CSV_LEAD.sub("", s, count=1).startswith(CSV_FORMULA_START) for s in (value, text)
    )
    return "'" + text if formula else text


def text(value: object, style: str = "", limit: int | None = DETAIL_LIMIT) -> Text:
    """External text as a rich ``Text``: never markup, control characters shown, capped."""
    return Text(clean(value, limit), style=style)


def _one_line(value: object, style: str = "") -> Text:
    """External text inside a line: as ``text()``, and its line breaks shown as ``\\n`` (a file's name or a plugin's
    exception must not start a line of its own that reads as llmb's)."""
    return Text(one_line(value), style=style)


def line(*parts: object) -> Text:
    """One line from parts: a ``(value, style)`` pair is styled, anything else is external text (``text()``, its
    line breaks shown as ``\\n``)."""
    out = Text()
    for part in parts:
        if isinstance(part, Text):
            out.append_text(part)
        elif isinstance(part, tuple):
            value, style = part
            out.append_text(_one_line(value, style))
        else:
            out.append_text(_one_line(part))
    return out


class _Unpadded:
    """Off a terminal (a log, a pipe): the stream of the moment with each line's trailing spaces cut, so a title or
    a note is not padded out to the width of the table it heads (up to _WIDE columns of blanks in a log file)."""

    def __init__(self, stderr: bool) -> None:
        self.stderr = stderr

    @property
    def stream(self):
        return sys.stderr if self.stderr else sys.stdout  # read at each write: click's test runner swaps them

    def write(self, text: str) -> int:
        return self.stream.write(_TRAILING.sub("\n", text))

    def flush(self) -> None:
        self.stream.flush()

    def isatty(self) -> bool:
        return False

    @property
    def encoding(self) -> str:
        return getattr(self.stream, "encoding", None) or "utf-8"


_TRAILING = re.compile(r"[ \t]+\n")


def _console(stderr: bool) -> Console:
    stream = sys.stderr if stderr else sys.stdout
    terminal = hasattr(stream, "isatty") and stream.isatty()
    width = None if terminal or os.environ.get("COLUMNS") else _WIDE
    file = None if terminal else _Unpadded(stderr)
    return Console(file=file, stderr=stderr, markup=False, emoji=False, highlight=False, width=width)


# Console reads sys.stdout/sys.stderr at each print, so click's test runner still captures these.
out = _console(stderr=False)
err = _console(stderr=True)


def say(*parts: object, stderr: bool = False) -> None:
    """Print one line (see ``line()``); long lines wrap, never truncate."""
    (err if stderr else out).print(line(*parts), soft_wrap=True)


def error(*parts: object) -> None:
    say(("error:", "bold red"), " ", *parts, stderr=True)


def warning(*parts: object) -> None:
    say(("warning:", "yellow"), " ", *parts, stderr=True)


def table(title: object = None, *, show_header: bool = True, **kwargs: Any) -> Table:
    """A table whose title is external text on one line (a device name's line break cannot forge a line of its
    own); add columns with ``column()`` so that nothing is cut."""
    caption = title if isinstance(title, Text) or title is None else line(title)
    return Table(title=caption, title_justify="left", show_header=show_header, **kwargs)


# A column of prose (a setting's help, a list of methods) wraps at this width, on a terminal or off one: a log's
# table is then as wide as a reader's window, not _WIDE columns of one long line beside padded short ones.
PROSE = 100


def column(t: Table, header: str, *, numeric: bool = False, style: str = "", prose: bool = False) -> None:
    """A column that folds long values instead of cutting them ("…"); numbers never wrap; prose wraps at PROSE."""
    t.add_column(
        header,
        justify="right" if numeric else "left",
        overflow="fold",
        no_wrap=numeric,
        style=style,
        max_width=PROSE if prose else None,
    )


def row(t: Table, *cells: object) -> None:
    """A row of external values (``Text`` cells, pre-styled by llmb, pass through)."""
    t.add_row(*(c if isinstance(c, Text) else text(c) for c in cells))
