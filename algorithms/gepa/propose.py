"""One reflection turn: the formats of the turn's plan (reflect.format_plan) tried in order
until one changes the module, each a proposer request screened for free.

Two ways to spend the proposer's round trips:

- one by one (the default): a request's samples are drawn one after the other and stop once
  `lines_wanted` new lines survived the screen; the next format is asked only when nothing
  did. Fewest calls, but a turn whose first format screens out costs two or more round trips.
- at once (`sample_together`): every request of the plan with all its samples goes out
  together, and the plan is then walked in order over the replies. One round trip a turn,
  whatever the screen keeps, at the price of the calls the early stops would have saved: for
  slow hosted proposers at high concurrency, where a round trip is the iteration's longest step.

Both choose the same way: the first format of the plan whose replies change the module."""

from __future__ import annotations

import asyncio
from dataclasses import dataclass, field
from functools import cached_property
from typing import Any, Sequence

from algorithms.gepa.proposer import answer_space
from algorithms.gepa.reflect import CitedPairs, EditSettings, Proposal, apply, cite_examples, request
from algorithms.protocol import RunView
from harness.candidates import RolloutResult
from harness.errors import FailureKind, ServiceError
from harness.llm import ChatMessage, ChatResult


class ProposerHealth:
    """Consecutive failed proposer calls (after the client's retries): an endpoint that keeps
    failing, or fails fatally, fails the run; a passing failure only ends its turn."""

    def __init__(self, max_errors: int):
        self.max_errors = max_errors
        self.consecutive = 0

    def failed(self, exc: ServiceError) -> str:
        self.consecutive += 1
        if exc.kind is FailureKind.FATAL or self.consecutive >= self.max_errors:
            raise exc
        return str(exc)

    def answered(self) -> None:
        self.consecutive = 0


@dataclass
class Turn:
    """What one turn produced and spent."""

    edit_format: str
    proposal: Proposal | None = None
    calls: int = 0
    prompt_tokens: int = 0
    completion_tokens: int = 0
    latency_s: float = 0.0
    error: str | None = None

    def count(self, replies: Sequence[ChatResult]) -> None:
        for reply in replies:
            self.calls += 1
            self.prompt_tokens += reply.prompt_tokens
            self.completion_tokens += reply.completion_tokens
            self.latency_s += reply.latency_s

    @property
    def changed(self) -> bool:
        return self.proposal is not None and self.proposal.status == "changed"


@dataclass(frozen=True)
class TurnInputs:
    """The parent module's text and what the proposer is shown about its minibatch."""

    current: str
    results: list[RolloutResult]
    task_info: dict[str, Any] | None
    settings: EditSettings
    samples: int  # replies per request
    lines_wanted: int
    sampling: dict[str, Any] = field(default_factory=dict)  # temperature, max_tokens
    earlier: CitedPairs = ()  # citations of the run's earlier failures, for an `examples` edit with room left
    failed_answers: tuple[str, ...] = ()  # the run's failed answers, most frequent first (not_answer_lines)

    @cached_property
    def examples_edit(self) -> Proposal:
        """The `examples` edit of this turn: the container's citations, no proposer call;
        computed once, whether the plan or the turn asks first."""
        return cite_examples(self.current, self.results, self.settings, self.earlier,
                             answer_space(self.task_info), self.failed_answers)


async def one_by_one(ctx: RunView, plan: list[str], inputs: TurnInputs, health: ProposerHealth,
                     scopes: list[str]) -> Turn:
    turn = Turn(edit_format=plan[0])
    for edit_format in plan:
        turn.edit_format = edit_format
        if edit_format == "examples":  # the container's citations: no proposer call
            turn.proposal = inputs.examples_edit
            if turn.changed:
                break
            continue
        messages = request(inputs.current, inputs.results, edit_format, inputs.task_info, inputs.settings)
        replies: list[ChatResult] = []
        turn.proposal = None  # an earlier format's result must not stand for this one if its call fails
        try:
            for _ in range(inputs.samples):
                replies.append(await ctx.propose(messages, **inputs.sampling, scopes=scopes))
                turn.proposal = _screen(inputs, messages, replies, edit_format)
                if turn.proposal.enough(inputs.lines_wanted):
                    break
        except ServiceError as exc:
            turn.error = health.failed(exc)
        else:
            health.answered()
        finally:
            turn.count(replies)
        # the screen ran after every reply: turn.proposal already holds this request's result
        if turn.changed or turn.error is not None:
            break
    return turn


async def at_once(ctx: RunView, plan: list[str], inputs: TurnInputs, health: ProposerHealth,
                  scopes: list[str]) -> Turn:
    if plan[0] == "examples":  # free: when the citations change the module, nothing is asked
        if inputs.examples_edit.status == "changed":
            return Turn(edit_format="examples", proposal=inputs.examples_edit)
    asked = [(i, request(inputs.current, inputs.results, f, inputs.task_info, inputs.settings))
             for i, f in enumerate(plan) if f != "examples"]
    calls = [ctx.propose(messages, **inputs.sampling, scopes=scopes) for _, messages in asked
             for _ in range(inputs.samples)]
    outcomes = await asyncio.gather(*calls, return_exceptions=True)
    turn = Turn(edit_format=plan[0])
    turn.count([o for o in outcomes if isinstance(o, ChatResult)])
    failures = [o for o in outcomes if isinstance(o, BaseException)]
    if failures:
        first = failures[0]
        if not isinstance(first, ServiceError):  # a budget stop, a cancellation
            raise first
        turn.error = health.failed(first)
    elif calls:
        health.answered()
    replies_of = {i: [o for o in outcomes[n * inputs.samples:(n + 1) * inputs.samples] if isinstance(o, ChatResult)]
                  for n, (i, _) in enumerate(asked)}
    messages_of = dict(asked)
    for i, edit_format in enumerate(plan):
        turn.edit_format = edit_format
        if edit_format == "examples":
            turn.proposal = inputs.examples_edit
        elif replies_of[i]:
            turn.proposal = _screen(inputs, messages_of[i], replies_of[i], edit_format)
        else:  # its calls failed: no result of its own
            turn.proposal = None
        if turn.changed:
            break
    return turn


def _screen(inputs: TurnInputs, messages: list[ChatMessage], replies: list[ChatResult], edit_format: str) -> Proposal:
    return apply(inputs.current, messages, replies, edit_format, inputs.results, inputs.task_info, inputs.settings)
