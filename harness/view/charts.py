"""Vega-Lite specs (built with Altair, which checks them against the schema) for a run's
lineage graph and optimization trace. The specs name their data ("nodes", "edges", "trace");
the page passes the rows from its one embedded JSON, so no row is written twice. Scales take
their domains from the data, so a spec depends on little but whether nodes carry labels: it
is built (and validated, which takes about a second) once per process and copied per page."""

from __future__ import annotations

import functools
import json
from typing import Any

import altair as alt

STATUS_COLORS = {"seed": "#6b7280", "accepted": "#16a34a", "rejected": "#dc2626", "merged": "#7c3aed",
                 "merge rejected": "#c4b5fd"}
SERIES_COLORS = {"minibatch (accepted)": "#16a34a", "minibatch (rejected)": "#dc2626", "pareto": "#2563eb",
                 "best so far": "#111827"}
LABELS_UP_TO = 60  # node labels beyond this many candidates would overlap: tooltips only
PX_PER_GENERATION = 70


def _spec(chart: alt.TopLevelMixin) -> dict[str, Any]:
    spec = chart.to_dict()
    spec.pop("$schema", None)  # a URL the page never fetches
    return spec


@functools.cache
def _lineage_json(labels: bool) -> str:
    # integer generations only: a tick between two rows gets no label
    y = alt.Y("y:Q", title="generation", scale=alt.Scale(reverse=True, nice=False, padding=36),
              axis=alt.Axis(tickMinStep=1, labelExpr="datum.value % 1 ? '' : datum.label", grid=False))
    x = alt.X("x:Q", axis=None, scale=alt.Scale(nice=False, zero=False, padding=40))
    edges = alt.Chart(alt.Data(name="edges")).mark_line(color="#9ca3af", strokeWidth=1.2).encode(
        x=x, y=y, detail="edge_id:N", order="end:Q",
        strokeDash=alt.condition("datum.primary", alt.value([1, 0]), alt.value([4, 3])))
    tooltip = [alt.Tooltip("candidate_id:N", title="candidate"), alt.Tooltip("status:N"),
               alt.Tooltip("pareto.mean:Q", title="pareto", format=".3f"),
               alt.Tooltip("pareto.n:Q", title="pareto rows"),
               alt.Tooltip("heldout.mean:Q", title="heldout", format=".3f"),
               alt.Tooltip("heldout.n:Q", title="heldout rows"),
               alt.Tooltip("minibatch:Q", title="minibatch", format=".3f"),
               alt.Tooltip("edit_format:N", title="edit")]
    zoom = alt.selection_interval(bind="scales")
    nodes = alt.Chart(alt.Data(name="nodes")).mark_point(filled=True, size=140, cursor="pointer").encode(
        x=x, y=y, tooltip=tooltip,
        color=alt.Color("status:N", scale=alt.Scale(domain=list(STATUS_COLORS), range=list(STATUS_COLORS.values())),
                        legend=alt.Legend(orient="top", title=None)),
        shape=alt.condition("datum.is_pick", alt.value("diamond"), alt.value("circle")),
        stroke=alt.condition("datum.is_pick", alt.value("#111827"), alt.value("white")),
    ).add_params(zoom)
    layers: list[alt.Chart] = [edges, nodes]
    if labels:
        layers.append(alt.Chart(alt.Data(name="nodes")).mark_text(dy=16, fontSize=10, lineBreak="\n").encode(
            x=x, y=y, text="label:N"))
    return json.dumps(_spec(alt.layer(*layers).properties(width="container")))


def lineage_spec(n_nodes: int, generations: int) -> dict[str, Any]:
    spec = json.loads(_lineage_json(n_nodes <= LABELS_UP_TO))
    return {**spec, "height": max(160, PX_PER_GENERATION * (generations + 1))}


@functools.cache
def _trace_json() -> str:
    x = alt.X("rollouts:Q", title="optimization rollouts spent", scale=alt.Scale(zero=True))
    y = alt.Y("score:Q", title="mean reward")
    color = alt.Color("series:N", scale=alt.Scale(domain=list(SERIES_COLORS), range=list(SERIES_COLORS.values())),
                      legend=alt.Legend(orient="top", title=None))
    tooltip = [alt.Tooltip("candidate_id:N", title="candidate"), alt.Tooltip("series:N"),
               alt.Tooltip("score:Q", format=".3f"), alt.Tooltip("rollouts:Q")]
    base = alt.Chart(alt.Data(name="trace"))
    best = base.transform_filter("datum.kind == 'best so far'").mark_line(interpolate="step-after", strokeWidth=2)
    points = base.transform_filter("datum.kind != 'best so far'").mark_point(filled=True, size=60, opacity=0.8)
    zoom = alt.selection_interval(bind="scales")
    layered = alt.layer(best.encode(x=x, y=y, color=color),
                        points.encode(x=x, y=y, color=color, tooltip=tooltip,
                                      shape=alt.condition("datum.kind == 'pareto'", alt.value("diamond"),
                                                          alt.value("circle"))).add_params(zoom))
    return json.dumps(_spec(layered.properties(width="container", height=260)))


def trace_spec() -> dict[str, Any]:
    return json.loads(_trace_json())
