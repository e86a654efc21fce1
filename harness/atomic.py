"""The one atomic write: a file is replaced whole or not at all, on local disk or an object
store (a pyarrow filesystem), so a reader or a crash never sees half of it."""

from __future__ import annotations

import uuid
from collections.abc import Callable, Iterable
from contextlib import suppress
from pathlib import Path

import pyarrow.fs as pafs


def drop_dead_temporaries(directory: str, names: Iterable[str], fs: pafs.FileSystem | None = None) -> None:
    """Delete the temporaries (`.<file>.<id>.tmp`) a process killed inside atomic_write left
    beside the files `names` of `directory`. Only for a caller that knows no write of those
    files is live (a sweep driver that holds its folder, a run about to load its checkpoint)."""
    fs = fs or pafs.LocalFileSystem()
    try:
        entries = fs.get_file_info(pafs.FileSelector(directory, allow_not_found=True))
    except OSError:
        return
    for entry in entries:
        if entry.type == pafs.FileType.File and is_temporary_of(entry.base_name, names):
            with suppress(OSError):
                fs.delete_file(entry.path)


def is_temporary_of(base_name: str, names: Iterable[str]) -> bool:
    """Whether `base_name` is an atomic_write temporary of one of the files `names`."""
    return base_name.endswith(".tmp") and base_name.startswith(tuple(f".{name}." for name in names))


def atomic_write(path: str | Path, content: bytes | Callable[[str], None],
                 fs: pafs.FileSystem | None = None) -> None:
    """Write `content` (bytes, or a function that writes the file at the path it is given)
    to a temporary file beside `path`, then move it over `path`. Raises OSError (a full disk,
    a missing permission) with the temporary file removed and `path` as it was. `fs`
    defaults to the local disk."""
    fs = fs or pafs.LocalFileSystem()
    target = str(Path(path).absolute()) if isinstance(fs, pafs.LocalFileSystem) else str(path)
    directory, _, name = target.rpartition("/")
    # a name of its own per write: two writers of one file never share a temporary
    temp = f"{directory}/.{name}.{uuid.uuid4().hex}.tmp"  # drop_dead_temporaries knows this name
    try:
        fs.create_dir(directory, recursive=True)
        if isinstance(content, bytes):
            with fs.open_output_stream(temp) as stream:
                stream.write(content)
        else:
            content(temp)
        fs.move(temp, target)
    except BaseException:
        with suppress(OSError):
            fs.delete_file(temp)
        raise
