"""OpenTelemetry traces (docs/reference.md, Tracing) across two real ``printery-workers``
processes, exported over OTLP/HTTP to a receiver the test runs and decodes with
``opentelemetry-proto``: one deployment is one trace, a span per handled entry named after
its step, each parented to the span that wrote its input, in the producer's trace when the
producer gave a ``traceparent`` (to ``Client.submit`` or as the header of ``POST
/v1/runs``)."""

from __future__ import annotations

import secrets
from collections import Counter
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import httpx
import pytest

from printery import Client
from printery.servers.process import ServerProcess
from printery.testing import unique_prefix
from support.otlp import OtlpReceiver, ReceivedSpan, otlp_receiver
from support.service import ServiceHandle, spawn

#: The deployment pipeline's spans of one succeeded run: the aggregator handles three
#: entries (deployment:validated opens the join, dependencies:checked and health:checked
#: fill it), each a span of its own.
RUN_SPANS = Counter({"validator": 1, "dependency-checker": 1, "health-monitor": 1,
                     "aggregator": 3, "notifier": 1})


def request() -> dict[str, Any]:
    return {"service": "billing-api", "version": "1.0.0", "environment": "development",
            "requested_by": "alice", "notify": ["log"]}


def producer_context() -> tuple[str, str, str]:
    """(traceparent, trace id, span id) of a made-up producer span."""
    trace_id, span_id = secrets.token_hex(16), secrets.token_hex(8)
    return f"00-{trace_id}-{span_id}-01", trace_id, span_id


@pytest.fixture
def receiver() -> Iterator[OtlpReceiver]:
    with otlp_receiver() as found:
        yield found


@pytest.fixture
def two_processes(
    server: ServerProcess, tmp_path: Path, receiver: OtlpReceiver
) -> Iterator[tuple[ServiceHandle, ServiceHandle, str]]:
    """Process ``front`` runs the first three steps, tracing on by the standard env var;
    ``back`` runs the aggregator and notifier, tracing on by ``[telemetry]``."""
    prefix = unique_prefix()
    config = tmp_path / "back.toml"
    config.write_text(f'[telemetry]\notlp_endpoint = "{receiver.url}"\n')
    common = ["--redis-url", server.url, "--stream-prefix", prefix]
    front = spawn([*common, "--worker", "validator,dependency-checker,health-monitor"],
                  env={"OTEL_EXPORTER_OTLP_ENDPOINT": receiver.url, "OTEL_SERVICE_NAME": "front"},
                  cwd=tmp_path)
    try:
        back = spawn([*common, "--worker", "aggregator,notifier", "--config", str(config)],
                     env={"OTEL_SERVICE_NAME": "back"}, cwd=tmp_path)
    except BaseException:
        front.kill()
        raise
    try:
        yield front, back, prefix
    finally:
        front.kill()
        back.kill()


def by_name(spans: list[ReceivedSpan]) -> dict[str, list[ReceivedSpan]]:
    named: dict[str, list[ReceivedSpan]] = {}
    for span in spans:
        named.setdefault(span.name, []).append(span)
    return named


def assert_one_run_trace(spans: list[ReceivedSpan], run_id: str, trace_id: str,
                         producer_span: str) -> None:
    """The spans of one succeeded deployment: one trace, parented step to step."""
    assert {span.trace_id for span in spans} == {trace_id}
    assert Counter(span.name for span in spans) == RUN_SPANS
    named = by_name(spans)
    (validator,) = named["validator"]
    (checker,) = named["dependency-checker"]
    (monitor,) = named["health-monitor"]
    (notifier,) = named["notifier"]
    assert validator.parent_span_id == producer_span
    assert checker.parent_span_id == monitor.parent_span_id == validator.span_id
    assert sorted(a.parent_span_id for a in named["aggregator"]) == sorted(
        [validator.span_id, checker.span_id, monitor.span_id])
    assert notifier.parent_span_id in {a.span_id for a in named["aggregator"]}
    # Parents across the process boundary: front's spans are the parents of back's.
    assert {s.service for s in (validator, checker, monitor)} == {"front"}
    assert {s.service for s in (*named["aggregator"], notifier)} == {"back"}
    for span in spans:
        assert span.attributes["printery.step"] == span.name
        assert span.attributes["printery.run_id"] == run_id
        assert span.attributes["printery.attempt"] == 1
        assert span.attributes["printery.outcome"] == "ok"
        assert span.kind == 5  # SPAN_KIND_CONSUMER
    assert checker.attributes["printery.cost.probes"] == 0  # it reported 0 probes


async def test_a_deployment_is_one_trace_across_two_processes(
    server: ServerProcess, receiver: OtlpReceiver,
    two_processes: tuple[ServiceHandle, ServiceHandle, str],
) -> None:
    front, back, prefix = two_processes
    by_client, client_trace, client_span = producer_context()
    by_http, http_trace, http_span = producer_context()
    async with Client(server.url, stream_prefix=prefix) as client:
        first = await client.submit(request(), traceparent=by_client)
        assert front.http_base is not None
        async with httpx.AsyncClient(timeout=10) as http:
            answer = await http.post(front.http_base + "/v1/runs", json={"data": request()},
                                     headers={"traceparent": by_http})
        assert answer.status_code == 202, answer.text
        second = answer.json()["run_id"]
        assert (await client.result(first, timeout=30)).status == "succeeded"
        assert (await client.result(second, timeout=30)).status == "succeeded"
        entries = await client.entries(first)
    # Every entry of the run carries a traceparent, all of the producer's trace.
    assert all(e.get("traceparent", "").split("-")[1] == client_trace for e in entries), entries
    assert front.stop() == 0 and back.stop() == 0  # a graceful stop flushes the spans
    spans = receiver.wait_for(2 * sum(RUN_SPANS.values()), timeout=20)
    runs = {run: [s for s in spans if s.attributes["printery.run_id"] == run]
            for run in (first, second)}
    assert_one_run_trace(runs[first], first, client_trace, client_span)
    assert_one_run_trace(runs[second], second, http_trace, http_span)


async def test_without_a_producer_context_a_run_is_still_one_trace(
    server: ServerProcess, receiver: OtlpReceiver,
    two_processes: tuple[ServiceHandle, ServiceHandle, str],
) -> None:
    front, back, prefix = two_processes
    async with Client(server.url, stream_prefix=prefix) as client:
        run = await client.submit(request())
        assert (await client.result(run, timeout=30)).status == "succeeded"
        ingress = (await client.entries(run))[0]
    assert "traceparent" not in ingress  # the client writes none of its own
    assert front.stop() == 0 and back.stop() == 0
    spans = receiver.wait_for(sum(RUN_SPANS.values()), timeout=20)
    (validator,) = by_name(spans)["validator"]
    assert validator.parent_span_id == ""  # the first step's span begins the trace
    assert_one_run_trace(spans, run, validator.trace_id, "")


async def test_tracing_off_writes_no_traceparent_and_exports_nothing(
    server: ServerProcess, tmp_path: Path, receiver: OtlpReceiver
) -> None:
    """No endpoint: no span is made (the receiver, listening, gets no request) and no
    entry carries a traceparent; a producer's own still passes through."""
    prefix = unique_prefix()
    handle = spawn(["--redis-url", server.url, "--stream-prefix", prefix], cwd=tmp_path)
    try:
        given, _, _ = producer_context()
        async with Client(server.url, stream_prefix=prefix) as client:
            plain = await client.submit(request())
            traced = await client.submit(request(), traceparent=given)
            for run in (plain, traced):
                assert (await client.result(run, timeout=30)).status == "succeeded"
            plain_entries = await client.entries(plain)
            traced_entries = await client.entries(traced)
        assert handle.stop() == 0
    finally:
        handle.kill()
    assert all("traceparent" not in entry for entry in plain_entries)
    assert traced_entries[0]["traceparent"] == given
    assert all("traceparent" not in entry for entry in traced_entries[1:])
    assert receiver.requests == 0 and receiver.spans == []
    assert "tracing on" not in handle.log()


async def test_an_invalid_traceparent_is_refused_before_anything_is_written(
    server: ServerProcess
) -> None:
    from printery import InvalidInput

    async with Client(server.url, stream_prefix=unique_prefix()) as client:
        with pytest.raises(InvalidInput) as refused:
            await client.submit(request(), traceparent="00-" + "0" * 32 + "-" + "1" * 16 + "-01")
        assert refused.value.reasons[0].field == "traceparent"
        assert await client.redis.keys(f"{client.keys.prefix}:*") == []
