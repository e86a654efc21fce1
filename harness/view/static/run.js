"use strict";
// The run page: summary, lineage graph and trace (Vega-Lite), candidates and proposals tables,
// a detail panel (diffs from difflib, the proposal with its prompt and replies) and the
// heldout rows with filters. Data comes from the one JSON block; tables render on demand.

const ROWS_PAGE = 300;

(function main() {
  const data = readJson("view-data");
  const specs = readJson("view-charts").specs;
  const byId = new Map(data.candidates.map((c) => [c.candidate_id, c]));
  const proposalById = new Map(data.proposals.map((p) => [p.proposal_id, p]));
  const s = data.summary;

  // ---- summary ----------------------------------------------------------------------
  if (data.sweep_link) {
    document.getElementById("crumbs").replaceChildren(h("a", {href: data.sweep_link}, `← sweep ${s.sweep || ""}`));
  }
  facts(document.getElementById("summary"), [
    ["status", h("span", {}, badge(s.status), s.stop_reason ? ` stopped: ${s.stop_reason}` : "")],
    ["error", s.error],
    ["container", s.container], ["algorithm", s.algorithm], ["policy", s.policy_model], ["proposer", s.proposer_model],
    ["seed", s.seed], ["axes", Object.entries(s.axes).map(([k, v]) => `${k}=${v}`).join(", ")],
    ["seed heldout", `${fmtScore(s.seed_heldout)} · ${s.seed_candidate_id || "–"}`],
    ["pick heldout", `${fmtScore(s.pick_heldout)} · ${s.pick_candidate_id || "–"}`],
    ["rollouts", `${fmtInt(s.rollouts)} optimization + ${fmtInt(s.heldout_rollouts)} heldout`],
    ["error rows", fmtInt(s.failed_rollouts)], ["cost", fmtCost(s.cost_usd)], ["wall time", fmtSeconds(s.wall_s)],
    ["candidates", fmtInt(data.candidates.length)], ["proposals", fmtInt(data.proposals.length)],
    ["solved at", `reward ≥ ${s.solved_threshold}`], ["started", s.started_at],
  ]);
  document.getElementById("manifest").textContent = JSON.stringify(data.manifest, null, 2);

  // ---- charts -------------------------------------------------------------------------
  function embed(id, spec, datasets) {
    const el = document.getElementById(id);
    if (typeof vegaEmbed !== "function") {
      el.textContent = "charts unavailable (the Vega runtime is missing from this page)";
      return Promise.resolve(null);
    }
    // log level 1 (vega's Error): an empty layer (a run without children has no edges) is not worth a warning
    return vegaEmbed(el, {...spec, datasets}, {renderer: "svg", actions: false, logLevel: 1}).then((result) => {
      markReady(id);
      return result;
    });
  }
  const nodes = data.candidates.map((c) => ({
    candidate_id: c.candidate_id, status: c.status, is_pick: c.is_pick, pareto: c.pareto, heldout: c.heldout,
    minibatch: c.minibatch, edit_format: c.edit_format, x: c.x, y: c.y, label: c.label,
  }));
  embed("lineage", specs.lineage, {nodes, edges: data.edges}).then((result) => {
    if (!result) return;
    result.view.addEventListener("click", (_event, item) => {
      const id = item && item.datum && item.datum.candidate_id;
      if (id && byId.has(id) && !item.datum.edge_id) selectCandidate(id);
    });
  });
  embed("trace", specs.trace, {trace: data.trace});

  // ---- candidates and proposals tables ----------------------------------------------------
  fillTable(document.getElementById("candidates"), [
    {label: "candidate", value: (c) => h("span", {}, c.candidate_id, c.is_pick ? " " : "", c.is_pick ? badge("pick") : null),
     sort: (c) => c.index},
    {label: "status", value: (c) => badge(c.status), sort: (c) => c.status},
    {label: "parents", value: (c) => c.parent_ids.join(", ") || "–"},
    {label: "gen", num: true, value: (c) => c.generation, sort: (c) => c.generation},
    {label: "edit", value: (c) => c.edit_format || "–", sort: (c) => c.edit_format},
    {label: "minibatch parent → child", num: true,
     value: (c) => (c.minibatch === null && c.parent_minibatch === null ? "–" : `${fmt(c.parent_minibatch, 2)} → ${fmt(c.minibatch, 2)}`),
     sort: (c) => c.minibatch},
    {label: "pareto", num: true, value: (c) => fmtScore(c.pareto), sort: (c) => c.pareto.mean},
    {label: "heldout", num: true, value: (c) => fmtScore(c.heldout), sort: (c) => (c.heldout ? c.heldout.mean : null)},
    {label: "rollouts at creation", num: true, value: (c) => fmtInt(c.rollouts_at_creation), sort: (c) => c.rollouts_at_creation},
  ], data.candidates, {sortable: true, rowKey: (c) => c.candidate_id, onRow: (c) => selectCandidate(c.candidate_id)});

  fillTable(document.getElementById("proposals"), [
    {label: "proposal", value: (p) => p.proposal_id, sort: (p) => p.proposal_id},
    {label: "iter", num: true, value: (p) => p.iteration ?? "–", sort: (p) => p.iteration},
    {label: "parent → child", value: (p) => `${p.merged_from.length ? p.merged_from.join(" + ") : p.parent_id || "–"} → ${p.child_id || "none"}`},
    {label: "module", value: (p) => p.module || "–"},
    {label: "edit", value: (p) => p.edit_format || "–", sort: (p) => p.edit_format},
    {label: "status", value: (p) => badge(p.status || "–", p.status === "changed" ? "ok" : "missing"), sort: (p) => p.status},
    {label: "accepted", value: (p) => (p.accepted ? badge("accepted") : badge("rejected")), sort: (p) => p.accepted},
    {label: "minibatch", num: true, value: (p) => `${fmt(p.parent_minibatch, 2)} → ${fmt(p.child_minibatch, 2)}`,
     sort: (p) => p.child_minibatch},
    {label: "screened out", value: (p) => screenedText(p.screened_out) || "–"},
    {label: "replies", num: true, value: (p) => p.proposer_replies.length, sort: (p) => p.proposer_replies.length},
    {label: "error", value: (p) => (p.error ? h("div", {class: "error-text clip"}, p.error) : "")},
  ], data.proposals, {sortable: true, rowKey: (p) => p.proposal_id, onRow: (p) => selectProposal(p.proposal_id)});

  function screenedText(screened) {
    return Object.entries(screened || {}).map(([reason, n]) => `${reason}: ${Array.isArray(n) ? n.length : n}`).join(", ");
  }

  // ---- detail panel ---------------------------------------------------------------------
  const title = document.getElementById("detail-title");
  const body = document.getElementById("detail-body");

  function highlight(tableId, key) {
    document.querySelectorAll(`#${tableId} tbody tr`).forEach((tr) => tr.classList.toggle("selected", tr.dataset.key === key));
  }

  function diffBlock(heading, key) {
    const box = h("div", {class: "diff-box"});
    box.innerHTML = data.diffs[key];  // difflib's HtmlDiff escaped the candidate texts
    return h("div", {class: "diff"}, h("h3", {}, heading), box);
  }

  function selectCandidate(id) {
    const c = byId.get(id);
    highlight("candidates", id);
    highlight("proposals", c.proposal_id);
    title.replaceChildren(`Candidate ${id} `, badge(c.status), c.is_pick ? " " : "", c.is_pick ? badge("pick") : "");
    const parts = [h("dl", {class: "kv"},
      h("dt", {}, "parents"), h("dd", {}, c.parent_ids.join(", ") || "none (the seed)"),
      h("dt", {}, "pareto"), h("dd", {}, fmtScore(c.pareto)),
      h("dt", {}, "heldout"), h("dd", {}, c.heldout ? fmtScore(c.heldout) : "not scored on heldout"),
      h("dt", {}, "minibatch"), h("dd", {}, c.minibatch === null ? "–" : `${fmt(c.parent_minibatch, 2)} → ${fmt(c.minibatch, 2)}`))];
    c.parent_ids.forEach((parent, i) => parts.push(diffBlock(`Diff against parent ${parent}`, c.diff_vs_parent[i])));
    if (c.diff_vs_seed && !c.diff_vs_parent.includes(c.diff_vs_seed)) {
      parts.push(diffBlock(`Diff against the seed ${s.seed_candidate_id}`, c.diff_vs_seed));
    }
    if (c.proposal_id) parts.push(proposalBlock(proposalById.get(c.proposal_id)));
    parts.push(h("details", {}, h("summary", {}, "Full text"),
      ...Object.entries(c.modules).map(([module, text]) => h("div", {}, h("h4", {}, module), h("pre", {}, text)))));
    body.replaceChildren(...parts);
  }

  function selectProposal(id) {
    const p = proposalById.get(id);
    if (p.child_id && byId.has(p.child_id)) return selectCandidate(p.child_id);
    highlight("proposals", id);
    highlight("candidates", null);
    title.replaceChildren(`Proposal ${id} (no child) `, badge(p.status || "–", "missing"));
    body.replaceChildren(proposalBlock(p));
  }

  function proposalBlock(p) {
    const screened = Object.entries(p.screened_out || {});
    return h("div", {class: "proposal"},
      h("h3", {}, `Proposal ${p.proposal_id}`),
      h("dl", {class: "kv"},
        h("dt", {}, "iteration"), h("dd", {}, p.iteration ?? "–"),
        h("dt", {}, "parent"), h("dd", {}, p.merged_from.length ? `merge of ${p.merged_from.join(" + ")}` : p.parent_id || "–"),
        h("dt", {}, "module"), h("dd", {}, p.module || "–"),
        h("dt", {}, "edit format"), h("dd", {}, p.edit_format || "–"),
        h("dt", {}, "status"), h("dd", {}, `${p.status || "–"}${p.accepted ? " · accepted" : " · not accepted"}`),
        h("dt", {}, "minibatch"), h("dd", {}, `parent ${fmt(p.parent_minibatch, 2)} → child ${fmt(p.child_minibatch, 2)}`),
        h("dt", {}, "proposer calls"), h("dd", {}, `${p.attempts ?? "–"} (${fmtInt(p.prompt_tokens)} prompt + ` +
          `${fmtInt(p.completion_tokens)} completion tokens, ${fmtSeconds(p.latency_s)}, ${fmtCost(p.cost_usd)})`),
        h("dt", {}, "cut-off replies"), h("dd", {}, p.truncated_replies ?? "–"),
        h("dt", {}, "learned lines"), h("dd", {}, p.learned_lines ?? "–"),
        h("dt", {}, "error"), h("dd", {class: p.error ? "error-text" : null}, p.error || "none")),
      h("h4", {}, "Dropped by the screen (screened_out_json)"),
      screened.length ? h("ul", {}, screened.map(([reason, lines]) => h("li", {}, `${reason}: `,
        Array.isArray(lines) ? h("pre", {}, lines.join("\n")) : String(lines)))) : h("p", {class: "muted"}, "nothing"),
      h("details", {open: true}, h("summary", {}, `Raw replies (proposer_replies: ${p.proposer_replies.length})`),
        ...p.proposer_replies.map((reply, i) => h("div", {}, h("div", {class: "message-role"}, `reply ${i + 1}`), h("pre", {}, reply)))),
      h("details", {}, h("summary", {}, `Proposer prompt (proposer_prompt: ${p.proposer_prompt.length} messages)`),
        ...p.proposer_prompt.map((m) => h("div", {}, h("div", {class: "message-role"}, m.role || "?"),
          h("pre", {}, typeof m.content === "string" ? m.content : JSON.stringify(m.content, null, 2))))));
  }

  // ---- heldout rows -------------------------------------------------------------------------
  const heldout = data.heldout_candidates;
  const pickA = document.getElementById("pick-a"), pickB = document.getElementById("pick-b");
  const filter = document.getElementById("row-filter"), search = document.getElementById("row-search");
  const more = document.getElementById("rows-more");
  const label = (id) => `${id}${id === s.pick_candidate_id ? " (pick)" : ""}${id === s.seed_candidate_id ? " (seed)" : ""}`;
  for (const select of [pickA, pickB]) select.replaceChildren(...heldout.map((id) => h("option", {value: id}, label(id))));
  pickA.value = heldout.includes(s.pick_candidate_id) ? s.pick_candidate_id : heldout[heldout.length - 1] || "";
  pickB.value = heldout.includes(s.seed_candidate_id) ? s.seed_candidate_id : heldout[0] || "";
  let shown = ROWS_PAGE;

  const solved = (cell) => cell && cell.reward !== null && cell.reward >= s.solved_threshold;
  const missed = (cell) => cell && cell.reward !== null && cell.reward < s.solved_threshold;
  const tests = {
    "all": () => true,
    "a-not-b": (a, b) => solved(a) && missed(b),
    "b-not-a": (a, b) => solved(b) && missed(a),
    "both": (a, b) => solved(a) && solved(b),
    "neither": (a, b) => missed(a) && missed(b),
    "error": (a, b) => (a && a.reward === null) || (b && b.reward === null),
  };

  function cellView(cell) {
    if (!cell) return h("span", {class: "muted"}, "not scored");
    const verdict = cell.reward === null ? badge(`error (${cell.status})`, "error")
      : badge(fmt(cell.reward, 2), solved(cell) ? "solved" : "missed");
    return h("div", {}, verdict,
      cell.error ? h("div", {class: "error-text clip"}, cell.error) : null,
      cell.output ? h("div", {class: "cell-output clip", title: cell.output}, cell.output) : null,
      cell.feedback ? h("div", {class: "cell-feedback clip", title: cell.feedback}, cell.feedback) : null);
  }

  function chips(row) {
    return h("div", {class: "chips"}, heldout.map((id) => {
      const cell = row.cells[id];
      const kind = !cell ? "" : cell.reward === null ? "error" : solved(cell) ? "solved" : "missed";
      return h("span", {class: `chip ${kind}`, title: `${id}: ${!cell ? "not scored" : cell.reward === null ? "error" : fmt(cell.reward, 2)}`});
    }));
  }

  function renderRows() {
    const a = pickA.value, b = pickB.value, test = tests[filter.value];
    const needle = search.value.trim().toLowerCase();
    const matches = data.heldout_rows.filter((row) => test(row.cells[a], row.cells[b]) && (!needle ||
      [row.task_id, row.inputs, ...Object.values(row.cells).flatMap((c) => [c.output, c.feedback, c.error])]
        .some((t) => t && t.toLowerCase().includes(needle))));
    const columns = [
      {label: "task", value: (r) => r.task_id},
      {label: "input", value: (r) => h("div", {class: "clip", title: r.inputs || ""}, r.inputs || "–")},
      {label: `A: ${label(a)}`, value: (r) => cellView(r.cells[a])},
      {label: `B: ${label(b)}`, value: (r) => cellView(r.cells[b])},
      {label: `all ${heldout.length} scored`, value: chips},
    ];
    fillTable(document.getElementById("rows"), columns, matches.slice(0, shown), {rowKey: (r) => r.task_id});
    document.getElementById("row-count").textContent =
      `${Math.min(shown, matches.length)} of ${matches.length} matching rows (${data.heldout_rows.length} heldout rows)`;
    more.hidden = matches.length <= shown;
  }
  for (const el of [pickA, pickB, filter]) el.addEventListener("change", () => { shown = ROWS_PAGE; renderRows(); });
  search.addEventListener("input", () => { shown = ROWS_PAGE; renderRows(); });
  more.addEventListener("click", () => { shown += ROWS_PAGE; renderRows(); });
  renderRows();

  // open on the run's pick (its diff against the seed); when the pick is the seed, on the
  // last candidate proposed, so a diff is the first thing shown either way
  const pick = byId.get(s.pick_candidate_id);
  const first = pick && pick.candidate_id !== s.seed_candidate_id ? pick : data.candidates[data.candidates.length - 1];
  if (first) selectCandidate(first.candidate_id);
  markReady("tables");
})();
