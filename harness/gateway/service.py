"""The gateway as one of the services `harness.services.Services` starts once per
machine: it starts the process on first use and registers each model endpoint with it
as an upstream, under a stable name (the cache keys on the name, not on a port)."""

from __future__ import annotations

import hashlib
import re
from pathlib import Path
from urllib.parse import urlparse

import httpx

from harness.gateway.models import GatewaySettings, Upstream, UsageTotals
from harness.gateway.server import GatewayServer
from harness.http_pool import tls_context
from harness.specs import ModelSpec

_UNSAFE = re.compile(r"[^A-Za-z0-9._-]+")


def upstream_name(spec: ModelSpec) -> str:
    """`local-<model>`, `scripted-<script>`, or `<host>-<hash of url and key variable>`:
    the same on every machine and run, so a recorded store replays anywhere."""
    if spec.provider in ("local", "scripted"):
        name = f"{spec.provider}-{spec.source or spec.model}"
    else:
        host = urlparse(spec.base_url or "").hostname or "upstream"
        digest = hashlib.sha256(f"{(spec.base_url or '').rstrip('/')}|{spec.api_key_env or ''}".encode()).hexdigest()
        name = f"{host}-{digest[:8]}"
    name = _UNSAFE.sub("_", name).strip("_") or "upstream"
    if len(name) > 64:  # e.g. a GGUF path as the local model's source
        name = f"{name[:48]}-{hashlib.sha256(name.encode()).hexdigest()[:12]}"
    return name


def upstream_for(spec: ModelSpec, base_url: str) -> Upstream:
    return Upstream(name=upstream_name(spec), base_url=base_url.rstrip("/"), provider=spec.provider,
                    api_key_env=spec.api_key_env)


class GatewayService:
    def __init__(self, settings: GatewaySettings, log_dir: Path):
        self.settings = settings
        self.log_dir = log_dir
        self._server: GatewayServer | None = None
        self._registered: dict[str, Upstream] = {}
        self._ready = False

    def spawn(self) -> None:
        """Start the process (if not yet) without waiting: it boots while a container does."""
        if self._server is None:
            self._server = GatewayServer(self.settings, log_dir=self.log_dir)
            self._server.spawn()

    @property
    def url(self) -> str:
        self.spawn()
        assert self._server is not None
        if not self._ready:
            self._server.wait_ready()
            self._ready = True
        return self._server.url

    @property
    def admin_token(self) -> str:
        self.spawn()
        assert self._server is not None
        return self._server.admin_token

    def route(self, spec: ModelSpec, base_url: str) -> tuple[str, str]:
        """(upstream name, unattributed gateway URL) of a model endpoint, registered once."""
        upstream = upstream_for(spec, base_url)
        url = self.url
        if self._registered.get(upstream.name) != upstream:
            assert self._server is not None
            self._server.register(upstream)
            self._registered[upstream.name] = upstream
        return upstream.name, f"{url}/u/{upstream.name}/v1"

    def usage(self) -> UsageTotals | None:
        """Totals across every run so far (live usage); None if the gateway does not answer."""
        if self._server is None:
            return None
        try:
            answer = httpx.get(f"{self._server.url}/usage", timeout=2.0, verify=tls_context(),
                               headers=self._server.admin_headers)
            return UsageTotals.model_validate_json(answer.content)
        except (httpx.HTTPError, ValueError):
            return None

    def stop(self) -> None:
        if self._server is not None:
            self._server.stop()
            self._server, self._ready = None, False
