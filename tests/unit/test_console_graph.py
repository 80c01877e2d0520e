"""The console's pipeline graph (service/console/graph.py): which steps an edge is drawn
from. Before: a step taking a Map's output had a second edge from the Map's split (the
split writes that output itself when it has no items), drawn straight through the each
and collector boxes, so it read as coming from the wrong step."""

from __future__ import annotations

from typing import Any

from printery import Map, Message, Pipeline
from printery.service.console import graph as console_graph
from printery.service.console.graph import BOX_H, BOX_W, layout


def _items(message: Message) -> list[Any]:
    return list(message.data["items"])


async def _same(message: Message) -> Any:
    return message.data


def _pipeline(**step: Any) -> Pipeline:
    pipeline = Pipeline("docs", ingress=["document"])
    pipeline.add(Map("chunks", consumes="document", produces="merged", split=_items,
                     each=_same))
    pipeline.step("summarize", consumes=["merged"], produces=["summary"], **step)(_same)
    return pipeline


def test_a_maps_output_is_drawn_from_its_collector_only() -> None:
    pipeline = _pipeline()
    assert pipeline.dependencies()["summarize"] == ("chunks", "chunks:collect")
    graph = layout(pipeline)
    place = {n.name: (n.x, n.y) for n in graph.nodes}
    (x, y), (cx, cy) = place["summarize"], place["chunks:collect"]
    into = [e.path for e in graph.edges if e.path.endswith(f" {x - 4},{y + BOX_H // 2}")]
    assert [p.split(" ")[0] for p in into] == [f"M{cx + BOX_W},{cy + BOX_H // 2}"]
    assert len(graph.edges) == 3  # split -> each -> collector -> summarize


def test_a_declared_dependency_on_the_split_is_still_drawn() -> None:
    pipeline = _pipeline(depends_on=["chunks"])
    assert console_graph.drawn_dependencies(pipeline)["summarize"] == ["chunks", "chunks:collect"]
