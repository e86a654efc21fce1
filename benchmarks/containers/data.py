"""Resolve a container's dataset file: a local copy if given, else a pinned download.

Downloads are verified against a sha256 pin so every run scores against the same bytes,
and written atomically so a crash never leaves a half file that looks valid.
"""

from __future__ import annotations

import hashlib
import os
import tempfile
from pathlib import Path

import httpx

from harness.errors import HarnessError

_CHUNK = 1 << 16


class DatasetError(HarnessError):
    """A dataset file cannot be found, downloaded or verified."""


def cache_root() -> Path:
    """`$XDG_CACHE_HOME/gepa-harness/datasets` (default `~/.cache/...`)."""
    base = os.environ.get("XDG_CACHE_HOME") or str(Path.home() / ".cache")
    return Path(base) / "gepa-harness" / "datasets"


def sha256_of(path: Path) -> str:
    digest = hashlib.sha256()
    with open(path, "rb") as handle:
        for chunk in iter(lambda: handle.read(_CHUNK), b""):
            digest.update(chunk)
    return digest.hexdigest()


def dataset_file(
    data_dir: str | None,
    dataset: str,
    filename: str,
    url: str,
    sha256: str,
    *,
    timeout_s: float = 60.0,
) -> Path:
    """Path of `<dataset>/<filename>`: from `data_dir` if present there, else from the
    download cache (fetched from `url` and checked against `sha256` when missing)."""
    if data_dir:
        local = Path(data_dir).expanduser() / dataset / filename
        if local.is_file():
            # A user-supplied copy is trusted as is (it may be a deliberate variant).
            return local
    target = cache_root() / dataset / filename
    if target.is_file() and sha256_of(target) == sha256:
        return target
    _download(url, target, sha256, label=f"{dataset}/{filename}", timeout_s=timeout_s)
    return target


def _download(url: str, target: Path, sha256: str, *, label: str, timeout_s: float) -> None:
    target.parent.mkdir(parents=True, exist_ok=True)
    # The temp file lives next to the target so the final rename is atomic (same filesystem).
    fd, tmp_name = tempfile.mkstemp(prefix=f".{target.name}.", suffix=".part", dir=target.parent)
    tmp = Path(tmp_name)
    digest = hashlib.sha256()
    try:
        with os.fdopen(fd, "wb") as out:
            try:
                with httpx.stream("GET", url, timeout=timeout_s, follow_redirects=True) as response:
                    if response.status_code != 200:
                        raise DatasetError(f"cannot download {label}: HTTP {response.status_code} from {url}")
                    for chunk in response.iter_bytes(_CHUNK):
                        digest.update(chunk)
                        out.write(chunk)
            except httpx.HTTPError as exc:
                raise DatasetError(f"cannot download {label} from {url}: {type(exc).__name__}: {exc}") from exc
        got = digest.hexdigest()
        if got != sha256:
            raise DatasetError(
                f"checksum mismatch for {label} from {url}: expected sha256 {sha256}, got {got}; refusing it"
            )
        os.replace(tmp, target)
    finally:
        tmp.unlink(missing_ok=True)
