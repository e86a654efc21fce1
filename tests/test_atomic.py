"""harness.atomic.atomic_write: a file is replaced whole or not at all, on local disk and on
any pyarrow filesystem (a sub-tree filesystem stands in for an object store)."""

from __future__ import annotations

from pathlib import Path

import pyarrow.fs as pafs
import pytest

from harness.atomic import atomic_write


def test_writes_bytes_and_makes_the_directory(tmp_path: Path) -> None:
    target = tmp_path / "a" / "b" / "file.json"
    atomic_write(target, b'{"x": 1}')
    assert target.read_bytes() == b'{"x": 1}'
    atomic_write(target, b"second")
    assert target.read_bytes() == b"second" and [p.name for p in target.parent.iterdir()] == ["file.json"]


def test_a_writer_function_gets_a_temporary_path_beside_the_target(tmp_path: Path) -> None:
    target = tmp_path / "table.parquet"
    seen: list[str] = []

    def write(temp: str) -> None:
        seen.append(temp)
        Path(temp).write_bytes(b"parquet bytes")

    atomic_write(target, write)
    assert target.read_bytes() == b"parquet bytes"
    assert Path(seen[0]).parent == tmp_path and Path(seen[0]).name.startswith(".table.parquet.")
    assert not Path(seen[0]).exists()


def test_a_failed_write_keeps_the_old_file_and_leaves_no_temporary(tmp_path: Path) -> None:
    target = tmp_path / "manifest.json"
    target.write_bytes(b"old")

    def half_then_fail(temp: str) -> None:
        Path(temp).write_bytes(b"half")
        raise OSError(28, "No space left on device")

    with pytest.raises(OSError, match="No space left"):
        atomic_write(target, half_then_fail)
    assert target.read_bytes() == b"old" and sorted(p.name for p in tmp_path.iterdir()) == ["manifest.json"]


def test_on_a_non_local_filesystem(tmp_path: Path) -> None:
    fs = pafs.SubTreeFileSystem(str(tmp_path), pafs.LocalFileSystem())
    atomic_write("sweep/run/rollouts.parquet", b"rows", fs)
    assert (tmp_path / "sweep" / "run" / "rollouts.parquet").read_bytes() == b"rows"
    assert sorted(p.name for p in (tmp_path / "sweep" / "run").iterdir()) == ["rollouts.parquet"]
