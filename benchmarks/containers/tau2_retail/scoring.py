"""tau2-bench reward for a retail episode: the final database must equal the one obtained
by replaying the task's expected actions on a fresh copy (hash comparison), and every
`communicate_info` string must appear in an agent message; the reward is their product,
and zero when the episode did not end by the user's stop or a transfer.

tau2's NL assertions (LLM-judged, present on some retail tasks) are not part of this reward.
"""

from __future__ import annotations

import json
from dataclasses import dataclass, field
from typing import Any

from benchmarks.containers.tau2_retail.data import Db, db_hash
from benchmarks.containers.tau2_retail.tools import WRITE_TOOLS, RetailTools, ToolError

# Terminations after which the episode is scored; anything else (turn limit, too many
# errors) scores zero, as tau2's evaluate_simulation does for premature ends.
SCORED_ENDS = frozenset({"user_stop", "agent_stop", "transfer"})


@dataclass(frozen=True)
class GoldState:
    hash: str
    failed_writes: list[dict[str, Any]]  # expected write actions that raised during the replay


def replay_gold(db: Db, actions: list[dict[str, Any]]) -> GoldState:
    """Replay the expected actions on `db` (a fresh copy). A failing read cannot move the
    database and is ignored; a failing write makes the gold state incomplete (recorded)."""
    tools, failed = RetailTools(db), []
    for action in actions:
        try:
            tools.call(action["name"], action.get("arguments") or {})
        except ToolError as exc:
            if action["name"] in WRITE_TOOLS:
                failed.append({"action_id": action.get("action_id"), "name": action["name"], "error": str(exc)})
    return GoldState(hash=db_hash(db), failed_writes=failed)


def action_matches(expected: dict[str, Any], call: dict[str, Any]) -> bool:
    """tau2's ActionEvaluator match: same tool, same values on `compare_args` (all expected
    arguments when absent)."""
    if call["name"] != expected["name"]:
        return False
    args = expected.get("arguments") or {}
    keys = expected.get("compare_args")
    keys = list(args) if keys is None else keys
    return all(call.get("arguments", {}).get(k) == args.get(k) for k in keys)


def communicated(info: str, agent_texts: list[str]) -> bool:
    # tau2's substring rule: lowercase, commas dropped from the message ("1,288.65" says "1288.65").
    needle = info.lower()
    return any(needle in text.lower().replace(",", "") for text in agent_texts)


def render_call(name: str, arguments: dict[str, Any]) -> str:
    args = ", ".join(f"{k}={json.dumps(v, ensure_ascii=False)}" for k, v in arguments.items())
    return f"{name}({args})"


@dataclass
class Verdict:
    reward: float
    db_match: bool
    communicate_ok: bool
    scored_end: bool
    missing_info: list[str]
    action_checks: list[dict[str, Any]]
    agent_hash: str
    gold: GoldState
    feedback: str = ""
    objectives: dict[str, float] = field(default_factory=dict)


def score_episode(task: dict[str, Any], agent_db: Db, gold: GoldState, calls: list[dict[str, Any]],
                  agent_texts: list[str], termination: str, steps: int) -> Verdict:
    criteria = task.get("evaluation_criteria") or {}
    expected = criteria.get("actions") or []
    agent_hash = db_hash(agent_db)
    db_match = agent_hash == gold.hash
    missing_info = [i for i in criteria.get("communicate_info") or [] if not communicated(i, agent_texts)]
    checks = [{"action_id": a.get("action_id"), "name": a["name"], "arguments": a.get("arguments") or {},
               "write": a["name"] in WRITE_TOOLS, "matched": any(action_matches(a, c) for c in calls)}
              for a in expected]
    scored_end = termination in SCORED_ENDS
    reward = float(scored_end and db_match and not missing_info)
    verdict = Verdict(reward=reward, db_match=db_match, communicate_ok=not missing_info, scored_end=scored_end,
                      missing_info=missing_info, action_checks=checks, agent_hash=agent_hash, gold=gold)
    verdict.objectives = {
        "db": float(db_match), "communicate": float(not missing_info),
        "actions": sum(c["matched"] for c in checks) / len(checks) if checks else 1.0,
    }
    verdict.feedback = feedback_text(verdict, calls, termination, steps)
    return verdict


def feedback_text(v: Verdict, calls: list[dict[str, Any]], termination: str, steps: int) -> str:
    """Most important first (reflection clips long feedback): verdict, wrong or missing
    database changes, uncommunicated facts, then lookups the reference made."""
    ends = {"user_stop": "the customer ended the conversation", "agent_stop": "the agent ended the conversation",
            "transfer": "the agent transferred to a human",
            "max_steps": "the step limit was reached", "too_many_errors": "too many tool errors"}
    why = []
    if not v.scored_end:
        why.append("the episode did not finish")
    if not v.db_match:
        why.append("the final database differs from the expected one")
    if v.missing_info:
        why.append("required information was not told to the customer")
    head = (f"Reward {v.reward:g} ({ends.get(termination, termination)} after {steps} steps)"
            + (": " + "; ".join(why) + "." if why else ": database and communicated information as expected."))
    parts = [head]
    writes = [c for c in v.action_checks if c["write"] and not c["matched"]]
    shown: set[int] = set()  # calls already quoted next to the action they got wrong
    if writes:
        lines = []
        for check in writes:
            same_tool = [c for c in calls if c["name"] == check["name"]]
            shown.update(id(c) for c in same_tool)
            line = "expected " + render_call(check["name"], check["arguments"])
            line += (" but the agent called " + "; ".join(render_call(c["name"], c["arguments"]) for c in same_tool)
                     if same_tool else " (never called)")
            lines.append(line)
        parts.append("Missing or wrong database actions: " + " | ".join(lines) + ".")
    extra = [c for c in calls if c["name"] in WRITE_TOOLS and c.get("ok") and id(c) not in shown
             and not any(ch["write"] and action_matches(ch | {"compare_args": None}, c) for ch in v.action_checks)]
    if extra:
        parts.append("Unexpected database actions: " + " | ".join(render_call(c["name"], c["arguments"]) for c in extra) + ".")
    if v.missing_info:
        parts.append("Not communicated to the customer: " + ", ".join(f"'{i}'" for i in v.missing_info) + ".")
    reads = [c for c in v.action_checks if not c["write"] and not c["matched"]]
    if reads:
        parts.append("Expected steps not taken: " + " | ".join(render_call(c["name"], c["arguments"]) for c in reads) + ".")
    if v.gold.failed_writes:
        parts.append(f"(Note: {len(v.gold.failed_writes)} reference write action(s) failed on replay.)")
    return " ".join(parts)
