"""What one rollout response amounts to: a reward, or an error row with its cause.
Shared by the run context (evidence) and the doctor (diagnosis)."""

from __future__ import annotations

import math
from dataclasses import dataclass

from harness.contract import RolloutResponse


@dataclass
class RolloutOutcome:
    reward: float | None = None  # None: an error row
    error: str | None = None
    error_kind: str | None = None
    container_status: str | None = None  # the status value as the container sent it
    output: str = ""
    feedback: str = ""
    feedback_source: str | None = None  # actionable_side_info, reward_info.details, summary, trace
    inputs: str | None = None
    answer_examples: dict[str, list[str]] | None = None  # answer -> inputs the container vouches for


def judge(response: RolloutResponse) -> RolloutOutcome:
    """Liberal in what it accepts (any success status, any reward fallback), strict in what
    it records: no reward, a reward that is not a finite number, or a failed status is an
    error row with the container's reason."""
    reward = response.resolved_reward()
    feedback, source = response.feedback_and_source()
    outcome = RolloutOutcome(container_status=response.status, output=response.output_text, feedback=feedback,
                             feedback_source=source, inputs=response.inputs,
                             answer_examples=response.answer_examples)
    if response.status_ok and reward is not None and math.isfinite(reward):
        outcome.reward = reward
        return outcome
    reason = response.failure_reason()
    if not response.status_ok:
        head = f"status {response.status}"
    else:  # a NaN (a grader's 0/0) would turn every mean it joins into NaN
        head = "no reward in response" if reward is None else f"the reward is {reward}, not a finite number"
    outcome.error = f"{head}: {reason}" if reason else head
    kind = (response.model_extra or {}).get("error_kind")
    outcome.error_kind = kind if isinstance(kind, str) and kind else "container"
    return outcome
