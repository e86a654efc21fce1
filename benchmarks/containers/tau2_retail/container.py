"""The tau2-bench retail task container: the policy is the customer-service agent whose
mutable module is the domain policy text; each rollout is one simulated conversation on its
own copy of the database, scored as tau2 does (database hash match x communicated info)."""

from __future__ import annotations

import argparse
import asyncio
import dataclasses
import hashlib
import json
from typing import Any

from pydantic import BaseModel, ConfigDict

from benchmarks.containers.kit import (
    PROGRAM_VERSION,
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
)
from benchmarks.containers.tau2_retail.chat import ToolChatClient
from benchmarks.containers.tau2_retail.data import RetailData
from benchmarks.containers.tau2_retail.episode import (
    AGENT_INSTRUCTION,
    USER_GUIDELINES,
    Episode,
    EpisodeLimits,
    agent_system_prompt,
    run_episode,
    user_system_prompt,
)
from benchmarks.containers.tau2_retail.scoring import GoldState, Verdict, replay_gold, score_episode
from benchmarks.containers.tau2_retail.tools import TOOL_SCHEMAS, RetailTools


class UserSimSettings(BaseModel):
    """The user simulator's endpoint; base_url/model None: the rollout's policy endpoint/model."""

    model_config = ConfigDict(frozen=True)
    base_url: str | None = None
    model: str | None = None
    key_env: str | None = None
    provider: str = "openai_compatible"


class Tau2Retail(MultiStepContainer):
    taskset_id = "tau2_retail"
    name = "tau2-bench retail customer service (agent with tools, simulated user)"
    source = "https://github.com/sierra-research/tau2-bench (data/tau2/domains/retail, MIT)"
    row_keys = ("id", "user_scenario", "evaluation_criteria")

    def __init__(self, data_dir: str | None = None) -> None:
        super().__init__(data_dir)
        self.user_sim = UserSimSettings()
        self.limits = EpisodeLimits()
        self._data: RetailData | None = None
        self._gold: dict[str, GoldState] = {}

    @classmethod
    def add_arguments(cls, parser: argparse.ArgumentParser) -> None:
        parser.add_argument("--user-base-url", default=None,
                            help="OpenAI-compatible base (.../v1) of the user simulator; default: the rollout's policy endpoint")
        parser.add_argument("--user-model", default=None, help="user simulator model; default: the rollout's policy model")
        parser.add_argument("--user-key-env", default=None, help="env var holding the user simulator's API key")
        parser.add_argument("--user-provider", default="openai_compatible", help="provider name used to price its tokens")
        parser.add_argument("--user-temperature", type=float, default=0.0)
        parser.add_argument("--user-max-tokens", type=int, default=512)
        parser.add_argument("--max-steps", type=int, default=100, help="messages per episode before it is cut off (scores 0)")
        parser.add_argument("--max-errors", type=int, default=10, help="failed tool calls before the episode is cut off")
        parser.add_argument("--min-policy-tokens", type=int, default=512,
                            help="floor on the agent's (the policy's) max_tokens per turn: tool calls need room")

    def configure(self, args: argparse.Namespace) -> None:
        self.user_sim = UserSimSettings(base_url=args.user_base_url, model=args.user_model,
                                        key_env=args.user_key_env, provider=args.user_provider)
        self.limits = EpisodeLimits(max_steps=args.max_steps, max_errors=args.max_errors,
                                    agent_max_tokens=args.min_policy_tokens, user_max_tokens=args.user_max_tokens,
                                    user_temperature=args.user_temperature)

    def data(self) -> RetailData:
        if self._data is None:
            self._data = RetailData.load(self.data_dir)
        return self._data

    def load_splits(self) -> dict[str, list[Row]]:
        data = self.data()
        return {split: [_row(data.tasks[task_id]) for task_id in ids] for split, ids in data.split_ids.items()}

    def program(self) -> ProgramResponse:
        policy = self.data().policy
        return ProgramResponse(
            version=PROGRAM_VERSION,
            program_id="tau2.retail.agent.v1",
            modules=[
                ProgramModule(module_id="agent_instruction", role="system", content=AGENT_INSTRUCTION, mutable=False),
                ProgramModule(module_id="domain_policy", role="system", content=policy, mutable=True,
                              candidate_field="domain_policy"),
                ProgramModule(module_id="tools", role="tools", content=json.dumps(TOOL_SCHEMAS), mutable=False),
                ProgramModule(module_id="user_simulator", role="user_simulator", content=USER_GUIDELINES, mutable=False),
            ],
            target_modules=["domain_policy"],
            seed_candidate={"domain_policy": policy},
        )

    def reflection_input(self, row: Row) -> str | None:
        """The customer's request: the agent meets it only through the simulated user."""
        instructions = (row.get("user_scenario") or {}).get("instructions")
        if isinstance(instructions, dict):
            instructions = instructions.get("reason_for_call")
        return f"Customer's request: {instructions}" if isinstance(instructions, str) and instructions else None

    async def gold_state(self, row: Row) -> GoldState:
        """The expected database after the task's actions (cached by the actions' content)."""
        actions = (row.get("evaluation_criteria") or {}).get("actions") or []
        key = hashlib.sha256(json.dumps(actions, sort_keys=True).encode()).hexdigest()
        if key not in self._gold:
            self._gold[key] = await asyncio.to_thread(replay_gold, self.data().fresh_db(), actions)
        return self._gold[key]

    def user_client(self, req: RolloutRequest, env: RolloutEnv) -> tuple[ToolChatClient, str]:
        if self.user_sim.base_url or self.user_sim.model:
            base = role_url(policy_endpoint(self.user_sim.base_url or req.policy.endpoint), "user_simulator")
            key_env = self.user_sim.key_env if self.user_sim.base_url else (self.user_sim.key_env or env.policy_key_env)
            provider = self.user_sim.provider if self.user_sim.base_url else req.policy.provider
            return ToolChatClient(base, self.user_sim.model or req.policy.model, api_key_env=key_env, client=env.http), provider
        return self.policy_client(req, env, role="user_simulator"), req.policy.provider

    @staticmethod
    def policy_client(req: RolloutRequest, env: RolloutEnv, role: str = "policy") -> ToolChatClient:
        return ToolChatClient(role_url(policy_endpoint(req.policy.endpoint), role), req.policy.model,
                              api_key_env=env.policy_key_env, client=env.http)

    async def rollout(self, req: RolloutRequest, row: Row, env: RolloutEnv) -> RolloutResponse:
        gold = await self.gold_state(row)
        db = self.data().fresh_db()  # this rollout's own database (copy-on-access)
        episode = Episode(agent_system=agent_system_prompt(req.candidate["domain_policy"]),
                          user_system=user_system_prompt(row["user_scenario"]))
        user, user_provider = self.user_client(req, env)
        limits = self.limits
        agent_tokens = max(req.policy.max_tokens, limits.agent_max_tokens)
        try:
            await run_episode(episode, agent=self.policy_client(req, env), user=user, tools=RetailTools(db),
                              limits=dataclasses.replace(limits, agent_max_tokens=agent_tokens),
                              agent_temperature=req.policy.temperature, seed=request_seed(req))
        except HarnessError as exc:
            episode.termination = "model_error"
            return failed_response(req, exc, _trace(req, episode, None, user.model, agent_tokens), _usage(episode, None))
        verdict = await asyncio.to_thread(score_episode, row, db, gold, episode.calls, episode.agent_texts,
                                          episode.termination, episode.steps)
        user_usage = {"prompt_tokens": episode.user_usage.prompt_tokens,
                      "completion_tokens": episode.user_usage.completion_tokens, "calls": episode.user_usage.calls,
                      "model": user.model, "cost_usd": cost_usd(user_provider, user.model, episode.user_usage.prompt_tokens,
                                                                episode.user_usage.completion_tokens)}
        return RolloutResponse(
            rollout_id=req.rollout_id, status="ok", reward_info=RewardInfo(outcome_reward=verdict.reward),
            objective_scores=verdict.objectives, usage=_usage(episode, user_usage),
            trace=_trace(req, episode, verdict, user.model, agent_tokens),
            actionable_side_info=SideInfo(feedback=verdict.feedback),
        )

    def task_info(self) -> dict[str, Any]:
        return {
            "description": "A customer-service agent for an online retailer talks with a simulated customer and "
                           "uses tools (look up users, orders and products; cancel, modify, return, exchange; "
                           "transfer to a human). Reward 1 when the final database equals the expected one and "
                           "the required information was told to the customer, else 0.",
            "mutable": "domain_policy: the policy text the agent must follow",
            "tools": [schema["function"]["name"] for schema in TOOL_SCHEMAS],
        }


def _row(task: dict[str, Any]) -> Row:
    return {"id": str(task["id"]), "user_scenario": task["user_scenario"],
            "evaluation_criteria": task["evaluation_criteria"], "description": task.get("description")}


def _usage(episode: Episode, user_usage: dict[str, Any] | None) -> Usage:
    # Top-level tokens are the agent's (the policy's); the simulator's sit in usage.user_simulator.
    extra = {"user_simulator": user_usage} if user_usage is not None else {}
    return Usage.model_validate({"prompt_tokens": episode.agent_usage.prompt_tokens,
                                 "completion_tokens": episode.agent_usage.completion_tokens, "cost_usd": None, **extra})


def _trace(req: RolloutRequest, episode: Episode, verdict: Verdict | None, user_model: str,
           agent_tokens: int) -> dict[str, Any]:
    trace: dict[str, Any] = {
        "output": episode.transcript(), "model": req.policy.model, "user_model": user_model,
        "termination": episode.termination, "steps": episode.steps, "tool_errors": episode.errors,
        "agent_max_tokens": agent_tokens, "agent_calls": episode.agent_usage.calls,
        "messages": [{"role": "system", "content": episode.agent_system}, *episode.history],
        "user_system": episode.user_system, "tool_calls": episode.calls,
    }
    if verdict is not None:
        trace.update(db_match=verdict.db_match, agent_db_hash=verdict.agent_hash, gold_db_hash=verdict.gold.hash,
                     gold_failed_writes=verdict.gold.failed_writes, missing_info=verdict.missing_info,
                     action_checks=verdict.action_checks)
    return trace
