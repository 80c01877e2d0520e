"""The validator's rules for a deployment request (docs/reference.md, The deployment
pipeline), as one pure function.

Pure so that it can be tested exhaustively and reused (``printery emit`` can check a
request before publishing it). It never raises on bad input: whatever a producer sends,
the answer is either a normalized request or a list of every reason it was refused,
so the producer can fix everything in one round trip.
"""

from __future__ import annotations

import re
from collections.abc import Collection
from dataclasses import dataclass, field
from typing import Any

from packaging.specifiers import InvalidSpecifier, SpecifierSet

from printery import Reason
from printery.deploy.delivery import WEBHOOK_PREFIX, parse_channel, url_problem

# The stable reason codes of the validator; callers branch on them.
MALFORMED_EVENT = "malformed_event"
MISSING_FIELD = "missing_field"
INVALID_FIELD = "invalid_field"
INVALID_VERSION = "invalid_version"
UNKNOWN_ENVIRONMENT = "unknown_environment"
INVALID_URL = "invalid_url"
PRODUCTION_REQUIRES_APPROVAL = "production_requires_approval"
DUPLICATE_DEPENDENCY = "duplicate_dependency"
INVALID_VERSION_CONSTRAINT = "invalid_version_constraint"

REASON_CODES: frozenset[str] = frozenset(
    {
        MALFORMED_EVENT,
        MISSING_FIELD,
        INVALID_FIELD,
        INVALID_VERSION,
        UNKNOWN_ENVIRONMENT,
        INVALID_URL,
        PRODUCTION_REQUIRES_APPROVAL,
        DUPLICATE_DEPENDENCY,
        INVALID_VERSION_CONSTRAINT,
    }
)

DEFAULT_ENVIRONMENTS: tuple[str, ...] = ("development", "staging", "production")

# Patterns are matched with fullmatch and explicit ASCII classes: `$` would accept a
# trailing newline and `\d` would accept non-ASCII digits.
DEPLOYMENT_ID_RE = re.compile(r"[A-Za-z0-9._:-]{1,128}")
SERVICE_RE = re.compile(r"[a-z0-9][a-z0-9-]{0,62}")
# The regular expression published with Semantic Versioning 2.0.0.
_NUM = r"(?:0|[1-9][0-9]*)"
_PRE_ID = r"(?:0|[1-9][0-9]*|[0-9]*[a-zA-Z-][0-9a-zA-Z-]*)"
SEMVER_RE = re.compile(
    rf"{_NUM}\.{_NUM}\.{_NUM}"
    rf"(?:-{_PRE_ID}(?:\.{_PRE_ID})*)?"
    r"(?:\+[0-9a-zA-Z-]+(?:\.[0-9a-zA-Z-]+)*)?"
)


@dataclass(frozen=True, slots=True)
class Validation:
    """The validator's verdict.

    ``request`` is the normalized request when there are no ``reasons`` (else None).
    ``needs_approval`` is True for a valid request that must wait for a human on the
    ``review`` stream: an approval-requiring environment and no ``approved_by``.
    """

    request: dict[str, Any] | None
    reasons: list[Reason] = field(default_factory=list)
    needs_approval: bool = False

    @property
    def ok(self) -> bool:
        """True when the request passed (it may still need approval)."""
        return not self.reasons


class _Collector:
    """Gathers reasons so every rule runs and all problems are reported at once."""

    def __init__(self) -> None:
        self.reasons: list[Reason] = []

    def add(self, code: str, path: str, message: str) -> None:
        self.reasons.append(Reason(code=code, field=path, message=message))

    def string(self, data: dict[str, Any], key: str, path: str, *, required: bool) -> str | None:
        """The non-empty string at ``key``; None (with a reason when it matters) otherwise.

        An explicit null counts as absent, as producers commonly write optional keys so.
        """
        value = data.get(key)
        if value is None:
            if required:
                self.add(MISSING_FIELD, path, f"{path} is required")
            return None
        if not isinstance(value, str):
            self.add(INVALID_FIELD, path, f"{path} must be a string, not {_kind(value)}")
            return None
        if not value.strip():
            self.add(INVALID_FIELD, path, f"{path} must not be empty")
            return None
        return value

    def pattern(self, value: str | None, path: str, pattern: re.Pattern[str], desc: str) -> None:
        if value is not None and not pattern.fullmatch(value):
            self.add(INVALID_FIELD, path, f"{path} must match {desc}, got {_show(value)}")

    def url(self, value: str | None, path: str) -> None:
        problem = url_problem(value) if value is not None else None
        if problem is not None:
            self.add(INVALID_URL, path, f"{path} {problem}")


def validate_request(
    data: object,
    *,
    approval_required: Collection[str] = ("production",),
    known_environments: Collection[str] = DEFAULT_ENVIRONMENTS,
    default_notify: Collection[str] = ("log",),
) -> Validation:
    """Check a ``deployment:started`` payload and normalize it (docs/reference.md, The
    deployment pipeline).

    ``data`` is the decoded JSON, of any type. Every rule runs and every problem becomes
    a :class:`~printery.Reason` with a stable code and a field path such as
    ``dependencies[1].health_url``. The normalized request has every key of a request
    (docs/reference.md, The deployment pipeline): absent optional values are None,
    ``dependencies`` defaults to ``[]`` and ``notify`` to ``default_notify`` (the
    notifier's default channels); ``deployment_id`` is kept when given and None otherwise
    (the validator fills it from the entry). Unknown keys are dropped; duplicate channels
    in ``notify`` are kept once, in order.
    """
    if not isinstance(data, dict):
        reason = Reason(
            code=MALFORMED_EVENT,
            field="",
            message=f"the request must be a JSON object, not {_kind(data)}",
        )
        return Validation(request=None, reasons=[reason])

    # A bare string is a Collection[str] too, and `in` would then match substrings.
    approval_required = _names(approval_required)
    known_environments = _names(known_environments)
    check = _Collector()
    deployment_id = check.string(data, "deployment_id", "deployment_id", required=False)
    check.pattern(deployment_id, "deployment_id", DEPLOYMENT_ID_RE, "[A-Za-z0-9._:-]{1,128}")
    service = check.string(data, "service", "service", required=True)
    check.pattern(service, "service", SERVICE_RE, "[a-z0-9][a-z0-9-]{0,62}")

    version = check.string(data, "version", "version", required=True)
    if version is not None and not SEMVER_RE.fullmatch(version):
        check.add(INVALID_VERSION, "version", f"version {_show(version)} is not semver 2.0")

    environment = check.string(data, "environment", "environment", required=True)
    if environment is not None and environment not in known_environments:
        check.add(
            UNKNOWN_ENVIRONMENT,
            "environment",
            f"environment {_show(environment)} is not one of {', '.join(known_environments)}",
        )

    requested_by = check.string(data, "requested_by", "requested_by", required=True)
    approved_by = check.string(data, "approved_by", "approved_by", required=False)
    if approved_by is not None and approved_by == requested_by and environment in approval_required:
        check.add(
            PRODUCTION_REQUIRES_APPROVAL,
            "approved_by",
            f"{environment} requires approval by someone other than the requester",
        )

    health_url = check.string(data, "health_url", "health_url", required=False)
    check.url(health_url, "health_url")
    dependencies = _dependencies(check, data.get("dependencies"))
    notify = _notify(check, data.get("notify"), default_notify)

    if check.reasons:
        return Validation(request=None, reasons=check.reasons)
    request: dict[str, Any] = {
        "deployment_id": deployment_id,
        "service": service,
        "version": version,
        "environment": environment,
        "requested_by": requested_by,
        "approved_by": approved_by,
        "health_url": health_url,
        "dependencies": dependencies,
        "notify": notify,
    }
    needs_approval = environment in approval_required and approved_by is None
    return Validation(request=request, reasons=[], needs_approval=needs_approval)


def _dependencies(check: _Collector, value: object) -> list[dict[str, Any]]:
    """Normalized dependencies; reasons for each bad entry and each repeated service."""
    if value is None:
        return []
    if not isinstance(value, list):
        check.add(INVALID_FIELD, "dependencies", f"dependencies must be a list, not {_kind(value)}")
        return []
    result: list[dict[str, Any]] = []
    seen: dict[str, int] = {}
    for index, item in enumerate(value):
        path = f"dependencies[{index}]"
        if not isinstance(item, dict):
            check.add(INVALID_FIELD, path, f"{path} must be an object, not {_kind(item)}")
            continue
        service = check.string(item, "service", f"{path}.service", required=True)
        check.pattern(service, f"{path}.service", SERVICE_RE, "[a-z0-9][a-z0-9-]{0,62}")
        if service is not None:
            if service in seen:
                first = f"dependencies[{seen[service]}]"
                check.add(
                    DUPLICATE_DEPENDENCY,
                    f"{path}.service",
                    f"dependency {_show(service)} is already listed at {first}",
                )
            else:
                seen[service] = index
        health_url = check.string(item, "health_url", f"{path}.health_url", required=True)
        check.url(health_url, f"{path}.health_url")
        constraint = _constraint(check, item.get("version"), f"{path}.version")
        result.append({"service": service, "health_url": health_url, "version": constraint})
    return result


def _constraint(check: _Collector, value: object, path: str) -> str | None:
    """A PEP 440 specifier set such as ``>=2.0,<3``; None means any version."""
    if value is None:
        return None
    if not isinstance(value, str):
        check.add(INVALID_FIELD, path, f"{path} must be a string, not {_kind(value)}")
        return None
    try:
        SpecifierSet(value)
    except InvalidSpecifier:
        check.add(
            INVALID_VERSION_CONSTRAINT,
            path,
            f"{path} {_show(value)} is not a PEP 440 specifier set (e.g. '>=2.0,<3')",
        )
        return None
    return value


def _notify(check: _Collector, value: object, default: Collection[str]) -> list[str]:
    """The channels to notify, checked now so a typo is refused before anything runs."""
    if value is None:
        return list(default)
    if not isinstance(value, list):
        check.add(INVALID_FIELD, "notify", f"notify must be a list of strings, not {_kind(value)}")
        return []
    channels: list[str] = []
    for index, channel in enumerate(value):
        path = f"notify[{index}]"
        if not isinstance(channel, str):
            check.add(INVALID_FIELD, path, f"{path} must be a string, not {_kind(channel)}")
            continue
        try:
            parse_channel(channel)
        except ValueError as exc:
            url_bad = channel.startswith(WEBHOOK_PREFIX)
            check.add(INVALID_URL if url_bad else INVALID_FIELD, path, f"{path}: {exc}")
            continue
        if channel not in channels:
            channels.append(channel)
    return channels


def _names(names: Collection[str]) -> Collection[str]:
    return (names,) if isinstance(names, str) else names


def _kind(value: object) -> str:
    """The JSON name of a value's type, for messages a producer (not a Pythonista) reads."""
    if value is None:
        return "null"
    if isinstance(value, bool):
        return "a boolean"
    if isinstance(value, int | float):
        return "a number"
    if isinstance(value, str):
        return "a string"
    if isinstance(value, list):
        return "a list"
    if isinstance(value, dict):
        return "an object"
    return type(value).__name__


def _show(value: str, limit: int = 80) -> str:
    """A value quoted for a message, cut short so one huge field cannot bloat the event."""
    shown = value if len(value) <= limit else value[:limit] + "..."
    return repr(shown)
