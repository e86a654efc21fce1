"""Evidence folder -> pages. A run folder gives one page; a sweep folder gives its runs table
and one page per finished run beside it (`runs/<run_id>.html`, each self-contained, linked
both ways). Every run is checked before the first page is written."""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

from harness.view.charts import lineage_spec, trace_spec
from harness.view.evidence import (
    VIEW_DIR,
    RunEvidence,
    Target,
    ViewError,
    check_run,
    load_run,
    locate,
    run_manifest,
    sweep_runs,
)
from harness.view.page import is_view_page, render, write_page
from harness.view.run_payload import build_run_payload
from harness.view.sweep_payload import build_sweep_payload

RUN_PAGES = "runs"


@dataclass(frozen=True)
class Written:
    index: Path  # the page to open
    pages: int
    bytes: int


def default_output(target: Target) -> Path:
    return target.path / VIEW_DIR / "index.html"


def run_page(evidence: RunEvidence, sweep_link: str | None = None) -> str:
    payload = build_run_payload(evidence, sweep_link=sweep_link)
    generations = max((c.generation for c in payload.candidates), default=0)
    charts = {"lineage": lineage_spec(len(payload.candidates), generations), "trace": trace_spec()}
    return render("run.html.j2", payload, title=f"Run {payload.summary.run_id} · {payload.summary.container or ''}",
                  scripts=["common.js", "run.js"], vega=True, charts=charts)


def _check_runs(sweep_dir: Path) -> list[str]:
    """Finished runs of the sweep (those with a manifest), each readable and unchanged."""
    finished = []
    for point in sweep_runs(sweep_dir):
        if run_manifest(sweep_dir / point["run_id"]) is not None:
            check_run(sweep_dir / point["run_id"])  # raises on a bad file: before anything is written
            finished.append(point["run_id"])
    return finished


def build(path: str | Path, out: str | Path | None = None) -> Written:
    target = locate(path)
    index = Path(out) if out is not None else default_output(target)
    if index.suffix.lower() not in (".html", ".htm"):
        raise ViewError(f"--out {index}: expected an .html file name")
    if target.kind == "run":
        html = run_page(load_run(target.path))
        write_page(index, html)
        return Written(index=index, pages=1, bytes=len(html.encode()))
    finished = _check_runs(target.path)
    payload = build_sweep_payload(target.path, page_dir=RUN_PAGES)  # checked whole before any page is written
    run_dir = index.parent / RUN_PAGES
    total = 0
    for run_id in finished:
        html = run_page(load_run(target.path / run_id), sweep_link=f"../{index.name}")
        write_page(run_dir / f"{run_id}.html", html)
        total += len(html.encode())
    # a run that left the sweep (or lost its manifest) keeps no page; other files are not ours to remove
    stale = [p for p in run_dir.glob("*.html") if p.stem not in set(finished) and is_view_page(p)]
    for page in stale:
        page.unlink()
    html = render("sweep.html.j2", payload, title=f"Sweep {payload.sweep}", scripts=["common.js", "sweep.js"],
                  vega=False)
    write_page(index, html)
    return Written(index=index, pages=len(finished) + 1, bytes=total + len(html.encode()))
