"""The streaming tests' model and app: the OpenAI-compatible chat-completions server that
streams on loopback is the one ``examples/documents.py`` talks to
(:mod:`examples.local_model`; ``hold`` keeps its last chunk back until the test releases
it), and :data:`STREAM_APP` is an app whose Loop streams its drafts."""

from __future__ import annotations

import textwrap

from examples.local_model import StreamModel, serving

__all__ = ["STREAM_APP", "StreamModel", "serving"]

#: An app (``streamapp:pipeline``) whose Loop streams its drafts: attempt n shows
#: ``draft n: ``, then holds until the test pushes to ``<STREAM_GATES>:<run>:<n>`` (a
#: list: the wait is a BLPOP, no sleep), then shows ``the end``; attempt 2 passes. Its
#: step ``idle`` (of a type no one writes) lets a process serve HTTP without the loop
#: (``--worker idle``): one that can be killed without touching the run.
STREAM_APP = textwrap.dedent(
    """
    import os

    import redis.asyncio as aioredis

    from printery import Loop, Message, Pipeline, Reason

    GATES = os.environ["STREAM_GATES"]
    pipeline = Pipeline("drafts", ingress=["request", "never"], outcomes=["answer"])
    _gates = []


    async def work(message: Message):
        if not _gates:
            _gates.append(aioredis.Redis.from_url(os.environ["STREAM_REDIS"],
                                                  decode_responses=True))
        yield f"draft {message.attempt}: "
        gate = f"{GATES}:{message.correlation_id}:{message.attempt}"
        if await _gates[0].blpop([gate], timeout=60) is None:
            raise RuntimeError("the test never opened " + gate)
        yield "the end"


    def validate(message: Message) -> list:
        if message.data.startswith("draft 2"):
            return []
        return [Reason("not_yet", "", f"attempt {message.attempt} is a first draft")]


    pipeline.add(Loop("draft", consumes="request", produces="answer", work=work,
                      validate=validate, max_attempts=3))


    @pipeline.step("idle", consumes=["never"], produces=["never:done"])
    async def idle(message: Message) -> None:
        return None
    """
)
