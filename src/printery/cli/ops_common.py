"""What every ``printery`` subcommand shares: settings, the server, the pipeline, output.

Settings are loaded once per invocation from the global options (flag > env > config
file > the app's defaults > the framework's), with the app's hook exactly as
``printery-workers`` loads them (:mod:`printery.runs.apps`); a bad one exits 2 with one
stderr line.
Nothing connects before a subcommand asks for the client, so ``pipeline show`` works
without a server.
"""

from __future__ import annotations

import asyncio
import os
import sys
from collections.abc import Awaitable, Callable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any, NoReturn, TypeVar

import click

from printery.base import _json
from printery.base.errors import ConfigError, TransportError
from printery.cli.term import escape_c1, printable
from printery.observe.redact import redact_text
from printery.pipeline.dag import Pipeline
from printery.runs.apps import LoadedApp, load_app_settings
from printery.servers.embedded import find_running
from printery.settings.config import Settings
from printery.store import Redis, ServerError
from printery.store.partitions import resolve_keys
from printery.transport.connection import connect
from printery.transport.refusal import refusal_error
from printery.wire.keys import StreamKeys

T = TypeVar("T")

#: Exit statuses (docs/reference.md, Commands).
EXIT_OK, EXIT_FAIL, EXIT_USAGE, EXIT_TIMEOUT = 0, 1, 2, 3
#: The ``producer`` of every entry the operator's tool writes.
PRODUCER = "printery-cli"


class Failure(Exception):
    """A negative outcome: printed as one line on stderr, exit status ``code``."""

    def __init__(self, message: str, code: int = EXIT_FAIL) -> None:
        super().__init__(message)
        self.code = code


@dataclass
class OpsContext:
    """Per-invocation state: the global options, resolved lazily."""

    flags: dict[str, object | None]
    _loaded: LoadedApp | None = None
    _pipeline: Pipeline | None = None
    extra: dict[str, Any] = field(default_factory=dict)

    @property
    def loaded(self) -> LoadedApp:
        if self._loaded is None:
            try:
                self._loaded = load_app_settings(self.flags, os.environ)
            except ConfigError as exc:
                fail(str(exc), EXIT_USAGE)
        return self._loaded

    @property
    def settings(self) -> Settings:
        return self.loaded.settings

    @property
    def keys(self) -> StreamKeys:
        """The keys in the layout recorded in the server, once :meth:`run` read it (the
        settings' until then)."""
        keys = self.extra.get("keys")
        return keys if isinstance(keys, StreamKeys) else self.settings.keys

    @property
    def pipeline(self) -> Pipeline:
        if self._pipeline is None:
            try:
                self._pipeline = self.loaded.pipeline()
            except ConfigError as exc:
                fail(str(exc), EXIT_USAGE)
        return self._pipeline

    def redis_url(self) -> str:
        """The configured URL, else the embedded server of the data dir, else exit 1.

        Only ``demo`` starts a server of its own: an operator command that silently
        started an empty server would show empty streams instead of the real ones.
        """
        url = self.settings.redis_url or find_running(self.settings.data_dir)
        if url is None:
            data_dir = self.settings.data_dir
            fail(
                f"no Redis URL given and no embedded server running for data dir {data_dir}; "
                f"start one with `printery-workers --data-dir {data_dir}` (or `printery demo`), "
                "or pass --redis-url / set REDIS_URL"
            )
        return url

    def run(self, body: Callable[[Redis], Awaitable[T]]) -> T:
        """Run ``body`` with a connected client; a connection problem exits 1 cleanly."""
        url = self.redis_url()

        async def main() -> T:
            client = connect(url, max_connections=16)
            try:
                try:  # the recorded partition count (docs/reference.md, Partitions)
                    self.extra["keys"] = await resolve_keys(client, self.settings)
                except ConfigError as exc:
                    raise Failure(str(exc), EXIT_USAGE) from exc
                return await body(client)
            finally:
                await client.aclose()

        try:
            return asyncio.run(main())
        except Failure as exc:
            fail(str(exc), exc.code)
        except (ServerError, OSError, TransportError) as exc:
            refusal = refusal_error(exc) or (exc.__cause__ and refusal_error(exc.__cause__))
            fail(str(refusal) if refusal else f"redis error: {redact_text(str(exc))}")


def fail(message: str, code: int = EXIT_FAIL) -> NoReturn:
    """Exit with ``code`` after one stderr line (secrets masked)."""
    click.echo(f"printery: {redact_text(message)}", err=True)
    sys.exit(code)


def get_ctx() -> OpsContext:
    obj = click.get_current_context().find_object(OpsContext)
    if obj is None:  # only when a command is invoked outside the group
        obj = OpsContext(flags={})
    return obj


def print_json(value: Any) -> None:
    """One JSON document on stdout, secrets masked (URLs may travel in data), with no
    raw control character a terminal could act on (:mod:`printery.cli.term`)."""
    click.echo(escape_c1(redact_text(_json.dumps(value))))


def table(rows: Sequence[Sequence[object]], headers: Sequence[str]) -> str:
    """A plain aligned text table; ``-`` for empty cells. Cells hold stream data, so
    each is one printable line (:func:`~printery.cli.term.printable`)."""
    cells = [[str(h) for h in headers]]
    cells += [["-" if c is None or c == "" else printable(str(c)) for c in row] for row in rows]
    widths = [max(len(r[i]) for r in cells) for i in range(len(headers))]
    lines = ["  ".join(c.ljust(w) for c, w in zip(r, widths, strict=True)).rstrip() for r in cells]
    lines.insert(1, "  ".join("-" * w for w in widths))
    return "\n".join(lines)


#: Entry fields that hold numbers (every field is a string on the wire, docs/reference.md,
#: Streams and entries).
def show_entry(entry: Mapping[str, Any]) -> str:
    """One entry for reading: ``name: value`` a line; JSON values (``data``, ``cost``)
    and multi-line text (a traceback) indented below their name. Printable only."""
    lines: list[str] = []
    for name, value in entry.items():
        if isinstance(value, dict | list):
            block = _json.dumps_indented(value)
        elif isinstance(value, str) and "\n" in value.strip("\n"):
            block = value.strip("\n")
        else:
            lines.append(f"{name}: {printable(str(value))}")
            continue
        lines.append(f"{name}:")
        lines += ["  " + line for line in printable(block, one_line=False).splitlines()]
    return redact_text("\n".join(lines))


json_option = click.option("--json", "as_json", is_flag=True, help="one JSON document on stdout")
