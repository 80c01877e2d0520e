"""Bad input, fuzzed (issue 6 item 5): hypothesis-generated stream entries (random and
missing fields, binary bytes, deep or huge JSON, wrong types) never crash a worker; each
one ends in ``dlq`` with a reason, or is processed.

One relay StreamWorker runs for the whole module in a thread of its own (its own event
loop), so the hypothesis examples are plain synchronous code against the real server.
"""

from __future__ import annotations

import asyncio
import json
import threading
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from typing import Any

import pytest
import redis
import redis.asyncio as aioredis
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from printery import ConsumerSettings, StreamWorker
from printery.base import _json
from printery.base.errors import Reject
from printery.runtime.handler import Message, Output
from printery.servers.process import ServerProcess
from printery.supervisor.manager import WorkerManager
from printery.testing import unique_prefix, wait_for_sync
from printery.transport.connection import connect
from printery.wire.envelope import Codec
from printery.wire.keys import StreamKeys

PAYLOAD_LIMIT = 4096
#: (``invalid_run_id``: a correlation field with a control character, or over 256 characters.)
REASONS = {"undecodable", "payload_too_large", "not_an_object", "blob_missing", "invalid_run_id"}


@dataclass
class Relay:
    keys: StreamKeys
    worker: StreamWorker | None = None
    thread: threading.Thread | None = None
    loop: asyncio.AbstractEventLoop | None = None
    stop: asyncio.Event | None = None
    manager: WorkerManager | None = None
    crashed: list[BaseException] = field(default_factory=list)
    ready: threading.Event = field(default_factory=threading.Event)


def _run_relay(url: str, relay: Relay) -> None:
    async def handler(msg: Message) -> Output:
        if not isinstance(msg.data, dict):
            raise Reject("not_an_object", f"data is a {type(msg.data).__name__}")
        return Output("out", {"ok": True}, extra={"source_id": msg.entry_id})

    async def main() -> None:
        client = connect(url, block_ms=100)
        if client.connection_pool.connection_kwargs.get("encoding_errors") != "surrogateescape":
            # Until connect() sets it: non-UTF-8 bytes in any field must not make the
            # reply undecodable (that poisons XREADGROUP and XAUTOCLAIM for good).
            client = aioredis.Redis.from_url(
                url, decode_responses=True, encoding_errors="surrogateescape",
                socket_timeout=10.1, socket_connect_timeout=5,
            )
        relay.worker = StreamWorker(
            "fuzz", client=client, keys=relay.keys, consumes=["in"], handler=handler,
            codec=Codec(payload_limit=PAYLOAD_LIMIT),
            settings=ConsumerSettings(block_ms=100, visibility_timeout=5, retry_backoff_ms=20),
        )
        manager = relay.manager = WorkerManager(drain_timeout=2)
        manager.register(relay.worker)
        relay.loop = asyncio.get_running_loop()
        relay.stop = asyncio.Event()
        await manager.start_all()
        relay.ready.set()
        await relay.stop.wait()
        await manager.stop_all()
        await client.aclose()

    try:
        asyncio.run(main())
    except BaseException as exc:  # reported by the test, never swallowed
        relay.crashed.append(exc)
        relay.ready.set()


@pytest.fixture(scope="module")
def relay(server: ServerProcess) -> Iterator[Relay]:
    state = Relay(keys=StreamKeys(unique_prefix("fuzz")))
    state.thread = threading.Thread(target=_run_relay, args=(server.url, state), daemon=True)
    state.thread.start()
    assert state.ready.wait(15) and not state.crashed, state.crashed
    yield state
    if state.loop and state.stop and not state.crashed:
        state.loop.call_soon_threadsafe(state.stop.set)
    state.thread.join(15)
    assert not state.thread.is_alive()


# -- strategies ------------------------------------------------------------------------

FIELD_NAMES = st.one_of(
    st.sampled_from(
        ["data", "type", "event_id", "correlation_id", "idempotency_key", "attempt",
         "produced_at", "producer", "$ref"]
    ),
    st.text(min_size=1, max_size=12),
    st.binary(min_size=1, max_size=12),
)
JSON = st.recursive(
    st.none() | st.booleans() | st.integers() | st.floats(allow_nan=False) | st.text(max_size=20),
    lambda children: st.lists(children, max_size=4)
    | st.dictionaries(st.text(max_size=8), children, max_size=4),
    max_leaves=20,
)
DEEP = st.integers(min_value=100, max_value=5000).map(lambda d: "[" * d + "]" * d)
HUGE = st.integers(min_value=PAYLOAD_LIMIT + 1, max_value=4 * PAYLOAD_LIMIT).map(
    lambda n: _json.dumps({"blob": "x" * n})
)
REF = st.text(max_size=20).map(lambda d: _json.dumps({"$ref": f"blob:{d}", "size": 3}))
VALUES = st.one_of(
    st.binary(max_size=64),
    st.text(max_size=64),
    st.integers().map(str),
    JSON.map(json.dumps),
    DEEP,
    HUGE,
    REF,
)
RANDOM_ENTRY = st.dictionaries(FIELD_NAMES, VALUES, min_size=1, max_size=6)
# Nearly valid: a JSON object as data, plus random (often wrong-typed) envelope fields.
NEAR_VALID = st.builds(
    lambda data, rest: {**rest, "data": json.dumps(data)},
    st.dictionaries(st.text(max_size=8), JSON, max_size=4),
    st.dictionaries(FIELD_NAMES, VALUES, max_size=4),
)
ENTRY = st.one_of(RANDOM_ENTRY, NEAR_VALID)


def _id_key(entry_id: str) -> tuple[int, int]:
    ms, seq = entry_id.split("-")
    return int(ms), int(seq)


def _settle(r: redis.Redis, keys: StreamKeys, ids: list[str], relay: Relay) -> dict[str, str]:
    """Wait until the group has read every id and holds none pending; then each id's
    outcome: its dlq reason code, 'processed', or 'duplicate' (acked without a call: an
    idempotency key seen before)."""
    stream = keys.stream("in")
    last = max(ids, key=_id_key)

    def done() -> bool:
        assert not relay.crashed, relay.crashed
        assert relay.manager is not None
        status = relay.manager.get_status()["fuzz"]
        assert status["state"] == "running", status
        (group,) = r.xinfo_groups(stream)
        return _id_key(group["last-delivered-id"]) >= _id_key(last) and group["pending"] == 0

    wait_for_sync(done, timeout=15, message="every fuzzed entry settled")
    wanted = set(ids)
    outcome = dict.fromkeys(ids, "duplicate")
    for _id, fields in r.xrange(keys.dlq):
        if fields.get("source_id") in wanted:
            outcome[fields["source_id"]] = fields["reason_code"]
    for _id, fields in r.xrange(keys.stream("out")):
        if fields.get("source_id") in wanted:
            outcome[fields["source_id"]] = "processed"
    return outcome


@settings(
    max_examples=100, deadline=None, derandomize=True,
    suppress_health_check=[HealthCheck.function_scoped_fixture, HealthCheck.too_slow],
)
@given(entries=st.lists(ENTRY, min_size=1, max_size=5))
def test_fuzzed_entries_end_in_dlq_or_processed(
    relay: Relay, server: ServerProcess, entries: list[dict[Any, Any]]
) -> None:
    r = redis.Redis.from_url(server.url)  # bytes in, bytes out: binary fields as they are
    text = redis.Redis.from_url(server.url, decode_responses=True, encoding_errors="replace")
    ids = [r.xadd(relay.keys.stream("in"), entry).decode() for entry in entries]
    outcome = _settle(text, relay.keys, ids, relay)
    for entry_id, result in outcome.items():
        assert result in {"processed", "duplicate", *REASONS}, (entry_id, result)
    assert relay.worker is not None and relay.worker.healthy()
    assert relay.worker.stats().errors == 0, relay.worker.stats().last_error


def test_payload_over_the_limit_is_dead_lettered(relay: Relay, server: ServerProcess) -> None:
    r = redis.Redis.from_url(server.url, decode_responses=True, encoding_errors="replace")
    big = _json.dumps({"blob": "x" * (PAYLOAD_LIMIT + 1)})
    small = _json.dumps({"blob": "x" * 10})
    ids = [r.xadd(relay.keys.stream("in"), {"data": d}) for d in (big, small)]
    outcome = _settle(r, relay.keys, ids, relay)
    assert outcome == {ids[0]: "payload_too_large", ids[1]: "processed"}
    (_, dead), = [(i, f) for i, f in r.xrange(relay.keys.dlq) if f["source_id"] == ids[0]]
    assert dead["reason_code"] == "payload_too_large" and dead["deliveries"] == "1"
    assert "limit 4096" in dead["error"]


def test_binary_entry_is_dead_lettered_byte_for_byte(relay: Relay, server: ServerProcess) -> None:
    raw = redis.Redis.from_url(server.url)
    fields = {b"data": b"\xff\xfe{\x00}", b"\x80key": b"\xc3\x28"}
    entry_id = raw.xadd(relay.keys.stream("in"), fields).decode()  # type: ignore[arg-type]
    text = redis.Redis.from_url(server.url, decode_responses=True, encoding_errors="replace")
    assert _settle(text, relay.keys, [entry_id], relay) == {entry_id: "undecodable"}
    for _id, dead in raw.xrange(relay.keys.dlq):
        if dead[b"source_id"] == entry_id.encode():
            assert dead[b"data"] == fields[b"data"] and dead[b"\x80key"] == fields[b"\x80key"]
            break
    else:
        raise AssertionError("dlq entry not found")


def test_fuzz_summary(
    relay: Relay, server: ServerProcess, report_figures: Callable[[str], None]
) -> None:
    """The figures of the whole module run (printed)."""
    r = redis.Redis.from_url(server.url, decode_responses=True, encoding_errors="replace")
    reasons: dict[str, int] = {}
    for _id, fields in r.xrange(relay.keys.dlq):
        reasons[fields["reason_code"]] = reasons.get(fields["reason_code"], 0) + 1
    processed = r.xlen(relay.keys.stream("out"))
    wait_for_sync(lambda: r.xpending(relay.keys.stream("in"), "fuzz")["pending"] == 0, timeout=10)
    assert relay.worker is not None and relay.worker.healthy() and not relay.crashed
    started = time.monotonic()
    assert r.ping() and time.monotonic() - started < 1, "the server is fine too"
    total = r.xlen(relay.keys.stream("in"))
    duplicates = total - processed - sum(reasons.values())
    report_figures(f"fuzzed entries: {total}, processed: {processed}, dlq: {reasons}, "
          f"deduplicated: {duplicates}, worker crashes: 0, pending: 0")


# -- the deployment app's validator ----------------------------------------------------

REQUEST_KEYS = ["deployment_id", "service", "version", "environment", "dependencies",
                "notify", "requested_by", "timeout_s"]
REQUEST = st.dictionaries(
    st.one_of(st.sampled_from(REQUEST_KEYS), st.text(max_size=8)),
    st.one_of(
        JSON,
        st.sampled_from(["payments", "1.2.3", "production", "staging", "log", "webhook+x"]),
        st.lists(st.fixed_dictionaries({"name": st.text(max_size=6),
                                        "health_url": st.text(max_size=30)}), max_size=3),
    ),
    max_size=8,
)


def _message(data: Any) -> Message:
    from printery.deploy.events import STARTED

    codec = Codec(correlation_field="deployment_id")
    envelope = codec.new(STARTED, data, correlation_id="dep-fuzz", producer="fuzz")
    return Message(envelope=envelope, stream=f"x:{STARTED}", entry_id="1-0", deliveries=1,
                   worker="validator", consumer="c", fields={})


@settings(max_examples=150, deadline=None, derandomize=True)
@given(data=st.one_of(JSON, REQUEST))
def test_validator_rejects_random_requests_with_reasons(data: Any) -> None:
    """Random requests to the deployment app's validator (with its input contract) end in
    ``deployment:rejected`` with reasons, a contract rejection with reasons, or a valid
    decision: never any other exception."""
    from printery.deploy.app import build_pipeline
    from printery.deploy.events import REJECTED, VALIDATED
    from printery.runtime.handler import outputs_of

    handler = build_pipeline().steps["validator"].guarded_handler()
    try:
        outputs = outputs_of(asyncio.run(handler(_message(data))))
    except Reject as exc:
        assert exc.reason_code == "invalid_input"
        assert json.loads(str(exc)), "a contract rejection carries its reasons"
        return
    (out,) = outputs
    if out.type == REJECTED:
        reasons = out.data["reasons"]
        assert reasons and all(r["code"] and "message" in r for r in reasons), reasons
    else:
        assert out.type in {VALIDATED, "review"}, out.type
