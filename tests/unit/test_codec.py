"""The wire format has one owner, the ``Codec``: every ``Output`` a handler can return
round-trips through the fields a worker writes for it, and ``encode(new(...))`` (tools,
replay) writes the same layout as the hot path's ``new_fields``."""

from __future__ import annotations

import re
from typing import Any

from hypothesis import given
from hypothesis import strategies as st

from printery import Codec, Output
from printery.wire.envelope import ENVELOPE_FIELDS, run_id_problem

CODEC = Codec(correlation_field="run_id", id_prefix="run")

_text = st.text(min_size=1, max_size=20).filter(lambda s: "\x00" not in s)
#: A run id is decoded only when it holds to the rule of run ids (else: invalid_run_id).
_run_ids = _text.filter(lambda s: run_id_problem(s) is None)
_json = st.recursive(
    st.none() | st.booleans() | st.integers(-(2**63), 2**63 - 1)
    | st.floats(allow_nan=False, allow_infinity=False) | st.text(max_size=20),
    lambda inner: st.lists(inner, max_size=4) | st.dictionaries(st.text(max_size=8), inner, max_size=4),
    max_leaves=12,
)
_extra_keys = st.text(min_size=1, max_size=12).filter(
    lambda k: k not in ENVELOPE_FIELDS and k != "run_id")
_outputs = st.builds(
    Output,
    type=_text,
    data=_json,
    correlation_id=st.none() | _run_ids,
    idempotency_key=st.none() | _text,
    extra=st.dictionaries(_extra_keys, st.text(max_size=20), max_size=3),
    once=st.none() | _text,
)


@given(out=_outputs, input_correlation=_run_ids, duration=st.floats(0, 1e4))
def test_every_output_round_trips(out: Output, input_correlation: str, duration: float) -> None:
    common = {"duration_ms": f"{duration:.3f}"}
    fields = CODEC.new_fields(
        out.type, out.data, correlation_id=out.correlation_id or input_correlation,
        producer="step", idempotency_key=out.idempotency_key, extra=common, more=out.extra,
    )
    assert all(isinstance(k, str) and isinstance(v, str) for k, v in fields.items())
    back = CODEC.decode(fields, "ignored-stream-type")
    correlation = out.correlation_id or input_correlation
    assert back.type == out.type
    assert back.data == out.data
    assert back.correlation_id == correlation
    assert back.idempotency_key == (out.idempotency_key or f"{out.type}:{correlation}")
    assert back.attempt == 1 and back.producer == "step"
    assert re.fullmatch(r"evt-[0-9a-f]+-[0-9a-f]{10}", back.event_id)
    assert re.fullmatch(r"\d{4}-\d\d-\d\dT\d\d:\d\d:\d\d\.\d{3}Z", back.produced_at)
    assert dict(back.extra) == {**common, **out.extra}


@given(data=_json, correlation=_text, key=st.none() | _text)
def test_tools_and_workers_write_one_layout(data: Any, correlation: str, key: str | None) -> None:
    by_tool = CODEC.encode(CODEC.new("t", data, correlation_id=correlation, producer="p",
                                     idempotency_key=key))
    by_worker = CODEC.new_fields("t", data, correlation_id=correlation, producer="p",
                                 idempotency_key=key)
    assert list(by_tool) == list(by_worker)
    varying = {"event_id", "produced_at"}
    assert {k: v for k, v in by_tool.items() if k not in varying} == {
        k: v for k, v in by_worker.items() if k not in varying}
    assert by_tool["event_id"].split("-")[0] == by_worker["event_id"].split("-")[0] == "evt"
