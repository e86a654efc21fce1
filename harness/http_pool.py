"""httpx clients handed out one per call in flight, each with a single connection.

httpx's shared connection pool does work per request that grows with the requests waiting
in it; at a few dozen calls in flight that, not the server, set the rate (the overhead
benchmark measured a run at 0.4 of what a bare loop with a connection per worker got).
A stack of single-connection clients keeps each call's cost flat and reuses warm
connections (last in, first out)."""

from __future__ import annotations

import asyncio
import functools
import ssl
import urllib.parse
import urllib.request
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager

import httpx


@functools.cache
def tls_context() -> ssl.SSLContext:
    """One verifying TLS context per process: loading the CA bundle takes ~50 ms, and a run
    builds several clients (a short sweep run spent a third of its CPU on it)."""
    return httpx.create_ssl_context()


def env_proxy(url: str) -> str | None:
    """The proxy the environment names for `url` (HTTP(S)_PROXY, NO_PROXY), read once per
    URL as an httpx client reads it once when created; aiohttp's own `trust_env` reads it on
    every call and would also send ~/.netrc credentials. A proxy URL's own `user:password@`
    is used as the proxy's credentials."""
    parts = urllib.parse.urlsplit(url)
    if urllib.request.proxy_bypass_environment(parts.hostname or ""):
        return None
    return urllib.request.getproxies_environment().get(parts.scheme)


class ClientPerCall:
    def __init__(self, timeout_s: float):
        self._timeout_s = timeout_s
        self._idle: list[httpx.AsyncClient] = []
        self._all: list[httpx.AsyncClient] = []

    @asynccontextmanager
    async def client(self) -> AsyncIterator[httpx.AsyncClient]:
        http = self._idle.pop() if self._idle else self._new()
        try:
            yield http
        finally:
            self._idle.append(http)

    def _new(self) -> httpx.AsyncClient:
        limits = httpx.Limits(max_connections=1, max_keepalive_connections=1)
        http = httpx.AsyncClient(timeout=self._timeout_s, limits=limits, verify=tls_context())
        self._all.append(http)
        return http

    def __len__(self) -> int:
        """Clients opened so far: the most calls that were in flight at once."""
        return len(self._all)

    async def aclose(self) -> None:
        await asyncio.gather(*(http.aclose() for http in self._all))
        self._all.clear()
        self._idle.clear()
