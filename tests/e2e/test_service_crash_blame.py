"""A crash blames the crasher (docs/reference.md, Failures), as issue 39 found
it: one entry whose handler calls ``os._exit`` among slow healthy ones of a step with
``concurrency=4``, under ``printery-workers --processes 2 --supervised``. Before, every death
counted as a delivery of each entry its process held, so the healthy entries in flight
beside the poison were dead-lettered with it (``max_deliveries_exceeded``, "the process
handling it died"). Now the entries a dead process held are suspects that run alone: the
poison alone is dead-lettered, every healthy entry is handled once. At ``max_deliveries``
1 the old rule dead-lettered every entry in flight beside the poison at its first death."""

from __future__ import annotations

import json
import textwrap
from pathlib import Path

import redis

from printery.servers.process import ServerProcess
from printery.testing import unique_prefix
from support.service import spawn

APP = textwrap.dedent(
    """
    import asyncio
    import os

    from printery import Message, Output, Pipeline

    pipeline = Pipeline("parsing", ingress=["doc"])


    running = 0


    @pipeline.step("parse", consumes=["doc"], produces=["parsed"], concurrency=4)
    async def parse(msg: Message) -> Output:
        global running
        print(f"parse {msg.data['n']} delivery {msg.deliveries}", flush=True)
        if msg.data.get("poison"):
            # It dies with neighbours in flight when it has any (a second at most).
            for _ in range(100):
                if running >= 2:
                    break
                await asyncio.sleep(0.01)
            os._exit(1)  # a segfaulting parser, as far as its process can tell
        running += 1
        try:
            await asyncio.sleep(1.5)
        finally:
            running -= 1
        return Output("parsed", {"n": msg.data["n"]})
    """
)

HEALTHY = 8
POISON = 4
MAX_DELIVERIES = 1  # one death among several used to dead-letter each entry in flight


def test_one_poison_entry_is_dead_lettered_alone_and_its_neighbours_finish(
    server: ServerProcess, tmp_path: Path
) -> None:
    prefix = unique_prefix("blame")
    (tmp_path / "parsing.py").write_text(APP)
    (tmp_path / "p.toml").write_text(
        f"[transport]\nmax_deliveries = {MAX_DELIVERIES}\nclaim_interval = 0.2\n")
    r = redis.Redis.from_url(server.url, decode_responses=True)
    svc = spawn(["--redis-url", server.url, "--stream-prefix", prefix, "--app", "parsing:pipeline",
                 "--config", str(tmp_path / "p.toml"), "--processes", "2", "--supervised",
                 "--backoff", "50"], cwd=tmp_path)
    try:
        def both_up() -> bool:
            procs = svc.json("/status")["processes"]
            return len(procs) == 2 and all(
                p["workers"].get("parse", {}).get("state") == "running" for p in procs)

        svc.wait_until(both_up, timeout=30, what="two children running")
        entries = {}
        for n in range(HEALTHY + 1):
            data = {"n": n, "poison": n == POISON}
            entries[n] = r.xadd(f"{prefix}:doc", {"data": json.dumps(data),
                                                 "correlation_id": f"doc-{n}"})

        def settled() -> bool:  # each entry handled or dead-lettered, none pending
            return bool(r.xlen(f"{prefix}:parsed") + r.xlen(f"{prefix}:dlq") >= HEALTHY + 1
                        and r.xpending(f"{prefix}:doc", "parse")["pending"] == 0)

        svc.wait_until(settled, timeout=90, what="every entry settled")
        dead = [fields for _, fields in r.xrange(f"{prefix}:dlq")]
        assert [d["source_id"] for d in dead] == [entries[POISON]], dead
        (letter,) = dead
        assert letter["reason_code"] == "max_deliveries_exceeded"
        assert "died or was killed" in letter["error"]
        parsed = sorted(json.loads(f["data"])["n"] for _, f in r.xrange(f"{prefix}:parsed"))
        assert parsed == [n for n in range(HEALTHY + 1) if n != POISON], "each healthy one once"
        failed = [json.loads(f["data"]) for _, f in r.xrange(f"{prefix}:run:failed")]
        assert [f["step"] for f in failed] == ["parse"] and len(failed) == 1
        log = svc.log()
        assert "entries held by a process that died are suspects" in log
        assert "a suspect ran alone and its process lives: cleared" in log
        # The poison ran once among others, then alone until its deaths passed the limit.
        assert log.count(f"parse {POISON} delivery") == MAX_DELIVERIES + 1
    finally:
        assert svc.stop() == 0, svc.log()
        r.close()
