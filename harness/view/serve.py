"""`--serve`: the page's folder over HTTP on loopback only (the page needs no server; this is
for opening it from another tab or machine through a tunnel). Only that folder is served."""

from __future__ import annotations

import functools
import http.server
from pathlib import Path

from harness.view.evidence import ViewError


class _QuietHandler(http.server.SimpleHTTPRequestHandler):
    def log_message(self, format: str, *args: object) -> None:  # noqa: A002 - the stdlib's name
        pass


def make_server(folder: Path, port: int) -> http.server.ThreadingHTTPServer:
    handler = functools.partial(_QuietHandler, directory=str(folder))
    try:
        return http.server.ThreadingHTTPServer(("127.0.0.1", port), handler)
    except OSError as exc:
        raise ViewError(f"cannot serve on 127.0.0.1:{port}: {exc.strerror or exc} (choose another --port, or 0 "
                        "for any free port)") from exc
