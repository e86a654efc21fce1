"""Content-addressed response store: (upstream, endpoint, model, request body, sample
index) -> response body, in SQLite.

WAL mode lets many readers and one writer at a time work without blocking each other,
across threads and processes (every gateway, test or benchmark on the machine may share
one file); `INSERT OR IGNORE` makes concurrent writers of the same digest harmless (the
first write wins, and any write is a valid sample). One connection per thread: sqlite3
connections must not be shared across threads."""

from __future__ import annotations

import hashlib
import json
import sqlite3
import threading
import time
from pathlib import Path
from typing import Any

# Fields that do not change what the model answers; left out of the digest so a replay
# still matches when a client adds them.
VOLATILE_FIELDS = frozenset({"user", "metadata", "store", "stream_options", "service_tier"})

_SCHEMA = """
CREATE TABLE IF NOT EXISTS responses (
    digest TEXT PRIMARY KEY,
    upstream TEXT NOT NULL,
    endpoint TEXT NOT NULL,
    model TEXT,
    body BLOB NOT NULL,
    created_at REAL NOT NULL
) WITHOUT ROWID
"""


def canonical_json(value: Any) -> str:
    return json.dumps(value, sort_keys=True, separators=(",", ":"), ensure_ascii=False)


def request_digest(upstream: str, endpoint: str, model: str | None, body: dict[str, Any] | None) -> str:
    """Digest of a request without its sample index (the key of the per-scope counters)."""
    stable = {k: v for k, v in (body or {}).items() if k not in VOLATILE_FIELDS}
    text = canonical_json({"upstream": upstream, "endpoint": endpoint, "model": model, "body": stable})
    return hashlib.sha256(text.encode()).hexdigest()


def sample_digest(base: str, sample_index: int) -> str:
    """The store key: the k-th identical request in a scope is a different sample."""
    return hashlib.sha256(f"{base}:{sample_index}".encode()).hexdigest()


class ResponseStore:
    def __init__(self, path: str | Path, *, busy_timeout_s: float = 60.0):
        self.path = Path(path)
        self.path.parent.mkdir(parents=True, exist_ok=True)
        self.busy_timeout_s = busy_timeout_s
        self._local = threading.local()
        conn = self._conn()
        # WAL is a property of the file: set once, every later connection uses it
        conn.execute("PRAGMA journal_mode=WAL")
        conn.execute(_SCHEMA)

    def _conn(self) -> sqlite3.Connection:
        conn = getattr(self._local, "conn", None)
        if conn is None:
            # autocommit: each statement is its own short transaction
            conn = sqlite3.connect(self.path, timeout=self.busy_timeout_s, isolation_level=None)
            conn.execute(f"PRAGMA busy_timeout={int(self.busy_timeout_s * 1000)}")
            conn.execute("PRAGMA synchronous=NORMAL")  # WAL + NORMAL: durable at checkpoints, no fsync per put
            self._local.conn = conn
        return conn

    def get(self, digest: str) -> bytes | None:
        row = self._conn().execute("SELECT body FROM responses WHERE digest = ?", (digest,)).fetchone()
        return None if row is None else bytes(row[0])

    def put(self, digest: str, *, upstream: str, endpoint: str, model: str | None, body: bytes) -> bool:
        """Store a response; False if the digest was already there (kept as it was)."""
        cursor = self._conn().execute(
            "INSERT OR IGNORE INTO responses (digest, upstream, endpoint, model, body, created_at) "
            "VALUES (?, ?, ?, ?, ?, ?)", (digest, upstream, endpoint, model, body, time.time()))
        return cursor.rowcount == 1

    def count(self) -> int:
        return int(self._conn().execute("SELECT COUNT(*) FROM responses").fetchone()[0])

    def close(self) -> None:
        conn = getattr(self._local, "conn", None)
        if conn is not None:
            conn.close()
            self._local.conn = None
