"""The HTTP API under ``/v1`` (docs/reference.md, The API: /v1): runs, reviews and dead
letters, for programs that cannot use the Python client.

Every answer is JSON; client input never gets a 500: a body over the payload limit is
413 (refused before it is read when its length is declared, and never read past the
limit otherwise), malformed JSON or a wrong shape is 400 with machine-actionable
reasons. Access (:class:`~printery.service.access.Access`, the console's rule too):
with a token, every request needs ``Authorization: Bearer <token>`` (compared in
constant time); without one, only a loopback listener answers, anything else is 403.
"""

from __future__ import annotations

import re
from collections.abc import Awaitable, Callable, Mapping
from datetime import UTC, datetime
from typing import Any
from urllib.parse import quote, unquote, urlencode

from aiohttp import web

from printery.base import _json
from printery.base.errors import (
    InvalidInput,
    PayloadTooLarge,
    ReviewActionFailed,
    ReviewError,
    ReviewInvalid,
    ReviewNotFound,
    ReviewRefused,
    ReviewRunEnded,
    UnknownRun,
)
from printery.base.reason import Reason
from printery.inbox import dead_letters, reviews
from printery.observe.logging import get_logger
from printery.pipeline.dag import Pipeline
from printery.runs.cost import budget_report
from printery.runs.facade import Runs
from printery.runs.listing import list_runs, listing_of_query
from printery.runs.partials import POSITION, Partial
from printery.runs.reader import RUNNING, run_cost, run_status
from printery.service.access import Access, service_access
from printery.settings.config import Settings
from printery.store import Redis
from printery.wire.fields import STEP, TRACEPARENT, WORKER
from printery.wire.keys import DLQ, REVIEW, StreamKeys

__all__ = ["build_api", "refusal", "service_api"]

log = get_logger("printery.api")

Handler = Callable[[web.Request], Awaitable[web.StreamResponse]]
_SUBMIT_KEYS = frozenset({"data", "event_type", "run_id", "idempotency_key", "deadline",
                          "supersede"})
#: What ``POST /v1/runs/{id}/cancel`` takes.
_CANCEL_KEYS = frozenset({"reason", "by"})
_MAX_ID = 256
#: The most reviews one ``GET /v1/reviews`` page returns.
MAX_REVIEW_PAGE = 1000
#: Milliseconds an ``EventSource`` waits before it reconnects (the ``retry:`` hint).
RETRY_MS = 2000



def error(
    status: int, code: str, detail: str = "", *, reasons: list[dict[str, str]] | None = None,
    headers: Mapping[str, str] | None = None,
) -> web.Response:
    body: dict[str, Any] = {"error": code}
    if detail:
        body["detail"] = detail
    if reasons is not None:
        body["reasons"] = reasons
    return respond(body, status, headers)


def respond(body: object, status: int = 200, headers: Mapping[str, str] | None = None) -> (
    web.Response
):
    return web.json_response(body, status=status, dumps=_json.dumps,
                             headers={"Cache-Control": "no-store", **(headers or {})})


async def read_json(request: web.Request, limit: int) -> Any:
    """The request's JSON body; raises :class:`_Refused` (413 over ``limit`` bytes,
    400 when it is not JSON)."""
    if request.content_length is not None and request.content_length > limit:
        raise _Refused(error(413, "payload_too_large", f"body over {limit} bytes"))
    chunks, size = [], 0
    while True:
        chunk = await request.content.readany()
        if not chunk:
            break
        size += len(chunk)
        if size > limit:
            raise _Refused(error(413, "payload_too_large", f"body over {limit} bytes"))
        chunks.append(chunk)
    try:
        return _json.loads(b"".join(chunks))
    except (_json.JSONDecodeError, ValueError) as exc:
        raise _Refused(error(400, "malformed_json", str(exc)[:200])) from None


class _Refused(Exception):
    """Ends a request early with ``response``."""

    def __init__(self, response: web.Response) -> None:
        super().__init__(response.status)
        self.response = response


def _reason(code: str, field: str, message: str) -> dict[str, str]:
    return Reason(code=code, field=field, message=message).as_dict()


def submit_arguments(body: Any) -> dict[str, Any]:
    """``POST /v1/runs`` body -> :meth:`Runs.submit` keyword arguments; raises
    :class:`_Refused` (400 with reasons) for a wrong shape."""
    if not isinstance(body, dict):
        raise _Refused(error(400, "invalid_request", "the body must be a JSON object",
                             reasons=[_reason("malformed_event", "", "expected an object")]))
    reasons = [_reason("unknown_field", key, "not a field of a run submission")
               for key in body if key not in _SUBMIT_KEYS]
    if "data" not in body:
        reasons.append(_reason("missing_field", "data", "the run's input is required"))
    for key in ("event_type", "run_id", "idempotency_key", "supersede"):
        value = body.get(key)
        if value is not None and not (isinstance(value, str) and 0 < len(value) <= _MAX_ID):
            reasons.append(_reason("invalid_field", key, f"a string of 1 to {_MAX_ID} characters"))
    deadline = body.get("deadline")
    if deadline is not None and (isinstance(deadline, bool)
                                 or not isinstance(deadline, int | float) or not deadline > 0):
        reasons.append(_reason("invalid_field", "deadline", "a positive number of seconds"))
    if reasons:
        raise _Refused(error(400, "invalid_request", reasons=reasons))
    return {key: body.get(key) for key in _SUBMIT_KEYS}


def cancel_arguments(body: Any) -> dict[str, Any]:
    """``POST /v1/runs/{id}/cancel`` body (``{"reason"?, "by"?}``, may be empty) ->
    :meth:`Runs.cancel` keyword arguments; :class:`_Refused` (400) for a wrong shape."""
    if body is None:
        return {}
    if not isinstance(body, dict):
        raise _Refused(error(400, "invalid_request", "the body must be a JSON object"))
    reasons = [_reason("unknown_field", key, "not a field of a cancel")
               for key in body if key not in _CANCEL_KEYS]
    for key in _CANCEL_KEYS:
        value = body.get(key)
        if value is not None and not (isinstance(value, str) and len(value) <= 1000):
            reasons.append(_reason("invalid_field", key, "a string of at most 1000 characters"))
    if reasons:
        raise _Refused(error(400, "invalid_request", reasons=reasons))
    return {"reason": body.get("reason") or "", "by": body.get("by")}


def decision_arguments(body: Any, decision: str) -> dict[str, Any]:
    """A review decision's body (``{"by", "note"?, "data"?}``; no ``data`` on a reject)
    -> :func:`printery.inbox.reviews.decide` keyword arguments; :class:`_Refused` (400) for a
    wrong shape."""
    if not isinstance(body, dict):
        raise _Refused(error(400, "invalid_request", "the body must be a JSON object"))
    allowed = {"by", "note", "data"} if decision == "approve" else {"by", "note"}
    reasons = [_reason("unknown_field", key, f"not a field of a {decision}")
               for key in body if key not in allowed]
    by, note = body.get("by"), body.get("note", "")
    if not (isinstance(by, str) and 0 < len(by.strip()) <= _MAX_ID):
        reasons.append(_reason("missing_field" if by is None else "invalid_field", "by",
                               f"who decides: a string of 1 to {_MAX_ID} characters"))
    if not isinstance(note, str):
        reasons.append(_reason("invalid_field", "note", "a string"))
    if reasons:
        raise _Refused(error(400, "invalid_request", reasons=reasons))
    arguments: dict[str, Any] = {"by": by, "note": note}
    if body.get("data") is not None:
        arguments["data"] = body["data"]
    return arguments


def _ref(event_type: str, entry_id: str) -> str:
    return f"{quote(event_type, safe=':')}/{entry_id}"


def event_id(entry: Mapping[str, Any], positions: Mapping[str, str]) -> str:
    """The ``id:`` of ``entry`` on a run's event stream, unique within the run: its event
    type and entry id (``deployment:finished/1700000000123-0``), then, comma-separated,
    the last entry id given of each other stream of the run (``positions``, this one's
    included): everything a reconnect with it as ``Last-Event-ID`` has been given, so
    the stream goes on after exactly that event (:func:`parse_event_id`). Event types
    are percent-encoded (``/``, ``,`` and spaces never appear raw)."""
    own = str(entry["stream"])
    return ",".join([_ref(own, str(entry["id"])),
                     *(_ref(t, positions[t]) for t in sorted(positions) if t != own)])


_ENTRY_ID = re.compile(r"\d{1,20}-\d{1,20}")


def parse_event_id(text: str) -> dict[str, str] | None:
    """The positions an :func:`event_id` names (event type -> last entry id given);
    None for no id or one this server did not write (the stream starts from the first
    entry)."""
    if not text.strip():
        return None
    positions: dict[str, str] = {}
    for item in text.strip().split(","):
        event_type, _, entry_id = item.rpartition("/")
        if not event_type or not _ENTRY_ID.fullmatch(entry_id):
            return None
        positions[unquote(event_type)] = entry_id
    return positions


def step_summary(runs: Runs, entries: list[dict[str, Any]],
                 figures: Mapping[str, Any]) -> list[dict[str, Any]]:
    """Each step of the pipeline for one run: ``done`` when it wrote an entry of the run
    (or a review decision wrote one of its output types for it),
    ``failed`` when it dead-lettered one, ``review`` when it escalated one, else
    ``pending``; with its handler time and cost (``figures``: :func:`run_cost`'s steps)."""
    states: dict[str, str] = {}
    steps = runs.pipeline.steps
    for entry in entries:
        stream, producer = entry.get("stream"), str(entry.get("producer", ""))
        if stream == DLQ:
            states[str(entry.get(WORKER, ""))] = "failed"
        elif stream == REVIEW:
            states[str(entry.get(STEP) or producer)] = "review"
        elif producer in steps:
            states.setdefault(producer, "done")
        else:  # written for a step (a review's approval resumes with its output type)
            for step in runs.pipeline.producers_of(str(stream)):
                states.setdefault(step, "done")
    return [{"step": name, "status": states.get(name, "pending"),
             "duration_ms": figures.get(name, {}).get("duration_ms", 0.0),
             "cost": figures.get(name, {}).get("cost", {})} for name in runs.pipeline.steps]


def service_api(
    client: Redis, keys: StreamKeys, pipeline: Pipeline, settings: Settings,
    env: Mapping[str, str],
) -> tuple[web.Application, Runs]:
    """The ``/v1`` application of a process serving ``--http-addr`` (a service, or the
    parent of ``--processes``) over ``client``, and its :class:`Runs` (to close at
    shutdown). Without a token on a non-loopback address it logs one warning: ``/v1``
    answers 403 until the token's env var is set."""
    access = service_access(settings, env)
    if access.forbidden:
        log.warning("the HTTP API listens beyond loopback without a token: /v1 answers "
                    f"403 until {settings.api_token_env} is set", http_addr=settings.http_addr)
    limit = settings.transport.payload_limit_bytes
    runs = Runs(client, keys, pipeline, payload_limit=limit, producer="printery-api",
                replicated=settings.transport.submit_wait)
    return build_api(runs, access, body_limit=limit), runs


def refusal(access: Access, request: web.Request) -> web.Response | None:
    """The answer for a request the access rule refuses (as JSON), or None."""
    if access.forbidden:
        return error(403, "forbidden", f"the API listens beyond loopback without a "
                     f"token: set {access.token_env} for the service")
    if access.token is not None and not access.bearer(request):
        return error(401, "unauthorized", "a valid `Authorization: Bearer <token>` "
                     "header is required", headers={"WWW-Authenticate": "Bearer"})
    return None


def build_api(runs: Runs, access: Access, *, body_limit: int) -> web.Application:
    """The ``/v1`` application, to mount under the service's HTTP server."""

    @web.middleware
    async def guard(request: web.Request, handler: Handler) -> web.StreamResponse:
        refused = refusal(access, request)
        if refused is not None:
            return refused
        try:
            return await handler(request)
        except _Refused as exc:
            return exc.response

    api = web.Application(middlewares=[guard])
    _run_routes(api, runs, body_limit)
    _cancel_route(api, runs, body_limit)
    _run_list_route(api, runs)
    _review_routes(api, runs, body_limit)
    _dlq_routes(api, runs)
    return api


def _run_routes(api: web.Application, runs: Runs, body_limit: int) -> None:
    async def submit(request: web.Request) -> web.Response:
        arguments = submit_arguments(await read_json(request, body_limit))
        try:  # a producer's trace context, as W3C Trace Context sends it: a header
            run_id, entry_id = await runs.submit(
                **arguments, traceparent=request.headers.get(TRACEPARENT))
        except InvalidInput as exc:
            return error(400, "invalid_input", str(exc),
                         reasons=[reason.as_dict() for reason in exc.reasons])
        except PayloadTooLarge as exc:
            return error(413, "payload_too_large", str(exc))
        return respond({"run_id": run_id, "entry_id": entry_id}, 202)

    async def get_run(request: web.Request) -> web.Response:
        run_id = request.match_info["run_id"]
        try:
            entries = await runs.entries(run_id)
        except UnknownRun as exc:
            return error(404, "unknown_run", str(exc))
        spent = run_cost(runs.pipeline, entries)
        budget, limits_from = await budget_report(runs.redis, runs.keys, runs.pipeline, run_id)
        status = run_status(runs.reader.outcome_of(entries))
        deadline = await runs.deadline(run_id) if status == RUNNING else None
        return respond({"run_id": run_id, "status": status,
                        **({} if deadline is None else {"deadline": datetime.fromtimestamp(
                            deadline, UTC).isoformat(timespec="milliseconds")}),
                        "entries": entries,
                        "cost": spent["total"]["cost"],
                        "steps": step_summary(runs, entries, spent["steps"]),
                        **({} if budget is None else {"budget": budget,
                                                      "budget_limits": limits_from})})

    async def run_events(request: web.Request) -> web.StreamResponse:
        """The run's entries as server-sent events (see :func:`event_id`): 404 for an
        unknown run; on a reconnect (``Last-Event-ID``) the events after that one, or
        204 (which stops an ``EventSource``) when the outcome was given already."""
        run_id = request.match_info["run_id"]
        seen = parse_event_id(request.headers.get("Last-Event-ID", ""))
        response = web.StreamResponse(headers={
            "Content-Type": "text/event-stream", "Cache-Control": "no-store",
            "X-Accel-Buffering": "no"})

        def alive() -> bool:
            transport = request.transport
            return transport is not None and not transport.is_closing()

        try:
            async with runs.reader.open(run_id, seen=seen, partials=True) as run:
                if not run.known:
                    return error(404, "unknown_run", f"no entries of "
                                 f"{runs.pipeline.correlation_field} {run_id!r}")
                if run.ended:
                    return web.Response(status=204, headers={"Cache-Control": "no-store"})
                await response.prepare(request)
                await response.write(f"retry: {RETRY_MS}\n\n".encode())
                positions = dict(seen or {})
                async for item in run.items(alive):
                    if isinstance(item, dict):
                        positions[item["stream"]] = item["id"]
                        head = f"id: {event_id(item, positions)}\ndata: "
                        body = item
                    else:  # a partial or a verdict: positioned in the run's partials stream
                        positions[POSITION] = item.id
                        kind = "partial" if isinstance(item, Partial) else "verdict"
                        at = event_id({"stream": POSITION, "id": item.id}, positions)
                        head, body = f"event: {kind}\nid: {at}\ndata: ", item.as_event()
                    await response.write(head.encode() + _json.dumps(body).encode() + b"\n\n")
                await response.write_eof()
        except ConnectionResetError:  # the client went away: nothing to report
            log.debug("event stream client went away", run_id=run_id)
        return response

    api.router.add_post("/runs", submit)
    api.router.add_get("/runs/{run_id}", get_run)
    api.router.add_get("/runs/{run_id}/events", run_events)


def _cancel_route(api: web.Application, runs: Runs, body_limit: int) -> None:
    async def cancel(request: web.Request) -> web.Response:
        run_id = request.match_info["run_id"]
        body = await read_json(request, body_limit) if request.can_read_body else None
        try:
            done = await runs.cancel(run_id, **cancel_arguments(body))
        except UnknownRun as exc:
            return error(404, "unknown_run", str(exc))
        return respond(done.as_dict())

    api.router.add_post("/runs/{run_id}/cancel", cancel)


def _run_list_route(api: web.Application, runs: Runs) -> None:
    async def run_list(request: web.Request) -> web.Response:
        """A page of runs newest first (:mod:`printery.runs.listing`); a full page links
        to the next (``Link: <...>; rel="next"``, the same query ``after`` its last run)."""
        try:
            listing = listing_of_query(request.query)
        except InvalidInput as exc:
            return error(400, exc.reasons[0].code, exc.reasons[0].message)
        page, following = await list_runs(runs.reader, listing)
        body = [run.as_dict() for run in page]
        if following is None:
            return respond(body)
        query = {k: v for k, v in request.query.items() if k in ("status", "since", "limit")}
        link = f"{request.path}?{urlencode({**query, 'after': following}, quote_via=quote)}"
        return respond(body, headers={"Link": f'<{link}>; rel="next"'})

    api.router.add_get("/runs", run_list)


def _review_routes(api: web.Application, runs: Runs, body_limit: int) -> None:
    keys, pipeline = runs.keys, runs.pipeline

    async def review_list(request: web.Request) -> web.Response:
        """A page of open reviews, oldest first: ``?limit=`` (1..MAX_REVIEW_PAGE, default
        :data:`~printery.inbox.reviews.REVIEW_PAGE`) after ``?after=`` (a review id); a full
        page links to the next (``Link: <...>; rel="next"``)."""
        raw_limit = request.query.get("limit", str(reviews.REVIEW_PAGE))
        if not raw_limit.isdigit() or not 1 <= int(raw_limit) <= MAX_REVIEW_PAGE:
            return error(400, "invalid_limit",
                         f"limit must be a whole number from 1 to {MAX_REVIEW_PAGE}")
        limit, after = int(raw_limit), request.query.get("after", "")
        try:
            page = await reviews.list_reviews(runs.redis, keys, pipeline, limit=limit,
                                              after=after)
        except ReviewInvalid as exc:
            return error(400, "invalid_after", str(exc))
        if len(page) < limit:
            return respond(page)
        following = f"{request.path}?limit={limit}&after={quote(page[-1]['id'], safe='')}"
        return respond(page, headers={"Link": f'<{following}>; rel="next"'})

    async def review_get(request: web.Request) -> web.Response:
        try:
            found = await reviews.get_review(runs.redis, keys, pipeline, request.match_info["id"])
        except ReviewNotFound as exc:
            return error(404, "unknown_review", str(exc))
        return respond(found)

    async def review_decide(request: web.Request) -> web.Response:
        decision = request.match_info["decision"]
        body = decision_arguments(await read_json(request, body_limit), decision)
        try:
            record = await reviews.decide(
                runs.redis, keys, pipeline, request.match_info["id"],
                "approved" if decision == "approve" else "rejected", producer="printery-api",
                **body)
        except ReviewNotFound as exc:
            return error(404, "unknown_review", str(exc))
        except ReviewRefused as exc:
            return error(409, "refused", str(exc))
        except ReviewRunEnded as exc:  # recorded, changed nothing
            return error(409, reviews.RUN_ENDED, str(exc))
        except ReviewInvalid as exc:
            return error(400, "invalid_decision", str(exc), reasons=exc.reasons)
        except ReviewActionFailed as exc:
            return error(502, "action_failed", str(exc))
        except ReviewError as exc:  # too much concurrent change: try again
            return error(409, "conflict", str(exc))
        return respond(record)

    api.router.add_get("/reviews", review_list)
    api.router.add_get("/reviews/{id}", review_get)
    api.router.add_post("/reviews/{id}/{decision:approve|reject}", review_decide)


def _dlq_routes(api: web.Application, runs: Runs) -> None:
    keys, field = runs.keys, runs.pipeline.correlation_field

    async def dlq_list(_: web.Request) -> web.Response:
        return respond(await dead_letters.dead_letters(runs.redis, keys, field))

    async def dlq_replay(request: web.Request) -> web.Response:
        result = await dead_letters.replay_dead_letter(runs.redis, keys, request.match_info["id"],
                                                       field)
        return respond(result) if result["replayed"] else error(404, "unknown_dead_letter",
                                                               result["error"])

    async def dlq_delete(request: web.Request) -> web.Response:
        result = await dead_letters.purge(runs.redis, keys, request.match_info["id"])
        return respond(result) if result["purged"] else error(404, "unknown_dead_letter",
                                                             result["error"])

    api.router.add_get("/dlq", dlq_list)
    api.router.add_post("/dlq/{id}/replay", dlq_replay)
    api.router.add_delete("/dlq/{id}", dlq_delete)
