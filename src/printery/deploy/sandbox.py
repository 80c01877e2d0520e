"""Local stand-ins for deployed services and a webhook sink, served for real over HTTP.

Used by ``printery demo`` and by the tests: healthy, failing, slow and wrong-version
services, and a sink that records every POST (and can be told to fail).
"""

from __future__ import annotations

import asyncio
from dataclasses import dataclass, field
from typing import Any

from aiohttp import web

from printery.base import _json


@dataclass
class Received:
    path: str
    headers: dict[str, str]
    body: bytes

    @property
    def json(self) -> Any:
        return _json.loads(self.body)


@dataclass
class Sandbox:
    """One aiohttp server with every stand-in; ``base`` is its URL once started.

    Routes: ``/svc/healthy/{version}`` (200 with that version), ``/svc/failing`` (500),
    ``/svc/slow`` (answers after ``slow_seconds``), ``/hooks/ok`` (records, 200),
    ``/hooks/fail`` (records, 500).
    """

    slow_seconds: float = 30.0
    received: list[Received] = field(default_factory=list)
    base: str = ""
    _runner: web.AppRunner | None = None
    _arrived: asyncio.Condition = field(default_factory=asyncio.Condition)

    def url(self, path: str) -> str:
        return f"{self.base}{path}"

    async def start(self, host: str = "127.0.0.1", port: int = 0) -> str:
        app = web.Application()
        app.router.add_get("/svc/healthy/{version}", self._healthy)
        app.router.add_get("/svc/failing", self._failing)
        app.router.add_get("/svc/slow", self._slow)
        app.router.add_post("/hooks/ok", self._hook_ok)
        app.router.add_post("/hooks/fail", self._hook_fail)
        self._runner = web.AppRunner(app, shutdown_timeout=0.2, access_log=None)
        await self._runner.setup()
        site = web.TCPSite(self._runner, host, port)
        await site.start()
        bound_host, bound_port = self._runner.addresses[0][:2]
        self.base = f"http://{bound_host}:{bound_port}"
        return self.base

    async def stop(self) -> None:
        if self._runner:
            await self._runner.cleanup()
            self._runner = None

    async def wait_for_posts(self, count: int, timeout: float = 10.0) -> list[Received]:
        async with self._arrived:
            await asyncio.wait_for(
                self._arrived.wait_for(lambda: len(self.received) >= count), timeout
            )
        return list(self.received)

    async def _record(self, request: web.Request) -> None:
        """Record a POST whose body arrived whole; a sender that dies mid-body (the chaos
        test kills them) delivered nothing, so it is not counted and not logged as an
        error of ours."""
        try:
            body = await request.read()
        except ConnectionError:
            raise web.HTTPBadRequest(text="connection lost before the body arrived") from None
        self.received.append(Received(request.path, dict(request.headers), body))
        async with self._arrived:
            self._arrived.notify_all()

    async def _healthy(self, request: web.Request) -> web.Response:
        return web.json_response({"status": "ok", "version": request.match_info["version"]})

    async def _failing(self, request: web.Request) -> web.Response:
        return web.json_response({"status": "down"}, status=500)

    async def _slow(self, request: web.Request) -> web.Response:
        await asyncio.sleep(self.slow_seconds)
        return web.json_response({"status": "ok"})

    async def _hook_ok(self, request: web.Request) -> web.Response:
        await self._record(request)
        return web.json_response({"ok": True})

    async def _hook_fail(self, request: web.Request) -> web.Response:
        await self._record(request)
        return web.json_response({"ok": False}, status=500)
