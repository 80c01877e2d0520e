"""The package root shows the architecture (issue 41): it keeps only the faces, and no two
modules share a name unless they are the same job in two layers and their docstrings say
so, each naming the other."""

from __future__ import annotations

import ast
from collections import defaultdict
from pathlib import Path

PACKAGE = Path(__file__).resolve().parents[2] / "src" / "printery"
#: The root's modules: the faces (authors and applications, the extension surface, the
#: name the reference gives model steps), the test helpers and ``python -m printery``.
ROOT_MODULES = {"__init__", "__main__", "ext", "models", "testing"}


def test_the_root_keeps_only_the_faces() -> None:
    assert {p.stem for p in PACKAGE.glob("*.py")} == ROOT_MODULES


def test_namesakes_are_one_job_in_several_layers_and_say_so() -> None:
    by_name: dict[str, list[Path]] = defaultdict(list)
    for path in PACKAGE.rglob("*.py"):
        if path.name != "__init__.py" and "__pycache__" not in path.parts:
            by_name[path.name].append(path)
    silent = []
    for paths in by_name.values():
        modules = [".".join(p.relative_to(PACKAGE.parent).with_suffix("").parts) for p in paths]
        for path, module in zip(paths, modules, strict=True):
            doc = ast.get_docstring(ast.parse(path.read_text())) or ""
            silent += [f"{module} does not name {other}" for other in modules
                       if other != module and other not in doc]
    assert silent == []
