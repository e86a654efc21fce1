"""The floor of any gateway on the harness's stack: a proxy that forwards each request to one
upstream and returns its answer, on the server and client the gateway uses (uvicorn, a raw
ASGI app, an aiohttp session), with none of the gateway's work (no attribution, ledger,
budget, limits, store or key handling). The gateway benchmark runs it as a third arm, so
that "gateway vs direct" splits into the cost of one more Python hop (this proxy vs direct)
and the gateway's own (the gateway vs this proxy), both measured in the same run.

    python -m benchmarks.perf.bare_proxy --port PORT --upstream http://127.0.0.1:UPSTREAM_PORT
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

import aiohttp
import uvicorn
from starlette.types import ASGIApp, Receive, Scope, Send

from harness.body_limit import read_body
from harness.processes import ManagedProcess, ProcessService, free_port, project_env

JSON_HEADERS = [(b"content-type", b"application/json")]


def create_app(upstream: str) -> ASGIApp:
    """The ASGI app: `/health` answers itself, every other request goes upstream unchanged
    (path, method and body) and its status and body come back."""
    session: aiohttp.ClientSession | None = None

    async def app(scope: Scope, receive: Receive, send: Send) -> None:
        nonlocal session
        if scope["type"] == "lifespan":
            while True:
                message = await receive()
                if message["type"] == "lifespan.startup":
                    session = aiohttp.ClientSession(connector=aiohttp.TCPConnector(limit=1024))
                    await send({"type": "lifespan.startup.complete"})
                elif message["type"] == "lifespan.shutdown":
                    if session is not None:
                        await session.close()
                    await send({"type": "lifespan.shutdown.complete"})
                    return
        if scope["type"] != "http":
            return
        if scope["path"] == "/health":
            status, content = 200, b'{"status": "ok"}'
        else:
            body = await read_body(receive)
            assert session is not None, "the session opens with the app's lifespan"
            async with session.request(scope["method"], upstream + scope["path"], data=body,
                                       headers={"content-type": "application/json"}) as answer:
                status, content = answer.status, await answer.read()
        await send({"type": "http.response.start", "status": status, "headers": JSON_HEADERS})
        await send({"type": "http.response.body", "body": content})

    return app


class BareProxy(ProcessService):
    """The proxy as a child process on a free loopback port."""

    def __init__(self, upstream: str, *, log_dir: Path):
        self.port = free_port()
        self._proc = ManagedProcess(
            "bare-proxy", [sys.executable, "-m", "benchmarks.perf.bare_proxy", "--port", str(self.port),
                           "--upstream", upstream],
            health_url=f"http://127.0.0.1:{self.port}/health", log_path=log_dir / f"bare-proxy-{self.port}.log",
            env=project_env(), startup_timeout_s=30.0)

    @property
    def base_url(self) -> str:
        return f"http://127.0.0.1:{self.port}/v1"


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(prog="python -m benchmarks.perf.bare_proxy", description=__doc__.splitlines()[0])
    parser.add_argument("--host", default="127.0.0.1")
    parser.add_argument("--port", type=int, required=True)
    parser.add_argument("--upstream", required=True, help="scheme, host and port of the upstream (no path)")
    args = parser.parse_args(argv)
    # the gateway's server settings (harness/gateway/server.py)
    uvicorn.run(create_app(args.upstream.rstrip("/")), host=args.host, port=args.port, log_level="warning",
                access_log=False, proxy_headers=False, lifespan="on")


if __name__ == "__main__":
    main()
