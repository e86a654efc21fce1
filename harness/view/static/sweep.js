"use strict";
// The sweep page: runs table (sortable), the report's charts and summary.

(function main() {
  const data = readJson("view-data");
  document.getElementById("sweep-path").textContent = data.path;
  const counts = {};
  for (const run of data.runs) counts[run.status] = (counts[run.status] || 0) + 1;
  document.getElementById("status-counts").replaceChildren(
    `${data.runs.length} runs: `, ...Object.entries(counts).map(([s, n]) => h("span", {}, badge(`${n} ${s}`, s), " ")));

  const scoreCol = (label, key) => ({
    label, num: true, value: (r) => fmtScore(r[key]), sort: (r) => (r[key] ? r[key].mean : null),
  });
  const columns = [
    {label: "run", value: (r) => (r.page ? h("a", {href: r.page}, r.run_id) : r.run_id), sort: (r) => r.run_id},
    ...data.axes.map((axis) => ({label: axis, value: (r) => r.axes[axis] ?? "–", sort: (r) => r.axes[axis] ?? null})),
    {label: "status", value: (r) => h("span", {}, badge(r.status), r.error ? h("div", {class: "error-text clip"}, r.error) : null),
     sort: (r) => r.status},
    scoreCol("seed heldout", "seed_heldout"),
    scoreCol("pick heldout", "pick_heldout"),
    scoreCol("best heldout (test-set)", "best_heldout"),
    {label: "lift (pick − seed)", num: true, value: (r) => lift(r), sort: (r) => liftValue(r)},
    {label: "rollouts", num: true, value: (r) => fmtInt(r.rollouts), sort: (r) => r.rollouts},
    {label: "heldout rollouts", num: true, value: (r) => fmtInt(r.heldout_rollouts), sort: (r) => r.heldout_rollouts},
    {label: "failed", num: true, value: (r) => fmtInt(r.failed_rollouts), sort: (r) => r.failed_rollouts},
    {label: "cost", num: true, value: (r) => (r.status === "done" || r.cost_usd !== null ? fmtCost(r.cost_usd) : "–"),
     sort: (r) => r.cost_usd},
    {label: "wall", num: true, value: (r) => fmtSeconds(r.wall_s), sort: (r) => r.wall_s},
  ];
  function liftValue(r) {
    const a = r.seed_heldout, b = r.pick_heldout;
    return a && b && a.mean !== null && b.mean !== null ? b.mean - a.mean : null;
  }
  function lift(r) {
    const value = liftValue(r);
    return value === null ? "–" : `${value >= 0 ? "+" : ""}${value.toFixed(3)}`;
  }
  fillTable(document.getElementById("runs"), columns, data.runs, {sortable: true, rowKey: (r) => r.run_id});

  const charts = document.getElementById("charts");
  if (data.charts.length === 0) {
    charts.replaceChildren(h("p", {class: "muted"}, "No report/ folder: run python -m benchmarks.report on this sweep " +
      "to add its charts here."));
  } else {
    charts.replaceChildren(...data.charts.map((c) => h("figure", {},
      h("img", {src: c.data_uri, alt: c.name, loading: "lazy"}), h("figcaption", {}, c.name))));
  }
  if (data.summary_md) document.getElementById("summary-md").textContent = data.summary_md;
  else document.getElementById("summary-md-box").hidden = true;
  markReady("runs");
})();
