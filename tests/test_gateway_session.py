"""The run's side of the gateway (harness/gateway/session.py) against the real gateway app on
loopback: announcements and closings made together share requests, and every rollout still
gets its own token, its budget flag, and its scope closed."""

from __future__ import annotations

import asyncio
import secrets
from collections import Counter
from typing import Any

import httpx
import pytest

from servers import ServerThread
from gateway_fakes import FakeUpstream, chat_body
from harness.contract import PolicyBlock
from harness.errors import ServiceError
from harness.gateway.app import create_app as create_gateway_app
from harness.gateway.models import GatewaySettings, Upstream
from harness.gateway.server import resolved
from harness.gateway.session import GatewaySession


class CountingApp:
    """The gateway app, counting the control requests it is sent (method, path's last part)."""

    def __init__(self, app: Any):
        self.app = app
        self.requests: Counter[tuple[str, str]] = Counter()

    async def __call__(self, scope: dict[str, Any], receive: Any, send: Any) -> None:
        if scope["type"] == "http" and scope["path"].startswith("/runs/"):
            self.requests[(scope["method"], scope["path"].rsplit("/", 1)[-1])] += 1
        await self.app(scope, receive, send)


def policy_status(session: GatewaySession, scope: str) -> int:
    base = PolicyBlock(provider="openai_compatible", model="gpt-4.1-mini", base_url="http://unused/v1")
    url = session.policy_block(base, scope).base_url
    return httpx.post(f"{url}/chat/completions", json=chat_body("hi"), timeout=30.0).status_code


@pytest.fixture
def gateway():
    fake = FakeUpstream()
    with ServerThread(fake.app()) as upstream:
        admin = secrets.token_urlsafe(16)
        app = CountingApp(create_gateway_app(
            resolved(GatewaySettings()), admin_token=admin,
            upstreams=[Upstream(name="fake", base_url=f"{upstream.url}/v1", provider="openai_compatible")]))
        with ServerThread(app, name="gateway") as server:
            yield server.url, admin, app, server


def session(url: str, admin: str, run_id: str = "run1") -> GatewaySession:
    return GatewaySession(url, run_id, policy_upstream="fake", proposer_upstream="fake", admin_token=admin)


def test_announcements_made_together_share_requests_and_each_rollout_gets_its_token(gateway) -> None:
    url, admin, app, _ = gateway
    run = session(url, admin)
    scopes = [f"s{i}" for i in range(16)]

    async def main() -> tuple[set[str], set[str], list[int]]:
        await run.open()
        await asyncio.gather(*(run.announce({scope: f"c{i % 3}"}, {f"c{i % 3}": {"system": "Be brief."}},
                                            budgeted=i % 4 != 0) for i, scope in enumerate(scopes)))
        ledger = app.app.state.gateway.ledger.runs[run.key]
        opened, unbudgeted = set(ledger.open_scopes), set(ledger.unbudgeted)
        statuses = [policy_status(run, scope) for scope in scopes]  # the gateway serves from its own thread
        await asyncio.gather(*(run.close_scopes([scope]) for scope in scopes))
        await run.close()
        return opened, unbudgeted, statuses

    opened, unbudgeted, statuses = asyncio.run(main())
    assert opened == set(scopes) and unbudgeted == set(scopes[::4])
    assert statuses == [200] * 16
    assert app.requests[("POST", "scopes")] < 16 and app.requests[("POST", "close")] < 16


def test_closed_scopes_spend_nothing_more(gateway) -> None:
    url, admin, _, _ = gateway
    run = session(url, admin)

    async def main() -> list[int]:
        await run.open()
        await run.announce({"a": "c0", "b": "c0"}, {"c0": {"system": "Be brief."}}, budgeted=True)
        await asyncio.gather(run.close_scopes(["a"]), run.close_scopes(["b"]))
        statuses = [policy_status(run, "a"), policy_status(run, "b")]
        await run.close()
        return statuses

    assert 200 not in asyncio.run(main())


def test_a_failed_shared_announcement_fails_every_caller(gateway) -> None:
    url, admin, _, _ = gateway
    run = session(url, admin)  # never opened: the gateway does not know the run

    async def main() -> list[Any]:
        outcomes = await asyncio.gather(*(run.announce({f"s{i}": "c0"}, {"c0": {"system": "x"}}, budgeted=True)
                                          for i in range(5)), return_exceptions=True)
        await run.close()
        return outcomes

    outcomes = asyncio.run(main())
    assert all(isinstance(o, ServiceError) for o in outcomes)


def test_a_control_call_the_gateway_dropped_unanswered_is_tried_again() -> None:
    """A gateway that closes the first connection without answering (as one closing a
    kept-alive connection under load does): the announcement still lands."""
    seen: list[bytes] = []

    async def serve(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        head = await reader.readuntil(b"\r\n\r\n")
        length = next((int(line.split(b":")[1]) for line in head.split(b"\r\n")
                       if line.lower().startswith(b"content-length")), 0)
        seen.append(await reader.readexactly(length))
        if len(seen) > 1:
            body = b'{"tokens": {"s0": "t0"}}'
            writer.write(b"HTTP/1.1 200 OK\r\ncontent-type: application/json\r\ncontent-length: "
                         + str(len(body)).encode() + b"\r\n\r\n" + body)
            await writer.drain()
        writer.close()

    async def main() -> str:
        server = await asyncio.start_server(serve, "127.0.0.1", 0)
        port = server.sockets[0].getsockname()[1]
        run = GatewaySession(f"http://127.0.0.1:{port}", "run1", policy_upstream="fake", proposer_upstream="fake")
        try:
            await run.announce({"s0": "c0"}, {"c0": {"system": "x"}}, budgeted=True)
            base = PolicyBlock(provider="openai_compatible", model="m", base_url="http://unused/v1")
            return str(run.policy_block(base, "s0").base_url)
        finally:
            await run.close()
            server.close()

    url = asyncio.run(main())
    assert seen[0] == seen[1] != b"" and "/c/t0/" in url
