"""The public API is pinned (the layering: test_layering.py)."""

from __future__ import annotations

import inspect
import re
import typing
from collections.abc import Iterator
from typing import Any

import printery
import printery.errors

EXPECTED = {
    "Aggregator", "BlobMissing", "Codec", "ConfigError", "ConsumerSettings", "DecodeError",
    "DependencyCycle", "Envelope", "Handler", "HandlerError", "HandlerResult", "JoinState", "Limit",
    "MergePolicy", "Message", "MessageError", "Output", "PayloadTooLarge", "Pipeline",
    "PipelineError", "PrinteryError", "Reason", "Reject", "Retry", "RunContext", "Settings",
    "Step", "StreamWorker", "SupervisorError", "ServerRefused", "TransportError", "Worker", "WorkerFailed",
    "WorkerManager", "WorkerState", "WorkerStats", "all_must_pass", "any_pass",
    "compute_backoff", "escalate", "first_wins", "review_output", "to_mermaid", "to_text",
    # replay and cost accounting for any pipeline (docs/reference.md, Replay and cost)
    "ReplayError", "ReplayResult", "StreamKeys", "cost_summary", "replay",
    # the application hook of the settings, redaction, the framework's own streams
    "AppConfig", "SettingsTable", "redact_text", "redact_url", "DLQ", "REVIEW", "REVIEW_DECIDED",
    "review_fields",
    # runs: submitting work and following it (docs/reference.md, Runs)
    "Client", "SyncClient", "RunResult", "RunSummary", "InvalidInput", "UnknownRun",
    # what followers see while a step works (docs/reference.md, Streaming through the gate)
    "Partial", "Verdict",
    # the review inbox of any pipeline (docs/reference.md, Review inbox)
    "ReviewCase", "ReviewKind", "ReviewOutcome", "ReviewError", "ReviewNotFound",
    "ReviewRefused", "ReviewInvalid", "ReviewActionFailed", "ReviewRunEnded",
    # AI-worker patterns (docs/reference.md, Validation loops; Budgets; Flow control)
    "Budget",
    "Loop",
    # partitioned streams (docs/reference.md, Partitions)
    "PartitionError", "partition_of",
    # failure semantics (docs/reference.md, Failures)
    "RUN_FAILED", "WorkerCrashed",
    # quota-aware fallbacks (reference: flow control and model steps)
    "QuotaExhausted",
    # circuit breakers of model steps (reference: flow control and model steps)
    "Breaker", "ProviderDown",
    # fan-out over run-time data (reference: fan-out)
    "Map", "MapShape",
    # steps composed one way: what a step is in one worker, its typed options
    "BoundStep", "StepOptions",
    # the types of the exported signatures (docs/reference.md, Pipelines and steps; Budgets;
    # Validation loops; Running workers; Flow control and model steps)
    "BudgetPlan", "Companion", "Emit", "LoopShape", "Observer", "PayloadStore", "RunIndex",
    "RunMark", "StepContext", "StepSource", "Completion", "OpenAICompatible",
    "ConsoleSettings", "ReviewSettings", "TelemetrySettings", "TransportSettings",
    "WorkerSettings",
    # errors and redaction (docs/reference.md, Envelopes, errors and redaction)
    "OutputContractError", "ServerStartError", "StepTimeout", "register_secret",
}


def test_exported_members() -> None:
    assert set(printery.__all__) == EXPECTED
    missing = [name for name in printery.__all__ if not hasattr(printery, name)]
    assert missing == [], f"in printery.__all__ but not importable from printery: {missing}"


def test_every_exported_error_is_under_the_root_and_in_its_tree() -> None:
    """One ``except PrinteryError`` catches whatever printery raises, and errors.py's tree
    names every error a user can import."""
    errors = [obj for obj in vars(printery).values()
              if isinstance(obj, type) and issubclass(obj, BaseException)]
    assert {e.__name__ for e in errors} <= set(printery.__all__)
    assert [e.__name__ for e in errors if not issubclass(e, printery.PrinteryError)] == []
    tree = printery.errors.__doc__ or ""
    assert [e.__name__ for e in errors
            if not re.search(rf"(^\s*|-- ){e.__name__}\b", tree, re.M)] == []


def _printery_types(hint: object) -> Iterator[type]:
    """The printery classes a type hint names, through unions and generics."""
    if isinstance(hint, type) and hint.__module__.startswith("printery"):
        yield hint
    for arg in typing.get_args(hint):
        yield from _printery_types(arg)
    origin = typing.get_origin(hint)
    if origin is not None:
        yield from _printery_types(origin)


def _signatures(obj: object) -> Iterator[tuple[str, Any]]:
    """``(where, callable or class)`` of every public signature of an exported name:
    itself, and for a class its ``__init__``, fields, methods and properties."""
    yield "", obj
    if not isinstance(obj, type):
        return
    yield ".__init__", obj.__init__
    for name, member in vars(obj).items():
        if name.startswith("_"):
            continue
        if isinstance(member, property) and member.fget is not None:
            yield f".{name}", member.fget
        elif callable(member) and getattr(member, "__module__", "").startswith("printery"):
            yield f".{name}", member


def test_every_type_in_an_exported_signature_is_exported() -> None:
    """A user can name every printery type an exported name takes or returns."""
    public = {id(getattr(printery, name)) for name in printery.__all__}
    leaked = set()
    for name in printery.__all__:
        for where, obj in _signatures(getattr(printery, name)):
            if not (isinstance(obj, type) or inspect.isfunction(obj)):
                continue
            try:
                hints = typing.get_type_hints(obj, localns=vars(printery))
            except (NameError, TypeError):
                continue  # a base class's method of another library (pydantic's)
            for hint in hints.values():
                for found in _printery_types(hint):
                    if id(found) not in public and not found.__name__.startswith("_"):
                        leaked.add(f"{name}{where}: {found.__module__}.{found.__name__}")
    assert sorted(leaked) == []
