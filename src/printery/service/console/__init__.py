"""The web console (docs/reference.md, The web console): server-rendered pages at ``/`` of
``--http-addr``, live over server-sent events, every asset shipped in this package (no
CDN).

:func:`service_console` builds it for a service: it shares ``/v1``'s access rule
(:func:`~printery.service.access.service_access`) and its :class:`~printery.runs.facade.Runs`.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping

from aiohttp import web

from printery.runs.facade import Runs
from printery.service.access import ConsoleAuth, service_access
from printery.service.console.routes import add_console
from printery.service.console.views import Views
from printery.settings.config import Settings

__all__ = ["service_console"]


def service_console(runs: Runs, settings: Settings, env: Mapping[str, str]) -> (
    Callable[[web.Application], None]
):
    """What adds the console's routes to the HTTP application of a process serving
    ``--http-addr`` (a service, or the parent of ``--processes``)."""
    views = Views(runs)
    auth = ConsoleAuth(service_access(settings, env), runs.redis, runs.keys,
                       session_ttl=settings.console.session_ttl)
    limit = settings.transport.payload_limit_bytes
    return lambda app: add_console(app, views, auth, body_limit=limit)
