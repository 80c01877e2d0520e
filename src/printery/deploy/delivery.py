"""Notification channels and webhook delivery for the notifier (docs/reference.md, The
deployment pipeline; Escalation kinds).

Channels are strings a producer writes in ``notify``: ``log`` or ``webhook+<http(s) URL>``.
A webhook receives the ``deployment:finished`` data as JSON, with an idempotency key that
stays the same across retries and restarts (delivery is at-least-once; receivers dedupe
on the key) and, when a secret is configured, an HMAC signature of the exact body bytes.

The channel is where URLs meet operators' eyes: anything this package shows (details,
``notification:sent``) goes through :func:`redact_channel`, printery's one redaction
rule set with the user info masked whole, so credentials never leave in an event or a
log line.
"""

from __future__ import annotations

import asyncio
import hashlib
import hmac
import re
from collections.abc import Collection
from dataclasses import dataclass
from typing import Any, Literal
from urllib.parse import urlsplit

import httpx
import orjson

from printery import redact_url
from printery.ext import compute_backoff

LOG = "log"
WEBHOOK_PREFIX = "webhook+"
IDEMPOTENCY_HEADER = "X-Printery-Idempotency-Key"
SIGNATURE_HEADER = "X-Printery-Signature"

# Whitespace and control characters: an HTTP client would reject or mangle them, and
# they are never intended in a URL someone typed into a request.
_BAD_URL_CHARS = re.compile(r"[\x00-\x20\x7f]")


def delivery_key(deployment_id: str, channel: str) -> str:
    """The idempotency key of a deployment's delivery to ``channel``: stable across
    retries, restarts and a reviewer's retry, so the receiver dedupes on it."""
    digest = hashlib.sha256(channel.encode()).hexdigest()[:16]
    return f"{deployment_id}:{digest}"


def url_problem(url: object) -> str | None:
    """Why ``url`` is not an absolute http(s) URL with a host, or None when it is one.

    Only http and https are allowed because the probes and webhooks speak HTTP; other
    schemes (file, gopher, ...) would turn a request field into a way to reach things
    the workers should not.
    """
    if not isinstance(url, str):
        return "must be a string"
    if _BAD_URL_CHARS.search(url):
        return "must not contain whitespace or control characters"
    try:
        parts = urlsplit(url)
        host = parts.hostname
        parts.port  # noqa: B018 - raises ValueError for a port out of range or not a number
    except ValueError as exc:
        return f"is not a valid URL ({exc})"
    if parts.scheme not in ("http", "https"):
        return "must use http or https"
    if not host:
        return "must have a host"
    return None


@dataclass(frozen=True, slots=True)
class Channel:
    """A parsed notification channel: ``kind`` ``log`` (url None) or ``webhook`` (url set)."""

    kind: Literal["log", "webhook"]
    url: str | None = None


def parse_channel(channel: str) -> Channel:
    """Parse a ``notify`` entry; raises ValueError naming what is wrong and what is allowed.

    The error messages show the channel redacted, since they end up in reasons and logs.
    """
    if not isinstance(channel, str):
        raise ValueError(f"channel must be a string, not {type(channel).__name__}")
    if channel == LOG:
        return Channel(kind="log")
    if channel.startswith(WEBHOOK_PREFIX):
        url = channel[len(WEBHOOK_PREFIX) :]
        problem = url_problem(url)
        if problem is not None:
            raise ValueError(f"webhook URL of {redact_channel(channel)!r} {problem}")
        return Channel(kind="webhook", url=url)
    raise ValueError(
        f"unknown channel {redact_channel(channel)!r}: expected 'log', "
        "'webhook+http://...' or 'webhook+https://...'"
    )


def redact_channel(channel: str) -> str:
    """The channel as it may be shown (``notification:sent``, logs): credentials as ``***``."""
    if channel.startswith(WEBHOOK_PREFIX):
        return WEBHOOK_PREFIX + redact_url(channel[len(WEBHOOK_PREFIX) :], keep_user=False)
    return redact_url(channel, keep_user=False) if "://" in channel else channel


def sign(body: bytes, secret: str) -> str:
    """``sha256=<hex HMAC-SHA256 of body>``: the ``X-Printery-Signature`` header value.

    It signs the exact bytes sent, so a receiver must verify the raw body before parsing.
    """
    digest = hmac.new(secret.encode(), body, hashlib.sha256).hexdigest()
    return f"sha256={digest}"


@dataclass(frozen=True, slots=True)
class DeliveryResult:
    """What became of one webhook delivery. ``attempts`` is 0 when nothing was sent
    (a refused host); ``status_code`` is that of the last response, if any."""

    status: Literal["delivered", "failed"]
    attempts: int
    detail: str
    status_code: int | None = None


def host_allowed(url: str, allow_hosts: Collection[str]) -> bool:
    """True when ``allow_hosts`` is empty or names the URL's host (``host`` or ``host:port``).

    Hosts compare case-insensitively; an entry without a port allows every port.
    """
    if isinstance(allow_hosts, str):  # one host given bare, not a list of its characters
        allow_hosts = (allow_hosts,)
    if not allow_hosts:
        return True
    parts = urlsplit(url)
    host = (parts.hostname or "").lower()
    port = parts.port or (443 if parts.scheme == "https" else 80)
    allowed = {entry.strip().lower() for entry in allow_hosts}
    return host in allowed or f"{host}:{port}" in allowed or f"[{host}]:{port}" in allowed


async def post_webhook(
    client: httpx.AsyncClient,
    url: str,
    payload: dict[str, Any],
    *,
    idempotency_key: str,
    secret: str | None,
    retries: int,
    backoff_ms: float,
    timeout: float,
    max_response_bytes: int = 65536,
    allow_hosts: Collection[str] = (),
) -> DeliveryResult:
    """POST ``payload`` as JSON to ``url``: up to ``1 + retries`` attempts, 2xx = delivered.

    The body is serialized once, and those same bytes are signed and sent on every
    attempt, so a receiver sees identical body, signature and idempotency key however
    often it is retried. ``timeout`` bounds each attempt as a whole (connect to the last
    byte read); at most ``max_response_bytes`` of a response are read, so a hostile or
    broken receiver can neither stall nor flood the notifier. Redirects are not followed:
    a payload must not be forwarded somewhere the allowlist did not approve.

    A URL that is not http(s), or whose host ``allow_hosts`` (when non-empty) does not
    name, fails at once without any request. Never raises for delivery problems; only a
    payload that is not JSON-serializable raises (a caller bug).
    """
    problem = url_problem(url)
    if problem is not None:
        return DeliveryResult("failed", 0, f"URL {problem}")
    if not host_allowed(url, allow_hosts):
        return DeliveryResult("failed", 0, "host not allowed")
    body = orjson.dumps(payload)
    headers = {"Content-Type": "application/json", IDEMPOTENCY_HEADER: idempotency_key}
    if secret:
        headers[SIGNATURE_HEADER] = sign(body, secret)

    detail = "not attempted"
    status_code: int | None = None
    attempts = 0
    for attempt in range(1, 2 + max(retries, 0)):
        if attempt > 1:
            await asyncio.sleep(compute_backoff(attempt - 1, base_ms=backoff_ms))
        attempts = attempt
        try:
            async with asyncio.timeout(timeout):
                status_code = await _post_once(
                    client, url, body, headers, timeout, max_response_bytes
                )
        except (httpx.HTTPError, httpx.InvalidURL, OSError, TimeoutError) as exc:
            status_code = None
            detail = _describe_error(exc, timeout)
            continue
        if 200 <= status_code < 300:
            return DeliveryResult("delivered", attempts, f"HTTP {status_code}", status_code)
        detail = f"HTTP {status_code}"
    return DeliveryResult("failed", attempts, f"{detail} after {attempts} attempt(s)", status_code)


async def _post_once(
    client: httpx.AsyncClient,
    url: str,
    body: bytes,
    headers: dict[str, str],
    limit_s: float,
    max_response_bytes: int,
) -> int:
    """One POST; reads at most ``max_response_bytes`` of the answer, returns its status."""
    request = client.build_request("POST", url, content=body, headers=headers, timeout=limit_s)
    response = await client.send(request, stream=True, follow_redirects=False)
    try:
        await read_limited(response, max_response_bytes)
    finally:
        # Closing before the body is exhausted drops the connection instead of reading on.
        await response.aclose()
    return response.status_code


async def read_limited(response: httpx.Response, limit: int) -> bytes:
    """Up to ``limit`` bytes of a streamed response body (decoded transfer, raw content).

    Raw bytes, so a compressed answer cannot expand past the limit on our side.
    """
    chunks: list[bytes] = []
    size = 0
    if limit <= 0:
        return b""
    async for chunk in response.aiter_raw():
        chunks.append(chunk)
        size += len(chunk)
        if size >= limit:
            break
    return b"".join(chunks)[:limit]


def _describe_error(exc: BaseException, timeout: float) -> str:
    """A short, secret-free description: httpx messages do not include the URL."""
    if isinstance(exc, TimeoutError | httpx.TimeoutException):
        return f"timed out after {timeout:g}s"
    message = str(exc) or type(exc).__name__
    return f"{type(exc).__name__}: {message}"
