"""Result files: their names, atomic writes, loading (the record itself is llmb.records.Result)."""

from __future__ import annotations

import contextlib
import json
import os
import stat
import tempfile
from pathlib import Path

from llmb.api.errors import UsageError, shown
from llmb.records import Result
from llmb.records.files import read_object
from llmb.records.outputs import name_part


def result_filename(record: Result) -> str:
    """The file a result is written to; each part comes from the record, so each is made a plain name part (a run id
    holding ``../`` or a separator never leaves the folder it is written into)."""
    stamp = record.created.replace(":", "").replace("-", "").split(".")[0]
    parts = (stamp, record.plugin.name, record.precision.effective, f"b{record.batch_size}", record.run_id)
    return "-".join(name_part(p) for p in parts) + ".json"


def write_json_atomic(path: Path, data: dict) -> Path:
    """Write JSON so a reader never sees half a file: a temp file in the same directory, then a rename."""
    return write_bytes_atomic(path, (json.dumps(data, indent=2, sort_keys=False) + "\n").encode())


def _umask() -> int:
    mask = os.umask(0o022)
    os.umask(mask)
    return mask


def write_bytes_atomic(path: Path, data: bytes) -> Path:
    """Write a file so a reader never sees half of it: a temp file in the same directory, then a rename.

    Only a regular file (or nothing) is replaced: a symlink or a folder in the way is refused, and a character
    device or a FIFO (/dev/null, /dev/stdout, a pipe) is written through, never replaced. The new file gets the
    mode an ordinary write would (0666 less the umask), not mkstemp's 0600."""
    path = Path(path)
    info = _replaceable(path)
    if info is not None and (stat.S_ISCHR(info.st_mode) or stat.S_ISFIFO(info.st_mode)):
        with open(path, "wb") as f:  # a device or a pipe: written through, never replaced
            f.write(data)
        return path
    path.parent.mkdir(parents=True, exist_ok=True)
    fd, tmp = tempfile.mkstemp(prefix=f".{path.name}.", dir=path.parent)
    try:
        os.fchmod(fd, 0o666 & ~_umask())
        with os.fdopen(fd, "wb") as f:
            f.write(data)
            f.flush()
            os.fsync(f.fileno())
        os.replace(tmp, path)
    except BaseException:
        with contextlib.suppress(FileNotFoundError):
            os.unlink(tmp)
        raise
    return path


def write_result(record: Result, out_dir: Path) -> Path:
    return write_json_atomic(Path(out_dir) / result_filename(record), record.to_dict())


def _replaceable(path: Path) -> os.stat_result | None:
    """What is at `path` now (None: nothing), where write_bytes_atomic may write it: a regular file, or a device or a
    pipe (a link to one included) that it writes through; a link to anything else, or a folder, is refused."""
    try:
        info = os.lstat(path)
    except (FileNotFoundError, NotADirectoryError):
        return None
    if stat.S_ISLNK(info.st_mode):
        try:
            target = os.stat(path)
        except OSError:
            target = None
        if target is None or not (stat.S_ISCHR(target.st_mode) or stat.S_ISFIFO(target.st_mode)):
            raise UsageError(f"{path} is a symbolic link: refusing to replace it (give the path it points to)")
        info = target
    if not (stat.S_ISREG(info.st_mode) or stat.S_ISCHR(info.st_mode) or stat.S_ISFIFO(info.st_mode)):
        raise UsageError(f"{path} is not a regular file: refusing to replace it")
    return info


def check_out_file(path: Path, what: str = "--out") -> None:
    """Before anything is measured: `path` can be written by write_bytes_atomic (nothing there, a regular file, a
    device or a pipe) and its folder takes a file, so that the measurement is never lost to a refusal after it."""
    path = Path(path)
    info = _replaceable(path)
    if info is None or stat.S_ISREG(info.st_mode):
        check_writable(path.parent, f"{what} {path}: its folder")


def check_writable(out_dir: Path, what: str = "--out") -> None:
    """Before anything is measured: the results folder takes a file, or can be made. A folder that does not exist yet
    is not made here (the first write makes it): a later usage error leaves nothing on disk."""
    out_dir = Path(out_dir)
    if not os.path.exists(out_dir):  # os.path: a name too long for the file system is absent, not a traceback
        parent = next((p for p in out_dir.absolute().parents if os.path.exists(p)), Path("/"))
        if not parent.is_dir() or not os.access(parent, os.W_OK | os.X_OK):
            raise UsageError(f"{what} {out_dir} is not a writable folder ({parent} is not a writable folder)")
        try:  # os.access answers yes to root everywhere (/proc, a read-only mount): a folder made and removed says
            os.rmdir(tempfile.mkdtemp(prefix=".llmb-write-check-", dir=parent))
        except OSError as exc:
            raise UsageError(f"{what} {out_dir} is not a writable folder ({parent}: {exc.strerror or exc})") from None
        too_long = _too_long(out_dir.absolute(), parent)
        if too_long:
            raise UsageError(f"{what} {shown(str(out_dir))} is not a writable folder ({too_long})")
        return
    try:
        fd, probe = tempfile.mkstemp(prefix=".llmb-write-check-", dir=out_dir)
        try:
            with os.fdopen(fd, "wb") as f:
                f.write(b"llmb")
                f.flush()
                os.fsync(f.fileno())
        finally:
            os.unlink(probe)
    except OSError as exc:
        raise UsageError(f"{what} {out_dir} is not a writable folder ({exc.strerror or exc})") from None


# Room kept in a path for the file llmb writes into the folder: a result's name is under 100 bytes.
_FILE_NAME_ROOM = 128


def _too_long(out_dir: Path, parent: Path) -> str | None:
    """Why the folders under ``parent`` that make ``out_dir`` could not be made, with a file in the last: a name
    longer than the file system takes, or a path too long with the file's name; None where neither is (or the file
    system does not say its limits)."""
    try:
        name_max, path_max = os.pathconf(parent, "PC_NAME_MAX"), os.pathconf(parent, "PC_PATH_MAX")
    except (OSError, ValueError):
        return None
    for size in (len(os.fsencode(part)) for part in out_dir.relative_to(parent).parts):
        if size > name_max:
            return f"a name of {size} bytes, where the file system takes {name_max} at most"
    size = len(os.fsencode(out_dir))
    if size + _FILE_NAME_ROOM >= path_max:
        return f"a path of {size} bytes, where the file system takes {path_max} at most"
    return None


def save_result(record: Result, out_dir: Path) -> tuple[Path, str | None]:
    """Write a result into out_dir; if that fails (a full disk, a folder gone), write it under the temporary folder
    instead. Returns where it is and, after a failure, why it is not in out_dir: a measurement is never lost."""
    try:
        return write_result(record, out_dir), None
    except (OSError, UsageError) as exc:
        problem = f"{exc.__class__.__name__}: {exc}"
    rescue = Path(tempfile.mkdtemp(prefix="llmb-unsaved-"))
    try:
        return write_result(record, rescue), problem
    except (OSError, UsageError) as exc:  # the temporary folder is full too: the caller prints the record
        return rescue, f"{problem}; the temporary folder failed as well ({exc.__class__.__name__})"


def load_result(path: Path) -> dict:
    """A JSON object from a file, read as every record is (llmb.records.files.read_object: a FIFO or a giant refused,
    nesting past 64 levels refused); Unreadable, a ValueError, says why not."""
    return read_object(Path(path))


def read_result(path: Path) -> Result:
    """A result file as a Result; RecordError (a ValueError) names the bad field, ValueError a file that is not JSON."""
    return Result.from_dict(load_result(path))
