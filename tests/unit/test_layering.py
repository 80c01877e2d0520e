"""The code layers hold as README.md's table says: import-linter's ``layers`` contract is
that table, it is kept, and it breaks on an import back up (so it cannot pass whatever
the direction)."""

from __future__ import annotations

import os
import re
import shutil
import subprocess
import sys
import tomllib
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
LINT = Path(sys.executable).parent / "lint-imports"

#: One import back up per kind of arrow the layers forbid, (importer, imported): the base
#: naming the runtime, the runtime the pipeline, the transport the store, the runs the
#: service, the service the command line; each must break the contract.
BACK_ARROWS = [
    ("printery.base.errors", "printery.runtime.consume"),
    ("printery.rules.limits", "printery.runtime.handler"),
    ("printery.runtime.consume", "printery.pipeline.dag"),
    ("printery.transport.channel", "printery.store"),
    ("printery.runs.reader", "printery.service.api"),
    ("printery.service.api", "printery.cli.operator"),
]


def layers_contract() -> list[set[str]]:
    """The ``layers`` contract of pyproject.toml, bottom first, each layer's modules
    without the ``printery.`` prefix."""
    config = tomllib.loads((ROOT / "pyproject.toml").read_text())
    contracts = [c for c in config["tool"]["importlinter"]["contracts"] if c["type"] == "layers"]
    assert len(contracts) == 1, "pyproject.toml has no layers contract (or several)"
    return [{name.strip().removeprefix("printery.") for name in re.split(r"[|:]", layer)}
            for layer in reversed(contracts[0]["layers"])]


def readme_layers() -> list[set[str]]:
    """README's "Code layers" table, bottom first: each row's module column."""
    text = (ROOT / "README.md").read_text()
    table = text[text.index("Code layers (`src/printery/`)"):]
    rows = re.findall(r"^\| (\d+) \| ([^|]+) \|", table, re.M)
    assert [int(n) for n, _ in rows] == list(range(len(rows))), "README's layers are not 0, 1, ..."
    return [{name.rstrip("/") for name in re.findall(r"`([^`]+)`", cell)} for _, cell in rows]


def lint(root: Path, env: dict[str, str] | None = None) -> subprocess.CompletedProcess[str]:
    return subprocess.run([str(LINT), "--no-cache"], cwd=root, capture_output=True, text=True,
                          timeout=300, env=env)


def test_the_layers_contract_is_readmes_table() -> None:
    assert readme_layers() == layers_contract()


def test_every_module_of_the_package_is_in_a_layer() -> None:
    """A module outside every layer would be checked by nothing."""
    layered = set().union(*layers_contract())
    package = ROOT / "src" / "printery"
    top = {p.stem if p.is_file() else p.name for p in package.iterdir()
           if (p.suffix == ".py" and p.stem != "__init__") or (p / "__init__.py").exists()}
    assert top - layered == set()


def test_layering_contracts_hold(tmp_path: Path) -> None:
    """The contracts are kept as the code is, and an import back up breaks them."""
    result = lint(ROOT)
    assert result.returncode == 0, result.stdout + result.stderr
    assert "BROKEN" not in result.stdout and "0 broken" in result.stdout

    # The same package with the back arrows added: every one of them is reported.
    shutil.copytree(ROOT / "src", tmp_path / "src",
                    ignore=shutil.ignore_patterns("__pycache__", "*.egg-info"))
    shutil.copy(ROOT / "pyproject.toml", tmp_path / "pyproject.toml")
    for importer, imported in BACK_ARROWS:
        path = tmp_path / "src" / Path(*importer.split("."))
        module = path / "__init__.py" if path.is_dir() else path.with_suffix(".py")
        module.write_text(module.read_text() + f"\nimport {imported}  # a back arrow\n")
    env = {**os.environ, "PYTHONPATH": str(tmp_path / "src")}
    broken = lint(tmp_path, env)
    assert broken.returncode != 0, broken.stdout
    for importer, imported in BACK_ARROWS:
        assert f"{importer} -> {imported}" in broken.stdout, (importer, imported, broken.stdout)
