"""printery.ext: the extension surface, for code that builds workers by hand or plugs
into the ones a pipeline builds (docs/reference.md, "Python API", "The extension
surface").

A pipeline author or an application needs none of it: ``printery`` is their face. What
is here is for the next layer out: a ``StreamWorker`` made without a pipeline, a step's
companions and what they get (``StepContext``, ``Emit``), an ``Observer`` of the hot
path, the codec (``Codec``, ``Envelope``), payloads by reference (``PayloadStore``), the
run index a commit keeps (``RunIndex``, ``RunMark``), the ``Worker`` protocol the
supervisor runs, and the pieces of a pipeline's definition that such code reads
(``StepSource``, ``LoopShape``, ``BudgetPlan``, the renderings, ``review_fields``,
``partition_of``, ``compute_backoff``). These names are stable as ``printery``'s are;
modules not named here stay internal.

Like ``printery``, each name is imported on first use (PEP 562).
"""

import typing

if typing.TYPE_CHECKING:
    from printery.base.backoff import compute_backoff
    from printery.base.worker import RunContext, Worker, WorkerState, WorkerStats
    from printery.pipeline.render import to_mermaid, to_text
    from printery.pipeline.step import BoundStep, LoopShape, MapShape, StepSource
    from printery.rules.budgets import BudgetPlan
    from printery.runtime.observe import Observer
    from printery.runtime.payloads import PayloadStore
    from printery.runtime.run_index import RunIndex, RunMark
    from printery.runtime.step_context import Companion, Emit, StepContext
    from printery.runtime.stream_worker import StreamWorker
    from printery.wire.envelope import Codec, Envelope
    from printery.wire.fields import review_fields
    from printery.wire.keys import partition_of

__all__ = [  # noqa: RUF022 - grouped as docs/reference.md's section
    # workers built by hand and what the supervisor runs
    "RunContext", "StreamWorker", "Worker", "WorkerState", "WorkerStats",
    # what a step's own code gets of its worker: companions and their context
    "Companion", "Emit", "StepContext",
    # plugged into a worker: observers, payloads by reference, the run index
    "Observer", "PayloadStore", "RunIndex", "RunMark",
    # the wire: codec, envelopes, partitions, review entries, backoff
    "Codec", "Envelope", "compute_backoff", "partition_of", "review_fields",
    # a pipeline's definition as such code reads it
    "BudgetPlan", "BoundStep", "LoopShape", "MapShape", "StepSource", "to_mermaid", "to_text",
]

#: Where each name lives: module -> names.
_MODULES = {
    "printery.base.backoff": ("compute_backoff",),
    "printery.rules.budgets": ("BudgetPlan",),
    "printery.wire.envelope": ("Codec", "Envelope"),
    "printery.wire.fields": ("review_fields",),
    "printery.wire.keys": ("partition_of",),
    "printery.pipeline.render": ("to_mermaid", "to_text"),
    "printery.pipeline.step": ("BoundStep", "LoopShape", "MapShape", "StepSource"),
    "printery.runtime.observe": ("Observer",),
    "printery.runtime.payloads": ("PayloadStore",),
    "printery.runtime.run_index": ("RunIndex", "RunMark"),
    "printery.runtime.step_context": ("Companion", "Emit", "StepContext"),
    "printery.runtime.stream_worker": ("StreamWorker",),
    "printery.base.worker": ("RunContext", "Worker", "WorkerState", "WorkerStats"),
}
_WHERE = {name: module for module, names in _MODULES.items() for name in names}

if not typing.TYPE_CHECKING:  # type checkers see the imports above instead

    def __getattr__(name: str) -> object:
        """A name's first use imports its module (and keeps the name here)."""
        import importlib

        module = _WHERE.get(name)
        if module is None:
            raise AttributeError(f"module 'printery.ext' has no attribute {name!r}")
        value = getattr(importlib.import_module(module), name)
        globals()[name] = value
        return value

    def __dir__() -> list[str]:
        return sorted({*globals(), *__all__})
