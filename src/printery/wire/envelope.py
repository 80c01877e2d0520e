"""The entry envelope (docs/reference.md, Streams and entries) and its codec, the one
owner of the wire format: decoding (with the defaults an external producer may leave out)
and encoding, on the hot path too (:meth:`Codec.new_fields`). The correlation field's wire
name is the application's choice, so this layer knows nothing of what is being
correlated."""

from __future__ import annotations

import re
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any

from printery.base import _json
from printery.base._util import as_text, new_id, now_rfc3339, stamped_id
from printery.base.errors import DecodeError, InvalidRunId, PayloadTooLarge

ENVELOPE_FIELDS = (
    "data", "type", "event_id", "idempotency_key", "attempt", "produced_at", "producer",
)
_ENVELOPE_FIELD_SET = frozenset(ENVELOPE_FIELDS)
DEFAULT_PAYLOAD_LIMIT = 1_048_576
_NO_FIELDS: Mapping[str, str] = {}


@dataclass(slots=True)
class Envelope:
    """One event. ``data`` is decoded JSON; ``extra`` holds every other field as written.

    Not frozen: one is made for every entry a worker takes, and a frozen dataclass sets
    each field through ``object.__setattr__`` (1.4 µs to make one against 0.5); nothing
    in printery changes an envelope once made."""

    type: str
    data: Any
    event_id: str
    correlation_id: str
    idempotency_key: str
    attempt: int = 1
    produced_at: str = ""
    producer: str = "external"
    extra: Mapping[str, str] = field(default_factory=dict)


def _is_text(fields: Mapping[Any, Any]) -> bool:
    """Whether ``fields`` already maps str to str, judged by its first item: a client
    decodes every reply or none (``decode_responses``), so one item tells; the hot path
    then skips a copy of every entry."""
    for key, value in fields.items():
        return isinstance(key, str) and isinstance(value, str)
    return True


def _id_in(data: Any, field: str) -> str | None:
    """The correlation id ``data`` carries under ``field``, if it is a non-empty string."""
    candidate = data.get(field) if isinstance(data, dict) else None
    return candidate if isinstance(candidate, str) and candidate else None


#: The longest run id a run may be given (``Client.submit``, ``POST /v1/runs``, replay).
MAX_RUN_ID = 256
#: A control character (C0, DEL, C1): none may be part of a run id.
_CONTROL = re.compile("[\x00-\x1f\x7f-\x9f]")


def run_id_problem(run_id: str) -> str | None:
    """What is wrong with ``run_id`` as the id of any run (None: nothing): it must be 1
    to :data:`MAX_RUN_ID` characters, none of them a control character. The one rule of
    every run id, however it is named: a submit, a replay, and every entry decoded (an
    entry whose id breaks it is dead-lettered ``invalid_run_id``, whoever wrote it)."""
    if 0 < len(run_id) <= MAX_RUN_ID and _CONTROL.search(run_id) is None:
        return None
    return f"1 to {MAX_RUN_ID} characters, none of them a control character"


def correlation_of(fields: Mapping[str, str], field: str) -> str | None:
    """The run an entry belongs to, by the rule :meth:`Codec.decode` applies: its
    ``field``, else the id inside its ``data``. An external producer may write only
    ``data`` (docs/reference.md, Streams and entries), so whoever looks a run up in the
    streams (``trace``, ``replay``, ``cost``) must look inside ``data`` too. None when
    neither names one."""
    value = fields.get(field)
    if value:
        return value
    raw = fields.get("data")
    if not raw or field not in raw:  # no need to parse what cannot name it
        return None
    try:
        return _id_in(_json.loads(raw), field)
    except (_json.JSONDecodeError, ValueError):
        return None


@dataclass(frozen=True, slots=True)
class Codec:
    """Turns stream fields into envelopes and back.

    ``correlation_field`` is the wire name of the correlation id (an application picks it,
    e.g. ``deployment_id``); ``id_prefix`` prefixes generated ids.
    """

    correlation_field: str = "correlation_id"
    id_prefix: str = "cor"
    payload_limit: int = DEFAULT_PAYLOAD_LIMIT
    #: The fields an envelope has a place for (the rest go to ``extra``), this
    #: correlation field included: one set lookup per field of every entry decoded.
    _known: frozenset[str] = field(init=False, repr=False, compare=False)

    def __post_init__(self) -> None:
        object.__setattr__(self, "_known", _ENVELOPE_FIELD_SET | {self.correlation_field})

    def decode(self, fields: Mapping[Any, Any], stream_type: str) -> Envelope:
        """Decode an entry, filling the defaults an external producer may leave out.

        Raises :class:`DecodeError` when ``data`` is missing or not JSON,
        :class:`PayloadTooLarge` past the payload limit, and :class:`InvalidRunId` when
        the run id it names breaks :func:`run_id_problem`'s rule; none is worth a retry.
        """
        text = fields if _is_text(fields) else {as_text(k): as_text(v) for k, v in fields.items()}
        raw = text.get("data")
        if raw is None:
            raise DecodeError("entry has no `data` field")
        if len(raw) > self.payload_limit:
            raise PayloadTooLarge(f"data is {len(raw)} bytes, limit {self.payload_limit}")
        try:
            data = _json.loads(raw)
        except (_json.JSONDecodeError, ValueError) as exc:
            raise DecodeError(f"`data` is not valid JSON: {exc}") from None
        return self.envelope_from(text, data, stream_type)

    def envelope_from(self, text: Mapping[str, str], data: Any, stream_type: str) -> Envelope:
        kind = text.get("type") or stream_type
        correlation = text.get(self.correlation_field) or _id_in(data, self.correlation_field)
        if correlation is None:
            correlation = new_id(self.id_prefix)
        elif (problem := run_id_problem(correlation)) is not None:
            shown = f"{correlation[:64]!r}{'...' if len(correlation) > 64 else ''}"
            raise InvalidRunId(f"run id {shown} is not a run id: it must be {problem}")
        try:
            attempt = max(1, int(text.get("attempt") or 1))
        except ValueError:
            attempt = 1
        known = self._known
        return Envelope(
            type=kind,
            data=data,
            event_id=text.get("event_id") or new_id("evt"),
            correlation_id=correlation,
            idempotency_key=text.get("idempotency_key") or f"{kind}:{correlation}",
            attempt=attempt,
            produced_at=text.get("produced_at") or now_rfc3339(),
            producer=text.get("producer") or "external",
            extra={k: v for k, v in text.items() if k not in known},
        )

    def encode(self, envelope: Envelope, *, data_json: str | None = None) -> dict[str, str]:
        """All contract fields of ``envelope`` as strings; ``data_json`` skips encoding
        known JSON again."""
        return self._fields(
            data_json if data_json is not None else _json.dumps_data(envelope.data),
            envelope.type, envelope.event_id, envelope.correlation_id,
            envelope.idempotency_key, str(envelope.attempt),
            envelope.produced_at or now_rfc3339(), envelope.producer, envelope.extra,
        )

    def new(
        self,
        event_type: str,
        data: Any,
        *,
        correlation_id: str | None = None,
        producer: str,
        idempotency_key: str | None = None,
        attempt: int = 1,
        extra: Mapping[str, str] | None = None,
    ) -> Envelope:
        """A fresh envelope written by ``producer`` (a worker name, or a tool)."""
        if correlation_id is None:
            correlation_id = _id_in(data, self.correlation_field)
        correlation_id = correlation_id or new_id(self.id_prefix)
        return Envelope(
            type=event_type,
            data=data,
            event_id=new_id("evt"),
            correlation_id=correlation_id,
            idempotency_key=idempotency_key or f"{event_type}:{correlation_id}",
            attempt=attempt,
            produced_at=now_rfc3339(),
            producer=producer,
            extra=dict(extra or {}),
        )

    def new_fields(
        self,
        event_type: str,
        data: Any,
        *,
        correlation_id: str,
        producer: str,
        idempotency_key: str | None = None,
        extra: Mapping[str, str] = _NO_FIELDS,
        more: Mapping[str, str] | None = None,
    ) -> dict[str, str]:
        """``encode(new(...))`` without the envelope in between: the form a worker writes
        its outputs in, once per output. ``extra`` then ``more`` are added last (a
        handler call's common fields, then the output's own)."""
        event_id, produced_at = stamped_id("evt")
        fields = self._fields(
            _json.dumps_data(data), event_type, event_id, correlation_id,
            idempotency_key or f"{event_type}:{correlation_id}", "1", produced_at,
            producer, extra,
        )
        if more:
            fields.update(more)
        return fields

    def _fields(
        self, data_json: str, event_type: str, event_id: str, correlation_id: str,
        idempotency_key: str, attempt: str, produced_at: str, producer: str,
        extra: Mapping[str, str],
    ) -> dict[str, str]:
        """The one layout of an entry's fields (docs/reference.md, Streams and entries),
        extra fields last."""
        fields = {
            "data": data_json,
            "type": event_type,
            "event_id": event_id,
            self.correlation_field: correlation_id,
            "idempotency_key": idempotency_key,
            "attempt": attempt,
            "produced_at": produced_at,
            "producer": producer,
        }
        if extra:
            fields.update(extra)
        return fields
