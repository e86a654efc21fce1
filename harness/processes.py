"""Child services (containers, model servers): start on a free loopback port, wait until
healthy, and always stop them, including on Ctrl-C and errors."""

from __future__ import annotations

import os
import random
import signal
import socket
import subprocess
import sys
import time
from contextlib import suppress
from pathlib import Path
from typing import Self

import httpx

from harness.errors import PreflightError


def _exited(proc: subprocess.Popen) -> bool:
    """True once the service's main process has exited. Its process group (a wrapper's
    children) is killed when that is first seen, while the unreaped main process still
    holds the group's id: later, the id could name another process's group."""
    if proc.returncode is not None:
        return True
    try:
        gone = os.waitid(os.P_PID, proc.pid, os.WEXITED | os.WNOHANG | os.WNOWAIT) is not None
    except ChildProcessError:  # reaped already (a wait on another thread)
        return proc.poll() is not None
    if gone:
        with suppress(ProcessLookupError, PermissionError):
            os.killpg(proc.pid, signal.SIGKILL)
        proc.poll()
    return gone


def _die_with_parent() -> None:
    """Runs in the child before exec: ask Linux to SIGTERM it when the harness dies, even
    by SIGKILL, so no model server or container outlives the process that started it."""
    try:
        import ctypes

        ctypes.CDLL("libc.so.6", use_errno=True).prctl(1, signal.SIGTERM)  # PR_SET_PDEATHSIG
    except (OSError, AttributeError):
        pass


# Services listen below the kernel's ephemeral range: a port bind(0) hands out comes from the
# range outgoing connections draw their local ports from, and between this check and the
# service's own bind (or while a dead container's port waits for its restart) a run's many
# rollout connections could take it. From 20000: Ray's workers use 10002-19999.
_SERVICE_PORTS_FROM = 20000


def _ephemeral_ports_from() -> int:
    try:
        return int(Path("/proc/sys/net/ipv4/ip_local_port_range").read_text().split()[0])
    except (OSError, ValueError, IndexError):
        return 32768  # Linux's default


def free_port(host: str = "127.0.0.1") -> int:
    """A port nothing holds now, for a service to listen on."""
    ephemeral = _ephemeral_ports_from()
    if ephemeral - _SERVICE_PORTS_FROM >= 1000:
        for port in random.SystemRandom().sample(range(_SERVICE_PORTS_FROM, ephemeral), 64):  # not the seeded one
            with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as sock:
                try:
                    sock.bind((host, port))
                except OSError:
                    continue
                return port
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as sock:
        sock.bind((host, 0))
        return sock.getsockname()[1]


class ServiceHandle:
    """Something the harness starts and must always stop; usable as a context manager."""

    def start(self) -> None:
        raise NotImplementedError

    def stop(self) -> None:
        raise NotImplementedError

    def __enter__(self) -> Self:
        self.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self.stop()


class ManagedProcess(ServiceHandle):
    """One child process in its own process group, with its output in a log file."""

    def __init__(
        self,
        name: str,
        command: list[str],
        *,
        health_url: str,
        log_path: Path,
        env: dict[str, str] | None = None,
        cwd: str | None = None,
        startup_timeout_s: float = 120.0,
        unset_env: frozenset[str] = frozenset(),
        inherit_env: bool = True,
    ):
        self.name = name
        self.command = command
        self.health_url = health_url
        self.log_path = log_path
        self.env = env
        self.cwd = cwd
        self.startup_timeout_s = startup_timeout_s
        self.unset_env = unset_env  # variables the child must not inherit (keys it has no use for)
        self.inherit_env = inherit_env  # False: the child gets `env` only
        self._proc: subprocess.Popen | None = None

    @property
    def pid(self) -> int | None:
        return self._proc.pid if self._proc else None

    def alive(self) -> bool:
        return self._proc is not None and not _exited(self._proc)

    def start(self) -> None:
        self.spawn()
        self.wait_ready()

    def spawn(self) -> None:
        """Start the process without waiting for it (`wait_ready` waits): two services can
        then come up side by side, both still children of this thread."""
        self.log_path.parent.mkdir(parents=True, exist_ok=True)
        log = open(self.log_path, "ab")
        inherited = os.environ if self.inherit_env else {}
        env = {k: v for k, v in {**inherited, **(self.env or {})}.items() if k not in self.unset_env}
        try:
            self._proc = subprocess.Popen(
                self.command, stdout=log, stderr=subprocess.STDOUT, env=env, cwd=self.cwd,
                start_new_session=True, stdin=subprocess.DEVNULL,
                preexec_fn=_die_with_parent if sys.platform.startswith("linux") else None,
            )
        except OSError as exc:
            raise PreflightError(f"cannot start {self.name}: {exc}") from exc
        finally:
            log.close()

    def wait_ready(self) -> None:
        self._wait_healthy()

    def _wait_healthy(self) -> None:
        from harness.http_pool import tls_context  # aiohttp's import: not for every child that imports this

        deadline = time.monotonic() + self.startup_timeout_s
        while time.monotonic() < deadline:
            proc = self._proc  # once: another thread (the services closing) may stop it meanwhile
            if proc is None:
                raise PreflightError(f"{self.name} was stopped before it was ready")
            if _exited(proc):
                tail = self._log_tail()
                raise PreflightError(
                    f"{self.name} exited with code {proc.returncode} before it was ready "
                    f"(log {self.log_path}): {tail}"
                )
            try:
                if httpx.get(self.health_url, timeout=2.0, verify=tls_context()).status_code == 200:
                    return
            except httpx.HTTPError:
                pass
            time.sleep(0.2)
        self.stop()
        raise PreflightError(f"{self.name} not healthy at {self.health_url} after {self.startup_timeout_s:.0f}s")

    def _log_tail(self) -> str:
        try:
            lines = self.log_path.read_text(errors="replace").strip().splitlines()
        except OSError:
            return ""
        return lines[-1][:300] if lines else ""

    def stop(self, grace_s: float = 5.0) -> None:
        proc, self._proc = self._proc, None
        try:
            self._stop(proc, grace_s)
        finally:
            self._drop_empty_log()

    def _drop_empty_log(self) -> None:
        """A service that never wrote a line leaves no empty log file behind."""
        try:
            if self.log_path.stat().st_size == 0:
                self.log_path.unlink()
        except OSError:
            pass

    @staticmethod
    def _stop(proc: subprocess.Popen | None, grace_s: float) -> None:
        if proc is None or _exited(proc):
            return  # its group went when the main process was first seen gone
        try:
            os.killpg(proc.pid, signal.SIGTERM)
            proc.wait(timeout=grace_s)
        except (ProcessLookupError, PermissionError):
            pass
        except subprocess.TimeoutExpired:
            try:
                os.killpg(proc.pid, signal.SIGKILL)
            except ProcessLookupError:
                pass
            proc.wait(timeout=grace_s)


class ProcessService(ServiceHandle):
    """A service that is one ManagedProcess (`_proc`, set by the subclass): started,
    stopped and identified through it."""

    _proc: ManagedProcess

    @property
    def pid(self) -> int | None:
        return self._proc.pid

    @property
    def log_path(self) -> Path:
        return self._proc.log_path

    def start(self) -> None:
        self._proc.start()

    def spawn(self) -> None:
        self._proc.spawn()

    def wait_ready(self) -> None:
        self._proc.wait_ready()

    def stop(self) -> None:
        self._proc.stop()


def project_env() -> dict[str, str]:
    """PYTHONPATH for a child that runs `python -m` on a module of this project: it must
    import the project even where the project is not installed."""
    root = str(Path(__file__).resolve().parents[1])
    return {"PYTHONPATH": os.pathsep.join(filter(None, [root, os.environ.get("PYTHONPATH")]))}
