"""One writer per piece of evidence: an flock held for as long as a block runs, or until
the process dies (the kernel lets go then, so a killed writer never leaves a stale lock).
An flock holds among the processes of one host; a file system without flock gets no lock."""

from __future__ import annotations

import fcntl
import os
from collections.abc import Iterator
from contextlib import contextmanager

from harness.errors import HarnessError


@contextmanager
def held_alone(path: str, busy: str) -> Iterator[None]:
    """Hold `path` (a directory, or a file created empty if absent, never deleted: deleting
    a lock file lets two processes hold two files of one name) while the block runs; if
    another process holds it, HarnessError(`busy`) before the block starts. The descriptor
    is not inherited by child processes (os.open's default), so a model server or container
    started inside the block does not keep the lock after this process ends."""
    try:
        if os.path.isdir(path):
            fd = os.open(path, os.O_RDONLY | os.O_DIRECTORY)
        else:  # opened for writing: NFS emulates flock with fcntl locks, which need that
            fd = os.open(path, os.O_RDWR | os.O_CREAT, 0o644)
    except OSError as exc:
        raise HarnessError(f"cannot lock {path}: {exc.strerror or exc}") from exc
    try:
        try:
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            raise HarnessError(busy) from None
        except OSError:
            pass  # no flock here (e.g. some network file systems): unlocked, as on an object store
        yield
    finally:
        os.close(fd)  # releases the lock
