"""Writes a run's evidence. Tables are buffered in memory and written once, each to a
temporary name then renamed, and manifest.json last: a directory with a manifest is
complete, and a reader never sees a partial Parquet file."""

from __future__ import annotations

import json
import uuid
from pathlib import Path
from typing import Any

import pyarrow as pa
import pyarrow.fs as pafs
import pyarrow.parquet as pq

from harness.errors import HarnessError
from harness.evidence.schema import SCHEMA_VERSION, TABLES, with_version

MANIFEST = "manifest.json"


class EvidenceLocation:
    """A run directory on any pyarrow filesystem (local path, s3://, gs://)."""

    def __init__(self, root: str, sweep: str, run_id: str):
        if "://" in root:
            self.fs, base = pafs.FileSystem.from_uri(root)
        else:
            self.fs, base = pafs.LocalFileSystem(), str(Path(root).resolve())
        self.root = base
        self.sweep_dir = f"{base}/{sweep}"
        self.run_dir = f"{self.sweep_dir}/{run_id}"

    def exists(self, name: str) -> bool:
        return self.fs.get_file_info(f"{self.run_dir}/{name}").type == pafs.FileType.File

    def read_manifest(self) -> dict[str, Any] | None:
        if not self.exists(MANIFEST):
            return None
        with self.fs.open_input_stream(f"{self.run_dir}/{MANIFEST}") as stream:
            return json.loads(stream.read().decode())

    def check_writable(self) -> None:
        """Fail before any work if evidence cannot be written."""
        probe = f"{self.sweep_dir}/.write-probe-{uuid.uuid4().hex}"
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

    def _atomic_write(self, name: str, write: Any) -> None:
        final = f"{self.run_dir}/{name}"
        temp = f"{self.run_dir}/.{name}.{uuid.uuid4().hex}.tmp"
        try:
            self.fs.create_dir(self.run_dir, recursive=True)
            write(temp)
            self.fs.move(temp, final)
        except OSError as exc:
            try:
                self.fs.delete_file(temp)
            except OSError:
                pass
            raise HarnessError(f"cannot write evidence {final}: {exc}") from exc

    def write_table(self, name: str, rows: list[dict[str, Any]]) -> None:
        schema = with_version(TABLES[name])
        table = pa.Table.from_pylist(rows, schema=schema)
        self._atomic_write(name + ".parquet", lambda path: pq.write_table(table, path, filesystem=self.fs))

    def write_manifest(self, manifest: dict[str, Any]) -> None:
        body = json.dumps({**manifest, "schema_version": SCHEMA_VERSION}, indent=2, sort_keys=True, default=str)

        def write(path: str) -> None:
            with self.fs.open_output_stream(path) as stream:
                stream.write(body.encode())

        self._atomic_write(MANIFEST, write)
