"""``escalate`` at its last attempt (docs/reference.md, Failures): what it escalates and
what it raises through (``Reject`` and ``WorkerCrashed`` are deliberate), on the wrapped
handler alone."""

from __future__ import annotations

from typing import Any

import pytest

from printery import Message, Output, Reject, WorkerCrashed, escalate
from printery.wire.envelope import Codec


def _message(deliveries: int) -> Message:
    envelope = Codec().new("task", {}, producer="test", correlation_id="run-1")
    return Message(envelope=envelope, stream="p:task", entry_id="1-0", deliveries=deliveries,
                   worker="work", consumer="c", fields={})


async def _fallback(message: Message) -> Output:
    return Output("result", {"via": "fallback"})


@pytest.mark.parametrize("error", [WorkerCrashed("client beyond repair"), Reject("bad", "no")])
async def test_deliberate_errors_are_raised_through_not_escalated(error: Exception) -> None:
    async def handler(message: Message) -> Any:
        raise error

    wrapped = escalate(handler, attempts=2, fallback=_fallback)
    with pytest.raises(type(error)):
        await wrapped(_message(2))

    async def failing(message: Message) -> Any:
        raise RuntimeError("down")

    async def deliberate_fallback(message: Message) -> Any:
        raise error

    wrapped = escalate(failing, attempts=1, fallback=deliberate_fallback)
    with pytest.raises(type(error)):
        await wrapped(_message(1))


async def test_a_system_exit_at_the_last_attempt_escalates_like_any_failure() -> None:
    async def handler(message: Message) -> Any:
        raise SystemExit(3)

    wrapped = escalate(handler, attempts=2, fallback=_fallback)
    with pytest.raises(SystemExit):
        await wrapped(_message(1))  # retried first, as any failure
    assert await wrapped(_message(2)) == Output("result", {"via": "fallback"})


def _logged(handler: Any) -> Any:
    """A user's own decorator, written without ``functools.wraps``."""

    async def wrapper(message: Message) -> Any:
        return await handler(message)

    return wrapper


def test_a_users_decorator_without_wraps_keeps_what_escalate_declares() -> None:
    """The graph check (an escalation to review declares ``review``) and the fallback a
    ``Limit(max_wait=)`` runs were skipped without a word under such a decorator."""
    from printery import Limit, Pipeline, PipelineError

    async def model(message: Message) -> Output:
        return Output("result", {})

    escalated = escalate(model, attempts=2, review_kind="model_failed", on_approve="result")
    p = Pipeline("wrapped", ingress=["task"])
    with pytest.raises(PipelineError, match="escalates to review 'model_failed'"):
        p.step("model", consumes=["task"], produces=["result"])(_logged(_logged(escalated)))
        p.validate()
    q = Pipeline("fallback", ingress=["task"])
    q.step("model", consumes=["task"], produces=["result"],
           limits=[Limit("llm", concurrency=1, max_wait=1.0)])(
        _logged(escalate(model, attempts=2, fallback=_fallback)))
    assert q.steps["model"].falls_back is not None
