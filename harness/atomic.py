"""The one atomic write: a file is replaced whole or not at all, on local disk or an object
store (a pyarrow filesystem), so a reader or a crash never sees half of it."""

from __future__ import annotations

import uuid
from collections.abc import Callable
from contextlib import suppress
from pathlib import Path

import pyarrow.fs as pafs


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
    temp = f"{directory}/.{name}.{uuid.uuid4().hex}.tmp"
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
