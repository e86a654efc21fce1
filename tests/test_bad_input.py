"""Bad input to `python -m harness` (a subprocess, scripted models): one clear error line,
a non-zero exit, no rollout and no run directory.

Every mistake prints exactly one `error: ...` line (exit 2): those our config models
catch, and those Hydra finds while composing (an option a group does not have, a key the
config does not have), which the entry point reports as one line with the options or the
closest key."""

from __future__ import annotations

from pathlib import Path

import pytest

from conftest import run_cli


def harness(tmp_path: Path, data_dir: Path, *overrides: str):
    evidence = tmp_path / "evidence"
    result = run_cli("models=scripted", f"evidence_root={evidence}", f"data_dir={data_dir}", *overrides)
    lines = [line for line in result.stdout.splitlines() if line.strip()]
    return result, lines, evidence


def assert_no_run_written(evidence: Path) -> None:
    """Nothing but service logs: no run directory, no table, no manifest."""
    if not evidence.exists():
        return
    written = [p for p in evidence.rglob("*") if p.is_file() and "logs" not in p.relative_to(evidence).parts]
    assert written == []
    for sweep_dir in evidence.iterdir():
        assert sorted(p.name for p in sweep_dir.iterdir()) in ([], ["logs"])


def assert_one_error_line(result, lines: list[str], *needles: str, only_line: bool) -> str:
    assert result.returncode == 2, result.stdout
    assert "Traceback" not in result.stdout
    errors = [line for line in lines if line.startswith("error:")]
    assert len(errors) == 1, result.stdout
    assert lines[-1] == errors[0], result.stdout  # the error is the last word, whole on one line
    if only_line:
        assert lines == errors, result.stdout
    for needle in needles:
        assert needle in errors[0], errors[0]
    return errors[0]


# ---------------------------------------------------------------- caught by our config models


@pytest.mark.parametrize("overrides, needles", [
    (["+budget.max_rollutes=3"], ["unknown config key 'budget.max_rollutes'", "misspelled"]),
    (["+max_rollouts=3"], ["unknown config key 'max_rollouts'"]),
    (["budget.max_rollouts=0"], ["budget.max_rollouts", "greater than 0"]),
    (["budget.max_rollouts=-3"], ["budget.max_rollouts", "greater than 0"]),
    (["budget.max_wall_s=-1"], ["budget.max_wall_s", "greater than 0"]),
    (["budget.max_rollouts=many"], ["budget.max_rollouts", "valid integer"]),  # Hydra does not type-check
    (["pools.heldout.split=train", "pools.heldout.start=0"], ["'pools'", "heldout overlaps train/pareto", "train:0"]),
    (["pools.train.count=0"], ["pools.train.count", "greater than 0"]),
    (["container.command=null"], ["container", "needs a command to start it or a url"]),
    # an algorithm's params are its optimizer's to judge, still before any service starts
    (["algorithm.name=nope"], ["unknown algorithm 'nope'", "gepa", "seed_only"]),
    (["+algorithm.params.minibatch=3"], ["algorithm 'gepa': invalid params: unknown param 'minibatch' (misspelled?)"]),
    (["algorithm.params.not_answer_lines=-1"], ["algorithm 'gepa': invalid params: not_answer_lines:", "0"]),
    (["algorithm=gepa_ai", "+algorithm.params.bogus=1"], ["algorithm 'gepa_ai': invalid params: unknown param 'bogus'"]),
    # a sweep: every grid point's params, and an override some point's options lack, before Ray
    (["+sweep=same_container", "sweep.algorithms=[gepa]", "algorithm.params.minibatch_size=0"],
     ["algorithm 'gepa': invalid params: minibatch_size: Input should be greater than 0"]),
    (["+sweep=same_container", "algorithm.params.minibatch_size=0"],
     ["sweep same_container: the grid point", "algorithm=seed_only", "'algorithm.params.minibatch_size'",
      "this point's config has no such key"]),
])
def test_config_errors_print_one_line_and_start_nothing(tmp_path, data_dir, overrides, needles) -> None:
    result, lines, evidence = harness(tmp_path, data_dir, *overrides)
    assert_one_error_line(result, lines, *needles, only_line=True)
    assert not evidence.exists()


def test_unwritable_evidence_root_is_one_line(tmp_path, data_dir) -> None:
    blocker = tmp_path / "a-file"
    blocker.write_text("not a directory")
    result = run_cli("models=scripted", f"evidence_root={blocker}/evidence", f"data_dir={data_dir}")
    lines = [line for line in result.stdout.splitlines() if line.strip()]
    assert_one_error_line(result, lines, "evidence directory", "not writable", only_line=True)
    assert sorted(p.name for p in tmp_path.iterdir()) == ["a-file"]


# ---------------------------------------------------------------- found while composing


@pytest.mark.parametrize("override, needles", [
    ("container=nope", ["configs/container/ has no option 'nope'", "banking77, chaos", "heart_disease"]),
    ("algorithm=gepa_aj", ["configs/algorithm/ has no option 'gepa_aj'", "did you mean algorithm=gepa_ai?"]),
    ("budgett.max_rollouts=3", ["unknown config key 'budgett'", "did you mean budget?", "leading +"]),
    ("budget.max_rolouts=3", ["unknown config key 'budget.max_rolouts'", "did you mean budget.max_rollouts?"]),
    ("colour=red", ["unknown config key 'colour'", "the keys are algorithm, budget"]),
    ("budget.max_rollouts=[1,", ["cannot parse the overrides"]),
])
def test_composition_errors_are_one_line(tmp_path, data_dir, override, needles) -> None:
    result, lines, evidence = harness(tmp_path, data_dir, override)
    assert_one_error_line(result, lines, *needles, only_line=True)
    assert not evidence.exists()


# ---------------------------------------------------------------- caught before any rollout


@pytest.mark.parametrize("overrides, needles", [
    (["pools.heldout.count=999999"], ["task id 'test:3080' in pool heldout is not in the taskset", "3080 rows"]),
    (["pools.pareto.split=validation"], ["pool pareto names split 'validation'", "['test', 'train']"]),
    (["container.target_modules=[other]"], ["container banking77", "lacks target module(s) ['other']"]),
    (["container.target_modules=[]"], ["advertises target module(s) ['stage2_system'] the config does not name"]),
    (["+pools.pareto.stratify_by=intent", "+pools.pareto.window=40"],
     ["pool pareto is stratified by 'intent'", "task train:60 has no such field"]),
    (["+pools.pareto.stratify_by=label"], ["a stratified pool needs split, count and a window of at least count rows"]),
    (["+container.label_field=intent"], ["its label_field is 'intent'", "task train:0 has no such field"]),
])
def test_preflight_errors_stop_before_any_rollout(tmp_path, data_dir, banking77_url, overrides, needles) -> None:
    # attach to the session's banking77 (started once) instead of starting one per case
    attach = ["container.command=null", f"+container.url={banking77_url}"]
    result, lines, evidence = harness(tmp_path, data_dir, *attach, *overrides)
    assert_one_error_line(result, lines, *needles, only_line=False)
    assert_no_run_written(evidence)


@pytest.mark.parametrize("overrides, role", [
    (["policy=gpt_4_1_nano"], "policy gpt-4.1-nano"),
    (["proposer=gpt_5_4_nano"], "proposer gpt-5.4-nano"),
    # an attached container's calls get the key from the harness's gateway: still needed here
    (["policy=gpt_4_1_nano", "container.command=null", "+container.url=http://127.0.0.1:9"], "policy gpt-4.1-nano"),
    (["+sweep=same_container", "models=hosted"], "policy gpt-4.1-nano"),  # before the sweep writes anything
])
def test_missing_hosted_key_is_named_before_any_rollout(tmp_path, data_dir, monkeypatch, overrides, role) -> None:
    monkeypatch.delenv("OPENAI_API_KEY", raising=False)  # the child inherits this environment
    result, lines, evidence = harness(tmp_path, data_dir, *overrides)
    assert_one_error_line(result, lines, "OPENAI_API_KEY is not set", role, only_line=True)
    assert not evidence.exists()  # checked before any service started or any file was written
