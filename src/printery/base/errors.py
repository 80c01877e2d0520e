"""Every error printery raises, under one root.

::

    PrinteryError
     +-- ConfigError            a setting is invalid (the CLI exits 2)
     +-- TransportError         the server could not be reached or answered oddly
     |    +-- ServerRefused     the server refused the credentials or the ACL a
     |    |                     command: raised at once, never waited out
     |    +-- ServerStartError  the embedded server binary would not start
     +-- MessageError           an entry cannot be turned into an envelope
     |    +-- DecodeError       `data` missing or not JSON (reason_code `undecodable`)
     |    +-- PayloadTooLarge   larger than the payload limit (`payload_too_large`)
     |    +-- BlobMissing       a `$ref` points at no blob (`blob_missing`)
     +-- HandlerError           raised by handlers to steer failure handling
     |    +-- Retry             retry later, after `delay` if given (counts as a delivery)
     |    |    +-- ProviderDown  a model's circuit breaker is open: the fallback runs at
     |    |                      once, else retried after the breaker's reset
     |    +-- Reject            never retry: dead-letter at once with a reason code
     |         +-- QuotaExhausted  a provider's quota is gone (`quota_exhausted`): the
     |                           fallback runs at once
     +-- OutputContractError    a step emitted what its contract does not allow (a bug:
     |                          retried like any handler error, then dead-lettered)
     +-- WorkerCrashed          raised by a handler to crash its worker on purpose, or the
     |                          runtime itself failed: the worker crashes
     |                          (docs/reference.md, Failures)
     +-- StepTimeout            a handler call ran past its step's timeout (`timeout`)
     +-- SupervisorError
     |    +-- DependencyCycle   the declared worker graph has a cycle
     |    +-- WorkerFailed      a worker exhausted its restarts (or failed standalone)
     +-- PipelineError          a pipeline definition is invalid
     +-- ReplayError            a run cannot be replayed (unknown id, step or entry)
     |    +-- InvalidReplayId   the new id is one no run may have (CLI exit 2)
     +-- PartitionError         a partitioned key asked of the whole keyspace of several
     |                          partitions (also a LookupError)
     +-- InvalidInput           submitted data the ingress step refuses (`reasons`)
     +-- UnknownRun             no entry of that run id exists
     +-- ReviewError            a review decision could not be made
          +-- ReviewNotFound    unknown or already decided (CLI exit 1, HTTP 404)
          +-- ReviewRefused     this reviewer may not decide it (CLI exit 1, HTTP 409)
          +-- ReviewInvalid     no reviewer, or edited data the kind or the resumed
          |                     step refuses (CLI exit 2, HTTP 400)
          +-- ReviewActionFailed the decision's action failed; the review stays open
          |                     (CLI exit 1)
          +-- ReviewRunEnded    the review's run had ended: the decision changed nothing
                                (CLI exit 1, HTTP 409 ``run_ended``)

Connection failures that reach a caller of the public API are :class:`TransportError`,
with the client's own exception as ``__cause__``.
"""

from __future__ import annotations

import traceback
from collections.abc import Sequence
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from printery.base.reason import Reason

#: Characters of a traceback kept in a ``dlq`` entry: the innermost frames, which say
#: where it failed, are the ones kept.
TRACEBACK_LIMIT = 4000


def describe(exc: BaseException) -> str:
    """An error as one line: its type, and its text when it has one."""
    text = str(exc)
    return f"{type(exc).__name__}: {text}" if text else type(exc).__name__


def bounded_traceback(exc: BaseException, limit: int = TRACEBACK_LIMIT) -> str:
    """``exc``'s traceback as text, its last ``limit`` characters."""
    text = "".join(traceback.format_exception(exc))
    return text if len(text) <= limit else "...\n" + text[-limit:]


class PrinteryError(Exception):
    """Root of every printery error."""


class ConfigError(PrinteryError):
    """Raised when a setting is invalid; the message names setting, value and what is allowed."""

    def __init__(self, setting: str, value: object, allowed: str) -> None:
        self.setting = setting
        self.value = value
        self.allowed = allowed
        super().__init__(f"invalid {setting}: {value!r} ({allowed})")


class TransportError(PrinteryError):
    """Raised when the Redis-compatible server cannot be reached or misbehaves."""


class ServerRefused(TransportError):
    """Raised when the server refuses the connection's credentials or its ACL refuses a
    command: configuration, not an outage, so it is raised at once instead of waited out
    (a ``TransportError`` still, for callers that catch every server problem)."""


class ServerStartError(TransportError):
    """Raised when the embedded server binary does not come up."""


class MessageError(PrinteryError):
    """Raised when a stream entry cannot become an envelope; carries a stable reason code."""

    reason_code = "malformed_entry"


class DecodeError(MessageError):
    """Raised when `data` is missing or not valid JSON."""

    reason_code = "undecodable"


class InvalidRunId(MessageError):
    """Raised when an entry's run id (its correlation field, or the id in its data) is
    not a run id: over 256 characters, or holding a control character."""

    reason_code = "invalid_run_id"


class PayloadTooLarge(MessageError):
    """Raised when an entry's payload exceeds the configured limit."""

    reason_code = "payload_too_large"


class BlobMissing(MessageError):
    """Raised when a `$ref` payload points at a blob that no longer exists."""

    reason_code = "blob_missing"


class HandlerError(PrinteryError):
    """Base of the errors a handler raises on purpose."""


class Retry(HandlerError):
    """Raise to have the entry redelivered (it counts as a delivery) after ``delay``
    seconds, or after the worker's backoff when no delay is given (e.g. a model API's
    ``Retry-After``)."""

    def __init__(self, message: str = "", *, delay: float | None = None) -> None:
        if delay is not None and not delay >= 0:
            raise ValueError(f"Retry delay must be >= 0 seconds, not {delay!r}")
        self.delay = delay
        super().__init__(message or "retry requested")


#: The reason code of an attempt that met an open circuit breaker (a Loop's verdict).
PROVIDER_DOWN = "provider_down"


class ProviderDown(Retry):
    """A model's circuit breaker is open (docs/reference.md, Flow control and model
    steps): its provider failed ``failures`` calls in a row, so this call was refused at
    once, without a request. It is not worth asking again before the breaker's trial: a
    :class:`~printery.Loop` with a ``fallback`` or a step wrapped with ``escalate(...,
    fallback=...)`` runs its fallback at once; elsewhere it is a :class:`Retry` whose
    ``delay`` is the time until the breaker lets a trial call through. ``model``: the
    model name of the breaker."""

    def __init__(self, model: str, message: str = "", *, delay: float | None = None) -> None:
        self.model = model
        super().__init__(message or f"model {model}: its provider is down (circuit breaker "
                                    "open)", delay=delay)


class Reject(HandlerError):
    """Raise to dead-letter the entry at once; `reason_code` lands in the dlq entry."""

    def __init__(self, reason_code: str, message: str = "") -> None:
        self.reason_code = reason_code
        super().__init__(message or reason_code)


#: The reason code of a :class:`QuotaExhausted` entry or attempt.
QUOTA_EXHAUSTED = "quota_exhausted"


class QuotaExhausted(Reject):
    """A provider will not serve this call for longer than waiting makes sense: a 402, a
    429 naming an exhausted quota (``insufficient_quota``), or a ``Retry-After`` past
    the caller's ``max_wait``. Asking again soon is pointless, so it is never retried:
    a :class:`~printery.Loop` or a step wrapped with ``escalate(..., fallback=...)``
    runs its fallback at once; elsewhere the entry is dead-lettered with reason code
    ``quota_exhausted``. ``retry_after``: the seconds the provider named, if any."""

    def __init__(self, message: str = "", *, retry_after: float | None = None) -> None:
        self.retry_after = retry_after
        super().__init__(QUOTA_EXHAUSTED, message)


class PartitionError(PrinteryError, LookupError):
    """A partitioned key was asked of the whole keyspace of several partitions: the
    caller must name the partition (:meth:`~printery.StreamKeys.at`,
    :meth:`~printery.StreamKeys.of`). A ``LookupError`` too, as it was before it joined
    the error tree."""


class OutputContractError(PrinteryError):
    """Raised when a handler emits an undeclared type, data its output model refuses, or
    an undeclared cost unit."""


class WorkerCrashed(PrinteryError):
    """Raise it in a handler to crash its worker on purpose (a client it holds is beyond
    repair): the entry is handed back unacknowledged and the supervisor restarts the
    worker or marks it failed (docs/reference.md, Failures; Running workers). Anything
    else a handler raises, ``SystemExit`` and ``KeyboardInterrupt`` included, fails its
    entry only. The runtime raises it too when it fails itself."""


class StepTimeout(PrinteryError):
    """A handler call ran past its step's ``timeout`` and was cancelled (reason code
    ``timeout``, docs/reference.md): retried, then dead-lettered."""


#: The message of the cancellation of a call at its step's timeout (``Task.cancel``):
#: what the call sees as it is cancelled tells a timeout from a stop.
TIMEOUT_CANCEL = "printery: the step's timeout"


class SupervisorError(PrinteryError):
    """Base of the supervisor's errors."""


class DependencyCycle(SupervisorError):
    """Raised before anything starts when declared dependencies form a cycle."""

    def __init__(self, cycle: list[str]) -> None:
        self.cycle = cycle
        super().__init__("dependency cycle: " + " -> ".join(cycle))


class WorkerFailed(SupervisorError):
    """Raised when a worker is marked failed (restarts exhausted, or standalone mode)."""

    def __init__(self, worker: str, reason: str) -> None:
        self.worker = worker
        self.reason = reason
        super().__init__(f"worker {worker} failed: {reason}")


class PipelineError(PrinteryError):
    """Raised when a pipeline definition is invalid (cycle, unproduced input, unreachable step)."""


class ReplayError(PrinteryError):
    """Raised when a run cannot be replayed: unknown id, unknown step, or no entry."""


class InvalidReplayId(ReplayError):
    """Raised when a replay's new id is one no run may have (a usage error)."""


class InvalidInput(PrinteryError):
    """Raised by :meth:`~printery.Client.submit` when the data is not valid input of the
    ingress step; ``reasons`` says why (one :class:`~printery.Reason` per problem) and
    nothing was written."""

    def __init__(self, reasons: Sequence[Reason]) -> None:
        self.reasons = list(reasons)
        summary = "; ".join(f"{r.field or '(data)'}: {r.code}" for r in self.reasons[:5])
        super().__init__(f"invalid input ({summary})")


class UnknownRun(PrinteryError):
    """Raised when no entry of a run id exists (never submitted, or trimmed)."""
class ReviewError(PrinteryError):
    """Raised when a review decision cannot be made; nothing was written."""


class ReviewNotFound(ReviewError):
    """Raised for a review id that is unknown or already decided."""

    def __init__(self, review_id: str) -> None:
        self.review_id = review_id
        super().__init__(f"no open review {review_id} (unknown or already decided)")


class ReviewRefused(ReviewError):
    """Raised when the reviewer may not make this decision (the requester of a
    deployment approving it)."""


class ReviewInvalid(ReviewError):
    """Raised for a decision without a reviewer, or edited data on a rejection, on a kind
    that takes none, or that the resumed step's input model refuses, and for a listing's
    page that means nothing (a limit under 1, an ``after`` that is no review id);
    ``reasons`` are ``{code, field, message}`` dicts (the input model's)."""

    def __init__(self, message: str, reasons: list[dict[str, str]] | None = None) -> None:
        self.reasons = list(reasons or [])
        super().__init__(message)


class ReviewActionFailed(ReviewError):
    """Raised when the decision's own action failed (a retried delivery): nothing is
    recorded and the review stays open, so it can be decided again."""


class ReviewRunEnded(ReviewError):
    """Raised for a decision that would write to a run that has already ended (its
    outcome is written; ``status`` is the run's): it changes nothing. The review is closed
    (its ``review:decided`` names no outputs, ``reason_code`` ``run_ended``), and nothing
    the decision would have written is: a run gets one outcome."""

    def __init__(self, review_id: str, run_id: str, status: str) -> None:
        self.review_id, self.run_id, self.status = review_id, run_id, status
        super().__init__(f"review {review_id}: run {run_id} had already ended ({status}); "
                         "the decision changed nothing (review closed, nothing written)")
