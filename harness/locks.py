"""One writer per piece of evidence: an flock held for as long as a block runs, or until
the process dies (the kernel lets go then, so a killed writer never leaves a stale lock).
An flock holds among the processes of one host; a file system without flock gets no lock."""

from __future__ import annotations

import fcntl
import os
from collections.abc import Iterator
from contextlib import contextmanager, suppress

import pyarrow.fs as pafs

from harness.errors import HarnessError


@contextmanager
def held_in(fs: pafs.FileSystem, folder: str, busy: str, lock_file: str | None = None,
            shared: bool = False) -> Iterator[None]:
    """`folder` (created if absent), or its file `lock_file`, held by this process alone while
    the block runs, or `shared` with other sharers but no one alone (held_alone). Off the
    local disk (an object store) there is no lock."""
    if not isinstance(fs, pafs.LocalFileSystem):
        yield
        return
    try:
        fs.create_dir(folder, recursive=True)
    except OSError as exc:
        raise HarnessError(f"evidence directory {folder} is not writable: {exc}") from exc
    with held_alone(folder if lock_file is None else f"{folder}/{lock_file}", busy, shared):
        yield


@contextmanager
def held_alone(path: str, busy: str, shared: bool = False) -> Iterator[None]:
    """Hold `path` while the block runs: a directory, or a lock file created for the block
    and removed at its end (a killed holder leaves it, unlocked, for the next to take). If
    another process holds it, HarnessError(`busy`) before the block starts. `shared` (a directory
    only: a lock file goes when its holder lets go) lets other sharers hold it at once and
    keeps out whoever wants it alone. The descriptor is not inherited by child processes
    (os.open's default), so a model server or container started inside the block does not
    keep the lock after this process ends."""
    directory = os.path.isdir(path)
    if shared and not directory:
        raise ValueError(f"a shared lock is for a directory: {path}")
    fd = _take(path, busy, directory, shared)
    try:
        yield
    finally:
        if not directory:  # removed while still held: whoever opened it meanwhile sees that and starts over
            with suppress(OSError):
                os.unlink(path)
        os.close(fd)  # releases the lock


def _take(path: str, busy: str, directory: bool, shared: bool) -> int:
    while True:
        try:
            # a file is opened for writing: NFS emulates flock with fcntl locks, which need that
            fd = os.open(path, os.O_RDONLY | os.O_DIRECTORY) if directory else \
                os.open(path, os.O_RDWR | os.O_CREAT, 0o644)
        except OSError as exc:
            raise HarnessError(f"cannot lock {path}: {exc.strerror or exc}") from exc
        try:
            fcntl.flock(fd, (fcntl.LOCK_SH if shared else fcntl.LOCK_EX) | fcntl.LOCK_NB)
        except BlockingIOError:
            os.close(fd)
            raise HarnessError(busy) from None
        except OSError:
            return fd  # no flock here (e.g. some network file systems): unlocked, as on an object store
        if directory or _still_there(fd, path):
            return fd
        os.close(fd)  # the holder removed this file as it let go: take the one at `path` now


def _still_there(fd: int, path: str) -> bool:
    try:
        now = os.stat(path)
    except FileNotFoundError:
        return False
    held = os.fstat(fd)
    return (held.st_dev, held.st_ino) == (now.st_dev, now.st_ino)
