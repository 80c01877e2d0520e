"""printery: worker orchestration over Redis Streams.

Everything here is the public API, described in docs/reference.md ("Python API"); the
names of ``__all__`` are grouped as its sections are. Other modules are internal, but
for ``printery.models``, whose names are also here (imported on first use: they load
an HTTP client that only a model step needs).
"""

from typing import TYPE_CHECKING

from printery.backoff import compute_backoff
from printery.budgets import Budget, BudgetPlan
from printery.config import AppConfig, Settings, SettingsTable
from printery.config_tables import (
    ConsoleSettings,
    ReviewSettings,
    TelemetrySettings,
    TransportSettings,
    WorkerSettings,
)
from printery.envelope import Codec, Envelope
from printery.errors import (
    BlobMissing,
    ConfigError,
    DecodeError,
    DependencyCycle,
    HandlerError,
    InvalidInput,
    MessageError,
    OutputContractError,
    PartitionError,
    PayloadTooLarge,
    PipelineError,
    PrinteryError,
    ProviderDown,
    QuotaExhausted,
    Reject,
    Retry,
    ReviewActionFailed,
    ReviewError,
    ReviewInvalid,
    ReviewNotFound,
    ReviewRefused,
    ReviewRunEnded,
    ServerRefused,
    ServerStartError,
    StepTimeout,
    SupervisorError,
    TransportError,
    UnknownRun,
    WorkerCrashed,
    WorkerFailed,
)
from printery.fields import review_fields
from printery.keys import DLQ, REVIEW, REVIEW_DECIDED, RUN_FAILED, StreamKeys, partition_of
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
from printery.pipeline.step import BoundStep, LoopShape, MapShape, Step, StepOptions, StepSource
from printery.reason import Reason
from printery.redact import redact_text, redact_url, register_secret
from printery.runs.client import Client, SyncClient
from printery.runs.cost import cost_summary
from printery.runs.listing import RunSummary
from printery.runs.partials import Partial, Verdict
from printery.runs.reader import RunResult
from printery.runs.replay import ReplayError, ReplayResult, replay
from printery.runtime.breaker import Breaker
from printery.runtime.consumer import ConsumerSettings
from printery.runtime.handler import Handler, HandlerResult, Message, Output
from printery.runtime.observe import Observer
from printery.runtime.payloads import PayloadStore
from printery.runtime.run_index import RunIndex, RunMark
from printery.runtime.step_context import Companion, Emit, StepContext
from printery.runtime.stream_worker import StreamWorker
from printery.supervisor.manager import WorkerManager
from printery.worker import RunContext, Worker, WorkerState, WorkerStats

if TYPE_CHECKING:
    from printery.models import Completion, OpenAICompatible

__all__ = [  # noqa: RUF022 - grouped as docs/reference.md's sections, sorted within each
    # Pipelines and steps
    "BoundStep", "Companion", "Emit", "Pipeline", "PipelineError", "Step", "StepContext",
    "StepOptions", "StepSource", "to_mermaid", "to_text",
    # Budgets
    "Budget", "BudgetPlan",
    # Handlers
    "Handler", "HandlerResult", "Message", "Output", "QuotaExhausted", "Reason", "Reject",
    "Retry",
    # Flow control and model steps
    "Breaker", "Completion", "Limit", "OpenAICompatible", "ProviderDown",
    # Joins
    "Aggregator", "JoinState", "MergePolicy", "all_must_pass", "any_pass", "first_wins",
    # Escalation
    "escalate", "review_fields", "review_output",
    # Validation loops
    "Loop", "LoopShape",
    # Streaming through the gate
    "Partial", "Verdict",
    # Fan-out: Map
    "Map", "MapShape",
    # Review inbox
    "REVIEW", "REVIEW_DECIDED", "ReviewActionFailed", "ReviewCase", "ReviewError",
    "ReviewInvalid", "ReviewKind", "ReviewNotFound", "ReviewOutcome", "ReviewRefused",
    "ReviewRunEnded",
    # Running workers
    "ConsumerSettings", "Observer", "PartitionError", "PayloadStore", "RunContext",
    "RunIndex", "RunMark", "StreamKeys", "StreamWorker", "Worker", "WorkerCrashed", "WorkerManager",
    "WorkerState", "WorkerStats", "compute_backoff", "partition_of",
    # Replay and cost
    "DLQ", "RUN_FAILED", "ReplayError", "ReplayResult", "cost_summary", "replay",
    # Runs: submitting work and following it
    "Client", "InvalidInput", "RunResult", "RunSummary", "SyncClient", "UnknownRun",
    # Settings and applications
    "AppConfig", "ConsoleSettings", "ReviewSettings", "Settings", "SettingsTable",
    "TelemetrySettings", "TransportSettings", "WorkerSettings",
    # Envelopes, errors and redaction
    "BlobMissing", "Codec", "ConfigError", "DecodeError", "DependencyCycle", "Envelope",
    "HandlerError", "MessageError", "OutputContractError", "PayloadTooLarge",
    "PrinteryError", "ServerRefused", "ServerStartError", "StepTimeout", "SupervisorError", "TransportError",
    "WorkerFailed", "redact_text", "redact_url", "register_secret",
]

#: The names of :mod:`printery.models`, imported on first use (it loads httpx).
_MODELS = frozenset({"Completion", "OpenAICompatible"})


def __getattr__(name: str) -> object:
    if name in _MODELS:
        from printery import models

        return getattr(models, name)
    raise AttributeError(f"module 'printery' has no attribute {name!r}")
