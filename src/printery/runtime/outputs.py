"""Handler outputs as stream entry fields: what ``codec.encode(codec.new(...))`` gives,
field for field, built directly (on the hot path the intermediate envelope, a
cryptographic random id and a fresh timestamp format cost more per output than the
commit round trip)."""

from __future__ import annotations

import random
import time
from datetime import UTC, datetime

from printery import _json
from printery.runtime.handler import Message, Output


def extra_fields(message: Message, seconds: float) -> dict[str, str]:
    """The fields every output of one handler call carries besides its own."""
    extra: dict[str, str] = {"duration_ms": f"{seconds * 1000:.3f}"}
    if message.costs:
        extra["cost"] = _json.dumps(message.costs)
    replay_of = message.envelope.extra.get("replay_of")
    if replay_of:
        extra["replay_of"] = replay_of
    return extra


def output_fields(
    out: Output, correlation: str, extra: dict[str, str], *, correlation_field: str, producer: str
) -> dict[str, str]:
    """One output's entry fields (CONTRACT §2), ``extra`` and the output's own extras last."""
    ms, produced_at = _CLOCK.now()
    fields = {
        "data": _json.dumps(out.data),
        "type": out.type,
        "event_id": f"evt-{ms:x}-{random.getrandbits(40):010x}",
        correlation_field: correlation,
        "idempotency_key": out.idempotency_key or f"{out.type}:{correlation}",
        "attempt": "1",
        "produced_at": produced_at,
        "producer": producer,
    }
    fields.update(extra)
    if out.extra:
        fields.update(out.extra)
    return fields


class _Rfc3339Clock:
    """The current time as ms and RFC 3339 text, formatted once per millisecond."""

    def __init__(self) -> None:
        self._ms = -1
        self._text = ""

    def now(self) -> tuple[int, str]:
        ms = int(time.time() * 1000)
        if ms != self._ms:
            stamp = datetime.fromtimestamp(ms / 1000, UTC).isoformat(timespec="milliseconds")
            self._ms, self._text = ms, stamp.replace("+00:00", "Z")
        return ms, self._text


_CLOCK = _Rfc3339Clock()
