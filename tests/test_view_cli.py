"""`python -m harness view` without a browser: bad input is one line before anything is written,
--serve serves only the page's folder on loopback, and what the page says agrees with the
evidence (error rows counted apart and kept out of every mean, lineage, statuses). Evidence
here is synthetic, written with the harness's own writer (benchmarks/view/synthetic.py)."""

from __future__ import annotations

import json
import re
import shutil
import subprocess
import sys
from pathlib import Path

import httpx
import polars as pl
import pyarrow.parquet as pq
import pytest

from benchmarks.view.synthetic import RunShape, write_run, write_sweep
from harness.sweep.store import SweepStore
from harness.view.evidence import load_run
from harness.view.lineage import NodeIn, tree_positions
from harness.view.run_payload import build_run_payload
from harness.view.sweep_payload import build_sweep_payload

REPO = Path(__file__).resolve().parents[1]
SHAPE = RunShape(rollouts=400, heldout_rows=30, heldout_candidates=3, error_rate=0.05)


def view(*args: str | Path, timeout: float = 120) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", "harness", "view", *map(str, args)], cwd=REPO, capture_output=True,
                          text=True, timeout=timeout)


def assert_one_line_error(result: subprocess.CompletedProcess, *fragments: str) -> None:
    assert result.returncode == 2, result.stdout + result.stderr
    lines = result.stderr.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith("error: "), result.stderr
    for fragment in fragments:
        assert fragment in lines[0], lines[0]


@pytest.fixture(scope="module")
def synthetic_run(tmp_path_factory) -> Path:
    return write_run(tmp_path_factory.mktemp("view-cli"), "synthetic", "run0", SHAPE)


def test_a_missing_path_is_one_line(tmp_path):
    assert_one_line_error(view(tmp_path / "nope"), "no such file or directory")
    assert not (tmp_path / "nope").exists()


def test_a_folder_that_is_not_evidence_is_refused_before_writing(tmp_path):
    (tmp_path / "notes.txt").write_text("hello")
    assert_one_line_error(view(tmp_path), "not evidence", "manifest.json")
    assert not (tmp_path / "view").exists()
    assert_one_line_error(view(tmp_path / "notes.txt"), "not a folder")


def test_a_run_without_manifest_is_refused(tmp_path, synthetic_run):
    unfinished = tmp_path / "sweep" / "unfinished"
    unfinished.mkdir(parents=True)
    (unfinished / "rollouts.parquet").write_bytes((synthetic_run / "rollouts.parquet").read_bytes())
    assert_one_line_error(view(unfinished), "without manifest.json", "unfinished")
    assert not (unfinished / "view").exists()


def test_a_changed_table_is_refused_and_nothing_is_written(tmp_path):
    sweep = write_sweep(tmp_path, "tampered", 2, RunShape(rollouts=120, heldout_rows=10, heldout_candidates=2))
    table = sweep / "run0001" / "proposals.parquet"
    pq.write_table(pq.read_table(table).slice(1), table)  # a valid file of this schema, one row fewer
    assert_one_line_error(view(sweep), "run0001/proposals.parquet", "sha256")
    assert not (sweep / "view").exists()  # run0000 was fine, but no page is written for a sweep with a bad run


def test_a_sweep_lists_runs_without_evidence_as_missing_or_failed(tmp_path):
    sweep = write_sweep(tmp_path, "partial", 3, RunShape(rollouts=120, heldout_rows=10, heldout_candidates=2))
    shutil.rmtree(sweep / "run0001")  # never ran
    (sweep / "run0002" / "manifest.json").unlink()  # failed before its manifest; the index says so
    index = pq.read_table(sweep / "index.parquet").to_pylist()
    for row in index:
        if row["run_id"] == "run0002":
            row.update(status="failed", error="container exited")
    SweepStore(str(tmp_path), "partial").write_index(index)
    payload = build_sweep_payload(sweep, page_dir="runs")
    rows = {r.run_id: r for r in payload.runs}
    assert [r.run_id for r in payload.runs] == ["run0000", "run0001", "run0002"]
    assert (rows["run0000"].status, rows["run0001"].status, rows["run0002"].status) == ("done", "missing", "failed")
    assert rows["run0002"].error == "container exited" and rows["run0001"].page is None is rows["run0002"].page
    assert rows["run0001"].seed_heldout is None  # no score, not a zero
    result = view(sweep)
    assert result.returncode == 0 and "(2 pages" in result.stdout, result.stderr
    pages = sweep / "view" / "runs"
    assert sorted(p.name for p in pages.iterdir()) == ["run0000.html"]
    # a page of a run that left the sweep goes on the next build; a file that is not a view page stays
    shutil.copy(pages / "run0000.html", pages / "gone.html")
    (pages / "mine.html").write_text("<html>notes</html>")
    assert view(sweep).returncode == 0
    assert sorted(p.name for p in pages.iterdir()) == ["mine.html", "run0000.html"]


def test_out_must_be_an_html_file(tmp_path, synthetic_run):
    assert_one_line_error(view(synthetic_run, "--out", tmp_path / "page.txt"), "--out", ".html")


def test_a_run_page_is_written_where_asked_and_only_there(tmp_path, synthetic_run):
    out = tmp_path / "pages" / "run.html"
    result = view(synthetic_run, "--out", out)
    assert result.returncode == 0, result.stderr
    assert result.stdout.strip() == f"wrote {out} (1 page, {out.stat().st_size / 2**20:.1f} MiB)"
    assert sorted(p.name for p in out.parent.iterdir()) == ["run.html"]  # no temporary file left
    html = out.read_text()
    assert "<script src=" not in html and "http://" not in html.replace("http://www.w3.org", "")  # nothing fetched


def test_serve_serves_the_page_folder_on_loopback(tmp_path, synthetic_run):
    out = tmp_path / "served" / "index.html"
    server = subprocess.Popen([sys.executable, "-m", "harness", "view", str(synthetic_run), "--out", str(out),
                               "--serve", "--port", "0"], cwd=REPO, stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                              text=True)
    try:
        assert server.stdout is not None
        assert server.stdout.readline().startswith("wrote ")
        line = server.stdout.readline()
        url = re.search(r"http://127\.0\.0\.1:\d+/index\.html", line)
        assert url, line
        page = httpx.get(url.group(0), timeout=30)
        assert page.status_code == 200 and "<title>Run run0" in page.text
        outside = httpx.get(url.group(0).replace("index.html", "../../") + "synthetic/run0/manifest.json", timeout=30)
        assert outside.status_code == 404  # only the page's folder is served
    finally:
        server.terminate()
        server.wait(timeout=30)


# ---- what the page says, against the evidence ---------------------------------------------------


def _means(rows: pl.DataFrame) -> dict[str, tuple[float | None, int, int]]:
    ok = pl.col("status") == "ok"
    grouped = rows.group_by("candidate_id").agg(mean=pl.col("reward").filter(ok).mean(), n=ok.sum(), errors=(~ok).sum())
    return {r["candidate_id"]: (r["mean"], r["n"], r["errors"]) for r in grouped.iter_rows(named=True)}


def test_scores_rest_on_rewarded_rows_and_count_errors_apart(synthetic_run):
    evidence = load_run(synthetic_run)
    payload = build_run_payload(evidence)
    rollouts = evidence.tables["rollouts"]
    pareto_pool = evidence.manifest["spec"]["pools"]["pareto"]
    pareto = _means(rollouts.filter(pl.col("task_id").is_in(pareto_pool)))
    heldout = _means(rollouts.filter(pl.col("stage") == "heldout"))
    errors = rollouts.filter(pl.col("status") != "ok")
    assert errors.height > 0 and errors["reward"].null_count() == errors.height  # the evidence has error rows
    assert payload.summary.failed_rollouts == errors.height
    for node in payload.candidates:
        if node.candidate_id in pareto:
            mean, n, n_errors = pareto[node.candidate_id]
            assert (node.pareto.mean, node.pareto.n, node.pareto.errors) == pytest.approx((mean, n, n_errors))
        assert (node.heldout is None) == (node.candidate_id not in heldout)
        if node.heldout is not None:
            mean, n, n_errors = heldout[node.candidate_id]
            assert (node.heldout.mean, node.heldout.n, node.heldout.errors) == pytest.approx((mean, n, n_errors))
    cells = [c for row in payload.heldout_rows for c in row.cells.values()]
    assert sum(c.reward is None for c in cells) == heldout_errors(heldout)
    assert all(c.status == "error" and c.error for c in cells if c.reward is None)  # an error, never a 0


def heldout_errors(heldout: dict[str, tuple[float | None, int, int]]) -> int:
    return sum(errors for _, _, errors in heldout.values())


def test_lineage_statuses_and_trace_follow_the_evidence(synthetic_run):
    evidence = load_run(synthetic_run)
    payload = build_run_payload(evidence)
    candidates = evidence.tables["candidates"]
    assert [n.candidate_id for n in payload.candidates] == candidates.sort("index")["candidate_id"].to_list()
    assert len({e.edge_id for e in payload.edges}) == sum(len(p) for p in candidates["parent_ids"].to_list())
    by_status = {n.candidate_id: n.status for n in payload.candidates}
    for row in candidates.iter_rows(named=True):
        merged = len(row["parent_ids"]) > 1
        expected = {"seed": "seed", "proposal": "accepted", "merge": "merged",
                    "rejected": "merge rejected" if merged else "rejected"}[row["origin"]]
        assert by_status[row["candidate_id"]] == expected
    assert {"merged", "rejected", "accepted"} <= set(by_status.values())
    best = [p.score for p in sorted((p for p in payload.trace if p.kind == "best so far"), key=lambda p: p.rollouts)]
    assert best == sorted(best) and best[-1] == max(n.pareto.mean or 0 for n in payload.candidates)
    # every non-seed candidate has its diffs, and they are stored once
    seed = payload.summary.seed_candidate_id
    for node in payload.candidates:
        keys = node.diff_vs_parent + ([node.diff_vs_seed] if node.candidate_id != seed else [])
        assert all(key in payload.diffs for key in keys)
    assert len(payload.diffs) == len({k for n in payload.candidates for k in [*n.diff_vs_parent, n.diff_vs_seed] if k})


def test_proposals_keep_prompt_replies_and_screen_drops(synthetic_run):
    evidence = load_run(synthetic_run)
    payload = build_run_payload(evidence)
    proposals = evidence.tables["proposals"]
    assert len(payload.proposals) == proposals.height
    for shown, row in zip(payload.proposals, proposals.iter_rows(named=True)):
        assert shown.proposer_replies == list(row["proposer_replies"] or [])
        assert shown.screened_out == json.loads(row["screened_out_json"])
        assert (shown.proposer_prompt == json.loads(row["proposer_prompt"])) if row["proposer_prompt"] else \
            shown.proposer_prompt == []
    assert any(p.child_id is None for p in payload.proposals)  # unchanged proposals are listed too


def test_the_tree_layout_does_not_recurse():
    chain = [NodeIn(f"c{i}", i, [f"c{i - 1}"] if i else [], i) for i in range(20_000)]
    positions = tree_positions(chain)
    assert len(positions) == 20_000 and set(positions.values()) == {0.0}
