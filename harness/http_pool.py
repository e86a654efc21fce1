"""httpx clients handed out one per call in flight, each with a single connection.

httpx's shared connection pool does work per request that grows with the requests waiting
in it; at a few dozen calls in flight that, not the server, set the rate (the overhead
benchmark measured a run at 0.4 of what a bare loop with a connection per worker got).
A stack of single-connection clients keeps each call's cost flat and reuses warm
connections (last in, first out)."""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from typing import Any

import httpx


class ClientPerCall:
    def __init__(self, timeout_s: float):
        self._timeout_s = timeout_s
        self._idle: list[httpx.AsyncClient] = []
        self._all: list[httpx.AsyncClient] = []
        self._tls: Any = None

    @asynccontextmanager
    async def client(self) -> AsyncIterator[httpx.AsyncClient]:
        http = self._idle.pop() if self._idle else self._new()
        try:
            yield http
        finally:
            self._idle.append(http)

    def _new(self) -> httpx.AsyncClient:
        if self._tls is None:
            self._tls = httpx.create_ssl_context()  # loading the CA bundle takes ~50 ms: once per pool
        limits = httpx.Limits(max_connections=1, max_keepalive_connections=1)
        http = httpx.AsyncClient(timeout=self._timeout_s, limits=limits, verify=self._tls)
        self._all.append(http)
        return http

    async def aclose(self) -> None:
        await asyncio.gather(*(http.aclose() for http in self._all))
        self._all.clear()
        self._idle.clear()
