"""A run's side of the gateway: it registers the run (roles -> upstreams, USD budget),
gives each rollout and each proposer call its own attributed URL, announces rollouts
before they start (for the prompt check and the budget) and closes them when they end,
reads the metered spend back into the run (whose budget, harness/budget.py, decides on
it), and fetches the run's calls for its evidence at the end.

Announcements and closings made while one is in flight go out together in the next
request (`_Coalesced`): with many evaluations in flight (parallel proposals of small
minibatches) a request per evaluation was as many gateway calls as rollouts.

Authority: the control calls carry the driver's admin token; the gateway answers the
registration with the run's token (for the proposer's URLs) and each announcement with one
token per rollout (for that rollout's URL, the only one its container sees)."""

from __future__ import annotations

import asyncio
import dataclasses
import secrets
import time
from functools import partial
from typing import TYPE_CHECKING, Any, Awaitable, Callable, Generic, TypeVar
from urllib.parse import quote

import aiohttp
from pydantic import TypeAdapter

from harness.contract import PolicyBlock
from harness.http_pool import SharedSession, transport_failure
from harness.errors import FailureKind, ServiceError
from harness.retry import AttemptFailed, RetryPolicy
from harness.gateway.models import (
    Announcement,
    CallRecord,
    RunGrant,
    RunRegistration,
    RunSpend,
    ScopeClosing,
    ScopeGrants,
    UsageTotals,
)

if TYPE_CHECKING:
    from harness.llm import ChatClient

_RECORDS = TypeAdapter(list[CallRecord])
T = TypeVar("T")
_Announced = tuple[dict[str, str], dict[str, dict[str, str]]]  # rollout scopes -> candidate ids, candidates' texts
# columns of the model_calls table the gateway does not know: the run fills them in
_RUN_COLUMNS = ("rollout_id", "proposal_id")
REFRESH_EVERY_S = 1.0
# A control call that got no answer is tried again shortly, on another connection: a kept-alive
# one the gateway had just closed fails so under load (every control call here is idempotent
# but the registration, whose retry meets a 409 if the first got through).
_CONTROL_RETRY = RetryPolicy(attempts=3, base_delay_s=0.05, max_delay_s=0.5)


class GatewaySession:
    def __init__(self, gateway_url: str, run_id: str, *, policy_upstream: str, proposer_upstream: str,
                 budget_usd: float | None = None, timeout_s: float = 60.0, admin_token: str | None = None):
        self.gateway_url = gateway_url.rstrip("/")
        self.run_id = run_id
        # this attempt's name at the gateway: a retried run (its last attempt's worker died
        # before it could DELETE) registers anew instead of meeting a 409
        self.key = f"{run_id}~{secrets.token_hex(4)}"
        self._headers = {"authorization": f"Bearer {admin_token}"} if admin_token else {}
        self._token = ""  # the run's capability, from the registration
        self._scope_tokens: dict[str, str] = {}
        self.registration = RunRegistration(upstreams={"policy": policy_upstream, "proposer": proposer_upstream},
                                            budget_usd=budget_usd)
        self.spend = RunSpend(run_id=run_id)
        self._session = SharedSession(timeout_s)  # iterations in flight announce at once
        self._proposer_calls = 0
        self._unassigned: list[str] = []  # proposer scopes not yet tied to a proposal
        self._proposal_of: dict[str, str] = {}
        self._rollout_scopes: set[str] = set()
        self._refused_seen = 0
        self._refreshed_at = float("-inf")
        # by whether the run's USD budget applies: one announcement carries one flag
        self._announcers = {budgeted: _Coalesced(partial(self._announce_batch, budgeted))
                            for budgeted in (True, False)}
        self._closer = _Coalesced(self._close_batch)

    async def _request(self, method: str, path: str, body: str | None = None) -> bytes:
        """A control call's answer body (a 200's)."""
        url = f"{self.gateway_url}{path}"
        headers = {**self._headers, "Content-Type": "application/json"} if body is not None else self._headers

        async def attempt() -> tuple[int, bytes]:
            try:
                status, content, _ = await self._session.send(method, url, body, headers)
                return status, content
            except (TimeoutError, aiohttp.ClientError) as exc:
                raise AttemptFailed(f"gateway {method} {path}: {transport_failure(exc)[0]}",
                                    FailureKind.TRANSIENT) from exc

        try:
            status, content = await _CONTROL_RETRY.run(attempt)
        except AttemptFailed as exc:
            raise ServiceError(str(exc), exc.kind) from None
        if status != 200:
            text = content.decode("utf-8", errors="replace")
            raise ServiceError(f"gateway {method} {path}: HTTP {status}: {text[:300]}", FailureKind.FATAL)
        return content

    async def open(self) -> None:
        answer = await self._request("POST", f"/runs/{self.key}", self.registration.model_dump_json())
        self._token = RunGrant.model_validate_json(answer).token

    def url(self, scope: str, role: str, token: str | None = None) -> str:
        return f"{self.gateway_url}/c/{token or self._token}/r/{self.key}/{quote(scope, safe=':')}/{role}/v1"

    def policy_block(self, base: PolicyBlock, rollout_id: str) -> PolicyBlock:
        """The rollout's policy block: the container calls the gateway at a URL naming the
        rollout and carrying its capability (announced before it starts)."""
        url = self.url(rollout_id, "policy", self._scope_tokens[rollout_id])
        return base.model_copy(update={"base_url": url, "inference_url": url})

    async def announce(self, scopes: dict[str, str], candidates: dict[str, dict[str, str]], budgeted: bool) -> None:
        """Open rollout scopes; returns once the gateway has granted each its token."""
        self._rollout_scopes.update(scopes)
        await self._announcers[budgeted]((scopes, candidates))

    async def _announce_batch(self, budgeted: bool, batch: list[_Announced]) -> None:
        scopes = {scope: cid for part, _ in batch for scope, cid in part.items()}
        candidates = {cid: texts for _, part in batch for cid, texts in part.items()}
        body = Announcement(scopes=scopes, candidates=candidates, budgeted=budgeted)
        answer = await self._request("POST", f"/runs/{self.key}/scopes", body.model_dump_json())
        self._scope_tokens.update(ScopeGrants.model_validate_json(answer).tokens)

    async def close_scopes(self, scopes: list[str]) -> None:
        """The rollouts ended: their containers' URLs spend nothing more."""
        await self._closer(scopes)

    async def _close_batch(self, batch: list[list[str]]) -> None:
        closing = ScopeClosing(scopes=[scope for part in batch for scope in part])
        await self._request("POST", f"/runs/{self.key}/scopes/close", closing.model_dump_json())

    def proposer_client(self, client: "ChatClient") -> "ChatClient":
        """`client` aimed at this run's next proposer scope."""
        scope = f"proposer-{self._proposer_calls:04d}"
        self._proposer_calls += 1
        self._unassigned.append(scope)
        return client.with_base_url(self.url(scope, "proposer"))

    @property
    def last_proposer_scope(self) -> str | None:
        return self._unassigned[-1] if self._unassigned else None

    def assign_proposal(self, proposal_id: str, scopes: list[str] | None = None) -> None:
        """`scopes` (default: the proposer calls made since the last recorded proposal)
        belong to this proposal; iterations in flight together name their own."""
        mine = list(self._unassigned) if scopes is None else scopes
        for scope in mine:
            self._proposal_of[scope] = proposal_id
        self._unassigned = [s for s in self._unassigned if s not in set(mine)]

    def refresh_due(self) -> bool:
        """Whether to read the spend after a batch: always under a USD budget (the stop and
        the refusals must be exact; the gateway refuses nothing without one), otherwise at
        most every REFRESH_EVERY_S, for the progress line: a read per small batch would
        be a third of the run's HTTP calls."""
        return self.registration.budget_usd is not None or time.monotonic() - self._refreshed_at >= REFRESH_EVERY_S

    async def refresh(self) -> set[str]:
        """Read the run's spend; returns the scopes refused (budget) since the last refresh."""
        self._refreshed_at = time.monotonic()
        self.spend = RunSpend.model_validate_json(await self._request("GET", f"/runs/{self.key}/spend"))
        refused = self.spend.refused_scopes[self._refused_seen:]
        self._refused_seen = len(self.spend.refused_scopes)
        return set(refused)

    async def calls(self) -> list[CallRecord]:
        return _RECORDS.validate_json(await self._request("GET", f"/runs/{self.key}/calls"))

    def rows(self, records: list[CallRecord]) -> list[dict[str, Any]]:
        """Rows of the model_calls table, in a stable order (replays compare equal)."""
        rows = []
        for record in sorted(records, key=lambda r: _call_order(r.call_id)):
            row = dataclasses.asdict(record)
            scope = record.scope or ""
            row["rollout_id"] = scope if scope in self._rollout_scopes else None
            row["proposal_id"] = self._proposal_of.get(scope)
            row["run_id"] = self.run_id
            rows.append(row)
        return rows

    def summary(self) -> dict[str, Any]:
        """The manifest's `gateway` entry."""
        spend = self.spend
        return {
            "url": self.gateway_url, "cost_usd": spend.cost_usd, "budgeted_cost_usd": spend.budgeted_cost_usd,
            "unknown_cost_calls": spend.unknown_cost_calls, "budget_usd": spend.budget_usd, "cache": spend.cache,
            "refused": len(spend.refused_scopes),
            "prompt_check_misses": spend.prompt_check_misses, "replay_misses": spend.replay_misses,
            "by_role": {role: totals.model_dump() for role, totals in sorted(spend.by_role.items())},
        }

    async def close(self) -> None:
        try:
            await self._request("DELETE", f"/runs/{self.key}")
        except ServiceError:
            pass  # the gateway may be gone already; it forgets runs when it stops
        await self._session.aclose()


class _Coalesced(Generic[T]):
    """One request at a time for a kind of call: items given while it is in flight wait and
    go out together in the next. Each caller returns when the request carrying its item
    did, or raises its error; a caller cancelled meanwhile does not cancel the request,
    which others share."""

    def __init__(self, send: Callable[[list[T]], Awaitable[None]]):
        self._send = send
        self._queued: list[T] = []
        self._outcome: asyncio.Future[None] | None = None  # of the queued items' request
        self._sender: asyncio.Task[None] | None = None

    async def __call__(self, item: T) -> None:
        if self._outcome is None:
            self._outcome = asyncio.get_running_loop().create_future()
        outcome = self._outcome
        self._queued.append(item)
        if self._sender is None:  # starts on the loop's next turn: items given in this one join
            self._sender = asyncio.ensure_future(self._drain())
        await asyncio.shield(outcome)

    async def _drain(self) -> None:
        try:
            while self._queued:
                batch, outcome = self._queued, self._outcome
                assert outcome is not None
                self._queued, self._outcome = [], None
                try:
                    await self._send(batch)
                except Exception as exc:
                    outcome.set_exception(exc)
                except BaseException:
                    outcome.cancel()
                    raise
                else:
                    outcome.set_result(None)
        finally:
            self._sender = None
            if self._outcome is not None:  # this task was cancelled (the loop shuts down): nobody waits forever
                self._outcome.cancel()
                self._outcome, self._queued = None, []


def _call_order(call_id: str) -> tuple[str, int]:
    scope, _, index = call_id.rpartition("#")
    return scope, int(index) if index.isdigit() else 0


def live_usage_text(spend: RunSpend | UsageTotals | None) -> str:
    """`policy $x (n calls) | proposer $y (m calls)` for a progress line; ? marks unknown cost."""
    if spend is None:
        return ""
    parts = []
    for role, totals in sorted(spend.by_role.items()):
        unknown = "+?" if totals.unknown_cost_calls else ""
        tokens = totals.prompt_tokens + totals.completion_tokens
        parts.append(f"{role} ${totals.cost_usd:.4f}{unknown} {totals.calls} calls {tokens:,} tok")
    return " | ".join(parts)
