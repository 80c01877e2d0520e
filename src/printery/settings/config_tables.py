"""The settings tables: the base of every TOML table, and the framework's own tables.

:class:`SettingsTable` is what a table must be, the framework's and an application's
alike (unknown keys are errors, values immutable, no boolean for a number); the
framework's tables are ``[transport]``, ``[workers.<name>]``, ``[review.<kind>]`` and
``[telemetry]``. They live apart from :mod:`printery.settings.config`, which holds the top-level
:class:`~printery.settings.config.Settings` (they are its fields) and what an application adds,
so each module stays one job and one size; every name here is also importable from
:mod:`printery.settings.config`.
"""

from __future__ import annotations

import types
from typing import Annotated, Any, Union, get_args, get_origin
from urllib.parse import urlsplit

from pydantic import BaseModel, ConfigDict, Field, ValidationInfo, field_validator
from pydantic_core import PydanticCustomError

from printery.wire.keys import MAX_PARTITIONS

__all__ = [
    "ReviewSettings",
    "SettingsTable",
    "TelemetrySettings",
    "TransportSettings",
    "WorkerSettings",
    "not_allowed",
]


def not_allowed(allowed: str) -> PydanticCustomError:
    """The error of a value a validator refuses: ``allowed`` says what is allowed, and is
    the message template of the one-line :class:`~printery.base.errors.ConfigError`."""
    return PydanticCustomError("printery", "{allowed}", {"allowed": allowed})


def _numeric(annotation: Any) -> bool:
    """Whether a field holds a number (``int``, ``float``, optional or not)."""
    origin, args = get_origin(annotation), get_args(annotation)
    if origin is Annotated:
        return _numeric(args[0])
    if origin in (Union, types.UnionType):
        return any(_numeric(arg) for arg in args)
    return annotation in (int, float)


class SettingsTable(BaseModel):
    """Base of every settings table, the framework's and applications' alike.

    Unknown keys are errors, instances are immutable, and a boolean where a number
    belongs is refused (pydantic would read TOML's ``true`` as 1), as are inf and nan.
    """

    model_config = ConfigDict(extra="forbid", frozen=True, allow_inf_nan=False)

    @field_validator("*", mode="before")
    @classmethod
    def _no_bool_for_numbers(cls, value: object, info: ValidationInfo) -> object:
        if isinstance(value, bool) and info.field_name is not None:
            found = cls.model_fields.get(info.field_name)
            if found is not None and _numeric(found.annotation):
                # Not `not_allowed`: the field's own description ("an integer >= 0") says it better.
                raise PydanticCustomError("bool_not_number", "a number, not true or false")
        return value


class TransportSettings(SettingsTable):
    """``[transport]``: delivery limits shared by every stream worker (docs/reference.md,
    Failures; Streams and entries)."""

    max_deliveries: int = Field(default=5, ge=1)
    visibility_timeout: float = Field(default=60.0, gt=0)
    payload_limit_bytes: int = Field(default=1_048_576, ge=1)
    inline_limit_bytes: int = Field(default=65_536, ge=1)
    blob_ttl: int = Field(default=604_800, ge=1)
    #: Seconds an entry that every group has acknowledged stays in its stream (for
    #: ``trace``, ``replay`` and ``cost``); 0 keeps everything. Unacknowledged and unread
    #: entries are never trimmed, nor are ``dlq``, ``review`` and ``review:decided``.
    retention: float = Field(default=604_800.0, ge=0)
    #: Seconds between retention sweeps.
    retention_interval: float = Field(default=60.0, gt=0)
    #: Seconds between sweeps for messages of dead consumers; unset: a quarter of the
    #: visibility timeout (at least 50 ms, at most 5 s), so an orphan waits at most about
    #: 1.25 timeouts.
    claim_interval: float | None = Field(default=None, gt=0)
    #: Partitions of every stream (docs/reference.md, Partitions):
    #: ``<prefix>:{p<k>}:<event type>``, a run in partition ``crc32(correlation id) %
    #: partitions``; 1 keeps the unpartitioned keys. Unset: the count recorded in
    #: ``<prefix>:layout`` (:mod:`printery.store.partitions`), or on the very first start 3 x the
    #: master count on a cluster, 1 on one server; a setting that disagrees with the
    #: record is refused.
    partitions: int | None = Field(default=None, ge=1, le=MAX_PARTITIONS)
    #: Seconds an acknowledged submit (``Client.submit``, ``POST /v1/runs``, ``printery
    #: emit``) waits for a replica to have it (``WAIT 1``) when the master it was written
    #: to has one, so a failover cannot lose it; 0 turns the wait off.
    submit_wait: float = Field(default=1.0, ge=0)
    #: Seconds a handler call cancelled at its timeout may take to end before it is given
    #: up on (docs/reference.md, Failures): its entry fails, the step goes on.
    abandon_after: float = Field(default=5.0, gt=0)


class WorkerSettings(SettingsTable):
    """``[workers.<name>]``; unset values fall back to the pipeline's own (its steps')."""

    concurrency: int | None = Field(default=None, ge=1)
    #: Entries fetched per read (``XREADGROUP COUNT``).
    prefetch: int | None = Field(default=None, ge=1)
    #: Seconds one handler call may run before it is cancelled (reference: failures); unset:
    #: the step's own ``timeout``, else 300.
    timeout: float | None = Field(default=None, gt=0)


class ReviewSettings(SettingsTable):
    """``[review.<kind>]``: how long a review of that kind may wait for a decision."""

    #: Seconds after which an undecided review is rejected with ``by`` = ``timeout``
    #: (docs/reference.md, Review inbox); unset: it waits for ever.
    timeout: float | None = Field(default=None, gt=0)


class ConsoleSettings(SettingsTable):
    """``[console]``: the web console's sessions (docs/reference.md, The web console)."""

    #: Seconds a login to the console lasts; then the token is asked for again. Logging
    #: out ends a session sooner, for every process.
    session_ttl: float = Field(default=43200.0, gt=0)


class TelemetrySettings(SettingsTable):
    """``[telemetry]``: OpenTelemetry traces (docs/reference.md, Tracing,
    :mod:`printery.observe.telemetry`)."""

    #: Base URL of an OTLP/HTTP collector (``/v1/traces`` is added, as for
    #: ``OTEL_EXPORTER_OTLP_ENDPOINT``); unset: that env var decides, and without it
    #: tracing is off.
    otlp_endpoint: str | None = None

    @field_validator("otlp_endpoint")
    @classmethod
    def _otlp_endpoint(cls, value: str | None) -> str | None:
        if value is None:
            return None
        parts = urlsplit(value.strip())
        if parts.scheme not in ("http", "https") or not parts.netloc:
            raise not_allowed("an http:// or https:// URL of an OTLP/HTTP collector, or unset")
        return value.strip()
