"""printery: worker orchestration over Redis Streams."""

from printery.backoff import compute_backoff
from printery.errors import (
    BlobMissing,
    ConfigError,
    DecodeError,
    DependencyCycle,
    HandlerError,
    MessageError,
    PayloadTooLarge,
    PipelineError,
    PrinteryError,
    Reject,
    Retry,
    SupervisorError,
    TransportError,
    WorkerFailed,
)
from printery.pipeline.gate import Reason
from printery.worker import RunContext, Worker, WorkerState, WorkerStats

__all__ = [
    "BlobMissing",
    "ConfigError",
    "DecodeError",
    "DependencyCycle",
    "HandlerError",
    "MessageError",
    "PayloadTooLarge",
    "PipelineError",
    "PrinteryError",
    "Reason",
    "Reject",
    "Retry",
    "RunContext",
    "SupervisorError",
    "TransportError",
    "Worker",
    "WorkerFailed",
    "WorkerState",
    "WorkerStats",
    "compute_backoff",
]
