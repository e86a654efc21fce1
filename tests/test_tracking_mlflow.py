"""Export to MLflow, read back with MLflow's own client: a scripted run with
`tracking=mlflow` (params, metric histories, artifacts against its evidence), the export of
a sweep folder afterwards (one MLflow run per harness run, idempotent, a redone run
replaced), a sweep on Ray (workers export, the driver exports runs it skipped), and the
failures: no extra, a store that does not open, a tracker that fails after the run."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path
from typing import Any

import polars as pl
import pytest

from conftest import REPO, container_spec, execute, make_run_spec, run_cli
from harness.run_state import OPTIMIZATION_STAGES

pytestmark = pytest.mark.timeout(600)
EVIDENCE_FILES = {"manifest.json", "rollouts.parquet", "candidates.parquet", "proposals.parquet", "events.parquet",
                  "model_calls.parquet"}
MISSING_EXTRA = "error: tracking=mlflow needs MLflow, which is not installed: pip install -e '.[mlflow]'"


@pytest.fixture(scope="module")
def mlflow_client_cls() -> Any:
    try:
        from mlflow import MlflowClient
    except ImportError:  # an error, not a skip: CI installs the extra (.ci/setup)
        pytest.fail("mlflow is not installed: pip install -e '.[mlflow]'", pytrace=False)
    return MlflowClient


def store_uri(evidence_root: Path) -> str:
    return f"sqlite:///{evidence_root.resolve() / '.mlflow' / 'mlflow.db'}"


def runs_of(client: Any, experiment: str) -> list[Any]:
    found = client.get_experiment_by_name(experiment)
    return [] if found is None else client.search_runs([found.experiment_id])


def history(client: Any, run_id: str, key: str) -> list[tuple[int, float]]:
    return [(m.step, m.value) for m in sorted(client.get_metric_history(run_id, key), key=lambda m: (m.step, m.timestamp))]


def pareto_means(run_dir: Path) -> dict[str, float]:
    """Per candidate scored on the whole pareto pool: its mean over rows with a reward."""
    manifest = json.loads((run_dir / "manifest.json").read_text())
    pareto = manifest["spec"]["pools"]["pareto"]
    rows = (pl.read_parquet(run_dir / "rollouts.parquet")
            .filter(pl.col("stage").is_in(sorted(OPTIMIZATION_STAGES)), pl.col("task_id").is_in(pareto)))
    means = {}
    for (candidate,), group in rows.group_by("candidate_id"):
        if set(group["task_id"]) == set(pareto):
            means[candidate] = group.filter(pl.col("status") == "ok")["reward"].mean()
    return means


def leaves(value: Any, prefix: str = "") -> dict[str, Any]:
    if isinstance(value, dict):
        out: dict[str, Any] = {}
        for key, item in value.items():
            out.update(leaves(item, f"{prefix}.{key}" if prefix else key))
        return out
    return {prefix: value}


# ---------------------------------------------------------------- a run with tracking=mlflow


@pytest.fixture(scope="module")
def tracked_run(tmp_path_factory: pytest.TempPathFactory, data_dir: Path) -> dict[str, Any]:
    root = tmp_path_factory.mktemp("tracked") / "evidence"
    result = run_cli("models=scripted", "tracking=mlflow", f"evidence_root={root}", f"data_dir={data_dir}",
                     "pools.heldout.count=20", "budget.max_rollouts=120",
                     # the scripted policy follows learned rules, not quoted examples: the
                     # proposer's rotation gives the run accepted children to track
                     "algorithm.params.examples_first=false")
    assert result.returncode == 0, result.stdout[-3000:]
    (run_dir,) = [p for p in (root / "local").iterdir() if (p / "manifest.json").is_file()]
    return {"root": root, "run_dir": run_dir, "stdout": result.stdout,
            "manifest": json.loads((run_dir / "manifest.json").read_text())}


def test_a_run_with_tracking_is_one_mlflow_run_with_its_spec_as_params(tracked_run, mlflow_client_cls):
    client = mlflow_client_cls(tracking_uri=store_uri(tracked_run["root"]))
    manifest = tracked_run["manifest"]
    (run,) = runs_of(client, "local")  # experiment = the sweep's name
    assert run.data.tags["harness.run_id"] == manifest["run_id"]
    assert run.data.tags["harness.status"] == "done" and run.info.status == "FINISHED"
    assert run.info.run_name.endswith(manifest["run_id"][:8])
    assert f"MLflow run {run.info.run_id} created in experiment 'local'" in tracked_run["stdout"]
    assert f"view: mlflow ui --backend-store-uri {store_uri(tracked_run['root'])}" in tracked_run["stdout"]

    params = run.data.params
    spec = dict(manifest["spec"])
    pools = spec.pop("pools")
    for key, value in leaves(spec).items():  # every leaf of the resolved spec, as text
        expected = value if isinstance(value, str) else json.dumps(value, sort_keys=True)
        assert params[key] == expected, key
    assert params["budget.max_rollouts"] == "120" and params["policy.provider"] == "scripted"
    assert params["pools.heldout"] == "test:0-19" and params["pools.heldout_count"] == "20"
    assert params["pools.train_count"] == str(len(pools["train"]))
    assert params["versions.gepa-harness"] == manifest["versions"]["gepa-harness"]


def test_metric_histories_match_the_evidence(tracked_run, mlflow_client_cls):
    client = mlflow_client_cls(tracking_uri=store_uri(tracked_run["root"]))
    manifest, run_dir = tracked_run["manifest"], tracked_run["run_dir"]
    (run,) = runs_of(client, "local")
    run_id = run.info.run_id

    # one pareto point per candidate scored on the whole pool: the seed and each accepted child
    proposals = pl.read_parquet(run_dir / "proposals.parquet")
    accepted = proposals.filter(pl.col("accepted"))["child_id"].to_list()
    means = pareto_means(run_dir)
    assert set(means) == {manifest["seed_candidate_id"], *accepted}
    pareto = history(client, run_id, "pareto_score")
    assert len(pareto) == len(means) >= 2, "the scripted run accepts children"
    assert sorted(v for _, v in pareto) == pytest.approx(sorted(means.values()))
    steps = [s for s, _ in pareto]
    assert steps == sorted(steps) and 0 < steps[-1] <= manifest["totals"]["rollouts"]
    best = history(client, run_id, "best_pareto_score")
    running = [max(v for _, v in pareto[:i + 1]) for i in range(len(pareto))]
    assert [v for _, v in best] == pytest.approx(running) and [s for s, _ in best] == steps
    scored = {h["candidate_id"]: h for h in manifest["heldout"]}
    assert means[manifest["best_candidate_id"]] == pytest.approx(scored[manifest["best_candidate_id"]]["pareto_score"])
    judged = proposals.filter(pl.col("child_minibatch_score").is_not_null())
    assert sorted(v for _, v in history(client, run_id, "minibatch_child_score")) == pytest.approx(
        sorted(judged["child_minibatch_score"].to_list()))

    # one value each at step = the run's rollouts
    final = manifest["totals"]["rollouts"]
    seed, pick = scored[manifest["seed_candidate_id"]], scored[manifest["best_candidate_id"]]
    expected = {"seed_heldout": seed["heldout_score"], "pick_heldout": pick["heldout_score"],
                "pick_lift": pick["heldout_score"] - seed["heldout_score"], "seed_heldout_n": 20,
                "rollouts": final, "heldout_rollouts": manifest["totals"]["heldout_rollouts"],
                "failed_rollouts": manifest["totals"]["failed_rollouts"],
                "proposals_accepted": len(accepted), "wall_s": manifest["timings"]["wall_s"]}
    for key, value in expected.items():
        assert history(client, run_id, key) == [(final, pytest.approx(value))], key
    if manifest["totals"]["cost_usd"] is None:  # unknown is left out, never a zero
        assert "cost_usd" not in run.data.metrics
    else:
        assert run.data.metrics["cost_usd"] == pytest.approx(manifest["totals"]["cost_usd"])


def test_artifacts_are_the_evidence_and_the_candidates_texts(tracked_run, mlflow_client_cls, tmp_path):
    client = mlflow_client_cls(tracking_uri=store_uri(tracked_run["root"]))
    manifest, run_dir = tracked_run["manifest"], tracked_run["run_dir"]
    (run,) = runs_of(client, "local")
    run_id = run.info.run_id
    assert {Path(a.path).name for a in client.list_artifacts(run_id, "evidence")} == EVIDENCE_FILES
    fetched = Path(client.download_artifacts(run_id, "evidence/manifest.json", str(tmp_path)))
    assert fetched.read_bytes() == (run_dir / "manifest.json").read_bytes()
    texts = {r["candidate_id"]: json.loads(r["modules_json"])
             for r in pl.read_parquet(run_dir / "candidates.parquet").iter_rows(named=True)}
    for folder, candidate in (("best_candidate", manifest["best_candidate_id"]),
                              ("seed_candidate", manifest["seed_candidate_id"])):
        for module, text in texts[candidate].items():
            path = Path(client.download_artifacts(run_id, f"{folder}/{module}.txt", str(tmp_path / folder)))
            assert path.read_text() == text


# ---------------------------------------------------------------- export afterwards


def test_exporting_a_sweep_folder_is_idempotent_and_replaces_a_redone_run(
        tmp_path, data_dir, banking77_url, scripted_policy, mlflow_client_cls, capsys):
    from harness.run import run_sync
    from harness.services import Endpoints
    from harness.tracking.cli import main as export

    root = tmp_path / "evidence"
    specs = [make_run_spec(container_spec("banking77", data_dir), root, train=[f"train:{i}" for i in range(8)],
                           pareto=[f"train:{i}" for i in range(8, 12)], heldout=["test:0", "test:1"],
                           max_rollouts=30, seed=seed, params={"minibatch_size": 3}).model_copy(update={"sweep": "exp"})
             for seed in (0, 1)]
    for spec in specs:
        assert execute(spec, banking77_url, scripted_policy.base_url).status == "done"
    sweep_dir = root / "exp"
    client = mlflow_client_cls(tracking_uri=store_uri(root))

    def exported() -> dict[str, str]:
        return {r.data.tags["harness.run_id"]: r.info.run_id for r in runs_of(client, "exp")}

    assert export(["mlflow", str(sweep_dir)]) == 0
    assert capsys.readouterr().out.count(": created (MLflow run") == 2
    first = exported()
    assert sorted(first) == sorted(s.run_id for s in specs)  # one MLflow run per harness run

    assert export(["mlflow", str(sweep_dir)]) == 0
    assert capsys.readouterr().out.count(": unchanged (MLflow run") == 2
    assert export(["mlflow", str(sweep_dir / specs[0].run_id)]) == 0  # a run folder works the same
    assert exported() == first

    # redone (force=true): other evidence of the same run replaces the MLflow run
    endpoints = Endpoints(container_url=banking77_url, policy_url=scripted_policy.base_url,
                          proposer_url=scripted_policy.base_url)
    assert run_sync(specs[0], endpoints, force=True).status == "done"
    assert export(["mlflow", str(sweep_dir)]) == 0
    out = capsys.readouterr().out
    assert f"run {specs[0].run_id}: replaced" in out and f"run {specs[1].run_id}: unchanged" in out
    now = exported()
    assert sorted(now) == sorted(first) and now[specs[1].run_id] == first[specs[1].run_id]
    assert now[specs[0].run_id] != first[specs[0].run_id]
    assert client.get_run(first[specs[0].run_id]).info.lifecycle_stage == "deleted"

    # any URI and experiment name; a SQLite store's artifacts go beside it, not to ./mlruns
    other = f"sqlite:///{tmp_path / 'other.db'}"
    assert export(["mlflow", str(sweep_dir), "--uri", other, "--experiment", "mine"]) == 0
    assert len(runs_of(mlflow_client_cls(tracking_uri=other), "mine")) == 2
    assert len(list((tmp_path / "mlartifacts").glob("*/artifacts/evidence/manifest.json"))) == 2
    assert not (Path.cwd() / "mlruns").exists() and not (REPO / "mlruns").exists()


def test_edited_evidence_is_not_exported(tmp_path, data_dir, banking77_url, scripted_policy, mlflow_client_cls,
                                         capsys):
    from harness.tracking.cli import main as export

    spec = make_run_spec(container_spec("banking77", data_dir), tmp_path / "evidence", train=["train:0", "train:1"],
                         pareto=["train:2", "train:3"], heldout=["test:0"], max_rollouts=8)
    run_dir = Path(execute(spec, banking77_url, scripted_policy.base_url).evidence_dir)
    with open(run_dir / "events.parquet", "ab") as handle:
        handle.write(b"\0")
    assert export(["mlflow", str(run_dir)]) == 1
    out = capsys.readouterr().out
    assert f"run {spec.run_id}: not exported:" in out and "does not match the manifest" in out


# ---------------------------------------------------------------- a sweep on Ray


def test_a_sweep_on_ray_exports_every_run_once(tmp_path, data_dir, mlflow_client_cls):
    evidence = tmp_path / "evidence"
    cmd = [sys.executable, "-m", "harness", "+sweep=smoke", "models=scripted", "tracking=mlflow",
           f"evidence_root={evidence}", "sweep.seeds=[0]", "budget.max_rollouts=20"]
    env = {k: v for k, v in os.environ.items() if not k.startswith("RAY_")}
    env.update(HARNESS_DATA_DIR=str(data_dir), COLUMNS="250")

    def sweep() -> subprocess.CompletedProcess:
        result = subprocess.run(cmd, cwd=REPO, env=env, capture_output=True, text=True, timeout=400,
                                start_new_session=True)
        assert result.returncode == 0, result.stdout[-3000:] + result.stderr[-3000:]
        return result

    first = sweep()
    assert "tracking: 2 of 2 finished runs in MLflow experiment 'smoke'" in first.stdout
    index = pl.read_parquet(evidence / "smoke" / "index.parquet")
    client = mlflow_client_cls(tracking_uri=store_uri(evidence))
    runs = {r.data.tags["harness.run_id"]: r for r in runs_of(client, "smoke")}
    assert sorted(runs) == sorted(index["run_id"])
    for run_id, run in runs.items():
        assert run.info.status == "FINISHED" and "pick_heldout" in run.data.metrics
        assert {Path(a.path).name for a in client.list_artifacts(run.info.run_id, "evidence")} == EVIDENCE_FILES
        log = (evidence / "smoke" / "logs" / f"{run_id}.log").read_text()
        assert f"tracking: MLflow run {run.info.run_id} created" in log  # exported by the worker that ran it

    again = sweep()  # all skipped as done: the driver exports them, and nothing changed
    assert "2 already done, 0 to run" in again.stdout
    assert "tracking: 2 of 2 finished runs" in again.stdout
    assert {r.data.tags["harness.run_id"]: r.info.run_id for r in runs_of(client, "smoke")} == {
        k: r.info.run_id for k, r in runs.items()}


# ---------------------------------------------------------------- failures


def run_python(code: str, *args: str, data_dir: Path) -> subprocess.CompletedProcess:
    """`python -c code args...` from the repository root, output merged."""
    env = {k: v for k, v in os.environ.items() if k != "MLFLOW_ALLOW_FILE_STORE"}
    env.update(HARNESS_DATA_DIR=str(data_dir), COLUMNS="80")
    return subprocess.run([sys.executable, "-c", code, *args], cwd=REPO, env=env, text=True, timeout=300,
                          stdout=subprocess.PIPE, stderr=subprocess.STDOUT)


WITHOUT_MLFLOW = "import sys; sys.modules['mlflow'] = None; sys.argv[0] = 'harness'; from harness.__main__ import entry; entry()"


def test_without_the_extra_tracking_is_one_line_before_any_work(tmp_path, data_dir):
    result = run_python(WITHOUT_MLFLOW, "models=scripted", "tracking=mlflow", f"evidence_root={tmp_path}",
                        data_dir=data_dir)
    assert result.returncode == 2
    assert result.stdout.strip() == MISSING_EXTRA
    assert not [p for p in (tmp_path / "local").iterdir() if p.name != "logs"]  # no run, no service started
    exported = run_python(WITHOUT_MLFLOW, "export", "mlflow", str(tmp_path), data_dir=data_dir)
    assert exported.returncode == 2 and exported.stdout.strip() == MISSING_EXTRA


def test_a_store_that_does_not_open_is_one_line_before_any_work(tmp_path, data_dir):
    # MLflow 3 refuses a file: store unless MLFLOW_ALLOW_FILE_STORE=true
    result = run_cli("models=scripted", "tracking=mlflow", f"tracking.uri=file://{tmp_path}/mlruns",
                     f"evidence_root={tmp_path}/evidence", f"data_dir={data_dir}",
                     env={"MLFLOW_ALLOW_FILE_STORE": "false"})
    assert result.returncode == 2
    (line,) = result.stdout.strip().splitlines()
    assert line.startswith(f"error: cannot open the MLflow store file://{tmp_path}/mlruns: ")
    assert "MLFLOW_ALLOW_FILE_STORE" in line
    assert not list((tmp_path / "evidence" / "local").glob("*/manifest.json"))


FAILING_TRACKER = """
import sys
import harness.tracking.mlflow_export as mlflow_export
def refuse(record, target):
    raise RuntimeError("tracker unreachable")
mlflow_export.export_run = refuse
sys.argv[0] = 'harness'
from harness.__main__ import entry
entry()
"""


def test_a_tracker_failing_after_the_run_is_one_line_and_the_run_stays_done(tmp_path, data_dir):
    from benchmarks.report.io import verify_files

    result = run_python(FAILING_TRACKER, "models=scripted", "tracking=mlflow", f"evidence_root={tmp_path}",
                        "budget.max_rollouts=20", data_dir=data_dir)
    assert result.returncode == 0, result.stdout[-3000:]
    lines = [line for line in result.stdout.splitlines() if "tracking:" in line and "not exported" in line]
    assert lines == [f"tracking: run not exported to MLflow at {store_uri(tmp_path)}: RuntimeError: tracker "
                     "unreachable"]
    assert "view: mlflow ui" not in result.stdout
    (run_dir,) = [p.parent for p in (tmp_path / "local").glob("*/manifest.json")]
    manifest = json.loads((run_dir / "manifest.json").read_text())
    assert manifest["status"] == "done"
    verify_files(run_dir, manifest)  # every table as the run wrote it
