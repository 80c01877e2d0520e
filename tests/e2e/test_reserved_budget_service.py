"""Reserved budgets under fan-out (reference: budgets) in real service processes: a Map of
50 items, each spending 100 tokens, under ``Budget(tokens=1000, on_exceeded="stop")``,
handled by 10 consumers in 2 processes (``printery-workers --processes 2``). With
``estimate={"tokens": 100}`` the run stops having spent at most its limit; without it
(the check before handlers, the charge at commit) the items running at once all pass the
check, and the run spends past its limit."""

from __future__ import annotations

import json
import textwrap
from pathlib import Path
from typing import Any

import pytest
import redis

from printery.keys import StreamKeys
from printery.testing import unique_prefix
from printery.transport.commit import decode_spent
from support.service import spawn

APP = textwrap.dedent(
    """
    import asyncio
    import os

    from printery import Budget, Map, Message, Pipeline

    pipeline = Pipeline("pages", ingress=["document"], cost_units=["tokens"],
                        budget=Budget(tokens=1000, on_exceeded="stop"))
    estimate = {"tokens": 100} if os.environ.get("RESERVE") == "1" else None


    async def extract(message: Message) -> dict:
        await asyncio.sleep(0.1)  # a model call: items overlap in time
        message.report_cost("tokens", 100)
        return {"page": message.data}


    pipeline.add(Map("pages", consumes="document", produces="merged",
                     split=lambda message: message.data["pages"], each=extract,
                     concurrency=5, cost_units=["tokens"], estimate=estimate))
    """
)

ITEMS = 50


def _run(server: Any, tmp_path: Path, reserve: bool) -> tuple[float, int]:
    """One run of 50 items through the service: what it spent and how many items
    produced a result."""
    (tmp_path / "reserveapp.py").write_text(APP)
    (tmp_path / "fast.toml").write_text("[transport]\nvisibility_timeout = 2\n")
    prefix = unique_prefix("reserve")
    svc = spawn(["--redis-url", server.url, "--stream-prefix", prefix, "--processes", "2",
                 "--app", "reserveapp:pipeline", "--config", str(tmp_path / "fast.toml")],
                env={"RESERVE": "1" if reserve else "0"}, cwd=tmp_path)
    r = redis.Redis.from_url(server.url, decode_responses=True)
    try:
        def children() -> bool:
            procs = svc.json("/status")["processes"]
            return len([p for p in procs if p["alive"] and p["workers"]]) == 2

        svc.wait_until(children, what="two children")
        r.xadd(f"{prefix}:document", {"data": json.dumps({
            "correlation_id": "doc-1", "pages": [f"page-{n}" for n in range(ITEMS)]})})

        def settled() -> bool:
            if not r.exists(f"{prefix}:pages:item"):
                return False
            (group,) = [g for g in r.xinfo_groups(f"{prefix}:pages:item")
                        if g["name"] == "pages:each"]
            return bool(group["entries-read"] == ITEMS and group["pending"] == 0)

        svc.wait_until(settled, timeout=60, what="every item handled or held")
        assert r.xlen(f"{prefix}:budget:exceeded") == 1, "the run stopped"
        spent = decode_spent(r.hget(StreamKeys(prefix).budget("doc-1"), "tokens"))
        return spent, r.xlen(f"{prefix}:pages:result")
    finally:
        svc.stop()


@pytest.mark.parametrize("reserve", [True, False], ids=["estimate", "check-then-charge"])
def test_fifty_items_in_two_processes_stop_within_the_limit_only_with_reservations(
    server: Any, tmp_path: Path, reserve: bool
) -> None:
    spent, results = _run(server, tmp_path, reserve)
    print(f"\nreserve={reserve}: spent {spent:g} tokens of 1000, {results} item results")
    assert spent == 100 * results
    if reserve:
        assert spent <= 1000
    else:  # the check lets a run pass its limit by what the items running at once spend
        assert spent >= 1000
