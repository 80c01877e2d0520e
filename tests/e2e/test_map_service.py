"""A Map (reference: fan-out) under ``printery-workers --processes 2 --app``: a 40-item
run is shared by the two child processes, one of which is killed (SIGKILL) while it holds
items; the run still ends with every item's result written once and the output, in item
order, written once."""

from __future__ import annotations

import json
import re
import textwrap
from collections import Counter
from pathlib import Path
from typing import Any

import httpx
import psutil
import redis

from printery.testing import unique_prefix
from support.operator_cli import cli_sync
from support.service import ServiceHandle, spawn

APP = textwrap.dedent(
    """
    import asyncio
    import os

    from printery import Map, Message, Pipeline

    pipeline = Pipeline("pages", ingress=["document"])


    async def extract(message: Message) -> dict:
        await asyncio.sleep(0.15)  # long enough for a process to die holding items
        return {"page": message.data, "pid": os.getpid()}


    pipeline.add(Map("pages", consumes="document", produces="merged",
                     split=lambda message: message.data["pages"], each=extract,
                     concurrency=3))
    """
)


def test_a_40_item_map_survives_a_kill_9_of_one_of_two_processes(
    server: Any, tmp_path: Path
) -> None:
    (tmp_path / "mapapp.py").write_text(APP)
    (tmp_path / "fast.toml").write_text("[transport]\nvisibility_timeout = 1\n")
    prefix = unique_prefix("map-kill")
    svc = spawn(["--redis-url", server.url, "--stream-prefix", prefix, "--processes", "2",
                 "--app", "mapapp:pipeline", "--config", str(tmp_path / "fast.toml"),
                 "--backoff", "50"], cwd=tmp_path)
    r = redis.Redis.from_url(server.url, decode_responses=True)
    try:
        first = svc.wait_until(lambda: _children(svc), what="two children")
        pages = [f"page-{n}" for n in range(40)]
        r.xadd(f"{prefix}:document", {"data": json.dumps({"correlation_id": "doc-1",
                                                            "pages": pages})})

        def victim_holds_items() -> int | None:
            if r.xlen(f"{prefix}:pages:result") < 4:
                return None
            for consumer in r.xinfo_consumers(f"{prefix}:pages:item", "pages:each"):
                for pid in first:
                    if consumer["pending"] > 0 and f":{pid}:" in consumer["name"]:
                        return pid
            return None

        victim = svc.wait_until(victim_holds_items, what="a child holding items mid-run")
        assert r.xlen(f"{prefix}:pages:result") < 40, "the kill must come mid-run"
        # The console's run graph shows the items mid-run: some done, some running.
        page = httpx.get(f"{svc.http_base}/runs/doc-1", timeout=10).text
        shown = re.search(r'data-items="(\d+) done · (\d+) failed · (\d+) running"', page)
        assert shown, page
        assert int(shown[1]) >= 4 and int(shown[2]) == 0 and int(shown[3]) > 0
        psutil.Process(victim).kill()
        svc.wait_until(lambda: r.xlen(f"{prefix}:merged") == 1, timeout=60,
                       what="the merged output")
        ((_, merged),) = r.xrange(f"{prefix}:merged")
        data = json.loads(merged["data"])
        assert [item["page"] for item in data["items"]] == pages
        assert data["failed"] == []
        results = [fields for _, fields in r.xrange(f"{prefix}:pages:result")]
        assert Counter(int(f["item"]) for f in results) == {n: 1 for n in range(40)}
        pids = {item["pid"] for item in data["items"]}
        assert victim in pids and len(pids) >= 2, pids  # shared, the victim did some
        assert r.xlen(f"{prefix}:dlq") == 0 and r.xlen(f"{prefix}:run:failed") == 0
        page = httpx.get(f"{svc.http_base}/runs/doc-1", timeout=10).text
        assert 'data-items="40 done · 0 failed · 0 running"' in page
        svc.wait_until(lambda: r.xpending(f"{prefix}:pages:item", "pages:each")["pending"] == 0,
                       what="nothing left pending")

        # The operator sees the Map: drawn by `pipeline show`, every item in `trace`.
        def printery(*argv: str) -> str:
            done = cli_sync(server.url, prefix, "--app", "mapapp:pipeline", *argv,
                            cwd=str(tmp_path))
            assert done.returncode == 0, done.stderr
            return done.stdout

        assert ("map: one pages:item per item (at most 1000), each by pages:each, collected "
                "by pages:collect into merged") in printery("pipeline", "show")
        trace = printery("trace", "doc-1")
        assert all(f"item {n}/40" in trace for n in range(40)), trace
    finally:
        r.close()
        assert svc.stop() == 0, svc.log()


def _children(svc: ServiceHandle) -> list[int]:
    """The two children's pids once both run their workers, else []."""
    procs = svc.json("/status")["processes"]
    alive = [p["pid"] for p in procs if p["alive"] and p["workers"]]
    return alive if len(alive) == 2 else []


LOOP_APP = textwrap.dedent(
    """
    import asyncio
    import os

    from printery import Loop, Map, Message, Pipeline, Reason

    pipeline = Pipeline("pages", ingress=["document"])


    async def draft(message: Message) -> dict:
        await asyncio.sleep(0.05)  # a model call: the other process takes items meanwhile
        return {"page": message.data, "attempt": message.attempt, "pid": os.getpid()}


    def check(message: Message) -> list:
        if message.data["page"] != "never" and message.data["attempt"] >= 2:
            return []
        return [Reason("not_yet", "page", f"attempt {message.data['attempt']}")]


    pipeline.add(Map("pages", consumes="document", produces="merged",
                     split=lambda message: message.data["pages"], on_item_failure="skip",
                     each=Loop("pages:draft", consumes="pages:item", produces="pages:result",
                               work=draft, validate=check, max_attempts=2, concurrency=2)))
    """
)


def test_a_loop_as_each_under_two_processes_skips_the_item_it_exhausted(
    server: Any, tmp_path: Path
) -> None:
    (tmp_path / "loopmap.py").write_text(LOOP_APP)
    prefix = unique_prefix("map-loop")
    svc = spawn(["--redis-url", server.url, "--stream-prefix", prefix, "--processes", "2",
                 "--app", "loopmap:pipeline"], cwd=tmp_path)
    r = redis.Redis.from_url(server.url, decode_responses=True)
    try:
        svc.wait_until(lambda: len(_children(svc)) == 2, what="two children")
        pages = [f"page-{n}" for n in range(20)]
        pages[7] = "never"
        r.xadd(f"{prefix}:document", {"data": json.dumps({"correlation_id": "doc-2",
                                                            "pages": pages})})
        svc.wait_until(lambda: r.xlen(f"{prefix}:merged") == 1, timeout=60,
                       what="the merged output")
        ((_, merged),) = r.xrange(f"{prefix}:merged")
        data = json.loads(merged["data"])
        assert data["failed"] == [7]
        assert [o and (o["page"], o["attempt"]) for o in data["items"]] == [
            None if n == 7 else (page, 2) for n, page in enumerate(pages)]
        verdicts = [f for _, f in r.xrange(f"{prefix}:pages:draft:loop")
                    if f["type"] == "pages:draft:verdict"]
        assert Counter(int(f["item"]) for f in verdicts) == {n: 2 for n in range(20)}
        assert r.xlen(f"{prefix}:run:failed") == 0  # the exhausted item ended nothing
        assert len({o["pid"] for o in data["items"] if o}) == 2, "both processes drafted"
    finally:
        r.close()
        assert svc.stop() == 0, svc.log()
