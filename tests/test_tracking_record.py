"""What an export records, without a tracker: the spec as parameters (compact pools, no
secret values), and the run folders a path names."""

from __future__ import annotations

import json

import pytest

from harness.tracking.record import ExportError, compact_ids, run_dirs, spec_params


def test_pools_are_logged_as_ranges_in_their_order():
    assert compact_ids([f"train:{i}" for i in range(60)]) == "train:0-59"
    assert compact_ids(["train:3", "train:4", "test:5", "train:9", "train:10", "odd"]) == \
        "train:3-4,test:5,train:9-10,odd"
    assert compact_ids([]) == ""


def test_key_variable_names_stay_and_secret_values_are_redacted():
    spec = {
        "policy": {"api_key_env": "OPENAI_API_KEY", "max_tokens": 24, "model": "m"},
        "container": {"name": "c", "policy_key_env": "K", "env": ["GRADER_KEY"], "api_key": "sk-live",
                      "command": ["python", "-m", "c", "--api-key", "sk-1", "--token=t-2", "--api-key-env", "NAME",
                                  "--max-tokens", "512"]},
        "algorithm": {"name": "gepa", "params": {"proposer_max_tokens": None, "auth_token": "abc"}},
        "pools": {"train": ["train:0", "train:1"], "pareto": ["train:2"], "heldout": ["test:0"],
                  "allow_overlap": False},
    }
    params = spec_params(spec)
    assert params["policy.api_key_env"] == "OPENAI_API_KEY" and params["container.policy_key_env"] == "K"
    assert params["container.env"] == '["GRADER_KEY"]' and params["policy.max_tokens"] == "24"
    assert params["container.api_key"] == "<redacted>" and params["algorithm.params.auth_token"] == "<redacted>"
    assert params["algorithm.params.proposer_max_tokens"] == "null"
    assert json.loads(params["container.command"]) == [
        "python", "-m", "c", "--api-key", "<redacted>", "--token=<redacted>", "--api-key-env", "NAME",
        "--max-tokens", "512"]
    assert params["pools.train"] == "train:0-1" and params["pools.train_count"] == "2"
    assert params["pools.allow_overlap"] == "false"
    assert not any(secret in value for value in params.values() for secret in ("sk-live", "sk-1", "t-2", "abc"))


def test_a_path_names_one_run_or_every_finished_run_of_a_sweep(tmp_path):
    sweep = tmp_path / "s"
    for name in ("aaa", "bbb", "unfinished", ".staging"):
        (sweep / name).mkdir(parents=True)
    for name in ("aaa", "bbb"):
        (sweep / name / "manifest.json").write_text("{}")
    (sweep / ".staging" / "manifest.json").write_text("{}")
    assert run_dirs(sweep) == [sweep / "aaa", sweep / "bbb"]
    assert run_dirs(sweep / "aaa") == [sweep / "aaa"]
    with pytest.raises(ExportError, match="no such run or sweep folder"):
        run_dirs(tmp_path / "missing")
    with pytest.raises(ExportError, match="neither a run folder"):
        run_dirs(sweep / "unfinished")


def test_the_default_store_sits_under_the_evidence_root_and_needs_local_evidence(tmp_path):
    from harness.errors import ConfigError
    from harness.tracking.settings import TrackingConfig, resolve_target

    target = resolve_target(TrackingConfig(), tmp_path, "smoke")
    assert target.uri == f"sqlite:///{tmp_path}/.mlflow/mlflow.db" and target.experiment == "smoke"
    assert target.artifact_location == (tmp_path / ".mlflow" / "artifacts").as_uri()
    given = resolve_target(TrackingConfig(uri="http://127.0.0.1:5000", experiment="mine"), tmp_path, "smoke")
    assert (given.uri, given.experiment, given.artifact_location) == ("http://127.0.0.1:5000", "mine", None)
    database = resolve_target(TrackingConfig(uri=f"sqlite:///{tmp_path}/x/t.db"), "/elsewhere", "smoke")
    assert database.artifact_location == (tmp_path / "x" / "mlartifacts").as_uri()  # not ./mlruns of the cwd
    with pytest.raises(ConfigError, match="not a local folder"):
        resolve_target(TrackingConfig(), "s3://bucket/evidence", "smoke")
