"""printery: worker orchestration over Redis Streams."""

from printery.backoff import compute_backoff
from printery.budgets import Budget
from printery.config import AppConfig, Settings, SettingsTable
from printery.envelope import Codec, Envelope
from printery.errors import (
    BlobMissing,
    ConfigError,
    DecodeError,
    DependencyCycle,
    HandlerError,
    InvalidInput,
    MessageError,
    PayloadTooLarge,
    PipelineError,
    PrinteryError,
    QuotaExhausted,
    Reject,
    Retry,
    ReviewActionFailed,
    ReviewError,
    ReviewInvalid,
    ReviewNotFound,
    ReviewRefused,
    SupervisorError,
    TransportError,
    UnknownRun,
    WorkerCrashed,
    WorkerFailed,
)
from printery.fields import review_fields
from printery.keys import DLQ, REVIEW, REVIEW_DECIDED, RUN_FAILED, PartitionError, StreamKeys, partition_of
from printery.limits import Limit
from printery.pipeline.aggregate import (
    Aggregator,
    JoinState,
    MergePolicy,
    all_must_pass,
    any_pass,
    first_wins,
)
from printery.pipeline.dag import Pipeline
from printery.pipeline.escalation import escalate, review_output
from printery.pipeline.fanout import Map
from printery.pipeline.loop import Loop
from printery.pipeline.render import to_mermaid, to_text
from printery.pipeline.review_kinds import ReviewCase, ReviewKind, ReviewOutcome
from printery.pipeline.step import Step
from printery.reason import Reason
from printery.redact import redact_text, redact_url
from printery.runs.client import Client, SyncClient
from printery.runs.cost import cost_summary
from printery.runs.partials import Partial, Verdict
from printery.runs.reader import RunResult
from printery.runs.replay import ReplayError, ReplayResult, replay
from printery.runtime.consumer import ConsumerSettings
from printery.runtime.handler import Handler, HandlerResult, Message, Output
from printery.runtime.stream_worker import StreamWorker
from printery.supervisor.manager import WorkerManager
from printery.worker import RunContext, Worker, WorkerState, WorkerStats

__all__ = [
    "DLQ",
    "REVIEW",
    "REVIEW_DECIDED",
    "RUN_FAILED",
    "Aggregator",
    "AppConfig",
    "BlobMissing",
    "Budget",
    "Client",
    "Codec",
    "ConfigError",
    "ConsumerSettings",
    "DecodeError",
    "DependencyCycle",
    "Envelope",
    "Handler",
    "HandlerError",
    "HandlerResult",
    "InvalidInput",
    "JoinState",
    "Limit",
    "Loop",
    "Map",
    "MergePolicy",
    "Message",
    "MessageError",
    "Output",
    "Partial",
    "PartitionError",
    "PayloadTooLarge",
    "Pipeline",
    "PipelineError",
    "PrinteryError",
    "QuotaExhausted",
    "Reason",
    "Reject",
    "ReplayError",
    "ReplayResult",
    "Retry",
    "ReviewActionFailed",
    "ReviewCase",
    "ReviewError",
    "ReviewInvalid",
    "ReviewKind",
    "ReviewNotFound",
    "ReviewOutcome",
    "ReviewRefused",
    "RunContext",
    "RunResult",
    "Settings",
    "SettingsTable",
    "Step",
    "StreamKeys",
    "StreamWorker",
    "SupervisorError",
    "SyncClient",
    "TransportError",
    "UnknownRun",
    "Verdict",
    "Worker",
    "WorkerCrashed",
    "WorkerFailed",
    "WorkerManager",
    "WorkerState",
    "WorkerStats",
    "all_must_pass",
    "any_pass",
    "compute_backoff",
    "cost_summary",
    "escalate",
    "first_wins",
    "partition_of",
    "redact_text",
    "redact_url",
    "replay",
    "review_fields",
    "review_output",
    "to_mermaid",
    "to_text",
]
