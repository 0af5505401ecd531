"""What the clean room's two sides share (the judge, llmb.judge.cleanroom; the worker, llmb.run.clean_worker): how the
judge's key reaches a job's ranks, and how an error crosses the link as one line and is raised again."""

from __future__ import annotations

from llmb.api.errors import LlmbError, UsageError, describe, message

KEY_ENV = "LLMB_JUDGE_KEY"  # how the judge's key reaches a job's ranks (llmb.run.rank_worker)
# The kinds of error the worker names, and the exception each is raised as in the judge.
ERRORS = {"UsageError": UsageError, "LlmbError": LlmbError}


def error_line(exc: BaseException) -> tuple[str, str]:
    """An exception as (its kind, one line): what the link carries of a failure."""
    if isinstance(exc, UsageError):
        return "UsageError", message(exc)
    if isinstance(exc, LlmbError):
        return "LlmbError", message(exc)
    if isinstance(exc, KeyboardInterrupt):
        return "LlmbError", "interrupted"
    return "LlmbError", describe(exc)
