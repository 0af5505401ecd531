"""The results record: schema, atomic writes, loading."""

from __future__ import annotations

import contextlib
import json
import os
import tempfile
from pathlib import Path

SCHEMA = "llmb.result/1"


def median_index(values: list[float]) -> int:
    """Index of the median value (the lower middle for an even count), so a headline is always a run that happened."""
    order = sorted(range(len(values)), key=values.__getitem__)
    return order[(len(order) - 1) // 2]


def result_filename(record: dict) -> str:
    stamp = record["created"].replace(":", "").replace("-", "").split(".")[0]
    label = record["precision"]["effective"]
    return f"{stamp}-{record['plugin']['name']}-{label}-b{record['batch_size']}-{record['run_id']}.json"


def write_json_atomic(path: Path, data: dict) -> Path:
    """Write JSON so a reader never sees half a file: a temp file in the same directory, then a rename."""
    return write_bytes_atomic(path, (json.dumps(data, indent=2, sort_keys=False) + "\n").encode())


def write_bytes_atomic(path: Path, data: bytes) -> Path:
    """Write a file so a reader never sees half of it: a temp file in the same directory, then a rename."""
    path.parent.mkdir(parents=True, exist_ok=True)
    fd, tmp = tempfile.mkstemp(prefix=f".{path.name}.", dir=path.parent)
    try:
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


def write_result(record: dict, out_dir: Path) -> Path:
    return write_json_atomic(Path(out_dir) / result_filename(record), record)


def load_result(path: Path) -> dict:
    with open(path) as f:
        return json.load(f)
