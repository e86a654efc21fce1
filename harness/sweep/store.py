"""Sweep-level files next to the runs: the index of runs (Parquet) and sweep.json (the
sweep, its expected grid and the parity controls), each written atomically."""

from __future__ import annotations

import json
from contextlib import AbstractContextManager, suppress
from pathlib import Path
from typing import Any

import pyarrow as pa
import pyarrow.fs as pafs
import pyarrow.parquet as pq

from harness.atomic import atomic_write, is_temporary_of
from harness.errors import HarnessError
from harness.evidence.uri import joined
from harness.evidence.reader import first_line
from harness.evidence.writer import WRITE_PROBE, EvidenceLocation
from harness.locks import held_in

INDEX_SCHEMA = pa.schema(
    [
        ("run_id", pa.string()),
        ("status", pa.string()),
        ("error", pa.string()),
        ("evidence_dir", pa.string()),
        ("axes_json", pa.string()),
        ("container", pa.string()),
        ("policy", pa.string()),
        ("proposer", pa.string()),
        ("algorithm", pa.string()),
        ("seed", pa.int64()),
        ("attempts", pa.int64()),
        ("rollouts", pa.int64()),
        ("failed_rollouts", pa.int64()),
        ("wall_s", pa.float64()),
        ("seed_heldout", pa.float64()),
        ("best_heldout", pa.float64()),
        # on a cluster: the Ray node the run ran on, and the lost nodes it moved from
        ("node_id", pa.string()),
        ("node_host", pa.string()),
        ("moved_from", pa.string()),
        # what the run id hashes (RunSpec.identity): a later invocation's grid tells the
        # configuration of a run that failed before writing a manifest
        ("identity_json", pa.string()),
    ]
)


class SweepStore:
    def __init__(self, evidence_root: str, sweep: str):
        self.evidence_root, self.sweep = evidence_root, sweep
        self._probe = EvidenceLocation(evidence_root, sweep, "_")
        self.fs, self.dir = self._probe.fs, self._probe.sweep_dir
        self._carried: list[dict[str, Any]] = []  # earlier invocations' index rows (earlier_runs)
        remote_root = not isinstance(self.fs, pafs.LocalFileSystem)
        # what opens the folder again (an object store's URI keeps its query: endpoint, region)
        self.uri = joined(evidence_root, sweep) if remote_root else self.dir
        # what a printed line shows: never that query, which may hold keys
        self.shown_dir = self._probe.shown(self.dir)

    def check_writable(self) -> None:
        self._probe.check_writable()

    @property
    def log_dir(self) -> Path:
        return self._probe.log_dir

    def run_location(self, run_id: str) -> EvidenceLocation:
        return EvidenceLocation(self.evidence_root, self.sweep, run_id)

    def held(self) -> AbstractContextManager[None]:
        """The sweep folder for this driver alone, until the block ends or the process dies.
        A second driver of the same sweep would run the same runs into the same directories
        and overwrite the index, so it stops here with one line; so does a driver of the
        folder `python -m harness` runs in while one runs there (a run holds it shared). An
        flock on the folder itself (no lock file to leave behind), which holds among the
        processes of one host; an object store, or a file system without flock, has no such
        lock, and one driver per sweep is then the user's to keep."""
        return held_in(self.fs, self.dir, f"sweep folder {self.dir} is in use by another sweep driver or a run of "
                                          "`python -m harness`; wait for it to end, or give this sweep another name")

    def drop_dead_temporaries(self) -> None:
        """Delete what a driver killed mid-write left beside the index and sweep.json: their
        atomic_write temporaries and write probes. Called while the folder is `held`, so
        none of them belongs to a live write."""
        try:
            entries = self.fs.get_file_info(pafs.FileSelector(self.dir, allow_not_found=True))
        except OSError:
            return
        for entry in entries:
            name = entry.base_name
            if entry.type == pafs.FileType.File and (
                    name.startswith(WRITE_PROBE) or is_temporary_of(name, ("index.parquet", "sweep.json"))):
                with suppress(OSError):
                    self.fs.delete_file(entry.path)

    def _atomic(self, name: str, data: bytes) -> None:
        try:
            atomic_write(f"{self.dir}/{name}", data, self.fs)
        except OSError as exc:  # e.g. the disk is full: no temporary file left, one clear line
            raise HarnessError(f"cannot write {self.dir}/{name}: {exc}") from exc

    def _carry_over(self, planned: set[str]) -> dict[str, dict[str, Any]]:
        """Keep the index's rows of runs `planned` does not name, so the index goes on listing
        every run of the sweep folder, not only the last command's. Returns those of them that
        failed before writing evidence (the index is their only record), each as the part of
        a manifest the sweep's grid reads: its axes and identity."""
        path = f"{self.dir}/index.parquet"
        try:
            if self.fs.get_file_info(path).type == pafs.FileType.NotFound:
                return {}
            rows = pq.read_table(path, filesystem=self.fs).to_pylist()
        except (OSError, pa.ArrowException) as exc:
            raise HarnessError(f"{path}: unreadable sweep index ({first_line(exc)}); "
                               "move it aside to start a new one") from exc
        # a run an interrupted invocation left running is not running now: it is still to do;
        # evidence is in this folder wherever the folder is now (copied, cloned), not where
        # the row was written
        self._carried = [{**{k: r.get(k) for k in INDEX_SCHEMA.names},
                          **({"status": "pending"} if r.get("status") == "running" else {}),
                          **({"evidence_dir": self.run_location(r["run_id"]).shown_dir} if r.get("evidence_dir") else {})}
                         for r in rows if r.get("run_id") not in planned]
        return {r["run_id"]: {"axes": json.loads(r["axes_json"] or "{}"), "identity": json.loads(r["identity_json"])}
                for r in self._carried if r["status"] == "failed" and not r["evidence_dir"] and r["identity_json"]}

    def adopt(self, rows: dict[str, dict[str, Any] | None]) -> None:
        """Carry `rows` (run id -> index row read from the run's manifest) of earlier runs:
        those the index has no row of, and in place of an index row of an unfinished or
        failed run whose manifest says otherwise (an invocation stopped between a run's end
        and its index write left the run pending; its manifest says done)."""
        at = {r["run_id"]: i for i, r in enumerate(self._carried)}
        for run_id, row in sorted(rows.items()):
            if row is None:
                continue
            if run_id not in at:
                self._carried.append(row)
            elif self._carried[at[run_id]].get("status") not in ("done", "skipped", row["status"]):
                self._carried[at[run_id]] = row

    def write_index(self, rows: list[dict[str, Any]]) -> None:
        """The index: this invocation's `rows` after the carried ones."""
        table = pa.Table.from_pylist([*self._carried, *rows], schema=INDEX_SCHEMA)
        sink = pa.BufferOutputStream()
        pq.write_table(table, sink)
        self._atomic("index.parquet", sink.getvalue().to_pybytes())

    def earlier_runs(self, planned: set[str]) -> dict[str, dict[str, Any]]:
        """Run id -> manifest of each run earlier invocations of the sweep left that `planned`
        does not name: the run directories holding a readable manifest, and the runs the index
        records as failed before writing any (their manifest is the part the grid reads). Also
        keeps the index's rows of those runs for `write_index`, and in `unreadable` the run
        directories whose manifest cannot be read (run id -> why), which the grid leaves out."""
        self.unreadable: dict[str, str] = {}
        failed_early = self._carry_over(planned)
        try:
            entries = self.fs.get_file_info(pafs.FileSelector(self.dir, allow_not_found=True))
        except OSError as exc:
            raise HarnessError(f"cannot list {self.dir}: {exc}") from exc
        found: dict[str, dict[str, Any]] = {}
        for entry in entries:
            if entry.type != pafs.FileType.Directory or entry.base_name in planned or entry.base_name.startswith("."):
                continue
            try:
                manifest = self.run_location(entry.base_name).read_manifest()
            except (OSError, ValueError) as exc:
                self.unreadable[entry.base_name] = first_line(exc)
                continue
            if isinstance(manifest, dict):
                found[entry.base_name] = manifest
        return failed_early | found  # a run's own manifest, where it wrote one, over its index row

    def write_sweep(self, payload: dict[str, Any]) -> None:
        self._atomic("sweep.json", json.dumps(payload, indent=2, sort_keys=True, default=str).encode())
