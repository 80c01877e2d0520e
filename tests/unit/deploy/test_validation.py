"""The validator's rules: a table of every reason code, and properties over random input."""

from __future__ import annotations

from typing import Any

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from printery.deploy.events import DeploymentRequest
from printery.deploy.validation import REASON_CODES, validate_request


def base(**changes: Any) -> dict[str, Any]:
    """A valid staging request, with ``changes`` applied (a value of ... deletes a key)."""
    request: dict[str, Any] = {
        "deployment_id": "dep-2026-0001",
        "service": "billing-api",
        "version": "1.4.2",
        "environment": "staging",
        "requested_by": "alice",
        "approved_by": "bob",
        "health_url": "http://127.0.0.1:8081/healthz",
        "dependencies": [
            {
                "service": "ledger",
                "health_url": "http://127.0.0.1:8082/healthz",
                "version": ">=2.0,<3",
            }
        ],
        "notify": ["webhook+http://127.0.0.1:9000/hooks/deploy", "log"],
    }
    for key, value in changes.items():
        if value is ...:
            request.pop(key, None)
        else:
            request[key] = value
    return request


def dep(service: str = "ledger", url: object = "http://127.0.0.1:8082/h", **more: Any) -> Any:
    return {"service": service, "health_url": url, **more}


CASES: list[tuple[str, object, list[tuple[str, str]]]] = [
    ("list payload", [1, 2], [("malformed_event", "")]),
    ("string payload", "hello", [("malformed_event", "")]),
    ("null payload", None, [("malformed_event", "")]),
    ("no service", base(service=...), [("missing_field", "service")]),
    ("null version", base(version=None), [("missing_field", "version")]),
    ("no environment", base(environment=...), [("missing_field", "environment")]),
    ("no requested_by", base(requested_by=...), [("missing_field", "requested_by")]),
    ("bad service", base(service="Billing_API"), [("invalid_field", "service")]),
    ("long service", base(service="a" * 64), [("invalid_field", "service")]),
    ("service newline", base(service="billing\n"), [("invalid_field", "service")]),
    ("bad deployment_id", base(deployment_id="dep 1"), [("invalid_field", "deployment_id")]),
    ("long deployment_id", base(deployment_id="d" * 129), [("invalid_field", "deployment_id")]),
    ("int version", base(version=142), [("invalid_field", "version")]),
    ("empty requested_by", base(requested_by="  "), [("invalid_field", "requested_by")]),
    ("int approved_by", base(approved_by=7), [("invalid_field", "approved_by")]),
    ("dependencies dict", base(dependencies={"a": 1}), [("invalid_field", "dependencies")]),
    (
        "dependency not object",
        base(dependencies=["ledger"]),
        [("invalid_field", "dependencies[0]")],
    ),
    ("notify string", base(notify="log"), [("invalid_field", "notify")]),
    ("notify non-string", base(notify=["log", 3]), [("invalid_field", "notify[1]")]),
    ("notify unknown kind", base(notify=["sms:+100"]), [("invalid_field", "notify[0]")]),
    ("notify bad webhook", base(notify=["webhook+ftp://x/y"]), [("invalid_url", "notify[0]")]),
    ("semver leading v", base(version="v1.4.2"), [("invalid_version", "version")]),
    ("semver two parts", base(version="1.4"), [("invalid_version", "version")]),
    ("semver leading zero", base(version="01.4.2"), [("invalid_version", "version")]),
    ("semver bad pre", base(version="1.4.2-"), [("invalid_version", "version")]),
    ("semver unicode digit", base(version="1.4.\u0662"), [("invalid_version", "version")]),
    ("environment", base(environment="prod"), [("unknown_environment", "environment")]),
    ("ftp health_url", base(health_url="ftp://x/y"), [("invalid_url", "health_url")]),
    ("hostless url", base(health_url="http:///healthz"), [("invalid_url", "health_url")]),
    ("relative url", base(health_url="/healthz"), [("invalid_url", "health_url")]),
    ("bad port", base(health_url="http://h:99999/"), [("invalid_url", "health_url")]),
    ("int url", base(health_url=80), [("invalid_field", "health_url")]),
    (
        "self approval",
        base(environment="production", approved_by="alice"),
        [("production_requires_approval", "approved_by")],
    ),
    (
        "duplicate",
        base(dependencies=[dep(), dep("other"), dep()]),
        [("duplicate_dependency", "dependencies[2].service")],
    ),
    (
        "bad constraint",
        base(dependencies=[dep(version="two-ish")]),
        [("invalid_version_constraint", "dependencies[0].version")],
    ),
    (
        "int constraint",
        base(dependencies=[dep(version=2)]),
        [("invalid_field", "dependencies[0].version")],
    ),
    (
        "dependency missing url",
        base(dependencies=[dep(), {"service": "cache"}]),
        [("missing_field", "dependencies[1].health_url")],
    ),
    (
        "dependency bad url",
        base(dependencies=[dep(), dep("cache", "gopher://x")]),
        [("invalid_url", "dependencies[1].health_url")],
    ),
    (
        "everything at once",
        {
            "service": "Bad",
            "version": "one",
            "environment": "moon",
            "health_url": "file:///x",
            "dependencies": [dep("a"), dep("a", version="=>1")],
        },
        [
            ("invalid_field", "service"),
            ("invalid_version", "version"),
            ("unknown_environment", "environment"),
            ("missing_field", "requested_by"),
            ("invalid_url", "health_url"),
            ("duplicate_dependency", "dependencies[1].service"),
            ("invalid_version_constraint", "dependencies[1].version"),
        ],
    ),
]


@pytest.mark.parametrize(("data", "expected"), [c[1:] for c in CASES], ids=[c[0] for c in CASES])
def test_reasons(data: object, expected: list[tuple[str, str]]) -> None:
    result = validate_request(data)
    assert result.request is None
    assert not result.needs_approval
    assert [(r.code, r.field) for r in result.reasons] == expected
    assert all(r.message for r in result.reasons)


def test_table_covers_every_code() -> None:
    assert {code for case in CASES for code, _ in case[2]} == REASON_CODES


def test_valid_request_is_normalized() -> None:
    data = base()
    result = validate_request(data)
    assert result.ok and result.reasons == [] and not result.needs_approval
    assert result.request == {**data, "dependencies": [{**data["dependencies"][0]}]}
    DeploymentRequest.model_validate(result.request)


def test_defaults_fill_every_key() -> None:
    minimal = {
        "service": "api",
        "version": "2.0.0-rc.1+b5",
        "environment": "development",
        "requested_by": "alice",
        "extra": "dropped",
    }
    result = validate_request(minimal, default_notify=("log", "webhook+https://h.example/x"))
    assert result.request == {
        "deployment_id": None,
        "service": "api",
        "version": "2.0.0-rc.1+b5",
        "environment": "development",
        "requested_by": "alice",
        "approved_by": None,
        "health_url": None,
        "dependencies": [],
        "notify": ["log", "webhook+https://h.example/x"],
    }


def test_dependency_version_is_optional_and_notify_deduplicated() -> None:
    result = validate_request(base(dependencies=[dep()], notify=["log", "log"]))
    assert result.request is not None
    assert result.request["dependencies"] == [
        {"service": "ledger", "health_url": "http://127.0.0.1:8082/h", "version": None}
    ]
    assert result.request["notify"] == ["log"]


def test_production_without_approver_waits_for_review() -> None:
    result = validate_request(base(environment="production", approved_by=...))
    assert result.ok and result.needs_approval
    assert result.request is not None and result.request["approved_by"] is None


def test_production_approved_by_someone_else_passes() -> None:
    result = validate_request(base(environment="production", approved_by="bob"))
    assert result.ok and not result.needs_approval


def test_approval_environments_are_configurable() -> None:
    waits = validate_request(base(approved_by=None), approval_required=("staging",))
    assert waits.needs_approval
    self_approved = validate_request(base(approved_by="alice"), approval_required=())
    assert self_approved.ok
    custom = validate_request(base(environment="qa"), known_environments=("qa",))
    assert custom.ok


# --- properties ------------------------------------------------------------------------

json_values = st.recursive(
    st.none() | st.booleans() | st.integers() | st.floats() | st.text(max_size=20),
    lambda children: (
        st.lists(children, max_size=4) | st.dictionaries(st.text(max_size=12), children, max_size=4)
    ),
    max_leaves=12,
)
field_values = json_values | st.sampled_from(
    ["", "log", "api", "1.0.0", "production", "http://h/x", "webhook+http://", ">=1"]
)
dependency_like = st.fixed_dictionaries(
    {}, optional={"service": field_values, "health_url": field_values, "version": field_values}
)
request_like = st.fixed_dictionaries(
    {},
    optional={
        key: field_values
        for key in (
            "deployment_id",
            "service",
            "version",
            "environment",
            "requested_by",
            "approved_by",
            "health_url",
        )
    }
    | {
        "dependencies": st.lists(dependency_like | json_values, max_size=3) | json_values,
        "notify": st.lists(field_values, max_size=3) | json_values,
    },
)


@pytest.mark.fuzz
@settings(max_examples=300, suppress_health_check=[HealthCheck.too_slow])
@given(json_values | request_like)
def test_random_input_never_raises(data: object) -> None:
    result = validate_request(data)
    if result.request is None:
        assert result.reasons, "a rejection must say why"
        assert {r.code for r in result.reasons} <= REASON_CODES
        assert not result.needs_approval
    else:
        assert result.reasons == []
        DeploymentRequest.model_validate(result.request)


names = st.from_regex(r"[a-z0-9][a-z0-9-]{0,20}", fullmatch=True)
numbers = st.integers(min_value=0, max_value=10**6).map(str)
versions = st.builds(
    lambda a, b, c, pre, build: f"{a}.{b}.{c}{pre}{build}",
    numbers,
    numbers,
    numbers,
    st.sampled_from(["", "-rc.1", "-alpha", "-0.3.7", "-x.7.z.92"]),
    st.sampled_from(["", "+build.5", "+exp.sha.5114f85"]),
)
urls = st.builds(
    lambda scheme, host, port, path: f"{scheme}://{host}{port}{path}",
    st.sampled_from(["http", "https"]),
    st.from_regex(r"[a-z][a-z0-9-]{0,15}(\.[a-z]{2,5})?", fullmatch=True) | st.just("127.0.0.1"),
    st.sampled_from(["", ":80", ":8081", ":65535"]),
    st.sampled_from(["", "/", "/healthz", "/a/b?x=1"]),
)
people = st.text(min_size=1, max_size=16).filter(lambda s: s.strip() != "")
constraints = st.sampled_from([None, ">=2.0,<3", "==1.4.*", "~=2.2", "!=1.0", ""])


@st.composite
def valid_requests(draw: st.DrawFn) -> dict[str, Any]:
    services = draw(st.lists(names, unique=True, max_size=4))
    requested_by = draw(people)
    request: dict[str, Any] = {
        "service": draw(names),
        "version": draw(versions),
        "environment": draw(st.sampled_from(["development", "staging", "production"])),
        "requested_by": requested_by,
        "approved_by": draw(st.none() | people.filter(lambda p: p != requested_by)),
        "health_url": draw(st.none() | urls),
        "dependencies": [
            {"service": s, "health_url": draw(urls), "version": draw(constraints)} for s in services
        ],
        "notify": draw(
            st.lists(st.sampled_from(["log", "webhook+https://hooks.example.com/d"]), unique=True)
        ),
    }
    if draw(st.booleans()):
        request["deployment_id"] = draw(st.from_regex(r"[A-Za-z0-9._:-]{1,40}", fullmatch=True))
    return request


@pytest.mark.fuzz
@settings(max_examples=200, suppress_health_check=[HealthCheck.too_slow])
@given(valid_requests())
def test_random_valid_requests_pass(data: dict[str, Any]) -> None:
    result = validate_request(data)
    assert result.reasons == []
    assert result.request == {"deployment_id": None, **data}
    assert result.needs_approval == (
        data["environment"] == "production" and data["approved_by"] is None
    )


def test_a_bare_string_is_one_environment_not_its_substrings() -> None:
    result = validate_request(
        base(environment="production", approved_by=...), approval_required="production"
    )
    assert result.needs_approval
    assert validate_request(base(environment="staging"), known_environments="staging-x").reasons
