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
from printery.config import Settings
from printery.message import Codec, Envelope
from printery.pipeline.aggregate import Aggregator, JoinState, MergePolicy, all_must_pass, any_pass, first_wins
from printery.pipeline.dag import Pipeline, Step, to_mermaid, to_text
from printery.pipeline.escalation import escalate, review_output
from printery.pipeline.gate import Reason
from printery.runtime.handler import Handler, HandlerResult, Message, Output
from printery.runtime.stream_worker import ConsumerSettings, StreamWorker
from printery.supervisor.manager import WorkerManager
from printery.worker import RunContext, Worker, WorkerState, WorkerStats

__all__ = [
    "Aggregator",
    "Codec",
    "ConsumerSettings",
    "Envelope",
    "Handler",
    "HandlerResult",
    "JoinState",
    "MergePolicy",
    "Message",
    "Output",
    "Pipeline",
    "Settings",
    "Step",
    "StreamWorker",
    "WorkerManager",
    "all_must_pass",
    "any_pass",
    "escalate",
    "first_wins",
    "review_output",
    "to_mermaid",
    "to_text",
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
