"""Plugin settings: declared by a plugin, given on the command line as -O key=value, validated here."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from llmb.errors import UsageError

_TRUE = {"1", "true", "yes", "on"}
_FALSE = {"0", "false", "no", "off"}


@dataclass(frozen=True)
class Setting:
    """One plugin setting: its name, type (str, int, float or bool), default, help and optional choices."""

    name: str
    type: type
    default: Any
    help: str
    choices: tuple[str, ...] | None = None

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
            "default": self.default,
            "help": self.help,
            "choices": list(self.choices) if self.choices else None,
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
    values = {s.name: s.default for s in declared}
    for key, raw in given.items():
        try:
            values[key] = by_name[key].parse(raw)
        except ValueError as exc:
            raise UsageError(f"plugin {plugin_name!r} setting {key}={raw!r}: {exc}") from None
    return values
