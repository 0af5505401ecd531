"""Plugin settings: declared by a plugin, given on the command line as -O key=value, validated here."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from llmb.errors import UsageError
from llmb.redact import REDACTED, is_secret

# How a sweep hands secret settings to its trials' `llmb run`: an environment is readable by its user only, a command
# line by anyone on the host.
SECRET_OPTIONS_ENV = "LLMB_SECRET_OPTIONS"
_TRUE = {"1", "true", "yes", "on"}
_FALSE = {"0", "false", "no", "off"}


@dataclass(frozen=True)
class Setting:
    """One plugin setting: its name, type (str, int, float or bool), default, help and optional choices.

    secret=True (a license token, a password): its value is never recorded in a result or a conformance record and
    is shown as <redacted>. A setting whose name looks like a credential (llmb.redact.is_secret) is treated the same.
    """

    name: str
    type: type
    default: Any
    help: str
    choices: tuple[str, ...] | None = None
    secret: bool = False

    @property
    def hidden(self) -> bool:
        return self.secret or is_secret(self.name)

    def parse(self, raw: str) -> Any:
        if self.type is bool:
            if raw.lower() in _TRUE:
                return True
            if raw.lower() in _FALSE:
                return False
            raise ValueError("expected true or false")
        value = self.type(raw)
        if self.choices is not None and value not in self.choices:
            raise ValueError(f"expected one of {', '.join(self.choices)}")
        return value

    def describe(self) -> dict:
        return {
            "name": self.name,
            "type": self.type.__name__,
            "default": REDACTED if self.hidden and self.default not in ("", None) else self.default,
            "help": self.help,
            "choices": list(self.choices) if self.choices else None,
            "secret": self.hidden,
        }


def parse_options(options: tuple[str, ...] | list[str]) -> dict[str, str]:
    """Turn ("key=value", ...) into a dict; a malformed item is a usage error."""
    parsed: dict[str, str] = {}
    for item in options:
        key, sep, value = item.partition("=")
        if not sep or not key:
            raise UsageError(f"-O expects key=value, got {item!r}")
        parsed[key.strip()] = value.strip()
    return parsed


def resolve_settings(plugin_name: str, declared: list[Setting], given: dict[str, str]) -> dict[str, Any]:
    """Validate the given raw values against the declared settings; return every setting's value."""
    by_name = {s.name: s for s in declared}
    for key in given:
        if key not in by_name:
            known = ", ".join(sorted(by_name)) or "none"
            raise UsageError(f"plugin {plugin_name!r} has no setting {key!r} (settings: {known})")
    values = Resolved({s.name: s.default for s in declared})
    values.secret = frozenset(s.name for s in declared if s.hidden)
    for key, raw in given.items():
        try:
            values[key] = by_name[key].parse(raw)
        except ValueError as exc:
            if key in values.secret:  # int("...") quotes its input: say only what was expected
                raise UsageError(
                    f"plugin {plugin_name!r} setting {key}={REDACTED}: not a valid {by_name[key].type.__name__}"
                ) from None
            raise UsageError(f"plugin {plugin_name!r} setting {key}={raw!r}: {exc}") from None
    return values


class Resolved(dict):
    """Resolved setting values that remember which are secret, so that `recorded` can leave them out."""

    secret: frozenset[str] = frozenset()


def recorded(values: dict[str, Any]) -> dict[str, Any]:
    """Settings as a result or conformance record keeps them: a secret's value (declared secret=True, or a
    credential-like name) replaced by <redacted>."""
    secret = getattr(values, "secret", frozenset())
    return {k: REDACTED if k in secret or is_secret(k) else v for k, v in values.items()}
