"""HealthBench (PostTrainBench "Easy V3" subset, 245 rows): the policy answers a multi-turn
health conversation; a grader model judges every rubric criterion met / not met with the
official HealthBench grader prompt; the score is achieved points over the total of the
positive points, clipped to [0, 1] (Arora et al., 2025; openai/simple-evals, MIT).

Run: `python -m benchmarks.containers.healthbench --port 8126 --data-dir /path/to/datasets
      [--grader-base-url URL --grader-model NAME --grader-key-env VAR]`.

Without `--grader-base-url`/`--grader-model`, each rollout is graded by the endpoint and
model of its own policy block (with the `--policy-key-env` key): convenient for local runs,
but a model then grades itself, so configure a separate grader for published numbers.
Grader tokens and cost are reported in `usage.grader`, never in the policy's `usage` fields.
"""

from __future__ import annotations

import argparse
import asyncio
import json
from typing import Any

from pydantic import BaseModel, ConfigDict

from benchmarks.containers.data import DatasetError, dataset_file
from benchmarks.containers.healthbench_grader import (
    GRADER_MAX_TOKENS,
    GRADER_SYSTEM,
    GRADER_TEMPERATURE,
    GRADER_TEMPLATE,
    parse_verdict,
)
from benchmarks.containers.kit import (
    PROGRAM_VERSION,
    ChatClient,
    ChatMessage,
    HarnessError,
    MultiStepContainer,
    ProgramModule,
    ProgramResponse,
    RewardInfo,
    RolloutEnv,
    RolloutRequest,
    RolloutResponse,
    Row,
    SideInfo,
    Usage,
    cost_usd,
    failed_response,
    policy_endpoint,
    request_seed,
    role_url,
    seeded_split,
    serve,
    user_text,
)

URL = ("https://raw.githubusercontent.com/aisa-group/PostTrainBench/9082063a62e10e040f1acacdec2ccfc1467e0c00/"
       "src/eval/tasks/healthbench/evaluation_code/data/healthbench.jsonl")
SHA256 = "0febc8f013eb5d91e3b7e31bbbb0284ae6aa5fbd8cab68b81d63fa252837c0b0"
FILENAME = "healthbench_posttrainbench_easy_v3.jsonl"
N_ROWS, N_TRAIN = 245, 145
DEFAULT_MIN_TOKENS = 1024  # physician-written rubrics expect a complete answer
SPLIT_SEED = 2025  # HealthBench's year; it only has to never change

# The system message simple-evals samples API models with (OPENAI_SYSTEM_MESSAGE_API), so the
# seed candidate's score is the model's plain HealthBench score on these rows.
SEED_SYSTEM = "You are a helpful assistant."


class GraderSettings(BaseModel):
    """Where criteria are graded. base_url/model None: the rollout's policy endpoint/model."""

    model_config = ConfigDict(frozen=True)
    base_url: str | None = None
    model: str | None = None
    key_env: str | None = None
    provider: str = "openai_compatible"
    max_tokens: int = GRADER_MAX_TOKENS
    temperature: float = GRADER_TEMPERATURE
    concurrency: int = 8
    attempts: int = 3  # tries per criterion until the grader returns a parseable verdict


class Verdict(BaseModel):
    criterion: str
    points: float
    tags: list[str] = []
    met: bool
    explanation: str = ""
    parsed: bool = True
    prompt: str = ""
    raw: list[str] = []


def conversation_text(prompt: list[dict[str, str]], response: str) -> str:
    # As simple-evals grade_sample: the response is the final assistant turn, every turn as
    # "role: content", turns joined by blank lines.
    turns = [*prompt, {"role": "assistant", "content": response}]
    return "\n\n".join(f"{turn['role']}: {turn['content']}" for turn in turns)


def grader_prompt(conversation: str, criterion: str, points: int | float) -> str:
    # RubricItem.__str__ upstream: f"[{points}] {criterion}", points as loaded from the JSON.
    return GRADER_TEMPLATE.replace("<<conversation>>", conversation).replace(
        "<<rubric_item>>", f"[{points}] {criterion}")


def healthbench_score(verdicts: list[Verdict]) -> tuple[float, float, float]:
    """(score clipped to [0, 1], achieved points, total positive points)."""
    total = sum(v.points for v in verdicts if v.points > 0)
    achieved = sum(v.points for v in verdicts if v.met)
    if total <= 0:
        raise DatasetError("a HealthBench rubric needs positive points")
    return min(1.0, max(0.0, achieved / total)), achieved, total


def feedback_text(score: float, achieved: float, total: float, verdicts: list[Verdict]) -> str:
    """Unmet positive criteria and met negative ones, the heaviest first, with points."""
    unmet = sorted((v for v in verdicts if v.points > 0 and not v.met), key=lambda v: -v.points)
    penalties = sorted((v for v in verdicts if v.points < 0 and v.met), key=lambda v: v.points)
    parts = [f"Score {score:.2f} ({achieved:g} of {total:g} positive rubric points)."]
    if unmet:
        parts.append("Unmet criteria: " + " ".join(f"[+{v.points:g}] {v.criterion}" for v in unmet))
    if penalties:
        parts.append("Penalized (undesirable criteria met): " + " ".join(
            f"[{v.points:g}] {v.criterion}" for v in penalties))
    if not unmet and not penalties:
        parts.append("Every positive criterion met and no undesirable one.")
    unparsed = sum(not v.parsed for v in verdicts)
    if unparsed:
        parts.append(f"({unparsed} criteria had no parseable grader verdict and count as not met.)")
    return " ".join(parts)


class HealthBench(MultiStepContainer):
    taskset_id = "healthbench"
    name = "HealthBench (PostTrainBench Easy V3 subset) rubric-graded health conversations"
    source = "https://github.com/openai/simple-evals (HealthBench, MIT) via aisa-group/PostTrainBench"
    row_keys = ("prompt", "rubrics")

    def __init__(self, data_dir: str | None = None, grader: GraderSettings | None = None) -> None:
        super().__init__(data_dir)
        self.grader = grader or GraderSettings()
        self.min_policy_tokens = DEFAULT_MIN_TOKENS

    @classmethod
    def add_arguments(cls, parser: argparse.ArgumentParser) -> None:
        parser.add_argument("--grader-base-url", default=None,
                            help="OpenAI-compatible base (.../v1) of the grader; default: the rollout's policy endpoint")
        parser.add_argument("--grader-model", default=None, help="grader model; default: the rollout's policy model")
        parser.add_argument("--grader-key-env", default=None, help="env var holding the grader's API key")
        parser.add_argument("--grader-provider", default="openai_compatible",
                            help="provider name used to price grader tokens (local/scripted are free)")
        parser.add_argument("--grader-max-tokens", type=int, default=GRADER_MAX_TOKENS)
        parser.add_argument("--grader-temperature", type=float, default=GRADER_TEMPERATURE,
                            help="simple-evals samples its grader at 0.5; 0 makes grading repeatable")
        parser.add_argument("--grader-concurrency", type=int, default=8, help="criteria graded in parallel per rollout")
        parser.add_argument("--min-policy-tokens", type=int, default=DEFAULT_MIN_TOKENS,
                            help="floor on the policy's max_tokens for its answer")

    def configure(self, args: argparse.Namespace) -> None:
        self.grader = GraderSettings(
            base_url=args.grader_base_url, model=args.grader_model, key_env=args.grader_key_env,
            provider=args.grader_provider, max_tokens=args.grader_max_tokens, temperature=args.grader_temperature,
            concurrency=args.grader_concurrency)
        self.min_policy_tokens = args.min_policy_tokens

    def load_splits(self) -> dict[str, list[Row]]:
        path = dataset_file(self.data_dir, "healthbench", FILENAME, URL, SHA256)
        with open(path, encoding="utf-8") as handle:
            examples = [json.loads(line) for line in handle if line.strip()]
        if len(examples) != N_ROWS:
            raise DatasetError(f"healthbench: expected {N_ROWS} rows in {path}, found {len(examples)}")
        rows = [{"prompt": ex["prompt"], "rubrics": ex["rubrics"], "example_tags": ex["example_tags"],
                 "prompt_id": ex["prompt_id"], "source_row": i} for i, ex in enumerate(examples)]
        return seeded_split(rows, SPLIT_SEED, N_TRAIN)

    def program(self) -> ProgramResponse:
        return ProgramResponse(
            version=PROGRAM_VERSION,
            program_id="healthbench.respond.v1",
            modules=[
                ProgramModule(module_id="stage1_system", role="system", content=SEED_SYSTEM,
                              mutable=True, candidate_field="stage1_system"),
                ProgramModule(module_id="grader", role="grader", content=GRADER_TEMPLATE, mutable=False),
            ],
            target_modules=["stage1_system"],
            seed_candidate={"stage1_system": SEED_SYSTEM},
        )

    def render(self, candidate: dict[str, str], row: Row) -> list[ChatMessage]:
        turns = [ChatMessage(role=m["role"], content=m["content"]) for m in row["prompt"]]
        return [ChatMessage(role="system", content=candidate["stage1_system"]), *turns]

    def reflection_input(self, row: Row) -> str | None:
        """The conversation so far, as the policy sees it under the seed prompt."""
        return user_text(self.render(self.seed_texts(), row))

    def grader_client(self, req: RolloutRequest, env: RolloutEnv) -> tuple[ChatClient, str]:
        """(client, provider for pricing): the configured grader, else the rollout's policy."""
        if self.grader.base_url or self.grader.model:
            base = role_url(policy_endpoint(self.grader.base_url or req.policy.endpoint), "grader")
            model = self.grader.model or req.policy.model
            key_env = self.grader.key_env if self.grader.base_url else (self.grader.key_env or env.policy_key_env)
            provider = self.grader.provider if self.grader.base_url else req.policy.provider
            return ChatClient(base, model, api_key_env=key_env, client=env.http), provider
        return env.policy_client(req, role="grader"), req.policy.provider

    async def rollout(self, req: RolloutRequest, row: Row, env: RolloutEnv) -> RolloutResponse:
        messages = self.render(req.candidate, row)
        max_tokens = max(req.policy.max_tokens, self.min_policy_tokens)
        trace: dict[str, Any] = {"messages": [m.model_dump() for m in messages], "output": "", "model": req.policy.model,
                                 "max_tokens": max_tokens}
        try:
            result = await env.policy_client(req).complete(
                messages, temperature=req.policy.temperature, max_tokens=max_tokens, seed=request_seed(req))
        except HarnessError as exc:
            return failed_response(req, exc, trace)
        # cost_usd None: the harness prices the policy's tokens itself from its own price table.
        usage = Usage(prompt_tokens=result.prompt_tokens, completion_tokens=result.completion_tokens, cost_usd=None)
        trace.update(output=result.text, finish_reason=result.finish_reason, latency_s=round(result.latency_s, 4))
        grader, provider = self.grader_client(req, env)
        tokens = {"prompt_tokens": 0, "completion_tokens": 0, "calls": 0}
        try:
            verdicts = await self._grade(grader, row, result.text, tokens)
        except HarnessError as exc:
            return failed_response(req, exc, trace, Usage.model_validate({**usage.model_dump(), "grader": tokens}))
        score, achieved, total = healthbench_score(verdicts)
        grader_usage = {**tokens, "model": grader.model,
                        "cost_usd": cost_usd(provider, grader.model, tokens["prompt_tokens"], tokens["completion_tokens"])}
        # The grader's tokens sit apart (usage.grader): the harness reads the top-level fields as the policy's.
        usage = Usage.model_validate({**usage.model_dump(), "grader": grader_usage})
        trace["grader"] = {"model": grader.model, "base_url": grader.base_url, "usage": grader_usage,
                           "verdicts": [v.model_dump() for v in verdicts]}
        return RolloutResponse(
            rollout_id=req.rollout_id, status="ok", reward_info=RewardInfo(outcome_reward=score),
            objective_scores={"healthbench": score, "achieved_points": achieved, "positive_points": total},
            usage=usage, trace=trace,
            actionable_side_info=SideInfo(feedback=feedback_text(score, achieved, total, verdicts)),
        )

    async def _grade(self, grader: ChatClient, row: Row, response: str, tokens: dict[str, int]) -> list[Verdict]:
        conversation = conversation_text(row["prompt"], response)
        limit = asyncio.Semaphore(max(1, self.grader.concurrency))

        async def one(item: dict[str, Any]) -> Verdict:
            prompt = grader_prompt(conversation, item["criterion"], item["points"])
            verdict = Verdict(criterion=item["criterion"], points=item["points"], tags=item.get("tags", []),
                              met=False, parsed=False, prompt=prompt)
            async with limit:
                for _ in range(self.grader.attempts):
                    messages = [ChatMessage(role="system", content=GRADER_SYSTEM), ChatMessage(role="user", content=prompt)]
                    reply = await grader.complete(messages,
                                                  temperature=self.grader.temperature, max_tokens=self.grader.max_tokens)
                    tokens["prompt_tokens"] += reply.prompt_tokens
                    tokens["completion_tokens"] += reply.completion_tokens
                    tokens["calls"] += 1
                    verdict.raw.append(reply.text)
                    parsed = parse_verdict(reply.text)
                    if parsed is not None:
                        verdict.met, verdict.explanation, verdict.parsed = parsed[0], parsed[1], True
                        break
            return verdict

        return list(await asyncio.gather(*(one(item) for item in row["rubrics"])))

    def task_info(self) -> dict[str, Any]:
        return {
            "description": "Reply to the last user turn of a multi-turn health conversation. A grader judges "
                           "physician-written rubric criteria (positive and negative points); the score is "
                           "achieved points over total positive points, clipped to [0, 1].",
            "axes": ["accuracy", "completeness", "communication_quality", "context_awareness",
                     "instruction_following"],
        }


if __name__ == "__main__":
    serve(HealthBench)
