"""Errors the CLI turns into one line on stderr and an exit code, never a traceback."""

from __future__ import annotations


class LlmbError(Exception):
    """A run failed (exit code 1)."""

    exit_code = 1


class UsageError(LlmbError):
    """The user asked for something that cannot be done (exit code 2)."""

    exit_code = 2


class PluginError(LlmbError):
    """A plugin raised inside a hook; the message names the plugin and the hook."""

    def __init__(self, plugin: str, hook: str, error: BaseException) -> None:
        self.plugin, self.hook, self.error = plugin, hook, error
        first_line = str(error).strip().splitlines()[0] if str(error).strip() else ""  # one line, never a traceback
        super().__init__(f"plugin {plugin!r} failed in hook {hook}: {type(error).__name__}: {first_line}")
