"""A pipeline drawn for people: the text and the Mermaid flowchart that ``printery
pipeline show`` prints. A declared loop is drawn as one step that runs again on its own
verdicts (its internal attempt and verdict types are left out: they are its inner
workings, not edges of the graph). A Map is drawn as its three steps, the split fanning
out to the each step (one entry per item) and the collector gathering the results."""

from __future__ import annotations

from collections.abc import Mapping

from printery.pipeline.dag import Pipeline
from printery.pipeline.fanout import MapShape
from printery.pipeline.step import LoopShape


def loop_summary(shape: LoopShape) -> str:
    """One line saying what a loop does, in the order it does it."""
    parts = [f"validated, up to {shape.max_attempts} attempt"
             f"{'s' if shape.max_attempts != 1 else ''} with feedback"]
    if shape.fallback:
        parts.append("then the fallback")
    if shape.review_kind:
        parts.append(f"then review {shape.review_kind!r} (approve: {shape.produces}, "
                     f"reject: {shape.exhausted})")
    else:
        parts.append(f"then {shape.exhausted}")
    return "loop: " + "; ".join(parts)


def map_summary(shape: MapShape) -> str:
    """One line saying what a Map does with the items its split writes."""
    failure = ("the run fails" if shape.on_item_failure == "fail"
               else "listed in failed, the rest go on")
    return (f"map: one {shape.item_type} per item (at most {shape.max_items}), each by "
            f"{shape.each}, collected by {shape.collect} into {shape.produces} in item "
            f"order; a failed item: {shape.on_item_failure} ({failure})")


def to_text(pipeline: Pipeline, concurrency: Mapping[str, int] | None = None) -> str:
    """One line per step: ``name xN: consumes -> produces``, N the consumers in effect
    (``concurrency``, as for :meth:`Pipeline.describe`); a loop has a second line."""
    lines = [f"pipeline {pipeline.name} (ingress: {', '.join(pipeline.ingress)})"]
    for step in pipeline.describe(concurrency)["steps"]:
        shape = pipeline.steps[step["name"]].loop
        internal = shape.internal if shape is not None else ()
        consumes = [t for t in step["consumes"] if t not in internal]
        produces = [t for t in step["produces"] if t not in internal]
        lines.append(
            f"  {step['name']} x{step['concurrency']}: {', '.join(consumes)} -> "
            f"{', '.join(produces) or '(nothing)'}"
        )
        if shape is not None:
            lines.append(f"    {loop_summary(shape)}")
        if step["name"] in pipeline.maps:
            lines.append(f"    {map_summary(pipeline.maps[step['name']])}")
    return "\n".join(lines)


def to_mermaid(pipeline: Pipeline) -> str:
    """A Mermaid flowchart: ingress types as terminals, steps as boxes (a loop as a
    subroutine box with an edge back to itself), one edge per type a step consumes."""

    def node(name: str) -> str:
        return "".join(c if c.isalnum() else "_" for c in name)

    lines = ["flowchart LR"]
    fans = {m.item_type: m for m in pipeline.maps.values()}
    roles = {name: role for m in pipeline.maps.values()
             for name, role in zip(m.steps, ("map: split", "each item", "map: collect"),
                                   strict=True)}
    for event_type in pipeline.ingress:
        lines.append(f"  {node('in_' + event_type)}([{event_type}])")
    for step in pipeline.steps.values():
        shape = step.loop
        if step.name in roles and shape is None:
            lines.append(f'  {node(step.name)}[/"{step.name} ({roles[step.name]})"/]')
        elif shape is None:
            lines.append(f"  {node(step.name)}[{step.name}]")
        else:
            lines.append(f'  {node(step.name)}[["{step.name} (loop)"]]')
            lines.append(f'  {node(step.name)} -->|"retry with feedback, at most '
                         f'{shape.max_attempts}"| {node(step.name)}')
            lines.append(f"  {node('out_' + shape.exhausted)}([{shape.exhausted}])")
            via = f"review {shape.review_kind} rejected" if shape.review_kind else "exhausted"
            lines.append(f'  {node(step.name)} -.->|"{via}"| {node("out_" + shape.exhausted)}')
        internal = shape.internal if shape is not None else ()
        for event_type in step.consumes:
            if event_type in internal:
                continue
            sources = pipeline.producers_of(event_type) or (
                ["in_" + event_type] if event_type in pipeline.ingress else []
            )
            fan = fans.get(event_type)
            label = (f'"{event_type}: one per item, at most {fan.max_items}"'
                     if fan is not None else event_type)
            for source in sources:
                lines.append(f"  {node(source)} -->|{label}| {node(step.name)}")
    return "\n".join(lines)
