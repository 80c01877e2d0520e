"""Handlers called inline: a handler call run up to its first real await in the calling
task, in a context of its own, as a task would run it but without the cost of one.

A batch calls its handlers one after another this way. Most finish in that first step
(:class:`Done`); one that awaits for real (:class:`Suspended`) goes on in the task that
was current when it started, so ``asyncio.timeout`` and ``TaskGroup`` inside it are bound
to the task it really runs in, and context variables it sets stay in its own context.
"""

from __future__ import annotations

import asyncio
import contextvars
from collections.abc import Awaitable, Coroutine, Generator
from dataclasses import dataclass
from typing import Any, cast

from printery.runtime.handler import Handler, HandlerResult, Message

#: Stands for "still running" where a finished handler's error would be.
PENDING = Exception("handler still running")


@dataclass(slots=True)
class Done:
    """A handler call that finished during its first step: its value or its error."""

    value: HandlerResult
    error: BaseException | None


@dataclass(slots=True)
class Suspended:
    """A handler call that awaits for real: what to await for the rest of it."""

    rest: Awaitable[HandlerResult]
    context: contextvars.Context | None

    def __await__(self) -> Generator[Any, Any, HandlerResult]:
        return self.rest.__await__()


Step = Done | Suspended


def step_inline(handler: Handler, message: Message) -> Step:
    """Call the handler and run it up to its first real await, in a context of its own
    (as a task would, so context variables never leak between handlers)."""
    result = handler(message)
    if not isinstance(result, Coroutine):
        return Suspended(_await(result), None)
    context = contextvars.copy_context()
    try:
        yielded = context.run(result.send, None)
    except StopIteration as stop:
        return Done(stop.value, None)
    except Exception as exc:
        return Done(None, exc)
    return Suspended(_Resumed(result, yielded, context), context)


def start(result: Awaitable[HandlerResult]) -> asyncio.Future[HandlerResult]:
    """A handler call as a task (a coroutine is the usual case: no wrapping checks)."""
    if isinstance(result, Coroutine):
        return asyncio.get_running_loop().create_task(result)
    return asyncio.ensure_future(result)


async def raise_(exc: BaseException) -> HandlerResult:
    """An awaitable that fails with ``exc``: a finished call's error, awaited again."""
    raise exc


async def _await(result: Awaitable[HandlerResult]) -> HandlerResult:
    return await result


class _Resumed:
    """The rest of a coroutine that already ran up to its first suspension, driven from
    the awaiting task step by step, each step in the coroutine's own context: exactly
    what a task would do, without the cost of one for handlers that never suspend."""

    __slots__ = ("_context", "_coro", "_yielded")

    def __init__(
        self, coro: Coroutine[Any, Any, HandlerResult], yielded: Any, context: contextvars.Context
    ) -> None:
        self._coro = coro
        self._yielded = yielded
        self._context = context

    def __await__(self) -> Generator[Any, Any, HandlerResult]:
        coro, run, value = self._coro, self._context.run, self._yielded
        while True:
            try:
                sent = yield value
            except GeneratorExit:
                coro.close()
                raise
            except BaseException as exc:
                try:
                    value = run(coro.throw, exc)
                except StopIteration as stop:
                    return cast(HandlerResult, stop.value)
            else:
                try:
                    value = run(coro.send, sent)
                except StopIteration as stop:
                    return cast(HandlerResult, stop.value)


def describe(exc: BaseException) -> str:
    """An error as one line: its type, and its text when it has one."""
    text = str(exc)
    return f"{type(exc).__name__}: {text}" if text else type(exc).__name__
