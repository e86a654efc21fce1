"""The scripted model's scripts: deterministic replies for smoke runs, benchmarks and tests,
served by harness.scripted_server (`models=scripted`).

- `rules` (default): a policy that follows rule lines in its system prompt, and a proposer
  that adds one rule per call from failing examples, so optimization can really improve.
- `queue`: replies taken in order from a JSON list, cycling.

Scripts that fail on purpose (`fail`, `fail_429`, `flaky`) are in harness.scripted_faults.

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

import json
import re
from typing import Any

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


# The reference gepa library sends its reflection prompt as one user message.
LIBRARY_REFLECTION_MARKER = "I provided an assistant with the following instructions"
_LIBRARY_FENCE_RE = re.compile(r"```[a-zA-Z]*\n(.*?)```", re.S)
_LIBRARY_SECTIONS = {"## Inputs": "Input:", "## Generated Outputs": "Output:", "## Feedback": "Feedback:"}


def role_of(messages: list[dict[str, Any]]) -> str:
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
            word = rule_word(_input_text(sections.get("input", ""), expected), ruled_words)
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


def rule_word(text: str, taken: set[str] = frozenset()) -> str | None:
    """The word the `rules` proposer keys a rule for `text` on: its longest word of five
    letters or more that is no stop word and not in `taken` (the words ruled already)."""
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
