"""Dependency graphs: cycle detection and topological levels (pure functions)."""

from __future__ import annotations

from collections.abc import Mapping, Sequence

from printery.base.errors import DependencyCycle, SupervisorError


def find_cycle(graph: Mapping[str, Sequence[str]]) -> list[str] | None:
    """A cycle as a path that starts and ends on the same node, or None."""
    white, grey, black = 0, 1, 2
    color = dict.fromkeys(graph, white)
    stack: list[str] = []

    def visit(node: str) -> list[str] | None:
        color[node] = grey
        stack.append(node)
        for dep in graph.get(node, ()):
            if color.get(dep, black) == grey:
                return [*stack[stack.index(dep) :], dep]
            if color.get(dep) == white:
                found = visit(dep)
                if found:
                    return found
        stack.pop()
        color[node] = black
        return None

    for node in graph:
        if color[node] == white:
            found = visit(node)
            if found:
                return found
    return None


def topological_levels(graph: Mapping[str, Sequence[str]]) -> list[list[str]]:
    """Nodes grouped by level: each level depends only on earlier ones, so a level's nodes
    can start in parallel once the previous level is ready.

    ``graph`` maps a node to the nodes it depends on. Raises :class:`DependencyCycle`
    (with the cycle) or :class:`SupervisorError` for an unknown dependency.
    """
    for node, deps in graph.items():
        for dep in deps:
            if dep not in graph:
                raise SupervisorError(f"{node} depends on unknown worker {dep!r}")
    cycle = find_cycle(graph)
    if cycle:
        raise DependencyCycle(cycle)
    levels: list[list[str]] = []
    placed: set[str] = set()
    while len(placed) < len(graph):
        level = [n for n in graph if n not in placed and all(d in placed for d in graph[n])]
        levels.append(level)
        placed.update(level)
    return levels
