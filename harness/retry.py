"""The one retry policy of every HTTP client: the container client, the model clients and
the gateway's upstream calls.

A client makes one attempt and, when it fails, labels the failure (`AttemptFailed`:
transient, rate-limited or fatal, with the server's Retry-After); the policy alone decides
whether and when to try again.

The loop is ours rather than tenacity's: on a call that succeeds at once (the hot path of
every rollout and model call) tenacity's loop costs a hundred times more, hundreds of
microseconds a call on a busy 2-core machine (`python -m benchmarks.perf.retry_overhead`)."""

from __future__ import annotations

import asyncio
import email.utils
import random
import time
from collections.abc import Awaitable, Callable
from typing import Literal, TypeVar

from pydantic import BaseModel, ConfigDict, Field

from harness.errors import FailureKind, classify_status

T = TypeVar("T")


def retry_after_s(value: str | None, now: float | None = None) -> float | None:
    """Seconds from a Retry-After header: delta-seconds or an HTTP date (None when absent
    or unreadable)."""
    if value is None:
        return None
    try:
        return max(0.0, float(value))
    except ValueError:
        pass
    try:
        when = email.utils.parsedate_to_datetime(value)
    except (TypeError, ValueError):
        return None
    return max(0.0, when.timestamp() - (now if now is not None else time.time()))


class AttemptFailed(Exception):
    """One attempt's failure, labelled for the policy. `answer` carries what a caller that
    passes failures on (the gateway) returns when the policy stops trying."""

    def __init__(self, message: str, kind: FailureKind, *, retry_after: float | None = None,
                 answer: object = None):
        super().__init__(message)
        self.kind = kind
        self.retry_after = retry_after
        self.answer = answer

    @classmethod
    def from_status(cls, message: str, status: int, retry_after: str | None) -> "AttemptFailed":
        """A failure labelled by an HTTP status, with its Retry-After header's wait."""
        return cls(message, classify_status(status), retry_after=retry_after_s(retry_after))


class RetryPolicy(BaseModel):
    model_config = ConfigDict(frozen=True)
    attempts: int = Field(default=4, ge=1)
    base_delay_s: float = 0.5
    max_delay_s: float = 20.0
    # a server's Retry-After is honoured up to this: a quota reset hours away must not stall
    # the run for hours
    max_retry_after_s: float = 60.0
    # beyond max_retry_after_s: "cap" waits the cap and tries again; "give_up" stops at once
    # and leaves the decision to whoever is behind the caller (the gateway's own callers)
    long_retry_after: Literal["cap", "give_up"] = "cap"
    # up to this fraction of a Retry-After is added at random, so the callers one throttle
    # sent away do not all come back at the same instant
    retry_after_jitter: float = 0.0

    def gives_up_on(self, retry_after: float | None) -> bool:
        """Whether a Retry-After is too long to wait for under this policy."""
        return (self.long_retry_after == "give_up" and retry_after is not None
                and retry_after > self.max_retry_after_s)

    def delay(self, attempt: int, retry_after: float | None) -> float:
        """Seconds to wait before attempt `attempt + 1` (0-based): the server's Retry-After
        (capped, jittered by retry_after_jitter), else exponential backoff with jitter in
        [0.5, 1.5) x the step, capped."""
        if retry_after is not None:
            return min(retry_after, self.max_retry_after_s) * (1 + self.retry_after_jitter * random.random())
        return min(self.max_delay_s, self.base_delay_s * 2**attempt * (0.5 + random.random()))

    def retries(self, failure: AttemptFailed) -> bool:
        """Whether a failed attempt is worth another (when attempts are left)."""
        return failure.kind is not FailureKind.FATAL and not self.gives_up_on(failure.retry_after)

    async def run(self, attempt: Callable[[], Awaitable[T]]) -> T:
        """`attempt()` until it returns. An `AttemptFailed` that is fatal, or whose
        Retry-After the policy gives up on, or the last one, is raised to the caller; any
        other exception ends the call at once."""
        for number in range(self.attempts):
            try:
                return await attempt()
            except AttemptFailed as failure:
                if number + 1 == self.attempts or not self.retries(failure):
                    raise
                await asyncio.sleep(self.delay(number, failure.retry_after))
        raise AssertionError("unreachable: attempts >= 1")
