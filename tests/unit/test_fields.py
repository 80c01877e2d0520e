"""The field names of the framework's own entries are defined once (``printery.wire.fields``)
and the helpers that build those entries use exactly them."""

from __future__ import annotations

from printery import review_fields
from printery.wire.fields import DLQ_FIELDS, REVIEW_FIELDS, TRACEBACK, dlq_fields


def test_review_fields_are_the_review_field_names() -> None:
    fields = review_fields(kind="approval", step="validator", reason="production")
    assert tuple(fields) == REVIEW_FIELDS
    assert fields["source_stream"] == fields["source_id"] == ""


def test_dlq_fields_are_the_dlq_field_names() -> None:
    fields = dlq_fields(error="x" * 3000, reason_code="undecodable", worker="w", deliveries=3,
                        source_stream="p:in", source_id="1-0")
    assert set(fields) == set(DLQ_FIELDS) - {TRACEBACK}
    assert len(fields["error"]) == 2000 and fields["deliveries"] == "3"
    assert fields["failed_at"].endswith("Z")
    assert dlq_fields(error="e", reason_code="r", worker="w", deliveries=1, source_stream="s",
                      source_id="i", traceback="tb", failed_at="t")[TRACEBACK] == "tb"
