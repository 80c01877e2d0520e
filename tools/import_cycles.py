#!/usr/bin/env python3
"""Import cycles among the modules of a source tree: ``python tools/import_cycles.py src``.

Every import counts, type-only ones (under ``if TYPE_CHECKING:``) and local ones inside
functions included: a cycle that only a lazy import breaks is still one job split badly.
Prints each cycle; exits 1 when there is any. ``make lint`` and a unit test run it.
"""

from __future__ import annotations

import ast
import sys
from pathlib import Path


def module_graph(src: Path) -> dict[str, set[str]]:
    """Module name -> the modules of ``src`` it imports."""
    files: dict[str, Path] = {}
    for path in src.rglob("*.py"):
        parts = list(path.relative_to(src).with_suffix("").parts)
        if parts[-1] == "__init__":
            parts.pop()
        files[".".join(parts)] = path
    graph: dict[str, set[str]] = {name: set() for name in files}
    for name, path in files.items():
        package = name if path.name == "__init__.py" else name.rpartition(".")[0]
        for node in ast.walk(ast.parse(path.read_text())):
            targets: list[str] = []
            if isinstance(node, ast.Import):
                targets = [alias.name for alias in node.names]
            elif isinstance(node, ast.ImportFrom):
                base = package.split(".")[: len(package.split(".")) - max(0, node.level - 1)]
                prefix = ".".join([*base, node.module or ""]) if node.level else node.module or ""
                prefix = prefix.strip(".")
                targets = [prefix, *(f"{prefix}.{alias.name}" for alias in node.names)]
            for target in targets:
                # A package importing its own submodules is not an edge back to itself.
                if target in files and target != name and not name.startswith(target + "."):
                    graph[name].add(target)
    return graph


def cycles(graph: dict[str, set[str]]) -> list[list[str]]:
    """The strongly connected components with more than one module (Tarjan)."""
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    on_stack: set[str] = set()
    found: list[list[str]] = []

    def visit(node: str) -> None:
        index[node] = low[node] = len(index)
        stack.append(node)
        on_stack.add(node)
        for nxt in sorted(graph[node]):
            if nxt not in index:
                visit(nxt)
                low[node] = min(low[node], low[nxt])
            elif nxt in on_stack:
                low[node] = min(low[node], index[nxt])
        if low[node] == index[node]:
            component = []
            while True:
                member = stack.pop()
                on_stack.discard(member)
                component.append(member)
                if member == node:
                    break
            if len(component) > 1:
                found.append(sorted(component))

    sys.setrecursionlimit(max(sys.getrecursionlimit(), 10 * len(graph) + 100))
    for node in sorted(graph):
        if node not in index:
            visit(node)
    return found


def main(argv: list[str]) -> int:
    found = cycles(module_graph(Path(argv[1] if len(argv) > 1 else "src")))
    for component in found:
        print("cycle: " + " <-> ".join(component))
    print(f"cycles: {len(found)}")
    return 1 if found else 0


if __name__ == "__main__":
    sys.exit(main(sys.argv))
