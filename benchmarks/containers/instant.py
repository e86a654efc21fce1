"""Instant: Banking77 whose policy answers in-process, with no model call, for measuring
what the harness itself costs per rollout (`benchmarks/perf/overhead.py`).

The policy follows the rule lines of the candidate's system prompt exactly as the scripted
model's `rules` policy does (`harness.scripted_model.RulesScript`), so the scripted
proposer can still improve the prompt; rows, scoring and feedback are Banking77's.

Run: `python -m benchmarks.containers.instant --port 8124`.
"""

from __future__ import annotations

from benchmarks.containers.banking77 import Banking77
from benchmarks.containers.kit import (
    RewardInfo, RolloutEnv, RolloutRequest, RolloutResponse, Row, SideInfo, Usage, policy_result, serve,
)
from harness.scripted_model import RulesScript


class InstantBanking77(Banking77):
    name = "Banking77 with an in-process instant policy"

    async def rollout(self, req: RolloutRequest, row: Row, env: RolloutEnv) -> RolloutResponse:
        messages = [m.model_dump() for m in self.render(req.candidate, row)]
        answer = RulesScript().reply(messages, "policy")
        reward, feedback = self.score(row, policy_result(answer))
        prompt_tokens = sum(len(m["content"].split()) for m in messages)
        return RolloutResponse(
            rollout_id=req.rollout_id, status="ok", reward_info=RewardInfo(outcome_reward=reward),
            usage=Usage(prompt_tokens=prompt_tokens, completion_tokens=len(answer.split()), cost_usd=0.0),
            trace={"output": answer, "model": "in-process rules"}, actionable_side_info=SideInfo(feedback=feedback),
        )


if __name__ == "__main__":
    serve(InstantBanking77)
