"""Lineage layout: a tidy tree over each candidate's first parent (a merge's second parent is
drawn as an extra edge). Leaves take consecutive slots in creation order and a parent sits
over the middle of its children, so siblings stay together and no tree edge crosses another.
The y coordinate is the candidate's generation."""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

from harness.view.models import LineageEdge


@dataclass(frozen=True)
class NodeIn:
    candidate_id: str
    index: int
    parent_ids: Sequence[str]
    generation: int


def tree_positions(nodes: Sequence[NodeIn]) -> dict[str, float]:
    """x per candidate id. Iterative post-order, so a chain of thousands of generations does
    not hit Python's recursion limit."""
    known = {n.candidate_id for n in nodes}
    ordered = sorted(nodes, key=lambda n: n.index)
    children: dict[str, list[str]] = {n.candidate_id: [] for n in ordered}
    roots = []
    for node in ordered:
        parent = next((p for p in node.parent_ids if p in known), None)
        if parent is None:
            roots.append(node.candidate_id)
        else:
            children[parent].append(node.candidate_id)
    x: dict[str, float] = {}
    next_slot = 0.0
    for root in roots:
        stack: list[tuple[str, bool]] = [(root, False)]
        while stack:
            node_id, expanded = stack.pop()
            kids = children[node_id]
            if not kids:
                x[node_id] = next_slot
                next_slot += 1.0
            elif expanded:
                x[node_id] = (x[kids[0]] + x[kids[-1]]) / 2
            else:
                stack.append((node_id, True))
                stack.extend((kid, False) for kid in reversed(kids))
    return x


def tree_edges(nodes: Sequence[NodeIn], x: dict[str, float]) -> list[LineageEdge]:
    """Two rows per edge (the parent's end, then the child's), as a line chart draws them."""
    generation = {n.candidate_id: n.generation for n in nodes}
    edges = []
    for node in sorted(nodes, key=lambda n: n.index):
        for i, parent in enumerate(p for p in node.parent_ids if p in x):
            edge_id = f"{parent}->{node.candidate_id}"
            for end, (who, y) in enumerate(((parent, generation[parent]), (node.candidate_id, node.generation))):
                edges.append(LineageEdge(edge_id=edge_id, parent_id=parent, child_id=node.candidate_id, primary=i == 0,
                                         x=x[who], y=y, end=end))
    return edges
