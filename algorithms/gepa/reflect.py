"""One reflective proposal: sample several proposer replies for one module, screen them
for free, and turn what survives into the child's module text."""

from __future__ import annotations

import json
import re
from collections import Counter
from typing import Any, Literal, Sequence

from pydantic import BaseModel, ConfigDict, Field

from algorithms.gepa.edits import (
    SECTION_HEADINGS,
    SECTION_OF_FORMAT,
    canon,
    LearnedModule,
    copies_from,
    example_lines,
    flat,
    invented_answer_lines,
    pick,
    reply_lines,
    screen,
    spelling_lines,
    strip_fence,
)
from algorithms.gepa.proposer import answer_space, build_messages, is_failure, reflection_examples
from harness.candidates import RolloutResult
from harness.llm import ChatMessage, ChatResult


class EditSettings(BaseModel):
    model_config = ConfigDict(frozen=True)
    max_examples: int
    max_new_lines: int
    max_learned_lines: int
    screen_cited_inputs: bool
    max_example_lines: int
    max_cited_lines: int  # lines one `examples` edit adds
    not_answer_lines: int = 0  # invented answers an `examples` edit also lists (0: none)
    not_answer_style: Literal["forbid", "spell"] = "forbid"  # GepaParams.not_answer_style

    @property
    def lists_failed_answers(self) -> bool:
        """Whether an `examples` edit also lists invented answers, so the run tallies them."""
        return self.not_answer_lines > 0

    @property
    def section_caps(self) -> dict[str, int]:
        """Lines each learned section keeps at most."""
        caps = {"examples": self.max_example_lines, "not_answers": self.not_answer_lines,
                "spellings": self.not_answer_lines}
        return {kind: caps.get(kind, self.max_learned_lines) for kind in SECTION_HEADINGS}


class Proposal(BaseModel):
    """The child's text (the parent's when nothing survived), how it was made, and the
    proposer's prompt and raw replies for the evidence."""

    model_config = ConfigDict(frozen=True)
    text: str
    status: str  # changed | unchanged | empty
    edit_format: str
    prompt: str
    replies: tuple[str, ...] = ()
    dropped: dict[str, int] = Field(default_factory=dict)
    truncated_replies: int = 0
    added: int = 0  # learned lines added (0 for a consolidation or a rewrite)

    def enough(self, lines_wanted: int) -> bool:
        """Whether sampling more replies can stop: a whole-section or whole-module edit is
        complete as it is; appended lines are enough once `lines_wanted` survived the screen."""
        if self.status != "changed":
            return False
        return self.edit_format in ("consolidate", "rewrite") or self.added >= lines_wanted


class Rotation:
    """Which module a proposal edits (round robin over the proposals, not the iterations: a
    merge or a skipped iteration takes no turn, so a merge every second iteration does not
    leave one of two modules every proposal) and that module's turn in its own rotation of
    edit formats: with two modules and two formats, each module still gets both formats."""

    def __init__(self, modules: Sequence[str]):
        self.modules = list(modules)
        self.turns: dict[str, int] = {}
        self.proposals = 0

    def next(self) -> tuple[str, int]:
        module = self.modules[self.proposals % len(self.modules)]
        self.proposals += 1
        turn = self.turns.get(module, 0)
        self.turns[module] = turn + 1
        return module, turn


def choose_format(module_text: str, formats: Sequence[str], turn: int, settings: EditSettings) -> str:
    """The `turn`-th format of this module's rotation; a full rules section is consolidated
    instead of growing further."""
    edit_format = formats[turn % len(formats)]
    section = SECTION_OF_FORMAT.get(edit_format)
    if section == "rules" and len(LearnedModule.parse(module_text).lines("rules")) >= settings.max_learned_lines:
        return "consolidate"
    return edit_format


def format_plan(module_text: str, formats: Sequence[str], turn: int, attempts: int,
                results: Sequence[RolloutResult], settings: EditSettings, examples_first: bool,
                examples_idle: bool = False) -> list[str]:
    """The formats one turn tries in order until one changes the module: the rotation's from
    the `turn`-th on, one per attempt. With `examples_first`, a turn whose failures carry
    inputs the container cited starts with `examples` (it calls no proposer); a container
    that cites nothing gets the rotation alone. `examples_idle` says this turn's `examples`
    edit would leave the module as it is: the turn then rotates over the formats that ask
    the proposer, one request more in place of an attempt that could only come back
    unchanged."""
    cited = any(is_failure(r) and r.answer_examples for r in results)
    asking = [f for f in formats if f != "examples"]
    if examples_idle and asking:
        formats = asking
    plan = [choose_format(module_text, formats, turn + attempt, settings) for attempt in range(attempts)]
    if examples_first and cited and "examples" in formats:
        plan = ["examples", *(f for f in plan if f != "examples")]
    return plan


def request(module_text: str, results: Sequence[RolloutResult], edit_format: str,
            task_info: dict[str, Any] | None, settings: EditSettings) -> list[ChatMessage]:
    return build_messages(module_text, results, edit_format, task_info, settings.max_examples,
                          settings.max_new_lines, settings.max_learned_lines // 2)


def apply(module_text: str, messages: list[ChatMessage], replies: Sequence[ChatResult], edit_format: str,
          results: Sequence[RolloutResult], task_info: dict[str, Any] | None, settings: EditSettings) -> Proposal:
    """The child text from the sampled replies to one request."""
    prompt = json.dumps([m.model_dump() for m in messages], ensure_ascii=False)
    texts = tuple(r.text for r in replies)
    truncated = sum(r.finish_reason == "length" for r in replies)
    base = dict(edit_format=edit_format, prompt=prompt, replies=texts, truncated_replies=truncated)
    if not any(t.strip() for t in texts):
        return Proposal(text=module_text, status="empty", **base)
    shown = reflection_examples(results, settings.max_examples)
    examples = [getattr(r, "inputs", None) or "" for r in shown] + [r.feedback for r in shown]
    failures = [r.feedback for r in shown if is_failure(r)]
    if edit_format == "rewrite":
        # with an answer space the answer check is in the task's scoring; the copy check
        # is for open-ended answers, where a pasted example memorises one row
        return _rewrite(module_text, replies, [] if answer_space(task_info) else examples, base)
    module = LearnedModule.parse(module_text)
    section = SECTION_OF_FORMAT[edit_format]
    existing = [] if edit_format == "consolidate" else module.all_lines()
    lines: list[str] = []
    for reply in replies:
        lines += reply_lines(reply.text, reply.finish_reason, edit_format)[0]
    wrong = _wrong_answers([r for r in shown if is_failure(r)], answer_space(task_info) or [])
    screened = screen(lines, edit_format, labels=answer_space(task_info), existing=existing,
                      failure_text=failures, example_text=examples, wrong_answers=wrong,
                      cited=_cited(shown) if settings.screen_cited_inputs else None)
    if edit_format == "consolidate":
        kept = [ln.text for ln in screened.lines][:settings.max_learned_lines // 2]
        changed = bool(kept) and kept != list(module.lines(section))
        text = module.with_lines(section, kept).render() if changed else module_text
    else:
        room = max(0, settings.max_learned_lines - len(module.lines(section)))
        new = [ln.text for ln in pick(screened.lines, min(settings.max_new_lines, room))]
        changed = bool(new)
        text = module.with_lines(section, [*module.lines(section), *new]).render() if changed else module_text
        base["added"] = len(new)
    return Proposal(text=text, status="changed" if changed else "unchanged", dropped=screened.dropped, **base)


CitedPairs = Sequence[tuple[str, tuple[str, ...]]]


def cited_pairs(results: Sequence[RolloutResult]) -> list[tuple[str, tuple[str, ...]]]:
    """(answer, inputs) the container cited for the failed rows, the expected answers'
    before the answers the policy gave."""
    expected: list[tuple[str, tuple[str, ...]]] = []
    given: list[tuple[str, tuple[str, ...]]] = []
    for result in results:
        if is_failure(result) and result.answer_examples:
            for answer, inputs in result.answer_examples.items():
                (given if canon(answer) == canon(result.output) else expected).append((answer, inputs))
    return expected + given


def cite_examples(module_text: str, results: Sequence[RolloutResult], settings: EditSettings,
                  earlier: CitedPairs = (), labels: Sequence[str] | None = None,
                  failed_answers: Sequence[str] = ()) -> Proposal:
    """The `examples` edit: inputs the container cited with their answers for the failed
    rows (`answer_examples`) other than the minibatch's own, then those of the run's
    `earlier` failures while the edit has room, added to the module's examples section,
    whose oldest lines go once it is full. With `not_answer_lines` and an answer space, the
    failures' answers that are not labels, then the run's `failed_answers` (most frequent
    first), are listed as not valid (`forbid`) or by the labels they misspell (`spell`).
    Unchanged when there is nothing new; no proposer is called."""
    # not the minibatch's own inputs: quoting them would win the minibatch the child is judged on
    own = {flat(str(r.inputs or "")) for r in results}
    cited = [(answer, tuple(t for t in inputs if flat(t) not in own))
             for answer, inputs in [*cited_pairs(results), *earlier]]
    module = LearnedModule.parse(module_text)
    have = list(module.lines("examples"))
    new = example_lines(cited, module.all_lines(), settings.max_cited_lines)
    section, lister = (("spellings", spelling_lines) if settings.not_answer_style == "spell"
                       else ("not_answers", invented_answer_lines))
    if settings.lists_failed_answers and labels:
        listed = lister([*(r.output for r in results if is_failure(r)), *failed_answers], labels,
                        module.lines(section), settings.not_answer_lines)
    else:
        listed = []
    base: dict[str, Any] = dict(edit_format="examples", prompt="", added=len(new) + len(listed))
    if not new and not listed:
        return Proposal(text=module_text, status="unchanged", **base)
    if new:
        module = module.with_lines("examples", [*have, *new][-settings.max_example_lines:])
    if listed:
        module = module.with_lines(section, [*module.lines(section), *listed][-settings.not_answer_lines:])
    return Proposal(text=module.render(), status="changed", **base)


class CitationMemory:
    """The inputs the container cited for the run's earlier minibatch failures, newest
    first: an `examples` edit with room left after its own minibatch's citations takes
    them too, so an accepted child carries more of what the run has learned than four rows
    can show. Rows the container cites are outside every pool, so none is a row a child
    is judged on."""

    def __init__(self, capacity: int):
        self.capacity = capacity
        self._pairs: list[tuple[str, tuple[str, ...]]] = []

    def pairs(self) -> CitedPairs:
        return tuple(self._pairs)

    def remember(self, results: Sequence[RolloutResult]) -> None:
        fresh = [p for p in cited_pairs(results) if p not in self._pairs]
        self._pairs = (fresh + self._pairs)[:self.capacity]


def _cited(shown: Sequence[RolloutResult]) -> dict[str, list[str]]:
    """Answer -> the inputs the container cited for it across the examples shown."""
    cited: dict[str, list[str]] = {}
    for result in shown:
        for answer, texts in (result.answer_examples or {}).items():
            cited.setdefault(answer, []).extend(texts)
    return cited


def _wrong_answers(failed: Sequence[RolloutResult], labels: Sequence[str]) -> list[str]:
    """Answers the policy gave on failed examples that no other failure's feedback names
    (as the expected answer there)."""
    given = {canon(r.output) for r in failed if r.output.strip()}
    valid = set(labels)
    expected: set[str] = set()
    for r in failed:
        # the texts between consecutive backticks are the names `label` can match: one pass
        # over the feedback, not one search per label (77 of them on Banking77)
        named = set(_BETWEEN_BACKTICKS.findall(r.feedback)) & valid
        named.update(label for label in valid if "`" in label and f"`{label}`" in r.feedback)
        expected.update(canon(label) for label in named if canon(r.output) != canon(label))
    return sorted(given - expected)


_BETWEEN_BACKTICKS = re.compile(r"(?=`([^`]*)`)")


def _rewrite(module_text: str, replies: Sequence[ChatResult], examples: list[str], base: dict[str, Any]) -> Proposal:
    """The first whole reply that is complete, new, bounded in length and not pasted from
    an example or its feedback."""
    dropped: dict[str, int] = {}
    for reply in replies:
        text = strip_fence(reply.text)
        why = None
        if reply.finish_reason == "length":
            why = "truncated"
        elif not text or text.strip() == module_text.strip():
            why = "unchanged"
        elif len(text) > 2 * len(module_text) + 1500:  # bounded growth: the policy has a small context
            why = "too_long"
        elif examples and any(copies_from(line, examples) for line in text.splitlines()):
            why = "copies_an_example"
        if why is None:
            return Proposal(text=text, status="changed", dropped=dropped, **base)
        dropped[why] = dropped.get(why, 0) + 1
    return Proposal(text=module_text, status="unchanged", dropped=dropped, **base)


class FailedAnswers:
    """Answers the policy gave on the run's failed rollouts (seed, pareto and minibatch
    scores alike), most frequent first: the examples edit lists those that are not labels.
    Not `kept`, it remembers nothing (a run without that section)."""

    def __init__(self, kept: bool = True) -> None:
        self.kept = kept
        self._counts: Counter[str] = Counter()

    def remember(self, results: Sequence[RolloutResult]) -> None:
        if self.kept:
            self._counts.update(canon(r.output) for r in results if is_failure(r) and r.output.strip())

    def answers(self) -> tuple[str, ...]:
        return tuple(answer for answer, _ in self._counts.most_common())
