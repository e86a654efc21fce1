"""The `gepa` library's view of a run: task ids as data, an adapter whose `evaluate` goes
through `RunContext.evaluate` (via the bridge), and reflective records built from our
rollout results the way our own proposer shows them."""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import TYPE_CHECKING, Any

from gepa.core.adapter import EvaluationBatch

from algorithms.gepa.proposer import FEEDBACK_CHARS, OUTPUT_CHARS, clip, example_input
from harness.candidates import RolloutResult

if TYPE_CHECKING:
    from algorithms.gepa_ai.bridge import Bridge


class TaskIdLoader:
    """A `gepa` DataLoader whose ids and items are our task ids. Ids must not be list
    positions: the library's evaluation cache keys on (candidate, id), so train and pareto
    positions would collide."""

    def __init__(self, task_ids: Sequence[str]):
        self.task_ids = list(task_ids)

    def all_ids(self) -> list[str]:
        return list(self.task_ids)

    def fetch(self, ids: Sequence[str]) -> list[str]:
        return [str(i) for i in ids]

    def __len__(self) -> int:
        return len(self.task_ids)


def reflective_record(result: RolloutResult) -> dict[str, str]:
    """One example in the record format the library's reflection prompt renders
    (`Inputs`, `Generated Outputs`, `Feedback`), with our proposer's input view and clipping."""
    feedback = clip(result.feedback, FEEDBACK_CHARS)
    if result.status != "ok":
        failure = f"The rollout failed: {clip(result.error or 'unknown error', 300)}"
        feedback = f"{failure}\n{feedback}" if feedback else failure
    return {
        "Inputs": example_input(result),
        "Generated Outputs": clip(result.output, OUTPUT_CHARS) or "(empty)",
        "Feedback": feedback or "(none)",
    }


class HarnessAdapter:
    """GEPAAdapter over the run context. The library never sees a rollout the context did
    not run or serve from its cache; a failed row comes back as reward 0 with its error."""

    propose_new_texts = None  # the library's own reflective proposer, with our model behind it

    def __init__(self, bridge: "Bridge"):
        self.bridge = bridge

    def evaluate(self, batch: list[str], candidate: dict[str, str], capture_traces: bool = False) -> EvaluationBatch:
        results, spent = self.bridge.evaluate(candidate, [str(t) for t in batch])
        return EvaluationBatch(
            outputs=[r.output for r in results],
            # the library needs a number per row: a row without a reward counts as 0 there only
            scores=[0.0 if r.reward is None else float(r.reward) for r in results],
            trajectories=list(results) if capture_traces else None,
            # the library adds this to its metric-call count for minibatches: the rollouts
            # actually run, so its count follows our budget (cache hits are free for both)
            num_metric_calls=spent,
        )

    def make_reflective_dataset(
        self, candidate: dict[str, str], eval_batch: EvaluationBatch, components_to_update: list[str],
    ) -> Mapping[str, Sequence[Mapping[str, Any]]]:
        try:
            records = [reflective_record(r) for r in (eval_batch.trajectories or [])]
            return {component: list(records) for component in components_to_update}
        except Exception as exc:  # the library would swallow it and never propose again
            self.bridge.fail(exc)
            raise
