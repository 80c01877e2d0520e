"""The pipeline drawn as an inline SVG for the console: steps in layers (a step one
layer right of the furthest step it depends on), one edge per dependency, each step
coloured by its state in a run. Computed here, not in the browser, so the page needs no
graph library and renders with scripts off. The text form next to it is
:func:`printery.pipeline.render.to_text`'s."""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass

from printery.pipeline.dag import Pipeline

__all__ = ["Layout", "layout"]

BOX_W, BOX_H, GAP_X, GAP_Y, PAD = 150, 40, 50, 18, 10


@dataclass(frozen=True, slots=True)
class Node:
    name: str
    x: int
    y: int
    state: str
    label: str


@dataclass(frozen=True, slots=True)
class Edge:
    path: str


@dataclass(frozen=True, slots=True)
class Layout:
    width: int
    height: int
    nodes: list[Node]
    edges: list[Edge]


def layout(pipeline: Pipeline, states: Mapping[str, str] | None = None) -> Layout:
    """Where each step and edge goes; ``states`` maps step names to a state (a CSS
    class: ``done``, ``failed``, ``review``, ``pending``; missing: ``idle``)."""
    deps = {name: [d for d in found if d != name]
            for name, found in pipeline.dependencies().items()}
    layer: dict[str, int] = {}

    def depth(name: str, seen: frozenset[str] = frozenset()) -> int:
        if name not in layer:
            parents = [d for d in deps.get(name, []) if d not in seen]
            layer[name] = 1 + max((depth(d, seen | {name}) for d in parents), default=-1)
        return layer[name]

    for name in pipeline.steps:
        depth(name)
    columns: dict[int, list[str]] = {}
    for name in pipeline.steps:
        columns.setdefault(layer[name], []).append(name)
    place: dict[str, tuple[int, int]] = {}
    for column, names in columns.items():
        for row, name in enumerate(names):
            place[name] = (PAD + column * (BOX_W + GAP_X), PAD + row * (BOX_H + GAP_Y))
    nodes = [Node(name, x, y, (states or {}).get(name, "idle"),
                  name + (" (loop)" if pipeline.steps[name].loop is not None else ""))
             for name, (x, y) in place.items()]
    edges = []
    for name, parents in deps.items():
        for parent in parents:
            (x1, y1), (x2, y2) = place[parent], place[name]
            sx, sy, ex, ey = x1 + BOX_W, y1 + BOX_H // 2, x2, y2 + BOX_H // 2
            mid = (sx + ex) // 2
            edges.append(Edge(f"M{sx},{sy} C{mid},{sy} {mid},{ey} {ex - 4},{ey}"))
    width = PAD * 2 + (max(columns, default=0) + 1) * (BOX_W + GAP_X) - GAP_X
    rows = max((len(names) for names in columns.values()), default=1)
    height = PAD * 2 + rows * (BOX_H + GAP_Y) - GAP_Y
    return Layout(width, height, nodes, edges)
