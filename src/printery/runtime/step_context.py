"""What a step's own code may use of the worker that runs it.

A companion (a loop beside the consumers, such as an aggregator's deadline sweeper) and
a step that keeps state of its own (an aggregator's joins) need the step's keys, its
settings and the server, and a way to write outputs no input entry caused; they need
nothing else of the :class:`~printery.runtime.stream_worker.StreamWorker`, so they get
this instead: the worker's loops, lanes and consumers stay its own.
"""

from __future__ import annotations

from collections.abc import Awaitable, Callable, Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING, Protocol

from printery.runtime.consumer import ConsumerSettings
from printery.runtime.handler import Output
from printery.transport.connection import Redis
from printery.wire.envelope import Codec
from printery.wire.keys import StreamKeys

if TYPE_CHECKING:
    from printery.runtime.run_index import RunIndex

__all__ = ["Companion", "Emit", "StepContext"]


class Emit(Protocol):
    """Writes ``outputs`` of the run ``correlation_id`` atomically, with their ``once``
    guards; how many were written. Only while the worker runs; raises
    :class:`~printery.TransportError` when the server cannot be reached."""

    def __call__(self, outputs: Sequence[Output], *, correlation_id: str) -> Awaitable[int]: ...


@dataclass(frozen=True, slots=True)
class StepContext:
    """The step ``name``'s keys (every partition), its consumer settings, its codec, the
    server (``store``), the run index its commits keep (None: none) and :class:`Emit`."""

    name: str
    keys: StreamKeys
    settings: ConsumerSettings
    codec: Codec
    store: Redis
    index: RunIndex | None
    emit: Emit


#: Runs beside a step's consumers for as long as its worker runs.
Companion = Callable[[StepContext], Awaitable[None]]
