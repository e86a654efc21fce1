"""Failure labels (what the retry policy acts on), the error types a user sees as one line, and
the one reading of a pydantic error for such a line."""

from __future__ import annotations

import re

from enum import Enum
from typing import NamedTuple

from pydantic import ValidationError


class FailureKind(str, Enum):
    TRANSIENT = "transient"
    RATE_LIMITED = "rate_limited"
    FATAL = "fatal"


class HarnessError(Exception):
    """An error with a one-line message meant for the user."""


class ConfigError(HarnessError):
    """Bad input, detected before any work starts."""


class PreflightError(HarnessError):
    """A container or endpoint is not fit for the run; raised before any rollout."""


class ServiceError(HarnessError):
    """A call to a container or model endpoint failed after retries."""

    def __init__(self, message: str, kind: FailureKind):
        super().__init__(message)
        self.kind = kind


class Unreachable(ServiceError):
    """The endpoint was seen gone during a call (a refused or dropped connection) and the
    call ended without an HTTP answer: a container process that died, or that was being
    restarted when the last attempt reached it."""

    def __init__(self, message: str):
        super().__init__(message, FailureKind.TRANSIENT)


class CameBack(ServiceError):
    """The endpoint was seen gone during a call, and a process answered its last attempt
    with a failure worth retrying: the call's attempts went mostly to the gone process (a
    container that another run restarted meanwhile), none of them a fair try at the request."""


class ContractViolation(ServiceError):
    """A container answered with a body that does not fit the contract."""

    def __init__(self, message: str):
        super().__init__(message, FailureKind.FATAL)


class FieldError(NamedTuple):
    """The first error of a pydantic ValidationError, ready for a one-line message."""

    where: str  # dotted location; empty for a check of the whole model
    message: str  # pydantic's message without its "Value error, " prefix
    kind: str  # pydantic's error type, e.g. "extra_forbidden"


def first_error(exc: ValidationError) -> FieldError:
    error = exc.errors()[0]
    return FieldError(".".join(str(part) for part in error["loc"]), error["msg"].removeprefix("Value error, "),
                      error["type"])


REDACTED = "***"


def redact(text: str, *secrets: str | None) -> str:
    """`text` with every non-empty secret replaced: a remote error body may echo the
    request's Authorization header, and error text reaches logs and evidence."""
    for secret in secrets:
        if secret:
            text = text.replace(secret, REDACTED)
    return text


# a gateway capability URL (/c/<token>/r/<run>/...): the token is the run's key to the gateway
_CAPABILITY = re.compile(r"/c/[^/\s]+/r/")


def hide_capabilities(text: str) -> str:
    """`text` with the token of every gateway capability URL in it replaced: error text
    (a timeout names the URL it called) reaches logs and evidence."""
    return _CAPABILITY.sub(f"/c/{REDACTED}/r/", text) if "/c/" in text else text


def classify_status(status_code: int) -> FailureKind:
    if status_code == 429:
        return FailureKind.RATE_LIMITED
    if status_code >= 500 or status_code in (408, 409):
        return FailureKind.TRANSIENT
    return FailureKind.FATAL
