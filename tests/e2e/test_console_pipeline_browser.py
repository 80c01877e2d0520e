"""The console's pipeline page of an LLM document pipeline (a Map over chunks, a Loop with
a fallback and a review, long event type names) in a real headless Chromium at 1400 px,
against a real ``printery-workers --app``: the steps table fits its card (every column
seen, nothing to scroll sideways to) and the graph draws the Map's output from its
collector. Saved as ``docs/console/pipeline-wide.png``.

Before: the loop's one-line summary under its step name did not wrap, so the Step column
took the card's width: PRODUCES was cut and CONSUMERS hidden past the card's edge."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from printery.testing import unique_prefix
from support.browser import chrome, require_browser
from support.service import ServiceHandle, spawn

SHOTS = Path(__file__).resolve().parents[2] / "docs" / "console"
WAIT = 30.0
WIDE = (1400, 900)

DOC_APP = '''
from printery import Loop, Map, Message, Pipeline, Reason

pipeline = Pipeline("documents", ingress=["document:uploaded"], cost_units=["tokens"])


def chunks_of(message: Message) -> list:
    return list(message.data["chunks"])


async def embed(message: Message) -> dict:
    return {"text": str(message.data)}


async def summarize(message: Message) -> dict:
    return {"text": "a summary of the document"}


def long_enough(message: Message) -> list:
    return [] if len(message.data["text"]) > 3 else [Reason("too_short", "text", "short")]


pipeline.add(Map("chunks", consumes="document:uploaded", produces="document:chunks_collected",
                 split=chunks_of, each=embed))
pipeline.add(Loop("summarize", consumes="document:chunks_collected",
                  produces="document:summary_written", work=summarize, validate=long_enough,
                  fallback=summarize, max_attempts=3, review_kind="summary_needs_a_human",
                  exhausted="document:summary_exhausted"))


@pipeline.step("publish", consumes=["document:summary_written"],
               produces=["document:published"])
async def publish(message: Message) -> dict:
    return message.data
'''


@pytest.fixture
def service(redis_url: str, tmp_path: Path) -> Iterator[ServiceHandle]:
    require_browser()
    (tmp_path / "docapp.py").write_text(DOC_APP)
    handle = spawn(["--redis-url", redis_url, "--stream-prefix", unique_prefix("wide-console"),
                    "--app", "docapp:pipeline"], cwd=tmp_path)
    yield handle
    handle.stop()


@pytest.fixture
def browser() -> Iterator[Any]:
    require_browser()
    driver = chrome(WIDE)
    yield driver
    driver.quit()


def test_the_pipeline_page_fits_1400_px_and_draws_the_maps_output_from_its_collector(
    service: ServiceHandle, browser: Any
) -> None:
    from selenium.webdriver.support.ui import WebDriverWait

    browser.get(f"{service.http_base}/pipeline")
    WebDriverWait(browser, WAIT, poll_frequency=0.1).until(
        lambda d: len(d.find_elements("css selector", "svg.graph g.node")) == 5,
        message="the pipeline's 5 steps")
    SHOTS.mkdir(parents=True, exist_ok=True)
    assert browser.save_screenshot(str(SHOTS / "pipeline-wide.png"))
    window = browser.execute_script("return window.innerWidth")
    assert window == WIDE[0]
    # Each column's header and every cell: inside the window and inside the card's
    # scroll box (what a sideways scroll would be needed to see is hidden).
    cells = browser.execute_script("""
        const box = document.querySelector('table').closest('.scroll').getBoundingClientRect();
        return [...document.querySelectorAll('table tr')].map(row =>
            [...row.children].map(cell => {
                const r = cell.getBoundingClientRect();
                return [cell.textContent.trim().slice(0, 40), r.left, r.right, box.right];
            }));""")
    headers = [cell[0].upper() for cell in cells[0]]
    assert headers == ["STEP", "CONSUMES", "PRODUCES", "CONSUMERS"]
    for row in cells:
        for text, left, right, box_right in row:
            assert left >= 0 and right <= window, f"{text!r} is outside the window: {right}"
            assert right <= box_right + 0.5, f"{text!r} is cut by the card: {right} > {box_right}"
    scroll = browser.execute_script(
        "const s = document.querySelector('table').closest('.scroll');"
        "return [s.scrollWidth, s.clientWidth, document.documentElement.scrollWidth];")
    assert scroll[0] <= scroll[1] and scroll[2] <= window, f"something scrolls sideways: {scroll}"
    # One edge into the loop, from the Map's collector (its right edge, its row).
    nodes = {n.get_attribute("data-step"): n.find_element("css selector", "rect")
             for n in browser.find_elements("css selector", "svg.graph g.node")}
    loop = nodes["summarize"]
    collector = nodes["chunks:collect"]
    into_loop = [p.get_attribute("d") for p in browser.find_elements("css selector", "svg.graph path.edge")
                 if p.get_attribute("d").endswith(
                     f" {int(loop.get_attribute('x')) - 4},"
                     f"{int(loop.get_attribute('y')) + int(loop.get_attribute('height')) // 2}")]
    start = (f"M{int(collector.get_attribute('x')) + int(collector.get_attribute('width'))},"
             f"{int(collector.get_attribute('y')) + int(collector.get_attribute('height')) // 2} ")
    assert [d.startswith(start) for d in into_loop] == [True], into_loop
