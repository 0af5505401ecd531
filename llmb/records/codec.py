"""The records' codec: every schema id, one envelope, and strict reading of typed records (a missing or unknown
field, or a value of the wrong type, raises RecordError naming the field)."""

from __future__ import annotations

import dataclasses
import datetime as dt
import math
import types
import typing
from dataclasses import dataclass, field
from typing import Any, ClassVar, TypeVar

from llmb.spec.version import __version__

# Every schema id llmb writes, in one place.
RESULT_SCHEMA = "llmb.result/2"
# Every result schema llmb reads: a /1 record (llmb 0.1, model releases 1-4) reads as a /2 one (records.upgrade).
RESULT_SCHEMAS = ("llmb.result/1", RESULT_SCHEMA)
EVIDENCE_SCHEMA = "llmb.evidence/1"  # a result's evidence section (llmb.records.judged)
CONFORMANCE_SCHEMA = "llmb.conformance/1"
COMMBENCH_SCHEMA = "llmb.commbench/1"
SWEEP_LOG_SCHEMA = "llmb.sweep/1"
SWEEP_SUMMARY_SCHEMA = "llmb.sweep-summary/1"
SUBMISSION_SCHEMA = "llmb.submission/1"
PLUGIN_SOURCE_SCHEMA = "llmb.plugin-source/1"
CODE_SCHEMA = "llmb.code/1"
RELEASE_MANIFEST_SCHEMA = "llmb.release-manifest/1"
REPORT_SCHEMA = "llmb.report/1"
ROOFLINE_SCHEMA = "llmb.roofline/1"
ATTEMPT_SCHEMA = "llmb.attempt/1"  # a feature-matrix attempt that failed before a result (llmb.run.feature_matrix)
SEARCH_SUMMARY_SCHEMA = "llmb.search-summary/1"  # a settings search's summary (llmb.run.grid)
RELEASES_SCHEMA = "llmb.releases/1"  # the released versions' list (llmb.bundle.manifest)

# A freshly initialised model predicts near-uniformly: its first loss sits near ln(vocab). Measured here: tiny
# preset 10.38, small 10.40, official ~11.0 (logit std 0.02 x sqrt(hidden)); a scaled or broken model leaves the band.
LOSS_BAND = (0.8, 1.3)
# A result or a sweep log larger than this is not one llmb wrote: refused unread.
RECORD_LIMIT = 64 * 2**20
# Runs of one headline that spread more than this (max - min over the headline) are flagged as noisy.
SPREAD_WARNING = 0.10


def loss_band(vocab_size: int) -> tuple[float, float]:
    return LOSS_BAND[0] * math.log(vocab_size), LOSS_BAND[1] * math.log(vocab_size)


def now() -> str:
    return dt.datetime.now(dt.timezone.utc).isoformat(timespec="seconds")


def envelope(schema: str) -> dict:
    """The fields every llmb record starts with: what it is, which llmb wrote it, when."""
    return {"schema": schema, "llmb_version": __version__, "created": now()}


# Strict reading


class RecordError(ValueError):
    """A record that does not match its type; the message starts with the field's path."""


def _where(path: str) -> str:
    return path or "record"


def _parse(value: Any, hint: Any, path: str) -> Any:
    """``value`` (from JSON) checked against the type ``hint``; raises RecordError naming ``path``."""
    if hint is Any:
        return value
    origin = typing.get_origin(hint)
    if origin in (typing.Union, types.UnionType):
        options = typing.get_args(hint)
        if value is None:
            if type(None) in options:
                return None
            raise RecordError(f"{_where(path)}: is null")
        errors = []
        for option in options:
            if option is type(None):
                continue
            try:
                return _parse(value, option, path)
            except RecordError as exc:
                errors.append(exc)
        raise errors[0]
    if dataclasses.is_dataclass(hint):
        return _parse_dataclass(hint, value, path)
    if origin is list:
        if not isinstance(value, list):
            raise RecordError(f"{_where(path)}: expected a list, got {_kind(value)}")
        (item,) = typing.get_args(hint)
        return [_parse(v, item, f"{path}[{i}]") for i, v in enumerate(value)]
    if origin is dict:
        if not isinstance(value, dict):
            raise RecordError(f"{_where(path)}: expected an object, got {_kind(value)}")
        _, item = typing.get_args(hint)
        return {k: _parse(v, item, f"{path}.{k}") for k, v in value.items()}
    if hint is bool:
        if not isinstance(value, bool):
            raise RecordError(f"{_where(path)}: expected true or false, got {_kind(value)}")
        return value
    if hint is int:
        if not isinstance(value, int) or isinstance(value, bool):
            raise RecordError(f"{_where(path)}: expected an integer, got {_kind(value)}")
        return value
    if hint is float:
        if not isinstance(value, (int, float)) or isinstance(value, bool):
            raise RecordError(f"{_where(path)}: expected a number, got {_kind(value)}")
        return value
    if hint is str:
        if not isinstance(value, str):
            raise RecordError(f"{_where(path)}: expected a string, got {_kind(value)}")
        return value
    raise TypeError(f"records: no reader for the type {hint!r} of {path}")  # a programming error, not bad input


def _kind(value: Any) -> str:
    if value is None:
        return "null"
    if isinstance(value, bool):
        return "a boolean"
    if isinstance(value, (int, float)):
        return "a number"
    if isinstance(value, str):
        return "a string"
    return "a list" if isinstance(value, list) else "an object" if isinstance(value, dict) else type(value).__name__


_hints: dict[type, dict[str, Any]] = {}


def _fields(cls: type) -> list[tuple[dataclasses.Field, str, Any]]:
    """(field, JSON key, type) of a record dataclass; a field's JSON key may differ from its name (``class``)."""
    if cls not in _hints:
        _hints[cls] = typing.get_type_hints(cls)
    return [(f, f.metadata.get("key", f.name), _hints[cls][f.name]) for f in dataclasses.fields(cls) if f.init]


def field_tree(cls: type, prefix: str = "") -> dict[str, bool]:
    """Every JSON key a record type declares, nested ones dotted (``timing.window_seconds``), mapped to whether it
    is required; a list of records is ``checks[]``. The README's field lists are checked against this."""
    tree: dict[str, bool] = {}
    for f, key, hint in _fields(cls):
        name = prefix + key
        tree[name] = not (_has_default(f) and issubclass(cls, Typed))
        union = typing.get_origin(hint) in (typing.Union, types.UnionType)
        inner = [a for a in typing.get_args(hint) if a is not type(None)] if union else [hint]
        for candidate in inner:
            if typing.get_origin(candidate) is list:
                (item,) = typing.get_args(candidate)
                if dataclasses.is_dataclass(item):
                    tree.update(field_tree(item, f"{name}[]."))
            elif dataclasses.is_dataclass(candidate):
                tree.update(field_tree(candidate, f"{name}."))
    return tree


def describe(cls: type) -> str:
    """A record type's fields in the README's notation: ``name`` (``?`` when optional), ``name[]`` a list,
    ``name{...}`` a free-form object, ``name{a, b}`` a nested record, ``name[{a, b}]`` a list of records.
    `python -m llmb.records` prints them; tests/test_records.py checks the README against them."""
    parts = []
    for f, key, hint in _fields(cls):
        name = key + ("?" if _has_default(f) and issubclass(cls, Typed) else "")
        union = typing.get_origin(hint) in (typing.Union, types.UnionType)
        inner = next((a for a in typing.get_args(hint) if a is not type(None)), hint) if union else hint
        origin = typing.get_origin(inner)
        if dataclasses.is_dataclass(inner):
            parts.append(f"{name}{{{describe(inner)}}}")
        elif origin is list:
            (item,) = typing.get_args(inner)
            parts.append(f"{name}[{{{describe(item)}}}]" if dataclasses.is_dataclass(item) else f"{name}[]")
        elif origin is dict or inner is Any:
            parts.append(f"{name}{{...}}" if origin is dict else name)
        else:
            parts.append(name)
    return ", ".join(parts)


def _has_default(f: dataclasses.Field) -> bool:
    """Whether a record may leave the field out (a default that is only a writer's convenience does not count)."""
    if f.metadata.get("required"):
        return False
    return f.default is not dataclasses.MISSING or f.default_factory is not dataclasses.MISSING


def _parse_dataclass(cls: type, value: Any, path: str) -> Any:
    if not isinstance(value, dict):
        raise RecordError(f"{_where(path)}: expected an object, got {_kind(value)}")
    known = _fields(cls)
    keys = {key for _, key, _ in known}
    unknown = [k for k in value if k not in keys]
    if unknown:
        raise RecordError(f"{_join(path, str(unknown[0]))}: unknown field")
    kwargs = {}
    for f, key, hint in known:
        if key not in value:
            # Only llmb's own record types have optional fields; another dataclass (ModelConfig) must be complete,
            # or a record missing a dimension would read as the official shape.
            if _has_default(f) and issubclass(cls, Typed):
                continue
            raise RecordError(f"{_join(path, key)}: missing")
        kwargs[f.name] = _parse(value[key], hint, _join(path, key))
    record = cls(**kwargs)
    check = getattr(record, "check", None)
    if check is not None:
        check(path)
    return record


def _join(path: str, key: str) -> str:
    return f"{path}.{key}" if path else key


def _dump(value: Any) -> Any:
    if isinstance(value, Typed):
        return value.to_dict()
    if dataclasses.is_dataclass(value) and not isinstance(value, type):
        return _dump_dataclass(value)
    if isinstance(value, list):
        return [_dump(v) for v in value]
    if isinstance(value, dict):
        return {k: _dump(v) for k, v in value.items()}
    return value


def _dump_dataclass(record: Any) -> dict:
    out = {}
    for f, key, _ in _fields(type(record)):
        value = getattr(record, f.name)
        if value is None and f.default is None:
            continue  # an optional field left out is absent, as in records written before it existed
        out[key] = _dump(value)
    return out


R = TypeVar("R", bound="Typed")


class Typed:
    """Mixin for the record dataclasses: ``to_dict`` and a strict ``from_dict``."""

    def to_dict(self) -> dict:
        return _dump_dataclass(self)

    @classmethod
    def from_dict(cls: type[R], data: Any) -> R:
        return _parse_dataclass(cls, data, "")


@dataclass(kw_only=True)
class Record(Typed):
    """A top-level record: the envelope, then the record's own fields. ``SCHEMA`` is the id it must carry."""

    SCHEMA: ClassVar[str] = ""
    # Defaults for the writer; a record read from a file must carry all three.
    schema: str = field(default="", metadata={"required": True})
    llmb_version: str = field(default=__version__, metadata={"required": True})
    created: str = field(default_factory=now, metadata={"required": True})

    def __post_init__(self) -> None:
        self.schema = self.schema or self.SCHEMA

    def check(self, path: str) -> None:
        if self.schema != self.SCHEMA:
            raise RecordError(f"{_join(path, 'schema')}: is {self.schema!r}, expected {self.SCHEMA}")

    @classmethod
    def from_dict(cls: type[R], data: Any) -> R:
        # The schema first: a record of another kind is named as such, not by its first odd field.
        if isinstance(data, dict) and data.get("schema") != cls.SCHEMA:
            raise RecordError(f"schema: is {data.get('schema')!r}, expected {cls.SCHEMA}")
        return _parse_dataclass(cls, data, "")
