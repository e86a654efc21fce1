"""Server-side kit for task containers: a container is data + program + render + score;
`build_app` turns it into the HTTP task contract and `serve` into a CLI.

The container calls the policy model itself (with the rollout's policy block and a key
from its own environment), so the harness never hands a credential over the wire.
"""

from __future__ import annotations

import argparse
import hmac
import logging
import os
import random
import sys
import traceback
from abc import ABC, abstractmethod
from collections.abc import AsyncIterator, Callable
from contextlib import asynccontextmanager
from dataclasses import dataclass
from typing import Any, ClassVar

import httpx
import uvicorn
from fastapi import FastAPI, HTTPException, Request
from fastapi.exceptions import RequestValidationError
from fastapi.responses import JSONResponse
from starlette.types import ASGIApp, Receive, Scope, Send

from harness.contract import (
    CONTRACT_VERSION,
    GEPA_OPTIMIZER_CONTRACT,
    ProgramResponse,
    RewardInfo,
    RolloutRequest,
    RolloutResponse,
    SideInfo,
    TasksRequest,
    Usage,
    role_url,
)
from harness.body_limit import BodyLimit
from harness.errors import HarnessError, ServiceError
from harness.llm import ChatClient, ChatMessage, ChatResult

log = logging.getLogger(__name__)

Row = dict[str, Any]
# What score() gets: the policy's whole answer (text, finish_reason, prompt/completion tokens, latency).
PolicyResult = ChatResult


def policy_result(text: str, finish_reason: str | None = "stop", prompt_tokens: int = 0,
                  completion_tokens: int = 0) -> PolicyResult:
    """A PolicyResult built by hand: for a custom rollout() that scores text, and for tests."""
    return PolicyResult(text=text, finish_reason=finish_reason, prompt_tokens=prompt_tokens,
                        completion_tokens=completion_tokens, latency_s=0.0)

SHUTDOWN_GRACE_S = 3.0  # seconds in-flight requests get after SIGTERM before they are cut off


@dataclass(frozen=True)
class RolloutEnv:
    """What a custom rollout may use: the app's pooled HTTP client and the env var naming
    the policy model's key (read from this process's environment only)."""

    http: httpx.AsyncClient
    policy_key_env: str | None = None

    def policy_client(self, req: RolloutRequest, role: str = "policy") -> ChatClient:
        """A client for the rollout's policy endpoint and model. Another `role` (`grader`,
        `user_simulator`) reuses them for a call the harness's gateway attributes to it."""
        return ChatClient(role_url(policy_endpoint(req.policy.endpoint), role), req.policy.model,
                          api_key_env=self.policy_key_env, client=self.http)


def seeded_split(rows: list[Row], seed: int, n_train: int) -> dict[str, list[Row]]:
    """Deterministic train/test split: a fixed-seed shuffle of the row order, so ids
    (`train:i`, `test:i`) are stable across runs and machines."""
    order = list(range(len(rows)))
    random.Random(seed).shuffle(order)
    return {"train": [rows[i] for i in order[:n_train]], "test": [rows[i] for i in order[n_train:]]}


class TaskContainer(ABC):
    """One task: subclasses set the class attributes and implement the four abstract methods."""

    taskset_id: ClassVar[str]
    name: ClassVar[str]
    source: ClassVar[str | None] = None
    # Fields a `task` sent in a rollout request must carry to be scored as is; otherwise
    # the row is looked up by task id.
    row_keys: ClassVar[tuple[str, ...]] = ()
    # Floor on the policy's max_tokens: a policy block sized for one-word labels would cut
    # off a long-form answer. 0 keeps the policy block's value.
    min_policy_tokens: int = 0

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
    def render(self, candidate: dict[str, str], row: Row) -> list[ChatMessage]: ...

    @abstractmethod
    def score(self, row: Row, result: PolicyResult) -> tuple[float, str]:
        """(reward, feedback text for reflection). `result.text` is the answer;
        `result.finish_reason == "length"` means it was cut off at the token limit."""

    def reflection_input(self, row: Row) -> str | None:
        """What the policy saw of `row`, for the optimizer's reflection (sent as
        `actionable_side_info.inputs`): by default the rendered non-system messages of the
        seed candidate. Override to leave out what every row shares (a long label list)."""
        messages = self.render(self._seed_texts(), row)
        text = "\n\n".join(m.content for m in messages if m.role != "system")
        return text or None

    def _seed_texts(self) -> dict[str, str]:
        if self._seed is None:
            self._seed = dict(self.program().seed_candidate)
        return self._seed

    def labels(self) -> list[str] | None:
        return None

    def task_info(self) -> dict[str, Any]:
        return {}

    # ---- optional hooks (defaults keep the single-call behaviour) ----

    @classmethod
    def add_arguments(cls, parser: argparse.ArgumentParser) -> None:
        """Extra CLI options of this container (e.g. a grader endpoint)."""

    def configure(self, args: argparse.Namespace) -> None:
        """Read the options added by `add_arguments`; called once before the data loads."""

    def extend_app(self, app: FastAPI) -> None:
        """Extra routes or exception handlers on the built app (behind the same bearer check)."""

    def objectives(self, row: Row, output_text: str) -> dict[str, float] | None:
        """Named scores besides the reward (`objective_scores`) for the single-call path."""
        return None

    async def rollout(self, req: RolloutRequest, row: Row, env: RolloutEnv) -> RolloutResponse | None:
        """A rollout that is more than one policy call (a grader, a user simulator, tools).
        None (the default) runs the single call: render -> policy -> score."""
        return None

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


class _BearerAuth:
    """Pure ASGI middleware: every path but /health needs `Authorization: Bearer <key>`.

    Middleware rather than a dependency so the check runs before body parsing (a bad body
    without the key gets 401, not 422) and covers every route, including unknown ones.
    """

    def __init__(self, app: ASGIApp, expected: bytes) -> None:
        self.app = app
        self.expected = expected

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http" or scope["path"] == "/health":
            await self.app(scope, receive, send)
            return
        given = dict(scope["headers"]).get(b"authorization", b"")
        scheme, _, token = given.partition(b" ")
        if scheme.lower() == b"bearer" and hmac.compare_digest(token.strip(), self.expected):
            await self.app(scope, receive, send)
            return
        response = JSONResponse(
            {"detail": "missing or wrong bearer key"}, status_code=401, headers={"WWW-Authenticate": "Bearer"}
        )
        await response(scope, receive, send)


def _sanitized_errors(errors: Any) -> list[dict[str, Any]]:
    # Pydantic errors carry the offending `input` (and `ctx`); a rejected policy block may
    # hold a secret, so only location, message and type go back to the caller.
    return [{"loc": list(e.get("loc", ())), "msg": e.get("msg", ""), "type": e.get("type", "")} for e in errors]


def policy_endpoint(url: str) -> str:
    """The `.../v1` base for ChatClient, accepting a full `.../chat/completions` URL too."""
    url = url.rstrip("/")
    suffix = "/chat/completions"
    return url[: -len(suffix)] if url.endswith(suffix) else url


def request_seed(req: RolloutRequest) -> int | None:
    seed = req.metadata.get("seed")
    return seed if isinstance(seed, int) and not isinstance(seed, bool) else None


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


class _CodeErrors:
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


def build_app(
    container: TaskContainer, *, api_key_env: str | None = None, policy_key_env: str | None = None
) -> FastAPI:
    """The FastAPI app serving `container` over the task contract."""
    expected_key = os.environ.get(api_key_env) if api_key_env else None
    if api_key_env and not expected_key:
        log.warning("%s is not set: the container accepts requests without a key", api_key_env)
    program = container.program()
    code_errors = _CodeErrors()
    required_fields = [m.candidate_field or m.module_id for m in program.modules if m.mutable]

    @asynccontextmanager
    async def lifespan(app: FastAPI) -> AsyncIterator[None]:
        # One pooled client per app so concurrent rollouts share connections to the policy.
        limits = httpx.Limits(max_connections=256, max_keepalive_connections=64)
        async with httpx.AsyncClient(timeout=300.0, limits=limits) as client:
            app.state.http = client
            yield

    app = FastAPI(title=container.name, lifespan=lifespan, docs_url=None, redoc_url=None, openapi_url=None)
    app.add_middleware(BodyLimit)  # HARNESS_MAX_BODY_BYTES, else 8 MiB: a larger body gets a 413
    if expected_key:
        app.add_middleware(_BearerAuth, expected=expected_key.encode())

    @app.exception_handler(RequestValidationError)
    async def _on_invalid(_: Request, exc: RequestValidationError) -> JSONResponse:
        return JSONResponse({"detail": _sanitized_errors(exc.errors())}, status_code=422)

    @app.get("/health")
    async def health() -> dict[str, Any]:
        return {"status": "ok", "contract_version": CONTRACT_VERSION}

    @app.get("/metadata")
    async def metadata() -> dict[str, Any]:
        return {
            "runtime_id": container.taskset_id,
            "name": container.name,
            "capabilities": {"protocol": "http", "contract_version": CONTRACT_VERSION},
            "metadata": {
                "optimizer_contracts": {"gepa": {"version": GEPA_OPTIMIZER_CONTRACT}},
                "taskset_id": container.taskset_id,
                "program_id": program.program_id,
            },
        }

    @app.get("/program")
    async def get_program() -> dict[str, Any]:
        return program.model_dump(mode="json")

    @app.get("/taskset")
    async def taskset() -> dict[str, Any]:
        body: dict[str, Any] = {
            "taskset_id": container.taskset_id,
            "splits": {name: len(rows) for name, rows in container.splits().items()},
        }
        labels = container.labels()
        if labels is not None:
            body["labels"] = labels
        if container.source:
            body["source"] = container.source
        return body

    @app.post("/taskset/tasks")
    async def tasks(req: TasksRequest) -> dict[str, Any]:
        splits = container.splits()
        if req.split not in splits:
            raise HTTPException(404, f"unknown split {req.split!r}; splits are {sorted(splits)}")
        out = []
        for task_id in req.task_ids:
            try:
                task = container.task(task_id)
            except KeyError as exc:
                raise HTTPException(404, str(exc.args[0])) from None
            if task["split"] != req.split:
                raise HTTPException(404, f"task id {task_id!r} is not in split {req.split!r}")
            out.append(task)
        return {"tasks": out}

    @app.get("/task_info")
    async def task_info() -> dict[str, Any]:
        return container.task_info()

    def row_for(req: RolloutRequest) -> Row:
        if req.task and all(key in req.task for key in container.row_keys):
            return req.task
        try:
            return container.lookup(req.task_id)[2]
        except KeyError as exc:
            raise HTTPException(404, str(exc.args[0])) from None

    @app.post("/rollout")
    async def rollout(req: RolloutRequest, request: Request) -> dict[str, Any]:
        missing = [name for name in required_fields if name not in req.candidate]
        if missing:
            raise HTTPException(422, f"candidate lacks field(s) {missing}")
        row = row_for(req)
        env = RolloutEnv(http=request.app.state.http, policy_key_env=policy_key_env)
        trace: dict[str, Any] = {"model": req.policy.model}
        try:
            done = await run_one(req, row, env, trace)
        except HarnessError as exc:
            done = failed_response(req, exc, trace)
        except Exception as exc:  # the container's own code: an error row, not a 500 the harness retries
            if isinstance(exc, HTTPException) or handled(exc):
                raise  # a deliberate HTTP answer
            code_errors.log("rollout", req.task_id, exc)
            done = failed_response(req, exc, trace)
        if done.actionable_side_info is None or done.actionable_side_info.inputs is None:
            try:
                inputs = container.reflection_input(row)
            except Exception as exc:
                code_errors.log("reflection_input", req.task_id, exc)
                inputs = None
            if inputs:
                side = done.actionable_side_info or SideInfo()
                done = done.model_copy(update={"actionable_side_info": side.model_copy(update={"inputs": inputs})})
        return done.model_dump(mode="json")

    def handled(exc: Exception) -> bool:
        return any(isinstance(key, type) and key is not Exception and isinstance(exc, key)
                   for key in app.exception_handlers)

    async def run_one(req: RolloutRequest, row: Row, env: RolloutEnv, trace: dict[str, Any]) -> RolloutResponse:
        custom = await container.rollout(req, row, env)
        if custom is not None:
            return custom
        try:
            messages = container.render(req.candidate, row)
        except Exception as exc:
            code_errors.log("render", req.task_id, exc)
            return failed_response(req, exc, trace)
        max_tokens = max(req.policy.max_tokens, container.min_policy_tokens)
        trace.update(messages=[m.model_dump() for m in messages], output="", max_tokens=max_tokens)
        result = await env.policy_client(req).complete(
            messages, temperature=req.policy.temperature, max_tokens=max_tokens, seed=request_seed(req))
        trace.update(output=result.text, finish_reason=result.finish_reason, latency_s=round(result.latency_s, 4))
        usage = Usage(prompt_tokens=result.prompt_tokens, completion_tokens=result.completion_tokens, cost_usd=None)
        try:
            reward, feedback = container.score(row, result)
            objectives = container.objectives(row, result.text)
        except Exception as exc:  # the paid policy call is done: keep its usage on the error row
            code_errors.log("score", req.task_id, exc)
            return failed_response(req, exc, trace, usage)
        return RolloutResponse(
            rollout_id=req.rollout_id, status="ok", reward_info=RewardInfo(outcome_reward=float(reward)),
            objective_scores=objectives, usage=usage, trace=trace, actionable_side_info=SideInfo(feedback=feedback),
        )

    container.extend_app(app)
    return app


def serve(container_factory: Callable[[str | None], TaskContainer], argv: list[str] | None = None) -> None:
    """CLI entry for a container module's `__main__`."""
    parser = argparse.ArgumentParser(description="Serve a task container over the HTTP task contract.")
    parser.add_argument("--host", default="127.0.0.1", help="bind address (default loopback)")
    parser.add_argument("--port", type=int, required=True)
    parser.add_argument("--data-dir", default=os.environ.get("HARNESS_DATA_DIR"),
                        help="folder holding <dataset>/<file> (default $HARNESS_DATA_DIR); else download")
    parser.add_argument("--api-key-env", default=None, help="env var holding the key clients must send")
    parser.add_argument("--policy-key-env", default=None, help="env var holding the policy model's API key")
    add_arguments = getattr(container_factory, "add_arguments", None)
    if callable(add_arguments):
        add_arguments(parser)
    args = parser.parse_args(argv)
    container = container_factory(args.data_dir)
    container.configure(args)
    try:
        container.splits()  # load (or download) the data before we report healthy
    except HarnessError as exc:
        print(f"error: {exc}", file=sys.stderr)
        raise SystemExit(2) from None
    app = build_app(container, api_key_env=args.api_key_env, policy_key_env=args.policy_key_env)
    # bounded shutdown: on SIGTERM (also the harness's death signal) a request that hangs
    # (a stuck policy call) must not keep this process alive after the harness is gone
    uvicorn.run(app, host=args.host, port=args.port, log_level="warning",
                timeout_graceful_shutdown=SHUTDOWN_GRACE_S)
