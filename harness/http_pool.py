"""The HTTP client of the harness's async paths (rollouts, model calls, the gateway's control
calls): one aiohttp session per client, shared by its copies, with the environment's proxy
read once per host and one verifying TLS context per process.

httpx's shared pool does work per request that grows with the requests waiting in it, and
even with a single-connection client per call in flight its client costs about five times
aiohttp's CPU per call (benchmarks.perf.overhead's two bare loops)."""

from __future__ import annotations

import functools
import ssl
import urllib.parse
import urllib.request

import aiohttp
import httpx


@functools.cache
def tls_context() -> ssl.SSLContext:
    """One verifying TLS context per process: loading the CA bundle takes ~50 ms, and a run
    builds several clients (a short sweep run spent a third of its CPU on it)."""
    return httpx.create_ssl_context()


def transport_failure(exc: Exception) -> tuple[str, bool]:
    """(the failure's name in errors and evidence, whether the process behind the URL is gone:
    nothing accepts the connection, or it closed one without answering). The names are the
    ones evidence has always used (httpx's), whichever client library raised."""
    if isinstance(exc, TimeoutError):
        return "ReadTimeout", False
    if isinstance(exc, aiohttp.ClientConnectorError):
        return "ConnectError", True
    if isinstance(exc, (aiohttp.ServerDisconnectedError, aiohttp.ClientPayloadError)):
        return "RemoteProtocolError", True
    if isinstance(exc, aiohttp.ClientOSError):
        return "ReadError", True
    return type(exc).__name__, False


def env_proxy(url: str) -> str | None:
    """The proxy the environment names for `url` (HTTP(S)_PROXY, NO_PROXY), read once per
    URL as an httpx client reads it once when created; aiohttp's own `trust_env` reads it on
    every call and would also send ~/.netrc credentials. A proxy URL's own `user:password@`
    is used as the proxy's credentials."""
    parts = urllib.parse.urlsplit(url)
    if urllib.request.proxy_bypass_environment(parts.hostname or ""):
        return None
    return urllib.request.getproxies_environment().get(parts.scheme)


class SharedSession:
    """One aiohttp session for a client and every copy of it (or for all of a container's
    rollouts), opened on first use on the running loop. aiohttp, not httpx, on the hot paths
    (rollouts, model calls): its C parser and flat pool cost a fifth of httpx's client CPU
    per call (0.4 against 2.2 ms per rollout at 64 in flight, benchmarks.perf.overhead's
    bare loops). Timeouts as httpx's were: timeout_s to connect and between reads."""

    def __init__(self, timeout_s: float):
        self._timeout_s = timeout_s
        self._session: aiohttp.ClientSession | None = None
        self._proxies: dict[tuple[str, str], str | None] = {}

    def get(self) -> aiohttp.ClientSession:
        if self._session is None or self._session.closed:
            timeout = aiohttp.ClientTimeout(total=None, sock_connect=self._timeout_s, sock_read=self._timeout_s)
            connector = aiohttp.TCPConnector(limit=0, ssl=tls_context())  # callers bound their calls
            self._session = aiohttp.ClientSession(connector=connector, timeout=timeout)
            # retries are the caller's retry policy's alone: aiohttp would resend a GET dropped
            # mid-call once by itself, and hide that the process behind it went away
            self._session._retry_connection = False
        return self._session

    async def send(self, method: str, url: str, data: bytes | str | None = None,
                   headers: dict[str, str] | None = None) -> tuple[int, bytes, str | None]:
        """(status, body, Retry-After) of one request, redirects not followed; aiohttp's
        TimeoutError and ClientError go to the caller (transport_failure names them)."""
        async with self.get().request(method, url, data=data, headers=headers, proxy=self.proxy_for(url),
                                      allow_redirects=False) as response:
            return response.status, await response.read(), response.headers.get("retry-after")

    def proxy_for(self, url: str) -> str | None:
        """env_proxy, once per scheme and host: model calls go to a new URL per rollout."""
        parts = urllib.parse.urlsplit(url)
        key = (parts.scheme, parts.netloc)
        if key not in self._proxies:
            self._proxies[key] = env_proxy(url)
        return self._proxies[key]

    async def aclose(self) -> None:
        if self._session is not None:
            await self._session.close()
            self._session = None
