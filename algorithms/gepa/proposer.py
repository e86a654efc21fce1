"""The reflective proposer: turns a parent's failures and feedback into an edited module.

Small local models asked to "rewrite the instruction" mostly return it unchanged, while
asked for rules or answer descriptions grounded in the failed examples they write usable
text; so the edit format is part of the algorithm. `rules` and `answer_guide` append the
model's lines to the module under a heading; `rewrite` replaces the module wholesale.
"""

from __future__ import annotations

import json
import re
from typing import Any

from pydantic import BaseModel, ConfigDict

from harness.candidates import RolloutResult
from harness.llm import ChatMessage

PROPOSER_SYSTEM = (
    "You improve prompts for a language model that performs a task. You read the current "
    "instruction, examples of the model's answers with feedback, and write an improvement. "
    "Ground every change in the examples and their feedback."
)

EDIT_FORMATS = ("rules", "answer_guide", "rewrite")

_FORMAT_ASK = {
    "rules": (
        "Write 2 to 6 new rules that would have fixed the wrong answers above. One rule per line, "
        "each starting with '- If the message', saying what kind of message it is in your own words "
        "and the exact expected answer from the feedback.\nReply with the rule lines only."
    ),
    "answer_guide": (
        "For each expected answer that the model missed above, write one line that starts with that "
        "answer, then a colon, then what kind of message calls for it, in your own words, so the model "
        "can tell it apart from the answer it gave.\nReply with those lines only."
    ),
    "rewrite": (
        "Write an improved version of the whole instruction that keeps what works and fixes the "
        "mistakes shown by the feedback. Reply with the new instruction inside a ``` block."
    ),
}

_SECTION_HEADING = {"rules": "Rules learned from mistakes:", "answer_guide": "Answer guide:"}

_HIDDEN_ROW_FIELDS = frozenset({"task_id", "split", "seed", "source_row"})
_FENCE = re.compile(r"```[a-zA-Z]*\n?(.*?)```", re.DOTALL)
_LIST_LINE = re.compile(r"^\s*(?:[-*•]|\d+[.)])\s+(.+)$")
# Lines a small model copies from the request instead of writing: template placeholders,
# feedback echoes, and non-answers.
_JUNK_LINE = re.compile(r"<[a-z _]+>|the answer was|answer:\s*`?(unknown|not_determined|none)`?\s*$", re.I)


class ProposalText(BaseModel):
    model_config = ConfigDict(frozen=True)
    text: str
    status: str  # "changed", "unchanged", "empty"


def _clip(text: str, limit: int) -> str:
    text = text.strip()
    return text if len(text) <= limit else text[: limit - 3] + "..."


def _row_input(row: dict[str, Any] | None) -> str:
    if not row:
        return "(not available)"
    fields = {k: v for k, v in row.items() if k not in _HIDDEN_ROW_FIELDS}
    if len(fields) == 1:
        return _clip(str(next(iter(fields.values()))), 600)
    return _clip(json.dumps(fields, ensure_ascii=False, default=str), 900)


def build_messages(
    module_text: str,
    examples: list[RolloutResult],
    edit_format: str,
    task_info: dict[str, Any] | None,
    max_examples: int = 4,
) -> list[ChatMessage]:
    """The proposer prompt: task context, the current instruction, examples with
    outputs and feedback (failures first), then the edit request."""
    parts: list[str] = []
    if task_info:
        parts.append("Task context:\n" + _clip(json.dumps(task_info, ensure_ascii=False, default=str), 1200))
    parts.append(f"<current_instruction>\n{module_text}\n</current_instruction>")
    ordered = sorted(examples, key=lambda r: (r.reward is not None, r.reward or 0.0))[:max_examples]
    for k, result in enumerate(ordered, 1):
        parts.append(
            f"### Example {k}\nInput:\n{_row_input(result.task)}\nOutput:\n{_clip(result.output, 300) or '(empty)'}\n"
            f"Reward: {'none (error row)' if result.reward is None else f'{result.reward:g}'}\nFeedback:\n{_clip(result.feedback, 400) or '(none)'}"
        )
    parts.append(_FORMAT_ASK[edit_format])
    return [ChatMessage(role="system", content=PROPOSER_SYSTEM), ChatMessage(role="user", content="\n\n".join(parts))]


def _strip_fence(reply: str) -> str:
    match = _FENCE.search(reply)
    return (match.group(1) if match else reply).strip()


def _new_lines(reply: str, module_text: str) -> list[str]:
    existing = {line.strip().lower() for line in module_text.splitlines()}
    lines, seen = [], set()
    for raw in _strip_fence(reply).splitlines():
        match = _LIST_LINE.match(raw)
        if not match:
            continue
        line = "- " + match.group(1).strip()
        key = line.lower()
        if key not in existing and key not in seen and len(line) > 4 and not _JUNK_LINE.search(line):
            seen.add(key)
            lines.append(line)
    return lines


def apply_reply(module_text: str, reply: str, edit_format: str, max_new_lines: int = 8) -> ProposalText:
    """Turn the proposer's reply into the child's module text."""
    if not reply.strip():
        return ProposalText(text=module_text, status="empty")
    if edit_format == "rewrite":
        text = _strip_fence(reply)
        if not text:
            return ProposalText(text=module_text, status="empty")
        status = "unchanged" if text.strip() == module_text.strip() else "changed"
        return ProposalText(text=text, status=status)
    lines = _new_lines(reply, module_text)[:max_new_lines]
    if not lines:
        return ProposalText(text=module_text, status="unchanged")
    heading = _SECTION_HEADING[edit_format]
    if heading in module_text:
        head, _, tail = module_text.partition(heading)
        text = f"{head}{heading}{tail.rstrip()}\n" + "\n".join(lines)
    else:
        text = f"{module_text.rstrip()}\n\n{heading}\n" + "\n".join(lines)
    return ProposalText(text=text, status="changed")
