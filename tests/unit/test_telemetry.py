"""printery.observe.telemetry (docs/reference.md, Tracing): when tracing is on, what it reads, the
traceparent it accepts; and that with tracing off nothing of OpenTelemetry is even
imported."""

from __future__ import annotations

import subprocess
import sys
import textwrap

import pytest

from printery.base.errors import ConfigError
from printery.observe import telemetry
from printery.settings.config import Settings, TelemetrySettings
from support.otlp import otlp_receiver

TRACE = "4bf92f3577b34da6a3ce929d0e0e4736"
SPAN = "00f067aa0ba902b7"


def test_with_tracing_off_nothing_of_opentelemetry_is_imported() -> None:
    """The service, the consume path, the client and the API loaded, a step's entry
    pipeline built: no ``opentelemetry`` module in the process, and no tracer."""
    code = textwrap.dedent("""
        import os, sys
        import printery.service.service, printery.service.api, printery.runs.client
        from printery.observe import telemetry
        from printery.settings.config import Settings
        from printery.runtime.consume import EntryPipeline
        assert telemetry.start(Settings().telemetry.otlp_endpoint, dict(os.environ)) is False
        assert telemetry.step_tracer("validator") is None
        pipeline = EntryPipeline.__new__(EntryPipeline)
        EntryPipeline.__init__(pipeline, "validator", handler=None, chain=None,
            writes=None, failures=None, records=None, committer=None, leases=None,
            settings=None, connectivity=None, observer=None, stats=None)
        assert pipeline.spans is None and pipeline.handlers.handle == pipeline._run
        loaded = sorted(m for m in sys.modules if m.startswith("opentelemetry"))
        assert not loaded, loaded
        print("ok")
    """)
    env = {"PATH": "/usr/bin:/bin"}
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True,
                          timeout=60, check=False, env=env)
    assert done.returncode == 0 and done.stdout.strip() == "ok", done.stderr


def test_endpoint_sources_and_precedence() -> None:
    table = Settings(telemetry=TelemetrySettings(otlp_endpoint="http://table:4318")).telemetry.otlp_endpoint
    generic = {"OTEL_EXPORTER_OTLP_ENDPOINT": "http://generic:4318"}
    traces = {**generic, "OTEL_EXPORTER_OTLP_TRACES_ENDPOINT": "http://traces:4318/v1/traces"}
    assert telemetry.endpoint(None, {}) is None
    assert telemetry.endpoint(None, {"OTEL_EXPORTER_OTLP_ENDPOINT": " "}) is None
    # The traces URL: /v1/traces added to a base, the signal's own variable as given.
    assert telemetry.endpoint(None, generic) == "http://generic:4318/v1/traces"
    assert telemetry.endpoint(None, traces) == "http://traces:4318/v1/traces"
    custom = {"OTEL_EXPORTER_OTLP_TRACES_ENDPOINT": "http://traces:4318/custom"}
    assert telemetry.endpoint(None, custom) == "http://traces:4318/custom"
    assert telemetry.endpoint(table, traces) == "http://table:4318/v1/traces"
    assert telemetry.endpoint(table, {"OTEL_SDK_DISABLED": "true"}) is None


def test_traces_url() -> None:
    assert telemetry.traces_url("http://c:4318") == "http://c:4318/v1/traces"
    assert telemetry.traces_url("http://c:4318/") == "http://c:4318/v1/traces"
    assert telemetry.traces_url("http://c:4318/v1/traces") == "http://c:4318/v1/traces"


@pytest.mark.parametrize(
    ("value", "valid"),
    [
        (f"00-{TRACE}-{SPAN}-01", True),
        (f"00-{TRACE}-{SPAN}-00", True),
        (f"01-{TRACE}-{SPAN}-01", True),
        (f"ff-{TRACE}-{SPAN}-01", False),
        (f"00-{'0' * 32}-{SPAN}-01", False),
        (f"00-{TRACE}-{'0' * 16}-01", False),
        (f"00-{TRACE.upper()}-{SPAN}-01", False),
        (f"00-{TRACE}-{SPAN}", False),
        ("", False),
    ],
)
def test_valid_traceparent(value: str, valid: bool) -> None:
    assert telemetry.valid_traceparent(value) is valid


def test_an_endpoint_without_the_otel_extra_is_a_config_error(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    monkeypatch.setitem(sys.modules, "opentelemetry.exporter.otlp.proto.http.trace_exporter", None)
    with pytest.raises(ConfigError) as refused:
        telemetry.start(None, {"OTEL_EXPORTER_OTLP_ENDPOINT": "http://127.0.0.1:9"})
    assert "printery[otel]" in str(refused.value)
    assert telemetry.step_tracer("validator") is None


def test_spans_parent_to_the_traceparent_they_are_given() -> None:
    """The tracer of a step: a span parented to the entry's traceparent, whose own
    traceparent continues the same trace; an invalid one begins a new trace. Both are
    exported when tracing shuts down."""
    with otlp_receiver() as receiver:
        assert telemetry.start(None, {"OTEL_EXPORTER_OTLP_ENDPOINT": receiver.url})
        try:
            check_spans()
        finally:
            telemetry.shutdown()
        assert telemetry.step_tracer("validator") is None
        assert sorted(span.attributes["printery.run_id"] for span in receiver.wait_for(2)) == [
            "run-1", "run-2"]


def check_spans() -> None:
    """One span with a valid parent, one with an invalid one."""
    tracer = telemetry.step_tracer("validator")
    assert tracer is not None
    span = tracer.start(f"00-{TRACE}-{SPAN}-01", "run-1", 1, 1)
    child = tracer.traceparent(span)
    _, trace_id, span_id, flags = child.split("-")
    assert (trace_id, flags) == (TRACE, "01") and span_id != SPAN
    assert span.parent.span_id == int(SPAN, 16)
    tracer.end(span, "ok", {"tokens": 12.0})
    assert span.attributes["printery.outcome"] == "ok"
    assert span.attributes["printery.cost.tokens"] == 12.0
    orphan = tracer.start("not-a-traceparent", "run-2", 1, 1)
    assert orphan.parent is None and tracer.traceparent(orphan).split("-")[1] != TRACE
    tracer.end(orphan, "dead_lettered", {}, "boom")
    assert not orphan.status.is_ok
