"""Object-store URIs (`s3://bucket/evidence?endpoint_override=...`): the one that opens a
folder again keeps the query (endpoint, region); the one shown to people drops it, since
pyarrow also takes keys there."""

from __future__ import annotations

import os
from urllib.parse import urlsplit, urlunsplit


def is_uri(path: str | os.PathLike[str]) -> bool:
    return "://" in str(path)


def shown(uri: str) -> str:
    """`uri` without its query or credentials: what a printed line or a log may hold. A local
    path has neither and comes back as it is."""
    if not is_uri(uri):
        return uri
    parts = urlsplit(uri)
    return f"{parts.scheme}://{parts.hostname or ''}{parts.path}"


def joined(uri: str, name: str) -> str:
    """`uri` one level down, its query kept."""
    parts = urlsplit(uri)
    return urlunsplit(parts._replace(path=f"{parts.path.rstrip('/')}/{name}"))
