"""A user's middleware: around the call, and outputs committed with the call's."""

import dataclasses
from typing import Any

import pytest
from tests.support.policy_fakes import entries

from printery.base.errors import OutputContractError
from printery.policies.chain import Chain
from printery.policies.middleware import Middleware, UserMiddleware
from printery.runtime.handler import Output


class Redact(Middleware):
    async def call(self, message: Any, call_next: Any) -> Any:
        envelope = dataclasses.replace(message.envelope, data={"text": "[redacted]"})
        return await call_next(dataclasses.replace(message, envelope=envelope))


class Audit(Middleware):
    def commit(self, message: Any, outputs: list[Output]) -> list[Output]:
        return [Output("audit", {"outputs": [out.type for out in outputs]})]


async def handler(message: Any) -> Output:
    return Output("answer", message.data)


async def test_the_handler_sees_what_the_middleware_passes_and_the_audit_is_added() -> None:
    (delivery, message), = entries(1, data={"text": "my card is 4242"})
    call = Chain([UserMiddleware(Audit()), UserMiddleware(Redact())], handler).wrapped
    assert call is not None
    result = await call(delivery, message)
    assert [(out.type, out.data) for out in result] == [
        ("answer", {"text": "[redacted]"}), ("audit", {"outputs": ["answer"]})]


async def test_middleware_defining_nothing_changes_nothing() -> None:
    (delivery, message), = entries(1)
    call = Chain([UserMiddleware(Middleware())], handler).wrapped
    assert call is not None
    result = await call(delivery, message)
    assert isinstance(result, Output) and result.data == {"n": 0}


async def test_a_commit_hook_returning_no_outputs_fails_the_call() -> None:
    class Wrong(Middleware):
        def commit(self, message: Any, outputs: list[Output]) -> Any:
            return ["not an output"]

    (delivery, message), = entries(1)
    call = Chain([UserMiddleware(Wrong())], handler).wrapped
    assert call is not None
    with pytest.raises(OutputContractError):
        await call(delivery, message)


def test_only_middleware_instances_are_taken() -> None:
    with pytest.raises(TypeError, match="Middleware instances"):
        UserMiddleware(Redact)  # type: ignore[arg-type]
