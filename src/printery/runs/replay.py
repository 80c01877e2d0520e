"""Replay a run of any pipeline from any step under a new correlation id
(docs/reference.md, Replay).

Streams are append-only history, so the entry a step consumed for a correlation id is
still there (until trimmed): replay finds it and publishes a copy under a new id. The
new id keeps the rule "one outcome per correlation id" intact, and the field
``replay_of`` (propagated by every worker to its outputs) ties the new run to the old.

Limitation: finding entries scans streams with XRANGE in chunks (O(stream length)); fine
for operator use, not for a hot path. Entries trimmed by retention cannot be replayed.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

from printery.base import _json
from printery.base.errors import BlobMissing, InvalidReplayId, ReplayError
from printery.pipeline.dag import Pipeline, run_id_problem, steps_reached
from printery.runs.history import find_entries, id_order
from printery.runtime.payloads import PayloadStore
from printery.store import Redis
from printery.store.scan import append_entries, scan_stream
from printery.transport.streams import public_api
from printery.wire.envelope import correlation_of
from printery.wire.fields import REPLAY_FOR, TRACEPARENT
from printery.wire.keys import StreamKeys

__all__ = ["ReplayError", "ReplayResult", "find_entries", "replay", "rerun_steps", "scan_stream"]

_REF_PREFIX = "blob:"


@dataclass(frozen=True, slots=True)
class ReplayResult:
    """What was re-published: ``entries`` maps each new entry id to its stream;
    ``reruns`` names the steps that run again."""

    original_id: str
    new_id: str
    step: str | None
    entries: list[dict[str, str]]
    reruns: list[str] = dataclasses.field(default_factory=list)

    def as_dict(self) -> dict[str, Any]:
        return {"replay_of": self.original_id, "new_id": self.new_id,
                "from": self.step or "ingress", "reruns": self.reruns, "entries": self.entries}


def rerun_steps(pipeline: Pipeline, from_step: str) -> list[str]:
    """``from_step`` and every step downstream of it: those that consume what it, or a
    step downstream of it, produces. In pipeline order."""
    chosen = {from_step, *steps_reached(pipeline.steps.values(), pipeline.steps[from_step].produces)}
    return [name for name in pipeline.steps if name in chosen]


def _inputs(pipeline: Pipeline, steps: list[str]) -> dict[str, list[str]]:
    """Event type -> the re-run steps that read it, for every type a re-run step consumes
    and no re-run step produces: what the replay must supply from the original run."""
    rerun = set(steps)
    produced = {t for name in steps for t in pipeline.steps[name].produces}
    inputs: dict[str, list[str]] = {}
    for name in steps:
        for event_type in pipeline.steps[name].consumes:
            if event_type not in produced:
                inputs.setdefault(event_type, [])
    for event_type in inputs:
        inputs[event_type] = [g for g in pipeline.groups()[event_type] if g in rerun]
    return inputs


@public_api
async def replay(
    client: Redis,
    keys: StreamKeys,
    pipeline: Pipeline,
    correlation_id: str,
    from_step: str | None = None,
    new_id: str | None = None,
    *,
    producer: str = "printery-replay",
) -> ReplayResult:
    """Run ``correlation_id`` again under a new id, from the ingress or from ``from_step``.

    ``from_step`` None means the ingress: the first ingress entry of that id is copied and
    the whole pipeline runs again. For a step, only that step and the steps downstream of
    it (:func:`rerun_steps`) run again: the replay copies, for each event type they
    consume and none of them produces, the first entry of that id (what the step
    consumed, and for a join downstream the opening entry and the branches that are not
    re-run, taken as they were). A copy whose stream other steps read as well carries
    ``replay_for`` (the re-run steps among its readers); the others acknowledge it
    without running, so the siblings of ``from_step`` do not run again.

    The copies get the new id in the correlation field and in ``data`` (when ``data``
    carries it), a fresh event id and idempotency key, ``attempt`` 1 and ``replay_of``;
    they are written in one MULTI/EXEC. ``new_id`` defaults to ``<id>-r<n>``, the first
    ``n`` no entry of the pipeline uses yet.
    """
    field = pipeline.correlation_field
    if from_step is not None and from_step not in pipeline.steps:
        raise ReplayError(f"unknown step {from_step!r}; steps: {', '.join(pipeline.steps)}")
    fanned = next((m for m in pipeline.maps.values() if from_step in m.steps[1:]), None)
    if fanned is not None:  # one item's copy would leave its collector waiting for ever
        raise ReplayError(f"step {from_step!r} is part of map {fanned.name!r}, whose items run "
                          f"again together: replay --from {fanned.name} splits again")
    steps = list(pipeline.steps) if from_step is None else rerun_steps(pipeline, from_step)
    inputs = _inputs(pipeline, steps) if from_step is not None else {}
    originals: list[tuple[str, str, dict[str, str]]] = []
    source = keys.of(correlation_id)  # a run's entries are in its partition
    for event_type in pipeline.ingress if from_step is None else inputs:
        # An entry that never decoded (a producer's garbage naming the run) ran nothing:
        # what a step consumed is the first entry that did.
        found = [entry for entry in
                 await find_entries(client, source.stream(event_type), field, correlation_id)
                 if _decodes(entry[1])]
        if found:
            originals.append((event_type, *found[0]))
            if from_step is None:
                break
    consumed = pipeline.steps[from_step].consumes if from_step is not None else pipeline.ingress
    if not any(event_type in consumed for event_type, _, _ in originals):
        where = f"step {from_step!r}" if from_step else "the ingress"
        raise ReplayError(f"no entry of {field} {correlation_id!r} consumed by {where}")
    if new_id is not None:
        await _check_new_id(client, source, pipeline, new_id, originals if from_step is None else [])
    new_id = await _new_id(client, keys, pipeline, correlation_id, new_id)
    target = keys.of(new_id)  # the copies: one transaction in the new run's partition
    codec = pipeline.codec()
    groups = pipeline.groups()
    encoded: list[tuple[str, dict[str, str]]] = []
    for event_type, _entry_id, fields in sorted(originals, key=lambda o: id_order(o[1])):
        data = await _data(client, source, fields.get("data", "null"))
        if isinstance(data, dict) and field in data:
            data = {**data, field: new_id}
        extra = {"replay_of": correlation_id}
        if fields.get(TRACEPARENT):  # the copy's spans join the original's trace
            extra[TRACEPARENT] = fields[TRACEPARENT]
        readers = inputs.get(event_type)
        if readers is not None and set(groups[event_type]) != set(readers):
            extra[REPLAY_FOR] = ",".join(readers)
        envelope = codec.new(event_type, data, correlation_id=new_id, producer=producer, extra=extra)
        encoded.append((target.stream(event_type), codec.encode(envelope)))
    ids = await append_entries(client, encoded)
    entries = [{"stream": s, "id": str(i)} for (s, _), i in zip(encoded, ids, strict=True)]
    return ReplayResult(correlation_id, new_id, from_step, entries, steps)


async def _check_new_id(
    client: Redis, source: StreamKeys, pipeline: Pipeline, new_id: str,
    ingress: list[tuple[str, str, dict[str, str]]],
) -> None:
    """Refuse a ``new_id`` no submit could name a run (:meth:`Pipeline.run_id_reasons`,
    checked against the ``ingress`` entry's data when it is copied)."""
    if ingress:
        event_type, _entry_id, fields = ingress[0]
        data = await _data(client, source, fields.get("data", "null"))
        problem = next((r.message for r in pipeline.run_id_reasons(event_type, data, new_id)),
                       None)
    else:
        problem = run_id_problem(new_id)
    if problem is not None:
        raise InvalidReplayId(f"--as {new_id!r}: {problem}")


async def _new_id(
    client: Redis, keys: StreamKeys, pipeline: Pipeline, original: str,
    wanted: str | None,
) -> str:
    """``wanted`` if no entry uses it, else (when not given) the first free ``-r<n>``
    (looked for in every partition: each candidate may hash to another)."""
    field = pipeline.correlation_field
    used: set[str] = set()
    stem = wanted if wanted is not None else f"{original}-r"
    for event_type in pipeline.event_types():
        for part in keys.each():
            async for _i, fields in scan_stream(client, part.stream(event_type)):
                value = correlation_of(fields, field) or ""
                if value.startswith(stem):
                    used.add(value)
    if wanted is not None:
        if wanted in used:
            raise ReplayError(f"{field} {wanted!r} is already used; choose another --as")
        return wanted
    n = 1
    while f"{original}-r{n}" in used:
        n += 1
    return f"{original}-r{n}"


def _decodes(fields: Mapping[str, str]) -> bool:
    """Whether an entry's ``data`` is there and is JSON (what a step could consume)."""
    raw = fields.get("data")
    if raw is None:
        return False
    try:
        _json.loads(raw)
    except ValueError:
        return False
    return True


async def _data(client: Redis, keys: StreamKeys, raw: str) -> Any:
    """The entry's data, with a blob reference resolved (the copy must carry the id)."""
    try:
        return await PayloadStore(client, keys).resolved(_json.loads(raw))
    except BlobMissing as exc:
        raise ReplayError(f"the entry's payload has expired: {exc}") from None

