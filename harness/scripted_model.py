"""A scripted, deterministic OpenAI-compatible model server for tests and smoke runs.

It is a real HTTP server on loopback (FastAPI + uvicorn), so tests exercise the same
client path as a hosted model. Scripts are chosen by name at start:

- `rules` (default): a policy that follows rule lines in its system prompt, and a proposer
  that adds one rule per call from failing examples, so optimization can really improve.
- `queue`: replies taken in order from a JSON list, cycling.
- `fail` / `fail_429`: always HTTP 500 / 429 (with `Retry-After: 0`).
- `flaky`: `rules`, except that a share of requests fail, for fault-injection tests. Options
  follow the name as a query string (also as a model's `source`), e.g.
  `flaky?rate=0.05&kinds=429,503,empty&seed=0`: `rate` (share of distinct requests that
  fail), `kinds` (subset of `FLAKY_KINDS`: 429 with `Retry-After`, 429 without, 503, `slow`
  (answers after `slow_s` seconds, past a short client timeout), `empty` (a completion with
  no text), `garbage` (HTTP 200 whose body is not JSON)), `attempts` (how many times the
  same request fails before it is answered; 0: always), `seed`, `retry_after`, `slow_s`.
  Which requests fail depends on the seed, the request body and how often that body was
  seen, so a rerun fails the same requests. `/stats` counts the faults by kind.

Policy: rule lines `- If the message mentions "WORD", answer: LABEL` in the system prompt
are tried in order against the last user message minus its label list (case-insensitive
substring); otherwise the first label of the label list (`Available intents:` /
`Intent labels:` followed by lines, or `Labels: a, b`), else `unknown`.

Proposer request format (what the optimizer sends; the constants below are the contract):
the system message starts with `PROPOSER_MARKER`; the user message holds the current
instruction between `CURRENT_OPEN` and `CURRENT_CLOSE` lines and examples rendered by
`format_example` (an optional `Reward: x` line; x >= 1 means the example passed). Feedback
carries the expected label as "expected intent `LABEL`" or "Expected: LABEL". An input may
be a JSON row; its label-like fields are ignored. The reply is the current instruction plus
one new rule line inside a ``` fenced block (unchanged if no failing example lacks a rule).
"""

from __future__ import annotations

import argparse
import asyncio
import hashlib
import json
import os
import re
import sys
import tempfile
import threading
import time
from pathlib import Path
from collections import Counter
from typing import Any
from urllib.parse import parse_qsl

import uvicorn
from fastapi import FastAPI, Request
from fastapi.responses import JSONResponse, Response
from pydantic import BaseModel, ConfigDict, Field, ValidationError, field_validator

from harness.errors import first_error
from harness.processes import ManagedProcess, ServiceHandle, free_port

PROPOSER_MARKER = "You improve prompts"
CURRENT_OPEN = "<current_instruction>"
CURRENT_CLOSE = "</current_instruction>"
EXAMPLE_HEADER = "### Example {k}"
RULE_TEMPLATE = '- If the message mentions "{word}", answer: {label}'
DEFAULT_SCRIPT = "rules"

_RULE_RE = re.compile(r'^\s*-\s*If the message mentions "(?P<word>[^"]+)",\s*answer:\s*(?P<label>.+?)\s*$', re.I | re.M)
_EXPECTED_RES = (re.compile(r"expected(?: intent)?\s*`([^`]+)`", re.I), re.compile(r"Expected:\s*`?([^\s`]+)`?", re.I))
_EXAMPLE_SPLIT_RE = re.compile(r"^### Example\s+\d+\s*$", re.M)
_SECTION_RE = re.compile(r"^(Input|Output|Reward|Feedback):[ \t]*\n?", re.M)
_ANSWER_KEYS = frozenset({"label", "answer", "expected", "target", "output"})
_WORD_RE = re.compile(r"[A-Za-z]+")
_STOPWORDS = frozenset(
    "about above after again against because before being below between could doing during "
    "further having hello other ought please should their there these thing things those "
    "through under until where which while would yours yourself thanks thank might really "
    "every today tomorrow still since message answer customer intent intents label labels".split()
)


def format_example(k: int, input_text: str, output_text: str, feedback: str, reward: float | None = None) -> str:
    """One example block in the format the `rules` proposer parses."""
    reward_line = f"Reward: {reward:g}\n" if reward is not None else ""
    return (f"{EXAMPLE_HEADER.format(k=k)}\nInput:\n{input_text}\nOutput:\n{output_text}\n{reward_line}"
            f"Feedback:\n{feedback}\n")


def _count_tokens(text: str) -> int:
    return len(text.split())


# The reference gepa library sends its reflection prompt as one user message.
LIBRARY_REFLECTION_MARKER = "I provided an assistant with the following instructions"
_LIBRARY_FENCE_RE = re.compile(r"```[a-zA-Z]*\n(.*?)```", re.S)
_LIBRARY_SECTIONS = {"## Inputs": "Input:", "## Generated Outputs": "Output:", "## Feedback": "Feedback:"}


def _role(messages: list[dict[str, Any]]) -> str:
    system = next((m["content"] for m in messages if m.get("role") == "system"), "")
    if system.lstrip().startswith(PROPOSER_MARKER) or LIBRARY_REFLECTION_MARKER in _last_user(messages):
        return "proposer"
    return "policy"


def _from_library_prompt(text: str) -> str:
    """Rewrite the gepa library's reflection prompt into the example format `rules` parses."""
    fence = _LIBRARY_FENCE_RE.search(text)
    current = fence.group(1).strip("\n") if fence else ""
    body = text[fence.end():] if fence else text
    body = re.sub(r"^# Example (\d+)\s*$", r"### Example \1", body, flags=re.M)
    for heading, section in _LIBRARY_SECTIONS.items():
        body = re.sub(rf"^{re.escape(heading)}\s*$", section, body, flags=re.M)
    return f"{CURRENT_OPEN}\n{current}\n{CURRENT_CLOSE}\n{body}"


def _last_user(messages: list[dict[str, Any]]) -> str:
    return next((m["content"] for m in reversed(messages) if m.get("role") == "user"), "")


class ScriptError(Exception):
    """Raised by a script to answer with an HTTP error instead of a completion."""

    def __init__(self, status: int, headers: dict[str, str] | None = None):
        super().__init__(f"scripted HTTP {status}")
        self.status = status
        self.headers = headers or {}


class Script:
    name = "base"
    latency_s = 0.0  # every answer waits this long (set from the `latency_s` option)

    def __init__(self, replies: list[str] | None = None):
        self.replies = replies

    def reply(self, messages: list[dict[str, Any]], role: str) -> str:
        raise NotImplementedError


def rules_in(text: str) -> list[tuple[str, str]]:
    """(word, label) pairs of the rule lines in `text`, in order."""
    return [(m["word"], m["label"]) for m in _RULE_RE.finditer(text)]


# "intent labels:" is the banking77 container's header (labels before the message)
_LABEL_HEADS = ("available intents:", "intent labels:", "labels:")


def _label_block(lines: list[str]) -> tuple[int, int, list[str]] | None:
    """(first, end) line span and labels of the first label list: a header line with the
    labels after it on the same line (comma-separated) or on the following lines until a blank."""
    for i, line in enumerate(lines):
        stripped = line.strip()
        head = next((h for h in _LABEL_HEADS if stripped.lower().startswith(h)), None)
        if head is None:
            continue
        rest = stripped[len(head):].strip()
        if rest:
            return i, i + 1, [x.strip().strip("`'\"") for x in rest.split(",") if x.strip()]
        end = i + 1
        while end < len(lines) and lines[end].strip():
            end += 1
        return i, end, [ln.strip().lstrip("-*• ").strip().strip("`'\"") for ln in lines[i + 1:end]]
    return None


def _without_label_list(text: str) -> str:
    """The message without its label list, so rule words do not match label names."""
    lines = text.splitlines()
    block = _label_block(lines)
    return "\n".join(lines[: block[0]] + lines[block[1]:]) if block else text


def first_label(text: str) -> str | None:
    """First label of an `Available intents:` (or `Intent labels:`) list, or of a `Labels: a, b` line."""
    block = _label_block(text.splitlines())
    return next((label for label in block[2] if label), None) if block else None


class RulesScript(Script):
    name = "rules"

    def reply(self, messages: list[dict[str, Any]], role: str) -> str:
        if role != "proposer":
            return self._answer(messages)
        text = _last_user(messages)
        if LIBRARY_REFLECTION_MARKER in text and CURRENT_OPEN not in text:
            text = _from_library_prompt(text)
        return self._propose(text)

    @staticmethod
    def _answer(messages: list[dict[str, Any]]) -> str:
        system = "\n".join(m["content"] for m in messages if m.get("role") == "system")
        user = _last_user(messages)
        message = _without_label_list(user).lower()
        for word, label in rules_in(system):
            if word.lower() in message:  # substring: "refund" also matches "refunds"
                return label
        return first_label(user) or first_label(system) or "unknown"

    @staticmethod
    def _propose(text: str) -> str:
        current = ""
        if CURRENT_OPEN in text and CURRENT_CLOSE in text:
            current = text.split(CURRENT_OPEN, 1)[1].split(CURRENT_CLOSE, 1)[0].strip("\n")
        existing = rules_in(current)
        ruled_labels = {label.lower() for _, label in existing}
        ruled_words = {word.lower() for word, _ in existing}
        for block in _EXAMPLE_SPLIT_RE.split(text)[1:]:
            sections = _sections(block)
            expected = _expected_label(sections.get("feedback", ""))
            if expected is None or expected.lower() in ruled_labels or _passed(sections, expected):
                continue
            word = _distinctive_word(_input_text(sections.get("input", ""), expected), ruled_words)
            if word is None:
                continue
            rule = RULE_TEMPLATE.format(word=word, label=expected)
            return f"```\n{current.rstrip()}\n{rule}\n```" if current.strip() else f"```\n{rule}\n```"
        return f"```\n{current}\n```"


def _sections(block: str) -> dict[str, str]:
    parts = _SECTION_RE.split(block)
    # split yields [preamble, name1, body1, name2, body2, ...]
    return {parts[i].lower(): parts[i + 1].strip("\n") for i in range(1, len(parts) - 1, 2)}


def _passed(sections: dict[str, str], expected: str) -> bool:
    reward = sections.get("reward", "").strip()
    try:
        return float(reward) >= 1.0
    except ValueError:
        return sections.get("output", "").strip().strip("`").lower() == expected.lower()


def _input_text(text: str, expected: str) -> str:
    """The input's own words: for a JSON row, its string values minus the label field."""
    try:
        row = json.loads(text)
    except ValueError:
        return text
    if not isinstance(row, dict):
        return text
    return " ".join(v for k, v in row.items()
                    if isinstance(v, str) and k not in _ANSWER_KEYS and v.lower() != expected.lower())


def _expected_label(feedback: str) -> str | None:
    for pattern in _EXPECTED_RES:
        match = pattern.search(feedback)
        if match:
            return match.group(1).strip().rstrip(".,;")
    return None


def _distinctive_word(text: str, taken: set[str]) -> str | None:
    best: str | None = None
    for word in _WORD_RE.findall(text):
        low = word.lower()
        if len(low) >= 5 and low not in _STOPWORDS and low not in taken and (best is None or len(low) > len(best)):
            best = low
    return best


class QueueScript(Script):
    name = "queue"

    def __init__(self, replies: list[str] | None = None):
        if not replies:
            raise ValueError("the queue script needs a non-empty replies list (--replies FILE)")
        super().__init__(replies)
        self._next = 0

    def reply(self, messages: list[dict[str, Any]], role: str) -> str:
        assert self.replies is not None
        text = self.replies[self._next % len(self.replies)]
        self._next += 1
        return text


class FailScript(Script):
    name = "fail"

    def reply(self, messages: list[dict[str, Any]], role: str) -> str:
        raise ScriptError(500)


class Fail429Script(Script):
    name = "fail_429"

    def reply(self, messages: list[dict[str, Any]], role: str) -> str:
        raise ScriptError(429, {"Retry-After": "0"})


FLAKY_KINDS = ("429", "429_bare", "503", "slow", "empty", "garbage")


class FlakyOptions(BaseModel):
    model_config = ConfigDict(frozen=True, extra="forbid")
    rate: float = Field(default=0.2, ge=0.0, le=1.0)
    kinds: tuple[str, ...] = FLAKY_KINDS
    seed: int = 0
    attempts: int = Field(default=1, ge=0)
    retry_after: float = Field(default=1.0, ge=0.0)
    slow_s: float = Field(default=5.0, gt=0.0)

    @field_validator("kinds", mode="before")
    @classmethod
    def _split(cls, value: Any) -> Any:
        kinds = tuple(k.strip() for k in value.split(",") if k.strip()) if isinstance(value, str) else value
        unknown = sorted(set(kinds) - set(FLAKY_KINDS))
        if unknown or not kinds:
            raise ValueError(f"kinds must be a non-empty subset of {list(FLAKY_KINDS)}, got {list(kinds)}")
        return kinds


class FlakyScript(RulesScript):
    """`rules`, with faults decided per request by `fault_for` (see the module docstring)."""

    name = "flaky"

    def __init__(self, replies: list[str] | None = None, options: FlakyOptions | None = None):
        super().__init__(replies)
        self.options = options or FlakyOptions()
        self.faults: Counter[str] = Counter()
        self._seen: Counter[str] = Counter()

    def fault_for(self, body: dict[str, Any]) -> str | None:
        options = self.options
        key = hashlib.sha256(f"{options.seed}:{json.dumps(body, sort_keys=True)}".encode()).digest()
        if int.from_bytes(key[:8], "big") / 2**64 >= options.rate:
            return None
        self._seen[key.hex()] += 1
        if options.attempts and self._seen[key.hex()] > options.attempts:
            return None
        kind = options.kinds[int.from_bytes(key[8:16], "big") % len(options.kinds)]
        self.faults[kind] += 1
        print(f"flaky: injected {kind}", file=sys.stderr, flush=True)  # the server's log keeps the count
        return kind


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


async def _flaky_answer(script: Script, body: dict[str, Any]) -> tuple[Response | None, str | None]:
    """(an error response to send instead of a completion, or a forced completion text)."""
    if not isinstance(script, FlakyScript):
        return None, None
    kind = script.fault_for(body)
    error = {"error": {"message": f"scripted fault {kind}", "type": "scripted_failure"}}
    if kind == "429":
        return JSONResponse(error, status_code=429, headers={"Retry-After": f"{script.options.retry_after:g}"}), None
    if kind == "429_bare":
        return JSONResponse(error, status_code=429), None
    if kind == "503":
        return JSONResponse(error, status_code=503), None
    if kind == "garbage":
        return Response("<html><body>upstream hiccup</body></html>", status_code=200, media_type="text/html"), None
    if kind == "slow":
        await asyncio.sleep(script.options.slow_s)
    return None, ("" if kind == "empty" else None)


def create_app(script: Script) -> FastAPI:
    app = FastAPI(title=f"scripted model ({script.name})")
    counts: dict[str, int] = {"policy": 0, "proposer": 0}
    served = {"n": 0}

    # async handlers run on one event loop, so counters and the queue need no lock
    @app.post("/v1/chat/completions")
    async def chat(request: Request) -> JSONResponse:
        body = await request.json()
        messages = [m for m in body.get("messages", []) if isinstance(m, dict)]
        for m in messages:
            m["content"] = m.get("content") if isinstance(m.get("content"), str) else ""
        role = _role(messages)
        counts[role] += 1
        if script.latency_s:
            await asyncio.sleep(script.latency_s)
        refused, forced = await _flaky_answer(script, body)
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
        return {"script": script.name, "requests": dict(counts), "total": sum(counts.values()), "faults": faults}

    return app


def load_replies(path: str | Path | None) -> list[str] | None:
    if path is None:
        return None
    data = json.loads(Path(path).read_text())
    if not isinstance(data, list) or not all(isinstance(x, str) for x in data):
        raise ValueError(f"{path}: replies must be a JSON list of strings")
    return data


class _Running(ServiceHandle):
    port: int

    @property
    def base_url(self) -> str:
        return f"http://127.0.0.1:{self.port}/v1"

    @property
    def stats_url(self) -> str:
        return f"http://127.0.0.1:{self.port}/stats"


class ScriptedModelServer(_Running):
    """Runs the scripted model as a child process on a free loopback port."""

    def __init__(self, script: str = DEFAULT_SCRIPT, replies: list[str] | None = None, *,
                 log_dir: Path | None = None, startup_timeout_s: float = 30.0):
        make_script(script, replies)  # fail here, not in the child, on a bad name or missing replies
        self.script = script
        self.replies = replies
        self.port = free_port()
        self._tmp = tempfile.TemporaryDirectory(prefix="scripted-model-")
        self.log_dir = log_dir or Path(self._tmp.name)
        command = [sys.executable, "-m", "harness.scripted_model", "--port", str(self.port), "--script", script]
        if replies is not None:
            replies_path = Path(self._tmp.name) / "replies.json"
            replies_path.write_text(json.dumps(replies))
            command += ["--replies", str(replies_path)]
        # the child must import this package even when it is not installed
        project_root = str(Path(__file__).resolve().parent.parent)
        self._proc = ManagedProcess(
            f"scripted-model[{script}]", command, health_url=f"http://127.0.0.1:{self.port}/health",
            log_path=self.log_dir / f"scripted-model-{self.port}.log",
            env={"PYTHONPATH": os.pathsep.join(filter(None, [project_root, os.environ.get("PYTHONPATH")]))},
            startup_timeout_s=startup_timeout_s,
        )

    def start(self) -> None:
        self._proc.start()

    @property
    def log_path(self) -> Path:
        return self._proc.log_path

    def stop(self) -> None:
        self._proc.stop()
        self._tmp.cleanup()


class ScriptedModelThread(_Running):
    """The same server inside this process (a uvicorn thread): faster for unit tests."""

    def __init__(self, script: str = DEFAULT_SCRIPT, replies: list[str] | None = None):
        self.script = make_script(script, replies)
        self.port = free_port()
        config = uvicorn.Config(create_app(self.script), host="127.0.0.1", port=self.port, log_level="warning")
        self._server = uvicorn.Server(config)
        self._thread = threading.Thread(target=self._server.run, name="scripted-model", daemon=True)

    def start(self) -> None:
        self._thread.start()
        deadline = time.monotonic() + 10.0
        while not self._server.started:
            if time.monotonic() > deadline or not self._thread.is_alive():
                raise RuntimeError(f"scripted model thread did not start on port {self.port}")
            time.sleep(0.01)

    def stop(self) -> None:
        self._server.should_exit = True
        if self._thread.is_alive():
            self._thread.join(timeout=5.0)


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(prog="python -m harness.scripted_model", description=__doc__.splitlines()[0])
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
