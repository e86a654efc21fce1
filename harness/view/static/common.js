"use strict";
// Helpers shared by the sweep and run pages. Every text from the evidence goes in through
// textContent (never innerHTML): outputs and feedback come from containers and models.

function readJson(id) {
  return JSON.parse(document.getElementById(id).textContent);
}

function h(tag, attrs, ...children) {
  const el = document.createElement(tag);
  for (const [key, value] of Object.entries(attrs || {})) {
    if (value === null || value === undefined || value === false) continue;
    if (key === "class") el.className = value;
    else if (key === "dataset") Object.assign(el.dataset, value);
    else if (key.startsWith("on")) el.addEventListener(key.slice(2), value);
    else el.setAttribute(key, value === true ? "" : value);
  }
  for (const child of children.flat()) {
    if (child === null || child === undefined || child === false) continue;
    el.append(child instanceof Node ? child : document.createTextNode(String(child)));
  }
  return el;
}

function fmt(value, digits = 3) {
  return value === null || value === undefined ? "–" : Number(value).toFixed(digits);
}

// A score with the rows it rests on; rows without a reward are errors, shown apart.
function fmtScore(score) {
  if (!score) return "–";
  if (score.n === 0 && score.errors === 0) return "not scored";
  const mean = score.mean === null ? "no reward" : fmt(score.mean);
  const rows = score.expected !== null && score.expected !== undefined && score.expected !== score.n + score.errors
    ? `${score.n}/${score.expected}` : `${score.n}`;
  const errors = score.errors ? `, ${score.errors} error${score.errors > 1 ? "s" : ""}` : "";
  return `${mean} (${rows} rows${errors})`;
}

function fmtCost(value) {
  return value === null || value === undefined ? "unknown" : `$${Number(value).toFixed(4)}`;
}

function fmtSeconds(value) {
  if (value === null || value === undefined) return "–";
  const s = Math.round(value);
  return s >= 3600 ? `${Math.floor(s / 3600)}h ${Math.floor((s % 3600) / 60)}m`
    : s >= 60 ? `${Math.floor(s / 60)}m ${s % 60}s` : `${Number(value).toFixed(1)}s`;
}

function fmtInt(value) {
  return value === null || value === undefined ? "–" : Number(value).toLocaleString("en-US");
}

function badge(text, kind) {
  return h("span", {class: `badge ${String(kind || text).replace(/\s+/g, "-")}`}, text);
}

function facts(dl, pairs) {
  dl.replaceChildren(...pairs.filter(([, v]) => v !== null && v !== undefined && v !== "")
    .map(([k, v]) => h("div", {}, h("dt", {}, k), h("dd", {}, v))));
}

// A table from column definitions {label, value(row) -> node|text, sort(row) -> key, num}.
// Sorting re-renders the body only.
function fillTable(table, columns, rows, {onRow, rowKey, sortable = false} = {}) {
  let order = rows.slice();
  let sorted = {index: -1, dir: 1};
  const head = h("tr", {}, columns.map((col, i) => h("th", {
    class: [col.num ? "num" : "", sortable && col.sort ? "sortable" : ""].join(" ").trim() || null,
    onclick: sortable && col.sort ? () => sortBy(i) : null,
  }, col.label)));
  const body = h("tbody");
  function renderBody() {
    body.replaceChildren(...order.map((row) => h("tr", {
      class: onRow ? "clickable" : null, dataset: rowKey ? {key: rowKey(row)} : undefined,
      onclick: onRow ? () => onRow(row) : null,
    }, columns.map((col) => h("td", {class: col.num ? "num" : null}, col.value(row))))));
  }
  function sortBy(i) {
    sorted = {index: i, dir: sorted.index === i ? -sorted.dir : 1};
    const key = columns[i].sort;
    order = rows.slice().sort((a, b) => {
      const x = key(a), y = key(b);
      if (x === y) return 0;
      if (x === null || x === undefined) return 1;  // unknowns last either way
      if (y === null || y === undefined) return -1;
      return (x < y ? -1 : 1) * sorted.dir;
    });
    head.querySelectorAll("th").forEach((th, j) => {
      th.classList.toggle("sorted-asc", j === i && sorted.dir === 1);
      th.classList.toggle("sorted-desc", j === i && sorted.dir === -1);
    });
    renderBody();
  }
  renderBody();
  table.replaceChildren(h("thead", {}, head), body);
}

// body[data-ready] lists what has rendered (tests wait on it); viewTimings when (ms since navigation)
function markReady(name) {
  (window.viewTimings = window.viewTimings || {})[name] = performance.now();
  const done = (document.body.dataset.ready || "").split(" ").filter(Boolean);
  done.push(name);
  document.body.dataset.ready = done.join(" ");
}

// a clipped text (long input, output, feedback) opens in place on click
document.addEventListener("click", (event) => {
  const clip = event.target.closest && event.target.closest(".clip");
  if (clip) clip.classList.toggle("open");
});
