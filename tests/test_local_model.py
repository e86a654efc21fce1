"""GGUF assembly/verification through the real code path (with a fake part set), and the
real llama-server with the 0.5B built-in model (slow)."""

from __future__ import annotations

import asyncio
import hashlib
import importlib.util
import uuid
from pathlib import Path

import pytest

from harness import local_model
from harness.errors import ConfigError
from harness.llm import ChatClient, ChatMessage
from harness.local_model import (
    BUILTIN_MODELS,
    BuiltinModel,
    LocalModelServer,
    LocalServerSettings,
    ensure_gguf,
    find_llama_server,
)

PART_SIZES = (1000, 4096, 7)


def make_parts(root: Path, parts: tuple[int, ...] = PART_SIZES, *, sha256: str | None = None) -> tuple[BuiltinModel, bytes]:
    """Fake part packages on sys.path whose __init__ fails if anything imports it."""
    prefix = f"fakegguf_{uuid.uuid4().hex[:8]}_part"
    blob = b""
    for i, size in enumerate(parts, start=1):
        data = bytes((i * 31 + j) % 251 for j in range(size))
        pkg = root / f"{prefix}{i}"
        (pkg / "data").mkdir(parents=True)
        (pkg / "__init__.py").write_text("raise RuntimeError('part packages must not be imported')\n")
        (pkg / "data" / f"part{i:02d}.bin").write_bytes(data)
        blob += data
    model = BuiltinModel(
        name="fake-model", package_prefix=prefix, parts=len(parts), size=len(blob),
        sha256=sha256 or hashlib.sha256(blob).hexdigest(), upstream="test",
    )
    return model, blob


@pytest.fixture
def parts_dir(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    root = tmp_path / "site"
    root.mkdir()
    monkeypatch.syspath_prepend(str(root))
    return root


def test_assembles_verifies_and_reuses_without_rehash(parts_dir: Path, tmp_path: Path, monkeypatch) -> None:
    model, blob = make_parts(parts_dir)
    cache = tmp_path / "cache"
    path = ensure_gguf("fake-model", cache, registry={"fake-model": model})
    assert path == cache / "models" / "fake-model.gguf"
    assert path.read_bytes() == blob
    assert local_model._sidecar_sha(path) == model.sha256
    assert sorted(p.name for p in path.parent.iterdir() if not p.name.startswith(".fake-model.lock")) == [
        "fake-model.gguf", "fake-model.gguf.json"]

    def boom(*_: object) -> None:
        raise AssertionError("must not rehash or reassemble a verified file")

    monkeypatch.setattr(local_model, "_sha256_file", boom)
    monkeypatch.setattr(local_model, "_assemble", boom)
    assert ensure_gguf("fake-model", cache, registry={"fake-model": model}) == path


def test_cache_from_environment(parts_dir: Path, tmp_path: Path, monkeypatch) -> None:
    model, _ = make_parts(parts_dir)
    monkeypatch.setenv("GEPA_HARNESS_CACHE", str(tmp_path / "envcache"))
    assert ensure_gguf("fake-model", registry={"fake-model": model}).parent == tmp_path / "envcache" / "models"


def test_sha_mismatch_is_refused_and_temp_removed(parts_dir: Path, tmp_path: Path) -> None:
    model, _ = make_parts(parts_dir, sha256="0" * 64)
    cache = tmp_path / "cache"
    with pytest.raises(ConfigError, match="sha256") as info:
        ensure_gguf("fake-model", cache, registry={"fake-model": model})
    assert "\n" not in str(info.value)
    leftovers = [p.name for p in (cache / "models").iterdir() if not p.name.endswith(".lock")]
    assert leftovers == []


def test_modified_file_is_rechecked_and_rebuilt(parts_dir: Path, tmp_path: Path) -> None:
    model, blob = make_parts(parts_dir)
    registry = {"fake-model": model}
    path = ensure_gguf("fake-model", tmp_path, registry=registry)
    path.write_bytes(b"x" * len(blob))  # same size, new mtime: sidecar no longer matches
    assert ensure_gguf("fake-model", tmp_path, registry=registry).read_bytes() == blob
    local_model._sidecar(path).unlink()  # no sidecar: rehash once and accept
    assert ensure_gguf("fake-model", tmp_path, registry=registry) == path
    assert local_model._sidecar_sha(path) == model.sha256


def test_missing_part_names_the_extra(parts_dir: Path, tmp_path: Path) -> None:
    model, _ = make_parts(parts_dir)
    broken = model.model_copy(update={"parts": 4})
    with pytest.raises(ConfigError, match=r"part 4/4 missing .*pip install -e \.\[local-models\]"):
        ensure_gguf("fake-model", tmp_path, registry={"fake-model": broken})


def test_path_and_unknown_refs(tmp_path: Path) -> None:
    gguf = tmp_path / "m.gguf"
    gguf.write_bytes(b"GGUF")
    assert ensure_gguf(str(gguf), tmp_path) == gguf
    with pytest.raises(ConfigError, match="unknown model"):
        ensure_gguf("no-such-model", tmp_path)
    with pytest.raises(ConfigError, match="hf:<owner>"):
        ensure_gguf("hf:just-a-name", tmp_path)


def test_installed_builtin_parts_have_the_pinned_size() -> None:
    for model in BUILTIN_MODELS.values():
        if importlib.util.find_spec(model.package(1)) is None:
            pytest.skip("local-models extra not installed")
        paths = [local_model._part_path(model, i) for i in range(1, model.parts + 1)]
        assert sum(p.stat().st_size for p in paths) == model.size


def test_find_llama_server_order_and_error(tmp_path: Path, monkeypatch) -> None:
    monkeypatch.setenv("PATH", str(tmp_path / "empty"))
    monkeypatch.delenv("LLAMA_SERVER_BIN", raising=False)
    with pytest.raises(ConfigError, match=r"bash \.ci/setup"):
        find_llama_server(tmp_path)
    source = local_model.llama_server_install_path(tmp_path, "source")
    prebuilt = local_model.llama_server_install_path(tmp_path, "prebuilt")
    assert local_model.llama_server_install_path(tmp_path) == prebuilt
    # each recipe its own folder, named by what it was built from: never mistaken for the other
    assert source.parent.parent.name == f"llama.cpp-{local_model.LLAMA_CPP_PYTHON_VERSION}-cpuflags-noamx"
    assert prebuilt.parent.parent != source.parent.parent
    assert local_model.NODE_LLAMA_CPP_VERSION in prebuilt.parent.parent.name
    with pytest.raises(ValueError):
        local_model.llama_server_install_path(tmp_path, "other")
    for cached in (source, prebuilt):  # the source build alone is found; the prebuilt one comes first
        cached.parent.mkdir(parents=True)
        cached.write_text("#!/bin/sh\n")
        cached.chmod(0o755)
        assert find_llama_server(tmp_path) == cached
    monkeypatch.setenv("LLAMA_SERVER_BIN", str(tmp_path / "missing"))
    with pytest.raises(ConfigError, match="LLAMA_SERVER_BIN"):
        find_llama_server(tmp_path)


def test_setup_scripts_pin_the_versions_the_harness_names() -> None:
    root = Path(__file__).resolve().parents[1]
    prebuilt = (root / ".ci" / "llama-server-prebuilt" / "install").read_text()
    assert f"NODE_LLAMA_CPP_VERSION={local_model.NODE_LLAMA_CPP_VERSION} " in prebuilt
    setup = (root / ".ci" / "setup").read_text()
    assert f"LLAMA_CPP_PYTHON_VERSION={local_model.LLAMA_CPP_PYTHON_VERSION} " in setup


def test_server_command_flags(tmp_path: Path) -> None:
    settings = LocalServerSettings(model="qwen2.5-coder-0.5b", slots=3, ctx_per_slot=1024, threads=2)
    with pytest.raises(Exception):
        settings.slots = 4  # type: ignore[misc]  # frozen
    cmd = LocalModelServer(settings, cache_dir=tmp_path).command(Path("/m.gguf"), Path("/bin/llama-server"))
    joined = " ".join(cmd)
    assert "-np 3" in joined and "-c 3072" in joined and "--threads 2" in joined and "--host 127.0.0.1" in joined
    assert "--chat-template" not in joined
    with_template = LocalServerSettings(model="x.gguf", chat_template="chatml")
    assert "--chat-template chatml" in " ".join(LocalModelServer(with_template).command(Path("/x"), Path("/y")))


@pytest.mark.slow
def test_real_llama_server_completes_with_small_model() -> None:
    try:
        find_llama_server()
    except ConfigError as exc:
        pytest.skip(f"llama-server binary absent: {exc}")
    settings = LocalServerSettings(model="qwen2.5-coder-0.5b", slots=1, ctx_per_slot=2048)

    async def ask(base_url: str, model: str):
        client = ChatClient(base_url, model, timeout_s=300.0)
        try:
            return await client.complete(
                [ChatMessage(role="system", content="Answer with one word."),
                 ChatMessage(role="user", content="What color is the sky on a clear day?")],
                max_tokens=16,
            )
        finally:
            await client.aclose()

    with LocalModelServer(settings) as server:
        result = asyncio.run(ask(server.base_url, server.model_name))
        build = server.build()
    assert result.text.strip()
    # the cache folder names the recipe (builds of two recipes print the same --version)
    assert build.startswith(("llama.cpp-", "/")) and ", version: " in build, build
    assert result.prompt_tokens > 0 and result.completion_tokens > 0
    assert not server.alive()


def test_chat_template_file_or_name(tmp_path: Path) -> None:
    template = tmp_path / "t.jinja"
    template.write_text("{{ messages }}")
    for value, flag in ((str(template), "--chat-template-file"), ("{% for m in messages %}\n{% endfor %}", "--chat-template")):
        cmd = LocalModelServer(LocalServerSettings(model="x.gguf", chat_template=value)).command(Path("/x"), Path("/y"))
        assert cmd[cmd.index(flag) + 1] in (str(template), value)
