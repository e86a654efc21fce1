"""Helpers shared by the fault-injection tests (test_faults_*.py, test_security.py,
test_soak.py): the chaos container's spec, small scripted runs, and the evidence checks
that every fault test ends with (every rollout row present exactly once)."""

from __future__ import annotations

import json
import re
from collections import Counter
from pathlib import Path
from typing import Any

import httpx
import pyarrow.parquet as pq

from conftest import make_run_spec, run_cli
from harness.evidence.schema import TABLES
from harness.specs import ContainerSpec, RunSpec

TRAIN = [f"train:{i}" for i in range(8)]
PARETO = [f"train:{i}" for i in range(8, 12)]
HELDOUT = ["test:0", "test:1", "test:2", "test:3"]
TABLE_NAMES = tuple(TABLES)  # every table the evidence schema defines
_INJECTED = re.compile(r"^chaos: injected (?P<kind>\S+) rollout=(?P<rollout>\S+) attempt=(?P<attempt>\d+)$")


def chaos_spec(data_dir: Path | str, *flags: str, timeout_s: float = 2.0, **fields: Any) -> ContainerSpec:
    """The chaos container (Banking77 behind a fault injector) started by the harness with `flags`."""
    return ContainerSpec(name="chaos", command=["python", "-m", "benchmarks.containers.chaos", *flags],
                         data_dir=str(data_dir), target_modules=["stage2_system"], request_timeout_s=timeout_s,
                         **fields)


def small_spec(container: ContainerSpec, root: Path | str, *, budget: int = 30, seed: int = 0,
               params: dict[str, Any] | None = None, **kwargs: Any) -> RunSpec:
    """A small GEPA run (8 train, 4 pareto, 4 heldout rows) with scripted models."""
    return make_run_spec(container, root, train=TRAIN, pareto=PARETO, heldout=HELDOUT, max_rollouts=budget,
                         seed=seed, params={"minibatch_size": 3, **(params or {})}, **kwargs)


def check_rows_exactly_once(run_dir: Path | str) -> dict[str, Any]:
    """A finished run's evidence is whole: a manifest, every table readable, every rollout
    row once (unique ids, seq 0..n-1 without a gap), totals that match the rows. Returns
    the manifest and the tables as lists of dicts."""
    run_dir = Path(run_dir)
    assert sorted(p.name for p in run_dir.iterdir()) == sorted(
        [f"{t}.parquet" for t in TABLE_NAMES] + ["manifest.json"]), f"{run_dir}: stray or missing files"
    manifest = json.loads((run_dir / "manifest.json").read_text())
    out: dict[str, Any] = {"manifest": manifest}
    for name in TABLE_NAMES:
        out[name] = pq.read_table(run_dir / f"{name}.parquet").to_pylist()
    rollouts = out["rollouts"]
    ids = [r["rollout_id"] for r in rollouts]
    assert len(ids) == len(set(ids)), f"{run_dir.name}: a rollout row appears twice"
    assert sorted(r["seq"] for r in rollouts) == list(range(len(rollouts))), f"{run_dir.name}: a rollout row is missing"
    assert {r["run_id"] for r in rollouts} <= {manifest["run_id"]}
    totals = manifest["totals"]
    assert len(rollouts) == totals["rollouts"] + totals["heldout_rollouts"]
    assert sum(r["status"] != "ok" for r in rollouts) == totals["failed_rollouts"]
    for row in rollouts:
        if row["status"] != "ok":  # a failed rollout: recorded with its error and no reward (never a zero)
            assert row["error"] and row["error_kind"] and row["reward"] is None, row
    return out


def injected_faults(log_text: str) -> list[dict[str, str]]:
    """The chaos container's log lines `chaos: injected KIND rollout=ID attempt=K`, parsed."""
    return [m.groupdict() for line in log_text.splitlines() if (m := _INJECTED.match(line.strip()))]


def count_kinds(faults: list[dict[str, str]]) -> Counter[str]:
    return Counter(f["kind"] for f in faults)


def stats(url: str) -> dict[str, Any]:
    """The chaos container's own counters (its pid, requests served)."""
    return httpx.get(f"{url}/chaos/stats", timeout=5).json()


def container_log(services: Any, url: str) -> Path:
    """The log file Services writes for the container it started at `url`."""
    (path,) = services.logs_for(url)
    return Path(path)


def text_of(path: Path) -> str:
    """A file as text for a secret scan: Parquet cells decoded (pages may be compressed)."""
    raw = path.read_bytes()
    if path.suffix == ".parquet" and raw[:4] == b"PAR1":
        table = pq.read_table(path)
        return json.dumps(table.to_pylist(), default=str, ensure_ascii=False) + str(table.schema.metadata)
    return raw.decode("utf-8", errors="replace")


def assert_no_secret(roots: list[Path], *secrets: str, texts: tuple[str, ...] = ()) -> int:
    """No secret in any file under `roots` (raw bytes and decoded Parquet) nor in `texts`.
    Returns how many files were scanned."""
    scanned = 0
    for root in roots:
        for path in sorted(p for p in root.rglob("*") if p.is_file()):
            raw, text = path.read_bytes(), text_of(path)
            for secret in secrets:
                assert secret.encode() not in raw and secret not in text, f"{secret[:6]}... leaked into {path}"
            scanned += 1
    for text in texts:
        for secret in secrets:
            assert secret not in text, f"{secret[:6]}... leaked into output: {text[:200]}"
    return scanned


def small_cli_run(evidence: Path, data_dir: Path | str, *overrides: str) -> dict[str, Any]:
    """`python -m harness` with scripted models on a small run (24 rollouts; 8 train, 4
    pareto, 4 heldout rows) and `overrides`: it must succeed; returns its evidence, checked
    by check_rows_exactly_once."""
    result = run_cli("models=scripted", *overrides, f"evidence_root={evidence}", f"data_dir={data_dir}",
                     "budget.max_rollouts=24", "pools.train.count=8", "pools.pareto.count=4", "pools.heldout.count=4",
                     timeout=240)
    assert result.returncode == 0, result.stdout[-3000:]
    (run_dir,) = [p.parent for p in evidence.rglob("manifest.json")]
    return check_rows_exactly_once(run_dir)
