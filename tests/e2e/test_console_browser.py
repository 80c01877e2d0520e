"""The web console (docs/reference.md, The web console) clicked through in a real headless
Chromium against a real ``printery-workers`` and Valkey: log in, see the workers, open a
run, approve a production deployment and watch it finish (live, no reload), replay a dead
letter. Every page is saved as a screenshot to ``docs/console/`` (laptop size, and the
phone size for the overview and a run): the README shows two of them.
"""

from __future__ import annotations

from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import httpx
import pytest
import redis

from printery.servers.process import ServerProcess
from printery.testing import unique_prefix
from support.browser import PHONE, chrome, require_browser
from support.service import ServiceHandle, spawn

TOKEN = "console-token-for-browser-tests"
SHOTS = Path(__file__).resolve().parents[2] / "docs" / "console"
WAIT = 30.0


def deployment(environment: str = "development", version: str = "2.4.1") -> dict[str, Any]:
    return {"service": "billing-api", "version": version, "environment": environment,
            "requested_by": "alice", "notify": ["log"]}


@pytest.fixture(scope="module")
def service(server: ServerProcess, tmp_path_factory: pytest.TempPathFactory) -> Iterator[
    tuple[ServiceHandle, str]
]:
    require_browser()
    prefix = unique_prefix()
    handle = spawn(["--redis-url", server.url, "--stream-prefix", prefix],
                   env={"PRINTERY_API_TOKEN": TOKEN}, cwd=tmp_path_factory.mktemp("console"))
    yield handle, prefix
    handle.stop()


@pytest.fixture(scope="module")
def browser(service: tuple[ServiceHandle, str]) -> Iterator[Any]:
    driver = chrome()
    yield driver
    driver.quit()


def submit(handle: ServiceHandle, data: dict[str, Any]) -> str:
    assert handle.http_base is not None
    answer = httpx.post(f"{handle.http_base}/v1/runs", json={"data": data}, timeout=10,
                        headers={"Authorization": f"Bearer {TOKEN}"})
    assert answer.status_code == 202, answer.text
    return str(answer.json()["run_id"])


def wait_for(driver: Any, check: Callable[[Any], Any], what: str) -> Any:
    """Until ``check(driver)`` is truthy; an element replaced by a live update meanwhile
    (stale) counts as not yet."""
    from selenium.common.exceptions import StaleElementReferenceException
    from selenium.webdriver.support.ui import WebDriverWait

    return WebDriverWait(driver, WAIT, poll_frequency=0.1,
                         ignored_exceptions=[StaleElementReferenceException]).until(
        check, message=what)


def click(driver: Any, selector: str) -> None:
    """Click what ``selector`` finds, again if a live update replaced it first."""

    def clicked(d: Any) -> bool:
        css(d, selector)[0].click()
        return True

    wait_for(driver, clicked, f"a click on {selector}")


def css(driver: Any, selector: str) -> list[Any]:
    from selenium.webdriver.common.by import By

    return list(driver.find_elements(By.CSS_SELECTOR, selector))


def shot(driver: Any, name: str) -> None:
    SHOTS.mkdir(parents=True, exist_ok=True)
    assert driver.save_screenshot(str(SHOTS / f"{name}.png"))


def open_page(driver: Any, handle: ServiceHandle, path: str) -> None:
    driver.get(f"{handle.http_base}{path}")


def test_1_log_in_and_see_the_workers(service: tuple[ServiceHandle, str], browser: Any) -> None:
    handle, _ = service
    submit(handle, deployment(version="2.4.0"))  # something to show on the overview
    open_page(browser, handle, "/")
    assert "/login?next=" in browser.current_url  # not signed in: the login form
    shot(browser, "login")
    css(browser, "#token")[0].send_keys("not-the-token")
    css(browser, "#login")[0].click()
    wait_for(browser, lambda d: "That is not the token." in d.page_source, "the refusal")
    css(browser, "#token")[0].send_keys(TOKEN)
    css(browser, "#login")[0].click()
    wait_for(browser, lambda d: d.current_url == f"{handle.http_base}/", "the overview")
    cookie = browser.get_cookie("printery_session")
    assert cookie["httpOnly"] is True and cookie["sameSite"] == "Strict"
    assert TOKEN not in cookie["value"]

    def workers(d: Any) -> dict[str, str]:
        rows = css(d, "#workers tbody tr")
        found = {r.find_elements("css selector", "td")[1].text:
                 r.find_elements("css selector", "td")[2].text for r in rows}
        return found if found.get("validator") == "running" else {}

    found = wait_for(browser, workers, "the workers on the overview")
    assert set(found) == {"validator", "dependency-checker", "health-monitor", "aggregator",
                          "notifier"}
    wait_for(browser, lambda d: "succeeded" in css(d, "#live")[0].text, "a finished run")
    shot(browser, "overview")


def test_2_open_a_run(service: tuple[ServiceHandle, str], browser: Any) -> None:
    handle, _ = service
    run_id = submit(handle, deployment())
    open_page(browser, handle, "/runs")
    wait_for(browser, lambda d: run_id in d.page_source, "the run in the list (live)")
    shot(browser, "runs")
    search = css(browser, "input[name=q]")[0]
    search.send_keys(run_id)
    search.submit()
    wait_for(browser, lambda d: f"q={run_id}" in d.current_url, "the search")
    wait_for(browser, lambda d: len(css(d, f"a[href='/runs/{run_id}']")) == 1
             and len(css(d, "table.runs tbody tr")) == 1, "only the run searched for")
    click(browser, f"a[href='/runs/{run_id}']")
    wait_for(browser, lambda d: css(d, "#run-status")[0].text == "succeeded", "the outcome")
    states = {n.get_attribute("data-step"): n.get_attribute("data-state")
              for n in css(browser, "svg.graph g.node")}
    assert states["validator"] == "done" and states["notifier"] == "done"
    types = [li.get_attribute("data-type") for li in css(browser, "#timeline li")]
    assert types[0] == "deployment:started" and "deployment:finished" in types
    click(browser, "#timeline li:last-child details summary")  # an entry's data
    shot(browser, "run")


def test_3_approve_a_production_deployment_and_see_it_finish(
    service: tuple[ServiceHandle, str], browser: Any
) -> None:
    handle, _ = service
    open_page(browser, handle, "/reviews")
    run_id = submit(handle, deployment("production", "3.0.0"))
    card = wait_for(browser, lambda d: [c for c in css(d, "section.review")
                                        if run_id in c.text], "the review, live")[0]
    assert "approval" in card.text
    shot(browser, "reviews")
    review = f"[id='{card.get_attribute('id')}']"
    wait_for(browser, lambda d: css(d, f"{review} input[name=by]")[0].send_keys("bob") or True,
             "typing who approves")
    click(browser, f"{review} button.approve")
    wait_for(browser, lambda d: f"/runs/{run_id}" in d.current_url, "the run's page")
    assert "Review approved." in browser.page_source
    wait_for(browser, lambda d: css(d, "#run-status")[0].text == "succeeded",
             "the deployment finishing, live")
    shot(browser, "run-approved")


def test_4_replay_a_dead_letter(
    service: tuple[ServiceHandle, str], browser: Any, server: ServerProcess
) -> None:
    handle, prefix = service
    conn = redis.Redis.from_url(server.url, decode_responses=True)
    bad = conn.xadd(f"{prefix}:deployment:started", {"data": "{not json"})
    open_page(browser, handle, "/dlq")
    card = wait_for(browser, lambda d: [c for c in css(d, "section.letter")
                                        if "undecodable" in c.text], "the dead letter, live")[0]
    letter_id = card.get_attribute("id").removeprefix("letter-")
    assert conn.xrange(f"{prefix}:dlq", letter_id, letter_id)[0][1]["source_id"] == bad
    shot(browser, "dlq")
    click(browser, f"[id='letter-{letter_id}'] button.replay")
    wait_for(browser, lambda d: "Replayed as" in d.page_source, "the replay")
    assert conn.xrange(f"{prefix}:dlq", letter_id, letter_id) == []  # moved back
    new_id = browser.page_source.split("Replayed as ")[1].split(".")[0]
    assert conn.xrange(f"{prefix}:deployment:started", new_id, new_id)
    conn.close()


def test_5_pipeline_and_phone_size(service: tuple[ServiceHandle, str], browser: Any) -> None:
    handle, _ = service
    open_page(browser, handle, "/pipeline")
    wait_for(browser, lambda d: len(css(d, "svg.graph g.node")) == 5, "the pipeline's 5 steps")
    shot(browser, "pipeline")
    phone = chrome(PHONE)
    try:
        open_page(phone, handle, "/login")
        css(phone, "#token")[0].send_keys(TOKEN)
        css(phone, "#login")[0].click()
        wait_for(phone, lambda d: css(d, "#workers"), "the overview on a phone")
        shot(phone, "phone-overview")
        width = phone.execute_script("return document.documentElement.scrollWidth")
        assert width <= PHONE[0], f"the overview scrolls sideways on a phone ({width}px)"
        open_page(phone, handle, "/runs")
        # The list is live: a link read as an update replaces it is stale, and read again.
        (first,) = wait_for(phone, lambda d: [a.get_attribute("href")
                                              for a in css(d, "table.runs tbody a")][:1],
                            "a run in the list on a phone")
        open_page(phone, handle, first.removeprefix(str(handle.http_base)))
        wait_for(phone, lambda d: css(d, "#run-status"), "a run on a phone")
        shot(phone, "phone-run")
    finally:
        phone.quit()


def test_6_ids_an_operator_can_take_to_the_cli(
    service: tuple[ServiceHandle, str], browser: Any, server: ServerProcess
) -> None:
    """The overview counts each open review once; a review card shows the review's id
    and a dead letter's card its own id and its run's (what `printery review show ID`
    and `printery dlq show ID` take); a run a dead letter ended is ``failed``."""
    handle, prefix = service
    headers = {"Authorization": f"Bearer {TOKEN}"}
    run_id = submit(handle, deployment("production", "3.1.0"))  # held for an approval
    open_page(browser, handle, "/reviews")
    # The page updates live: each card is read whole inside the wait (a card replaced
    # under the read is read again), never kept across it.

    def review_card(d: Any) -> list[tuple[str, list[str], str]]:
        return [(c.get_attribute("id").removeprefix("review-"),
                 [x.text for x in c.find_elements("css selector", "code.review-id")],
                 c.find_elements("css selector", "a.run-id")[0].get_attribute("href"))
                for c in css(d, "section.review") if run_id in c.text]

    ((review_id, shown, href),) = wait_for(browser, review_card, "the review, live")
    assert shown == [review_id]
    assert httpx.get(f"{handle.http_base}/v1/reviews/{review_id}", headers=headers,
                     timeout=10).json()["deployment_id"] == run_id
    assert href.endswith(f"/runs/{run_id}")
    shot(browser, "reviews")

    open_reviews = len(httpx.get(f"{handle.http_base}/v1/reviews?limit=1000", headers=headers,
                                 timeout=10).json())
    assert open_reviews >= 1
    open_page(browser, handle, "/")
    wait_for(browser, lambda d: css(d, "#review-count")[0].text == str(open_reviews),
             f"{open_reviews} open reviews on the overview, counted once")

    conn = redis.Redis.from_url(server.url, decode_responses=True)
    dead_run = f"dep-dead-{unique_prefix()[-6:]}"
    conn.xadd(f"{prefix}:deployment:started", {"deployment_id": dead_run, "data": "{not json"})
    open_page(browser, handle, "/dlq")
    def letter_card(d: Any) -> list[tuple[str, list[str]]]:
        return [(c.get_attribute("id").removeprefix("letter-"),
                 [x.text for x in c.find_elements("css selector", "code.letter-id")])
                for c in css(d, "section.letter") if dead_run in c.text]

    ((letter_id, shown),) = wait_for(browser, letter_card, "the dead letter, live")
    assert shown == [letter_id]
    letters = httpx.get(f"{handle.http_base}/v1/dlq", headers=headers, timeout=10).json()
    assert [d["deployment_id"] for d in letters if d["id"] == letter_id] == [dead_run]
    shot(browser, "dlq")
    click(browser, f"[id='letter-{letter_id}'] a.run-id")
    wait_for(browser, lambda d: css(d, "#run-status")[0].text == "failed",
             "the run the dead letter ended: failed")
    # Its timeline says what the dead letter is, who wrote it and why (before: "dlq by ?",
    # the failed entry's producer).
    (said,) = [li.find_element("css selector", "summary").text
               for li in css(browser, "#timeline li[data-type=dlq]")]
    assert "dead-lettered by validator: undecodable" in said, said
    shot(browser, "run-failed")
    conn.close()


def test_7_log_out_ends_the_session(service: tuple[ServiceHandle, str], browser: Any) -> None:
    """Logging out ends the session in the server: the browser is back at the login form,
    and the cookie it had, copied before, opens nothing after."""
    handle, _ = service
    open_page(browser, handle, "/")
    wait_for(browser, lambda d: css(d, "form.logout button"), "the overview, signed in")
    copied = browser.get_cookie("printery_session")["value"]
    page = httpx.get(f"{handle.http_base}/runs", cookies={"printery_session": copied},
                     timeout=10)
    assert page.status_code == 200  # the copy passes while the session is open
    click(browser, "form.logout button")
    wait_for(browser, lambda d: d.current_url == f"{handle.http_base}/login", "the login form")
    open_page(browser, handle, "/runs")
    assert "/login?next=" in browser.current_url  # signed out: the login form again
    after = httpx.get(f"{handle.http_base}/runs", cookies={"printery_session": copied},
                      timeout=10)
    assert after.status_code == 303 and after.headers["location"].startswith("/login")
