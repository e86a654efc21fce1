"""A sweep folder -> SweepPayload: one row per expected run (sweep.json's grid, else the run
folders) from its manifest alone, so the table of a large sweep reads no rollout table. A run
without a manifest is `missing`, or `failed` when the sweep index says so."""

from __future__ import annotations

import base64
from pathlib import Path
from typing import Any

import polars as pl

from harness.view.evidence import ViewError, run_manifest, sweep_runs
from harness.view.models import ReportChart, Score, SweepPayload, SweepRunRow

LEADING_AXES = ("container", "algorithm", "policy", "proposer")
CHART_TYPES = {".svg": "image/svg+xml", ".png": "image/png"}


def _index(sweep_dir: Path) -> dict[str, dict[str, Any]]:
    """index.parquet rows by run id: a run that failed before writing evidence is only there."""
    path = sweep_dir / "index.parquet"
    if not path.is_file():
        return {}
    try:
        frame = pl.read_parquet(path)
    except (OSError, pl.exceptions.PolarsError) as exc:
        raise ViewError(f"{path}: unreadable sweep index: {exc}") from exc
    return {row["run_id"]: row for row in frame.iter_rows(named=True)}


def _heldout(manifest: dict[str, Any]) -> dict[str, Score]:
    return {h["candidate_id"]: Score(mean=h.get("heldout_score"), n=h.get("heldout_n") or 0,
                                     errors=h.get("heldout_failed") or 0)
            for h in manifest.get("heldout") or [] if isinstance(h, dict) and "candidate_id" in h}


def _row(sweep_dir: Path, point: dict[str, str], index: dict[str, dict[str, Any]], page_dir: str) -> SweepRunRow:
    run_id = point["run_id"]
    axes = {k: v for k, v in point.items() if k != "run_id"}
    manifest = run_manifest(sweep_dir / run_id)
    if manifest is None:
        recorded = index.get(run_id) or {}
        failed = recorded.get("status") == "failed"  # as the report: no manifest is missing unless it failed
        return SweepRunRow(run_id=run_id, axes=axes, status="failed" if failed else "missing",
                           error=recorded.get("error"), seed_heldout=None, pick_heldout=None, best_heldout=None,
                           rollouts=recorded.get("rollouts"), heldout_rollouts=None,
                           failed_rollouts=recorded.get("failed_rollouts"), cost_usd=None,
                           wall_s=recorded.get("wall_s"), page=None)
    heldout = _heldout(manifest)
    scored = [s for s in heldout.values() if s.mean is not None]
    totals, timings = manifest.get("totals") or {}, manifest.get("timings") or {}
    return SweepRunRow(
        run_id=run_id, axes=axes, status=str(manifest.get("status") or "unknown"), error=manifest.get("error"),
        seed_heldout=heldout.get(manifest.get("seed_candidate_id")),
        pick_heldout=heldout.get(manifest.get("best_candidate_id")),
        best_heldout=max(scored, key=lambda s: s.mean or 0.0) if scored else None,
        rollouts=totals.get("rollouts"), heldout_rollouts=totals.get("heldout_rollouts"),
        failed_rollouts=totals.get("failed_rollouts"), cost_usd=totals.get("cost_usd"), wall_s=timings.get("wall_s"),
        page=f"{page_dir}/{run_id}.html")


def _charts(report_dir: Path) -> list[ReportChart]:
    """The report's charts, SVG where written (sharp at any zoom), else PNG, as data URIs."""
    if not report_dir.is_dir():
        return []
    chosen: dict[str, Path] = {}
    for path in sorted(report_dir.iterdir()):
        if path.suffix in CHART_TYPES and (path.stem not in chosen or path.suffix == ".svg"):
            chosen[path.stem] = path
    return [ReportChart(name=name, data_uri=f"data:{CHART_TYPES[path.suffix]};base64,"
                                            f"{base64.b64encode(path.read_bytes()).decode()}")
            for name, path in sorted(chosen.items())]


def _axes(points: list[dict[str, str]]) -> list[str]:
    names = {k for point in points for k in point if k != "run_id"}
    leading = [a for a in LEADING_AXES if a in names]
    return leading + sorted(names - set(leading) - {"seed"}) + (["seed"] if "seed" in names else [])


def build_sweep_payload(sweep_dir: Path, page_dir: str) -> SweepPayload:
    points = sweep_runs(sweep_dir)
    if not points:
        raise ViewError(f"{sweep_dir}: a sweep folder without any run (no sweep.json grid, no run folder with "
                        "manifest.json): nothing to view")
    index = _index(sweep_dir)
    summary_md = sweep_dir / "report" / "summary.md"
    return SweepPayload(sweep=sweep_dir.resolve().name, path=str(sweep_dir), axes=_axes(points),
                        runs=[_row(sweep_dir, point, index, page_dir) for point in points],
                        charts=_charts(sweep_dir / "report"),
                        summary_md=summary_md.read_text() if summary_md.is_file() else None)
