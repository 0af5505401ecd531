"""Text llmb did not write (exceptions, plugin names and settings, device names, paths, the fields of results and
bundles) as printable text: one line's worth, every character a reader can see for what it is. llmb.terminal's
consoles print it through ``clean``; so does what must print before or without a console (a hung process's last
line, llmb.api.errors)."""

from __future__ import annotations

import re
import unicodedata

# A few hundred characters: enough for an error message or a path, short enough to keep a table readable.
DETAIL_LIMIT = 400
# C0 and C1 controls and DEL; tab and newline stay (tables wrap on them), everything else is shown as \xNN.
_CONTROL = re.compile(r"[\x00-\x08\x0b-\x1f\x7f-\x9f]")
# Beyond ASCII, what a terminal draws as nothing or uses to reorder or hide text: controls, format characters (the
# bidi overrides and isolates U+202A-202E and U+2066-2069, zero-width ones, tags), line and paragraph separators,
# surrogates, private-use and unassigned code points; and Unicode's other default-ignorable code points that are
# letters or marks by category (Hangul fillers, variation selectors, the combining grapheme joiner).
_HIDDEN_CATEGORIES = frozenset({"Cc", "Cf", "Cs", "Co", "Cn", "Zl", "Zp"})
_IGNORABLE = re.compile("[\u034f\u115f\u1160\u17b4\u17b5\u180b-\u180f\u3164\ufe00-\ufe0f\uffa0\U000e0000-\U000e0fff]")
_NON_ASCII = re.compile(r"[^\x00-\x7f]")


def _escaped(c: str) -> str:
    n = ord(c)
    return f"\\x{n:02x}" if n <= 0xFF else f"\\u{n:04x}" if n <= 0xFFFF else f"\\U{n:08x}"


def _shown(match: re.Match) -> str:
    c = match.group()
    hidden = unicodedata.category(c) in _HIDDEN_CATEGORIES or _IGNORABLE.match(c)
    return _escaped(c) if hidden else c


def clean(value: object, limit: int | None = DETAIL_LIMIT) -> str:
    """``value`` as printable text: capped at ``limit`` characters (None: no cap), control characters as ``\\xNN``
    and invisible or reordering ones (bidi controls, zero-width characters, separators) as ``\\uNNNN``."""
    s = value if isinstance(value, str) else str(value)
    if limit is not None and len(s) > limit:
        s = f"{s[:limit]}... ({len(s) - limit:,} more characters)"
    s = _CONTROL.sub(lambda m: _escaped(m.group()), s)
    return s if s.isascii() else _NON_ASCII.sub(_shown, s)


def one_line(value: object, limit: int | None = DETAIL_LIMIT) -> str:
    """``clean``, its line breaks shown as ``\\n``: external text inside a line of llmb's own (an error's line, a
    file's name or a plugin's message inside a sentence) never starts a line of its own."""
    return clean(value, limit).replace("\n", "\\n")
