"""Containers and model servers, started once per machine and shared by every run."""

from __future__ import annotations

import sys
from pathlib import Path

from pydantic import BaseModel, ConfigDict

from harness.errors import ConfigError
from harness.processes import ManagedProcess, free_port
from harness.specs import ContainerSpec, ModelSpec


class Endpoints(BaseModel):
    """Where one run's container and models answer."""

    model_config = ConfigDict(frozen=True)
    container_url: str
    policy_url: str
    proposer_url: str


class LocalServerOptions(BaseModel):
    model_config = ConfigDict(frozen=True, extra="forbid")
    slots: int = 1
    ctx_per_slot: int = 4096
    threads: int | None = None
    chat_template: str | None = None


class Services:
    """Starts what runs need, once, keyed by what identifies the service; stops all on close."""

    def __init__(self, log_dir: Path, local_server: LocalServerOptions | None = None):
        self.log_dir = log_dir
        self.local_server = local_server or LocalServerOptions()
        self._containers: dict[tuple, tuple[ManagedProcess | None, str]] = {}
        self._models: dict[tuple, tuple[object | None, str]] = {}

    def container_url(self, spec: ContainerSpec) -> str:
        key = (spec.name, tuple(spec.command or ()), spec.url, spec.data_dir, spec.api_key_env, spec.policy_key_env)
        if key not in self._containers:
            self._containers[key] = self._start_container(spec)
        return self._containers[key][1]

    def _start_container(self, spec: ContainerSpec) -> tuple[ManagedProcess | None, str]:
        if not spec.command:
            return None, (spec.url or "").rstrip("/")
        port = free_port()
        command = [sys.executable if part == "python" else part for part in spec.command]
        command += ["--host", "127.0.0.1", "--port", str(port)]
        if spec.data_dir:
            command += ["--data-dir", spec.data_dir]
        if spec.api_key_env:
            command += ["--api-key-env", spec.api_key_env]
        if spec.policy_key_env:
            command += ["--policy-key-env", spec.policy_key_env]
        url = f"http://127.0.0.1:{port}"
        process = ManagedProcess(
            f"container {spec.name}", command, health_url=f"{url}/health",
            log_path=self.log_dir / f"container-{spec.name}-{port}.log", startup_timeout_s=spec.startup_timeout_s,
        )
        process.start()
        return process, url

    def model_url(self, spec: ModelSpec) -> str:
        if spec.provider == "openai_compatible":
            return (spec.base_url or "").rstrip("/")
        key = (spec.provider, spec.source or spec.model)
        if key not in self._models:
            self._models[key] = self._start_model(spec)
        return self._models[key][1]

    def _start_model(self, spec: ModelSpec) -> tuple[object, str]:
        if spec.provider == "local":
            from harness.local_model import LocalModelServer, LocalServerSettings

            settings = LocalServerSettings(model=spec.source or spec.model, **self.local_server.model_dump())
            server = LocalModelServer(settings, log_dir=self.log_dir)
        elif spec.provider == "scripted":
            from harness.scripted_model import ScriptedModelServer

            server = ScriptedModelServer(script=spec.source or "rules", log_dir=self.log_dir)
        else:
            raise ConfigError(f"unknown model provider {spec.provider!r}")
        server.start()
        return server, server.base_url

    def endpoints(self, container: ContainerSpec, policy: ModelSpec, proposer: ModelSpec) -> Endpoints:
        if container.command and policy.api_key_env and not container.policy_key_env:
            # a container we start calls the policy itself: hand it the name of the policy's key variable
            container = container.model_copy(update={"policy_key_env": policy.api_key_env})
        return Endpoints(container_url=self.container_url(container), policy_url=self.model_url(policy),
                         proposer_url=self.model_url(proposer))

    def close(self) -> None:
        for process, _ in self._containers.values():
            if process is not None:
                process.stop()
        for server, _ in self._models.values():
            stop = getattr(server, "stop", None)
            if stop is not None:
                stop()
        self._containers.clear()
        self._models.clear()

    def __enter__(self) -> "Services":
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()
