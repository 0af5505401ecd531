"""Plugin settings: declared by a plugin, given on the command line as -O key=value, validated here."""

from __future__ import annotations

import dataclasses
import difflib
import math
import os
import re
import typing
from collections.abc import Iterable, Iterator, Mapping
from dataclasses import dataclass, field
from typing import Any

from llmb.api.errors import UsageError, shown
from llmb.spec.redact import REDACTED, is_secret, value_for_record

# How a sweep hands secret settings to its trials' `llmb run`: an environment is readable by its user only, a command
# line by anyone on the host.
SECRET_OPTIONS_ENV = "LLMB_SECRET_OPTIONS"
_TRUE = ("true", "yes", "on", "1")
_FALSE = ("false", "no", "off", "0")
BOOL_WORDS = "/".join(w for pair in zip(_TRUE, _FALSE, strict=True) for w in pair)  # what the error message names


def parse_bool(raw: str) -> bool:
    """A yes/no word, in any case: the one parser of llmb's boolean values."""
    word = raw.strip().lower()
    if word in _TRUE:
        return True
    if word in _FALSE:
        return False
    raise ValueError(f"expected one of {BOOL_WORDS}")


def env_flag(name: str, env: Mapping[str, str] | None = None) -> bool:
    """An on/off environment variable (LLMB_DEBUG, LLMB_IN_PROCESS): unset, empty or a "no" word (0, false, off, no)
    is off, so `LLMB_DEBUG=0` means what it says; any other value is on, as it always was."""
    raw = (os.environ if env is None else env).get(name, "")
    if not raw.strip():
        return False
    try:
        return parse_bool(raw)
    except ValueError:
        return True


@dataclass(frozen=True)
class Setting:
    """One plugin setting: its name, type (str, int, float or bool), default, help, optional choices and, for a number,
    an optional least and greatest value (`minimum`, `maximum`: a value outside them is refused as the command line is
    read, before any worker starts, and `llmb plugins` shows them).

    secret=True (a license token, a password): its value is never recorded in a result or a conformance record and
    is shown as <redacted>. A setting whose name looks like a credential (llmb.spec.redact.is_secret) is treated the
    same.
    """

    name: str
    type: type
    default: Any
    help: str
    choices: tuple[str, ...] | None = None
    secret: bool = False
    minimum: int | float | None = None
    maximum: int | float | None = None

    @property
    def hidden(self) -> bool:
        return self.secret or is_secret(self.name)

    def problem(self) -> str | None:
        """What makes this declaration one llmb cannot offer as -O, in one line (types and names, never the plugin's
        help or values); None where it is sound. Every command reads a plugin's settings through this check
        (llmb.registry.plugins.call), so a malformed one is the plugin's error naming its method, never a TypeError
        deep in a run."""
        if not isinstance(self.name, str) or not SETTING_NAME.fullmatch(self.name):
            said = shown(self.name) if isinstance(self.name, str) else f"of type {type(self.name).__name__}"
            return f"a setting's name is {said}, not one -O can give ({NAME_RULE})"
        where = f"setting {self.name!r}"
        if self.type not in SETTING_TYPES:
            said = self.type.__name__ if isinstance(self.type, type) else f"a {type(self.type).__name__} value"
            return f"{where} has type {said}, not one of the classes str, int, float or bool"
        if not isinstance(self.help, str):
            return f"{where} has help of type {type(self.help).__name__}, not str"
        if not isinstance(self.secret, bool):
            return f"{where} has secret of type {type(self.secret).__name__}, not bool"
        if self.default is not None and not _of_type(self.default, self.type):
            return f"{where} has a default of type {type(self.default).__name__}, not {self.type.__name__}"
        bounds = self._bounds_problem()
        if bounds is not None:
            return f"{where} {bounds}"
        if self.choices is None:
            return None
        if not isinstance(self.choices, (tuple, list)) or not self.choices:
            return f"{where} has choices of type {type(self.choices).__name__}, not a non-empty tuple"
        odd = [type(c).__name__ for c in self.choices if not _of_type(c, self.type)]
        if odd:
            return f"{where} has a choice of type {odd[0]}, not {self.type.__name__}"
        if self.default is not None and self.default not in self.choices:
            return f"{where} has a default that is not one of its choices"
        return None

    def _bounds_problem(self) -> str | None:
        """What is wrong with the declared minimum and maximum: only a number has them, each of its type, the least
        no greater than the greatest, the default between them."""
        given = {
            name: value for name, value in (("minimum", self.minimum), ("maximum", self.maximum)) if value is not None
        }
        if not given:
            return None
        if self.type not in (int, float):
            return f"has a {next(iter(given))}, which only an int or a float setting may have"
        for name, value in given.items():
            if not _of_type(value, self.type):
                return f"has a {name} of type {type(value).__name__}, not {self.type.__name__}"
        if len(given) == 2 and self.minimum > self.maximum:
            return "has a minimum greater than its maximum"
        if self.default is not None and self.outside(self.default):
            return "has a default outside its minimum and maximum"
        return None

    def outside(self, value: int | float) -> str | None:
        """What a number outside the declared range was expected to be ("expected at least 0"); None inside it."""
        low, high = self.minimum, self.maximum
        if (low is None or value >= low) and (high is None or value <= high):
            return None
        return f"expected {range_text(low, high)}"

    def parse(self, raw: str) -> Any:
        if self.type is bool:
            return parse_bool(raw)
        try:
            value = self.type(raw.strip()) if self.type in (int, float) else self.type(raw)
        except ValueError:  # int("x") says "invalid literal for int() with base 10": say what was expected
            raise ValueError(f"expected {'an integer' if self.type is int else 'a number'}") from None
        if self.type is float and not math.isfinite(value):  # float("nan") parses; no setting means it
            raise ValueError("expected a finite number")
        if self.type in (int, float) and (outside := self.outside(value)) is not None:
            raise OutOfRange(outside)
        if self.choices is not None:
            # Choices match in any case, as every choice on llmb's command line does (bounds.choice).
            matched = [c for c in self.choices if str(c).lower() == str(value).lower()]
            if not matched:
                listed = [str(c) for c in self.choices]
                raise ValueError(f"expected one of {', '.join(listed)}{did_you_mean(str(value), listed)}")
            value = matched[0]
        return value

    def describe(self) -> dict:
        return {
            "name": self.name,
            "type": self.type.__name__,
            "default": REDACTED if self.hidden and self.default not in ("", None) else self.default,
            "help": self.help,
            "choices": list(self.choices) if self.choices else None,
            "secret": self.hidden,
            "minimum": self.minimum,
            "maximum": self.maximum,
        }


class OutOfRange(ValueError):
    """A number outside a setting's declared minimum and maximum: its message names the range, never the value, so
    a secret setting's error may say it."""


def range_text(minimum: int | float | None, maximum: int | float | None) -> str:
    """A setting's declared range in words: "1 to 8", "at least 0", "at most 8" ("" where it has none)."""
    if minimum is not None and maximum is not None:
        return f"{minimum} to {maximum}"
    if minimum is not None:
        return f"at least {minimum}"
    return f"at most {maximum}" if maximum is not None else ""


# What a setting's name may be: what `-O name=value` can give, JSON and a table show as it is.
SETTING_NAME = re.compile(r"[A-Za-z_][A-Za-z0-9_.-]{0,63}")
NAME_RULE = "a letter or _, then letters, digits, _, . or -, 64 at most"
SETTING_TYPES = (str, int, float, bool)


def _of_type(value: object, kind: type) -> bool:
    """Whether a default or a choice is a value of the setting's type: bool is no int here (though Python's is), an
    int is a float's value, and a float is a finite one (JSON holds no NaN)."""
    if isinstance(value, bool) or kind is bool:
        return isinstance(value, bool) and kind is bool
    if kind is float:
        return isinstance(value, (int, float)) and math.isfinite(value)
    return isinstance(value, kind)


def declaration_problem(declared: Iterable[Setting]) -> str | None:
    """What is wrong with a backend's settings as a whole, in one line: the first setting's own problem, or two
    names -O cannot tell apart (names match in any case); None where they are sound."""
    seen: dict[str, str] = {}
    for setting in declared:
        problem = setting.problem()
        if problem is not None:
            return problem
        if setting.name.lower() in seen:
            return f"settings {seen[setting.name.lower()]!r} and {setting.name!r} have one name in -O (any case)"
        seen[setting.name.lower()] = setting.name
    return None


def option(
    default: Any,
    help: str,
    *,
    choices: Iterable[Any] | None = None,
    secret: bool = False,
    minimum: int | float | None = None,
    maximum: int | float | None = None,
) -> Any:
    """One field of a backend's typed settings (PluginSettings): its default, help, choices, secrecy and, for a
    number, its least and greatest value, declared once, e.g. ``compile: str = option("none", "torch.compile mode",
    choices=("none", "default"))`` or ``streams: int = option(2, "copy streams", minimum=1, maximum=8)``."""
    metadata = {
        "help": help,
        "choices": tuple(choices) if choices else None,
        "secret": secret,
        "minimum": minimum,
        "maximum": maximum,
    }
    return field(default=default, metadata=metadata)


@dataclass(frozen=True, eq=False)
class PluginSettings(Mapping):
    """A backend's settings as one frozen dataclass: each field is one -O setting, typed str, int, float or bool,
    with its default and help given by `option`. A backend names its class as ``Backend.Settings``, and its methods
    get an instance: ``settings.compile``, with a type checker's help. The instance also reads as the mapping that
    plugins written before it use (``settings["compile"]``, ``settings.get(...)``), and equals the dict of its
    values. A subclass inherits the fields and may give one another default or choices by declaring it again
    (llmb.toolkit.features.FeatureSettings, the training features every plugin may offer, is one to subclass)."""

    @classmethod
    def declared(cls) -> list[Setting]:
        """The settings as -O, `llmb plugins` and the records see them, in field order."""
        hints = typing.get_type_hints(cls)
        settings = []
        for f in dataclasses.fields(cls):
            kind = hints[f.name]
            if f.name in _MAPPING_NAMES:
                raise TypeError(f"{cls.__name__}.{f.name}: the name is the settings mapping's own; choose another")
            if kind not in (str, int, float, bool):
                raise TypeError(f"{cls.__name__}.{f.name}: a setting is a str, int, float or bool, not {kind!r}")
            meta = f.metadata
            settings.append(
                Setting(
                    f.name,
                    kind,
                    f.default,
                    meta.get("help", ""),
                    meta.get("choices"),
                    meta.get("secret", False),
                    meta.get("minimum"),
                    meta.get("maximum"),
                )
            )
        return settings

    @property
    def secret(self) -> frozenset[str]:
        """The settings whose values are never recorded (`recorded`): declared secret, or named like a credential."""
        return frozenset(s.name for s in self.declared() if s.hidden)

    def __getitem__(self, key: str) -> Any:
        if key not in self._names():
            raise KeyError(key)
        return getattr(self, key)

    def __iter__(self) -> Iterator[str]:
        return iter(self._names())

    def __len__(self) -> int:
        return len(self._names())

    def __repr__(self) -> str:  # a secret's value never reaches a log or a traceback
        shown = recorded(self)
        return f"{type(self).__name__}({', '.join(f'{k}={v!r}' for k, v in shown.items())})"

    def __init_subclass__(cls, **kwargs: Any) -> None:
        super().__init_subclass__(**kwargs)
        # In the subclass's own namespace before @dataclass runs, which then keeps it rather than writing its own.
        cls.__repr__ = PluginSettings.__repr__

    @classmethod
    def _names(cls) -> tuple[str, ...]:
        return tuple(f.name for f in dataclasses.fields(cls))


# What an instance answers itself: a setting may not take one of these names.
_MAPPING_NAMES = frozenset({"get", "keys", "items", "values", "secret", "declared"})


def parse_options(options: tuple[str, ...] | list[str]) -> dict[str, str]:
    """Turn ("key=value", ...) into a dict; a malformed item is a usage error."""
    parsed: dict[str, str] = {}
    for item in options:
        key, sep, value = item.partition("=")
        if not sep or not key:
            raise UsageError(f"-O expects key=value, got {shown(item)}")
        parsed[key.strip()] = value.strip()
    return parsed


def resolve_settings(plugin_name: str, declared: list[Setting], given: dict[str, str]) -> dict[str, Any]:
    """Validate the given raw values against the declared settings; return every setting's value."""
    by_name = {s.name: s for s in declared}
    given = {_setting_key(plugin_name, key, by_name): raw for key, raw in given.items()}
    values = Resolved({s.name: s.default for s in declared})
    values.secret = frozenset(s.name for s in declared if s.hidden)
    for key, raw in given.items():
        try:
            values[key] = by_name[key].parse(raw)
        except ValueError as exc:
            if key in values.secret:  # int("...") quotes its input: say only what was expected
                expected = str(exc) if isinstance(exc, OutOfRange) else f"not a valid {by_name[key].type.__name__}"
                raise UsageError(f"plugin {plugin_name!r} setting {key}={REDACTED}: {expected}") from None
            raise UsageError(f"plugin {plugin_name!r} setting {key}={shown(raw)}: {exc}") from None
    return values


def _setting_key(plugin_name: str, key: str, by_name: Mapping[str, Setting]) -> str:
    """The declared name of a -O key, matched in any case; a usage error naming the closest names otherwise."""
    if key in by_name:
        return key
    same = [name for name in by_name if name.lower() == key.lower()]
    if len(same) == 1:
        return same[0]
    known = ", ".join(sorted(by_name)) or "none"
    closest = did_you_mean(key, by_name)
    raise UsageError(f"plugin {plugin_name!r} has no setting {shown(key)} (settings: {known}){closest}")


def did_you_mean(given: str, names: Iterable[str]) -> str:
    """What ends an unknown name's error: "; did you mean X?", with the names closest to the given one compared in
    any case, or "" when none is close."""
    by_lower = {str(n).lower(): str(n) for n in names}
    close = [by_lower[n] for n in difflib.get_close_matches(given.lower(), list(by_lower), n=2, cutoff=0.6)]
    return f"; did you mean {' or '.join(close)}?" if close else ""


class Resolved(dict):
    """Resolved setting values that remember which are secret, so that `recorded` can leave them out."""

    secret: frozenset[str] = frozenset()


def recorded(values: dict[str, Any]) -> dict[str, Any]:
    """Settings as a result or conformance record keeps them: a secret's value (declared secret=True, or a
    credential-like name) replaced by <redacted>, and any other text scrubbed of what looks like a credential (a URL's
    user:password, a token, a secret-named pair: llmb.spec.redact.scrub)."""
    secret = getattr(values, "secret", frozenset())
    return {k: REDACTED if k in secret else value_for_record(k, v) for k, v in values.items()}
