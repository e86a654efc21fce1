"""The scripted model as an OpenAI-compatible server: a real HTTP server on loopback
(FastAPI + uvicorn), so runs and tests exercise the same client path as a hosted model.
Scripts (harness.scripted_model, harness.scripted_faults) are chosen by name at start.

    python -m harness.scripted_server --port 8100 --script rules
"""

from __future__ import annotations

import argparse
import asyncio
import json
import sys
import tempfile
from pathlib import Path
from typing import Any
from urllib.parse import parse_qsl

import uvicorn
from fastapi import FastAPI, Request
from fastapi.responses import JSONResponse
from pydantic import ValidationError

from harness.errors import first_error
from harness.processes import ManagedProcess, ProcessService, ServiceHandle, free_port, project_env
from harness.scripted_faults import Fail429Script, FailScript, FlakyOptions, FlakyScript, flaky_answer
from harness.scripted_model import (
    DEFAULT_SCRIPT,
    QueueScript,
    RulesScript,
    Script,
    ScriptError,
    role_of,
)


def _count_tokens(text: str) -> int:
    return len(text.split())


SCRIPTS: dict[str, type[Script]] = {
    cls.name: cls for cls in (RulesScript, QueueScript, FailScript, Fail429Script, FlakyScript)}


def make_script(name: str, replies: list[str] | None = None) -> Script:
    """A script by name; `flaky` takes options as a query string (`flaky?rate=0.1&kinds=503`),
    and every script takes `latency_s` (each answer waits that long: a model's latency)."""
    base, sep, query = name.partition("?")
    if base not in SCRIPTS:
        raise ValueError(f"unknown script {base!r}; known: {', '.join(sorted(SCRIPTS))}")
    try:
        options = dict(parse_qsl(query, strict_parsing=bool(query)))
    except ValueError as exc:  # a query string that does not parse
        raise ValueError(f"script {name!r}: bad options: {exc}") from exc
    try:
        latency_s = float(options.pop("latency_s", 0.0))
    except ValueError:
        raise ValueError(f"script {name!r}: option 'latency_s': not a number") from None
    if not 0.0 <= latency_s <= 600.0:
        raise ValueError(f"script {name!r}: option 'latency_s': must be between 0 and 600 seconds")
    if base == "flaky":
        try:
            flaky_options = FlakyOptions.model_validate(options)
        except ValidationError as exc:
            error = first_error(exc)
            raise ValueError(f"script {name!r}: option {error.where!r}: {error.message}") from exc
        script: Script = FlakyScript(replies, flaky_options)
    elif options:
        raise ValueError(f"script {base!r} takes no options but latency_s (got {query!r})")
    else:
        script = SCRIPTS[base](replies)
    script.latency_s = latency_s
    return script


def create_app(script: Script) -> FastAPI:
    app = FastAPI(title=f"scripted model ({script.name})")
    counts: dict[str, int] = {"policy": 0, "proposer": 0}
    # calls being answered now, and the most there were at once: what ran beside what
    in_flight: dict[str, int] = {"policy": 0, "proposer": 0}
    peak_in_flight: dict[str, int] = {"policy": 0, "proposer": 0}
    served = {"n": 0}

    # async handlers run on one event loop, so counters and the queue need no lock
    @app.post("/v1/chat/completions")
    async def chat(request: Request) -> JSONResponse:
        body = await request.json()
        messages = [m for m in body.get("messages", []) if isinstance(m, dict)]
        for m in messages:
            m["content"] = m.get("content") if isinstance(m.get("content"), str) else ""
        role = role_of(messages)
        counts[role] += 1
        in_flight[role] += 1
        peak_in_flight[role] = max(peak_in_flight[role], in_flight[role])
        try:
            return await _answer(body, messages, role)
        finally:
            in_flight[role] -= 1

    async def _answer(body: dict[str, Any], messages: list[dict[str, Any]], role: str) -> JSONResponse:
        if script.latency_s:
            await asyncio.sleep(script.latency_s)
        refused, forced = await flaky_answer(script, body)
        if refused is not None:
            return refused
        try:
            text = script.reply(messages, role) if forced is None else forced
        except ScriptError as exc:
            error = {"error": {"message": str(exc), "type": "scripted_failure"}}
            return JSONResponse(error, status_code=exc.status, headers=exc.headers)
        finish = "stop"
        max_tokens = body.get("max_tokens")
        if isinstance(max_tokens, int) and _count_tokens(text) > max_tokens:
            text, finish = " ".join(text.split()[:max_tokens]), "length"
        served["n"] += 1
        prompt_tokens = sum(_count_tokens(m["content"]) for m in messages)
        completion_tokens = _count_tokens(text)
        return JSONResponse({
            "id": f"chatcmpl-scripted-{served['n']}",
            "object": "chat.completion",
            "created": 0,
            "model": body.get("model", script.name),
            "choices": [{"index": 0, "message": {"role": "assistant", "content": text}, "finish_reason": finish}],
            "usage": {"prompt_tokens": prompt_tokens, "completion_tokens": completion_tokens,
                      "total_tokens": prompt_tokens + completion_tokens},
        })

    @app.get("/v1/models")
    async def models() -> dict[str, Any]:
        return {"object": "list", "data": [{"id": f"scripted-{script.name}", "object": "model", "owned_by": "harness"}]}

    @app.get("/health")
    async def health() -> dict[str, str]:
        return {"status": "ok", "script": script.name}

    @app.get("/stats")
    async def stats() -> dict[str, Any]:
        faults = dict(script.faults) if isinstance(script, FlakyScript) else {}
        return {"script": script.name, "requests": dict(counts), "total": sum(counts.values()), "faults": faults,
                "peak_in_flight": dict(peak_in_flight)}

    return app


def load_replies(path: str | Path | None) -> list[str] | None:
    if path is None:
        return None
    data = json.loads(Path(path).read_text())
    if not isinstance(data, list) or not all(isinstance(x, str) for x in data):
        raise ValueError(f"{path}: replies must be a JSON list of strings")
    return data


class ScriptedEndpoint(ServiceHandle):
    port: int

    @property
    def base_url(self) -> str:
        return f"http://127.0.0.1:{self.port}/v1"

    @property
    def stats_url(self) -> str:
        return f"http://127.0.0.1:{self.port}/stats"


class ScriptedModelServer(ProcessService, ScriptedEndpoint):
    """Runs the scripted model as a child process on a free loopback port."""

    def __init__(self, script: str = DEFAULT_SCRIPT, replies: list[str] | None = None, *,
                 log_dir: Path | None = None, startup_timeout_s: float = 30.0):
        make_script(script, replies)  # fail here, not in the child, on a bad name or missing replies
        self.script = script
        self.replies = replies
        self.port = free_port()
        self._tmp = tempfile.TemporaryDirectory(prefix="scripted-model-")
        self.log_dir = log_dir or Path(self._tmp.name)
        command = [sys.executable, "-m", "harness.scripted_server", "--port", str(self.port), "--script", script]
        if replies is not None:
            replies_path = Path(self._tmp.name) / "replies.json"
            replies_path.write_text(json.dumps(replies))
            command += ["--replies", str(replies_path)]
        self._proc = ManagedProcess(
            f"scripted-model[{script}]", command, health_url=f"http://127.0.0.1:{self.port}/health",
            log_path=self.log_dir / f"scripted-model-{self.port}.log", env=project_env(),
            startup_timeout_s=startup_timeout_s,
        )

    def stop(self) -> None:
        super().stop()
        self._tmp.cleanup()


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(prog="python -m harness.scripted_server", description=__doc__.splitlines()[0])
    parser.add_argument("--host", default="127.0.0.1")
    parser.add_argument("--port", type=int, required=True)
    parser.add_argument("--script", default=DEFAULT_SCRIPT,
                        help=f"one of {', '.join(sorted(SCRIPTS))}; flaky takes options: flaky?rate=0.1&kinds=503")
    parser.add_argument("--replies", help="JSON list of reply strings (queue script)")
    args = parser.parse_args(argv)
    try:
        script = make_script(args.script, load_replies(args.replies))
    except (OSError, ValueError) as exc:
        parser.exit(2, f"error: {exc}\n")
    # bounded shutdown: a `slow` request must not keep this process alive after SIGTERM
    uvicorn.run(create_app(script), host=args.host, port=args.port, log_level="warning", timeout_graceful_shutdown=3)


if __name__ == "__main__":
    main()
