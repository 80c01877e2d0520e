"""OpenTelemetry traces of runs (docs/reference.md, Tracing), the one module that knows
OpenTelemetry.

With an OTLP endpoint (``[telemetry] otlp_endpoint``, else ``OTEL_EXPORTER_OTLP_TRACES_
ENDPOINT`` or ``OTEL_EXPORTER_OTLP_ENDPOINT``) a service calls :func:`start` once; each
step then asks :func:`step_tracer` once, as it starts, and gets a :class:`StepTracer`
that makes one span per handled entry, parented to the ``traceparent`` field of the
entry it handles, and whose own ``traceparent`` goes on every entry the step writes, so
a run is one trace across processes. Without an endpoint :func:`step_tracer` answers
None: nothing is imported from ``opentelemetry`` and the consume path does no per-entry
work at all (it holds None and never asks again).

Spans go out through a ``BatchSpanProcessor`` (a thread of the SDK's own, off the event
loop); :func:`shutdown` flushes them on a graceful stop.
"""

from __future__ import annotations

import re
from collections.abc import Iterator, Mapping
from contextlib import contextmanager
from typing import Any

from printery.base.errors import ConfigError
from printery.observe.redact import redact_url
from printery.wire.fields import TRACEPARENT

__all__ = [
    "TRACEPARENT",
    "StepTracer",
    "call_span",
    "endpoint",
    "is_on",
    "shutdown",
    "start",
    "step_tracer",
    "traces_url",
    "valid_traceparent",
]

_TRACEPARENT = re.compile(r"^([0-9a-f]{2})-([0-9a-f]{32})-([0-9a-f]{16})-([0-9a-f]{2})$")
#: The tracer of this process, once :func:`start` turned tracing on.
_active: _Tracing | None = None


def valid_traceparent(value: str) -> bool:
    """Whether ``value`` is a W3C ``traceparent`` printery may continue: version 00-fe,
    non-zero trace and span ids."""
    match = _TRACEPARENT.match(value)
    return (match is not None and match[1] != "ff" and match[2] != "0" * 32
            and match[3] != "0" * 16)


def endpoint(configured: str | None, env: Mapping[str, str]) -> str | None:
    """The OTLP/HTTP endpoint traces go to: ``configured`` (``[telemetry]
    otlp_endpoint``), else the standard env vars; None: tracing off. ``OTEL_SDK_DISABLED``
    turns tracing off whatever is set, as the OpenTelemetry SDKs do."""
    if env.get("OTEL_SDK_DISABLED", "").strip().lower() == "true":
        return None
    if configured:
        return traces_url(configured)
    exact = env.get("OTEL_EXPORTER_OTLP_TRACES_ENDPOINT", "").strip()
    if exact:  # the signal's own variable is used as given (the OTLP exporter spec)
        return exact
    base = env.get("OTEL_EXPORTER_OTLP_ENDPOINT", "").strip()
    return traces_url(base) if base else None


def traces_url(base: str) -> str:
    """The traces URL of an OTLP/HTTP ``base`` URL, as the SDK derives it from
    ``OTEL_EXPORTER_OTLP_ENDPOINT`` (a URL already ending in ``/v1/traces`` is kept)."""
    base = base.rstrip("/")
    return base if base.endswith("/v1/traces") else base + "/v1/traces"


def start(configured: str | None, env: Mapping[str, str]) -> bool:
    """Turn tracing on for this process when an endpoint is set (see :func:`endpoint`);
    whether it is on. Raises :class:`ConfigError` when it is set but the ``otel`` extra
    is not installed."""
    global _active
    url = endpoint(configured, env)
    if url is None or _active is not None:
        return _active is not None
    try:
        _active = _Tracing(url, env)
    except ImportError as exc:
        raise ConfigError(
            "telemetry.otlp_endpoint", redact_url(url, keep_user=False),
            f"the OpenTelemetry packages: pip install 'printery[otel]' ({exc.name} is missing)",
        ) from None
    return True


def is_on() -> bool:
    """Whether :func:`start` turned tracing on in this process."""
    return _active is not None


def shutdown() -> None:
    """Export what is buffered and stop tracing (a graceful stop's last step)."""
    global _active
    active, _active = _active, None
    if active is not None:
        active.provider.shutdown()


def step_tracer(step: str) -> StepTracer | None:
    """The tracer for ``step``'s entries, or None while tracing is off."""
    return StepTracer(step, _active) if _active is not None else None


@contextmanager
def call_span(name: str, attributes: Mapping[str, Any]) -> Iterator[Any]:
    """A span of a call a handler makes (a model's, say), a child of the span current
    now (the entry's, while its handler runs); yields it to add attributes to, or None
    while tracing is off (nothing of OpenTelemetry is touched then). An exception that
    leaves the block marks the span failed with its message (which printery's own
    errors keep free of secrets) and goes on."""
    active = _active
    if active is None:
        yield None
        return
    from opentelemetry.trace import SpanKind, Status, StatusCode

    with active.tracer.start_as_current_span(
        name, kind=SpanKind.CLIENT, attributes=dict(attributes), record_exception=False,
        set_status_on_exception=False,
    ) as span:
        try:
            yield span
        except BaseException as exc:
            span.set_status(Status(StatusCode.ERROR, f"{type(exc).__name__}: {exc}"[:500]))
            raise


class _Tracing:
    """The SDK objects of one process: a provider exporting over OTLP/HTTP in batches."""

    def __init__(self, url: str, env: Mapping[str, str]) -> None:
        from opentelemetry.exporter.otlp.proto.http.trace_exporter import OTLPSpanExporter
        from opentelemetry.sdk.resources import Resource
        from opentelemetry.sdk.trace import TracerProvider
        from opentelemetry.sdk.trace.export import BatchSpanProcessor

        resource = Resource.create({"service.name": env.get("OTEL_SERVICE_NAME") or "printery"})
        self.provider = TracerProvider(resource=resource)
        self.provider.add_span_processor(BatchSpanProcessor(OTLPSpanExporter(endpoint=url)))
        self.tracer = self.provider.get_tracer("printery")


class StepTracer:
    """Spans of one step's entries: :meth:`start` as an entry is taken, :meth:`end` once
    its commit says what happened."""

    def __init__(self, step: str, tracing: _Tracing) -> None:
        from opentelemetry import trace
        from opentelemetry.trace import SpanKind, Status, StatusCode

        self.step = step
        self._tracer = tracing.tracer
        self._trace = trace
        self._kind = SpanKind.CONSUMER
        self._error = (Status, StatusCode.ERROR)

    def start(self, traceparent: str | None, run_id: str, attempt: int, deliveries: int) -> Any:
        """A span for an entry whose field ``traceparent`` names the span that wrote it
        (None or invalid: the span begins a trace)."""
        context = self._parent(traceparent) if traceparent else None
        return self._tracer.start_span(self.step, context=context, kind=self._kind, attributes={
            "printery.step": self.step, "printery.run_id": run_id, "printery.attempt": attempt,
            "printery.deliveries": deliveries,
        })

    def _parent(self, traceparent: str) -> Any:
        if not valid_traceparent(traceparent):
            return None
        trace = self._trace
        _, trace_id, span_id, flags = traceparent.split("-")
        parent = trace.SpanContext(int(trace_id, 16), int(span_id, 16), is_remote=True,
                                   trace_flags=trace.TraceFlags(int(flags, 16)))
        return trace.set_span_in_context(trace.NonRecordingSpan(parent))

    def use(self, span: Any) -> Any:
        """A context manager making ``span`` current, so spans a handler makes itself are
        its children."""
        return self._trace.use_span(span, end_on_exit=False)

    @staticmethod
    def traceparent(span: Any) -> str:
        """The ``traceparent`` field of what ``span``'s entry writes."""
        ctx = span.get_span_context()
        return f"00-{ctx.trace_id:032x}-{ctx.span_id:016x}-{int(ctx.trace_flags):02x}"

    def end(self, span: Any, outcome: str, costs: Mapping[str, float], error: str = "") -> None:
        """Close ``span`` with the entry's ``outcome`` and what it cost; ``error`` marks
        it failed."""
        span.set_attribute("printery.outcome", outcome)
        for unit, amount in costs.items():
            span.set_attribute(f"printery.cost.{unit}", amount)
        if error:
            status, code = self._error
            span.set_status(status(code, error[:500]))
        span.end()
