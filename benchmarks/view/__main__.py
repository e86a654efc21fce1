"""Benchmark of `python -m harness view` at scale (not a test): synthetic evidence of a sweep
of 64 runs (with its report) and of one run of 5,000 rollouts, written with the harness's
writer; then the pages' build time, size, and load time in headless Chromium (navigation to
the page's own "ready" marks, median of several loads), and two interactions on the long
run's page (select a candidate: its diffs and proposal; filter the heldout rows).

    python -m benchmarks.view [--runs 64] [--rollouts-per-run 500] [--long-rollouts 5000] [--loads 3]
                              [--dir DIR] [--keep] [--quick] [--results-dir DIR]

Writes benchmarks/view/results/view.parquet (one row per measured page, with the machine
columns of benchmarks.perf) and summary.md."""

from __future__ import annotations

import argparse
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

import pyarrow.parquet as pq

from benchmarks.perf.common import write_results
from benchmarks.view.browser import chromium_path
from benchmarks.view.synthetic import RunShape, write_run, write_sweep

REPO = Path(__file__).resolve().parents[2]
RESULTS = Path(__file__).resolve().parent / "results"
READY = {"sweep": ("runs",), "run": ("tables", "lineage", "trace")}
MEASURE_CLICK = """async (selector) => {
  const started = performance.now();
  document.querySelector(selector).click();
  await new Promise((done) => requestAnimationFrame(() => setTimeout(done, 0)));
  return performance.now() - started;
}"""
MEASURE_FILTER = """async (value) => {
  const started = performance.now();
  const select = document.getElementById("row-filter");
  select.value = value;
  select.dispatchEvent(new Event("change"));
  await new Promise((done) => requestAnimationFrame(() => setTimeout(done, 0)));
  return performance.now() - started;
}"""


def build(path: Path) -> float:
    started = time.perf_counter()
    subprocess.run([sys.executable, "-m", "harness", "view", str(path)], cwd=REPO, check=True, capture_output=True)
    return time.perf_counter() - started


def load(browser: Any, page_path: Path, kind: str, loads: int) -> dict[str, Any]:
    """Median ms from navigation to each ready mark, and the page's console errors."""
    marks: dict[str, list[float]] = {m: [] for m in READY[kind]}
    errors: list[str] = []
    dom_nodes = 0
    for _ in range(loads):
        page = browser.new_page(viewport={"width": 1400, "height": 900})
        page.on("console", lambda m: errors.append(m.text) if m.type == "error" else None)
        page.on("pageerror", lambda e: errors.append(str(e)))
        page.goto(page_path.as_uri())
        for mark in READY[kind]:
            page.wait_for_selector(f"body[data-ready~='{mark}']", state="attached", timeout=120_000)
        timings = page.evaluate("window.viewTimings")
        for mark in READY[kind]:
            marks[mark].append(timings[mark])
        dom_nodes = page.evaluate("document.getElementsByTagName('*').length")
        page.close()
    return {**{f"ready_{m}_ms": statistics.median(v) for m, v in marks.items()},
            "load_ms": statistics.median([max(v) for v in zip(*marks.values())]), "dom_elements": dom_nodes,
            "console_errors": len(errors)}


def interactions(browser: Any, page_path: Path, loads: int) -> dict[str, float]:
    page = browser.new_page(viewport={"width": 1400, "height": 900})
    page.goto(page_path.as_uri())
    page.wait_for_selector("body[data-ready~='tables']", state="attached", timeout=120_000)
    rows = page.locator("#candidates tbody tr").count()
    select = [page.evaluate(MEASURE_CLICK, f"#candidates tbody tr:nth-child({1 + (i * 37) % rows})")
              for i in range(loads)]
    filters = [page.evaluate(MEASURE_FILTER, value) for value in ("a-not-b", "b-not-a", "all")]
    page.close()
    return {"select_candidate_ms": statistics.median(select), "filter_rows_ms": statistics.median(filters)}


def summary_markdown(rows: list[dict[str, Any]]) -> str:
    lines = ["# `python -m harness view` at scale", "",
             f"Measured {rows[0]['measured_at']} on {rows[0]['host']} ({rows[0]['cpus']} CPUs, load "
             f"{rows[0]['load_1m_when_written']:.1f}); headless Chromium, median of the loads.", "",
             "| page | evidence | page size | build (whole command) | load to ready | select a candidate | "
             "filter rows | console errors |", "|---|---|---|---|---|---|---|---|"]
    for row in rows:
        extra = (f"{row['select_candidate_ms']:.0f} ms", f"{row['filter_rows_ms']:.0f} ms") \
            if row.get("select_candidate_ms") is not None else ("", "")
        build_s = "" if row["build_s"] != row["build_s"] else f"{row['build_s']:.1f} s"  # NaN: built with the sweep
        size = f"{row['page_mib']:.2f} MiB" + (f" (+ {row['run_pages_total_mib']:.0f} MiB of run pages)"
                                               if row.get("run_pages_total_mib") else "")
        lines.append(f"| {row['page']} | {row['evidence']} | {size} | {build_s} | "
                     f"{row['load_ms']:.0f} ms | {extra[0]} | {extra[1]} | {row['console_errors']} |")
    return "\n".join(lines) + "\n"


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--runs", type=int, default=64)
    parser.add_argument("--rollouts-per-run", type=int, default=500)
    parser.add_argument("--long-rollouts", type=int, default=5000)
    parser.add_argument("--loads", type=int, default=3)
    parser.add_argument("--dir", type=Path, default=None, help="evidence root (default: a temp dir, deleted after)")
    parser.add_argument("--keep", action="store_true")
    parser.add_argument("--quick", action="store_true", help="8 runs, a 1,000-rollout run, one load: a smoke run")
    parser.add_argument("--results-dir", type=Path, default=RESULTS)
    args = parser.parse_args()
    if args.quick:
        args.runs, args.long_rollouts, args.loads = 8, 1000, 1
    executable = chromium_path()
    if executable is None:
        print("error: no chromium found (apt-get install chromium, or set HARNESS_CHROMIUM)", file=sys.stderr)
        return 2
    from playwright.sync_api import sync_playwright

    root = args.dir or Path(tempfile.mkdtemp(prefix="view_bench_"))
    try:
        sweep_dir = write_sweep(root, "sweep", args.runs, RunShape(rollouts=args.rollouts_per_run))
        from benchmarks.report import write_report

        write_report(str(sweep_dir))
        long_run = write_run(root, "long", "long", RunShape(rollouts=args.long_rollouts, heldout_rows=100,
                                                             heldout_candidates=8))
        print(f"evidence: {args.runs} runs x ~{args.rollouts_per_run} rollouts at {sweep_dir}; "
              f"one run of ~{args.long_rollouts} at {long_run}")
        sweep_build, long_build = build(sweep_dir), build(long_run)
        run_pages = sorted((sweep_dir / "view" / "runs").glob("*.html"))
        rows = []
        with sync_playwright() as playwright:
            browser = playwright.chromium.launch(executable_path=executable)
            measured = (("sweep index", f"{args.runs} runs + report", sweep_dir / "view" / "index.html", "sweep",
                         sweep_build),
                        ("sweep: one run's page", f"{args.rollouts_per_run} rollouts", run_pages[0], "run", None),
                        ("long run", f"{args.long_rollouts} rollouts", long_run / "view" / "index.html", "run",
                         long_build))
            for name, evidence, page, kind, build_s in measured:
                figures = load(browser, page, kind, args.loads)
                if name == "long run":
                    figures |= interactions(browser, page, args.loads)
                # every row has every column: the table's schema is read from its first row
                row = {"page": name, "evidence": evidence, "page_mib": page.stat().st_size / 2**20,
                       "build_s": build_s if build_s is not None else float("nan"), "select_candidate_ms": None,
                       "filter_rows_ms": None, "run_pages_total_mib": None, **figures}
                if kind == "sweep":
                    row["run_pages_total_mib"] = sum(p.stat().st_size for p in run_pages) / 2**20
                rows.append(row)
                print(f"{name:>22}: {row['page_mib']:.2f} MiB, load {row['load_ms']:.0f} ms, "
                      f"{row['dom_elements']} elements, {row['console_errors']} console errors"
                      + (f", build {build_s:.1f} s" if build_s else ""))
            browser.close()
        print(f"sweep view folder: {rows[0]['run_pages_total_mib']:.1f} MiB of run pages ({len(run_pages)} pages)")
        path = write_results("view", rows, args.results_dir)
        (args.results_dir / "summary.md").write_text(summary_markdown(pq.read_table(path).to_pylist()))
        print(f"results: {path}, {args.results_dir / 'summary.md'}")
    finally:
        if not args.dir and not args.keep:
            shutil.rmtree(root, ignore_errors=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
