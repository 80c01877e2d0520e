"""The aggregator's merge policy: one ``deployment:finished`` from the steps' outputs.

Pure, so the policy (docs/reference.md, The deployment pipeline) is testable as a table
and the aggregator worker only has to collect step outputs and decide when a branch has
missed its deadline. All steps must pass; the status is the worst outcome by the
precedence rejected > blocked > unhealthy > failed > succeeded.
"""

from __future__ import annotations

from typing import Any

from printery import Reason
from printery.deploy.events import DEPENDENCY_CHECKER, HEALTH_MONITOR, VALIDATOR, Finished

DEPENDENCY_UNHEALTHY = "dependency_unhealthy"
DEPENDENCY_UNREACHABLE = "dependency_unreachable"
DEPENDENCY_VERSION_MISMATCH = "dependency_version_mismatch"
SERVICE_UNHEALTHY = "service_unhealthy"
BRANCH_TIMEOUT = "branch_timeout"

_DEPENDENCY_CODES = {
    "unreachable": DEPENDENCY_UNREACHABLE,
    "version_mismatch": DEPENDENCY_VERSION_MISMATCH,
}


def merge_outcome(
    deployment_id: str | None,
    steps: dict[str, dict[str, Any]],
    *,
    rejected: dict[str, Any] | None,
    missing: list[str],
) -> dict[str, Any]:
    """The ``deployment:finished`` data for one deployment.

    ``steps`` maps worker names to the output data that arrived; ``rejected`` is the
    ``deployment:rejected`` data if the request was refused; ``missing`` names the steps
    whose output did not arrive by their deadline (a name also in ``steps`` did arrive
    and is ignored).

    A rejection stands alone: its reasons are the validator's, and no branch ran, so
    ``missing`` is ignored and the rejection is kept as the validator's step output.
    Otherwise the reasons of every failed check are listed, worst first: one per failing
    dependency (``dependencies[i]``, i its index in the results), ``service_unhealthy``
    for a health watch that ended unhealthy, ``branch_timeout`` per missing step. Outputs
    that are malformed or carry an unknown status fail closed, as the failure of that
    step: nothing passes that has not positively passed.
    """
    steps = dict(steps)
    if rejected is not None:
        steps.setdefault(VALIDATOR, rejected)
        reasons = [_reason(item) for item in _as_list(rejected.get("reasons"))]
        return _finished(deployment_id, "rejected", reasons, steps)

    blocked = _dependency_reasons(steps.get(DEPENDENCY_CHECKER))
    unhealthy = _health_reasons(steps.get(HEALTH_MONITOR))
    timed_out = [
        Reason(code=BRANCH_TIMEOUT, field=step, message=f"{step} did not answer in time")
        for step in dict.fromkeys(missing)
        if step not in steps
    ]
    if blocked:
        status = "blocked"
    elif unhealthy:
        status = "unhealthy"
    elif timed_out:
        status = "failed"
    else:
        status = "succeeded"
    return _finished(deployment_id, status, [*blocked, *unhealthy, *timed_out], steps)


def _dependency_reasons(output: dict[str, Any] | None) -> list[Reason]:
    """One reason per dependency that is not healthy; none when the step is absent."""
    if output is None:
        return []
    reasons: list[Reason] = []
    for index, result in enumerate(_as_list(output.get("results"))):
        status = result.get("status") if isinstance(result, dict) else None
        if status == "healthy":
            continue
        result = result if isinstance(result, dict) else {}
        service = result.get("service", "?")
        detail = result.get("detail") or status or "no result"
        reasons.append(
            Reason(
                code=_DEPENDENCY_CODES.get(str(status), DEPENDENCY_UNHEALTHY),
                field=f"dependencies[{index}]",
                message=f"dependency {service} is {status or 'unknown'}: {detail}",
            )
        )
    if not reasons and output.get("status") != "ok":
        # Blocked (or garbled) without a failing result to point at: still not a pass.
        reasons.append(
            Reason(
                code=DEPENDENCY_UNHEALTHY,
                field="dependencies",
                message=f"dependency check reported {output.get('status')!r}",
            )
        )
    return reasons


def _health_reasons(output: dict[str, Any] | None) -> list[Reason]:
    """``service_unhealthy`` unless the watch ended healthy or was skipped."""
    if output is None or output.get("status") in ("healthy", "skipped"):
        return []
    detail = output.get("detail") or f"health check reported {output.get('status')!r}"
    return [Reason(code=SERVICE_UNHEALTHY, field="health_url", message=str(detail))]


def _reason(item: object) -> Reason:
    """A Reason from a rejection's reason, tolerating one that is not a proper object."""
    if isinstance(item, Reason):
        return item
    if isinstance(item, dict):
        return Reason(
            code=str(item.get("code", "")),
            field=str(item.get("field", "")),
            message=str(item.get("message", "")),
        )
    return Reason(code="rejected", field="", message=str(item))


def _as_list(value: object) -> list[Any]:
    return value if isinstance(value, list) else []


def _finished(
    deployment_id: str | None, status: str, reasons: list[Reason], steps: dict[str, Any]
) -> dict[str, Any]:
    return Finished.model_validate(
        {"deployment_id": deployment_id, "status": status, "reasons": reasons, "steps": steps}
    ).model_dump(mode="json")
