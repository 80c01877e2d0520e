"""The pipeline drawn as an inline SVG for the console: steps in layers (a step one
layer right of the furthest step it depends on), one edge per dependency, each step
coloured by its state in a run; a Map's each step says how many of the run's items are
done, failed and running. Computed here, not in the browser, so the page needs no graph
library and renders with scripts off. The text form next to it is
:func:`printery.pipeline.render.to_text`'s."""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from dataclasses import dataclass
from typing import Any

from printery.pipeline.dag import Pipeline
from printery.wire.fields import ITEM, ITEM_FAILED, ITEMS, MAP
from printery.wire.keys import DLQ

__all__ = ["ItemCounts", "Layout", "drawn_dependencies", "item_counts", "layout"]

BOX_W, BOX_H, GAP_X, GAP_Y, PAD = 150, 40, 50, 18, 10


@dataclass(frozen=True, slots=True)
class Node:
    name: str
    x: int
    y: int
    state: str
    label: str
    #: A second line: a Map's item counts in the run ("" none).
    detail: str = ""


@dataclass(frozen=True, slots=True)
class Edge:
    path: str


@dataclass(frozen=True, slots=True)
class Layout:
    width: int
    height: int
    nodes: list[Node]
    edges: list[Edge]


@dataclass(frozen=True, slots=True)
class ItemCounts:
    """One run's items of one Map (reference: fan-out): ``items`` written by its split,
    how many ended with a result, how many failed, and the rest, still running."""

    items: int
    done: int
    failed: int

    @property
    def running(self) -> int:
        return max(0, self.items - self.done - self.failed)

    def __str__(self) -> str:
        return f"{self.done} done · {self.failed} failed · {self.running} running"


def item_counts(pipeline: Pipeline, entries: Iterable[Mapping[str, Any]]) -> (
    dict[str, ItemCounts]
):
    """Each Map's each step -> its items in the run of ``entries`` (as the run reader
    gives them): done (a result), failed (a result written for a failed item, the item's
    dead letter, a Loop's exhausted item), the rest running. Maps the run has not
    reached are left out."""
    maps = pipeline.maps
    if not maps:
        return {}
    items: dict[str, int] = {}
    done: dict[str, set[str]] = {}
    failed: dict[str, set[str]] = {}
    for entry in entries:
        name, index = entry.get(MAP), entry.get(ITEM)
        shape = maps.get(str(name)) if name is not None else None
        if shape is None or index is None:
            continue
        items[shape.name] = max(items.get(shape.name, 0), _count(entry.get(ITEMS)))
        stream = entry.get("stream")
        kind = entry.get("type") or stream
        if stream == DLQ:
            if kind != shape.result_type:  # the item's handling, not the collector's
                failed.setdefault(shape.name, set()).add(str(index))
        elif kind == shape.result_type:
            ended = failed if entry.get(ITEM_FAILED) else done
            ended.setdefault(shape.name, set()).add(str(index))
        elif kind == shape.exhausted:
            failed.setdefault(shape.name, set()).add(str(index))
    return {maps[name].each: ItemCounts(count, len(done.get(name, set())),
                                        len(failed.get(name, set()) - done.get(name, set())))
            for name, count in items.items()}


def _count(value: Any) -> int:
    try:
        return int(value)
    except (TypeError, ValueError):
        return 0


def drawn_dependencies(pipeline: Pipeline) -> dict[str, list[str]]:
    """Step -> the steps drawn with an edge into it: its dependencies, less itself, and
    less a Map's split where the step takes the Map's output. A split writes that output
    itself only when it has no items (its run has nothing to collect); the output is the
    collector's, so its edge comes from the collector. Drawn from the split too, the edge
    ran behind the Map's each and collector boxes and read as coming from the wrong step."""
    outputs = {shape.produces for shape in pipeline.maps.values()}
    deps: dict[str, list[str]] = {}
    for name, found in pipeline.dependencies().items():
        step = pipeline.steps[name]
        # A split is drawn from when declared, or for an input other than a Map's output
        # (the each step's items).
        from_split = set(step.depends_on) | {
            writer for event_type in step.consumes if event_type not in outputs
            for writer in pipeline.producers_of(event_type)}
        deps[name] = [d for d in found if d != name
                      and (d not in pipeline.maps or d in from_split)]
    return deps


def layout(pipeline: Pipeline, states: Mapping[str, str] | None = None,
           counts: Mapping[str, ItemCounts] | None = None) -> Layout:
    """Where each step and edge goes; ``states`` maps step names to a state (a CSS
    class: ``done``, ``failed``, ``review``, ``pending``; missing: ``idle``); ``counts``
    a Map's each step to its items in the run (:func:`item_counts`)."""
    deps = drawn_dependencies(pipeline)
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
                  name + (" (loop)" if pipeline.steps[name].loop is not None else ""),
                  str((counts or {})[name]) if name in (counts or {}) else "")
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
