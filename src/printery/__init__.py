"""printery: worker orchestration over Redis Streams.

This is the face for the two audiences that use printery as it is (docs/reference.md,
"Python API"): pipeline authors (steps, handlers, loops, joins, budgets, limits, model
steps, review kinds) and applications (submitting and following runs, replay and cost,
settings, running a pipeline's workers in their own process). ``__all__`` is those two
and nothing else. The extension surface, for code that builds workers by hand or plugs
into them (stream workers, companions, observers, codecs, run indexes, payload stores),
is :mod:`printery.ext`; its names still resolve here, outside ``__all__``, for code
written before it had a namespace of its own. Every other module is internal.

Every name is imported on first use (PEP 562), not with the package: a ``printery``
command that needs no runtime does not pay for loading one.
"""

import typing

if typing.TYPE_CHECKING:
    from printery.base.errors import (
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
    from printery.base.reason import Reason
    from printery.observe.redact import redact_text, redact_url, register_secret
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
    from printery.pipeline.models import Completion, OpenAICompatible
    from printery.pipeline.review_kinds import ReviewCase, ReviewKind, ReviewOutcome
    from printery.pipeline.step import Step, StepOptions
    from printery.policies.middleware import Middleware
    from printery.rules.budgets import Budget
    from printery.rules.limits import Limit
    from printery.runs.client import Client, SyncClient
    from printery.runs.cost import cost_summary
    from printery.runs.listing import RunSummary
    from printery.runs.partials import Partial, Verdict
    from printery.runs.reader import RunResult
    from printery.runs.replay import ReplayError, ReplayResult, replay
    from printery.runtime.breaker import Breaker
    from printery.runtime.consumer import ConsumerSettings
    from printery.runtime.handler import Handler, HandlerResult, Message, Output
    from printery.settings.config import AppConfig, Settings, SettingsTable
    from printery.settings.config_tables import (
        ConsoleSettings,
        ReviewSettings,
        TelemetrySettings,
        TransportSettings,
        WorkerSettings,
    )
    from printery.supervisor.manager import WorkerManager
    from printery.wire.keys import DLQ, REVIEW, REVIEW_DECIDED, RUN_CANCELLED, RUN_FAILED, StreamKeys

__all__ = [  # noqa: RUF022 - two faces, grouped as docs/reference.md's sections
    # For pipeline authors: what a pipeline, its steps and their handlers are made of,
    # and what a handler or a review hook may raise.
    # - pipelines and steps; budgets
    "Pipeline", "PipelineError", "Step", "StepOptions", "Budget", "Middleware",
    # - handlers
    "Handler", "HandlerError", "HandlerResult", "Message", "Output", "OutputContractError",
    "QuotaExhausted", "Reason", "Reject", "Retry", "StepTimeout", "WorkerCrashed",
    # - flow control and model steps
    "Breaker", "Completion", "Limit", "OpenAICompatible", "ProviderDown", "register_secret",
    # - joins
    "Aggregator", "JoinState", "MergePolicy", "all_must_pass", "any_pass", "first_wins",
    # - escalation, validation loops, fan-out
    "Loop", "Map", "escalate", "review_output",
    # - review kinds, their hooks and what those raise
    "ReviewActionFailed", "ReviewCase", "ReviewError", "ReviewInvalid", "ReviewKind",
    "ReviewNotFound", "ReviewOutcome", "ReviewRefused", "ReviewRunEnded",
    # - the framework's own event types, which a step may consume
    "DLQ", "REVIEW", "REVIEW_DECIDED", "RUN_CANCELLED", "RUN_FAILED",
    # For applications: submitting and following runs, replay and cost, settings,
    # running a pipeline's workers in their own process, and the errors of all that.
    # - runs
    "Client", "InvalidInput", "Partial", "RunResult", "RunSummary", "SyncClient",
    "UnknownRun", "Verdict",
    # - replay and cost
    "ReplayError", "ReplayResult", "cost_summary", "replay",
    # - running a pipeline's workers (Pipeline.build_workers)
    "ConsumerSettings", "PartitionError", "StreamKeys", "WorkerManager",
    # - settings and applications
    "AppConfig", "ConsoleSettings", "ReviewSettings", "Settings", "SettingsTable",
    "TelemetrySettings", "TransportSettings", "WorkerSettings",
    # - errors and redaction
    "BlobMissing", "ConfigError", "DecodeError", "DependencyCycle", "MessageError",
    "PayloadTooLarge", "PrinteryError", "ServerRefused", "ServerStartError",
    "SupervisorError", "TransportError", "WorkerFailed", "redact_text", "redact_url",
]

#: Where each name of ``__all__`` lives: module -> names.
_MODULES = {
    "printery.rules.budgets": ("Budget",),
    "printery.settings.config": ("AppConfig", "Settings", "SettingsTable"),
    "printery.settings.config_tables": ("ConsoleSettings", "ReviewSettings", "TelemetrySettings",
                               "TransportSettings", "WorkerSettings"),
    "printery.base.errors": (
        "BlobMissing", "ConfigError", "DecodeError", "DependencyCycle", "HandlerError",
        "InvalidInput", "MessageError", "OutputContractError", "PartitionError",
        "PayloadTooLarge", "PipelineError", "PrinteryError", "ProviderDown", "QuotaExhausted",
        "Reject", "Retry", "ReviewActionFailed", "ReviewError", "ReviewInvalid",
        "ReviewNotFound", "ReviewRefused", "ReviewRunEnded", "ServerRefused",
        "ServerStartError", "StepTimeout", "SupervisorError", "TransportError", "UnknownRun",
        "WorkerCrashed", "WorkerFailed"),
    "printery.wire.keys": ("DLQ", "REVIEW", "REVIEW_DECIDED", "RUN_CANCELLED", "RUN_FAILED", "StreamKeys"),
    "printery.rules.limits": ("Limit",),
    "printery.pipeline.models": ("Completion", "OpenAICompatible"),
    "printery.pipeline.aggregate": ("Aggregator", "JoinState", "MergePolicy", "all_must_pass",
                                    "any_pass", "first_wins"),
    "printery.pipeline.dag": ("Pipeline",),
    "printery.pipeline.escalation": ("escalate", "review_output"),
    "printery.pipeline.fanout": ("Map",),
    "printery.pipeline.loop": ("Loop",),
    "printery.pipeline.review_kinds": ("ReviewCase", "ReviewKind", "ReviewOutcome"),
    "printery.pipeline.step": ("Step", "StepOptions"),
    "printery.policies.middleware": ("Middleware",),
    "printery.base.reason": ("Reason",),
    "printery.observe.redact": ("redact_text", "redact_url", "register_secret"),
    "printery.runs.client": ("Client", "SyncClient"),
    "printery.runs.cost": ("cost_summary",),
    "printery.runs.listing": ("RunSummary",),
    "printery.runs.partials": ("Partial", "Verdict"),
    "printery.runs.reader": ("RunResult",),
    "printery.runs.replay": ("ReplayError", "ReplayResult", "replay"),
    "printery.runtime.breaker": ("Breaker",),
    "printery.runtime.consumer": ("ConsumerSettings",),
    "printery.runtime.handler": ("Handler", "HandlerResult", "Message", "Output"),
    "printery.supervisor.manager": ("WorkerManager",),
}
_WHERE = {name: module for module, names in _MODULES.items() for name in names}

if not typing.TYPE_CHECKING:  # type checkers see the imports above instead

    def __getattr__(name: str) -> object:
        """A name's first use imports its module (and keeps the name here)."""
        import importlib

        module = _WHERE.get(name)
        if module is not None:
            value = getattr(importlib.import_module(module), name)
        else:
            ext = importlib.import_module("printery.ext")
            if name.startswith("_") or name not in ext.__all__:
                raise AttributeError(f"module 'printery' has no attribute {name!r}")
            value = getattr(ext, name)
        globals()[name] = value
        return value

    def __dir__() -> list[str]:
        return sorted({*globals(), *__all__})
