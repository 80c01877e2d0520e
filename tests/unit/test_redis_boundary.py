"""Only ``store/`` and ``transport/`` speak redis-py: import-linter's forbidden contract
names every other module, is kept, and breaks on an import of redis-py elsewhere (so it
cannot pass whatever the code imports)."""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
import tomllib
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[2]
LINT = Path(sys.executable).parent / "lint-imports"
BOUNDARY = "Only store/ and transport/ import redis-py"

#: Imports of redis-py where it does not belong: (module, the line added to it).
STRAYS = [
    ("printery.runs.reader", "import redis.asyncio"),
    ("printery.service.housekeeping", "from redis.exceptions import RedisError"),
    ("printery.cli.ops_inspect", "import redis"),
]


def contract() -> dict[str, Any]:
    config = tomllib.loads((ROOT / "pyproject.toml").read_text())
    importlinter = config["tool"]["importlinter"]
    assert importlinter.get("include_external_packages") is True, "redis-py is not in the graph"
    found = [c for c in importlinter["contracts"] if c["name"] == BOUNDARY]
    assert len(found) == 1, f"pyproject.toml has no contract {BOUNDARY!r}"
    return found[0]


def lint(root: Path, env: dict[str, str] | None = None) -> subprocess.CompletedProcess[str]:
    return subprocess.run([str(LINT), "--no-cache"], cwd=root, capture_output=True, text=True,
                          timeout=300, env=env)


def test_the_contract_names_every_module_but_store_and_transport() -> None:
    """A module missing from the list would be checked by nothing."""
    package = ROOT / "src" / "printery"
    top = {p.stem if p.is_file() else p.name for p in package.iterdir()
           if (p.suffix == ".py" and p.stem != "__init__") or (p / "__init__.py").exists()}
    named = {name.removeprefix("printery.") for name in contract()["source_modules"]}
    assert named == top - {"store", "transport"}
    assert contract()["forbidden_modules"] == ["redis"]


def test_redis_py_outside_store_and_transport_breaks_the_contract(tmp_path: Path) -> None:
    result = lint(ROOT)
    assert f"{BOUNDARY} KEPT" in result.stdout, result.stdout + result.stderr

    shutil.copytree(ROOT / "src", tmp_path / "src",
                    ignore=shutil.ignore_patterns("__pycache__", "*.egg-info"))
    shutil.copy(ROOT / "pyproject.toml", tmp_path / "pyproject.toml")
    for module, line in STRAYS:
        path = (tmp_path / "src" / Path(*module.split("."))).with_suffix(".py")
        path.write_text(path.read_text() + f"\n{line}  # redis-py outside the store\n")
    broken = lint(tmp_path, {**os.environ, "PYTHONPATH": str(tmp_path / "src")})
    assert broken.returncode != 0 and f"{BOUNDARY} BROKEN" in broken.stdout, broken.stdout
    for module, _ in STRAYS:
        assert f"{module} -> redis" in broken.stdout, (module, broken.stdout)
