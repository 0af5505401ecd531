"""Where llmb writes: never over, into or around what the same command reads, and never where a record's text says.

A command checks its outputs against its inputs before it reads or writes anything (``refuse_overlap``): an output
that is an input (a report over its own result), sits inside an input folder (a file a later read would pick up)
or holds one (a bundle folder replaced over the results it is made from) is a usage error. Text from a record (a
run id, a plugin or precision name) becomes part of a file name only through ``name_part``: no separator, no
``..``, no hidden name, never longer than a file system takes.
"""

from __future__ import annotations

import os
import re
from collections.abc import Iterable, Mapping
from pathlib import Path

from llmb.api.errors import UsageError

# The characters `llmb verify` takes in a bundle's file names (and every file system does): all else becomes "_".
_UNSAFE = re.compile(r"[^A-Za-z0-9._+-]")
# Well under the 255 bytes of a file name, so that a few parts joined still fit.
NAME_PART_LIMIT = 64


def name_part(value: object) -> str:
    """Text from a record as one part of a file name: letters, digits and ``._+-`` only, never starting with a dot
    (no ``..``, no hidden file), capped at NAME_PART_LIMIT characters; never empty."""
    text = _UNSAFE.sub("_", str(value))[:NAME_PART_LIMIT].lstrip(".")
    return text or "_"


def _real(path: Path) -> Path:
    return Path(os.path.realpath(path))  # links resolved: a symlinked folder is the folder it names


def _same_file(a: Path, b: Path) -> bool:
    try:
        return os.path.samefile(a, b)  # a hard link or a bind mount: two names, one file
    except OSError:
        return False


def overlap(output: Path, source: Path) -> str | None:
    """How an output path overlaps an input path ("is", "is inside", "holds"), or None when it does not."""
    out, src = _real(output), _real(source)
    if out == src or _same_file(output, source):
        return "is"
    if out.is_relative_to(src):
        return "is inside"
    if src.is_relative_to(out):
        return "holds"
    return None


def refuse_overlap(outputs: Mapping[str, Path | None], inputs: Iterable[Path | None]) -> None:
    """UsageError when an output (keyed by the option that names it) is, sits inside or holds an input."""
    sources = [Path(p) for p in inputs if p is not None]
    for option, output in outputs.items():
        if output is None:
            continue
        for source in sources:
            how = overlap(Path(output), source)
            if how:
                raise UsageError(
                    f"{option} {output} {how} the input {source}: an output never replaces, enters or holds what "
                    f"the same command reads; give {option} a path outside the inputs"
                )


def path_problem(path: Path | str) -> str | None:
    """Why a string given as a path cannot name anything here (too long, a NUL), or None; never raises."""
    try:
        os.stat(path)
    except (FileNotFoundError, NotADirectoryError):
        return None  # simply absent
    except OSError as exc:  # ENAMETOOLONG, ELOOP, EACCES...
        return exc.strerror or exc.__class__.__name__
    except ValueError as exc:  # an embedded NUL
        return str(exc)
    return None
