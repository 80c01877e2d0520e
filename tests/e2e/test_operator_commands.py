"""The commands as installed: `--version`, `python -m printery`, shell completion, and
`printery --app` loading an app module from the working directory like
`printery-workers` does, through the console scripts (whose sys.path lacks the cwd)."""

from __future__ import annotations

import shutil
import subprocess
import sys
from importlib.metadata import version
from pathlib import Path

import pytest

from support.service import base_env

BIN = Path(sys.executable).parent
EXAMPLES = Path(__file__).resolve().parents[2] / "examples"


def run(argv: list[str], cwd: Path | None = None,
        env: dict[str, str] | None = None) -> subprocess.CompletedProcess[str]:
    return subprocess.run(argv, capture_output=True, text=True, timeout=60, cwd=cwd,
                          env=base_env(env), check=False)


@pytest.mark.parametrize("argv", [
    [str(BIN / "printery"), "--version"],
    [str(BIN / "printery-workers"), "--version"],
    [sys.executable, "-m", "printery", "--version"],
])
def test_every_command_answers_version(argv: list[str]) -> None:
    proc = run(argv)
    assert proc.returncode == 0, proc.stderr
    assert proc.stdout.split() == [Path(argv[0]).name if "-m" not in argv else "printery",
                                   version("printery")]


def test_python_m_printery_is_the_operators_tool(tmp_path: Path) -> None:
    proc = run([sys.executable, "-m", "printery", "pipeline", "show"], cwd=tmp_path)
    assert proc.returncode == 0, proc.stderr
    assert "validator" in proc.stdout and "deployment:started" in proc.stdout


@pytest.mark.parametrize(("command", "var"), [("printery", "_PRINTERY_COMPLETE"),
                                               ("printery-workers", "_PRINTERY_WORKERS_COMPLETE")])
def test_shell_completion_as_the_readme_sets_it_up(command: str, var: str) -> None:
    for shell in ("bash", "zsh", "fish"):
        script = run([str(BIN / command)], env={var: f"{shell}_source"})
        assert script.returncode == 0 and var in script.stdout, (shell, script.stderr)
    words = {"printery": "printery dl", "printery-workers": "printery-workers --sup"}[command]
    done = run([str(BIN / command)], env={var: "bash_complete", "COMP_WORDS": words,
                                          "COMP_CWORD": "1"})
    assert done.stdout.split() == ["plain," + ("dlq" if command == "printery" else "--supervised")]


def test_app_loads_from_the_working_directory_through_the_console_script(tmp_path: Path) -> None:
    shutil.copytree(EXAMPLES, tmp_path / "examples",
                    ignore=shutil.ignore_patterns("__pycache__"))
    for argv, env in (([str(BIN / "printery"), "--app", "examples.docflow:pipeline"], None),
                      ([str(BIN / "printery")], {"PRINTERY_APP": "examples.docflow:pipeline"})):
        proc = run([*argv, "pipeline", "show", "--json"], cwd=tmp_path, env=env)
        assert proc.returncode == 0, proc.stderr
        assert '"name":"docflow"' in proc.stdout.replace(" ", "")
    missing = run([str(BIN / "printery"), "--app", "nosuchmodule:pipeline", "pipeline", "show"],
                  cwd=tmp_path)
    assert missing.returncode == 2 and "app" in missing.stderr and "nosuchmodule" in missing.stderr
