"""The README's shell blocks run as written on a Debian machine, which has ``python3``
and no ``python`` (before: the tour piped into ``python -m json.tool``)."""

from __future__ import annotations

import re
from pathlib import Path

README = Path(__file__).resolve().parents[2] / "README.md"
SHELL_BLOCK = re.compile(r"```(?:sh|bash|console)\n(.*?)```", re.S)
#: ``python`` as a command: at a line's start or after a pipe, ``&&``, ``;`` or ``$(``.
BARE_PYTHON = re.compile(r"(?:^|[|;&(]\s*)python\s", re.M)


def test_no_shell_block_of_the_readme_needs_a_python_on_path() -> None:
    found = [line.strip() for block in SHELL_BLOCK.findall(README.read_text())
             for line in block.splitlines() if BARE_PYTHON.search(line)]
    assert not found, f"write python3 or .venv/bin/python: {found}"
