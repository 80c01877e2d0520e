"""The public API is pinned (the layering: test_layering.py)."""

from __future__ import annotations

import printery

EXPECTED = {
    "Aggregator", "BlobMissing", "Codec", "ConfigError", "ConsumerSettings", "DecodeError",
    "DependencyCycle", "Envelope", "Handler", "HandlerError", "HandlerResult", "JoinState", "Limit",
    "MergePolicy", "Message", "MessageError", "Output", "PayloadTooLarge", "Pipeline",
    "PipelineError", "PrinteryError", "Reason", "Reject", "Retry", "RunContext", "Settings",
    "Step", "StreamWorker", "SupervisorError", "TransportError", "Worker", "WorkerFailed",
    "WorkerManager", "WorkerState", "WorkerStats", "all_must_pass", "any_pass",
    "compute_backoff", "escalate", "first_wins", "review_output", "to_mermaid", "to_text",
    # replay and cost accounting for any pipeline (docs/reference.md, Replay and cost)
    "ReplayError", "ReplayResult", "StreamKeys", "cost_summary", "replay",
    # the application hook of the settings, redaction, the framework's own streams
    "AppConfig", "SettingsTable", "redact_text", "redact_url", "DLQ", "REVIEW", "REVIEW_DECIDED",
    "review_fields",
    # runs: submitting work and following it (docs/reference.md, Runs)
    "Client", "SyncClient", "RunResult", "InvalidInput", "UnknownRun",
    # what followers see while a step works (docs/reference.md, Streaming through the gate)
    "Partial", "Verdict",
    # the review inbox of any pipeline (docs/reference.md, Review inbox)
    "ReviewCase", "ReviewKind", "ReviewOutcome", "ReviewError", "ReviewNotFound",
    "ReviewRefused", "ReviewInvalid", "ReviewActionFailed",
    # AI-worker patterns (docs/reference.md, Validation loops; Budgets; Flow control)
    "Budget",
    "Loop",
    # partitioned streams (docs/reference.md, Partitions)
    "PartitionError", "partition_of",
    # failure semantics (docs/reference.md, Failures)
    "RUN_FAILED", "WorkerCrashed",
    # quota-aware fallbacks (reference: flow control and model steps)
    "QuotaExhausted",
    # fan-out over run-time data (reference: fan-out)
    "Map",
}


def test_exported_members() -> None:
    assert set(printery.__all__) == EXPECTED
    for name in printery.__all__:
        assert getattr(printery, name) is not None
