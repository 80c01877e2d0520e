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

import httpx
import psutil
import pytest
import redis

from printery.testing import unique_prefix
from printery.transport.commit import decode_spent
from printery.wire.keys import StreamKeys
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
TOKEN = "reserve-test-token"


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


KILL_APP = textwrap.dedent(
    """
    import asyncio

    from printery import Budget, Map, Message, Pipeline

    pipeline = Pipeline("pages", ingress=["document"], cost_units=["tokens"],
                        budget=Budget(tokens=650, on_exceeded="stop"))


    async def extract(message: Message) -> dict:
        await asyncio.sleep(0.5)  # long enough for a process to die holding items
        message.report_cost("tokens", 100)
        return {"page": message.data}


    pipeline.add(Map("pages", consumes="document", produces="merged",
                     split=lambda message: message.data["pages"], each=extract,
                     concurrency=3, cost_units=["tokens"], estimate={"tokens": 100}))
    """
)


def test_a_killed_holders_items_keep_their_reservations_when_redelivered(
    server: Any, tmp_path: Path
) -> None:
    """Six items of 100 tokens under a limit of 650, all reserved at once by two
    processes; one process is killed (-9) holding reserved items. Their redeliveries to
    the other find their own reservations (keyed by the entry) and run: a second
    reservation of any would pass 650 and stop the run. The run finishes (the Map's
    output) with spent 600, every item once, nothing left reserved. (At 650 rather than
    600: a run at its limit runs no further handler, the Map's collector included.)"""
    (tmp_path / "killapp.py").write_text(KILL_APP)
    (tmp_path / "fast.toml").write_text("[transport]\nvisibility_timeout = 1\n")
    prefix = unique_prefix("reserve-kill")
    svc = spawn(["--redis-url", server.url, "--stream-prefix", prefix, "--processes", "2",
                 "--app", "killapp:pipeline", "--config", str(tmp_path / "fast.toml"),
                 "--backoff", "50"], env={"PRINTERY_API_TOKEN": TOKEN}, cwd=tmp_path)
    r = redis.Redis.from_url(server.url, decode_responses=True)
    keys = StreamKeys(prefix)
    try:
        def children() -> list[int]:
            procs = svc.json("/status")["processes"]
            alive = [p["pid"] for p in procs if p["alive"] and p["workers"]]
            return alive if len(alive) == 2 else []

        first = svc.wait_until(children, what="two children")
        r.xadd(f"{prefix}:document", {"data": json.dumps({
            "correlation_id": "doc-1", "pages": [f"page-{n}" for n in range(6)]})})

        def victim_holds_reserved_items() -> int | None:
            if r.hlen(keys.reserved("doc-1")) < 6 or not r.exists(f"{prefix}:pages:item"):
                return None
            for consumer in r.xinfo_consumers(f"{prefix}:pages:item", "pages:each"):
                for pid in first:
                    if consumer["pending"] > 0 and f":{pid}:" in consumer["name"]:
                        return pid
            return None

        victim = svc.wait_until(victim_holds_reserved_items,
                                what="a child holding reserved items")
        assert r.xlen(f"{prefix}:pages:result") < 6, "the kill must come mid-run"
        psutil.Process(victim).kill()
        svc.wait_until(lambda: r.xlen(f"{prefix}:merged") == 1, timeout=60,
                       what="the merged output")
        assert r.xlen(f"{prefix}:budget:exceeded") == 0
        results = [fields for _, fields in r.xrange(f"{prefix}:pages:result")]
        assert sorted(int(f["item"]) for f in results) == list(range(6))
        assert decode_spent(r.hget(keys.budget("doc-1"), "tokens")) == 600
        assert r.hlen(keys.reserved("doc-1")) == 0
        assert svc.http_base is not None  # the API's cost shows spent and reserved
        run = httpx.get(f"{svc.http_base}/v1/runs/doc-1", timeout=10,
                        headers={"Authorization": f"Bearer {TOKEN}"}).json()
        (row,) = run["budget"]
        assert (row["unit"], row["spent"], row["reserved"], row["limit"]) == (
            "tokens", 600.0, 0.0, 650.0)
    finally:
        svc.stop()
