"""`python -m harness doctor URL` (or `doctor container=NAME`): checks a task container
against the contract route by route, runs one rollout with the scripted model, and prints
one line per finding, each problem with its fix. Exit code 1 on any blocking problem."""

from __future__ import annotations

import argparse
import asyncio
import sys
import tempfile
import uuid
from pathlib import Path
from typing import Any, Literal

import httpx
from pydantic import BaseModel, ConfigDict

from harness.client import ContainerClient
from harness.contract import GEPA_OPTIMIZER_CONTRACT, PolicyBlock, ProgramResponse, RolloutRequest
from harness.errors import ConfigError, ContractViolation, HarnessError, ServiceError, Unreachable
from harness.http_pool import tls_context
from harness.retry import RetryPolicy
from harness.outcome import judge
from harness.preflight import optimizer_contract_problem, program_problems

Level = Literal["ok", "info", "warn", "error"]
_PORT_HINT = "start the container (it must listen on the given port, e.g. --port or $PORT) and check the url"


class Finding(BaseModel):
    model_config = ConfigDict(frozen=True)
    level: Level
    route: str
    message: str
    fix: str | None = None

    def line(self) -> str:
        fix = f" -> fix: {self.fix}" if self.fix else ""
        return f"{self.level.upper():5} {self.route}: {self.message}{fix}"


class Doctor:
    """Runs the checks in contract order; a blocking problem on a route the later checks
    need (nothing answers, no program, no rows) stops there."""

    def __init__(self, url: str, policy_url: str, *, api_key_env: str | None = None, timeout_s: float = 120.0):
        self.url = url.rstrip("/")
        self.policy_url = policy_url
        self.client = ContainerClient(self.url, api_key_env=api_key_env, concurrency=1, timeout_s=timeout_s,
                                      retry=RetryPolicy(attempts=1))
        self.findings: list[Finding] = []

    def add(self, level: Level, route: str, message: str, fix: str | None = None) -> None:
        self.findings.append(Finding(level=level, route=route, message=message, fix=fix))

    @property
    def blocking(self) -> bool:
        return any(f.level == "error" for f in self.findings)

    async def run(self) -> list[Finding]:
        try:
            await self._checks()
        except ConfigError as exc:
            self.add("error", "(config)", str(exc), "export the variable or drop --api-key-env")
        finally:
            await self.client.aclose()
        return self.findings

    async def _call(self, route: str, call: Any) -> Any:
        """The route's answer, or None with the problem recorded."""
        try:
            return await call
        except Unreachable as exc:
            self.add("error", route, f"nothing answers at {self.url}: {exc}", _PORT_HINT)
        except ContractViolation as exc:
            self.add("error", route, str(exc), "answer with the shape in README 'Write your own container'")
        except ServiceError as exc:
            fix = None
            if "HTTP 404" in str(exc):
                fix = ("serve the route, or advertise your path as metadata.optimizer_contracts.gepa."
                       f"{_route_key(route)}_route")
            elif "HTTP 401" in str(exc) or "HTTP 403" in str(exc):
                fix = "pass --api-key-env VAR (container.api_key_env in a config) naming the variable with the key"
            self.add("error", route, str(exc), fix)
        return None

    async def _checks(self) -> None:
        health = await self._call("/health", self.client.health())
        if health is None:
            return
        if not health.healthy:
            self.add("error", "/health", f"status is {health.status!r}", "answer {\"status\": \"ok\"} once ready")
        else:
            version = f" (contract_version {health.contract_version!r}: informational)" if health.contract_version else ""
            self.add("ok", "/health", f"alive{version}")
        metadata = await self._call("/metadata", self.client.metadata())
        if metadata is None:
            return
        problem = optimizer_contract_problem(metadata.gepa_contract)
        if problem:
            self.add("error", "/metadata", problem,
                     f"set metadata.optimizer_contracts.gepa.version to {GEPA_OPTIMIZER_CONTRACT!r}")
        else:
            self.add("ok", "/metadata", f"optimizer contract {metadata.gepa_contract}")
        advertised = self.client.use_routes(metadata)
        if advertised:
            shown = ", ".join(f"{name} -> {path}" for name, path in sorted(advertised.items()))
            self.add("info", "/metadata", f"advertised routes followed: {shown}")
        program = await self._call(self.client.routes["program"], self.client.program())
        if program is not None:
            self._check_program(program)
        row = await self._first_row()
        await self._task_info()
        if program is not None and row is not None and not program_problems(program):
            await self._rollout(program, row)

    def _check_program(self, program: ProgramResponse) -> None:
        route = self.client.routes["program"]
        problems = program_problems(program)
        for problem in problems:
            self.add("error", route, problem, "list each target module among `modules`, mutable, with its "
                     "candidate_field in `seed_candidate`")
        if not problems:
            shapes = "objects" if any(t.candidate_field or t.objective for t in program.target_specs) else "ids"
            self.add("ok", route, f"target modules {program.target_modules} (as {shapes}), "
                     f"seed fields {sorted(program.seed_candidate)}")

    async def _first_row(self) -> dict[str, Any] | None:
        route = self.client.routes["taskset"]
        taskset = await self._call(route, self.client.taskset())
        if taskset is None:
            return None
        filled = {name: count for name, count in taskset.splits.items() if count > 0}
        if not filled:
            self.add("error", route, f"no split has rows ({taskset.splits})", "return splits as {\"train\": N, ...}")
            return None
        self.add("ok", route, f"taskset {taskset.taskset_id!r}, splits {taskset.splits}")
        split = "train" if "train" in filled else sorted(filled)[0]
        tasks_route = self.client.routes["tasks"]
        tasks = await self._call(tasks_route, self.client.tasks(split, [f"{split}:0"]))
        if tasks is None:
            return None
        self.add("ok", tasks_route, f"row {split}:0 has fields {sorted(tasks[0].model_dump())}")
        return tasks[0].model_dump()

    async def _task_info(self) -> None:
        route = self.client.routes["task_info"]
        try:
            info = await self.client.task_info()
        except ServiceError as exc:
            self.add("warn", route, f"optional route failed: {exc}", "answer a JSON object, or 404 to have none")
            return
        if info:
            self.add("ok", route, f"task context for the proposer: keys {sorted(info)}")
        else:
            self.add("info", route, "no task context (optional): the proposer sees only rows and feedback")

    async def _rollout(self, program: ProgramResponse, row: dict[str, Any]) -> None:
        route = self.client.routes["rollout"]
        policy = PolicyBlock(provider="scripted", model="scripted-rules", base_url=self.policy_url, max_tokens=24)
        request = RolloutRequest(rollout_id=f"doctor-{uuid.uuid4().hex[:8]}", task_id=row["task_id"],
                                 candidate=dict(program.seed_candidate), task=row, policy=policy,
                                 metadata={"candidate_id": "c0000", "seed": 0, "stage": "doctor"})
        calls_before = await self._policy_calls()
        answers: list[str] = []
        response = await self._call(route, self.client.rollout(request, answers))
        if response is None:
            return
        outcome = judge(response)
        status = f"status {response.status!r}" if response.status is not None else "no status (read as ok)"
        if outcome.reward is None:
            self.add("error", route, f"error row: {outcome.error}",
                     "on success send a status such as ok/completed and reward_info.outcome_reward; on failure "
                     "put the reason in `error` or `status_detail`")
        else:
            self.add("ok", route, f"reward {outcome.reward:g} from {_reward_field(response)}, {status}")
        if outcome.feedback_source is None:
            self.add("warn", route, "no feedback: the proposer reflects on nothing",
                     "send actionable_side_info.feedback (or reward_info.details, or summary expected/predicted)")
        else:
            self.add("ok", route, f"feedback from {outcome.feedback_source}: {_clip(outcome.feedback)}")
        if outcome.inputs is None:
            self.add("warn", route, "no inputs: the proposer sees the raw row instead of what the policy saw",
                     "send actionable_side_info.inputs with the text the policy was given")
        else:
            self.add("ok", route, f"inputs for the proposer ({len(outcome.inputs)} chars): {_clip(outcome.inputs, 60)}")
        if outcome.answer_examples:
            cited = sum(len(texts) for texts in outcome.answer_examples.values())
            self.add("ok", route, f"answer_examples: {cited} input(s) cited for {len(outcome.answer_examples)} "
                     "answer(s), checked against the proposer's learned lines")
        if not outcome.output:
            self.add("warn", route, "no output text", "send trace.output with the policy's answer")
        if (response.trace or {}).get("finish_reason") == "length":
            self.add("warn", route, f"the answer was cut off at max_tokens {policy.max_tokens} (the policy profiles' "
                     "value)", "for long answers set a floor (kit: min_policy_tokens) or raise policy.max_tokens")
        usage = response.usage
        if usage.prompt_tokens == 0 and usage.completion_tokens == 0 and usage.cost_usd is None:
            self.add("warn", route, "usage has no tokens and no cost: the run's cost will be unknown",
                     "send usage.prompt_tokens and usage.completion_tokens from the policy's answer")
        calls_after = await self._policy_calls()
        if calls_before is not None and calls_after is not None and calls_after <= calls_before:
            self.add("warn", route, "the container did not call the policy endpoint it was sent",
                     "call policy.base_url (or inference_url) with policy.model, OpenAI-compatible")

    async def _policy_calls(self) -> int | None:
        stats = self.policy_url.removesuffix("/v1") + "/stats"
        try:
            async with httpx.AsyncClient(timeout=10.0, verify=tls_context()) as http:
                return int((await http.get(stats)).json().get("total", 0))
        except (httpx.HTTPError, ValueError, AttributeError):
            return None


def _route_key(route: str) -> str:
    return {"/taskset/tasks": "tasks", "/task_info": "task_info"}.get(route, route.strip("/").split("/")[-1])


def _reward_field(response: Any) -> str:
    info = response.reward_info
    if info is not None and info.outcome_reward is not None:
        return "reward_info.outcome_reward"
    if info is not None and info.score is not None:
        return "reward_info.score"
    if response.summary and response.summary.get("outcome_reward") is not None:
        return "summary.outcome_reward"
    return "reward"


def _clip(text: str, limit: int = 100) -> str:
    flat = " ".join(text.split())
    return flat if len(flat) <= limit else flat[: limit - 3] + "..."


def _container_spec(overrides: list[str]) -> Any:
    """The container of the composed config (`container=NAME` and other overrides)."""
    from hydra import compose, initialize_config_dir
    from omegaconf import OmegaConf

    from harness.config import CONFIG_DIR, load_config

    with initialize_config_dir(config_dir=CONFIG_DIR, version_base=None):
        cfg = compose(config_name="config", overrides=["models=scripted", *overrides])
    raw = OmegaConf.to_container(cfg, resolve=True)
    return load_config(raw, base_dir=str(Path.cwd())).container  # type: ignore[arg-type]


async def diagnose(url: str, policy_url: str, api_key_env: str | None = None,
                   timeout_s: float = 120.0) -> list[Finding]:
    return await Doctor(url, policy_url, api_key_env=api_key_env, timeout_s=timeout_s).run()


def main(argv: list[str]) -> int:
    parser = argparse.ArgumentParser(
        prog="python -m harness doctor",
        description="Check a task container against the contract. TARGET is a url (a running container) or "
                    "container=NAME (a configured container, started here); other KEY=VALUE are config overrides.")
    parser.add_argument("target", nargs="+", help="URL, or container=NAME [key=value ...]")
    parser.add_argument("--api-key-env", default=None, help="env var holding the container's bearer key")
    args = parser.parse_args(argv)
    from harness.scripted_server import ScriptedModelServer
    from harness.services import Services

    first = args.target[0]
    with tempfile.TemporaryDirectory(prefix="harness-doctor-") as tmp, \
            ScriptedModelServer(script="rules", log_dir=Path(tmp)) as model:
        try:
            if first.startswith(("http://", "https://")):
                url, key_env, name, timeout = first, args.api_key_env, None, 120.0
                services = None
            else:
                spec = _container_spec(args.target)
                services = Services(Path(tmp) / "logs", label="doctor")
                url = services.container_url(spec) if spec.command else (spec.url or "")
                key_env, name, timeout = args.api_key_env or spec.api_key_env, spec.name, spec.request_timeout_s
        except HarnessError as exc:
            print(f"ERROR (start): {exc}")
            return 1
        try:
            print(f"doctor: {name} at {url}" if name else f"doctor: {url}", flush=True)
            findings = asyncio.run(diagnose(url, model.base_url, key_env, timeout))
        finally:
            if services is not None:
                services.close()
    for finding in findings:
        print(finding.line())
    problems = sum(f.level == "error" for f in findings)
    warnings = sum(f.level == "warn" for f in findings)
    print(f"doctor: {problems} blocking problem(s), {warnings} warning(s)")
    return 1 if problems else 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
