"""The in-process HTTP endpoint of ``printery-workers`` (docs/reference.md, HTTP).

It only reads: every answer comes from a :class:`StatusProvider` that the service wires
in, so this module knows nothing of workers, Redis or pipelines. Every answer is JSON
(except ``/metrics``), errors included, in the API's shape ``{"error", "detail"}``:
unknown paths give 404, other methods on a known path 405 (with ``Allow``), and a
provider that raises or hangs gives a JSON 500 or a 503 instead of a stuck scrape,
because each provider call is bounded by ``probe_timeout``.
"""

from __future__ import annotations

import asyncio
from collections.abc import Awaitable, Callable
from typing import Any, Protocol

from aiohttp import web

from printery.base import _json
from printery.observe.logging import get_logger
from printery.observe.metrics import CONTENT_TYPE
from printery.observe.redact import redact_text
from printery.settings.config import parse_http_addr

__all__ = ["HttpServer", "StatusProvider", "build_app", "parse_http_addr"]

_log = get_logger(__name__)
_NO_STORE = {"Cache-Control": "no-store"}

Handler = Callable[[web.Request], Awaitable[web.StreamResponse]]
#: Adds routes to the application (the console's, on ``/``).
Routes = Callable[[web.Application], None]


class StatusProvider(Protocol):
    """What the HTTP endpoint asks the service; implementations must not block the loop."""

    async def status(self) -> dict[str, Any]:
        """The full ``/status`` document (docs/reference.md, HTTP), secrets already
        redacted."""
        ...

    async def readiness(self) -> tuple[bool, list[str]]:
        """``(ready, reasons)``: ready when Redis answers and every started worker is
        healthy; otherwise one short human-readable reason per problem."""
        ...

    def metrics(self) -> bytes:
        """Prometheus text exposition, e.g. :meth:`printery.observe.metrics.Metrics.render`."""
        ...


def _json_response(body: object, status: int = 200, headers: dict[str, str] | None = None) -> (
    web.Response
):
    return web.json_response(
        body, status=status, headers={**_NO_STORE, **(headers or {})}, dumps=_json.dumps
    )


def _detail(request: web.Request, exc: web.HTTPException) -> str:
    """What an aiohttp error says, in words (never the request's body)."""
    if exc.status == 404:
        return f"no route {request.method} {request.path}"
    if exc.status == 405:
        allowed = exc.headers.get("Allow", "")
        return f"{request.method} is not allowed on {request.path}" + (
            f"; allowed: {allowed}" if allowed else "")
    return exc.text if exc.text and not exc.text.startswith(f"{exc.status}:") else exc.reason


@web.middleware
async def _json_errors(request: web.Request, handler: Handler) -> web.StreamResponse:
    """Turn aiohttp's HTML error pages and unexpected exceptions into the API's error
    shape, ``{"error", "detail"}``. A client that went away is no error (logged at
    debug): its answer goes nowhere."""
    try:
        return await handler(request)
    except web.HTTPException as exc:
        if exc.status < 400:
            raise
        headers = {k: v for k, v in exc.headers.items()
                   if k.lower() in ("allow", "www-authenticate")}
        error = exc.reason.lower().replace(" ", "_")
        return _json_response({"error": error, "detail": _detail(request, exc)}, exc.status,
                              headers)
    except ConnectionResetError:  # aiohttp's ClientConnectionResetError: a write failed
        _log.debug("client went away", path=request.path)
        return web.Response(status=499)  # nothing is sent: the connection is gone
    except Exception as exc:
        _log.exception("http handler failed", path=request.path)
        return _json_response({"error": "internal", "detail": redact_text(str(exc))}, 500)


def build_app(
    provider: StatusProvider, *, probe_timeout: float = 5.0, api: web.Application | None = None,
    console: Routes | None = None,
) -> web.Application:
    """The aiohttp application: ``/healthz``, ``/readyz``, ``/status``, ``/metrics``,
    ``api`` (the ``/v1`` application of :mod:`printery.service.api`) mounted under ``/v1``, and
    what ``console`` adds (the web console's routes, :mod:`printery.service.console`).

    ``probe_timeout`` bounds each provider call: a Redis that hangs must turn into a 503
    from ``/readyz`` (so orchestrators stop routing to us), never into a hung probe.
    """

    async def healthz(_: web.Request) -> web.Response:
        # Answering at all proves the process and its event loop are alive.
        return _json_response({"status": "ok"})

    async def readyz(_: web.Request) -> web.Response:
        try:
            ready, reasons = await asyncio.wait_for(provider.readiness(), probe_timeout)
        except TimeoutError:
            ready, reasons = False, [f"readiness check timed out after {probe_timeout:g}s"]
        except Exception as exc:
            ready, reasons = False, [f"readiness check failed: {redact_text(str(exc))}"]
        if ready:
            return _json_response({"status": "ready"})
        return _json_response({"status": "unavailable", "reasons": list(reasons)}, 503)

    async def status(_: web.Request) -> web.Response:
        try:
            document = await asyncio.wait_for(provider.status(), probe_timeout)
        except TimeoutError:
            detail = f"status timed out after {probe_timeout:g}s"
            return _json_response({"error": "timeout", "detail": detail}, 503)
        return _json_response(document)

    async def metrics(_: web.Request) -> web.Response:
        return web.Response(
            body=provider.metrics(), headers={**_NO_STORE, "Content-Type": CONTENT_TYPE}
        )

    app = web.Application(middlewares=[_json_errors])
    app.router.add_get("/healthz", healthz)
    app.router.add_get("/readyz", readyz)
    app.router.add_get("/status", status)
    app.router.add_get("/metrics", metrics)
    if api is not None:
        app.add_subapp("/v1", api)
    if console is not None:
        console(app)
    return app


class HttpServer:
    """Serves :func:`build_app` on one TCP address inside the running event loop.

    No access log (scrapes every few seconds would drown the useful lines) and no signal
    handling: the service owns SIGTERM and calls :meth:`stop` during its shutdown.
    """

    def __init__(
        self, provider: StatusProvider, *, probe_timeout: float = 5.0,
        api: web.Application | None = None, console: Routes | None = None,
    ) -> None:
        self.app = build_app(provider, probe_timeout=probe_timeout, api=api, console=console)
        self._runner: web.AppRunner | None = None
        self.host: str | None = None
        self.port: int | None = None

    async def start(self, host: str, port: int) -> int:
        """Listen on ``host:port`` and return the actual port (``port`` 0: a free one).

        Raises ``OSError`` when the address cannot be bound (e.g. already in use).
        """
        if self._runner is not None:
            raise RuntimeError("HttpServer already started")
        runner = web.AppRunner(
            self.app, access_log=None, handle_signals=False, shutdown_timeout=1.0
        )
        await runner.setup()
        try:
            await web.TCPSite(runner, host, port).start()
        except BaseException:
            await runner.cleanup()
            raise
        self._runner = runner
        self.host = host
        self.port = int(runner.addresses[0][1])
        return self.port

    async def stop(self) -> None:
        """Stop listening and close open connections; safe to call more than once."""
        runner, self._runner = self._runner, None
        if runner is not None:
            await runner.cleanup()
