"""A streaming run (reference: streaming through the gate) followed in a real headless
Chromium against real ``printery-workers --app`` processes.

The console's run page: attempt 1's draft appears as it is written, provisional; its
verdict strikes it through with the validator's reasons; attempt 2 streams anew and is
committed; the run's outcome follows, all without a reload. Saved as
``docs/console/run-streaming.png`` (mid-run) and ``docs/console/run-streamed.png``.

The browser's own ``EventSource`` on ``/v1/runs/{id}/events``: the process serving it is
killed mid-attempt and another takes its port; the ``EventSource`` reconnects by itself
with ``Last-Event-ID`` and loses no committed entry, nor any partial or verdict."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path
from typing import Any

import httpx
import pytest
import redis

from printery.servers.process import free_port
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
    require_browser()
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
    answer = httpx.post(f"{handle.http_base}/v1/runs",
                        json={"data": {"question": "why?"}, "event_type": "request"}, timeout=10)
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


LISTEN = """
window.__events = [];
window.__errors = 0;
var source = new EventSource(arguments[0]);
window.__source = source;
var keep = function (kind) {
  return function (event) {
    window.__events.push({kind: kind, data: JSON.parse(event.data), id: event.lastEventId});
  };
};
source.onmessage = keep("message");
source.addEventListener("partial", keep("partial"));
source.addEventListener("verdict", keep("verdict"));
source.onerror = function () { window.__errors += 1; };
"""


def events(driver: Any) -> list[dict[str, Any]]:
    return list(driver.execute_script("return window.__events;"))


def partial_of(attempt: int) -> Any:
    def check(driver: Any) -> bool:
        return any(e["kind"] == "partial" and e["data"]["attempt"] == attempt
                   for e in events(driver))
    return check


def test_the_browsers_event_source_reconnects_to_another_process_and_loses_nothing(
    redis_url: str, tmp_path: Path, browser: Any
) -> None:
    (tmp_path / "streamapp.py").write_text(STREAM_APP)
    prefix = unique_prefix("stream-sse")
    gates = f"{prefix}:test-gates"
    env = {"STREAM_GATES": gates, "STREAM_REDIS": redis_url}
    common = ["--redis-url", redis_url, "--stream-prefix", prefix, "--app", "streamapp:pipeline"]
    port = free_port()
    # The loop runs in one process; another serves HTTP (its only worker idles), so it
    # can be killed without touching the run.
    loop = spawn([*common, "--worker", "draft"], env=env, cwd=tmp_path, http=False)
    serving = spawn([*common, "--worker", "idle", "--http-addr", f"127.0.0.1:{port}"],
                    env=env, cwd=tmp_path)
    gate = redis.Redis.from_url(redis_url, decode_responses=True)
    base = f"http://127.0.0.1:{port}"
    try:
        answer = httpx.post(f"{base}/v1/runs",
                            json={"data": {"question": "why?"}, "event_type": "request"},
                            timeout=10)
        assert answer.status_code == 202, answer.text
        run_id = answer.json()["run_id"]
        browser.get(f"{base}/healthz")  # a page of that origin
        browser.execute_script(LISTEN, f"/v1/runs/{run_id}/events")
        wait_for(browser, partial_of(1), "attempt 1's first chunk")
        gate.rpush(f"{gates}:{run_id}:1", "go")
        wait_for(browser, partial_of(2), "attempt 2's first chunk")
        serving.kill()  # mid-attempt: the EventSource loses its connection
        wait_for(browser, lambda d: d.execute_script("return window.__errors;") >= 1,
                 "the EventSource seeing its connection gone")
        serving = spawn([*common, "--worker", "idle", "--http-addr", f"127.0.0.1:{port}"],
                        env=env, cwd=tmp_path)
        gate.rpush(f"{gates}:{run_id}:2", "go")
        wait_for(browser, lambda d: any(e["kind"] == "message" and e["data"]["stream"] == "answer"
                                        for e in events(d)), "the outcome, after the reconnect")
        # After the outcome the server closes; the reconnect gets 204, which closes it.
        wait_for(browser, lambda d: d.execute_script("return window.__source.readyState;") == 2,
                 "the EventSource closed by the 204")
        found = events(browser)
        trace = httpx.get(f"{base}/v1/runs/{run_id}", timeout=10).json()["entries"]
    finally:
        gate.close()
        serving.stop()
        loop.stop()
    entries = [e["data"] for e in found if e["kind"] == "message"]
    outcome_at = next(n for n, e in enumerate(trace) if e["stream"] == "answer")
    assert [e["id"] for e in entries] == [e["id"] for e in trace[: outcome_at + 1]]
    shown = [(e["kind"], e["data"]["attempt"], e["data"].get("text"), e["data"].get("passed"))
             for e in found if e["kind"] != "message"]
    texts = {n: "".join(t for kind, a, t, _ in shown if kind == "partial" and a == n)
             for n in (1, 2)}
    assert texts == {1: "draft 1: the end", 2: "draft 2: the end"}  # each chunk once
    verdicts = [(e["data"]["attempt"], e["data"]["passed"], e["data"]["reasons"])
                for e in found if e["kind"] == "verdict"]
    assert verdicts == [(1, False, [{"code": "not_yet", "field": "",
                                     "message": "attempt 1 is a first draft"}]), (2, True, [])]
    kinds = [(e["kind"], e["data"].get("attempt")) for e in found if e["kind"] != "message"]
    assert kinds.index(("verdict", 1)) < kinds.index(("partial", 2)) < kinds.index(("verdict", 2))
    assert len({e["id"] for e in found}) == len(found), "every event id once"
