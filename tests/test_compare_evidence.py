"""benchmarks.compare_evidence: two evidence roots of the same runs agree; a changed result,
a missing run or a root with no runs is named."""

from __future__ import annotations

import json
from pathlib import Path

from benchmarks.compare_evidence import differences, main
from benchmarks.view.synthetic import RunShape, write_run

SHAPE = RunShape(rollouts=80, heldout_rows=5, heldout_candidates=2, pareto_rows=6)


def test_the_same_runs_agree_apart_from_timings(tmp_path: Path) -> None:
    for root in ("a", "b"):
        write_run(tmp_path / root, "smoke", "run0", SHAPE)
    manifest = tmp_path / "b" / "smoke" / "run0" / "manifest.json"
    body = json.loads(manifest.read_text())
    body["timings"] = {"wall_s": 99.0}  # another run of the same spec takes another time
    manifest.write_text(json.dumps(body))
    assert differences(tmp_path / "a", tmp_path / "b") == []
    assert main([str(tmp_path / "a"), str(tmp_path / "b")]) == 0


def test_a_changed_result_is_named(tmp_path: Path) -> None:
    write_run(tmp_path / "a", "smoke", "run0", SHAPE)
    write_run(tmp_path / "b", "smoke", "run0", RunShape(**{**SHAPE.__dict__, "seed": 1}))
    found = differences(tmp_path / "a", tmp_path / "b")
    assert any(line.startswith("smoke/run0: rollouts") for line in found), found
    assert main([str(tmp_path / "a"), str(tmp_path / "b")]) == 1


def test_missing_runs_and_empty_roots_are_named(tmp_path: Path, capsys) -> None:
    write_run(tmp_path / "a", "smoke", "run0", SHAPE)
    write_run(tmp_path / "b", "smoke", "run1", SHAPE)
    assert differences(tmp_path / "a", tmp_path / "b") == [
        "runs differ: only in A ['smoke/run0'], only in B ['smoke/run1']"]
    assert main([str(tmp_path / "a"), str(tmp_path / "empty")]) == 2
    assert "no run evidence" in capsys.readouterr().err


def test_a_manifest_key_on_one_side_only_is_named_and_the_node_is_a_place(tmp_path: Path) -> None:
    for root in ("a", "b"):
        write_run(tmp_path / root, "smoke", "run0", SHAPE)
    manifest = tmp_path / "b" / "smoke" / "run0" / "manifest.json"
    body = json.loads(manifest.read_text())
    manifest.write_text(json.dumps({**body, "node": {"node_id": "n1", "host": "h1"}, "extra": None}))
    assert differences(tmp_path / "a", tmp_path / "b") == ["smoke/run0: manifest differs in ['extra']"]
