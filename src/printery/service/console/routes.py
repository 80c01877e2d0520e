"""The console's routes on the service's HTTP server (docs/reference.md, The web console):
pages, the forms' POSTs, the live updates (server-sent events) and the static files.

Pages are rendered on the server (Jinja2, autoescaped). Live updates need no client-side
rendering either: a page's live part is one fragment the server renders again and sends
over SSE when it changed (a run's page: at each entry of the run, from the run's event
reader; the other pages: at most once a second); 40 lines of JS put it in place.

A page that fails shows an error page that says what kind of failure it was and never
the exception's text (a connection error can name the server; the log has the detail).
"""

from __future__ import annotations

import asyncio
import datetime
from collections.abc import Awaitable, Callable
from importlib import resources
from typing import Any
from urllib.parse import parse_qsl, quote

import jinja2
from aiohttp import web

from printery.base import _json
from printery.base._util import amount, amounts, idle
from printery.base.errors import (
    ReviewActionFailed,
    ReviewError,
    ReviewInvalid,
    ReviewNotFound,
    ReviewRefused,
)
from printery.inbox import dead_letters, reviews
from printery.observe.logging import get_logger
from printery.runs.partials import Drafts
from printery.service.access import ConsoleAuth
from printery.service.console.views import Views
from printery.store import ServerError

__all__ = ["add_console"]

log = get_logger("printery.console")

Handler = Callable[[web.Request], Awaitable[web.StreamResponse]]
#: Seconds between two renders of a polled page's live part.
POLL_SECONDS = 1.0
#: The deepest page of the runs list (each partition reads offset + a page of its index).
MAX_OFFSET = 10_000
_STATIC = {"console.css": "text/css", "console.js": "text/javascript"}
_HEADERS = {
    "Cache-Control": "no-store", "X-Content-Type-Options": "nosniff",
    "Referrer-Policy": "same-origin", "X-Frame-Options": "DENY",
    "Content-Security-Policy": "default-src 'self'; script-src 'self'; style-src 'self'; "
                               "img-src 'self' data:; frame-ancestors 'none'; form-action 'self'",
}
_MAX_FIELD = 256


def _environment() -> jinja2.Environment:
    env = jinja2.Environment(loader=jinja2.PackageLoader("printery.service.console", "templates"),
                             autoescape=True, trim_blocks=True, lstrip_blocks=True)
    env.filters["clock"] = lambda ms: datetime.datetime.fromtimestamp(
        int(ms) / 1000, datetime.UTC).strftime("%Y-%m-%d %H:%M:%S") if ms else ""
    env.filters["amounts"] = lambda cost: amounts(dict(sorted((cost or {}).items())),
                                                  joiner=", ", between=" ")
    env.filters["amount"] = amount
    env.filters["ms"] = lambda value: "" if value is None else f"{float(value):,.1f} ms"
    # A run id may hold a byte that is not UTF-8 (a producer's): quoted as that byte.
    env.filters["url"] = lambda value: quote(str(value), safe="", errors="surrogateescape")
    return env


class Console:
    """Renders pages for one process; :func:`add_console` puts its routes on the app."""

    def __init__(self, views: Views, auth: ConsoleAuth, *, body_limit: int) -> None:
        self.views = views
        self.auth = auth
        self.body_limit = body_limit
        self.env = _environment()
        self.static = {name: resources.files("printery.service.console").joinpath("static", name)
                       .read_bytes() for name in _STATIC}

    def html(self, request: web.Request, template: str, http_status: int = 200,
             **context: Any) -> web.Response:
        page = {"csrf": self.auth.csrf(request), "path": request.path,
                "login": self.auth.needs_login, "pipeline": self.views.pipeline.name,
                "ok": request.query.get("ok", ""), "problem": request.query.get("error", ""),
                **context}
        body = _json.valid_utf8(self.env.get_template(template).render(page))
        return web.Response(text=body, status=http_status, content_type="text/html",
                            headers=_HEADERS)

    def fragment(self, template: str, request: web.Request, **context: Any) -> str:
        return self.env.get_template(template).render(csrf=self.auth.csrf(request), **context)

    def forbidden(self, request: web.Request) -> web.Response:
        return self.html(request, "error.html", 403, title="Forbidden",
                         detail="The console listens beyond loopback without a token: set "
                                f"{self.auth.access.token_env} for the service.")

    def failure(self, request: web.Request, exc: BaseException) -> web.Response:
        """The error page: the kind of failure, never its text (see the module doc)."""
        if isinstance(exc, ServerError | OSError | TimeoutError):
            return self.html(request, "error.html", 503, title="Redis is not answering",
                             detail="The server did not answer; the page shows again "
                                    "once it does.")
        log.exception("console page failed", path=request.path, error=type(exc).__name__)
        return self.html(request, "error.html", 500, title="The page failed",
                         detail=f"An internal error ({type(exc).__name__}); the service "
                                "log has the detail.")


def add_console(app: web.Application, views: Views, auth: ConsoleAuth, *,
                body_limit: int) -> None:
    """Add the console's routes to ``app`` (the service's HTTP application)."""
    console = Console(views, auth, body_limit=body_limit)

    def page(handler: Handler, *, live: bool = False) -> Handler:
        async def guarded(request: web.Request) -> web.StreamResponse:
            if auth.forbidden():
                return console.forbidden(request)
            try:
                if not await auth.signed_in(request):  # a server that fails: the error page
                    if live or request.method == "POST":
                        raise web.HTTPUnauthorized(headers=_HEADERS)
                    raise web.HTTPSeeOther(f"/login?next={quote(request.path_qs, safe='')}")
                if request.method == "POST":
                    form = await _form(request, body_limit)
                    if not auth.csrf_valid(request, str(form.get("csrf", ""))):
                        return console.html(request, "error.html", 403, title="Refused",
                                            detail="The form's CSRF token is missing or "
                                                   "stale: load the page again.")
                    request["form"] = form
                return await handler(request)
            except web.HTTPException:
                raise
            except (asyncio.CancelledError, ConnectionResetError):
                raise
            except Exception as exc:
                if live:
                    raise
                return console.failure(request, exc)
        return guarded

    _login_routes(app, console)
    _page_routes(app, console, page)
    _action_routes(app, console, page)
    _live_routes(app, console, page)

    async def static(request: web.Request) -> web.Response:
        name = request.match_info["name"]
        if name not in _STATIC:
            raise web.HTTPNotFound()
        return web.Response(body=console.static[name], content_type=_STATIC[name],
                            headers={"Cache-Control": "max-age=3600",
                                     "X-Content-Type-Options": "nosniff"})

    app.router.add_get("/static/{name}", static)


async def _form(request: web.Request, limit: int) -> dict[str, str]:
    if request.content_length is not None and request.content_length > limit:
        raise web.HTTPRequestEntityTooLarge(max_size=limit, actual_size=request.content_length)
    chunks, size = [], 0
    while chunk := await request.content.readany():  # never read past the limit
        size += len(chunk)
        if size > limit:
            raise web.HTTPRequestEntityTooLarge(max_size=limit, actual_size=size)
        chunks.append(chunk)
    return dict(parse_qsl(b"".join(chunks).decode(errors="replace"), keep_blank_values=True))


def _login_routes(app: web.Application, console: Console) -> None:
    auth = console.auth

    async def login_form(request: web.Request) -> web.Response:
        target = _next(request.query.get("next", "/"))
        if auth.forbidden():
            return console.forbidden(request)
        if not auth.needs_login:
            raise web.HTTPSeeOther(target)
        return console.html(request, "login.html", next=target)

    async def login(request: web.Request) -> web.Response:
        form = await _form(request, 4096)
        target = _next(form.get("next", "/"))
        if not auth.csrf_valid(request, form.get("csrf", "")):
            return console.html(request, "error.html", 403, title="Refused",
                                detail="The form's CSRF token is missing or stale.")
        if not auth.token_matches(form.get("token", "")):
            return console.html(request, "login.html", 401, next=target,
                                problem="That is not the token.")
        response = web.HTTPSeeOther(target, headers=_HEADERS)
        if auth.needs_login:
            try:
                await auth.login(response, request)
            except Exception as exc:
                return console.failure(request, exc)
        raise response

    async def logout(request: web.Request) -> web.Response:
        form = await _form(request, 4096)
        if not auth.csrf_valid(request, form.get("csrf", "")):
            return console.html(request, "error.html", 403, title="Refused",
                                detail="The form's CSRF token is missing or stale.")
        response = web.HTTPSeeOther("/login")
        try:
            await auth.logout(response, request)
        except Exception as exc:
            return console.failure(request, exc)
        raise response

    app.router.add_get("/login", login_form)
    app.router.add_post("/login", login)
    app.router.add_post("/logout", logout)


def _next(target: str) -> str:
    """Where to go after logging in: a path of this site only."""
    return target if target.startswith("/") and not target.startswith("//") else "/"


Guard = Callable[..., Handler]


def _page_routes(app: web.Application, console: Console, page: Guard) -> None:
    views = console.views

    async def overview(request: web.Request) -> web.Response:
        return console.html(request, "overview.html", **await views.overview())

    async def run_list(request: web.Request) -> web.Response:
        return console.html(request, "runs.html", **await _run_list(views, request))

    async def run(request: web.Request) -> web.Response:
        found = await views.run(request.match_info["run_id"])
        if found is None:
            return console.html(request, "error.html", 404, title="No such run",
                                detail="No entry of this run exists (yet).")
        return console.html(request, "run.html", **found)

    async def review_list(request: web.Request) -> web.Response:
        return console.html(request, "reviews.html",
                            **await views.review_list(_after(request)))

    async def dlq(request: web.Request) -> web.Response:
        return console.html(request, "dlq.html", **await views.dlq_list())

    async def pipeline(request: web.Request) -> web.Response:
        return console.html(request, "pipeline.html", **views.pipeline_view())

    app.router.add_get("/", page(overview))
    app.router.add_get("/runs", page(run_list))
    app.router.add_get("/runs/{run_id}", page(run))
    app.router.add_get("/reviews", page(review_list))
    app.router.add_get("/dlq", page(dlq))
    app.router.add_get("/pipeline", page(pipeline))


def _after(request: web.Request) -> str:
    """A page's ``?after=`` (an entry id as listed; the views check it)."""
    return request.query.get("after", "")[:_MAX_FIELD]


async def _run_list(views: Views, request: web.Request) -> dict[str, Any]:
    try:
        offset = min(max(0, int(request.query.get("offset", "0"))), MAX_OFFSET)
    except ValueError:
        offset = 0
    return await views.run_list(query=request.query.get("q", "").strip()[:_MAX_FIELD],
                                status=request.query.get("status", "")[:_MAX_FIELD],
                                offset=offset)


def _action_routes(app: web.Application, console: Console, page: Guard) -> None:
    views = console.views

    async def decide(request: web.Request) -> web.Response:
        form, review_id = request["form"], request.match_info["id"]
        decision = request.match_info["decision"]
        by, note = form.get("by", "").strip(), form.get("note", "")
        back = "/reviews"
        if not 0 < len(by) <= _MAX_FIELD:
            raise _back(back, error="Say who decides (1 to 256 characters).")
        arguments: dict[str, Any] = {"by": by, "note": note[:4096]}
        if decision == "approve" and form.get("data", "").strip():
            try:
                arguments["data"] = _json.loads(form["data"])
            except (_json.JSONDecodeError, ValueError):
                raise _back(back, error="The edited data is not JSON.") from None
        client, keys, pipeline = views.client, views.keys, views.pipeline
        try:
            found = await reviews.get_review(client, keys, pipeline, review_id)
            await reviews.decide(client, keys, pipeline, review_id,
                                 "approved" if decision == "approve" else "rejected",
                                 producer="printery-console", **arguments)
        except ReviewNotFound:
            raise _back(back, error="That review is decided already or does not exist.") \
                from None
        except (ReviewRefused, ReviewInvalid, ReviewActionFailed, ReviewError) as exc:
            raise _back(back, error=str(exc)[:300]) from None
        run_id = str(found.get(pipeline.correlation_field) or "")
        done = "approved" if decision == "approve" else "rejected"
        raise _back(f"/runs/{quote(run_id, safe='')}" if run_id else back, ok=f"Review {done}.")

    async def replay(request: web.Request) -> web.Response:
        result = await dead_letters.replay_dead_letter(views.client, views.keys,
                                                       request.match_info["id"],
                                                       views.pipeline.correlation_field)
        if not result["replayed"]:
            raise _back("/dlq", error=str(result["error"])[:300])
        raise _back("/dlq", ok=f"Replayed as {result['new_id']}.")

    async def purge(request: web.Request) -> web.Response:
        result = await dead_letters.purge(views.client, views.keys, request.match_info["id"])
        if not result["purged"]:
            raise _back("/dlq", error=str(result["error"])[:300])
        raise _back("/dlq", ok="Purged.")

    app.router.add_post("/reviews/{id}/{decision:approve|reject}", page(decide))
    app.router.add_post("/dlq/{id}/replay", page(replay))
    app.router.add_post("/dlq/{id}/purge", page(purge))


def _back(path: str, *, ok: str = "", error: str = "") -> web.HTTPSeeOther:
    """303 to ``path`` with a message the page shows (escaped, like everything)."""
    query = f"ok={quote(ok)}" if ok else f"error={quote(error)}"
    return web.HTTPSeeOther(f"{path}?{query}")


def _live_routes(app: web.Application, console: Console, page: Guard) -> None:
    views = console.views

    async def stream(request: web.Request) -> web.StreamResponse:
        response = web.StreamResponse(headers={
            "Content-Type": "text/event-stream", "Cache-Control": "no-store",
            "X-Accel-Buffering": "no"})
        await response.prepare(request)
        return response

    def alive(request: web.Request) -> bool:
        transport = request.transport
        return transport is not None and not transport.is_closing()

    async def send(response: web.StreamResponse, html: str, event: str = "") -> None:
        head = f"event: {event}\n" if event else ""
        await response.write(f"{head}data: {_json.dumps({'html': html})}\n\n".encode())

    async def run_live(request: web.Request) -> web.StreamResponse:
        """The run's page part, sent again at each of its entries and at what its steps
        show while they work (its drafts, provisional until their verdict); ends after
        the outcome."""
        run_id = request.match_info["run_id"]
        response = await stream(request)
        entries: list[dict[str, Any]] = []
        drafts = Drafts()
        async for item in views.runs.reader.watch(run_id, alive=lambda: alive(request)):
            if isinstance(item, dict):
                entries.append(item)
            else:
                drafts.add(item)
            view = views.run_view(run_id, entries, drafts.drafts)
            await send(response, console.fragment("_run.html", request, **view))
        await send(response, "", "end")
        await response.write_eof()
        return response

    renders: dict[str, tuple[str, Callable[[web.Request], Awaitable[dict[str, Any]]]]] = {
        "overview": ("_overview.html", lambda _: views.overview()),
        "runs": ("_runs.html", lambda request: _run_list(views, request)),
        "reviews": ("_reviews.html", lambda request: views.review_list(_after(request))),
        "dlq": ("_dlq.html", lambda _: views.dlq_list()),
    }

    async def polled(request: web.Request) -> web.StreamResponse:
        """A page's live part, sent when it changed (checked once a second), for as long
        as its session is open: a logout (or its max age) ends the stream too."""
        name = request.match_info["page"]
        if name not in renders:
            raise web.HTTPNotFound()
        template, read = renders[name]
        response = await stream(request)
        last = None
        while alive(request):
            if not await console.auth.signed_in(request):
                await send(response, "", "end")
                break
            html = console.fragment(template, request, **await read(request))
            if html != last:
                await send(response, html)
                last = html
            await idle(POLL_SECONDS)
        return response

    app.router.add_get("/live/run/{run_id}", page(run_live, live=True))
    app.router.add_get("/live/{page}", page(polled, live=True))
