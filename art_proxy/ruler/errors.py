"""Errors of the RULER judge. Each becomes a recorded reason, never a crash: see `scorer.py`."""

from __future__ import annotations


class RulerError(Exception):
    """Base of the judge's errors; the message is what a judgment's `reason` records."""


class RubricError(RulerError):
    """A rubric file that is missing, unreadable or empty: a one-line CLI error."""


class PromptTooLong(RulerError):
    """The group does not fit the prompt token budget even with every long text trimmed."""


class InvalidAnswer(RulerError):
    """The judge answered, but not with one valid score per trajectory; shown to it on retry."""


class JudgeUnavailable(RulerError):
    """Unreachable, timed out, rate-limited or 5xx: worth retrying after a pause."""


class JudgeRejected(RulerError):
    """The judge refused the request (4xx other than 429): retrying the same request cannot help."""

    def __init__(self, message: str, *, status: int | None = None) -> None:
        super().__init__(message)
        self.status = status
