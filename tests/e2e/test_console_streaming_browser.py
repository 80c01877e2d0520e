"""The console's run page follows a streaming run (reference: streaming through the
gate) in a real headless Chromium against a real ``printery-workers --app``: attempt
1's draft appears as it is written, provisional; its verdict strikes it through with the
validator's reasons; attempt 2 streams anew and is committed; the run's outcome follows,
all without a reload. Saved as ``docs/console/run-streaming.png`` (mid-run) and
``docs/console/run-streamed.png`` (the end)."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path
from typing import Any

import httpx
import pytest
import redis

from printery.testing import unique_prefix
from support.browser import chrome, require_browser
from support.service import ServiceHandle, spawn
from support.stream_model import STREAM_APP

SHOTS = Path(__file__).resolve().parents[2] / "docs" / "console"
WAIT = 30.0


@pytest.fixture
def service(redis_url: str, tmp_path: Path) -> Iterator[tuple[ServiceHandle, str]]:
    require_browser()
    (tmp_path / "streamapp.py").write_text(STREAM_APP)
    prefix = unique_prefix("stream-console")
    gates = f"{prefix}:test-gates"
    handle = spawn(["--redis-url", redis_url, "--stream-prefix", prefix,
                    "--app", "streamapp:pipeline"],
                   env={"STREAM_GATES": gates, "STREAM_REDIS": redis_url}, cwd=tmp_path)
    yield handle, gates
    handle.stop()


@pytest.fixture
def browser() -> Iterator[Any]:
    driver = chrome()
    yield driver
    driver.quit()


def wait_for(driver: Any, check: Any, what: str) -> Any:
    from selenium.common.exceptions import StaleElementReferenceException
    from selenium.webdriver.support.ui import WebDriverWait

    return WebDriverWait(driver, WAIT, poll_frequency=0.1,
                         ignored_exceptions=[StaleElementReferenceException]).until(
        check, message=what)


def drafts(driver: Any) -> list[tuple[str, str, str, list[str]]]:
    """Each draft on the page: (attempt, state, text, reasons)."""
    from selenium.webdriver.common.by import By

    found = []
    for li in driver.find_elements(By.CSS_SELECTOR, "#drafts li.draft"):
        text = li.find_element(By.CSS_SELECTOR, ".draft-text")
        reasons = [r.text for r in li.find_elements(By.CSS_SELECTOR, ".reasons li")]
        state = next(c for c in li.get_attribute("class").split() if c != "draft")
        found.append((li.get_attribute("data-attempt"), state, text.text, reasons))
    return found


def shot(driver: Any, name: str) -> None:
    SHOTS.mkdir(parents=True, exist_ok=True)
    assert driver.save_screenshot(str(SHOTS / f"{name}.png"))


def test_the_run_page_shows_drafts_provisional_then_struck_or_committed(
    service: tuple[ServiceHandle, str], browser: Any, redis_url: str
) -> None:
    handle, gates = service
    assert handle.http_base is not None
    answer = httpx.post(f"{handle.http_base}/v1/runs", json={"data": {"question": "why?"}},
                        timeout=10)
    assert answer.status_code == 202, answer.text
    run_id = answer.json()["run_id"]
    gate = redis.Redis.from_url(redis_url, decode_responses=True)
    try:
        def page_with_draft(d: Any) -> bool:
            d.get(f"{handle.http_base}/runs/{run_id}")
            return bool(d.find_elements("css selector", "#live[data-live]"))

        wait_for(browser, page_with_draft, "the run's live page")
        wait_for(browser, lambda d: drafts(d) == [("1", "provisional", "draft 1: ", [])],
                 "attempt 1's draft, provisional")
        gate.rpush(f"{gates}:{run_id}:1", "go")
        wait_for(browser, lambda d: drafts(d) == [
            ("1", "retracted", "draft 1: the end", ["not_yet: attempt 1 is a first draft"]),
            ("2", "provisional", "draft 2: ", [])], "attempt 1 struck through, attempt 2 written")
        shot(browser, "run-streaming")
        style = browser.execute_script(
            "var d = document.querySelector('#drafts li.retracted del');"
            "return getComputedStyle(d).textDecorationLine;")
        assert "line-through" in style
        gate.rpush(f"{gates}:{run_id}:2", "go")
        wait_for(browser, lambda d: d.find_elements("css selector", "#live[data-ended]"),
                 "the run's end, live")
        assert browser.find_element("css selector", "#run-status").text == "answer"
        assert drafts(browser) == [
            ("1", "retracted", "draft 1: the end", ["not_yet: attempt 1 is a first draft"]),
            ("2", "committed", "draft 2: the end", [])]
        shot(browser, "run-streamed")
    finally:
        gate.close()
