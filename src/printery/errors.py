"""Every error printery raises, under one root.

::

    PrinteryError
     +-- ConfigError            a setting is invalid (the CLI exits 2)
     +-- TransportError         the server could not be reached or answered oddly
     |    +-- ServerStartError  the embedded server binary would not start
     +-- MessageError           an entry cannot be turned into an envelope
     |    +-- DecodeError       `data` missing or not JSON (reason_code `undecodable`)
     |    +-- PayloadTooLarge   larger than the payload limit (`payload_too_large`)
     |    +-- BlobMissing       a `$ref` points at no blob (`blob_missing`)
     +-- HandlerError           raised by handlers to steer failure handling
     |    +-- Retry             retry later (counts as a delivery)
     |    +-- Reject            never retry: dead-letter at once with a reason code
     +-- SupervisorError
     |    +-- DependencyCycle   the declared worker graph has a cycle
     |    +-- WorkerFailed      a worker exhausted its restarts (or failed standalone)
     +-- PipelineError          a pipeline definition is invalid
"""

from __future__ import annotations


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


class ServerStartError(TransportError):
    """Raised when the embedded server binary does not come up."""


class MessageError(PrinteryError):
    """Raised when a stream entry cannot become an envelope; carries a stable reason code."""

    reason_code = "malformed_entry"


class DecodeError(MessageError):
    """Raised when `data` is missing or not valid JSON."""

    reason_code = "undecodable"


class PayloadTooLarge(MessageError):
    """Raised when an entry's payload exceeds the configured limit."""

    reason_code = "payload_too_large"


class BlobMissing(MessageError):
    """Raised when a `$ref` payload points at a blob that no longer exists."""

    reason_code = "blob_missing"


class HandlerError(PrinteryError):
    """Base of the errors a handler raises on purpose."""


class Retry(HandlerError):
    """Raise to have the entry redelivered after the backoff (it counts as a delivery)."""


class Reject(HandlerError):
    """Raise to dead-letter the entry at once; `reason_code` lands in the dlq entry."""

    def __init__(self, reason_code: str, message: str = "") -> None:
        self.reason_code = reason_code
        super().__init__(message or reason_code)


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
