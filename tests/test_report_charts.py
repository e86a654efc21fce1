"""Charts and conclusions that cannot mislead (benchmarks.report): a single run's report is its
optimization trace; single runs pool into a cell only when their resolved specs match apart
from the seed; every run is drawn against its own seed with the seed noise floor; one colour per
stack across charts; integer ticks on count axes; titles that state the conclusion. Evidence is
written through the harness's own writer with real run specs; no Ray, no model, no timing."""

from __future__ import annotations

import re
import warnings
from pathlib import Path
from typing import Any

import matplotlib as mpl
import numpy as np
import polars as pl
import pytest
from matplotlib.backends.backend_agg import FigureCanvasAgg
from matplotlib.colors import to_hex
from matplotlib.figure import Figure
from matplotlib.text import Text

from benchmarks.report import ReportOptions, compute_report, write_report
from benchmarks.report.__main__ import main as report_main
from benchmarks.report.charts import MARKED_RUNS, build_charts
from harness.evidence.configs import config_labels, run_config
from benchmarks.report.style import (KEY_CHARS, KEY_LINE_IN, SHARED_NOISE_LABEL, STABLE_RC, figure, figure_legend,
                                     integer_ticks, lift_limit, noise_band, palette, save)
from benchmarks.report.style import title as panel_title
from conftest import container_spec, run_cli
from faults import small_spec
from harness.evidence.writer import EvidenceLocation
from harness.specs import AlgorithmSpec, RunSpec

HELDOUT_ROWS = 20


def spec(tmp_path: Path, *, seed: int = 0, temperature: float | None = None, proposer: str | None = None,
         algorithm: str | None = None) -> RunSpec:
    """A real run spec (what the harness would hash into a run id), varied on one field."""
    base = small_spec(container_spec("banking77", tmp_path), tmp_path, seed=seed)
    changes = {k: v for k, v in (("temperature", temperature), ("model", proposer)) if v is not None}
    base = base.model_copy(update={"proposer": base.proposer.model_copy(update=changes)})
    if algorithm is not None:
        base = base.model_copy(update={"algorithm": AlgorithmSpec(name=algorithm)})
    return base


def _heldout(candidate: str, solved: int) -> list[dict[str, Any]]:
    return [{"candidate_id": candidate, "task_id": f"test:{i}", "stage": "heldout",
             "reward": 1.0 if i < solved else 0.0} for i in range(HELDOUT_ROWS)]


def write_run(root: Path, run_spec: RunSpec, *, seed_solved: int, pick_solved: int | None = None,
              children: bool = True) -> Path:
    """One finished run in ``root/local/<run id>``. The seed c0 is scored on the 4-row pareto pool
    (0.25); c1 is judged on a 3-row minibatch (2/3 against its parent's 0), accepted and scored
    on the pareto pool (0.5); c2 is rejected on the next minibatch (0/2 with one failed row,
    against c1's 1/3). Heldout: the seed solves ``seed_solved`` of 20 rows, the pick c1
    ``pick_solved`` (None: the run kept its seed; c1 is then never accepted)."""
    run_id = run_spec.run_id
    rows: list[dict[str, Any]] = [{"candidate_id": "c0", "task_id": f"train:{8 + i}", "stage": "seed",
                                   "reward": r} for i, r in enumerate([1.0, 0.0, 0.0, 0.0])]
    candidates = [("c0", 0, [], "seed")]
    proposals: list[dict[str, Any]] = []
    accepted = pick_solved is not None
    if children:
        rows += [{"candidate_id": "c0", "task_id": f"train:{i}", "stage": "minibatch", "reward": 0.0}
                 for i in range(3)]
        rows += [{"candidate_id": "c1", "task_id": f"train:{i}", "stage": "minibatch", "reward": r}
                 for i, r in enumerate([1.0, 1.0, 0.0])]
        candidates.append(("c1", 1, ["c0"], "proposal" if accepted else "rejected"))
        proposals.append({"proposal_id": "p0", "parent_id": "c0", "child_id": "c1", "accepted": accepted,
                          "parent_minibatch_score": 0.0, "child_minibatch_score": 2 / 3})
        if accepted:
            rows += [{"candidate_id": "c1", "task_id": f"train:{8 + i}", "stage": "pareto", "reward": r}
                     for i, r in enumerate([1.0, 1.0, 0.0, 0.0])]
            rows += [{"candidate_id": "c1", "task_id": f"train:{3 + i}", "stage": "minibatch", "reward": r}
                     for i, r in enumerate([0.0, 1.0, 0.0])]
            rows += [{"candidate_id": "c2", "task_id": f"train:{3 + i}", "stage": "minibatch", "reward": r}
                     for i, r in enumerate([0.0, None, 0.0])]
            rows.append({"candidate_id": "c3", "task_id": "train:6", "stage": "minibatch", "reward": None,
                         "status": "refused"})  # never ran: spends nothing
            candidates.append(("c2", 2, ["c1"], "rejected"))
            proposals.append({"proposal_id": "p1", "parent_id": "c1", "child_id": "c2", "accepted": False,
                              "parent_minibatch_score": 1 / 3, "child_minibatch_score": 0.0})
    rows += _heldout("c0", seed_solved)
    if accepted:
        rows += _heldout("c1", pick_solved or 0)
    location = EvidenceLocation(str(root), "local", run_id)
    location.write_table("rollouts", [{
        "run_id": run_id, "seq": seq, "rollout_id": f"r{seq}", "split": row["task_id"].split(":")[0],
        "status": row.get("status", "ok" if row["reward"] is not None else "error"), "elapsed_s": float(seq),
        "prompt_tokens": 1, "completion_tokens": 1, "cost_usd": 0.0, **{k: v for k, v in row.items() if k != "status"},
    } for seq, row in enumerate(rows)])
    location.write_table("candidates", [{
        "run_id": run_id, "candidate_id": cid, "index": index, "parent_ids": parents, "generation": min(index, 1),
        "origin": origin, "digest": cid, "modules_json": "{}", "rollouts_at_creation": 4 * index,
        "cost_usd_at_creation": 0.0, "elapsed_s_at_creation": float(index)} for cid, index, parents, origin in candidates])
    location.write_table("proposals", [{"run_id": run_id, **p} for p in proposals])
    location.write_table("events", [])
    location.write_manifest({
        "run_id": run_id, "sweep": "local", "status": "done", "axes": {}, "identity": run_spec.identity(),
        "spec": run_spec.model_dump(mode="json"), "seed_candidate_id": "c0",
        "best_candidate_id": "c1" if accepted else "c0"})
    return Path(location.run_dir)


def title(ax: Any) -> str:
    """A panel's title (set on the left), as one line."""
    return str(ax.get_title(loc="left")).replace("\n", " ")


def legend_colours(fig: Figure) -> dict[str, str]:
    """Legend label -> colour of its artist, over every panel of a figure."""
    found: dict[str, str] = {}
    for ax in fig.axes:
        for handle, label in zip(*ax.get_legend_handles_labels()):
            if hasattr(handle, "patches"):  # bars
                colour = handle.patches[0].get_facecolor()
            elif hasattr(handle, "lines"):  # error bars
                colour = handle.lines[0].get_color()
            elif hasattr(handle, "get_facecolor") and not hasattr(handle, "get_color"):
                colour = handle.get_facecolor()
            else:
                colour = handle.get_color()
            found[label] = to_hex(colour, keep_alpha=False)
    return found


# ---- a single run --------------------------------------------------------------------------

def test_one_run_directory_is_a_report_of_its_trace(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    run_dir = write_run(tmp_path / "ev", spec(tmp_path), seed_solved=5, pick_solved=10)
    paths = write_report(str(run_dir), out=str(tmp_path / "out"))
    assert sorted(Path(p).name for p in paths.charts) == ["trace.png", "trace.svg"]  # no sweep-shaped charts
    trace = pl.read_parquet(paths.trace_points)
    points = {(r["kind"], r["candidate_id"]): r for r in trace.to_dicts()}
    # 4 seed rows, then 3 + 3 minibatch, 4 pareto, 3 + 3 minibatch; the refused row spent nothing
    assert {r["spent_total"] for r in points.values()} == {20}
    assert (points["pareto", "c0"]["x"], points["pareto", "c0"]["y"], points["pareto", "c0"]["best_so_far"]) == (
        4, 0.25, 0.25)
    assert (points["pareto", "c1"]["x"], points["pareto", "c1"]["y"], points["pareto", "c1"]["best_so_far"]) == (
        14, 0.5, 0.5)
    assert (points["minibatch", "c1"]["x"], points["minibatch", "c1"]["accepted"]) == (10, True)
    assert points["minibatch", "c1"]["y"] == pytest.approx(2 / 3)
    # the failed row has no reward: a mean of 0 over 2 rows, never a zero counted in
    assert (points["minibatch", "c2"]["x"], points["minibatch", "c2"]["y"], points["minibatch", "c2"]["n"],
            points["minibatch", "c2"]["accepted"]) == (20, 0.0, 2, False)
    assert (points["parent_minibatch", "c2"]["x"], points["parent_minibatch", "c2"]["y"]) == (20, pytest.approx(1 / 3))
    assert ("minibatch", "c0") not in points  # the seed as a parent is not a proposal
    markdown = Path(paths.summary_md).read_text()
    assert "K=None" not in markdown and f"# Run {run_dir.name}: gepa on banking77" in markdown
    assert "the run's pick lifts heldout 0.250 -> 0.500 (+0.250, 20 rows); 2 proposals judged, 1 accepted" in markdown
    assert "seed noise floor unknown" in markdown
    snapshot = {p.name: p.read_bytes() for p in Path(paths.report_dir).iterdir()}
    assert write_report(str(run_dir), out=str(tmp_path / "out")) == paths  # regenerated: the same bytes
    assert {p.name: p.read_bytes() for p in Path(paths.report_dir).iterdir()} == snapshot
    # the CLI on the run's directory
    assert report_main([str(run_dir), "--out", str(tmp_path / "cli")]) == 0
    out = capsys.readouterr().out
    assert f"# Run {run_dir.name}" in out and "(2 chart files)" in out


def test_the_trace_figure_has_integer_rollout_ticks_a_score_axis_and_its_conclusion(tmp_path: Path) -> None:
    run_dir = write_run(tmp_path / "ev", spec(tmp_path), seed_solved=5, pick_solved=None)
    frames = compute_report(str(run_dir))
    figures = build_charts(frames)
    assert list(figures) == ["trace"]
    (ax,) = [a for a in figures["trace"].axes if a.get_visible()]
    assert all(float(t).is_integer() for t in ax.get_xticks())
    assert ax.get_ylim()[0] <= 0.0 and ax.get_ylim()[1] >= 1.0  # scores on 0-1, not zoomed onto a difference
    assert "the run kept its seed (heldout 0.250, 20 rows); 1 proposal judged, 0 accepted" in title(ax)
    labels = ax.get_legend_handles_labels()[1]
    assert "child on its minibatch: rejected" in labels and "parent, same minibatch" in labels


@pytest.mark.parametrize("make", ["empty", "sweeps", "missing", "unfinished"])
def test_a_path_without_a_run_is_one_error_line(tmp_path: Path, capsys: pytest.CaptureFixture[str], make: str) -> None:
    path = tmp_path / "target"
    if make == "empty":
        path.mkdir()
    elif make == "sweeps":  # an evidence root: it names the folders to pass instead
        write_run(path, spec(tmp_path), seed_solved=5)
    elif make == "unfinished":
        run_dir = write_run(tmp_path / "ev", spec(tmp_path), seed_solved=5)
        (run_dir / "manifest.json").unlink()
        path = run_dir
    assert report_main([str(path), "--no-charts", "--out", str(tmp_path / "out")]) == 2
    lines = [line for line in capsys.readouterr().err.splitlines() if line.strip()]
    assert len(lines) == 1 and lines[0].startswith("error: ")
    expected = {"empty": "holds no run", "sweeps": "it holds local: pass one of them", "missing": "no such directory",
                "unfinished": "an unfinished run"}[make]
    assert expected in lines[0]


# ---- single runs pool only when their configurations match ------------------------------------

def test_single_runs_of_different_configurations_are_separate_cells_without_a_ci(tmp_path: Path) -> None:
    root = tmp_path / "ev"
    write_run(root, spec(tmp_path, temperature=0.8), seed_solved=5, pick_solved=9)
    write_run(root, spec(tmp_path, temperature=0.2), seed_solved=6, pick_solved=6)
    summary = compute_report(str(root / "local")).summary
    assert summary["config"].to_list() == ["proposer.temperature=0.2", "proposer.temperature=0.8"]
    assert summary["label"].to_list() == ["gepa (proposer.temperature=0.2)", "gepa (proposer.temperature=0.8)"]
    assert summary["n_runs"].to_list() == [1, 1] and set(summary["ci"]) == {"n=1, no CI"}
    assert summary["pick_lift_lo"].to_list() == [None, None] and summary["pick_lift_hi"].to_list() == [None, None]


def test_single_runs_of_one_configuration_pool_over_seeds(tmp_path: Path) -> None:
    root = tmp_path / "ev"
    for seed, (seed_solved, pick_solved) in enumerate([(5, 9), (7, 9), (6, 6)]):
        write_run(root, spec(tmp_path, seed=seed), seed_solved=seed_solved, pick_solved=pick_solved)
    frames = compute_report(str(root / "local"))
    assert "config" not in frames.axes
    (cell,) = frames.summary.to_dicts()
    assert (cell["n_runs"], cell["ci"]) == (3, "bootstrap95")
    assert cell["pick_lift_lo"] is not None and cell["pick_lift_lo"] <= cell["pick_lift_mean"] <= cell["pick_lift_hi"]
    # the seed's run-to-run spread: 0.25, 0.35, 0.30 -> +-0.05 over 3 runs
    assert (cell["noise_runs"], cell["noise_half_range"]) == (3, pytest.approx(0.05))


def test_configuration_names_say_what_differs_and_ignore_transport() -> None:
    heldout = [f"test:{i}" for i in range(50)]
    identity = {"seed": 0, "container": {"name": "banking77", "options": []}, "algorithm": {"name": "gepa"},
                "proposer": {"model": "q-0.5b", "source": "q-0.5b"}, "pools": {"heldout": heldout}}
    manifests = {
        "a": {"identity": identity},
        "b": {"identity": {**identity, "seed": 1, "proposer": {"model": "q-1.5b", "source": "q-1.5b"}}},
        "c": {"identity": {**identity, "pools": {"heldout": heldout * 2}}},
        # written before manifests carried the identity: the same fields of the spec, transport ignored
        "d": {"spec": {**identity, "seed": 3, "evidence_root": "/x", "concurrency": 8, "force": True,
                       "container": {"name": "banking77", "options": [], "command": ["python"], "url": None},
                       "proposer": {"model": "q-0.5b", "source": "q-0.5b", "timeout_s": 9.0}}},
        "e": {"identity": {**identity, "algorithm": {"name": "seed_only"}}},  # another stack: its own group
        # an algorithm parameter goes by its own name: the label starts with the algorithm's
        "f": {"identity": {**identity, "algorithm": {"name": "gepa", "params": {"minibatch_size": 8}}}},
    }
    labels = config_labels({run_id: run_config(m) for run_id, m in manifests.items()})
    assert labels is not None
    assert labels["a"] == labels["d"] and labels["e"] == "-"
    assert "proposer.model=q-1.5b" in labels["b"] and "source" not in labels["b"]
    assert "pools.heldout=[100 items #" in labels["c"] and len({labels["a"], labels["b"], labels["c"]}) == 3
    assert "minibatch_size=8" in labels["f"] and "algorithm.params" not in labels["f"]
    assert "minibatch_size=unset" in labels["a"]
    same = config_labels({run_id: run_config(manifests[run_id]) for run_id in ("a", "d", "e")})
    assert same is None  # nothing differs within a stack: no config axis at all


# ---- charts: own seed, noise floor, one palette, integer counts, conclusions -------------------

def _mixed_folder(tmp_path: Path) -> Path:
    """gepa with two proposer models (two seeds each) and the seed-only arm, in one folder."""
    root = tmp_path / "ev"
    write_run(root, spec(tmp_path, seed=0, proposer="big"), seed_solved=5, pick_solved=10)
    write_run(root, spec(tmp_path, seed=1, proposer="big"), seed_solved=7, pick_solved=12)
    write_run(root, spec(tmp_path, seed=0, proposer="small"), seed_solved=5, pick_solved=5)
    write_run(root, spec(tmp_path, seed=1, proposer="small"), seed_solved=6, pick_solved=7)
    write_run(root, spec(tmp_path, seed=0, algorithm="seed_only"), seed_solved=6, children=False)
    return root / "local"


def test_every_chart_takes_one_colour_per_stack_from_one_palette(tmp_path: Path) -> None:
    frames = compute_report(str(_mixed_folder(tmp_path)))
    figures = build_charts(frames)
    assert set(figures) == {"coverage", "best_vs_rollouts", "proposer_scaling", "same_container"}
    colours = palette(frames.summary["label"].to_list())
    assert len(set(colours.values())) == len(colours) == 3 and colours["seed_only"] == "#7f7f7f"
    for name, fig in figures.items():
        drawn = {label: colour for label, colour in legend_colours(fig).items() if label in colours}
        assert drawn == {label: colours[label] for label in drawn}, name
        assert len(drawn) >= 2, name  # the stacks really are in the legend


def test_a_figure_of_several_panels_has_one_key(tmp_path: Path) -> None:
    """Panels share one legend (a label has one colour in the whole report); bands of seed noise
    that differ between panels become one entry, their widths being in the panels' titles."""
    figures = build_charts(compute_report(str(_mixed_folder(tmp_path))))
    coverage = figures["coverage"]
    assert len(coverage.legends) == 1 and all(ax.get_legend() is None for ax in coverage.axes)
    (ax,) = [a for a in figures["same_container"].axes if a.get_visible()]
    assert ax.get_legend() is not None and not figures["same_container"].legends  # one panel keeps its own
    fig, axes = figure(2, ncols=2)
    for ax, half in zip(axes, (0.05, 0.1)):
        noise_band(ax, half, 3)
        ax.plot([0, 1], [0, 0], color="#1f77b4", label="gepa")
    figure_legend(fig, axes)
    (key,) = fig.legends
    assert [t.get_text() for t in key.get_texts()] == ["gepa", SHARED_NOISE_LABEL]


def test_a_key_of_configuration_labels_wraps_and_the_figure_grows_to_hold_it(tmp_path: Path) -> None:
    """Labels naming configurations run to 150 characters: on one line each they pushed the
    panels out of the figure (matplotlib gave up its layout), and a tall key was cut off."""
    names = [f"gepa (algorithm.params.cited_memory={m}, algorithm.params.edit_formats=[\"examples\",\"rules\"], "
             f"algorithm.params.examples_first=true, +11 more #{m:06d})" for m in range(12)]
    fig, axes = figure(2, ncols=2)
    width, height = fig.get_figwidth(), fig.get_figheight()
    for ax in axes:
        for name in names:
            ax.plot([0, 1], [0, 1], label=name)
    figure_legend(fig, axes)
    (key,) = fig.legends
    texts = [t.get_text() for t in key.get_texts()]
    assert [t.replace("\n", " ") for t in texts] == names
    assert all("\n" in t and max(len(line) for line in t.splitlines()) <= KEY_CHARS for t in texts)
    lines = sum(t.count("\n") + 1 for t in texts)
    assert fig.get_figwidth() > width and fig.get_figheight() >= max(height, lines * KEY_LINE_IN)
    with warnings.catch_warnings():
        warnings.simplefilter("error")  # "constrained_layout not applied" is a UserWarning
        save(fig, tmp_path, "key")
    bottom, top = key.get_window_extent().y0, key.get_window_extent().y1
    assert 0 <= bottom and top <= fig.bbox.height  # the whole key is inside the figure


def test_a_key_beside_two_panels_leaves_their_titles_room(tmp_path: Path) -> None:
    """A key beside the panels takes its width from the figure's growth, not from theirs: two
    panels' titles, wrapped for a whole panel, stay side by side instead of running into
    each other (as they did in the sweep report's best-vs charts with ten cells)."""
    fig, axes = figure(2, ncols=2)
    for i, ax in enumerate(axes):
        for cell in range(10):
            ax.plot([0, 1], [0, cell], label=f"gepa_ai (proposer=p_{cell:02d}_{'x' * 12})")
        panel_title(ax, f"task_{i}: picked on heldout (an upper bound), the best candidate is +0.229 over its "
                  "run's seed (gepa_ai (proposer=p_large), n=5 seeds, CI [+0.201, +0.263])")
    figure_legend(fig, axes)
    save(fig, tmp_path, "titles")  # lays out, then leaves the layout fixed
    renderer = FigureCanvasAgg(fig).get_renderer()
    left, right = (next(t for t in ax.get_children() if isinstance(t, Text) and t.get_text() == ax.get_title("left"))
                   .get_window_extent(renderer) for ax in axes)
    assert left.x1 < right.x0  # the first panel's title ends before the second's begins
    assert right.x1 < fig.legends[0].get_window_extent(renderer).x0


def test_a_cell_is_one_line_and_markers_go_past_a_dozen_runs(tmp_path: Path) -> None:
    """Each cell's runs are one step line (NaN breaks between runs); with more than
    MARKED_RUNS runs in a panel the per-candidate markers are left out."""
    few = compute_report(str(_mixed_folder(tmp_path)))
    root = tmp_path / "many"
    for seed in range(MARKED_RUNS + 1):
        write_run(root, spec(tmp_path, seed=seed), seed_solved=5, pick_solved=6 + seed % 5)
    many = compute_report(str(root / "local"))
    for frames, marker in ((few, "o"), (many, "None")):
        ax = next(a for a in build_charts(frames)["coverage"].axes if a.get_visible())
        lines = [line for line in ax.get_lines() if line.get_label() in set(frames.summary["label"])]
        assert len(lines) == len({line.get_label() for line in lines}) >= 1  # one line per cell
        assert {line.get_marker() for line in lines} == {marker}
    (line,) = [line for line in next(a for a in build_charts(many)["coverage"].axes if a.get_visible()).get_lines()
               if line.get_label() in set(many.summary["label"])]
    assert int(np.isnan(np.asarray(line.get_ydata(), dtype=float)).sum()) == MARKED_RUNS  # a break between runs


def _axes_boxes(svg: Path) -> list[tuple[float, ...]]:
    """Each axes' clip rectangle in an SVG (x, y, width, height in points)."""
    text = svg.read_text()
    return [tuple(float(v) for v in m) for m in
            re.findall(r'<clipPath id="[^"]+">\s*<rect x="([\d.]+)" y="([\d.]+)" width="([\d.]+)" '
                       r'height="([\d.]+)"', text)]


def test_saving_lays_out_once_and_regenerates_the_same_bytes(tmp_path: Path) -> None:
    """style.save draws each format once and lays out once (the PNG's layout stays for the
    SVG): the axes sit where savefig's own layout puts them, within four points (text is
    measured at the PNG's dpi, where hinting rounds a title's height up to 3.5 points
    differently than at the SVG's 72), and saving fresh figures again writes the very same bytes,
    for sweep charts and a single run's trace."""
    run_dir = write_run(tmp_path / "one", spec(tmp_path), seed_solved=5, pick_solved=10)
    reports = [compute_report(str(_mixed_folder(tmp_path))), compute_report(str(run_dir))]

    def figures() -> dict[str, Figure]:
        return {name: fig for frames in reports for name, fig in build_charts(frames).items()}

    first, second, reference = figures(), figures(), figures()
    assert {"trace", "coverage", "same_container"} <= set(first)
    for name, fig in first.items():
        png, svg = save(fig, tmp_path / "first", name)
        again_png, again_svg = save(second[name], tmp_path / "second", name)
        assert png.read_bytes() == again_png.read_bytes() and svg.read_bytes() == again_svg.read_bytes(), name
        with mpl.rc_context(STABLE_RC):
            reference[name].savefig(tmp_path / f"{name}.svg", metadata={"Date": None, "Creator": None})
        ours, theirs = _axes_boxes(svg), _axes_boxes(tmp_path / f"{name}.svg")
        assert len(ours) == len(theirs) >= 1, name
        for box, expected in zip(ours, theirs):
            assert box == pytest.approx(expected, abs=4.0), name


def test_count_axes_have_integer_ticks_and_lift_axes_do_not_exaggerate(tmp_path: Path) -> None:
    frames = compute_report(str(_mixed_folder(tmp_path)))
    figures = build_charts(frames)
    for name in ("coverage", "best_vs_rollouts"):
        for ax in (a for a in figures[name].axes if a.get_visible()):
            assert all(float(t).is_integer() for t in ax.get_xticks()), name
    for ax in (a for a in figures["coverage"].axes if a.get_visible()):
        assert all(float(t).is_integer() for t in ax.get_yticks())
    for name in ("best_vs_rollouts", "proposer_scaling", "same_container"):
        for ax in (a for a in figures[name].axes if a.get_visible()):
            low, high = ax.get_ylim()
            assert low == pytest.approx(-high) and high >= 0.05, name  # symmetric around the seed
    assert integer_ticks(1, 1) == [1] and integer_ticks(0, 65) == [0, 10, 20, 30, 40, 50, 60]
    assert integer_ticks(0.6, 0.8) == [0, 1]
    assert lift_limit([0.001, -0.002]) == 0.05 and lift_limit([0.3]) == pytest.approx(0.35)


def test_titles_state_the_conclusion_against_the_noise_floor(tmp_path: Path) -> None:
    frames = compute_report(str(_mixed_folder(tmp_path)))
    # the big proposer: lifts of +0.25 and +0.25; the seed spreads 0.25..0.35 over 5 runs: noise +-0.05
    lift = "banking77: gepa (proposer.model=big) lifts heldout by +0.250 (n=2 seeds, CI [+0.250, +0.250]), " \
           "beyond the seed noise ±0.050"
    figures = build_charts(frames)
    for name in ("same_container", "proposer_scaling"):
        (ax,) = [a for a in figures[name].axes if a.get_visible()]
        assert title(ax) == lift, name
        assert "seed noise ±0.050 (half range, 5 runs)" in ax.get_legend_handles_labels()[1]
    paths = write_report(str(tmp_path / "ev" / "local"), out=str(tmp_path / "out"), charts=False)
    assert f"- {lift}\n" in Path(paths.summary_md).read_text()


def test_a_lift_inside_the_noise_is_not_a_gain(tmp_path: Path) -> None:
    root = tmp_path / "ev"
    write_run(root, spec(tmp_path, seed=0), seed_solved=7, pick_solved=8)  # +0.05
    write_run(root, spec(tmp_path, seed=1), seed_solved=3, pick_solved=3)  # seed 0.15 vs 0.35: +-0.10
    frames = compute_report(str(root / "local"), ReportOptions())
    text = frames.conclusions.filter(pl.col("subject") == "lift")["text"].item()
    assert text.startswith("banking77: no stack beats the seed's noise floor (±0.100 over 2 runs); best gepa: +0.025")


def test_one_run_past_the_noise_is_reported_as_one_run(tmp_path: Path) -> None:
    """The local proposer_scaling case: the seed scores 0.35 and 0.30 on the same rows; the 0.5B
    proposer's run kept its seed (lift 0, not a gain over a pooled seed line)."""
    root = tmp_path / "ev"
    write_run(root, spec(tmp_path, proposer="0.5b"), seed_solved=7, pick_solved=None)
    write_run(root, spec(tmp_path, proposer="1.5b"), seed_solved=6, pick_solved=8)
    frames = compute_report(str(root / "local"))
    assert frames.runs.sort("proposer_model")["pick_lift"].to_list() == [0.0, pytest.approx(0.1)]
    (text,) = frames.conclusions.filter(pl.col("subject") == "lift")["text"]
    assert text == ("banking77: gepa (proposer.model=1.5b) lifts heldout by +0.100 in its one run (no CI), past the "
                    "seed noise ±0.025 (2 runs)")


def test_two_scripted_single_runs_with_different_proposers_are_two_cells(tmp_path: Path, data_dir: Path) -> None:
    """The real harness, scripted models: runs differing in the proposer's temperature stay apart;
    the same configuration at another seed pools with its first run."""
    evidence = tmp_path / "evidence"
    small = ["models=scripted", f"evidence_root={evidence}", f"data_dir={data_dir}", "budget.max_rollouts=16",
             "pools.train.count=8", "pools.pareto.start=8", "pools.pareto.count=4", "pools.heldout.count=4"]
    for extra in (["seed=0"], ["seed=0", "proposer.temperature=0.2"], ["seed=1"]):
        result = run_cli(*small, *extra)
        assert result.returncode == 0, result.stdout[-2000:]
    summary = compute_report(str(evidence / "local")).summary
    assert summary.select("config", "n_runs", "ci").rows() == [
        ("proposer.temperature=0.2", 1, "n=1, no CI"), ("proposer.temperature=0.8", 2, "bootstrap95")]
