"""What both commands share besides app loading (which is :mod:`printery.runs.apps`, shared
with the client): ``--version`` and importing app modules from the working directory."""

from __future__ import annotations

import os
import sys

import click

#: ``--version`` of both commands: the installed package's version.
version_option = click.version_option(package_name="printery", message="%(prog)s %(version)s")


def apps_from_cwd() -> None:
    """Like ``celery -A`` and ``uvicorn``: an app module in the working directory is
    importable (``--app examples.docflow:pipeline``) even when a command starts through
    its console script, whose ``sys.path`` lacks the working directory."""
    if os.getcwd() not in sys.path and "" not in sys.path:
        sys.path.insert(0, os.getcwd())
