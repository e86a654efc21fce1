"""The reflective proposer's request: task context (the whole answer space), the current
instruction, the parent's minibatch results as the policy saw them with the container's
feedback, and an edit request in one of the edit formats.

Small local models asked to "rewrite the instruction" mostly return it unchanged, while
asked for rules or answer descriptions grounded in the failed examples they write usable
text; so the edit format is part of the algorithm (see `edits.py` for what a reply may
change and the screen it passes).
"""

from __future__ import annotations

import json
from typing import Any, Sequence

from harness.candidates import RolloutResult
from harness.llm import ChatMessage

PROPOSER_SYSTEM = (
    "You improve prompts: the instruction of a language model that performs a task. You read the current "
    "instruction, examples of the model's answers with feedback, and write an improvement. "
    "Ground every change in the examples and their feedback, and write general guidance: "
    "never copy one example's input or feedback."
)

# `examples` needs no proposer call: it quotes inputs the container cited with their answers
EDIT_FORMATS = ("rules", "answer_guide", "rewrite", "examples")

_HIDDEN_ROW_FIELDS = frozenset({"task_id", "split", "seed", "source_row"})
INPUT_CHARS, OUTPUT_CHARS, FEEDBACK_CHARS = 700, 300, 600


def clip(text: str, limit: int) -> str:
    text = text.strip()
    return text if len(text) <= limit else text[: limit - 3] + "..."


def example_input(result: RolloutResult) -> str:
    """What the policy saw, as the container reports it; else the task row without ids."""
    inputs = getattr(result, "inputs", None)
    if inputs:
        return clip(inputs, INPUT_CHARS)
    row = result.task
    if not row:
        return "(not available)"
    fields = {k: v for k, v in row.items() if k not in _HIDDEN_ROW_FIELDS}
    if len(fields) == 1:
        return clip(str(next(iter(fields.values()))), INPUT_CHARS)
    return clip(json.dumps(fields, ensure_ascii=False, default=str), INPUT_CHARS)


def is_failure(result: RolloutResult) -> bool:
    return result.reward is None or result.reward < 1.0


def reflection_examples(results: Sequence[RolloutResult], limit: int) -> list[RolloutResult]:
    """Failures first (lowest reward first, rows without a reward before them), then successes."""
    return sorted(results, key=lambda r: -1.0 if r.reward is None else r.reward)[:limit]


def answer_space(task_info: dict[str, Any] | None) -> list[str] | None:
    labels = (task_info or {}).get("labels")
    if isinstance(labels, list) and labels and all(isinstance(x, str) for x in labels):
        return list(labels)
    return None


def task_context(task_info: dict[str, Any] | None) -> str | None:
    """The task's description and its whole answer space; other fields clipped."""
    if not task_info:
        return None
    parts = []
    if task_info.get("description"):
        parts.append(f"Task: {task_info['description']}")
    labels = answer_space(task_info)
    if labels:
        parts.append(f"Valid answers ({len(labels)}): " + ", ".join(labels))
    rest = {k: v for k, v in task_info.items() if k not in ("description", "labels")}
    if rest:
        parts.append("More context: " + clip(json.dumps(rest, ensure_ascii=False, default=str), 800))
    return "\n".join(parts) or None


def _ask(edit_format: str, labels: list[str] | None, max_lines: int, cap: int) -> str:
    answer = "the exact expected answer from the feedback, in backticks" if labels else "what to do instead"
    one = " Name exactly one valid answer per line." if labels else ""
    if edit_format == "rules":
        return (f"Write up to {max_lines} new rules that would have fixed the wrong answers above. One rule per "
                f"line, each starting with '- If the input', describing in your own words the kind of input and "
                f"then {answer}.{one} Rules must hold for other inputs of that kind too.\n"
                "Reply with the rule lines only.")
    if edit_format == "answer_guide":
        subject = "expected answer that the model missed above" if labels else "kind of mistake above"
        return (f"For each {subject}, write one line that starts with that answer, then a colon, then what kind "
                "of input calls for it, in your own words, so the model can tell it apart from the answer it "
                f"gave. At most {max_lines} lines.\nReply with those lines only.")
    if edit_format == "consolidate":
        return (f"The learned rules in the current instruction are too many. Rewrite them as at most {cap} rules: "
                "merge rules that say the same thing, drop rules the examples show to be wrong, keep the rest "
                f"word for word. One rule per line starting with '- '.{one}\nReply with the rule lines only.")
    return ("Write an improved version of the whole instruction that keeps what works and fixes the mistakes "
            "shown by the feedback. Keep it about as long as it is now. Reply with the new instruction inside a "
            "``` block.")


def build_messages(module_text: str, examples: Sequence[RolloutResult], edit_format: str,
                   task_info: dict[str, Any] | None, max_examples: int = 4, max_lines: int = 4,
                   cap: int = 12) -> list[ChatMessage]:
    """The proposer prompt: task context, the current instruction, examples with what the
    policy saw, its output and the feedback (failures first), then the edit request."""
    parts: list[str] = []
    context = task_context(task_info)
    if context:
        parts.append(context)
    parts.append(f"<current_instruction>\n{module_text}\n</current_instruction>")
    for k, result in enumerate(reflection_examples(examples, max_examples), 1):
        reward = "none (the rollout failed)" if result.reward is None else f"{result.reward:g}"
        feedback = result.feedback or (result.error or "")
        parts.append(
            f"### Example {k}\nInput:\n{example_input(result)}\nOutput:\n"
            f"{clip(result.output, OUTPUT_CHARS) or '(empty)'}\nReward: {reward}\nFeedback:\n"
            f"{clip(feedback, FEEDBACK_CHARS) or '(none)'}"
        )
    parts.append(_ask(edit_format, answer_space(task_info), max_lines, cap))
    return [ChatMessage(role="system", content=PROPOSER_SYSTEM), ChatMessage(role="user", content="\n\n".join(parts))]
