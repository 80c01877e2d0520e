"""One failure classification (reference: failures): the runtime, a Loop and escalate
decide by :func:`printery.runtime.failures.kind_of`, most specific first."""

import asyncio

import pytest

from printery.base.errors import ProviderDown, QuotaExhausted, Reject, Retry, StepTimeout, WorkerCrashed
from printery.runtime import failures
from printery.runtime.failures import kind_of


@pytest.mark.parametrize(("failure", "kind"), [
    (WorkerCrashed("on purpose"), failures.CRASH),
    (QuotaExhausted("gone"), failures.QUOTA),  # a Reject, but asking again will not help
    (Reject("bad_input"), failures.REJECTED),
    (ProviderDown("open", delay=1.0), failures.DOWN),  # a Retry, but the fallback may run now
    (StepTimeout("past its timeout"), failures.TIMEOUT_KIND),
    (Retry(delay=1.0), failures.ERROR),
    (ValueError("a bug"), failures.ERROR),
    (TimeoutError("a socket's"), failures.ERROR),  # user code's own, not the step's timeout
    (SystemExit(3), failures.ERROR),
    (KeyboardInterrupt(), failures.ERROR),
    (asyncio.CancelledError(), failures.STOP),
    (GeneratorExit(), failures.STOP),
])
def test_each_failure_has_one_kind(failure: BaseException, kind: str) -> None:
    assert kind_of(failure) == kind
