"""HotpotQA (distractor setting): multi-hop question answering over ten context paragraphs,
scored with the official answer F1 / exact match (Yang et al., 2018; CC BY-SA 4.0).

Run: `python -m benchmarks.containers.hotpotqa --port 8125 --data-dir /path/to/datasets [--reward em]`.

The rows are the first 103 examples of the official dev distractor file. A local copy is
read from `<data-dir>/hotpotqa/` (the JSONL of shared/datasets, or the upstream JSON
array); otherwise the upstream array is downloaded and checked against its sha256 pin.
"""

from __future__ import annotations

import argparse
import json
import re
import string
from collections import Counter
from pathlib import Path
from typing import Any

from benchmarks.containers.data import DatasetError, dataset_file
from benchmarks.containers.kit import (
    PROGRAM_VERSION, ChatMessage, PolicyResult, ProgramModule, ProgramResponse, Row, SingleCallContainer, seeded_split,
    serve,
)

# acmyu/CS592LLM-Project data/hotpot_dev_distractor_v1_100.json (103 examples, git blob
# 3d143d23...); see shared/datasets/hotpotqa/PROVENANCE.md. The sha256 is of those exact bytes.
URL = ("https://raw.githubusercontent.com/acmyu/CS592LLM-Project/"
       "5f67a0f94f7134e0ab3a2351a5146ed141d2dcc0/data/hotpot_dev_distractor_v1_100.json")
SHA256 = "f764184c713165e24c511fa067f76217d2eb9ad5c87223f268a6feedf45e812b"
UPSTREAM_FILE = "hotpot_dev_distractor_v1_100.json"
LOCAL_JSONL = "hotpot_dev_distractor_v1_first103.jsonl"
N_ROWS, N_TRAIN = 103, 63
SPLIT_SEED = 2018  # the dataset's year; it only has to never change
REWARDS = ("f1", "em")
DEFAULT_MIN_TOKENS = 256

SEED_SYSTEM = (
    "You answer multi-hop questions using only the given context paragraphs. Find the paragraphs "
    "that connect the question's entities, reason step by step, and give a short answer: an entity "
    "name, a date, a number, or yes/no."
)
# The answer format lives in the fixed user template so a rewritten system prompt cannot
# lose it; the context comes first so rows share no prefix anyway, the question last.
USER_TEMPLATE = (
    "Context paragraphs:\n\n{context}\n\nQuestion: {question}\n\n"
    "Think briefly if needed, then end with a final line of the form `Answer: <short answer>`."
)

_PUNCTUATION = frozenset(string.punctuation)
_ANSWER_LINE = re.compile(r"^[\s>*_#-]*(?:final\s+)?answer\s*[*_]*\s*[:：]\s*(?P<answer>.*)$", re.I | re.M)


# ---------------------------------------------------------------- official metric
# Same normalization and token F1 as hotpot_evaluate_v1.py (itself from SQuAD's evaluator).


def normalize_answer(text: str) -> str:
    """Lowercase, drop punctuation, drop articles (a/an/the), collapse whitespace."""
    text = text.lower()
    text = "".join(ch for ch in text if ch not in _PUNCTUATION)
    text = re.sub(r"\b(a|an|the)\b", " ", text)
    return " ".join(text.split())


def f1_score(prediction: str, gold: str) -> tuple[float, float, float]:
    """(f1, precision, recall); a yes/no/noanswer mismatch scores zero, as upstream."""
    pred, truth = normalize_answer(prediction), normalize_answer(gold)
    special = ("yes", "no", "noanswer")
    if (pred in special or truth in special) and pred != truth:
        return 0.0, 0.0, 0.0
    pred_tokens, truth_tokens = pred.split(), truth.split()
    same = sum((Counter(pred_tokens) & Counter(truth_tokens)).values())
    if same == 0:
        return 0.0, 0.0, 0.0
    precision, recall = same / len(pred_tokens), same / len(truth_tokens)
    return 2 * precision * recall / (precision + recall), precision, recall


def exact_match(prediction: str, gold: str) -> float:
    return float(normalize_answer(prediction) == normalize_answer(gold))


def extract_answer(output: str) -> tuple[str, bool]:
    """(answer, found an `Answer:` line). Without one, the last non-empty line is the answer."""
    matches = list(_ANSWER_LINE.finditer(output))
    if matches:
        raw, found = matches[-1]["answer"], True
    else:
        raw, found = next((ln for ln in reversed(output.splitlines()) if ln.strip()), ""), False
    return raw.strip().strip("*_`\"' ").rstrip(".").strip(), found


# ---------------------------------------------------------------- rows


def _load_rows(data_dir: str | None) -> list[dict[str, Any]]:
    if data_dir and (local := Path(data_dir).expanduser() / "hotpotqa" / LOCAL_JSONL).is_file():
        with open(local, encoding="utf-8") as handle:
            return [json.loads(line) for line in handle if line.strip()]
    path = dataset_file(data_dir, "hotpotqa", UPSTREAM_FILE, URL, SHA256)
    with open(path, encoding="utf-8") as handle:
        return json.load(handle)


def _row(example: dict[str, Any], source_row: int) -> Row:
    # The question first: the proposer sees a row clipped as JSON, so order is what it reads.
    return {
        "question": example["question"],
        "answer": example["answer"],
        "type": example["type"],
        "level": example["level"],
        "supporting_facts": [[title, int(sent)] for title, sent in example["supporting_facts"]],
        "context": [[title, list(sentences)] for title, sentences in example["context"]],
        "id": example["_id"],
        "source_row": source_row,
    }


def render_context(context: list[list[Any]]) -> str:
    # Sentences keep their upstream leading spaces, so joining with "" restores the paragraph.
    return "\n\n".join(f"[{k}] {title}\n{''.join(sentences).strip()}" for k, (title, sentences) in enumerate(context, 1))


def supporting_sentences(row: Row) -> list[str]:
    paragraphs = {title: sentences for title, sentences in row["context"]}
    out = []
    for title, index in row["supporting_facts"]:
        sentences = paragraphs.get(title, [])
        if 0 <= index < len(sentences):
            out.append(f"{title}: {sentences[index].strip()}")
    return out


class HotpotQA(SingleCallContainer):
    taskset_id = "hotpotqa"
    name = "HotpotQA (distractor) multi-hop QA"
    source = "https://hotpotqa.github.io (dev distractor, first 103 examples; CC BY-SA 4.0)"
    row_keys = ("question", "answer", "context", "supporting_facts")

    def __init__(self, data_dir: str | None = None) -> None:
        super().__init__(data_dir)
        self.reward_name = "f1"
        self.min_policy_tokens = DEFAULT_MIN_TOKENS

    @classmethod
    def add_arguments(cls, parser: argparse.ArgumentParser) -> None:
        parser.add_argument("--reward", choices=REWARDS, default="f1",
                            help="outcome reward: answer F1 (default) or exact match")
        parser.add_argument("--min-policy-tokens", type=int, default=DEFAULT_MIN_TOKENS,
                            help="floor on the policy's max_tokens (room to reason before the Answer line)")

    def configure(self, args: argparse.Namespace) -> None:
        self.reward_name = args.reward
        self.min_policy_tokens = args.min_policy_tokens

    def load_splits(self) -> dict[str, list[Row]]:
        examples = _load_rows(self.data_dir)
        if len(examples) != N_ROWS:
            raise DatasetError(f"hotpotqa: expected {N_ROWS} examples, found {len(examples)}")
        rows = [_row(example, i) for i, example in enumerate(examples)]
        return seeded_split(rows, SPLIT_SEED, N_TRAIN)

    def program(self) -> ProgramResponse:
        return ProgramResponse(
            version=PROGRAM_VERSION,
            program_id="hotpotqa.multihop.v1",
            modules=[
                ProgramModule(module_id="stage1_system", role="system", content=SEED_SYSTEM,
                              mutable=True, candidate_field="stage1_system"),
                ProgramModule(module_id="stage1_user", role="user", content=USER_TEMPLATE, mutable=False),
            ],
            target_modules=["stage1_system"],
            seed_candidate={"stage1_system": SEED_SYSTEM},
        )

    def render(self, candidate: dict[str, str], row: Row) -> list[ChatMessage]:
        user = USER_TEMPLATE.format(context=render_context(row["context"]), question=row["question"])
        return [ChatMessage(role="system", content=candidate["stage1_system"]), ChatMessage(role="user", content=user)]

    def objectives(self, row: Row, output_text: str) -> dict[str, float]:
        predicted, _ = extract_answer(output_text)
        f1, precision, recall = f1_score(predicted, row["answer"])
        return {"f1": f1, "em": exact_match(predicted, row["answer"]), "precision": precision, "recall": recall}

    def score(self, row: Row, result: PolicyResult) -> tuple[float, str]:
        output_text = result.text
        predicted, found = extract_answer(output_text)
        scores = self.objectives(row, output_text)
        reward = scores[self.reward_name]
        titles = list(dict.fromkeys(title for title, _ in row["supporting_facts"]))
        head = "Correct" if scores["em"] == 1.0 else ("Partly correct" if scores["f1"] > 0 else "Wrong")
        parts = [f"{head} (F1 {scores['f1']:.2f}, EM {scores['em']:g}): expected `{row['answer']}`, "
                 f"the answer was `{predicted}`." if predicted else
                 f"Wrong (F1 0, EM 0): expected `{row['answer']}`, the answer was empty."]
        parts.append("Supporting paragraphs: " + "; ".join(titles) + ".")
        if not found:
            parts.append("No `Answer:` line was found, so the last line was taken as the answer.")
            if result.finish_reason == "length":
                parts.append("The reply was cut off at the token limit before its `Answer:` line; reason briefly.")
        if scores["em"] < 1.0 and scores["f1"] > 0 and scores["precision"] < scores["recall"]:
            parts.append("The answer has extra words; give only the short span.")
        if normalize_answer(row["answer"]) in ("yes", "no") and normalize_answer(predicted) not in ("yes", "no"):
            parts.append("This is a yes/no question: answer exactly yes or no.")
        if scores["em"] < 1.0:
            parts.append("Supporting facts: " + " | ".join(supporting_sentences(row)))
        return reward, " ".join(parts)

    def task_info(self) -> dict[str, Any]:
        return {
            "description": "Answer a multi-hop question from ten Wikipedia paragraphs (two gold, eight "
                           "distractors); scored by the official HotpotQA answer F1 / exact match after "
                           "normalization (lowercase, no punctuation, no articles).",
            "reward": self.reward_name,
            "answer_format": "final line `Answer: <short answer>`",
        }


if __name__ == "__main__":
    serve(HotpotQA)
