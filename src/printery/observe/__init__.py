"""Observability: logs, metrics, OpenTelemetry (imported only while tracing is on) and redaction."""
