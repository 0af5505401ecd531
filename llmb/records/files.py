"""Reading record files written by anyone: one file's fault is that file's, never the whole command's.

Every reader of many records (report, features, package-submission, a resumed sweep) reads each file through
``read_object`` and each record through ``parse``: a file that is not a record raises ``Unreadable`` with one line
saying why (truncated, not UTF-8, nested too deep, a number out of range, not an object...), and the reader skips it
and names it with ``skipped_line``. Nothing that JSON or the record types can raise on hostile input escapes as a
traceback or as an unnamed ``error: RecursionError``.
"""

from __future__ import annotations

import json
import os
import re
import stat
from collections.abc import Iterable
from fnmatch import fnmatchcase
from pathlib import Path
from typing import Any, TypeVar

from llmb.api.errors import text_of
from llmb.records import RECORD_LIMIT, RecordError, codec
from llmb.terminal.console import clean

# Every schema id this llmb writes: a record of one of them is llmb's, whichever reader meets it.
KNOWN_SCHEMAS = frozenset(
    value for name, value in vars(codec).items() if name.endswith("_SCHEMA") and isinstance(value, str)
) | frozenset(codec.RESULT_SCHEMAS)

# llmb's records nest a few levels (result -> timing -> windows -> ...); far deeper is no record, and a structure
# nested past Python's recursion limit would break every later step (dumping, copying, comparing) if let through.
MAX_DEPTH = 64


class IrregularFile(ValueError):
    """A path that is no regular file of an acceptable size; the message starts with the path."""


def read_regular(path: Path, max_bytes: int) -> bytes:
    """A file someone else may have put in place (a result, a log, a system file): refused unless it is a regular
    file of at most max_bytes, and never waited on (a FIFO named x.json would hang a plain open())."""
    try:
        fd = os.open(path, os.O_RDONLY | os.O_NONBLOCK | os.O_CLOEXEC)
    except OSError as exc:
        raise IrregularFile(f"{path}: unreadable ({exc.strerror or exc.__class__.__name__})") from None
    try:
        info = os.fstat(fd)  # before any read: a folder, a FIFO or a device named x.json is named, never read
        if not stat.S_ISREG(info.st_mode):
            raise IrregularFile(f"{path}: {_kind_of(info.st_mode)}, not a regular file")
        if info.st_size > max_bytes:
            raise IrregularFile(f"{path}: {info.st_size} bytes (limit {max_bytes})")
        with os.fdopen(os.dup(fd), "rb") as f:
            data = f.read(max_bytes + 1)
    except OSError as exc:  # a read that fails (EIO, a file system gone): the file's fault, named as such
        raise IrregularFile(f"{path}: unreadable ({exc.strerror or exc.__class__.__name__})") from None
    finally:
        os.close(fd)
    if len(data) > max_bytes:
        raise IrregularFile(f"{path}: over {max_bytes} bytes (limit {max_bytes})")
    return data


def _kind_of(mode: int) -> str:
    kinds = [
        (stat.S_ISDIR, "a folder"),
        (stat.S_ISFIFO, "a FIFO"),
        (stat.S_ISSOCK, "a socket"),
        (stat.S_ISCHR, "a character device"),
        (stat.S_ISBLK, "a block device"),
    ]
    return next((name for test, name in kinds if test(mode)), "a special file")


class Unreadable(ValueError):
    """A file that is not a readable record; the message is one line saying why (without the file's name)."""


def _why_not_json(exc: BaseException) -> str:
    if isinstance(exc, json.JSONDecodeError):
        return f"not JSON ({exc.msg} at line {exc.lineno} column {exc.colno})"
    if isinstance(exc, UnicodeDecodeError):
        return f"not UTF-8 (byte {exc.start})"
    if isinstance(exc, RecursionError):
        return f"nested deeper than {MAX_DEPTH} levels"
    first = (str(exc).strip().splitlines() or [exc.__class__.__name__])[0]
    return f"not JSON ({first})"


# A lone surrogate (\ud800 in JSON) is no character: text holding one cannot be written to a file or printed.
_SURROGATE = re.compile("[\ud800-\udfff]")


def depth_problem(value: Any) -> str | None:
    """Why a parsed JSON value is no record's shape (nested too deep, a number no float can hold, text holding a
    lone surrogate), else None. Walked without recursion, so the check itself cannot overflow the stack."""
    stack = [(value, 1)]
    while stack:
        item, depth = stack.pop()
        if isinstance(item, (dict, list)):
            if depth > MAX_DEPTH:
                return f"nested deeper than {MAX_DEPTH} levels"
            if isinstance(item, dict):
                stack.extend((k, depth) for k in item)  # the keys are text too
            stack.extend((v, depth + 1) for v in (item.values() if isinstance(item, dict) else item))
        elif isinstance(item, int) and not isinstance(item, bool) and item.bit_length() > 1023:
            return f"a number out of range ({item.bit_length()}-bit integer)"
        elif isinstance(item, str) and _SURROGATE.search(item):
            return "not Unicode text (a lone surrogate escaped in a string)"
    return None


# What a record keeps of a value from outside (a plugin's facts, its device's name): far below what a reader refuses,
# so that a record llmb writes always reads back (a 70 MB fact, a fact nested 70 deep, a 1,329-bit integer or a lone
# surrogate each made `llmb run` write a result that every reader of results then refused).
VALUE_TEXT_LIMIT = 4096
VALUE_DEPTH_LIMIT = 16
VALUE_ITEMS_LIMIT = 1000
_INT_BITS = 1023  # the reader's limit above (depth_problem): a larger integer is kept as its text


def as_record_value(value: Any, text_limit: int = VALUE_TEXT_LIMIT, _depth: int = 0) -> Any:
    """`value` as a record keeps it: JSON's own types, every text Unicode (a lone surrogate replaced) and capped at
    `text_limit` characters, NaN and the infinities and integers past 1023 bits as their text, containers cut at
    VALUE_ITEMS_LIMIT items and VALUE_DEPTH_LIMIT levels (deeper as text), anything else as its text."""
    if value is None or isinstance(value, bool):
        return value
    if isinstance(value, int):
        return value if value.bit_length() <= _INT_BITS else _capped(hex(value), text_limit)
    if isinstance(value, float):
        return value if value == value and abs(value) != float("inf") else str(value)
    if isinstance(value, str):
        return _capped(value, text_limit)
    if isinstance(value, (dict, list, tuple)) and _depth < VALUE_DEPTH_LIMIT:
        items = list(value.items() if isinstance(value, dict) else enumerate(value))
        kept = [(k, as_record_value(v, text_limit, _depth + 1)) for k, v in items[:VALUE_ITEMS_LIMIT]]
        if isinstance(value, dict):
            out = {str(as_record_value(k if isinstance(k, str) else text_of(k), 200)): v for k, v in kept}
            return out | ({"...": f"{len(items) - VALUE_ITEMS_LIMIT} more items"} if len(items) > len(kept) else {})
        return [v for _, v in kept] + (
            [f"... {len(items) - VALUE_ITEMS_LIMIT} more items"] if len(items) > len(kept) else []
        )
    return _capped(text_of(value), text_limit)


def _capped(text: str, limit: int) -> str:
    text = _SURROGATE.sub("\ufffd", text)
    return text if len(text) <= limit else f"{text[:limit]}... ({len(text)} characters)"


def loads(text: str | bytes) -> Any:
    """JSON text as a value, refused (Unreadable) when it is not JSON or is too deep or too large in a number."""
    try:
        if isinstance(text, bytes):
            text = text.decode("utf-8")
        value = json.loads(text)
    except (ValueError, RecursionError) as exc:  # JSONDecodeError and UnicodeDecodeError are ValueErrors
        raise Unreadable(_why_not_json(exc)) from None
    problem = depth_problem(value)
    if problem:
        raise Unreadable(problem)
    return value


def read_object(path: Path, limit: int = RECORD_LIMIT) -> dict:
    """A file holding one JSON object (a FIFO, a giant or a vanished file refused, never waited on)."""
    try:
        data = read_regular(path, limit)
    except (OSError, ValueError) as exc:  # IrregularFile names the file itself: only the why is kept
        raise Unreadable(str(exc).removeprefix(f"{path}: ")) from None
    value = loads(data)
    if not isinstance(value, dict):
        raise Unreadable(f"not a JSON object (the top level is {type(value).__name__})")
    return value


T = TypeVar("T")


def parse(cls: type[T], data: dict) -> T:
    """A record of type ``cls`` (a records.Typed) from a parsed object; Unreadable names the first bad field."""
    try:
        return cls.from_dict(data)  # type: ignore[attr-defined]
    except RecordError as exc:
        raise Unreadable(f"incomplete llmb {cls.__name__.lower()} ({exc})") from None
    except (OverflowError, RecursionError, TypeError, ValueError) as exc:  # a value no field can hold
        raise Unreadable(f"not an llmb {cls.__name__.lower()} ({exc.__class__.__name__}: {exc})") from None


# A bundle's system description: the one JSON file llmb writes without a schema (it is the submitter's, merged).
SCHEMALESS_NAMES = frozenset({"system.json"})


def foreign(data: dict, path: Path | str, reads: Iterable[str]) -> str | None:
    """Why an object found among records is left out unread, or None when the reader takes it or it is an llmb
    record of another kind (a reader of results passes over a conformance record or a sweep summary in silence).

    A reader of many records names every file it does not take unless llmb wrote it: an object of no llmb schema
    (``{"hello": 1}``, an exported spreadsheet), or of a version of a kind it reads that this llmb does not know
    (``llmb.result/9``, written by a later llmb), is named, never dropped in silence."""
    schema = data.get("schema")
    if isinstance(schema, str) and schema in reads:
        return None
    if schema is None and Path(path).name in SCHEMALESS_NAMES:
        return None
    if not isinstance(schema, str):
        return "not an llmb record (no schema)" if schema is None else "not an llmb record (its schema is no text)"
    shown = clean(schema, limit=80)
    kinds = {s.rsplit("/", 1)[0] for s in reads}
    if schema.rsplit("/", 1)[0] in kinds:
        return f"a version this llmb does not read ({shown}; it reads {', '.join(sorted(reads))})"
    if schema in KNOWN_SCHEMAS:
        return None
    if schema.startswith("llmb."):
        return f"an llmb record this llmb does not know (schema {shown})"
    return f"not an llmb record (schema {shown})"


def under(directory: Path, *patterns: str) -> list[Path]:
    """The files a reader of many records reads in a folder (searched recursively), sorted: every name matching one
    of ``patterns`` but those on a hidden path, which hold a sweep's scratch (a trial in flight) and the temporary
    files of atomic writes. A folder named x.json is searched like any folder, not read; anything else found (a
    FIFO, a link to a folder, which is never followed, a folder that cannot be listed) is for ``read_object`` to
    name."""
    # os.walk, not Path.rglob: a sub-folder that vanishes or is replaced while the folder is walked (a sweep writing
    # beside the reader, a user tidying up) is passed by, where rglob raised FileNotFoundError out of every reader.
    # Neither follows a link to a folder; hidden folders are not entered (nothing under them is read). A folder that
    # cannot be listed (no permission) is found as itself, so that its reader names it: never passed over in silence.
    found = []

    def unlisted(exc: OSError) -> None:
        if not isinstance(exc, (FileNotFoundError, NotADirectoryError)) and exc.filename is not None:
            found.append(Path(exc.filename))

    for root, folders, names in os.walk(directory, onerror=unlisted):
        folders[:] = [name for name in folders if not name.startswith(".")]
        links = [name for name in folders if (Path(root) / name).is_symlink()]  # a folder found is walked, not read
        found += [Path(root) / name for name in links + names if any(fnmatchcase(name, p) for p in patterns)]
    return sorted(f for f in found if not f.name.startswith("."))


def skipped_line(path: Path | str, why: object) -> str:
    """The one line a reader prints for a file it leaves out."""
    return f"{path}: {why}"


def none_read_line(what: str, paths: Iterable[Path | str], skipped: list[str]) -> str:
    """The one line of a reader that found nothing to read: where it looked and, first, the files it left out
    (the reason, said once, not a warning line and then an error)."""
    left_out = f" (skipped: {'; '.join(skipped[:3])})" if skipped else ""
    return f"no llmb {what} found in {', '.join(map(str, paths))}{left_out}"


def duplicate_line(path: Path | str, run_id: str, kept: Path | str) -> str:
    """The one line for a result left out because a run with the same id was read first."""
    return f"{path}: run {run_id} already read from {kept} (a second record of one run; this one is left out)"
