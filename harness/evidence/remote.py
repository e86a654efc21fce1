"""Evidence on an object store (`s3://`, `gs://`), read and reported where the report's
polars and matplotlib can work: on this machine's disk. A sweep folder or run directory is
mirrored into the harness cache (only files whose size or time changed are fetched again),
the report is written there, and uploaded beside the evidence."""

from __future__ import annotations

import hashlib
import os
from pathlib import Path

import pyarrow as pa
import pyarrow.fs as pafs

from harness.evidence.reader import EvidenceError, first_line
from harness.evidence.uri import shown
from harness.evidence.writer import files_under

# written by the runs for their own use (logs, attempts in progress, checkpoints, locks) or
# regenerated here (the report): not evidence the report reads
NOT_EVIDENCE = ("logs", ".staging", ".checkpoints", "report")


def _open(uri: str) -> tuple[pafs.FileSystem, str]:
    try:
        return pafs.FileSystem.from_uri(uri)
    except (pa.ArrowException, ValueError) as exc:  # its text quotes the URI, query (keys) and all
        raise EvidenceError(f"{shown(uri)}: {first_line(exc).replace(uri, shown(uri))}") from exc


def mirror(uri: str, cache: Path | None = None) -> Path:
    """A local copy of the evidence under `uri` (a sweep folder or one run's directory, with
    its sweep folder's `sweep.json` and `index.parquet`), kept in the harness cache."""
    from harness.local_model import cache_root

    fs, path = _open(uri)
    root = (cache or cache_root()) / "evidence-mirror" / hashlib.sha256(shown(uri).encode()).hexdigest()[:16]
    try:
        info = fs.get_file_info(path)
        if info.type != pafs.FileType.Directory:
            raise EvidenceError(f"{shown(uri)}: no such directory")
        parent = path.rstrip("/").rpartition("/")[0]
        wanted = [i for i in files_under(fs, path) if not _skipped(i.path[len(path):])]
        # one run's directory: the sweep's own files too, which say what the run belongs to
        wanted += [i for i in fs.get_file_info([f"{parent}/sweep.json", f"{parent}/index.parquet"])
                   if i.type == pafs.FileType.File]
        kept = {root / item.path[len(parent):].lstrip("/") for item in wanted}
        for item in wanted:
            _fetch(fs, item, root / item.path[len(parent):].lstrip("/"))
        for stale in [p for p in root.rglob("*") if p.is_file() and p not in kept and not _skipped(
                p.relative_to(root).as_posix())]:
            stale.unlink()  # gone from the store (a run removed): gone from the report too
    except OSError as exc:
        raise EvidenceError(f"{shown(uri)}: cannot read the evidence: {first_line(exc)}") from exc
    return root / path.rstrip("/").rpartition("/")[2]


def upload(local_dir: Path, uri: str) -> None:
    """Every file under `local_dir` to the same place under `uri` (the report, beside the evidence)."""
    fs, path = _open(uri)
    try:
        for file in sorted(p for p in local_dir.rglob("*") if p.is_file()):
            with file.open("rb") as source, fs.open_output_stream(f"{path}/{file.relative_to(local_dir).as_posix()}") as out:
                out.write(source.read())
    except OSError as exc:
        raise EvidenceError(f"cannot write the report to {shown(uri)}: {first_line(exc)}") from exc


def _skipped(relative: str) -> bool:
    parts = relative.strip("/").split("/")
    return any(p in NOT_EVIDENCE for p in parts[:-1]) or parts[-1].endswith(".lock")


def _fetch(fs: pafs.FileSystem, item: pafs.FileInfo, local: Path) -> None:
    stamp = item.mtime_ns or 0
    if local.is_file() and local.stat().st_size == item.size and local.stat().st_mtime_ns == stamp:
        return
    local.parent.mkdir(parents=True, exist_ok=True)
    partial = local.with_name(local.name + ".part")
    with fs.open_input_stream(item.path) as source, partial.open("wb") as out:
        out.write(source.read())
    os.utime(partial, ns=(stamp, stamp))
    partial.replace(local)
