"""Changing a pipeline never replays history (docs/reference.md, Changing a pipeline),
under ``printery-workers --app`` on a real server: a step added after the first start
starts at the end of its stream (and says so); a step ``renamed_from`` its old name
keeps the old group's position and the entry a killed process left pending; ``printery
backfill`` hands the older entries on purpose."""

from __future__ import annotations

import json
import signal
import textwrap
from pathlib import Path

import redis

from printery.servers.process import ServerProcess
from printery.testing import unique_prefix
from support.operator_cli import cli_sync
from support.service import ServiceHandle, spawn

STEPS = {
    # the first version: `work` (an entry asking to hang does, until its process is killed)
    "work": """
        @pipeline.step("work", consumes=["in"], produces=["worked"])
        async def work(msg: Message) -> Output:
            if msg.data.get("hang"):
                await asyncio.Event().wait()
            return Output("worked", {**msg.data, "by": "work"})
    """,
    # a harmless step added later
    "audit": """
        @pipeline.step("audit", consumes=["in"], produces=["audited"])
        async def audit(msg: Message) -> Output:
            return Output("audited", msg.data)
    """,
    # `work` renamed
    "labour": """
        @pipeline.step("labour", consumes=["in"], produces=["worked"], renamed_from="work")
        async def labour(msg: Message) -> Output:
            return Output("worked", {**msg.data, "by": "labour"})
    """,
}


def _app(tmp_path: Path, name: str, *steps: str) -> None:
    body = "".join(textwrap.dedent(STEPS[s]) for s in steps)
    (tmp_path / f"{name}.py").write_text(
        "import asyncio\n\nfrom printery import Message, Output, Pipeline\n\n"
        # `worked` is the runs' outcome (a run gets one), `audited` a record beside it
        'pipeline = Pipeline("changes", ingress=["in"], outcomes=["worked"])\n' + body)


def _start(server: ServerProcess, prefix: str, tmp_path: Path, app: str) -> ServiceHandle:
    return spawn(["--redis-url", server.url, "--stream-prefix", prefix, "--app", f"{app}:pipeline"],
                 cwd=tmp_path)


def _put(r: redis.Redis, prefix: str, run: str, **data: object) -> None:
    r.xadd(f"{prefix}:in", {"data": json.dumps({"correlation_id": run, **data})})


def _outputs(r: redis.Redis, prefix: str, event_type: str) -> list[dict[str, object]]:
    return [json.loads(fields["data"]) for _, fields in r.xrange(f"{prefix}:{event_type}")]


def _runs(r: redis.Redis, prefix: str, event_type: str) -> list[object]:
    return sorted(d["correlation_id"] for d in _outputs(r, prefix, event_type))


def test_a_step_added_later_starts_at_the_end_and_backfill_hands_it_the_rest(
        server: ServerProcess, tmp_path: Path) -> None:
    prefix = unique_prefix("added")
    r = redis.Redis.from_url(server.url, decode_responses=True)
    _app(tmp_path, "v1", "work")
    _app(tmp_path, "v2", "work", "audit")
    svc = _start(server, prefix, tmp_path, "v1")
    try:
        for n in range(3):
            _put(r, prefix, f"r{n}")
        svc.wait_until(lambda: len(_outputs(r, prefix, "worked")) == 3, what="3 handled")
    finally:
        assert svc.stop() == 0
    svc = _start(server, prefix, tmp_path, "v2")
    try:
        _put(r, prefix, "r3")
        svc.wait_until(lambda: _outputs(r, prefix, "audited"), what="r3 audited")
        svc.wait_until(lambda: len(_outputs(r, prefix, "worked")) == 4, what="r3 worked")
        assert _runs(r, prefix, "audited") == ["r3"]  # not the 3 entries before it
        line = next(json.loads(x) for x in svc.log().splitlines()
                    if "starts at the end of its stream" in x)
        assert (line["step"], line["stream"]) == ("audit", f"{prefix}:in")
        assert line["id"] == r.xrange(f"{prefix}:in")[2][0]  # the last one before it
        assert svc.log().count("starts at the end of its stream") == 1  # only audit's

        done = cli_sync(server.url, prefix, "--app", "v2:pipeline", "backfill", "audit",
                        "--json", cwd=str(tmp_path))
        assert done.returncode == 0, done.stderr
        assert json.loads(done.stdout)["count"] == 3
        svc.wait_until(lambda: _runs(r, prefix, "audited") == ["r0", "r1", "r2", "r3"],
                       what="the history audited")
        svc.wait_until(lambda: r.xinfo_groups(f"{prefix}:in")[-1]["lag"] == 0
                       and all(g["pending"] == 0 for g in r.xinfo_groups(f"{prefix}:in")),
                       what="the copies read by every group")
        assert len(_outputs(r, prefix, "worked")) == 4  # work skipped the copies

        again = cli_sync(server.url, prefix, "--app", "v2:pipeline", "backfill", "audit",
                         cwd=str(tmp_path))
        assert (again.returncode, again.stdout.strip()) == (0, "0 entries handed to audit")
        for bad in (["backfill", "nosuch"], ["backfill", "audit", "--since", "soon"]):
            refused = cli_sync(server.url, prefix, "--app", "v2:pipeline", *bad,
                               cwd=str(tmp_path))
            assert refused.returncode == 2, refused.stderr
    finally:
        assert svc.stop() == 0


def test_a_renamed_step_keeps_the_position_and_the_pending_entry_of_a_killed_process(
        server: ServerProcess, tmp_path: Path) -> None:
    prefix = unique_prefix("renamed")
    r = redis.Redis.from_url(server.url, decode_responses=True)
    _app(tmp_path, "v1", "work")
    _app(tmp_path, "v3", "labour")
    svc = _start(server, prefix, tmp_path, "v1")
    try:
        for n in range(3):
            _put(r, prefix, f"r{n}")
        svc.wait_until(lambda: len(_outputs(r, prefix, "worked")) == 3, what="3 handled")
        _put(r, prefix, "r3", hang=True)
        svc.wait_until(lambda: r.xpending(f"{prefix}:in", "work")["pending"] == 1,
                       what="r3 held")
    finally:
        svc.stop(signal.SIGKILL)
    svc = _start(server, prefix, tmp_path, "v3")
    try:
        _put(r, prefix, "r4")
        svc.wait_until(lambda: len(_outputs(r, prefix, "worked")) == 5, what="r3 and r4 handled")
        by_labour = sorted(d["correlation_id"] for d in _outputs(r, prefix, "worked")
                           if d["by"] == "labour")
        assert by_labour == ["r3", "r4"]  # the pending one and the new one: no history
        assert [g["name"] for g in r.xinfo_groups(f"{prefix}:in")] == ["labour"]
        assert "consumer group renamed" in svc.log()
    finally:
        assert svc.stop() == 0
    svc = _start(server, prefix, tmp_path, "v3")  # the rename applied twice: nothing
    try:
        _put(r, prefix, "r5")
        svc.wait_until(lambda: len(_outputs(r, prefix, "worked")) == 6, what="r5 handled")
        assert "consumer group renamed" not in svc.log()
    finally:
        assert svc.stop() == 0


def test_the_first_start_of_two_processes_at_once_reads_from_the_beginning(
        server: ServerProcess, tmp_path: Path) -> None:
    prefix = unique_prefix("first")
    r = redis.Redis.from_url(server.url, decode_responses=True)
    _app(tmp_path, "v2", "work", "audit")
    for n in range(5):  # written before any process started
        _put(r, prefix, f"r{n}")
    svc = spawn(["--redis-url", server.url, "--stream-prefix", prefix, "--app", "v2:pipeline",
                 "--processes", "2"], cwd=tmp_path)
    try:
        svc.wait_until(lambda: len(_outputs(r, prefix, "worked")) == 5
                       and len(_outputs(r, prefix, "audited")) == 5, what="all handled by both")
        assert "starts at the end of its stream" not in svc.log()
        assert {g["last-delivered-id"] for g in r.xinfo_groups(f"{prefix}:in")} == {
            r.xrange(f"{prefix}:in")[-1][0]}
    finally:
        assert svc.stop() == 0
