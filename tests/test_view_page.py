"""The page as a person uses it: a real scripted sweep (`python -m harness +sweep=smoke
models=scripted`), then `python -m harness view`, then the pages opened in headless Chromium
(Debian's package, driven by Playwright): the runs table, the lineage graph, a diff and the
heldout filters render with the counts the evidence has, and the console stays clean.
Every wait is on an explicit selector (the page marks what it rendered in body[data-ready])."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import polars as pl
import pyarrow.parquet as pq
import pytest

from benchmarks.view.browser import chromium_path
from benchmarks.view.synthetic import RunShape, write_run
from harness.evidence.schema import TABLES
from harness.evidence.writer import EvidenceLocation

REPO = Path(__file__).resolve().parents[1]
RUN_MARKS = ("lineage", "trace", "tables")
HOSTILE = "</script><script>window.pwned = 1</script><img src=x onerror='window.pwned = 2'>"

pytestmark = pytest.mark.timeout(600)


def view(path: Path) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", "harness", "view", str(path)], cwd=REPO, capture_output=True,
                          text=True, timeout=300)


@pytest.fixture(scope="module")
def smoke_sweep(tmp_path_factory: pytest.TempPathFactory, data_dir: Path) -> Path:
    evidence = tmp_path_factory.mktemp("view-page") / "evidence"
    env = {k: v for k, v in os.environ.items() if not k.startswith("RAY_")}  # a fresh local Ray
    env.update(HARNESS_DATA_DIR=str(data_dir), COLUMNS="200")
    done = subprocess.run([sys.executable, "-m", "harness", "+sweep=smoke", "models=scripted",
                           f"evidence_root={evidence}"], cwd=REPO, env=env, capture_output=True, text=True,
                          timeout=400, start_new_session=True)
    assert done.returncode == 0, done.stdout[-3000:] + done.stderr[-3000:]
    return evidence / "smoke"


@pytest.fixture(scope="module")
def browser() -> Iterator[Any]:
    executable = chromium_path()
    if executable is None:
        pytest.skip("no Chromium on this machine: `apt-get install chromium` (.ci/setup installs it)")
    from playwright.sync_api import sync_playwright

    with sync_playwright() as playwright:
        launched = playwright.chromium.launch(executable_path=executable)
        yield launched
        launched.close()


class Opened:
    """A page with its console errors collected from the first script on."""

    def __init__(self, browser: Any, path: Path, marks: tuple[str, ...]):
        self.errors: list[str] = []
        self.page = browser.new_page(viewport={"width": 1400, "height": 900})
        self.page.on("console", lambda m: self.errors.append(m.text) if m.type == "error" else None)
        self.page.on("pageerror", lambda e: self.errors.append(str(e)))
        self.page.goto(path.as_uri())
        for mark in marks:
            self.page.wait_for_selector(f"body[data-ready~='{mark}']", state="attached", timeout=60_000)

    def count(self, selector: str) -> int:
        return self.page.locator(selector).count()


def test_sweep_page_lists_every_run_with_the_report_charts(smoke_sweep, browser, tmp_path):
    result = view(smoke_sweep)
    assert result.returncode == 0, result.stderr
    assert result.stdout.startswith(f"wrote {smoke_sweep / 'view' / 'index.html'} (5 pages")
    grid = json.loads((smoke_sweep / "sweep.json").read_text())["grid"]
    opened = Opened(browser, smoke_sweep / "view" / "index.html", ("runs",))
    try:
        assert opened.count("#runs tbody tr") == len(grid) == 4
        links = opened.page.locator("#runs tbody a").evaluate_all("els => els.map(e => e.getAttribute('href'))")
        assert sorted(links) == sorted(f"runs/{g['run_id']}.html" for g in grid)
        assert all((smoke_sweep / "view" / link).is_file() for link in links)
        charts = {p.stem for p in (smoke_sweep / "report").iterdir() if p.suffix in (".svg", ".png")}
        assert charts and opened.count("#charts figure img") == len(charts)
        opened.page.wait_for_function("[...document.querySelectorAll('#charts img')].every(i => i.complete)")
        assert opened.page.evaluate("[...document.querySelectorAll('#charts img')].every(i => i.naturalWidth > 0)")
        headers = opened.page.locator("#runs thead th").all_inner_texts()
        for column in ("container", "seed", "status", "seed heldout", "pick heldout", "rollouts", "cost", "wall"):
            assert column in headers
        opened.page.screenshot(path=str(tmp_path / "sweep.png"), full_page=True)
        opened.page.locator("#runs tbody a").first.click()  # the link opens the run's page
        opened.page.wait_for_selector("body[data-ready~='tables']", state="attached", timeout=60_000)
        assert opened.page.locator("#crumbs a").get_attribute("href") == "../index.html"
        assert opened.errors == []
    finally:
        opened.page.close()


def test_run_page_shows_lineage_diff_and_heldout_rows(smoke_sweep, browser, tmp_path):
    if not (smoke_sweep / "view" / "runs").is_dir():
        assert view(smoke_sweep).returncode == 0
    runs = {p.parent.name: pl.read_parquet(p) for p in smoke_sweep.glob("*/candidates.parquet")}
    manifests = {r: json.loads((smoke_sweep / r / "manifest.json").read_text()) for r in runs}
    # a run whose pick is not the seed (the A/B filter has rows to find), with the most candidates
    run_id = max(sorted(runs), key=lambda r: (manifests[r]["best_candidate_id"] != manifests[r]["seed_candidate_id"],
                                              runs[r].height))
    candidates = runs[run_id].sort("index")
    manifest = manifests[run_id]
    proposals = pl.read_parquet(smoke_sweep / run_id / "proposals.parquet")
    heldout = pl.read_parquet(smoke_sweep / run_id / "rollouts.parquet").filter(pl.col("stage") == "heldout")
    assert candidates.height >= 2, "the smoke run proposes at least one child"

    opened = Opened(browser, smoke_sweep / "view" / "runs" / f"{run_id}.html", RUN_MARKS)
    try:
        page = opened.page
        assert opened.count("#lineage .mark-symbol.role-mark path") == candidates.height  # one node per candidate
        edges = sum(len(p) for p in candidates["parent_ids"].to_list())
        assert opened.count("#lineage .mark-line.role-mark path") == edges
        assert opened.count("#candidates tbody tr") == candidates.height
        assert opened.count("#proposals tbody tr") == proposals.height
        assert opened.count("#trace .mark-symbol.role-mark path") > 0
        # click the last candidate's node in the graph: its diff against its parent renders
        child = candidates.row(-1, named=True)
        page.locator("#lineage .mark-symbol.role-mark path").nth(candidates.height - 1).click()
        page.wait_for_selector(f"#detail-title:has-text('Candidate {child['candidate_id']}')")
        diff = page.locator("#detail-body table.diff").first
        module = next(iter(json.loads(child["modules_json"])))
        assert diff.locator("th.diff_header").all_inner_texts() == [f"{child['parent_ids'][0]} · {module}",
                                                                      f"{child['candidate_id']} · {module}"]
        assert diff.locator(".diff_add, .diff_chg").count() > 0
        assert opened.count("#detail-body .proposal") == 1
        # heldout rows: one per heldout task; A solves / B misses as the evidence says
        assert opened.count("#rows tbody tr") == heldout["task_id"].n_unique()
        threshold = 1.0
        rewards = heldout.filter(pl.col("status") == "ok").pivot("candidate_id", index="task_id", values="reward")
        pick, seed = manifest["best_candidate_id"], manifest["seed_candidate_id"]
        expected = rewards.filter((pl.col(pick) >= threshold) & (pl.col(seed) < threshold)).height
        assert expected > 0
        page.select_option("#pick-a", pick)
        page.select_option("#pick-b", seed)
        page.select_option("#row-filter", "a-not-b")
        page.wait_for_function(f"document.querySelectorAll('#rows tbody tr').length === {expected}")
        assert page.locator("#row-count").inner_text().startswith(f"{expected} of {expected} matching rows")
        page.screenshot(path=str(tmp_path / "run.png"), full_page=True)
        assert opened.errors == []
    finally:
        opened.page.close()


def _rewrite(run_dir: Path, edit: Any) -> None:
    """Rewrite a run's tables through the writer after `edit(table, rows)`, with a fresh manifest."""
    location = EvidenceLocation(str(run_dir.parent.parent), run_dir.parent.name, run_dir.name)
    for name in TABLES:
        rows = pq.read_table(run_dir / f"{name}.parquet").to_pylist()
        edit(name, rows)
        location.write_table(name, rows)
    manifest = json.loads((run_dir / "manifest.json").read_text())
    location.write_manifest({k: v for k, v in manifest.items() if k not in ("files", "schema_version")})


def test_hostile_text_stays_text_and_error_rows_stay_errors(browser, tmp_path):
    run_dir = write_run(tmp_path, "hostile", "run0", RunShape(rollouts=300, heldout_rows=20, heldout_candidates=2,
                                                              error_rate=0.1))

    def plant(table: str, rows: list[dict[str, Any]]) -> None:
        for row in rows:
            if table == "rollouts" and row["stage"] == "heldout" and row["status"] == "ok":
                row["output"], row["inputs"] = f"label {HOSTILE}", f"input {HOSTILE}"
            if table == "candidates" and row["index"] > 0:
                texts = json.loads(row["modules_json"])
                row["modules_json"] = json.dumps({k: f"{v}\n{HOSTILE}" for k, v in texts.items()})
            if table == "proposals" and row["proposer_replies"]:
                row["proposer_replies"] = [f"{HOSTILE}"]
    _rewrite(run_dir, plant)
    result = view(run_dir)
    assert result.returncode == 0, result.stderr
    opened = Opened(browser, run_dir / "view" / "index.html", RUN_MARKS)
    try:
        page = opened.page
        assert page.evaluate("window.pwned") is None
        assert HOSTILE in page.locator("#rows tbody").inner_text()  # shown as text
        assert HOSTILE in page.locator("#detail-body").inner_text()  # in the diff and the proposal's reply
        # error rows are errors, and the summary's means rest on the rewarded rows only
        rows = pl.read_parquet(run_dir / "rollouts.parquet").filter(pl.col("stage") == "heldout")
        errors = rows.filter(pl.col("status") != "ok")
        assert errors.height > 0
        page.select_option("#row-filter", "error")
        page.wait_for_function("document.getElementById('row-count').textContent.includes('matching')")
        assert opened.count("#rows tbody .badge.error") == errors.filter(
            pl.col("candidate_id").is_in([page.input_value("#pick-a"), page.input_value("#pick-b")])).height
        seed = json.loads((run_dir / "manifest.json").read_text())["seed_candidate_id"]
        seed_rows = rows.filter(pl.col("candidate_id") == seed)
        ok = seed_rows.filter(pl.col("status") == "ok")
        failed = seed_rows.height - ok.height
        shown = f"{ok['reward'].mean():.3f} ({ok.height} rows" + (f", {failed} error" if failed else ")")
        assert shown in page.locator("#summary").inner_text()
        assert opened.errors == []
    finally:
        opened.page.close()


def test_a_run_without_children_renders_its_one_node(browser, tmp_path):
    """A seed-only run: one node, no edge, no proposal; nothing on the console."""
    run_dir = write_run(tmp_path, "seed_only", "run0", RunShape(rollouts=30 + 20, heldout_rows=20,
                                                                heldout_candidates=1))
    assert view(run_dir).returncode == 0
    opened = Opened(browser, run_dir / "view" / "index.html", RUN_MARKS)
    try:
        assert opened.count("#lineage .mark-symbol.role-mark path") == 1
        assert opened.count("#proposals tbody tr") == 0 and opened.count("#rows tbody tr") == 20
        assert opened.page.locator("#detail-title").inner_text().startswith("Candidate c0000")
        assert opened.errors == []
    finally:
        opened.page.close()
