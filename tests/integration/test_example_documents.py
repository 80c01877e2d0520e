"""``examples/documents.py`` (issue 34, item 5): a document fanned out page by page to a
streaming model on loopback, each page judged with feedback, one page's quota gone to
its fallback, merged in page order, within a reserved budget; offline, end to end."""

from __future__ import annotations

import os
import re
import subprocess
import sys
from pathlib import Path

from examples import documents

from printery.servers.process import ServerProcess
from printery.testing import unique_prefix

ROOT = Path(__file__).resolve().parents[2]


def asked_about(page: int) -> int:
    return sum(1 for body in documents.LOCAL.requests
               if body["messages"][-1]["content"].startswith(f"Page {page}:"))


async def test_every_page_once_in_order_with_a_retraction_a_fallback_and_the_budget(
    server: ServerProcess,
) -> None:
    before = {page: asked_about(page) for page in (1, 2, 3, 4)}
    shown: list[str] = []
    result, budget = await documents.run_once(server.url, unique_prefix("documents"),
                                              show=shown.append)
    assert result.status == "doc:extracted"
    assert [(p["page"], p["by"]) for p in result.data["pages"]] == [
        (1, "model"), (2, "model"), (3, "fallback"), (4, "model")]
    assert result.data["pages"][1]["summary"] == (
        "Staff costs fell by 3 percent to 1.1 million euros, as the support team moved to "
        "the new tooling.")
    # Every page is an item of the run, once; page 2 took two attempts, page 3 the fallback.
    items = sorted(int(e["item"]) for e in result.entries if e["stream"] == "pages:item")
    assert items == [0, 1, 2, 3]
    verdicts = sorted((int(e["item"]), e["data"]["attempt"], e["data"]["next"],
                       [r["code"] for r in e["data"]["reasons"]])
                      for e in result.entries if e.get("type") == "extract:verdict")
    assert verdicts == [(0, 1, "passed", []), (1, 1, "retry", ["missing_figure"]),
                        (1, 2, "passed", []), (2, 1, "fallback", ["quota_exhausted"]),
                        (2, 2, "passed", []), (3, 1, "passed", [])]
    # The quota is not a rate limit: the model was asked about page 3 once, not again.
    assert {page: asked_about(page) - before[page] for page in (1, 2, 3, 4)} == {
        1: 1, 2: 2, 3: 1, 4: 1}
    # The follower saw page 2's first draft streamed, then retracted with the reasons.
    at = shown.index("streamed page 2 draft 1 retracted: Costs were kept under control in "
                     "every region.")
    assert shown[at + 1] == " " * 9 + "missing_figure: the summary leaves out 3, 1.1"
    assert "streamed page 2 draft 2 committed: Staff costs fell by 3 percent to 1.1 million " \
           "euros, as the support team moved to the new tooling." in shown
    # Four model calls of 150 tokens, each reserved before it ran and settled at its commit.
    (row,) = budget
    assert (row["unit"], row["spent"], row["reserved"], row["limit"]) == (
        "tokens", 600, 0, documents.BUDGET)
    assert result.cost == {"tokens": 600}


def test_python_dash_m_runs_offline() -> None:
    done = subprocess.run([sys.executable, "-m", "examples.documents"], cwd=ROOT,
                          capture_output=True, text=True, timeout=120, check=False,
                          env={k: v for k, v in os.environ.items()
                               if k not in ("REDIS_URL", "DOCS_MODEL_URL")})
    assert done.returncode == 0, done.stderr[-2000:]
    lines = done.stdout.splitlines()
    assert re.fullmatch(r"model +a local streaming server, http://127\.0\.0\.1:\d+/v1 "
                        r"\(DOCS_MODEL_URL is unset\)", lines[0])
    assert "result   doc:extracted, 4 pages in order" in lines
    pages = [line.split()[:3] for line in lines if line.startswith("page ")]
    assert pages == [["page", "1", "model"], ["page", "2", "model"],
                     ["page", "3", "fallback"], ["page", "4", "model"]]
    refused = [line.strip() for line in lines if "did not pass" in line]
    assert refused == ["attempt 1 did not pass: missing_figure",
                       "attempt 1 did not pass: quota_exhausted"]
    assert any(line.startswith("streamed page 2 draft 1 retracted: ") for line in lines)
    spent, limit, reserved = map(float, re.findall(
        r"^tokens +spent (\S+) of (\S+), reserved (\S+) ", done.stdout, re.M)[0])
    assert spent <= limit == documents.BUDGET and reserved == 0
