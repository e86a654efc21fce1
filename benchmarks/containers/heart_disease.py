"""UCI Heart Disease (Cleveland, processed): say whether a patient has heart disease (num > 0).

Run: `python -m benchmarks.containers.heart_disease --port 8124 --data-dir /path/to/datasets`.
"""

from __future__ import annotations

import csv
import string
from typing import Any

from benchmarks.containers.data import DatasetError, dataset_file
from benchmarks.containers.kit import (
    PROGRAM_VERSION, ChatMessage, PolicyResult, ProgramModule, ProgramResponse, Row, SingleCallContainer, seeded_split,
    serve,
)

URL = "https://archive.ics.uci.edu/ml/machine-learning-databases/heart-disease/processed.cleveland.data"
SHA256 = "a74b7efa387bc9d108d7d0115d831fe9b414b29ae7124f331b622b4efa0427c8"
FILENAME = "processed.cleveland.data"
COLUMNS = ("age", "sex", "cp", "trestbps", "chol", "fbs", "restecg", "thalach",
           "exang", "oldpeak", "slope", "ca", "thal", "num")
N_ROWS, N_TRAIN = 303, 203
SPLIT_SEED = 45  # UCI's dataset id; any fixed value works, it only has to never change.
LABELS = ["no", "yes"]

SEED_SYSTEM = (
    "You are a cardiologist. Based on the patient's test results, say whether the patient has "
    "heart disease. Answer 'yes' or 'no'."
)
USER_TEMPLATE = "Patient test results:\n{features}\n\nDoes this patient have heart disease? Answer 'yes' or 'no'."

# Code meanings from heart-disease.names (see shared/datasets/heart_disease/PROVENANCE.md).
_CHEST_PAIN = {1: "typical angina", 2: "atypical angina", 3: "non-anginal pain", 4: "asymptomatic"}
_ECG = {0: "normal", 1: "ST-T wave abnormality", 2: "left ventricular hypertrophy"}
_SLOPE = {1: "upsloping", 2: "flat", 3: "downsloping"}
_THAL = {3: "normal", 6: "fixed defect", 7: "reversible defect"}


def _num(value: float | None) -> str:
    return "unknown" if value is None else f"{value:g}"


def _coded(table: dict[int, str], value: float | None) -> str:
    return "unknown" if value is None else table.get(int(value), f"code {value:g}")


def _yes_no(value: float | None) -> str:
    return "unknown" if value is None else ("yes" if value else "no")


def describe(row: Row) -> str:
    """The patient's features as readable lines; `?` in the data shows as `unknown`."""
    sex = "unknown" if row["sex"] is None else ("male" if row["sex"] else "female")
    lines = [
        f"Age: {_num(row['age'])} years",
        f"Sex: {sex}",
        f"Chest pain type: {_coded(_CHEST_PAIN, row['cp'])}",
        f"Resting blood pressure: {_num(row['trestbps'])} mm Hg",
        f"Serum cholesterol: {_num(row['chol'])} mg/dl",
        f"Fasting blood sugar above 120 mg/dl: {_yes_no(row['fbs'])}",
        f"Resting ECG: {_coded(_ECG, row['restecg'])}",
        f"Maximum heart rate achieved: {_num(row['thalach'])} bpm",
        f"Exercise-induced angina: {_yes_no(row['exang'])}",
        f"ST depression induced by exercise relative to rest: {_num(row['oldpeak'])}",
        f"Slope of the peak exercise ST segment: {_coded(_SLOPE, row['slope'])}",
        f"Major vessels coloured by fluoroscopy: {_num(row['ca'])}",
        f"Thallium stress test: {_coded(_THAL, row['thal'])}",
    ]
    return "\n".join(lines)


def findings(row: Row, disease: bool) -> list[str]:
    """Findings that point toward `disease` (True) or away from it, strongest first
    (roughly the features' usual importance on this dataset), each written as the line the
    policy sees in `describe` (`Thallium stress test: reversible defect`), so rules learned
    from feedback name what is in the prompt."""
    thal, ca, cp, oldpeak = row["thal"], row["ca"], row["cp"], row["oldpeak"]
    exang, slope, thalach = row["exang"], row["slope"], row["thalach"]
    shown = dict(line.split(": ", 1) for line in describe(row).splitlines())

    def line(name: str) -> str:
        return f"{name}: {shown[name]}"

    if disease:
        toward = [
            (thal in (6, 7), line("Thallium stress test")),
            (ca is not None and ca >= 1, line("Major vessels coloured by fluoroscopy")),
            (cp == 4, line("Chest pain type")),
            (oldpeak is not None and oldpeak >= 2, line("ST depression induced by exercise relative to rest")),
            (exang == 1, line("Exercise-induced angina")),
            (slope in (2, 3), line("Slope of the peak exercise ST segment")),
            (thalach is not None and thalach < 140, line("Maximum heart rate achieved")),
        ]
    else:
        toward = [
            (thal == 3, line("Thallium stress test")),
            (ca == 0, line("Major vessels coloured by fluoroscopy")),
            (cp in (1, 2, 3), line("Chest pain type")),
            (oldpeak is not None and oldpeak < 1, line("ST depression induced by exercise relative to rest")),
            (exang == 0, line("Exercise-induced angina")),
            (slope == 1, line("Slope of the peak exercise ST segment")),
            (thalach is not None and thalach >= 160, line("Maximum heart rate achieved")),
        ]
    return [text for holds, text in toward if holds]


def normalize_answer(text: str) -> str:
    """First word, lowercase, punctuation stripped (`**Yes.**` -> `yes`)."""
    words = text.split()
    return words[0].strip(string.punctuation + "`*").lower() if words else ""


def _parse(value: str) -> float | None:
    return None if value.strip() == "?" else float(value)


class HeartDisease(SingleCallContainer):
    taskset_id = "heart_disease"
    name = "UCI Heart Disease (Cleveland) diagnosis"
    source = "https://archive.ics.uci.edu/dataset/45/heart+disease (processed.cleveland.data)"
    row_keys = (*COLUMNS, "target")

    def load_splits(self) -> dict[str, list[Row]]:
        path = dataset_file(self.data_dir, "heart_disease", FILENAME, URL, SHA256)
        with open(path, newline="", encoding="ascii") as handle:
            raw = [r for r in csv.reader(handle) if r]
        if len(raw) != N_ROWS or any(len(r) != len(COLUMNS) for r in raw):
            raise DatasetError(f"{path}: expected {N_ROWS} rows of {len(COLUMNS)} values")
        rows: list[Row] = []
        for i, values in enumerate(raw):
            row: Row = {col: _parse(v) for col, v in zip(COLUMNS, values)}
            row["num"] = int(row["num"] or 0)
            row["target"] = int(row["num"] > 0)  # the standard binary task: any narrowing >= 50%
            row["source_row"] = i
            rows.append(row)
        return seeded_split(rows, SPLIT_SEED, N_TRAIN)

    def labels(self) -> list[str]:
        return list(LABELS)

    def program(self) -> ProgramResponse:
        return ProgramResponse(
            version=PROGRAM_VERSION,
            program_id="heart_disease.diagnosis.v1",
            modules=[
                ProgramModule(module_id="system", role="system", content=SEED_SYSTEM,
                              mutable=True, candidate_field="system"),
                ProgramModule(module_id="user", role="user", content=USER_TEMPLATE, mutable=False),
            ],
            target_modules=["system"],
            seed_candidate={"system": SEED_SYSTEM},
        )

    def render(self, candidate: dict[str, str], row: Row) -> list[ChatMessage]:
        user = USER_TEMPLATE.format(features=describe(row))
        return [ChatMessage(role="system", content=candidate["system"]), ChatMessage(role="user", content=user)]

    def reflection_input(self, row: Row) -> str:
        return describe(row)

    def score(self, row: Row, result: PolicyResult) -> tuple[float, str]:
        expected = LABELS[int(row["target"])]
        given = normalize_answer(result.text)
        meaning = "heart disease present" if expected == "yes" else "no heart disease"
        if given == expected:
            return 1.0, f"Correct: `{expected}` ({meaning})."
        shown = f"`{given}`" if given else "empty"
        feedback = f"Wrong: expected `{expected}` ({meaning}), the answer was {shown}."
        if given not in LABELS:
            feedback += " The answer must start with 'yes' or 'no'."
        strongest = findings(row, disease=expected == "yes")[:3]
        if strongest:
            feedback += " Findings in this patient's results that point to " + (
                "disease" if expected == "yes" else "no disease") + ": " + "; ".join(strongest) + "."
        against = findings(row, disease=expected != "yes")[:2]
        if against and given in LABELS:
            feedback += " The answer may have followed " + "; ".join(against) + ", which weigh less here."
        return 0.0, feedback

    def task_info(self) -> dict[str, Any]:
        return {
            "description": "Decide from 13 clinical test results whether a patient has heart disease "
                           "(angiographic narrowing >= 50% in any major vessel); answer yes or no.",
            "labels": list(LABELS),
        }


if __name__ == "__main__":
    serve(HeartDisease)
