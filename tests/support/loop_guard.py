"""A pytest plugin: an unobserved exception in an event loop fails the test it happened in.

asyncio reports what nobody observed through ``loop.call_exception_handler``: a task
whose exception was never retrieved (at garbage collection), a future likewise, an
exception in a callback, a task destroyed while pending, an error while shutting a loop
down. By default that is one log line and the test passes. This plugin installs a
handler on every event loop created in the test process (pytest-asyncio's loops, which
come from the event loop policy, and ``asyncio.run`` in a sync test or a thread), records
each context against the running test, forces ``gc.collect()`` at the end of the test's
teardown (after its loop is closed) so abandoned tasks are finalized while it is still
attributable, and fails the test with the list. Whatever arrives outside a test fails the
session.

Loaded by ``tests/conftest.py``; other runs load it with ``-p support.loop_guard``. A test
that provokes such reports on purpose says so with
``@pytest.mark.allow_loop_exceptions("why")``; it can read them with the
``loop_exceptions`` fixture (``loop_exceptions.reports()``). Subprocess services are not covered: they are checked by
their own logs and exit codes.
"""

from __future__ import annotations

import asyncio
import gc
import threading
import traceback
import warnings
import weakref
from collections.abc import Generator
from dataclasses import dataclass
from typing import Any

import pytest

MARKER = "allow_loop_exceptions"
TRACEBACK_LINES = 40


@dataclass(frozen=True, slots=True)
class LoopReport:
    """One context passed to ``call_exception_handler``, with where it was seen."""

    context: dict[str, Any]
    thread: str
    loop_created_in: str | None
    reported_in: str | None

    @property
    def message(self) -> str:
        return str(self.context.get("message") or "unhandled exception in event loop")

    @property
    def exception(self) -> BaseException | None:
        exc = self.context.get("exception")
        return exc if isinstance(exc, BaseException) else None

    def describe(self) -> str:
        lines = [f"{self.message} (thread {self.thread})"]
        exc = self.exception
        if exc is not None:
            lines[0] += f": {type(exc).__qualname__}: {exc}"
        for key in ("task", "future", "handle", "transport", "protocol", "asyncgen"):
            if key in self.context:
                lines.append(f"  {key}: {_short(repr(self.context[key]))}")
        if self.loop_created_in != self.reported_in:
            lines.append(f"  loop created during: {self.loop_created_in}")
        if exc is not None:
            text = "".join(traceback.format_exception(exc)).rstrip().splitlines()
            if len(text) > TRACEBACK_LINES:
                text = [text[0], f"  ... {len(text) - TRACEBACK_LINES + 1} lines ...",
                        *text[-(TRACEBACK_LINES - 2):]]
            lines.extend("  | " + line for line in text)
        return "\n".join(lines)


def _short(text: str, limit: int = 300) -> str:
    return text if len(text) <= limit else text[: limit - 3] + "..."


class LoopGuard:
    """Collects the reports of every guarded loop; the running test's are drained at its end."""

    def __init__(self) -> None:
        self.current: str | None = None
        self.created = 0
        self.loops: weakref.WeakSet[asyncio.AbstractEventLoop] = weakref.WeakSet()
        self._reports: list[LoopReport] = []
        self._lock = threading.Lock()

    def install(self, loop: asyncio.AbstractEventLoop) -> None:
        created_in = self.current
        with self._lock:  # loops are made in threads too
            self.created += 1
            self.loops.add(loop)

        def handler(loop: asyncio.AbstractEventLoop, context: dict[str, Any]) -> None:
            report = LoopReport(
                dict(context), threading.current_thread().name, created_in, self.current
            )
            with self._lock:
                self._reports.append(report)
            loop.default_exception_handler(context)  # still logged, as before

        loop.set_exception_handler(handler)

    def had_loops(self, created_before: int) -> bool:
        """Whether a loop was created since the count was ``created_before``, or is open."""
        return self.created != created_before or any(not loop.is_closed() for loop in list(self.loops))

    def drain(self) -> list[LoopReport]:
        with self._lock:
            reports, self._reports = self._reports, []
        return reports


with warnings.catch_warnings():  # the policy API is deprecated from Python 3.14
    warnings.simplefilter("ignore", DeprecationWarning)
    _DefaultPolicy: type[asyncio.AbstractEventLoopPolicy] = asyncio.DefaultEventLoopPolicy


class GuardedPolicy(_DefaultPolicy):  # type: ignore[valid-type,misc]
    """The default policy, but every new loop reports to the guard."""

    def __init__(self, guard: LoopGuard) -> None:
        super().__init__()
        self.guard = guard

    def new_event_loop(self) -> asyncio.AbstractEventLoop:
        loop = super().new_event_loop()
        self.guard.install(loop)
        return loop


_GUARD = pytest.StashKey[LoopGuard]()
_PREVIOUS_POLICY = pytest.StashKey[Any]()
_SEEN = pytest.StashKey[list[LoopReport]]()
_SEEN_OUTSIDE = pytest.StashKey[list[LoopReport]]()
_CREATED_BEFORE = pytest.StashKey[int]()


def _set_policy(policy: Any) -> None:
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", DeprecationWarning)
        asyncio.set_event_loop_policy(policy)


def pytest_configure(config: pytest.Config) -> None:
    config.addinivalue_line(
        "markers",
        f"{MARKER}(reason): the test provokes unobserved event-loop exceptions on purpose; "
        "they are recorded (fixture loop_exceptions) instead of failing it",
    )
    guard = LoopGuard()
    config.stash[_GUARD] = guard
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", DeprecationWarning)
        config.stash[_PREVIOUS_POLICY] = asyncio.get_event_loop_policy()
    _set_policy(GuardedPolicy(guard))


def pytest_unconfigure(config: pytest.Config) -> None:
    if _PREVIOUS_POLICY in config.stash:
        _set_policy(config.stash[_PREVIOUS_POLICY])


class LoopExceptions:
    """What a test marked ``allow_loop_exceptions`` has provoked so far."""

    def __init__(self, guard: LoopGuard, item: pytest.Item) -> None:
        self._guard, self._item = guard, item

    def reports(self, *, collect: bool = True) -> list[LoopReport]:
        """Every report of this test so far, after a ``gc.collect()`` unless told not to."""
        if collect:
            gc.collect()
        seen = self._item.stash.setdefault(_SEEN, [])
        seen.extend(self._guard.drain())
        return list(seen)


@pytest.fixture
def loop_exceptions(request: pytest.FixtureRequest) -> LoopExceptions:
    return LoopExceptions(request.config.stash[_GUARD], request.node)


@pytest.hookimpl(wrapper=True, tryfirst=True)
def pytest_runtest_protocol(item: pytest.Item, nextitem: pytest.Item | None) -> Generator[None, object, object]:
    guard = item.config.stash[_GUARD]
    leftovers = guard.drain()
    if leftovers:  # between tests (collection, a module fixture): the session fails
        item.config.stash.setdefault(_SEEN_OUTSIDE, []).extend(leftovers)
    guard.current = item.nodeid
    item.stash[_CREATED_BEFORE] = guard.created
    try:
        return (yield)
    finally:
        guard.current = None


def _check(item: pytest.Item, when: str) -> None:
    reports = item.config.stash[_GUARD].drain()
    item.stash.setdefault(_SEEN, []).extend(reports)
    if reports and item.get_closest_marker(MARKER) is None:
        listing = "\n\n".join(r.describe() for r in reports)
        pytest.fail(
            f"{len(reports)} unobserved exception(s) in the event loop {when} "
            f"(reported through loop.call_exception_handler):\n\n{listing}",
            pytrace=False,
        )


@pytest.hookimpl(wrapper=True, trylast=True)
def pytest_runtest_call(item: pytest.Item) -> Generator[None, object, object]:
    # What was reported while the test ran (a task dropped when done, a callback) fails
    # the test itself; cycles and loop shutdown are found at teardown.
    result = yield
    _check(item, "during the test")
    return result


@pytest.hookimpl(wrapper=True, trylast=True)
def pytest_runtest_teardown(item: pytest.Item, nextitem: pytest.Item | None) -> Generator[None, object, object]:
    guard = item.config.stash[_GUARD]
    try:
        return (yield)
    finally:
        # Fixtures are finalized and function-scoped loops closed: whatever is unreachable
        # now is finalized while this test is still the one to blame. A full collection
        # costs tens of ms, so only after a test that had an event loop.
        if guard.had_loops(item.stash.get(_CREATED_BEFORE, -1)):
            gc.collect()
        _check(item, "at teardown (after gc.collect)")


@pytest.hookimpl(trylast=True)
def pytest_sessionfinish(session: pytest.Session, exitstatus: int) -> None:
    config = session.config
    if _GUARD not in config.stash:
        return
    gc.collect()
    outside = [*config.stash.get(_SEEN_OUTSIDE, []), *config.stash[_GUARD].drain()]
    if not outside:
        return
    reporter = config.pluginmanager.get_plugin("terminalreporter")
    if reporter is not None:
        reporter.section("unobserved event-loop exceptions outside any test", red=True)
        for report in outside:
            reporter.write_line(report.describe())
    if session.exitstatus == pytest.ExitCode.OK:
        session.exitstatus = pytest.ExitCode.TESTS_FAILED
