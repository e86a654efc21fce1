"""Servers inside the test process: any ASGI app in a uvicorn thread on a free loopback port
(`ServerThread`), and on it the gateway (`GatewayThread`) and the scripted model
(`ScriptedModelThread`), the in-process twins of what Services starts as child processes."""

from __future__ import annotations

import secrets
import threading
import time
from typing import Any

import uvicorn

from harness.gateway.app import create_app as create_gateway_app
from harness.gateway.models import GatewaySettings, Upstream
from harness.gateway.server import GatewayEndpoint, resolved
from harness.processes import ServiceHandle, free_port
from harness.scripted_model import DEFAULT_SCRIPT
from harness.scripted_server import ScriptedEndpoint, create_app as create_scripted_app, make_script


class ServerThread(ServiceHandle):
    """An ASGI app served by uvicorn in a daemon thread on a free loopback port."""

    def __init__(self, app: Any, *, name: str = "server"):
        self.app = app
        self.port = free_port()
        config = uvicorn.Config(app, host="127.0.0.1", port=self.port, log_level="warning", access_log=False,
                                timeout_graceful_shutdown=1)
        self._server = uvicorn.Server(config)
        self._thread = threading.Thread(target=self._server.run, name=f"{name}-{self.port}", daemon=True)

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.port}"

    def start(self) -> None:
        self._thread.start()
        deadline = time.monotonic() + 10.0
        while not self._server.started:
            if time.monotonic() > deadline or not self._thread.is_alive():
                raise RuntimeError(f"{self._thread.name}: server thread did not start")
            time.sleep(0.01)

    def stop(self) -> None:
        self._server.should_exit = True
        if self._thread.is_alive():
            self._thread.join(timeout=5.0)


class GatewayThread(GatewayEndpoint):
    """The gateway app in a thread of this process."""

    def __init__(self, settings: GatewaySettings, upstreams: list[Upstream] | None = None):
        self.settings = resolved(settings)
        self.admin_token = secrets.token_urlsafe(24)
        self.app = create_gateway_app(self.settings, admin_token=self.admin_token, upstreams=upstreams)
        self._thread = ServerThread(self.app, name="gateway")
        self.port = self._thread.port

    @property
    def gateway(self):  # type: ignore[no-untyped-def]
        return self.app.state.gateway

    def start(self) -> None:
        self._thread.start()

    def stop(self) -> None:
        self._thread.stop()


class ScriptedModelThread(ScriptedEndpoint):
    """The scripted model server in a thread of this process: faster for unit tests."""

    def __init__(self, script: str = DEFAULT_SCRIPT, replies: list[str] | None = None):
        self.script = make_script(script, replies)
        self._thread = ServerThread(create_scripted_app(self.script), name="scripted-model")
        self.port = self._thread.port

    def start(self) -> None:
        self._thread.start()

    def stop(self) -> None:
        self._thread.stop()
