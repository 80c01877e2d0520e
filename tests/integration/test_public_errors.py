"""Every error printery raises is a ``PrinteryError``; a connection failure that reaches a
caller of the public API is a ``TransportError`` with the client's error as its cause,
whatever the client library raised."""

from __future__ import annotations

import pytest

from printery import (
    Output,
    Pipeline,
    PrinteryError,
    StreamKeys,
    TransportError,
    cost_summary,
    replay,
)
from printery.base.errors import OutputContractError, ReplayError, WorkerCrashed
from printery.servers.process import free_port
from printery.transport.connection import connect


def _pipeline() -> Pipeline:
    pipeline = Pipeline("p", ingress=["in"])

    @pipeline.step("s", consumes=["in"], produces=["out"])
    async def step(message: object) -> Output:
        return Output("out", {})

    return pipeline


async def test_a_lost_server_reaches_callers_as_transport_error() -> None:
    client = connect(f"redis://127.0.0.1:{free_port()}/0")  # nothing listens there
    keys = StreamKeys("nowhere")
    try:
        with pytest.raises(TransportError) as cost_error:
            await cost_summary(client, keys, _pipeline())
        with pytest.raises(TransportError) as replay_error:
            await replay(client, keys, _pipeline(), "run-1")
    finally:
        await client.aclose()
    for caught in (cost_error.value, replay_error.value):
        assert isinstance(caught, PrinteryError)
        assert caught.__cause__ is not None and "Connect" in type(caught.__cause__).__name__


def test_the_error_tree_has_no_holes() -> None:
    for error in (ReplayError, OutputContractError, WorkerCrashed, TransportError):
        assert issubclass(error, PrinteryError), error
