"""The one retry policy (harness.retry): failure labels, Retry-After in both forms, attempt
counts, delays, and the clients that use it against a real loopback server."""

from __future__ import annotations

import asyncio
import email.utils
from collections.abc import Callable

import pytest
from starlette.applications import Starlette
from starlette.requests import Request
from starlette.responses import JSONResponse
from starlette.routing import Route

from servers import ServerThread
from harness.errors import FailureKind, ServiceError
from harness.llm import ChatClient, ChatMessage
from harness.retry import AttemptFailed, RetryPolicy, retry_after_s

NO_WAIT = RetryPolicy(attempts=3, base_delay_s=0.0, max_delay_s=0.0)


def failing(kind: FailureKind, *, retry_after: float | None = None) -> tuple[list[int], Callable]:
    """An attempt that always fails with `kind`, and the list its calls are counted in."""
    calls: list[int] = []

    async def attempt() -> str:
        calls.append(1)
        raise AttemptFailed(f"failed ({kind.value})", kind, retry_after=retry_after)

    return calls, attempt


@pytest.mark.parametrize("kind, tries", [(FailureKind.TRANSIENT, 3), (FailureKind.RATE_LIMITED, 3),
                                         (FailureKind.FATAL, 1)])
def test_each_label_gets_its_attempts(kind: FailureKind, tries: int) -> None:
    calls, attempt = failing(kind, retry_after=0.0)
    with pytest.raises(AttemptFailed) as raised:
        asyncio.run(NO_WAIT.run(attempt))
    assert raised.value.kind is kind and str(raised.value) == f"failed ({kind.value})"
    assert len(calls) == tries


def test_success_after_failures_returns_the_answer() -> None:
    calls: list[int] = []

    async def attempt() -> str:
        calls.append(1)
        if len(calls) < 3:
            raise AttemptFailed("busy", FailureKind.TRANSIENT)
        return "answer"

    assert asyncio.run(NO_WAIT.run(attempt)) == "answer" and len(calls) == 3


def test_an_unlabelled_exception_ends_the_call_at_once() -> None:
    calls: list[int] = []

    async def attempt() -> str:
        calls.append(1)
        raise KeyError("not a transport failure")

    with pytest.raises(KeyError):
        asyncio.run(NO_WAIT.run(attempt))
    assert len(calls) == 1


def test_give_up_policy_stops_on_a_long_retry_after_and_keeps_the_answer() -> None:
    policy = RetryPolicy(attempts=5, max_retry_after_s=60.0, long_retry_after="give_up")
    calls: list[int] = []

    async def attempt() -> str:
        calls.append(1)
        raise AttemptFailed("throttled", FailureKind.RATE_LIMITED, retry_after=7200.0, answer="the 429")

    with pytest.raises(AttemptFailed) as raised:
        asyncio.run(policy.run(attempt))
    assert raised.value.answer == "the 429" and len(calls) == 1
    assert policy.gives_up_on(7200.0) and not policy.gives_up_on(60.0) and not policy.gives_up_on(None)
    assert not RetryPolicy().gives_up_on(7200.0)  # the default caps the wait instead


def test_retry_after_seconds_and_http_date() -> None:
    now = 1_700_000_000.0
    assert retry_after_s("2.5") == 2.5 and retry_after_s("0") == 0.0 and retry_after_s("-3") == 0.0
    assert retry_after_s(email.utils.formatdate(now + 30, usegmt=True), now) == pytest.approx(30.0)
    assert retry_after_s(email.utils.formatdate(now - 30, usegmt=True), now) == 0.0  # a date already past
    assert retry_after_s("soon") is None and retry_after_s(None) is None


def test_delay_bounds() -> None:
    policy = RetryPolicy(base_delay_s=0.5, max_delay_s=3.0, max_retry_after_s=10.0)
    for attempt in range(6):
        step = 0.5 * 2**attempt
        assert 0.5 * min(step, 3.0) <= policy.delay(attempt, None) <= min(1.5 * step, 3.0)
    assert policy.delay(0, 4.0) == 4.0 and policy.delay(0, 3600.0) == 10.0  # Retry-After honoured, capped
    jittered = RetryPolicy(retry_after_jitter=0.1)
    assert 2.0 <= jittered.delay(0, 2.0) < 2.2


def test_attempts_must_be_positive() -> None:
    with pytest.raises(ValueError, match="attempts"):
        RetryPolicy(attempts=0)


def status_server(status: int, headers: dict[str, str]) -> tuple[Starlette, list[int]]:
    seen: list[int] = []

    async def complete(request: Request) -> JSONResponse:
        seen.append(1)
        return JSONResponse({"error": "no"}, status_code=status, headers=headers)

    return Starlette(routes=[Route("/v1/chat/completions", complete, methods=["POST"])]), seen


@pytest.mark.parametrize("status, headers, kind, tries", [
    (500, {}, FailureKind.TRANSIENT, 3),
    (429, {"Retry-After": "0"}, FailureKind.RATE_LIMITED, 3),
    (400, {}, FailureKind.FATAL, 1),
])
def test_model_client_labels_and_counts_over_http(status: int, headers: dict[str, str], kind: FailureKind,
                                                  tries: int) -> None:
    app, seen = status_server(status, headers)
    with ServerThread(app) as server:
        async def call() -> None:
            client = ChatClient(f"{server.url}/v1", "m", retry=NO_WAIT)
            try:
                await client.complete([ChatMessage(role="user", content="hi")])
            finally:
                await client.aclose()

        with pytest.raises(ServiceError) as raised:
            asyncio.run(call())
    assert raised.value.kind is kind and len(seen) == tries
    assert str(raised.value).startswith(f"model call failed ({kind.value}): HTTP {status} from {server.url}/v1")


def test_model_client_transport_failure_is_transient() -> None:
    async def call() -> None:
        client = ChatClient("http://127.0.0.1:9/v1", "m", retry=NO_WAIT, timeout_s=1.0)
        try:
            await client.complete([ChatMessage(role="user", content="hi")])
        finally:
            await client.aclose()

    with pytest.raises(ServiceError) as raised:
        asyncio.run(call())
    assert raised.value.kind is FailureKind.TRANSIENT
    assert str(raised.value) == "model call failed (transient): ConnectError calling http://127.0.0.1:9/v1/chat/completions"
