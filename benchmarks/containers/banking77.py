"""Banking77: 77-intent classification of banking customer-support messages (PolyAI, CC BY 4.0).

Run: `python -m benchmarks.containers.banking77 --port 8123 --data-dir /path/to/datasets`.
"""

from __future__ import annotations

import csv
import difflib
import json
import random
from typing import Any

from benchmarks.containers.data import DatasetError, dataset_file
from benchmarks.containers.kit import (
    PROGRAM_VERSION, ChatMessage, PolicyResult, ProgramModule, ProgramResponse, Row, SingleCallContainer, serve,
)

_BASE = "https://raw.githubusercontent.com/PolyAI-LDN/task-specific-datasets/master/banking_data"
# sha256 of the upstream files at commit 57ec275d (see shared/datasets/banking77/PROVENANCE.md).
FILES: dict[str, tuple[str, str]] = {
    "train.csv": (f"{_BASE}/train.csv", "b06e26ac675513959a63135f11b94ea7786ed02da65db93a5650d8838cbc664b"),
    "test.csv": (f"{_BASE}/test.csv", "d12d6e3bc4c3103966ae786dc435913c0c563dfa328f5a3646d0e62cfeeb474d"),
    "categories.json": (f"{_BASE}/categories.json", "53261da888122daf2d120d925458631d9619e15d82e56052e7a42e535ce32b63"),
}
SHUFFLE_SEED = 77

SEED_SYSTEM = (
    "You are a banking customer-support intent classifier. Read the customer's message and reply "
    "with the single intent label from the list that best matches it. Reply with the label only."
)
# Labels come first and the customer message last, so every row shares the longest possible
# prompt prefix (system + label list) and a model server can reuse its prefix cache.
USER_TEMPLATE = "Intent labels:\n{labels}\n\nCustomer message:\n{query}\n\nAnswer with the intent label only."

_STRIP = " \t\"'`*"
# Feedback quotes example messages per intent from train rows at or after this index, which
# no pool of the shipped configs reaches (they use train:0..199): feedback never shows a
# row that the optimizer is judged on.
EXAMPLE_BANK_START = 5000
EXAMPLES_PER_LABEL = 2


def normalize_label(text: str) -> str:
    """Loose form of a model answer (or a label), to recognise a near miss in feedback:
    first non-empty line, no quotes or backticks, no trailing period, no `label:`/`intent:`
    prefix, lowercase, snake_case. Scoring itself is exact."""
    line = next((ln for ln in text.splitlines() if ln.strip()), "")
    value = line.strip(_STRIP).lower()
    for prefix in ("label:", "intent:"):
        if value.startswith(prefix):
            value = value[len(prefix):]
    value = value.strip(_STRIP).rstrip(".").strip(_STRIP)
    return "_".join(value.split())


def _canon(text: str) -> str:
    # Upstream has `reverted_card_payment?`: a missing final "?" is not a wrong answer.
    return normalize_label(text).rstrip("?")


class Banking77(SingleCallContainer):
    taskset_id = "banking77"
    name = "Banking77 intent classification"
    source = "https://github.com/PolyAI-LDN/task-specific-datasets (banking_data, CC BY 4.0)"
    row_keys = ("text", "label")

    def __init__(self, data_dir: str | None = None) -> None:
        super().__init__(data_dir)
        self._labels: list[str] | None = None
        self._by_canon: dict[str, str] = {}  # a label's canonical spelling -> the label
        self._examples: dict[str, list[str]] | None = None

    def _file(self, filename: str) -> str:
        url, sha = FILES[filename]
        return str(dataset_file(self.data_dir, "banking77", filename, url, sha))

    def load_splits(self) -> dict[str, list[Row]]:
        labels = set(self.labels())
        splits: dict[str, list[Row]] = {}
        for split in ("train", "test"):
            with open(self._file(f"{split}.csv"), newline="", encoding="utf-8") as handle:
                rows = [{"text": r["text"], "label": r["category"]} for r in csv.DictReader(handle)]
            unknown = {r["label"] for r in rows} - labels
            if unknown:
                raise DatasetError(f"banking77 {split}.csv has labels not in categories.json: {sorted(unknown)[:3]}")
            # The CSVs are sorted by label; a fixed-seed shuffle of the row order makes any
            # prefix (train:0..19) span many intents while keeping ids stable across runs.
            order = list(range(len(rows)))
            random.Random(SHUFFLE_SEED).shuffle(order)
            splits[split] = [{**rows[i], "source_row": i} for i in order]
        return splits

    def labels(self) -> list[str]:
        if self._labels is None:
            with open(self._file("categories.json"), encoding="utf-8") as handle:
                self._labels = list(json.load(handle))
            self._by_canon = {_canon(label): label for label in self._labels}
        return self._labels

    def examples(self, label: str) -> list[str]:
        """Short example messages of an intent, from the example bank (see EXAMPLE_BANK_START)."""
        if self._examples is None:
            bank: dict[str, list[str]] = {}
            for row in self.splits()["train"][EXAMPLE_BANK_START:]:
                bank.setdefault(row["label"], []).append(" ".join(row["text"].split()))
            # the shortest few: contrast fits in the feedback, and the choice is deterministic
            self._examples = {k: sorted(v, key=lambda t: (len(t), t))[:EXAMPLES_PER_LABEL] for k, v in bank.items()}
        return self._examples.get(label, [])

    def _like(self, label: str) -> str:
        shown = "; ".join(f'"{t}"' for t in self.examples(label))
        return f" (messages like {shown})" if shown else ""

    def nearest_label(self, answer: str) -> str | None:
        """The label itself for a label in another spelling; else the closest by difflib
        (about 3 ms over 77 labels: only for answers that are no label)."""
        self.labels()
        canon = _canon(answer)
        if canon in self._by_canon:
            return self._by_canon[canon]
        match = difflib.get_close_matches(canon, list(self._by_canon), n=1, cutoff=0.5)
        return self._by_canon[match[0]] if match else None

    def label_named(self, answer: str) -> str | None:
        """The label an answer names in any spelling; None for an answer that is no label."""
        self.labels()
        return self._by_canon.get(_canon(normalize_label(answer)))

    def program(self) -> ProgramResponse:
        return ProgramResponse(
            version=PROGRAM_VERSION,
            program_id="banking77.intent.v1",
            modules=[
                ProgramModule(module_id="stage2_system", role="system", content=SEED_SYSTEM,
                              mutable=True, candidate_field="stage2_system"),
                ProgramModule(module_id="stage2_user", role="user", content=USER_TEMPLATE, mutable=False),
            ],
            target_modules=["stage2_system"],
            seed_candidate={"stage2_system": SEED_SYSTEM},
        )

    def render(self, candidate: dict[str, str], row: Row) -> list[ChatMessage]:
        user = USER_TEMPLATE.format(labels="\n".join(self.labels()), query=row["text"])
        return [ChatMessage(role="system", content=candidate["stage2_system"]), ChatMessage(role="user", content=user)]

    def reflection_input(self, row: Row) -> str:
        return row["text"]  # the label list is the same for every row

    def score(self, row: Row, result: PolicyResult) -> tuple[float, str]:
        """1 for exactly the label after trimming whitespace, else 0. The feedback tells a
        near miss (the right label in another spelling) apart from a wrong label, and
        contrasts the expected and the given intent with example messages of each."""
        expected = row["label"]
        answer = result.text.strip()
        if answer == expected.strip():
            return 1.0, f"Correct: `{expected}`."
        if not answer:
            return 0.0, f"Wrong: expected intent `{expected}`{self._like(expected)}, the answer was empty."
        shown = answer if len(answer) <= 80 else answer[:77] + "..."
        given = normalize_label(answer)
        if _canon(given) == _canon(expected):
            return 0.0, (f"Wrong format: the intent `{expected}` is right but the answer was `{shown}`; "
                         "reply with the label exactly as listed and nothing else.")
        feedback = f"Wrong: expected intent `{expected}`{self._like(expected)}, the answer was `{shown}`"
        named = self.label_named(answer)
        if named:
            return 0.0, feedback + f", which is for other messages{self._like(named)}."
        nearest = self.nearest_label(given)
        hint = f" The nearest valid label is `{nearest}`." if nearest else ""
        return 0.0, feedback + f". `{given}` is not one of the 77 intent labels.{hint} Answer with a label from the list exactly."

    def answer_examples(self, row: Row, result: PolicyResult) -> dict[str, list[str]]:
        """The row's own message under its label; for a wrong label, also the example
        messages the feedback quotes for the expected and the given intent."""
        expected = row["label"]
        cited = {expected: [row["text"]]}
        answer = result.text.strip()
        if answer == expected.strip():
            return cited
        cited[expected] += self.examples(expected)
        given = self.label_named(answer) if answer else None
        if given and given != expected:
            cited[given] = list(self.examples(given))
        return {label: texts for label, texts in cited.items() if texts}

    def task_info(self) -> dict[str, Any]:
        return {
            "description": "Classify a banking customer-support message into exactly one of 77 intent labels.",
            "labels": self.labels(),
        }


if __name__ == "__main__":
    serve(Banking77)
