"""The merge policy as a table: precedence rejected > blocked > unhealthy > failed > succeeded."""

from __future__ import annotations

from typing import Any

import pytest

from printery.deploy.merge import merge_outcome

VALIDATED: dict[str, Any] = {"deployment_id": "d", "service": "api", "version": "1.0.0"}


def deps(*statuses: str) -> dict[str, Any]:
    return {
        "deployment_id": "d",
        "status": "ok" if all(s == "healthy" for s in statuses) else "blocked",
        "results": [
            {"service": f"s{i}", "status": s, "detail": f"detail {i}", "latency_ms": 1.0}
            for i, s in enumerate(statuses)
        ],
    }


def health(status: str) -> dict[str, Any]:
    return {
        "deployment_id": "d",
        "status": status,
        "probes": 3,
        "consecutive_successes": 3 if status == "healthy" else 0,
        "last_status_code": 200 if status == "healthy" else 503,
        "detail": f"watch {status}",
    }


REJECTED: dict[str, Any] = {
    "deployment_id": "d",
    "reasons": [{"code": "invalid_version", "field": "version", "message": "not semver"}],
    "request": {"version": "x"},
}

V, D, H = "validator", "dependency-checker", "health-monitor"

CASES: list[
    tuple[str, dict[str, Any], dict[str, Any] | None, list[str], str, list[tuple[str, str]]]
] = [
    (
        "all pass",
        {V: VALIDATED, D: deps("healthy"), H: health("healthy")},
        None,
        [],
        "succeeded",
        [],
    ),
    (
        "no deps, health skipped",
        {V: VALIDATED, D: deps(), H: health("skipped")},
        None,
        [],
        "succeeded",
        [],
    ),
    ("rejected", {}, REJECTED, [], "rejected", [("invalid_version", "version")]),
    (
        "rejected ignores missing",
        {},
        REJECTED,
        [D, H],
        "rejected",
        [("invalid_version", "version")],
    ),
    (
        "blocked, one reason per failing dependency",
        {
            V: VALIDATED,
            D: deps("healthy", "unreachable", "version_mismatch", "unhealthy"),
            H: health("healthy"),
        },
        None,
        [],
        "blocked",
        [
            ("dependency_unreachable", "dependencies[1]"),
            ("dependency_version_mismatch", "dependencies[2]"),
            ("dependency_unhealthy", "dependencies[3]"),
        ],
    ),
    (
        "blocked beats unhealthy",
        {V: VALIDATED, D: deps("unhealthy"), H: health("unhealthy")},
        None,
        [],
        "blocked",
        [("dependency_unhealthy", "dependencies[0]"), ("service_unhealthy", "health_url")],
    ),
    (
        "unhealthy",
        {V: VALIDATED, D: deps("healthy"), H: health("unhealthy")},
        None,
        [],
        "unhealthy",
        [("service_unhealthy", "health_url")],
    ),
    (
        "unhealthy beats failed",
        {V: VALIDATED, H: health("unhealthy")},
        None,
        [D],
        "unhealthy",
        [("service_unhealthy", "health_url"), ("branch_timeout", D)],
    ),
    (
        "blocked beats failed",
        {V: VALIDATED, D: deps("unreachable")},
        None,
        [H],
        "blocked",
        [("dependency_unreachable", "dependencies[0]"), ("branch_timeout", H)],
    ),
    (
        "health branch missing",
        {V: VALIDATED, D: deps("healthy")},
        None,
        [H],
        "failed",
        [("branch_timeout", H)],
    ),
    (
        "both branches missing",
        {V: VALIDATED},
        None,
        [D, H],
        "failed",
        [("branch_timeout", D), ("branch_timeout", H)],
    ),
    (
        "arrived step is not missing",
        {V: VALIDATED, D: deps("healthy"), H: health("healthy")},
        None,
        [H],
        "succeeded",
        [],
    ),
    (
        "unknown health status fails closed",
        {V: VALIDATED, D: deps(), H: health("bogus")},
        None,
        [],
        "unhealthy",
        [("service_unhealthy", "health_url")],
    ),
    (
        "blocked without results fails closed",
        {
            V: VALIDATED,
            D: {"deployment_id": "d", "status": "blocked", "results": []},
            H: health("healthy"),
        },
        None,
        [],
        "blocked",
        [("dependency_unhealthy", "dependencies")],
    ),
]


@pytest.mark.parametrize(
    ("steps", "rejected", "missing", "status", "reasons"),
    [c[1:] for c in CASES],
    ids=[c[0] for c in CASES],
)
def test_merge(
    steps: dict[str, Any],
    rejected: dict[str, Any] | None,
    missing: list[str],
    status: str,
    reasons: list[tuple[str, str]],
) -> None:
    finished = merge_outcome("d", steps, rejected=rejected, missing=missing)
    assert finished["deployment_id"] == "d"
    assert finished["status"] == status
    assert [(r["code"], r["field"]) for r in finished["reasons"]] == reasons
    assert all(set(r) == {"code", "field", "message"} for r in finished["reasons"])
    expected_steps = dict(steps)
    if rejected is not None:
        expected_steps.setdefault(V, rejected)
    assert finished["steps"] == expected_steps


def test_merge_does_not_mutate_its_input() -> None:
    steps: dict[str, dict[str, Any]] = {}
    merge_outcome("d", steps, rejected=REJECTED, missing=[])
    assert steps == {}


def test_dependency_reason_names_the_service() -> None:
    finished = merge_outcome(
        "d", {D: deps("healthy", "unreachable"), H: health("healthy")}, rejected=None, missing=[]
    )
    assert "s1" in finished["reasons"][0]["message"]
    assert "detail 1" in finished["reasons"][0]["message"]
