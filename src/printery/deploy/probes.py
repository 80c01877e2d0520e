"""HTTP probes of the deployment pipeline: dependency checks and the health watch.

Callers pass in one shared ``httpx.AsyncClient`` so connection pools and TLS settings
are decided once, by the worker. Every probe is bounded as a whole by its timeout (httpx
timeouts apply per network operation, so a server trickling bytes could otherwise hold a
probe forever), never follows redirects (a health endpoint that redirects is not
answering), and reads at most :data:`MAX_BODY_BYTES` of a body. Probes never raise for
network or HTTP problems: those are outcomes, reported with a secret-free ``detail``.
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any

import httpx
import orjson
from packaging.specifiers import InvalidSpecifier, SpecifierSet
from packaging.version import InvalidVersion, Version

from printery import redact_url
from printery.deploy.delivery import read_limited
from printery.deploy.events import (
    DependenciesChecked,
    DependencyResult,
    DependencyStatus,
    HealthChecked,
)
from printery.ext import compute_backoff

#: Health bodies are small JSON documents; anything past this is not read.
MAX_BODY_BYTES = 65536
#: First delay between dependency probe attempts; doubles per attempt.
DEFAULT_BACKOFF_MS = 250.0
#: Dependencies probed at once, so a long list cannot exhaust the client's pool and make
#: probes time out waiting for a connection rather than for the dependency.
DEFAULT_CONCURRENCY = 16


@dataclass(frozen=True, slots=True)
class _Answer:
    """One GET: ``status_code`` None when no response arrived (``error`` says why)."""

    status_code: int | None
    body: bytes
    latency_ms: float
    error: str | None = None
    location: str | None = None


async def _get(client: httpx.AsyncClient, url: str, limit_s: float) -> _Answer:
    """GET ``url`` within ``limit_s`` seconds overall, without following redirects."""
    started = time.perf_counter()
    try:
        async with asyncio.timeout(limit_s):
            request = client.build_request("GET", url, timeout=limit_s)
            response = await client.send(request, stream=True, follow_redirects=False)
            try:
                body = await read_limited(response, MAX_BODY_BYTES)
            finally:
                await response.aclose()
    except (TimeoutError, httpx.TimeoutException):
        return _Answer(None, b"", _ms_since(started), f"no answer within {limit_s:g}s")
    except (httpx.HTTPError, httpx.InvalidURL, OSError) as exc:
        return _Answer(None, b"", _ms_since(started), f"{type(exc).__name__}: {exc}")
    return _Answer(
        response.status_code,
        body,
        _ms_since(started),
        location=response.headers.get("location"),
    )


def _ms_since(started: float) -> float:
    return round((time.perf_counter() - started) * 1000, 1)


def _json_object(body: bytes) -> dict[str, Any] | None:
    """The body as a JSON object, or None when it is not one (plain text is fine)."""
    try:
        value = orjson.loads(body)
    except orjson.JSONDecodeError:
        return None
    return value if isinstance(value, dict) else None


def _http_failure(answer: _Answer) -> str:
    """Detail for a non-2xx answer; a redirect names where it pointed (redacted)."""
    if answer.status_code is not None and 300 <= answer.status_code < 400 and answer.location:
        where = redact_url(answer.location, keep_user=False)
        return f"HTTP {answer.status_code} redirect to {where} not followed"
    return f"HTTP {answer.status_code}"


def _judge_dependency(answer: _Answer, spec: SpecifierSet | None) -> tuple[DependencyStatus, str]:
    """(status, detail) of one dependency probe."""
    if answer.status_code is None:
        return "unreachable", answer.error or "no answer"
    if not 200 <= answer.status_code < 300:
        return "unhealthy", _http_failure(answer)
    if spec is None:
        return "healthy", f"HTTP {answer.status_code}"
    document = _json_object(answer.body)
    reported = document.get("version") if document is not None else None
    if not isinstance(reported, str):
        return "version_mismatch", f"no version reported, {spec} required"
    try:
        version = Version(reported)
    except InvalidVersion:
        return "version_mismatch", f"version {reported[:64]!r} is not PEP 440, {spec} required"
    # A running dependency is "already present on the system" in PEP 440's words, so its
    # pre-releases count: 2.1.0rc1 satisfies >=2.0.
    if not spec.contains(version, prereleases=True):
        return "version_mismatch", f"version {reported} does not satisfy {spec}"
    return "healthy", f"HTTP {answer.status_code}, version {reported}"


async def probe_dependency(
    client: httpx.AsyncClient,
    dep: dict[str, Any],
    *,
    timeout: float,
    retries: int,
    backoff_ms: float = DEFAULT_BACKOFF_MS,
) -> dict[str, Any]:
    """Probe one dependency (``service``, ``health_url``, optional ``version``).

    Returns ``{"service", "status", "detail", "latency_ms"}`` with status ``healthy``
    (2xx and, with a ``version`` constraint, a JSON body whose ``version`` satisfies that
    PEP 440 specifier set), ``unhealthy``, ``unreachable`` or ``version_mismatch``.
    Only unreachable and 5xx answers are retried, up to ``retries`` more times with
    :func:`printery.compute_backoff`: they are the transient ones, while a 4xx or a
    wrong version will not change in a few hundred milliseconds. ``latency_ms`` is that
    of the last attempt (None if none was made).
    """
    service = str(dep.get("service", ""))
    url = dep.get("health_url")
    spec: SpecifierSet | None = None
    constraint = dep.get("version")
    if constraint is not None:
        try:
            spec = SpecifierSet(str(constraint))
        except InvalidSpecifier:
            result = DependencyResult(
                service=service,
                status="version_mismatch",
                detail=f"invalid version constraint {str(constraint)[:64]!r}",
                latency_ms=None,
            )
            return result.model_dump(mode="json")
    if not isinstance(url, str):
        result = DependencyResult(
            service=service, status="unreachable", detail="no health_url", latency_ms=None
        )
        return result.model_dump(mode="json")

    attempts = 1 + max(retries, 0)
    for attempt in range(1, attempts + 1):
        answer = await _get(client, url, timeout)
        status, detail = _judge_dependency(answer, spec)
        transient = answer.status_code is None or answer.status_code >= 500
        if status == "healthy" or not transient or attempt == attempts:
            break
        await asyncio.sleep(compute_backoff(attempt, base_ms=backoff_ms))
    if attempt > 1:
        detail = f"{detail} (attempt {attempt} of {attempts})"
    result = DependencyResult(
        service=service, status=status, detail=detail, latency_ms=answer.latency_ms
    )
    return result.model_dump(mode="json")


async def check_dependencies(
    client: httpx.AsyncClient,
    deps: Sequence[dict[str, Any]],
    *,
    timeout: float,
    retries: int,
    deployment_id: str | None = None,
    backoff_ms: float = DEFAULT_BACKOFF_MS,
    concurrency: int = DEFAULT_CONCURRENCY,
) -> dict[str, Any]:
    """Probe every dependency concurrently; the ``dependencies:checked`` data.

    ``status`` is ``ok`` when every dependency is healthy, which includes having none,
    and ``blocked`` otherwise. ``results`` keep the order of ``deps``, so
    ``results[i]`` is ``dependencies[i]`` of the request (the aggregator's reasons point
    there). At most ``concurrency`` probes run at once.
    """
    gate = asyncio.Semaphore(max(concurrency, 1))

    async def one(dep: dict[str, Any]) -> dict[str, Any]:
        async with gate:
            return await probe_dependency(
                client, dep, timeout=timeout, retries=retries, backoff_ms=backoff_ms
            )

    async with asyncio.TaskGroup() as group:
        tasks = [group.create_task(one(dep)) for dep in deps]
    results = [task.result() for task in tasks]
    blocked = any(result["status"] != "healthy" for result in results)
    checked = DependenciesChecked.model_validate(
        {
            "deployment_id": deployment_id,
            "status": "blocked" if blocked else "ok",
            "results": results,
        }
    )
    return checked.model_dump(mode="json")


def _judge_health(answer: _Answer, expected_version: object) -> tuple[bool, str]:
    """(success, detail) of one probe of the deployed service.

    Success is 2xx and, when the body is a JSON object carrying ``version``, that version
    being the deployed one: an old instance still answering must not pass as the new.
    """
    if answer.status_code is None:
        return False, answer.error or "no answer"
    if not 200 <= answer.status_code < 300:
        return False, _http_failure(answer)
    document = _json_object(answer.body)
    if document is not None and "version" in document:
        reported = document["version"]
        if reported != expected_version:
            return False, (
                f"HTTP {answer.status_code} but version {str(reported)[:64]!r} answers, "
                f"not {expected_version}"
            )
    return True, f"HTTP {answer.status_code}"


async def watch_health(
    client: httpx.AsyncClient,
    request: dict[str, Any],
    *,
    interval: float,
    consecutive: int,
    deadline: float,
    probe_timeout: float,
    on_probe: Callable[[], None] | None = None,
) -> dict[str, Any]:
    """Watch a deployed service until it is healthy or the deadline passes.

    Probes ``request["health_url"]`` every ``interval`` seconds. ``healthy`` after
    ``consecutive`` successive successes; any failure starts the count again.
    ``unhealthy`` once ``deadline`` seconds have passed since the first probe, which
    bounds the whole watch: a probe never runs past the deadline. ``skipped`` (no probe)
    when the request has no ``health_url``. ``on_probe`` runs after every probe: the
    worker uses it to show progress (renew its lease, report cost) during a long watch.
    Returns the ``health:checked`` data.
    """
    deployment_id = request.get("deployment_id")
    url = request.get("health_url")
    if not isinstance(url, str) or not url:
        return HealthChecked(
            deployment_id=deployment_id,
            status="skipped",
            probes=0,
            consecutive_successes=0,
            last_status_code=None,
            detail="no health_url",
        ).model_dump(mode="json")

    needed = max(consecutive, 1)
    probes = 0
    streak = 0
    # What the service last answered: a final probe cut short by the deadline (no
    # answer) must not hide what the service was saying until then.
    last_status_code: int | None = None
    last_answer = ""
    started = time.monotonic()
    while True:
        remaining = deadline - (time.monotonic() - started)
        answer = await _get(client, url, max(min(probe_timeout, remaining), 0.001))
        probes += 1
        success, detail = _judge_health(answer, request.get("version"))
        if answer.status_code is not None:
            last_status_code, last_answer = answer.status_code, detail
        streak = streak + 1 if success else 0
        if on_probe is not None:
            on_probe()
        if streak >= needed:
            status, summary = "healthy", f"{streak} consecutive successful probes"
            break
        remaining = deadline - (time.monotonic() - started)
        if remaining <= 0:
            status, summary = "unhealthy", _deadline_detail(deadline, probes, last_answer or detail)
            break
        await asyncio.sleep(min(interval, remaining))
        if time.monotonic() - started >= deadline:
            status, summary = "unhealthy", _deadline_detail(deadline, probes, last_answer or detail)
            break
    return HealthChecked.model_validate(
        {
            "deployment_id": deployment_id,
            "status": status,
            "probes": probes,
            "consecutive_successes": streak,
            "last_status_code": last_status_code,
            "detail": summary,
        }
    ).model_dump(mode="json")


def _deadline_detail(deadline: float, probes: int, last: str) -> str:
    return f"not healthy within {deadline:g}s ({probes} probes); last: {last}"
