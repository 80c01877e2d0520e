"""The public API is pinned, face by face: ``printery`` for pipeline authors and for
applications, ``printery.ext`` for extensions (the layering: test_layering.py)."""

from __future__ import annotations

import inspect
import re
import subprocess
import sys
import typing
from collections.abc import Iterator
from typing import Any

import pytest

import printery
import printery.base.errors
import printery.ext

#: The face of pipeline authors (``printery.__all__``): what a pipeline, its steps and their
#: handlers are made of, and what a handler or a review hook may raise.
AUTHOR = {
    "Pipeline", "PipelineError", "Step", "StepOptions", "Budget", "Middleware",
    "Handler", "HandlerError", "HandlerResult", "Message", "Output", "OutputContractError",
    "QuotaExhausted", "Reason", "Reject", "Retry", "StepTimeout", "WorkerCrashed",
    "Breaker", "Completion", "Limit", "OpenAICompatible", "ProviderDown", "register_secret",
    "Aggregator", "JoinState", "MergePolicy", "all_must_pass", "any_pass", "first_wins",
    "Loop", "Map", "escalate", "review_output",
    "ReviewActionFailed", "ReviewCase", "ReviewError", "ReviewInvalid", "ReviewKind",
    "ReviewNotFound", "ReviewOutcome", "ReviewRefused", "ReviewRunEnded",
    "DLQ", "REVIEW", "REVIEW_DECIDED", "RUN_CANCELLED", "RUN_FAILED",
}

#: The face of applications (``printery.__all__``): runs, replay and cost, settings, a
#: pipeline's workers run in the application's own process, the errors of all that.
APPLICATION = {
    "Client", "InvalidInput", "Partial", "RunResult", "RunSummary", "SyncClient",
    "UnknownRun", "Verdict",
    "ReplayError", "ReplayResult", "cost_summary", "replay",
    "ConsumerSettings", "PartitionError", "StreamKeys", "WorkerManager",
    "AppConfig", "ConsoleSettings", "ReviewSettings", "Settings", "SettingsTable",
    "TelemetrySettings", "TransportSettings", "WorkerSettings",
    "BlobMissing", "ConfigError", "DecodeError", "DependencyCycle", "MessageError",
    "PayloadTooLarge", "PrinteryError", "ServerRefused", "ServerStartError",
    "SupervisorError", "TransportError", "WorkerFailed", "redact_text", "redact_url",
}

#: The extension surface (``printery.ext.__all__``): workers built by hand, companions,
#: observers, codecs, payloads, the run index, the pieces of a definition such code reads.
EXTENSION = {
    "RunContext", "StreamWorker", "Worker", "WorkerState", "WorkerStats",
    "Companion", "Emit", "StepContext",
    "Observer", "PayloadStore", "RunIndex", "RunMark",
    "Codec", "Envelope", "compute_backoff", "partition_of", "review_fields",
    "BudgetPlan", "BoundStep", "LoopShape", "MapShape", "StepSource", "to_mermaid", "to_text",
}

#: The Python names the reference pins for runs, reviews, AI-worker patterns, failure
#: semantics, fan-out, run control and the bad-day rounds (docs/reference.md, Runs; Review
#: inbox; Validation loops; Budgets; Flow control and model steps; Fan-out; Streaming
#: through the gate): each is on a face of ``printery`` itself.
PINNED = {
    "Client", "SyncClient", "InvalidInput", "Reason", "RunResult", "UnknownRun", "PrinteryError",
    "escalate", "Pipeline", "Loop", "Budget", "Limit", "OpenAICompatible", "WorkerCrashed",
    "Map", "Partial", "QuotaExhausted", "Output", "Retry", "Breaker", "ProviderDown", "Step",
    "Aggregator",
}


def test_each_name_is_on_exactly_one_face() -> None:
    assert AUTHOR.isdisjoint(APPLICATION)
    assert (AUTHOR | APPLICATION).isdisjoint(EXTENSION)
    assert sorted(printery.__all__) == sorted(AUTHOR | APPLICATION)
    assert sorted(printery.ext.__all__) == sorted(EXTENSION)
    assert PINNED <= AUTHOR | APPLICATION


def test_every_name_resolves_from_its_face() -> None:
    for name in printery.__all__:
        assert getattr(printery, name) is not None
    for name in printery.ext.__all__:
        assert getattr(printery.ext, name) is not None
        # code written before the namespace still finds it, outside ``__all__``
        assert getattr(printery, name) is getattr(printery.ext, name)
    star: dict[str, object] = {}
    exec("from printery import *", star)  # what a star import gives
    assert set(star) - {"__builtins__"} == AUTHOR | APPLICATION


def test_internals_are_not_exported() -> None:
    """Once every name is loaded, the package holds no public name but its faces' (and
    its submodules, which are internal but for ``printery.ext`` and ``printery.pipeline.models``)."""
    for name in [*printery.__all__, *printery.ext.__all__]:
        getattr(printery, name)
    public = {name for name, value in vars(printery).items()
              if not name.startswith("_") and not inspect.ismodule(value)}
    assert public <= AUTHOR | APPLICATION | EXTENSION
    for internal in ("Runs", "NullObserver", "StreamOverview", "approve_by_resuming"):
        with pytest.raises(AttributeError):
            getattr(printery, internal)
        with pytest.raises(AttributeError):
            getattr(printery.ext, internal)


def faces() -> dict[str, object]:
    """Every name of a face with what it names."""
    return {**{name: getattr(printery.ext, name) for name in printery.ext.__all__},
            **{name: getattr(printery, name) for name in printery.__all__}}


def test_importing_printery_imports_no_module_of_it() -> None:
    """A name is imported on its first use, so ``import printery`` (and the command line
    that starts with it) loads no runtime it does not use."""
    code = ("import sys, printery, printery.ext\n"
            "print(sorted(m for m in sys.modules if m.startswith('printery') or m == 'redis'))")
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True,
                          timeout=60, check=True)
    assert done.stdout.split() == ["['printery',", "'printery.ext']"]


def test_every_exported_error_is_under_the_root_and_in_its_tree() -> None:
    """One ``except PrinteryError`` catches whatever printery raises, and errors.py's tree
    names every error a user can import."""
    errors = [obj for obj in faces().values()
              if isinstance(obj, type) and issubclass(obj, BaseException)]
    assert {e.__name__ for e in errors} <= set(printery.__all__)
    assert [e.__name__ for e in errors if not issubclass(e, printery.PrinteryError)] == []
    tree = printery.base.errors.__doc__ or ""
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
    """A user can name every printery type an exported name takes or returns: from its
    face, or from the extension namespace."""
    named = faces()
    public = {id(value) for value in named.values()}
    leaked = set()
    for name, value in named.items():
        for where, obj in _signatures(value):
            if not (isinstance(obj, type) or inspect.isfunction(obj)):
                continue
            try:
                hints = typing.get_type_hints(obj, localns=named)
            except (NameError, TypeError):
                continue  # a base class's method of another library (pydantic's)
            for hint in hints.values():
                for found in _printery_types(hint):
                    if id(found) not in public and not found.__name__.startswith("_"):
                        leaked.add(f"{name}{where}: {found.__module__}.{found.__name__}")
    assert sorted(leaked) == []
