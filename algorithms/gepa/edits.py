"""What a proposer reply may change in a module, and the free screen it passes first.

A module's text is its base instruction plus learned sections (`Rules learned from
mistakes:`, `Answer guide:`, `Examples (input -> answer):`), one `- ` line per learned
item. Replies are parsed into lines, screened without any rollout (a cut-off last line, an
answer that is not in the task's answer space or several at once, a line that quotes
another answer's inputs, a line copied from an example), then appended to, or
(consolidation) substituted for, a section. Keeping edits at line level keeps small
proposers useful and prompt growth bounded.
"""

from __future__ import annotations

import difflib
import re
from collections.abc import Iterable, Iterator, Mapping, Sequence
from itertools import islice

from pydantic import BaseModel, ConfigDict

SECTION_HEADINGS = {"rules": "Rules learned from mistakes:", "answer_guide": "Answer guide:",
                    "examples": "Examples (input -> answer):",
                    "not_answers": "Not valid answers (never reply with these):",
                    "spellings": "Write labels in full, exactly as listed, e.g.:"}
# `consolidate` rewrites the rules section in place; `rewrite` replaces the whole module
SECTION_OF_FORMAT = {"rules": "rules", "answer_guide": "answer_guide", "consolidate": "rules",
                     "examples": "examples"}
EXAMPLE_CHARS = 240  # a cited input longer than this is not worth its share of the policy's context

_FENCE = re.compile(r"```[a-zA-Z]*\n?(.*?)```", re.DOTALL)
_LIST_LINE = re.compile(r"^\s*(?:[-*•]|\d+[.)])\s+(.+)$")
_GUIDE_LINE = re.compile(r"^\s*(?:[-*•]|\d+[.)])?\s*[`'\"*]*([A-Za-z0-9_?\- ]{1,60}?)[`'\"*]*\s*[:–—-]\s+(.{8,})$")
# `label:` alone on its line, its description on the next (a common small-model layout)
_GUIDE_HEAD = re.compile(r"^\s*(?:[-*•]|\d+[.)])?\s*[`'\"*]*[A-Za-z0-9_?\-]{1,60}[`'\"*]*\s*:\s*$")
_QUOTED = re.compile(r"[`'\"]([^`'\"\n]{1,60})[`'\"]")
_SNAKE = re.compile(r"\b[a-z0-9]+(?:_[a-z0-9]+)+\??")
_AFTER_ANSWER = re.compile(r"\b(?:answer|label|intent|reply|respond)(?:\s+(?:is|with|should\s+be|must\s+be))?"
                           r"\s*[:=]?\s*\**[`'\"]?([A-Za-z0-9_?\-]+)", re.I)
# Lines a small model copies from the request instead of writing: template placeholders,
# feedback echoes, non-answers, and conditions on the feedback, which the policy never sees.
_JUNK_LINE = re.compile(r"<[a-z _]+>|the answer was|answer:\s*`?(unknown|not_determined|none)`?\s*$|\bfeedback\b",
                        re.I)
GUIDE_MIN_WORDS = 3  # an answer guide's description shorter than this says nothing (often just another label)
_WORD = re.compile(r"[a-z0-9]+")
COPY_RUN = 7  # this many consecutive words shared with an example input or feedback: copied, not learned
# a quoted span in a line, apostrophes allowed inside (customer messages have them)
_QUOTE_SPAN = re.compile(r'"([^"\n]{3,300})"|`([^`\n]{3,300})`|“([^”\n]{3,300})”')
CITED_MIN_WORDS = 3  # a shorter cited input is too generic to say whose it is


class ScreenedLine(BaseModel):
    model_config = ConfigDict(frozen=True)
    text: str  # "- ..." as it goes into the module
    label: str | None = None  # the one answer it names, when the task has an answer space
    relevant: bool = True  # about one of the minibatch's failures


class Screen(BaseModel):
    """What a reply yielded: the lines kept, and how many were dropped and why."""

    model_config = ConfigDict(frozen=True)
    lines: tuple[ScreenedLine, ...] = ()
    dropped: dict[str, int] = {}


def canon(label: str) -> str:
    return label.strip().strip("`'\"*").rstrip(".").rstrip("?").strip().lower()


def strip_fence(reply: str) -> str:
    match = _FENCE.search(reply)
    return (match.group(1) if match else reply).strip()


def reply_lines(reply: str, finish_reason: str | None, edit_format: str) -> tuple[list[str], bool]:
    """The item lines of a reply, and whether a cut-off last line was dropped."""
    raw = [line for line in strip_fence(reply).splitlines() if line.strip()]
    cut = finish_reason == "length" and bool(raw)
    if cut:
        raw = raw[:-1]
    if edit_format == "answer_guide":
        return [line for line in _join_guide_heads(raw) if _GUIDE_LINE.match(line) or _LIST_LINE.match(line)], cut
    return [line for line in raw if _LIST_LINE.match(line)], cut


def _join_guide_heads(lines: list[str]) -> list[str]:
    """`label:` on one line and its description on the next, as one `label: description` line."""
    joined: list[str] = []
    for line in lines:
        if joined and _GUIDE_HEAD.match(joined[-1]) and not _GUIDE_HEAD.match(line) and not _GUIDE_LINE.match(line):
            joined[-1] = f"{joined[-1].rstrip()} {line.strip()}"
        else:
            joined.append(line)
    return joined


def _words(text: str) -> list[str]:
    return _WORD.findall(text.lower())


def copies_from(line: str, sources: Iterable[str], run: int = COPY_RUN) -> bool:
    """True when `line` shares `run` consecutive words with any source text."""
    words = _words(line)
    if len(words) < run:
        return False
    grams = {tuple(words[i:i + run]) for i in range(len(words) - run + 1)}
    for source in sources:
        src = _words(source)
        if any(tuple(src[i:i + run]) in grams for i in range(len(src) - run + 1)):
            return True
    return False


def _phrase(text: str) -> str:
    return " " + " ".join(_words(text)) + " "


class CitedInputs:
    """Which answers' inputs a line quotes, from the container's `answer_examples` of the
    examples the proposer was shown: a small proposer often pairs an answer with the
    example messages the feedback gave for another answer."""

    def __init__(self, cited: Mapping[str, Sequence[str]] | None):
        self.owners: dict[str, set[str]] = {}
        for answer, texts in (cited or {}).items():
            for text in texts:
                if len(_words(text)) >= CITED_MIN_WORDS:
                    self.owners.setdefault(_phrase(text), set()).add(canon(answer))

    def others(self, line: str, label: str) -> bool:
        """True when the line quotes an input cited only for answers other than `label`."""
        if not self.owners:
            return False
        whole = _phrase(line)
        spans = [_phrase(next(g for g in m.groups() if g)) for m in _QUOTE_SPAN.finditer(line)]
        spans = [s for s in spans if len(s.split()) >= CITED_MIN_WORDS]
        for phrase, owners in self.owners.items():
            if (phrase in whole or any(span in phrase for span in spans)) and canon(label) not in owners:
                return True
        return False


def named_labels(line: str, labels: dict[str, str]) -> tuple[set[str], set[str]]:
    """(valid labels the line names, label-shaped names that are not labels). `labels`
    maps canonical form -> label as listed."""
    valid: set[str] = set()
    invalid: set[str] = set()
    for token in _QUOTED.findall(line) + _SNAKE.findall(line):
        key = canon(token)
        if key in labels:
            valid.add(labels[key])
        elif " " not in key and "_" in key:  # label-shaped (snake_case) but not a label
            invalid.add(token.strip())
    for token in _AFTER_ANSWER.findall(line):
        key = canon(token)
        if key in labels:
            valid.add(labels[key])
    return valid, invalid


def _guide_label(line: str, labels: dict[str, str]) -> str | None:
    match = _GUIDE_LINE.match(line)
    if not match:
        return None
    return labels.get(canon(match.group(1)))


def screen(lines: Sequence[str], edit_format: str, *, labels: Sequence[str] | None, existing: Sequence[str],
           failure_text: Sequence[str], example_text: Sequence[str], wrong_answers: Sequence[str] = (),
           cited: Mapping[str, Sequence[str]] | None = None) -> Screen:
    """Keep the lines worth a rollout. With an answer space (`labels`), a line must name
    exactly one valid answer, not an answer the policy gave on a failed example (a small
    proposer often copies the given answer where the expected one belongs), and not quote
    an input the container `cited` for another answer; it is relevant when its answer
    appears in a failure's feedback. Without one (open-ended answers), a line must not
    copy an example or its feedback: that memorises one row instead of teaching the task."""
    by_canon = {canon(label): label for label in labels or []}
    seen = {line.strip().lower() for line in existing}
    kept: list[ScreenedLine] = []
    dropped: dict[str, int] = {}

    def drop(why: str) -> None:
        dropped[why] = dropped.get(why, 0) + 1

    failures = " ".join(failure_text)
    wrong = {canon(answer) for answer in wrong_answers} - {""}
    inputs = CitedInputs(cited)
    for raw in lines:
        item = _LIST_LINE.match(raw)
        body = (item.group(1) if item else raw).strip()
        text = "- " + body
        guide = _GUIDE_LINE.match(body) if edit_format == "answer_guide" else None
        if len(body) < 8 or _JUNK_LINE.search(body) or (guide and len(guide.group(2).split()) < GUIDE_MIN_WORDS):
            drop("junk")
            continue
        if len(body) > 300:
            drop("too_long")
            continue
        if text.lower() in seen:
            drop("duplicate")
            continue
        if not by_canon and copies_from(body, example_text):
            drop("copies_an_example")
            continue
        label: str | None = None
        if by_canon:
            if edit_format == "answer_guide":
                label = _guide_label(body, by_canon)
                if label is None:
                    drop("no_valid_answer")
                    continue
            else:
                valid, invalid = named_labels(body, by_canon)
                if invalid:
                    drop("invalid_answer")
                    continue
                if len(valid) != 1:
                    drop("no_valid_answer" if not valid else "several_answers")
                    continue
                label = next(iter(valid))
            if canon(label) in wrong:
                drop("repeats_a_wrong_answer")
                continue
            if inputs.others(body, label):
                drop("quotes_another_answers_input")
                continue
        relevant = label is None or label in failures or f"`{label}`" in failures
        seen.add(text.lower())
        kept.append(ScreenedLine(text=text, label=label, relevant=relevant))
    return Screen(lines=tuple(kept), dropped=dropped)


def pick(lines: Sequence[ScreenedLine], limit: int) -> list[ScreenedLine]:
    """At most `limit` lines, those about the minibatch's failures first, one per answer
    where possible, in reply order otherwise."""
    ordered = [ln for ln in lines if ln.relevant] + [ln for ln in lines if not ln.relevant]
    chosen: list[ScreenedLine] = []
    labels: set[str | None] = set()
    for line in ordered:  # first pass: one line per answer
        if line.label is None or line.label not in labels:
            chosen.append(line)
            labels.add(line.label)
    chosen += [ln for ln in ordered if ln not in chosen]
    return chosen[:limit]


def flat(text: str) -> str:
    """`text` on one line, each run of whitespace one space."""
    return " ".join(text.split())


def example_lines(cited: Sequence[tuple[str, Sequence[str]]], existing: Sequence[str], limit: int) -> list[str]:
    """Up to `limit` new `- "input" -> answer` lines: for each (answer, inputs) in order, the
    first input the container cited for it that the module does not quote yet. The pairs
    are the container's, so no proposer can mismatch an input and its answer."""
    seen = {line.strip().lower() for line in existing}
    lines: list[str] = []
    for answer, inputs in cited:
        for text in inputs:
            one_line = flat(text)
            line = f'- "{one_line}" -> {answer.strip()}'
            if len(_words(one_line)) < CITED_MIN_WORDS or len(one_line) > EXAMPLE_CHARS or line.lower() in seen:
                continue
            seen.add(line.lower())
            lines.append(line)
            break
        if len(lines) >= limit:
            break
    return lines


NEAR_LABEL = 0.85  # difflib ratio from which an invented answer is read as a misspelt label


def near_misses(given: Sequence[str], labels: Sequence[str]) -> Iterator[tuple[str, str | None]]:
    """Each answer the policy gave that is label-shaped but not in the answer space, once,
    in the order given, with the label it is a near spelling of (verify_identity:
    verify_my_identity) or None."""
    by_canon = {canon(label): label for label in labels}
    candidates = list(by_canon)
    seen: set[str] = set()
    for answer in given:
        key = canon(answer)
        if key in by_canon or key in seen or not _SNAKE.fullmatch(key):
            continue
        seen.add(key)
        near = difflib.get_close_matches(key, candidates, n=1, cutoff=NEAR_LABEL)
        yield key, (by_canon[near[0]] if near else None)


def invented_answer_lines(given: Sequence[str], labels: Sequence[str], existing: Sequence[str], limit: int) -> list[str]:
    """Up to `limit` new lines naming the `near_misses` among the answers, each with the
    label it is a near spelling of when there is one."""
    listed = {canon(line.removeprefix("- ").split("(")[0]) for line in existing}
    lines = (f"- `{key}`" + (f" (the label is `{label}`)" if label else "")
             for key, label in near_misses(given, labels) if key not in listed)
    return list(islice(lines, limit))


def spelling_lines(given: Sequence[str], labels: Sequence[str], existing: Sequence[str], limit: int) -> list[str]:
    """Up to `limit` new lines naming in full the labels that the `near_misses` among the
    answers are near spellings of, never the invented answer itself: a small policy told
    never to write a word writes it more often."""
    listed = {canon(line.removeprefix("- ").strip().strip("`")) for line in existing}
    lines: list[str] = []
    for _, label in near_misses(given, labels):
        if label and canon(label) not in listed:
            listed.add(canon(label))
            lines.append(f"- `{label}`")
            if len(lines) >= limit:
                break
    return lines


# ---------------------------------------------------------------- module text


class LearnedModule(BaseModel):
    """A module's base text and its learned sections."""

    model_config = ConfigDict(frozen=True)
    base: str
    sections: dict[str, tuple[str, ...]] = {}

    @classmethod
    def parse(cls, text: str) -> "LearnedModule":
        positions = sorted((text.find(h), kind) for kind, h in SECTION_HEADINGS.items() if h in text)
        if not positions:
            return cls(base=text.rstrip())
        base = text[:positions[0][0]].rstrip()
        sections: dict[str, tuple[str, ...]] = {}
        for i, (start, kind) in enumerate(positions):
            end = positions[i + 1][0] if i + 1 < len(positions) else len(text)
            body = text[start + len(SECTION_HEADINGS[kind]):end]
            sections[kind] = tuple(line.strip() for line in body.splitlines() if line.strip())
        return cls(base=base, sections=sections)

    def lines(self, kind: str) -> tuple[str, ...]:
        return self.sections.get(kind, ())

    def all_lines(self) -> list[str]:
        return [line for kind in SECTION_HEADINGS for line in self.lines(kind)]

    def with_lines(self, kind: str, lines: Sequence[str]) -> "LearnedModule":
        sections = dict(self.sections)
        if lines:
            sections[kind] = tuple(lines)
        else:
            sections.pop(kind, None)
        return LearnedModule(base=self.base, sections=sections)

    def render(self) -> str:
        parts = [self.base]
        for kind, heading in SECTION_HEADINGS.items():
            if self.sections.get(kind):
                parts.append(heading + "\n" + "\n".join(self.sections[kind]))
        return "\n\n".join(parts)


def union(first: str, second: str, caps: Mapping[str, int]) -> str:
    """`first` with the learned lines of `second` it lacks (a section at most its `caps`
    entry): the merge of two one-module candidates that lead on different rows."""
    a, b = LearnedModule.parse(first), LearnedModule.parse(second)
    merged = a
    for kind in SECTION_HEADINGS:
        have = list(a.lines(kind))
        known = {line.lower() for line in have}
        extra = [line for line in b.lines(kind) if line.lower() not in known]
        merged = merged.with_lines(kind, (have + extra)[:max(caps[kind], len(have))])
    return merged.render()
