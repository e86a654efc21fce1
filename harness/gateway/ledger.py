"""The usage ledger: every call attributed to (run, scope, role), with tokens, cost,
cache outcome and the prompt check; per-run spend against the run's USD budget; totals
by role for live usage. Lives in the gateway's event loop (no locks needed)."""

from __future__ import annotations

import hmac
import secrets
from collections import Counter

from harness.budget import would_cross_usd

from harness.gateway.models import (
    POLICY_SIDE_ROLES,
    Announcement,
    CallRecord,
    RoleTotals,
    RunRegistration,
    RunSpend,
    UsageTotals,
)


def normalize(text: str) -> str:
    """Whitespace-insensitive form: a container may re-indent or re-wrap the prompt."""
    return " ".join(text.split())


def new_token() -> str:
    return secrets.token_urlsafe(32)  # 256 bits: unguessable


def same(given: str, expected: str | None) -> bool:
    return expected is not None and hmac.compare_digest(given.encode(), expected.encode())


class RunLedger:
    def __init__(self, run_id: str, registration: RunRegistration):
        self.run_id = run_id
        self.token = new_token()  # the driver's own calls (proposer)
        self.scope_tokens: dict[str, str] = {}  # rollout scope -> its container's capability
        self.open_scopes: set[str] = set()
        self.upstreams = dict(registration.upstreams)
        self.budget = registration.budget_usd
        self.records: list[CallRecord] = []
        self.spent = 0.0
        self.budgeted_spent = 0.0  # what counts against the budget: all but unbudgeted (heldout) scopes
        self.reserved = 0.0  # estimated cost of budgeted calls in flight
        self.unknown_cost_calls = 0
        self.scope_candidate: dict[str, str] = {}
        self.candidate_texts: dict[str, tuple[str, ...]] = {}
        self.unbudgeted: set[str] = set()
        self.refused: list[str] = []
        self.by_role: dict[str, RoleTotals] = {}
        self.cache: Counter[str] = Counter()
        self.prompt_check_misses = 0
        self.replay_misses = 0
        self._samples: Counter[tuple[str, str]] = Counter()
        self._calls: Counter[str] = Counter()

    def upstream_for(self, role: str) -> str | None:
        if role in self.upstreams:
            return self.upstreams[role]
        return self.upstreams.get("policy") if role in POLICY_SIDE_ROLES else None

    def announce(self, announcement: Announcement) -> dict[str, str]:
        """Open the announced rollout scopes; returns each one's capability token."""
        for candidate_id, texts in announcement.candidates.items():
            self.candidate_texts[candidate_id] = tuple(n for n in (normalize(t) for t in texts.values()) if n)
        for scope, candidate_id in announcement.scopes.items():
            self.scope_candidate[scope] = candidate_id
            if announcement.budgeted:
                self.unbudgeted.discard(scope)
            else:
                self.unbudgeted.add(scope)
            self.scope_tokens.setdefault(scope, new_token())
            self.open_scopes.add(scope)
        return {scope: self.scope_tokens[scope] for scope in announcement.scopes}

    def close(self, scopes: list[str]) -> None:
        """A finished rollout's token spends nothing more."""
        self.open_scopes.difference_update(scopes)

    def admits(self, token: str, scope: str, role: str) -> str | None:
        """None if `token` may call as (scope, role), else why not. The run's token may call
        anywhere in the run; a rollout's only in its own scope, as a policy-side role,
        while the rollout is open."""
        if same(token, self.token):
            return None
        if not same(token, self.scope_tokens.get(scope)):
            return "the URL's token is not this rollout's"
        if scope not in self.open_scopes:
            return f"rollout {scope!r} is closed"
        if role not in ("policy", *POLICY_SIDE_ROLES):
            return f"a rollout cannot call as {role!r}"
        return None

    def next_sample(self, scope: str, base_digest: str) -> int:
        key = (scope, base_digest)
        index = self._samples[key]
        self._samples[key] += 1
        return index

    def next_call_id(self, scope: str) -> str:
        index = self._calls[scope]
        self._calls[scope] += 1
        return f"{scope}#{index}"

    def budgeted(self, scope: str) -> bool:
        return self.budget is not None and scope not in self.unbudgeted

    def would_cross(self, estimate: float | None) -> bool:
        """Refuse the call that would take the spend past the budget. Calls in flight count
        with their estimate, so many concurrent calls cannot cross it together."""
        return would_cross_usd(self.budget, self.budgeted_spent, self.reserved, estimate)

    def prompt_check(self, scope: str, prompt_text: str) -> bool | None:
        """True if a module text of the scope's candidate is in the prompt; None if unknown."""
        texts = self.candidate_texts.get(self.scope_candidate.get(scope, ""), ())
        if not texts:
            return None
        prompt = normalize(prompt_text)
        return any(text in prompt for text in texts)

    def add(self, record: CallRecord) -> None:
        self.records.append(record)
        self.by_role.setdefault(record.role, RoleTotals()).add(record)
        self.cache[record.cache] += 1
        if record.cost_usd is not None:
            self.spent += record.cost_usd
            if record.scope is None or record.scope not in self.unbudgeted:
                self.budgeted_spent += record.cost_usd
        elif record.status == "ok":
            self.unknown_cost_calls += 1
        if record.prompt_check is False:
            self.prompt_check_misses += 1
        if record.status == "replay_miss":
            self.replay_misses += 1
        if record.status == "refused" and record.scope is not None:
            self.refused.append(record.scope)

    def spend(self) -> RunSpend:
        return RunSpend(
            run_id=self.run_id, cost_usd=self.spent, budgeted_cost_usd=self.budgeted_spent,
            unknown_cost_calls=self.unknown_cost_calls,
            budget_usd=self.budget, by_role=self.by_role, cache=dict(self.cache), refused_scopes=list(self.refused),
            prompt_check_misses=self.prompt_check_misses, replay_misses=self.replay_misses,
        )


class Ledger:
    def __init__(self) -> None:
        self.runs: dict[str, RunLedger] = {}
        self.totals: dict[str, RoleTotals] = {}
        self._unattributed: Counter[str] = Counter()

    def register(self, run_id: str, registration: RunRegistration) -> RunLedger | None:
        """None if the run id is taken: registering again would wipe a live run's records
        and reset its budget. A new attempt registers after the last one's DELETE."""
        if run_id in self.runs:
            return None
        self.runs[run_id] = RunLedger(run_id, registration)
        return self.runs[run_id]

    def add(self, record: CallRecord, run: RunLedger | None) -> None:
        self.totals.setdefault(record.role, RoleTotals()).add(record)
        if run is not None:
            run.add(record)

    def unattributed_call_id(self) -> str:
        self._unattributed["-"] += 1
        return f"-#{self._unattributed['-'] - 1}"

    def usage(self) -> UsageTotals:
        return UsageTotals(by_role=self.totals, runs=len(self.runs))
