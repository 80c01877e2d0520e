"""No import cycle anywhere in ``src/`` (type-only and local imports count): the check
``make lint`` runs, enforced by the suite as well."""

from __future__ import annotations

import importlib.util
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]


def _checker():  # type: ignore[no-untyped-def]
    spec = importlib.util.spec_from_file_location("import_cycles", ROOT / "tools" / "import_cycles.py")
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def test_src_has_no_import_cycle() -> None:
    checker = _checker()
    assert checker.cycles(checker.module_graph(ROOT / "src")) == []


def test_the_checker_finds_a_cycle_through_a_type_only_import(tmp_path: Path) -> None:
    package = tmp_path / "pkg"
    package.mkdir()
    (package / "__init__.py").write_text("")
    (package / "a.py").write_text("from pkg.b import thing\n")
    (package / "b.py").write_text(
        "from typing import TYPE_CHECKING\nif TYPE_CHECKING:\n    from pkg import a\nthing = 1\n")
    (package / "c.py").write_text("from . import a\n")
    checker = _checker()
    assert checker.cycles(checker.module_graph(tmp_path)) == [["pkg.a", "pkg.b"]]
