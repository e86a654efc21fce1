"""The two kinds of task container and what their rollouts use.

`SingleCallContainer`: data + program + `render` + `score`; its `rollout` is render -> one
policy call -> score. `MultiStepContainer`: data + program + its own `rollout` (a grader, a
simulated user, tools). Both share `TaskContainer`: the task set, the program, the hooks."""

from __future__ import annotations

import argparse
import logging
import random
import traceback
from abc import ABC, abstractmethod
from dataclasses import dataclass, field
from typing import Any, ClassVar

from fastapi import FastAPI

from harness.contract import ProgramResponse, RewardInfo, RolloutRequest, RolloutResponse, SideInfo, Usage, role_url
from harness.errors import HarnessError, ServiceError
from harness.http_pool import SharedSession
from harness.llm import ChatClient, ChatMessage, ChatResult

log = logging.getLogger("benchmarks.containers.kit")

Row = dict[str, Any]
# What score() gets: the policy's whole answer (text, finish_reason, prompt/completion tokens, latency).
PolicyResult = ChatResult


def policy_result(text: str, finish_reason: str | None = "stop", prompt_tokens: int = 0,
                  completion_tokens: int = 0) -> PolicyResult:
    """A PolicyResult built by hand: for a rollout that scores text itself, and for tests."""
    return PolicyResult(text=text, finish_reason=finish_reason, prompt_tokens=prompt_tokens,
                        completion_tokens=completion_tokens, latency_s=0.0)


def policy_endpoint(url: str) -> str:
    """The `.../v1` base for ChatClient, accepting a full `.../chat/completions` URL too."""
    url = url.rstrip("/")
    suffix = "/chat/completions"
    return url[: -len(suffix)] if url.endswith(suffix) else url


def request_seed(req: RolloutRequest) -> int | None:
    seed = req.metadata.get("seed")
    return seed if isinstance(seed, int) and not isinstance(seed, bool) else None


def seeded_split(rows: list[Row], seed: int, n_train: int) -> dict[str, list[Row]]:
    """Deterministic train/test split: a fixed-seed shuffle of the row order, so ids
    (`train:i`, `test:i`) are stable across runs and machines."""
    order = list(range(len(rows)))
    random.Random(seed).shuffle(order)
    return {"train": [rows[i] for i in order[:n_train]], "test": [rows[i] for i in order[n_train:]]}


def user_text(messages: list[ChatMessage]) -> str | None:
    """The non-system messages, joined: what the policy saw of a row besides the prompt."""
    return "\n\n".join(m.content for m in messages if m.role != "system") or None


def failed_response(req: RolloutRequest, exc: Exception, trace: dict[str, Any],
                    usage: Usage | None = None) -> RolloutResponse:
    """An error row without a reward, carrying the cause: the harness records and counts the
    failure and leaves it out of every score. Answered with HTTP 200, so nothing retries it."""
    kind = exc.kind.value if isinstance(exc, ServiceError) else "fatal"
    message = str(exc) if isinstance(exc, HarnessError) else f"{type(exc).__name__}: {exc}"
    return RolloutResponse(
        rollout_id=req.rollout_id, status="error", error=message, error_kind=kind,
        usage=usage or Usage(), trace=trace,
    )


class CodeErrors:
    """Exceptions raised by a container's own code (render, score, rollout): one log line
    each, the full traceback only the first time a given place raises."""

    def __init__(self) -> None:
        self._seen: set[tuple[str, str, int]] = set()

    def log(self, where: str, task_id: str, exc: Exception) -> None:
        frames = traceback.extract_tb(exc.__traceback__)
        last = frames[-1] if frames else None
        key = (type(exc).__name__, last.filename if last else "", last.lineno or 0 if last else 0)
        log.error("%s raised on %s: %s: %s", where, task_id, type(exc).__name__, exc)
        if key not in self._seen:
            self._seen.add(key)
            log.error("traceback (shown once):\n%s", "".join(traceback.format_exception(exc)))


@dataclass(frozen=True)
class RolloutEnv:
    """What a rollout may use: the app's HTTP session (for ChatClient), the env var naming the policy
    model's key (read from this process's environment only), the rollout's trace (kept on
    the error row when the rollout raises) and the log of the container's own errors."""

    http: SharedSession
    policy_key_env: str | None = None
    trace: dict[str, Any] = field(default_factory=dict)
    code_errors: CodeErrors = field(default_factory=CodeErrors)

    def policy_client(self, req: RolloutRequest, role: str = "policy") -> ChatClient:
        """A client for the rollout's policy endpoint and model. Another `role` (`grader`,
        `user_simulator`) reuses them for a call the harness's gateway attributes to it."""
        return ChatClient(role_url(policy_endpoint(req.policy.endpoint), role), req.policy.model,
                          api_key_env=self.policy_key_env, client=self.http)


class TaskContainer(ABC):
    """What every container has: a task set, a program and a rollout. Subclass
    `SingleCallContainer` or `MultiStepContainer`, not this."""

    taskset_id: ClassVar[str]
    name: ClassVar[str]
    source: ClassVar[str | None] = None
    # Fields a `task` sent in a rollout request must carry to be scored as is; otherwise
    # the row is looked up by task id.
    row_keys: ClassVar[tuple[str, ...]] = ()

    def __init__(self, data_dir: str | None = None) -> None:
        self.data_dir = data_dir
        self._splits: dict[str, list[Row]] | None = None
        self._seed: dict[str, str] | None = None

    @abstractmethod
    def load_splits(self) -> dict[str, list[Row]]:
        """Split name -> rows, in a deterministic order (index i is task id `split:i`)."""

    @abstractmethod
    def program(self) -> ProgramResponse: ...

    @abstractmethod
    async def rollout(self, req: RolloutRequest, row: Row, env: RolloutEnv) -> RolloutResponse:
        """One rollout of `req.candidate` on `row`. An exception becomes an error row."""

    def reflection_input(self, row: Row) -> str | None:
        """What the policy saw of `row`, for the optimizer's reflection (sent as
        `actionable_side_info.inputs` when the rollout did not set it). None: nothing."""
        return None

    def seed_texts(self) -> dict[str, str]:
        """The program's seed candidate (field -> text)."""
        if self._seed is None:
            self._seed = dict(self.program().seed_candidate)
        return self._seed

    def labels(self) -> list[str] | None:
        return None

    def task_info(self) -> dict[str, Any]:
        return {}

    @classmethod
    def add_arguments(cls, parser: argparse.ArgumentParser) -> None:
        """Extra CLI options of this container (e.g. a grader endpoint)."""

    def configure(self, args: argparse.Namespace) -> None:
        """Read the options added by `add_arguments`; called once before the data loads."""

    def extend_app(self, app: FastAPI) -> None:
        """Extra routes or exception handlers on the built app (behind the same bearer check)."""

    def splits(self) -> dict[str, list[Row]]:
        if self._splits is None:
            self._splits = self.load_splits()
        return self._splits

    def lookup(self, task_id: str) -> tuple[str, int, Row]:
        """(split, index, row) of `split:index`; KeyError with a message naming the id."""
        split, sep, index_text = task_id.rpartition(":")
        rows = self.splits().get(split)
        if not sep or rows is None or not (index_text.isascii() and index_text.isdigit()) or int(index_text) >= len(rows):
            raise KeyError(f"unknown task id {task_id!r}")
        return split, int(index_text), rows[int(index_text)]

    def task(self, task_id: str) -> Row:
        split, index, row = self.lookup(task_id)
        return {"task_id": task_id, "split": split, "seed": index, **row}


class SingleCallContainer(TaskContainer):
    """A rollout is one policy call: `render` the candidate and row into messages, call the
    policy, `score` its answer. Override `rollout` to wrap that (`await super().rollout(...)`)."""

    # Floor on the policy's max_tokens: a policy block sized for one-word labels would cut
    # off a long-form answer. 0 keeps the policy block's value.
    min_policy_tokens: int = 0

    @abstractmethod
    def render(self, candidate: dict[str, str], row: Row) -> list[ChatMessage]: ...

    @abstractmethod
    def score(self, row: Row, result: PolicyResult) -> tuple[float, str]:
        """(reward, feedback text for reflection). `result.text` is the answer;
        `result.finish_reason == "length"` means it was cut off at the token limit."""

    def objectives(self, row: Row, output_text: str) -> dict[str, float] | None:
        """Named scores besides the reward (`objective_scores`)."""
        return None

    def answer_examples(self, row: Row, result: PolicyResult) -> dict[str, list[str]] | None:
        """Answer -> inputs known to have it, for the answers `score`'s feedback names
        (`actionable_side_info.answer_examples`). None: none."""
        return None

    def reflection_input(self, row: Row) -> str | None:
        """By default the rendered non-system messages of the seed candidate. Override to
        leave out what every row shares (a long label list)."""
        return user_text(self.render(self.seed_texts(), row))

    async def rollout(self, req: RolloutRequest, row: Row, env: RolloutEnv) -> RolloutResponse:
        trace = env.trace
        try:
            messages = self.render(req.candidate, row)
        except Exception as exc:
            env.code_errors.log("render", req.task_id, exc)
            return failed_response(req, exc, trace)
        max_tokens = max(req.policy.max_tokens, self.min_policy_tokens)
        trace.update(messages=[m.model_dump() for m in messages], output="", max_tokens=max_tokens)
        result = await env.policy_client(req).complete(
            messages, temperature=req.policy.temperature, max_tokens=max_tokens, seed=request_seed(req))
        trace.update(output=result.text, finish_reason=result.finish_reason, latency_s=round(result.latency_s, 4))
        usage = Usage(prompt_tokens=result.prompt_tokens, completion_tokens=result.completion_tokens, cost_usd=None)
        try:
            reward, feedback = self.score(row, result)
            objectives = self.objectives(row, result.text)
            examples = self.answer_examples(row, result)
        except Exception as exc:  # the paid policy call is done: keep its usage on the error row
            env.code_errors.log("score", req.task_id, exc)
            return failed_response(req, exc, trace, usage)
        return RolloutResponse(
            rollout_id=req.rollout_id, status="ok", reward_info=RewardInfo(outcome_reward=float(reward)),
            objective_scores=objectives, usage=usage, trace=trace,
            actionable_side_info=SideInfo(feedback=feedback, answer_examples=examples),
        )


class MultiStepContainer(TaskContainer):
    """A rollout is more than one model call (a grader, a simulated user, tools): implement
    `rollout`, and `reflection_input` to show the proposer what the policy worked from."""
