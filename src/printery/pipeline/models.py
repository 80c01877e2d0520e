"""Model steps (docs/reference.md, Flow control and model steps):
:class:`OpenAICompatible`, one chat-completions call per
:meth:`~OpenAICompatible.complete` against any OpenAI-compatible endpoint.

What a step needs from a model call and usually writes by hand: a timeout, retries of
429 and 5xx that honour ``Retry-After`` (bounded in attempts and in delay), the call's
usage reported as the step's ``tokens`` cost (and ``usd`` from ``prices``), which is
what ``Limit(tokens_per_minute=...)`` and budgets count, and the API key kept out of
logs and errors.

Failures map onto the runtime's: a timeout, a connection failure or retries used up
raise :class:`~printery.Retry` (the entry is delivered again later); a ``Retry-After``
longer than ``max_retry_delay`` too, with that delay, so no handler sleeps for minutes
holding a slot; 401 and 403 as well (a key an operator can fix); any other 4xx is
:class:`~printery.Reject` (the same request would be
refused again), reason code ``model_request_refused``. A 2xx body with no
completion in it (no choice, or a message without content) raises
:class:`~printery.Retry` too: the entry fails and is delivered again. A body without
``usage`` charges the step's ``estimate=`` in its place (its tokens are unknown, not
zero), or reports no cost at all when the step declares none, and logs a warning once
per step. A streamed answer is complete only with ``[DONE]`` or a ``finish_reason``: one
that ends without either was cut short, and raises :class:`~printery.Retry`.

A ``breaker=`` (:class:`~printery.Breaker`, :mod:`printery.runtime.breaker`) is asked
before every request and told how it went: while it is open a request raises
:class:`~printery.ProviderDown` at once, without reaching the provider.

A quota is not a rate limit: a 402, a 429 whose body names ``insufficient_quota``, or a
429 whose ``Retry-After`` is longer than ``max_wait`` (default 60 s) raises
:class:`~printery.QuotaExhausted` at once, without asking again: a call that cannot be
served for hours (a monthly quota, a ``Retry-After`` of three days) goes to the step's
fallback (a :class:`~printery.Loop`'s, or ``escalate(..., fallback=...)``) instead of
being retried for as long as the entry's deliveries last.

Its namesake in other layers (the same job there): :mod:`printery.models`.
"""

from __future__ import annotations

import asyncio
import email.utils
import json
import os
import time
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

import httpx
import structlog

from printery.base.backoff import compute_backoff
from printery.base.errors import PipelineError, QuotaExhausted, Reject, Retry
from printery.observe import telemetry
from printery.observe.redact import MASK, register_secret
from printery.runtime.breaker import Breaker, Circuit
from printery.runtime.handler import Message

__all__ = ["Completion", "OpenAICompatible"]

log = structlog.get_logger("printery.models")

#: The name of a model call's span while tracing is on.
SPAN_NAME = "model.complete"

#: Status codes worth asking again: rate limited, and the server's own failures.
_RETRYABLE = frozenset({408, 409, 429, 500, 502, 503, 504})
#: What a 429's body says when the quota, not the rate, is what ran out (OpenAI's
#: ``error.code`` and ``error.type``; others copy it).
_QUOTA_MARK = "insufficient_quota"
#: Seconds a breaker's trial call may take past the call's ``timeout`` before another
#: caller may make the trial (the one that took it died).
_TRIAL_GRACE = 10.0


class CutStream(Retry):
    """A streamed answer that ended without ``[DONE]`` or a ``finish_reason``: a broken
    answer (the connection closed, or the body ended, mid-answer), retried; a failure of
    the provider for its breaker."""


@dataclass(frozen=True, slots=True)
class Completion:
    """What one call returned: the first choice's ``text``, its usage, the whole body."""

    text: str
    prompt_tokens: int
    completion_tokens: int
    body: dict[str, Any] = field(repr=False)

    @property
    def tokens(self) -> int:
        return self.prompt_tokens + self.completion_tokens


class OpenAICompatible:
    """A chat-completions endpoint at ``base_url`` (``.../v1``) serving ``model``.

    ``api_key_env`` names the environment variable holding the key (read at each call;
    ``None``: no key, for local servers); ``prices`` are USD per 1,000 ``input`` and
    ``output`` tokens. ``timeout`` bounds one HTTP attempt; ``max_attempts`` bounds the
    attempts of one call (429/5xx), each waiting ``Retry-After`` (or a backoff) of at
    most ``max_retry_delay`` seconds. A 402, a 429 naming ``insufficient_quota`` and a
    429 whose ``Retry-After`` exceeds ``max_wait`` seconds raise
    :class:`~printery.QuotaExhausted` (not retried). The step must declare the cost
    units it reports (``cost_units=["tokens", "usd"]``).
    """

    def __init__(
        self,
        base_url: str,
        model: str,
        *,
        api_key_env: str | None = "OPENAI_API_KEY",
        prices: Mapping[str, float] | None = None,
        timeout: float = 60.0,
        max_attempts: int = 4,
        max_retry_delay: float = 30.0,
        max_wait: float = 60.0,
        breaker: Breaker | None = None,
        http: httpx.AsyncClient | None = None,
    ) -> None:
        unknown = set(prices or {}) - {"input", "output"}
        if unknown:
            raise PipelineError(f"OpenAICompatible prices: unknown {sorted(unknown)}; "
                                "give USD per 1k tokens as {'input': ..., 'output': ...}")
        if max_attempts < 1:
            raise PipelineError(f"OpenAICompatible max_attempts={max_attempts!r}: at least 1")
        if isinstance(max_wait, bool) or not isinstance(max_wait, int | float) or not max_wait > 0:
            raise PipelineError(f"OpenAICompatible max_wait={max_wait!r}: a number of seconds > 0")
        if breaker is not None and not isinstance(breaker, Breaker):
            raise PipelineError(f"OpenAICompatible breaker={breaker!r}: a Breaker(failures=, "
                                "window=, reset=)")
        self.url = base_url.rstrip("/") + "/chat/completions"
        self._host = httpx.URL(self.url).host
        self.model = model
        self.api_key_env = api_key_env
        self.prices = dict(prices or {})
        self.timeout = timeout
        self.max_attempts = max_attempts
        self.max_retry_delay = max_retry_delay
        self.max_wait = max_wait
        self._http = http
        #: The model's circuit breaker, shared through the server (None: none).
        self.circuit = Circuit(model, breaker, lease=timeout + _TRIAL_GRACE) \
            if breaker is not None else None
        #: Steps already told that this model's responses carry no usage.
        self._unmetered: set[str] = set()
        self._key()  # registered for redaction as soon as it is known

    async def complete(
        self, message: Message, *, messages: Sequence[Mapping[str, Any]], stream: bool = False,
        **params: Any,
    ) -> Completion:
        """One chat completion of ``messages`` (``params``: ``temperature``,
        ``max_tokens``...); its usage is reported on ``message`` as ``tokens`` and ``usd``.
        While tracing is on (docs/reference.md, Tracing) the call is a span
        ``model.complete``, a child of the entry's, with the model, the attempts and the
        tokens.

        ``stream=True`` asks the server for server-sent chunks and shows each chunk's text
        to the run's followers as it comes (:meth:`Message.partial
        <printery.Message.partial>`, reference: streaming through the gate); the cost is
        the usage of the final chunk (``stream_options.include_usage`` is asked for). A
        connection that breaks mid-answer fails the call like any other
        (:class:`~printery.Retry`): what it showed is retracted, the next call streams
        anew."""
        with telemetry.call_span(SPAN_NAME, {"printery.model": self.model,
                                             "gen_ai.request.model": self.model,
                                             "server.address": self._host}) as span:
            done = await self._complete(message, messages, params, span, stream)
            if span is not None:
                span.set_attribute("printery.tokens", done.tokens)
                span.set_attribute("gen_ai.usage.input_tokens", done.prompt_tokens)
                span.set_attribute("gen_ai.usage.output_tokens", done.completion_tokens)
            return done

    async def _complete(
        self, message: Message, messages: Sequence[Mapping[str, Any]], params: dict[str, Any],
        span: Any, stream: bool = False,
    ) -> Completion:
        key = self._key()
        headers = {"Authorization": f"Bearer {key}"} if key else {}
        body = {**params, "model": self.model, "messages": list(messages)}
        for attempt in range(1, self.max_attempts + 1):
            if span is not None:
                span.set_attribute("printery.model.attempts", attempt)
            caller = await self.circuit.admit() if self.circuit is not None else ""
            try:
                response = await (self._streamed(message, body, headers) if stream
                                  else self._post(body, headers))
            except httpx.TimeoutException:
                await self._record(caller, failed=True)
                raise Retry(f"model call to {self.url} timed out after {self.timeout} s") from None
            except httpx.TransportError as exc:
                await self._record(caller, failed=True)
                raise Retry(self._clean(f"model call to {self.url} failed: {exc}")) from None
            except CutStream:
                await self._record(caller, failed=True)
                raise
            if isinstance(response, Completion):
                await self._record(caller, failed=False)
                return response
            await self._record(caller, failed=response.status_code >= 500)
            if span is not None:
                span.set_attribute("http.response.status_code", response.status_code)
            if response.status_code < 300:
                return self._completed(message, response)
            detail = self._clean(f"{self.url} answered {response.status_code}: {response.text[:300]}")
            if response.status_code in (401, 403):  # the key: an operator can fix it
                raise Retry(detail)
            delay = _retry_after(response.headers.get("retry-after"))
            self._quota(response, delay, detail)
            if response.status_code not in _RETRYABLE:
                raise Reject("model_request_refused", detail)
            if delay is None:
                delay = compute_backoff(attempt, base_ms=500, cap_ms=self.max_retry_delay * 1000)
            if delay > self.max_retry_delay or attempt == self.max_attempts:
                raise Retry(detail, delay=delay)
            log.warning("model call retried", url=self.url, status=response.status_code,
                        attempt=attempt, delay_s=round(delay, 3))
            await asyncio.sleep(delay)
        raise AssertionError("unreachable")  # pragma: no cover

    # -- internals ---------------------------------------------------------------------------

    async def _record(self, caller: str, *, failed: bool) -> None:
        """Tell the breaker (when there is one) how the request ``caller`` made went."""
        if self.circuit is not None:
            await self.circuit.record(caller, failed=failed)

    def _quota(self, response: httpx.Response, delay: float | None, detail: str) -> None:
        """Raise :class:`QuotaExhausted` when ``response`` says the quota is gone, not the
        rate: waiting it out would hold the entry for hours."""
        status = response.status_code
        if status == 402:
            raise QuotaExhausted(detail, retry_after=delay)
        if status != 429:
            return
        if _QUOTA_MARK in response.text:
            raise QuotaExhausted(detail, retry_after=delay)
        if delay is not None and delay > self.max_wait:
            raise QuotaExhausted(f"{detail} (Retry-After {delay:g} s is longer than max_wait "
                                 f"{self.max_wait:g} s)", retry_after=delay)

    def _key(self) -> str:
        if self.api_key_env is None:
            return ""
        key = os.environ.get(self.api_key_env, "")
        register_secret(key)
        return key

    def _clean(self, text: str) -> str:
        """``text`` without the key, should a server echo it."""
        key = self._key()
        return text.replace(key, MASK) if key else text

    async def _post(self, body: dict[str, Any], headers: dict[str, str]) -> httpx.Response:
        if self._http is not None:
            return await self._http.post(self.url, json=body, headers=headers,
                                         timeout=self.timeout)
        async with httpx.AsyncClient(timeout=self.timeout, trust_env=False) as http:
            return await http.post(self.url, json=body, headers=headers)

    def _completed(self, message: Message, response: httpx.Response) -> Completion:
        try:
            body = response.json()
            usage = body.get("usage")
            counted = isinstance(usage, dict) and (
                "prompt_tokens" in usage or "completion_tokens" in usage)
            prompt = int(usage.get("prompt_tokens") or 0) if counted else 0
            completion = int(usage.get("completion_tokens") or 0) if counted else 0
            text = _text_of(body.get("choices"))
        except (ValueError, AttributeError, TypeError) as exc:
            raise Retry(self._clean(f"{self.url} answered a body that is not a chat "
                                    f"completion: {exc}")) from None
        if text is None:
            raise Retry(self._clean(
                f"{self.url} answered no completion (model {self.model}): no choice with a "
                f"message content in {response.text[:200]}"))
        if not counted:
            self._no_usage(message)
            return Completion(text, 0, 0, body)
        return self._charged(message, Completion(text, prompt, completion, body))

    def _charged(self, message: Message, done: Completion) -> Completion:
        """``done``, its usage reported on ``message`` as ``tokens`` and ``usd``."""
        if done.tokens:
            message.report_cost("tokens", done.tokens)
        if self.prices:
            usd = (done.prompt_tokens * self.prices.get("input", 0.0)
                   + done.completion_tokens * self.prices.get("output", 0.0)) / 1000
            message.report_cost("usd", usd)
        return done

    async def _streamed(
        self, message: Message, body: dict[str, Any], headers: dict[str, str],
    ) -> httpx.Response | Completion:
        """A streaming call: its completion, each chunk shown as it came; or the answer
        that was not a stream (an error status: read whole, judged as any answer)."""
        asked = {**body, "stream": True, "stream_options": {"include_usage": True}}
        if self._http is not None:
            return await self._read_stream(self._http, message, asked, headers)
        async with httpx.AsyncClient(timeout=self.timeout, trust_env=False) as http:
            return await self._read_stream(http, message, asked, headers)

    async def _read_stream(
        self, http: httpx.AsyncClient, message: Message, body: dict[str, Any],
        headers: dict[str, str],
    ) -> httpx.Response | Completion:
        got = _Streamed()
        async with http.stream("POST", self.url, json=body, headers=headers,
                               timeout=self.timeout) as response:
            if response.status_code >= 300:
                await response.aread()
                return response
            try:
                async for line in response.aiter_lines():
                    try:
                        text = got.take(line)
                    except ValueError:
                        raise Retry(self._clean(f"{self.url} streamed a chunk that is not "
                                                f"JSON: {line[5:].strip()[:200]}")) from None
                    if got.ended:
                        break
                    if text:
                        await message.partial(text)
            except httpx.TransportError:
                if not got.finished:
                    raise  # cut mid-answer: a failed call (Retry), its partials retracted
                # cut after a choice finished: the answer is whole, only its usage is lost
        if not (got.ended or got.finished):
            raise CutStream(self._clean(
                f"{self.url} streamed an answer that ended without [DONE] or a "
                f"finish_reason (model {self.model}): it was cut short"))
        texts, usage, answered = got.texts, got.usage, got.answered
        if not answered:
            raise Retry(self._clean(f"{self.url} streamed no completion (model {self.model})"))
        text = "".join(texts)
        whole = {"model": self.model, "usage": usage, "choices": [
            {"index": 0, "message": {"role": "assistant", "content": text}}]}
        if not (isinstance(usage, dict) and ("prompt_tokens" in usage
                                             or "completion_tokens" in usage)):
            self._no_usage(message)
            return Completion(text, 0, 0, whole)
        try:
            prompt = int(usage.get("prompt_tokens") or 0)
            completion = int(usage.get("completion_tokens") or 0)
        except (TypeError, ValueError) as exc:
            raise Retry(self._clean(f"{self.url} streamed a usage that is not counts: "
                                    f"{exc}")) from None
        return self._charged(message, Completion(text, prompt, completion, whole))

    def _no_usage(self, message: Message) -> None:
        """A response without ``usage``: its cost is unknown, so the step's estimate is
        charged in its place (a budget stays safe: what was reserved is spent, not
        released); a step without one reports none (not a free call: zero would pass for
        a count). Said once per step of this model."""
        charged = _estimated(message)
        for unit, amount in charged.items():
            message.report_cost(unit, amount)
        if message.worker in self._unmetered:
            return
        self._unmetered.add(message.worker)
        if charged:
            log.warning("model response without usage: the step's estimate is charged in "
                        "its place", url=self.url, model=self.model, step=message.worker,
                        charged=charged)
        else:
            log.warning("model response without usage: its tokens and usd are not counted "
                        "(budgets and token limits do not see this step's calls; an "
                        "estimate= on the step is charged instead)",
                        url=self.url, model=self.model, step=message.worker)


def _estimated(message: Message) -> dict[str, float]:
    """What the step's ``estimate=`` says ``message``'s call spends, its valid amounts
    ({} when none is declared, or its function fails: a reservation would have
    dead-lettered the entry already)."""
    estimate = message.estimate
    if callable(estimate):
        try:
            estimate = estimate(message)
        except Exception as exc:  # user code: nothing charged rather than a failed call
            log.warning("the step's estimate function raised: nothing charged",
                        step=message.worker, error=str(exc))
            return {}
    if not isinstance(estimate, Mapping):
        return {}
    return {unit: float(amount) for unit, amount in estimate.items()
            if isinstance(unit, str) and isinstance(amount, int | float)
            and not isinstance(amount, bool) and 0 <= amount < float("inf")}


@dataclass
class _Streamed:
    """What a stream said so far: its text, its usage, whether a chunk had a choice
    (``answered``), whether a choice finished and whether ``[DONE]`` came (``ended``)."""

    texts: list[str] = field(default_factory=list)
    usage: Any = None
    answered: bool = False
    finished: bool = False
    ended: bool = False

    def take(self, line: str) -> str | None:
        """One line of the stream: the text it adds (None: none). Raises ``ValueError``
        for a data line that is not JSON."""
        if not line.startswith("data:"):
            return None  # comments, event names, keep-alives
        payload = line[5:].strip()
        if payload == "[DONE]":
            self.ended = True
            return None
        chunk = json.loads(payload)
        if not isinstance(chunk, dict):
            return None
        if isinstance(chunk.get("usage"), dict):
            self.usage = chunk["usage"]
        choices = chunk.get("choices")
        self.finished = self.finished or _finished(choices)
        text = _delta_of(choices)
        if text is None:
            return None
        self.answered = True
        if text:
            self.texts.append(text)
        return text


def _finished(choices: Any) -> bool:
    """Whether a streamed chunk says a choice is complete (its ``finish_reason``)."""
    return isinstance(choices, list) and any(
        isinstance(choice, dict) and choice.get("finish_reason") for choice in choices)


def _delta_of(choices: Any) -> str | None:
    """A streamed chunk's text: the first choice's ``delta.content`` ("" for a delta
    without text: the role, a finish); None for a chunk without a choice (the usage)."""
    if not isinstance(choices, list) or not choices or not isinstance(choices[0], dict):
        return None
    delta = choices[0].get("delta")
    content = delta.get("content") if isinstance(delta, dict) else None
    return content if isinstance(content, str) else ""


def _text_of(choices: Any) -> str | None:
    """The first choice's message content; "" for a message that answers with tool
    calls or a refusal instead; None when there is no choice or no content."""
    if not isinstance(choices, list) or not choices or not isinstance(choices[0], dict):
        return None
    answer = choices[0].get("message")
    if not isinstance(answer, dict):
        return None
    content = answer.get("content")
    if isinstance(content, str):
        return content
    if isinstance(content, list) and content:  # content parts: their text, in order
        return "".join(str(part.get("text") or "") for part in content if isinstance(part, dict))
    if content is None and (answer.get("tool_calls") or answer.get("refusal")):
        return ""
    return None


def _retry_after(value: str | None) -> float | None:
    """``Retry-After`` in seconds: a number of seconds or an HTTP date."""
    if not value:
        return None
    try:
        return max(0.0, float(value))
    except ValueError:
        pass
    try:
        when = email.utils.parsedate_to_datetime(value)
    except (TypeError, ValueError):
        return None
    return max(0.0, when.timestamp() - time.time())
