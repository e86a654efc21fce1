"""Containers and model servers, started once per machine and shared by every run."""

from __future__ import annotations

import os
import sys
import threading
from pathlib import Path

from pydantic import BaseModel, ConfigDict, Field

from harness.container_keeper import RestartHook, RestartOutcome
from harness.errors import ConfigError, PreflightError
from harness.gateway.models import GatewaySettings
from harness.gateway.service import GatewayService
from harness.processes import ManagedProcess, free_port
from harness.specs import ContainerSpec, ModelSpec


# What a container started here inherits from the harness's environment: what running a
# program needs (paths, locale, caches), never a variable that could hold a credential
# (provider and cloud keys of any name, proxies with passwords, the gateway's admin token).
CONTAINER_ENV = frozenset({
    "PATH", "HOME", "USER", "LOGNAME", "SHELL", "LANG", "LANGUAGE", "TZ", "TMPDIR", "TEMP", "TMP", "TERM",
    "PYTHONPATH", "PYTHONHASHSEED", "PYTHONUNBUFFERED", "PYTHONDONTWRITEBYTECODE", "PYTHONIOENCODING", "VIRTUAL_ENV",
    "SSL_CERT_FILE", "SSL_CERT_DIR", "XDG_CACHE_HOME", "XDG_DATA_HOME", "HF_HOME", "HF_DATASETS_CACHE",
    "HF_HUB_OFFLINE", "HF_DATASETS_OFFLINE", "NODE_PATH", "GEPA_HARNESS_CACHE", "HARNESS_MAX_BODY_BYTES",
})


def container_env(spec: ContainerSpec, environ: dict[str, str] | None = None) -> dict[str, str]:
    """The allow-listed environment of a container: the basics, `LC_*`, and the variables its
    config names (its key, its policy key when it calls the policy itself, `env`, a variable
    its command names, e.g. a direct grader's `--grader-key-env NAME`)."""
    named = {spec.api_key_env, spec.policy_key_env, *spec.env, *(spec.command or ())} - {None}
    source = os.environ if environ is None else environ
    return {k: v for k, v in source.items() if k in CONTAINER_ENV or k.startswith("LC_") or k in named}


class NodePlace(BaseModel):
    """The Ray node whose service set a run uses (on a cluster; None on one machine)."""

    model_config = ConfigDict(frozen=True)
    node_id: str
    host: str

    @property
    def label(self) -> str:
        return f"{self.host}-{self.node_id[:8]}"


class ModelServer(BaseModel):
    """A model server this harness started, as a run's manifest records it."""

    model_config = ConfigDict(frozen=True)
    model: str
    url: str
    build: str  # e.g. `llama.cpp-<recipe>, version: ...`: another build answers differently


class Endpoints(BaseModel):
    """Where one run's container and models answer."""

    model_config = ConfigDict(frozen=True)
    container_url: str
    policy_url: str
    proposer_url: str
    # set when model calls go through the inference gateway (harness/gateway)
    gateway_url: str | None = None
    policy_upstream: str | None = None
    proposer_upstream: str | None = None
    # log files of the services this run uses (listed in its manifest)
    logs: tuple[str, ...] = ()
    model_servers: tuple[ModelServer, ...] = ()  # the ones started here (none for hosted models)
    # the gateway's admin token, for the run's control calls (driver and Ray workers only;
    # never in a container's environment, a policy block or evidence)
    gateway_token: str | None = Field(default=None, repr=False)
    node: NodePlace | None = None

    def limit_key(self, url: str) -> str:
        """The sweep limiter's key of one of these URLs: two nodes' loopback URLs are
        different services even when they read the same."""
        return f"{self.node.node_id}|{url}" if self.node is not None else url


class LocalServerOptions(BaseModel):
    model_config = ConfigDict(frozen=True, extra="forbid")
    slots: int = 1
    ctx_per_slot: int = 4096
    threads: int | None = None
    chat_template: str | None = None


class Services:
    """Starts what runs need, once, keyed by what identifies the service; stops all on close."""

    def __init__(self, log_dir: Path, local_server: LocalServerOptions | None = None, max_restarts: int = 3,
                 gateway: GatewaySettings | None = None, label: str | None = None):
        self.log_dir = log_dir
        # names container logs (`<label>-container-<name>.log`): a run id for one run, a sweep name
        # None or disabled: containers and the proposer call the model endpoints directly
        self.gateway = GatewayService(gateway, log_dir) if gateway is not None and gateway.enabled else None
        self.local_server = local_server or LocalServerOptions()
        # restarts per container over this object's life: a container that keeps dying fails its runs
        self.max_restarts = max_restarts
        self._containers: dict[tuple, tuple[ManagedProcess | None, str]] = {}
        self._models: dict[tuple, tuple[object | None, str, str]] = {}  # server, url, build
        self._restarts: dict[str, int] = {}
        self._restart_lock = threading.Lock()
        # a restart under way on another thread (the sweep driver's) starts nothing after close
        self._spawn_lock = threading.Lock()
        self._closing = False
        self.label = label

    def container_url(self, spec: ContainerSpec) -> str:
        key = (spec.name, tuple(spec.command or ()), spec.url, spec.data_dir, spec.api_key_env, spec.policy_key_env,
               spec.port_via)
        if key not in self._containers:
            self._containers[key] = self._start_container(spec)
        return self._containers[key][1]

    def logs_for(self, *urls: str) -> tuple[str, ...]:
        """Log files of the started services answering at `urls` (attached ones have none)."""
        found = [str(p.log_path) for p, u in self._containers.values() if p is not None and u in urls]
        for server, url, _ in self._models.values():
            log_path = getattr(server, "log_path", None)
            if log_path is not None and url in urls:
                found.append(str(log_path))
        return tuple(found)

    def servers_for(self, *urls: str) -> tuple[ModelServer, ...]:
        """The model servers started here that answer at `urls`, with their builds."""
        return tuple(ModelServer(model=model, url=url, build=build)
                     for (_, model), (_, url, build) in self._models.items() if url in urls)

    def _start_container(self, spec: ContainerSpec) -> tuple[ManagedProcess | None, str]:
        if not spec.command:
            return None, (spec.url or "").rstrip("/")
        port = free_port()
        # `python` means this harness's interpreter, so a container runs with the harness's packages
        command = [sys.executable if part == "python" else part for part in spec.command]
        if spec.port_via == "args":
            command += ["--host", "127.0.0.1", "--port", str(port)]
            if spec.data_dir:
                command += ["--data-dir", spec.data_dir]
            if spec.api_key_env:
                command += ["--api-key-env", spec.api_key_env]
            if spec.policy_key_env:
                command += ["--policy-key-env", spec.policy_key_env]
        env = {"PORT": str(port), "HOST": "127.0.0.1", **({"HARNESS_DATA_DIR": spec.data_dir} if spec.data_dir else {})}
        url = f"http://127.0.0.1:{port}"
        name = f"{self.label}-container-{spec.name}" if self.label else f"container-{spec.name}"
        log_path = self.log_dir / f"{name}.log"
        if any(p is not None and p.log_path == log_path for p, _ in self._containers.values()):
            log_path = self.log_dir / f"{name}-{port}.log"  # another instance (other options) of the same container
        process = ManagedProcess(
            f"container {spec.name}", command, health_url=f"{url}/health", env={**container_env(spec), **env},
            log_path=log_path, startup_timeout_s=spec.startup_timeout_s, inherit_env=False,
        )
        process.start()
        return process, url

    def revive(self, url: str) -> bool:
        """Start the container serving `url` again, on the same port, if its process has
        died or hangs (nothing to do when it answers); True when it started a new process.
        Raises PreflightError when it cannot: attached rather than started here, restarted
        too often, or it fails to start."""
        found = [(p, key[0]) for key, (p, u) in self._containers.items() if u == url]
        if not found:
            raise PreflightError(f"no container at {url} was started by this harness: cannot restart it")
        process, name = found[0]
        if process is None:
            raise PreflightError(f"container {name} at {url} is attached, not started by the harness: "
                                 "cannot restart it")
        with self._restart_lock:
            if process.alive():
                # busy is not dead: a live process (e.g. one just restarted, taking every run's
                # retries at once) gets as long to answer as a starting one before it is replaced,
                # or the rollouts it holds fail with it
                try:
                    process.wait_ready()
                    return False
                except PreflightError:
                    pass  # it exited meanwhile, or answered nothing in that time (and was stopped)
            with self._spawn_lock:  # close() waits for a spawn under way, then none comes after it
                if self._closing:
                    raise PreflightError(f"container {name} at {url}: the services are stopping, not restarting it")
                done = self._restarts.get(url, 0)
                if done >= self.max_restarts:
                    raise PreflightError(f"container {name} at {url} died again after {done} restart(s): "
                                         "not restarting it")
                self._restarts[url] = done + 1
                process.stop()
                process.spawn()  # same command, same port: every run's url stays valid
            process.wait_ready()  # a close meanwhile stops it, and this ends at once
            return True

    def restarts(self) -> dict[str, int]:
        """Restarts so far, per container url."""
        return dict(self._restarts)

    def restarter(self, url: str) -> RestartHook | None:
        """The hook a run in this process calls when its container stops answering; None
        for a container attached by url, which the harness cannot start again."""
        if not any(p is not None and u == url for p, u in self._containers.values()):
            return None

        async def restart() -> bool:
            # on this thread, not a worker thread: a child's parent-death signal fires when the
            # thread that started it exits, and the executor's threads end with the event loop
            return RestartOutcome.of(self.revive, url).restarted_or_raise()

        return restart

    def model_url(self, spec: ModelSpec) -> str:
        if spec.provider == "openai_compatible":
            return (spec.base_url or "").rstrip("/")
        key = (spec.provider, spec.source or spec.model)
        if key not in self._models:
            self._models[key] = self._start_model(spec)
        return self._models[key][1]

    def _start_model(self, spec: ModelSpec) -> tuple[object, str, str]:
        if spec.provider == "local":
            from harness.local_model import LocalModelServer, LocalServerSettings

            settings = LocalServerSettings(model=spec.source or spec.model, **self.local_server.model_dump())
            local = LocalModelServer(settings, log_dir=self.log_dir)
            local.start()
            return local, local.base_url, local.build()
        if spec.provider == "scripted":
            from harness.scripted_server import ScriptedModelServer

            scripted = ScriptedModelServer(script=spec.source or "rules", log_dir=self.log_dir)
            scripted.start()
            return scripted, scripted.base_url, f"harness.scripted_server, script {scripted.script}"
        raise ConfigError(f"unknown model provider {spec.provider!r}")

    def endpoints(self, container: ContainerSpec, policy: ModelSpec, proposer: ModelSpec) -> Endpoints:
        if self.gateway is not None:
            return self._gateway_endpoints(container, policy, proposer)
        if container.command and policy.api_key_env and not container.policy_key_env:
            # a container we start calls the policy itself: hand it the name of the policy's key variable
            container = container.model_copy(update={"policy_key_env": policy.api_key_env})
        urls = (self.container_url(container), self.model_url(policy), self.model_url(proposer))
        return Endpoints(container_url=urls[0], policy_url=urls[1], proposer_url=urls[2], logs=self.logs_for(*urls),
                         model_servers=self.servers_for(*urls))

    def _gateway_endpoints(self, container: ContainerSpec, policy: ModelSpec, proposer: ModelSpec) -> Endpoints:
        """Every model call through the gateway, which holds the keys: the container gets
        neither a key nor the name of its variable."""
        assert self.gateway is not None
        self.gateway.spawn()
        container_url = self.container_url(container)
        model_urls = (self.model_url(policy), self.model_url(proposer))
        policy_upstream, policy_url = self.gateway.route(policy, model_urls[0])
        proposer_upstream, proposer_url = self.gateway.route(proposer, model_urls[1])
        return Endpoints(container_url=container_url, policy_url=policy_url, proposer_url=proposer_url,
                         gateway_url=self.gateway.url, policy_upstream=policy_upstream,
                         proposer_upstream=proposer_upstream, gateway_token=self.gateway.admin_token,
                         logs=self.logs_for(container_url, *model_urls), model_servers=self.servers_for(*model_urls))

    def close(self) -> None:
        with self._spawn_lock:
            self._closing = True
        for process, _ in self._containers.values():
            if process is not None:
                process.stop()
        for server, _, _ in self._models.values():
            stop = getattr(server, "stop", None)
            if stop is not None:
                stop()
        self._containers.clear()
        self._models.clear()
        if self.gateway is not None:
            self.gateway.stop()

    def __enter__(self) -> "Services":
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()
