"""Writes a run's evidence. Tables are buffered in memory and written once, each to a
temporary name then renamed, and manifest.json last: a directory with a manifest is
complete, and a reader never sees a partial Parquet file. The manifest records the sha256
of every table file (`files`), so a reader can tell evidence that was edited afterwards.

A run is written into a staging directory (`<sweep>/.staging/<run_id>-<hex>`) and swapped
into place when it ends, so a rerun killed halfway leaves the previous evidence whole."""

from __future__ import annotations

import hashlib
import json
import uuid
from collections.abc import Iterator
from contextlib import contextmanager, suppress
from pathlib import Path
from typing import Any
from urllib.parse import urlsplit

import pyarrow as pa
import pyarrow.fs as pafs
import pyarrow.parquet as pq

from harness.atomic import atomic_write
from harness.errors import HarnessError
from harness.evidence.schema import SCHEMA_VERSION, TABLES, with_version
from harness.evidence.uri import is_uri, shown
from harness.locks import held_in

MANIFEST = "manifest.json"
STAGING = ".staging"
WRITE_PROBE = ".write-probe-"  # check_writable's file, named so that a dead one can be told


def files_under(fs: pafs.FileSystem, directory: str) -> list[pafs.FileInfo]:
    """Every file below `directory`, at any depth; none when it does not exist."""
    found = fs.get_file_info(pafs.FileSelector(directory, recursive=True, allow_not_found=True))
    return [i for i in found if i.type == pafs.FileType.File]


class EvidenceLocation:
    """A run directory on any pyarrow filesystem (local path, s3://, gs://)."""

    def __init__(self, root: str, sweep: str, run_id: str):
        for what, name in (("sweep name", sweep), ("run id", run_id)):
            if not name or name.startswith(".") or "/" in name or "\\" in name:
                raise HarnessError(f"{what} {name!r} is not a plain directory name: evidence stays inside "
                                   "evidence_root")
        if is_uri(root):
            try:
                self.fs, base = pafs.FileSystem.from_uri(root)
            except (pa.ArrowException, ValueError) as exc:  # its text quotes the URI, query (keys) and all
                reason = str(exc).splitlines()[0].replace(root, shown(root))
                raise HarnessError(f"evidence_root {shown(root)!r}: {reason}") from exc
        else:
            self.fs, base = pafs.LocalFileSystem(), str(Path(root).resolve())
        self.root = base
        # an object store's scheme, for the directory as printed (EvidenceLocation.shown_dir)
        self.scheme = urlsplit(root).scheme if not isinstance(self.fs, pafs.LocalFileSystem) else None
        self.sweep_dir = f"{base}/{sweep}"
        self.run_id, self.sweep = run_id, sweep
        self.run_dir = f"{self.sweep_dir}/{run_id}"
        self.digests: dict[str, str] = {}  # table file -> sha256 of what was written

    def shown(self, path: str) -> str:
        """A directory of this file system as printed and indexed: on an object store with
        its scheme (`s3://bucket/...`) and never the root URI's query, which may hold keys."""
        return f"{self.scheme}://{path}" if self.scheme else path

    @property
    def shown_dir(self) -> str:
        return self.shown(self.run_dir)

    @property
    def log_dir(self) -> Path:
        """Service and per-run logs: beside the evidence when it is on this machine's disk,
        else (an object store) in this machine's cache, where processes can append."""
        if isinstance(self.fs, pafs.LocalFileSystem):
            return Path(self.sweep_dir) / "logs"
        from harness.local_model import cache_root

        return cache_root() / "sweep-logs" / self.sweep

    def staging(self) -> "EvidenceLocation":
        """A fresh location for this run's next attempt, beside the run's directory."""
        return self._at(f"{self.sweep_dir}/{STAGING}/{self.run_id}-{uuid.uuid4().hex[:12]}")

    @contextmanager
    def held(self) -> Iterator[None]:
        """This run for this process alone while the block runs: the same run started twice
        would share its checkpoint, and each start's recover() would delete the other's
        staged attempt. The lock is a file beside the run's directory, `.<run_id>.lock`,
        there while the run is held; the sweep folder is held too, shared with the runs of
        other settings, so that no sweep driver (which holds the folder alone, and its runs
        with it) runs this run meanwhile. On an object store there is no lock."""
        with held_in(self.fs, self.sweep_dir, f"sweep folder {self.sweep_dir} is in use by a sweep driver; wait for "
                                              "it to end", shared=True), \
                held_in(self.fs, self.sweep_dir, f"run {self.run_id} is running in another process (its evidence: "
                                                 f"{self.run_dir}); wait for it to end, or change the run's settings "
                                                 "or seed", lock_file=f".{self.run_id}.lock"):
            yield

    def _staged_leftovers(self) -> list[pafs.FileInfo]:
        selector = pafs.FileSelector(f"{self.sweep_dir}/{STAGING}", allow_not_found=True)
        return [i for i in self.fs.get_file_info(selector)
                if i.type == pafs.FileType.Directory and i.base_name.startswith(f"{self.run_id}-")]

    def recover(self) -> None:
        """Undo what a process killed mid-swap left: the run's previous evidence, moved
        aside, goes back if nothing took its place; staged attempts that never finished go.
        On an object store, where a swap copies file by file, a finished attempt (one with a
        manifest) that execute_run would have swapped in (a done one, or any over evidence
        that is not done) was being copied in: the copy finishes."""
        if not isinstance(self.fs, pafs.LocalFileSystem):
            for info in self._staged_leftovers():
                staged = (self._at(info.path).read_manifest() or {}).get("status")
                current = (self.read_manifest() or {}).get("status")
                if staged == "done" or (staged is not None and current != "done"):
                    self._at(info.path).swap_into(self)
                else:
                    self.fs.delete_dir(info.path)
            return
        for info in self._staged_leftovers():
            replaced = info.base_name.endswith(".replaced")
            if replaced and self.fs.get_file_info(self.run_dir).type == pafs.FileType.NotFound:
                self.fs.move(info.path, self.run_dir)
            else:
                self.fs.delete_dir(info.path)

    def swap_into(self, final: "EvidenceLocation") -> None:
        """Put this (staged, complete) run directory where `final` is, moving the one there
        aside first and deleting it only once the new one is in place."""
        if self.run_dir == final.run_dir:
            return
        if not isinstance(self.fs, pafs.LocalFileSystem):
            return self._copy_into(final)
        aside = f"{final.sweep_dir}/{STAGING}/{final.run_id}-{uuid.uuid4().hex[:12]}.replaced"
        try:
            had = self.fs.get_file_info(final.run_dir).type == pafs.FileType.Directory
            if had:
                self.fs.move(final.run_dir, aside)
            self.fs.move(self.run_dir, final.run_dir)
        except OSError as exc:
            raise HarnessError(f"cannot move the run's evidence into {final.run_dir}: {exc}") from exc
        if had:  # the new evidence is in place: a copy aside that stays is recover()'s to delete
            with suppress(OSError):
                self.fs.delete_dir(aside)

    def _copy_into(self, final: "EvidenceLocation") -> None:
        """An object store has no directory rename: the previous manifest goes first and the
        new one is copied last, so until the end the run's directory reads as unfinished,
        never as done beside tables of another attempt; recover() finishes a copy cut short."""
        def files(run_dir: str) -> list[str]:
            return [i.path[len(run_dir) + 1:] for i in files_under(self.fs, run_dir)]

        try:
            new = sorted(files(self.run_dir), key=lambda name: name == MANIFEST)
            if final.exists(MANIFEST):
                self.fs.delete_file(f"{final.run_dir}/{MANIFEST}")
            for name in new:
                self.fs.copy_file(f"{self.run_dir}/{name}", f"{final.run_dir}/{name}")
            for name in set(files(final.run_dir)) - set(new):
                self.fs.delete_file(f"{final.run_dir}/{name}")
            self.fs.delete_dir(self.run_dir)
        except OSError as exc:
            raise HarnessError(f"cannot copy the run's evidence into {final.run_dir}: {exc}") from exc

    def _at(self, run_dir: str) -> "EvidenceLocation":
        other = EvidenceLocation.__new__(EvidenceLocation)
        other.__dict__.update(self.__dict__, run_dir=run_dir, digests={})
        return other

    def exists(self, name: str) -> bool:
        return self.fs.get_file_info(f"{self.run_dir}/{name}").type == pafs.FileType.File

    def read_manifest(self) -> dict[str, Any] | None:
        if not self.exists(MANIFEST):
            return None
        with self.fs.open_input_stream(f"{self.run_dir}/{MANIFEST}") as stream:
            return json.loads(stream.read().decode())

    def check_writable(self) -> None:
        """Fail before any work if evidence cannot be written."""
        probe = f"{self.sweep_dir}/{WRITE_PROBE}{uuid.uuid4().hex}"
        try:
            self.fs.create_dir(self.sweep_dir, recursive=True)
            with self.fs.open_output_stream(probe) as stream:
                stream.write(b"ok")
            self.fs.delete_file(probe)
        except OSError as exc:
            raise HarnessError(f"evidence directory {self.sweep_dir} is not writable: {exc}") from exc

    def clear_partial(self) -> None:
        """A run directory without a manifest is a run that did not finish: start it over."""
        if self.fs.get_file_info(self.run_dir).type == pafs.FileType.Directory:
            self.fs.delete_dir(self.run_dir)

    def _atomic_write(self, name: str, data: bytes) -> None:
        final = f"{self.run_dir}/{name}"
        try:
            atomic_write(final, data, self.fs)
        except OSError as exc:
            raise HarnessError(f"cannot write evidence {final}: {exc}") from exc

    def write_table(self, name: str, rows: list[dict[str, Any]]) -> None:
        schema = with_version(TABLES[name])
        table = pa.Table.from_pylist(rows, schema=schema)
        sink = pa.BufferOutputStream()
        pq.write_table(table, sink)
        data = sink.getvalue().to_pybytes()
        self.digests[name + ".parquet"] = hashlib.sha256(data).hexdigest()
        self._atomic_write(name + ".parquet", data)

    def write_manifest(self, manifest: dict[str, Any]) -> None:
        files = {name: {"sha256": digest} for name, digest in sorted(self.digests.items())}
        body = json.dumps({**manifest, "files": files, "schema_version": SCHEMA_VERSION}, indent=2, sort_keys=True,
                          default=str)
        self._atomic_write(MANIFEST, body.encode())
