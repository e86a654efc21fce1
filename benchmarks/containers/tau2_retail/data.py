"""The tau2-bench retail files (policy, database, tasks, splits), pinned to one upstream
commit, and the per-rollout database: copy-on-access tables over one pristine parse, so a
rollout copies only the records it touches and never shares state with another."""

from __future__ import annotations

import copy
import hashlib
import json
from collections.abc import Iterator, Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from benchmarks.containers.data import DatasetError, dataset_file

_BASE = ("https://raw.githubusercontent.com/sierra-research/tau2-bench/"
         "a2c024725189473d2d7cea3a5cfdbcc67478e41f/data/tau2/domains/retail")
# sha256 of the upstream files at that commit (see shared/datasets/tau2_retail/PROVENANCE.md).
FILES: dict[str, str] = {
    "policy.md": "2c9652afbce57d6e087768d37cda64d31c53d50b3e3225cfdb791bac66466467",
    "db.json": "413a65160adbdb5fde0ffc0015c49b6d70250b10c18128de169b597af7766765",
    "tasks.json": "8e03ebce7901bd6218e7a7dc3105faa9324091a68058f7fe61c65262868812e8",
    "split_tasks.json": "ed0580ec52575b63fbf76568af42490da6ee7783ecb4aa81af46961291358f20",
}
SPLITS = ("train", "test")



class Table(Mapping[str, Any]):
    """One table (users, orders, products) of one rollout's database.

    `table[key]` returns this rollout's own deep copy of the record (made on first access),
    which tools may mutate; iteration (`items`, `values`) yields read-only views, the own copy
    where one exists. The pristine base is never written.
    """

    def __init__(self, base: dict[str, Any]) -> None:
        self._base = base
        self._own: dict[str, Any] = {}

    def __getitem__(self, key: str) -> Any:
        if key not in self._own:
            self._own[key] = copy.deepcopy(self._base[key])
        return self._own[key]

    def __contains__(self, key: object) -> bool:
        return key in self._base

    def __iter__(self) -> Iterator[str]:
        return iter(self._base)

    def __len__(self) -> int:
        return len(self._base)

    def view(self, key: str) -> Any:
        return self._own[key] if key in self._own else self._base[key]

    def items(self) -> Iterator[tuple[str, Any]]:  # type: ignore[override]
        return ((key, self.view(key)) for key in self._base)

    def values(self) -> Iterator[Any]:  # type: ignore[override]
        return (self.view(key) for key in self._base)

    def changed(self) -> dict[str, Any]:
        """Records that differ from the pristine base (touched-but-equal ones excluded)."""
        return {key: value for key, value in self._own.items() if value != self._base[key]}


Db = dict[str, Table]


def retail_file(data_dir: str | None, filename: str) -> Path:
    return dataset_file(data_dir, "tau2_retail", filename, f"{_BASE}/{filename}", FILES[filename])


def db_hash(db: Db) -> str:
    """Fingerprint of a database state: the canonical JSON of every record that differs from
    the shipped database. Two rollouts' databases are equal iff their fingerprints are (both
    start from the same base), which is what tau2's full-state hash comparison decides."""
    diff = {name: table.changed() for name, table in sorted(db.items())}
    canonical = json.dumps(diff, sort_keys=True, separators=(",", ":"), ensure_ascii=False)
    return hashlib.sha256(canonical.encode()).hexdigest()


@dataclass(frozen=True)
class RetailData:
    policy: str
    db_base: dict[str, dict[str, Any]]  # the shipped database, parsed once and never written
    tasks: dict[str, dict[str, Any]]  # task id -> task
    split_ids: dict[str, list[str]]

    @classmethod
    def load(cls, data_dir: str | None) -> "RetailData":
        policy = retail_file(data_dir, "policy.md").read_text(encoding="utf-8")
        db_base = json.loads(retail_file(data_dir, "db.json").read_text(encoding="utf-8"))
        if sorted(db_base) != ["orders", "products", "users"]:
            raise DatasetError(f"tau2_retail db.json: unexpected tables {sorted(db_base)}")
        tasks = json.loads(retail_file(data_dir, "tasks.json").read_text(encoding="utf-8"))
        split_ids = json.loads(retail_file(data_dir, "split_tasks.json").read_text(encoding="utf-8"))
        by_id = {str(task["id"]): task for task in tasks}
        for split in SPLITS:
            unknown = [i for i in split_ids.get(split, []) if i not in by_id]
            if split not in split_ids or unknown:
                raise DatasetError(f"tau2_retail split_tasks.json: split {split!r} missing or names unknown tasks {unknown[:3]}")
        with_state = [i for i, task in by_id.items() if task.get("initial_state")]
        if with_state:
            # Retail tasks start from the shipped database; an initial state would need replaying.
            raise DatasetError(f"tau2_retail: tasks with an initial_state are not supported: {with_state[:3]}")
        return cls(policy=policy, db_base=db_base, tasks=by_id,
                   split_ids={split: [str(i) for i in split_ids[split]] for split in SPLITS})

    def fresh_db(self) -> Db:
        return {name: Table(records) for name, records in self.db_base.items()}
