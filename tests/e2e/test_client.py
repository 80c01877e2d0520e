"""``Client`` and ``SyncClient`` (docs/reference.md, Runs) against a real server and a real
``printery-workers`` process: submit, result, watch, idempotency, validation, restarts."""

from __future__ import annotations

import asyncio
import json
import subprocess
import sys
import textwrap
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
import redis.asyncio as aioredis
from examples import docflow

from printery import Client, InvalidInput, SyncClient, UnknownRun
from printery.servers.process import ServerProcess
from printery.testing import unique_prefix, wait_for
from support.operator_cli import cli
from support.service import ServiceHandle, spawn

ROOT = Path(__file__).resolve().parents[2]


def request(deployment_id: str | None = None, **extra: Any) -> dict[str, Any]:
    data: dict[str, Any] = {"service": "billing-api", "version": "1.0.0",
                            "environment": "development", "requested_by": "alice",
                            "notify": ["log"], **extra}
    if deployment_id is not None:
        data["deployment_id"] = deployment_id
    return data


@pytest.fixture
def service(server: ServerProcess, tmp_path: Path) -> Iterator[tuple[ServiceHandle, str]]:
    prefix = unique_prefix()
    handle = spawn(["--redis-url", server.url, "--stream-prefix", prefix], cwd=tmp_path)
    yield handle, prefix
    handle.stop()


async def test_submit_then_result_from_another_process(
    server: ServerProcess, service: tuple[ServiceHandle, str]
) -> None:
    _, prefix = service
    async with Client(server.url, stream_prefix=prefix) as client:
        run_id = await client.submit(request())
        assert run_id.startswith("dep-")
        result = await client.result(run_id, timeout=30)
    assert result.run_id == run_id
    assert result.status == "succeeded"
    assert result.data["deployment_id"] == run_id
    streams = [entry["stream"] for entry in result.entries]
    assert streams[0] == "deployment:started" and streams[-1] == "deployment:finished"
    assert {"deployment:validated", "dependencies:checked", "health:checked"} <= set(streams)
    assert all(entry["deployment_id"] == run_id for entry in result.entries)
    # The ingress entry carries every field of an entry, written by the client.
    first = result.entries[0]
    assert first["producer"] == "printery-client" and first["attempt"] == 1
    assert first["idempotency_key"] == f"deployment:started:{run_id}"


async def test_result_of_a_finished_run_and_watch_after_the_fact(
    server: ServerProcess, service: tuple[ServiceHandle, str]
) -> None:
    _, prefix = service
    async with Client(server.url, stream_prefix=prefix) as client:
        run_id = await client.submit(request("dep-after-1"))
        first = await client.result(run_id, timeout=30)
    # A client that starts after the run ended sees the same.
    async with Client(server.url, stream_prefix=prefix) as late:
        again = await late.result(run_id, timeout=5)
        watched = [entry async for entry in late.watch(run_id, timeout=5)]
    assert again.status == first.status == "succeeded"
    assert [e["id"] for e in watched] == [e["id"] for e in first.entries]
    assert watched[-1]["stream"] == "deployment:finished"
    ids = [tuple(int(p) for p in e["id"].split("-")) for e in watched]
    assert ids == sorted(ids)


async def test_watch_live_delivers_every_entry_in_order_and_ends(
    server: ServerProcess, tmp_path: Path
) -> None:
    prefix = unique_prefix()
    async with Client(server.url, stream_prefix=prefix) as client:
        run_id = await client.submit(request("dep-live-1"))
        seen: list[dict[str, Any]] = []

        async def watch() -> None:
            async for entry in client.watch(run_id, timeout=40):
                seen.append(entry)

        watcher = asyncio.create_task(watch())
        # Only the ingress entry exists until the service starts.
        handle = spawn(["--redis-url", server.url, "--stream-prefix", prefix], cwd=tmp_path)
        try:
            await asyncio.wait_for(watcher, 40)
        finally:
            handle.stop()
        history = await client.entries(run_id)
    assert seen[0]["stream"] == "deployment:started"
    assert seen[-1]["stream"] == "deployment:finished"
    # Everything up to the outcome, in the order trace shows it.
    upto = [e["id"] for e in history][: len(seen)]
    assert [e["id"] for e in seen] == upto


async def test_a_dead_lettered_entry_ends_its_run_failed(
    server: ServerProcess, service: tuple[ServiceHandle, str]
) -> None:
    """docs/reference.md, Failures: the dead letter's ``run:failed`` ends the run:
    ``watch`` (live) ends with it, ``result`` is ``failed`` with the outcome's data,
    naming the dlq entry."""
    _, prefix = service
    run_id = f"dep-dead-{unique_prefix()[-8:]}"
    async with Client(server.url, stream_prefix=prefix) as client:
        seen: list[dict[str, Any]] = []

        async def watch() -> None:
            async for entry in client.watch(run_id, timeout=40):
                seen.append(entry)

        watcher = asyncio.create_task(watch())
        conn = aioredis.Redis.from_url(server.url, decode_responses=True)
        bad = await conn.xadd(f"{prefix}:deployment:started",
                              {"deployment_id": run_id, "data": "{not json"})
        await asyncio.wait_for(watcher, 40)
        result = await client.result(run_id, timeout=30)
        await conn.aclose()
    assert [e["stream"] for e in seen] == ["deployment:started", "dlq", "run:failed"]
    assert seen[0]["id"] == bad
    assert result.status == "failed"
    assert result.data["reason_code"] == "undecodable" and result.data["step"] == "validator"
    assert result.data["dlq_id"] == seen[1]["id"]
    assert [e["id"] for e in result.entries] == [e["id"] for e in seen]


async def test_invalid_input_raises_with_reasons_and_writes_nothing(
    server: ServerProcess, client: aioredis.Redis
) -> None:
    prefix = unique_prefix()
    async with Client(server.url, stream_prefix=prefix) as pc:
        with pytest.raises(InvalidInput) as caught:
            await pc.submit({"service": "Bad Name", "version": "one",
                             "environment": "moon"})
    codes = {(r.code, r.field) for r in caught.value.reasons}
    assert ("missing_field", "requested_by") in codes
    assert ("invalid_field", "service") in codes
    assert ("invalid_version", "version") in codes
    assert ("unknown_environment", "environment") in codes
    async with Client(server.url, stream_prefix=prefix) as pc:
        for data in ("str", ["a"], 1.5, None):  # no step's input: refused, nothing written
            with pytest.raises(InvalidInput) as caught:
                await pc.submit(data)
            assert [(r.code, r.field) for r in caught.value.reasons] == [("invalid_field", "data")]
    assert await client.keys(f"{prefix}:*") == []


async def test_docflow_submit_and_result(server: ServerProcess, tmp_path: Path) -> None:
    prefix = unique_prefix()
    handle = spawn(["--redis-url", server.url, "--stream-prefix", prefix,
                    "--app", "examples.docflow:pipeline"], cwd=ROOT,
                   log_path=tmp_path / "service.log")
    try:
        async with Client(server.url, stream_prefix=prefix, app=docflow.pipeline) as client:
            with pytest.raises(InvalidInput) as caught:
                await client.submit({"doc_id": "d1"})  # no text: the step's input model
            assert [(r.code, r.field) for r in caught.value.reasons] == [("missing_field", "text")]
            run_id = await client.submit({"doc_id": "inv-7", "text": docflow.SAMPLES["invoice-1"]})
            result = await client.result(run_id, timeout=30)
    finally:
        handle.stop()
    assert run_id == "inv-7"
    assert result.status == "doc:published"
    assert result.data == {"doc_id": "inv-7", "label": "invoice", "summary": result.data["summary"]}
    assert result.cost.get("tokens", 0) > 0


async def test_same_idempotency_key_gives_one_run(
    server: ServerProcess, client: aioredis.Redis
) -> None:
    prefix = unique_prefix()
    async with Client(server.url, stream_prefix=prefix) as pc:
        runs = await asyncio.gather(*(pc.submit(request(), idempotency_key="order-77")
                                      for _ in range(20)))
    assert len(set(runs)) == 1
    assert await client.xlen(f"{prefix}:deployment:started") == 1


def test_two_processes_submitting_one_key_at_once(
    server: ServerProcess, tmp_path: Path
) -> None:
    prefix = unique_prefix()
    script = textwrap.dedent(f"""
        import sys
        from printery import SyncClient
        with SyncClient({server.url!r}, stream_prefix={prefix!r}) as client:
            sys.stdin.readline()  # both start together
            for _ in range(50):
                print(client.submit({json.dumps(request())}, idempotency_key="same-key"))
    """)
    procs = [subprocess.Popen([sys.executable, "-c", script], stdin=subprocess.PIPE,
                              stdout=subprocess.PIPE, text=True, cwd=ROOT) for _ in range(2)]
    for proc in procs:
        assert proc.stdin is not None
        proc.stdin.write("go\n")
        proc.stdin.flush()
    outputs = [proc.communicate(timeout=60)[0].split() for proc in procs]
    assert all(proc.returncode == 0 for proc in procs)
    assert len(outputs[0]) == len(outputs[1]) == 50
    assert len(set(outputs[0] + outputs[1])) == 1
    with SyncClient(server.url, stream_prefix=prefix) as client:
        entries = client.entries(outputs[0][0])
    assert [e["stream"] for e in entries] == ["deployment:started"]


def test_sync_client_from_plain_code(server: ServerProcess, service: tuple[ServiceHandle, str]) -> None:
    _, prefix = service
    with SyncClient(server.url, stream_prefix=prefix) as client:
        run_id = client.submit(request())
        result = client.result(run_id, timeout=30)
        watched = list(client.watch(run_id, timeout=5))
        with pytest.raises(UnknownRun):
            client.entries("dep-never-submitted")
        with pytest.raises(TimeoutError):
            client.result("dep-never-submitted", timeout=0.5)
    assert result.status == "succeeded"
    assert [e["id"] for e in watched] == [e["id"] for e in result.entries]


async def test_result_survives_kill_9_and_server_restart(own_server: ServerProcess, tmp_path: Path) -> None:
    prefix = unique_prefix()
    async with Client(own_server.url, stream_prefix=prefix) as client:
        run_id = await client.submit(request("dep-restart-1", health_url="http://127.0.0.1:9/none"))
        waiter = asyncio.create_task(client.result(run_id, timeout=90))
        # No service yet: the run cannot end. The server restarts under the waiter.
        own_server.stop()
        own_server.start()
        handle = spawn(["--redis-url", own_server.url, "--stream-prefix", prefix], cwd=tmp_path)
        # kill -9 mid-run: once the health monitor holds the run's entry (its probe of a
        # closed port waits out the default deadline).
        await wait_for(lambda: _held(own_server.url, f"{prefix}:deployment:validated",
                                     "health-monitor"), timeout=30,
                       message="the health monitor holding the run's entry")
        handle.kill()
        # What the killed process had read is claimed once idle past the visibility
        # timeout: a short one, so the test does not depend on how far it got.
        config = _fast_health(tmp_path)
        config.write_text(config.read_text() + "[transport]\nvisibility_timeout = 2\n")
        handle = spawn(["--redis-url", own_server.url, "--stream-prefix", prefix], cwd=tmp_path,
                       env={"PRINTERY_CONFIG": str(config)})
        try:
            result = await asyncio.wait_for(waiter, 90)
        finally:
            handle.stop()
    assert result.status == "unhealthy"
    assert result.data["deployment_id"] == run_id


async def _held(url: str, stream: str, group: str) -> bool:
    conn = aioredis.Redis.from_url(url, decode_responses=True)
    try:
        return bool(await conn.xpending_range(stream, group, min="-", max="+", count=1))
    except aioredis.ResponseError:  # no such group yet
        return False
    finally:
        await conn.aclose()


def _fast_health(tmp_path: Path) -> Path:
    config = tmp_path / "fast.toml"
    config.write_text("[health_monitor]\ndeadline = 2\ninterval = 0.2\nprobe_timeout = 0.5\n")
    return config


async def test_printery_watch_follows_a_run_live(server: ServerProcess, tmp_path: Path) -> None:
    prefix = unique_prefix()
    async with Client(server.url, stream_prefix=prefix) as client:
        ok = await client.submit(request("dep-watch-ok"))
        bad = await client.submit(request("dep-watch-bad", health_url="http://127.0.0.1:9/x"))
    watchers = [asyncio.create_task(cli(server.url, prefix, "watch", ok)),
                asyncio.create_task(cli(server.url, prefix, "watch", "--json", ok)),
                asyncio.create_task(cli(server.url, prefix, "watch", bad))]
    handle = spawn(["--redis-url", server.url, "--stream-prefix", prefix,
                    "--config", str(_fast_health(tmp_path))], cwd=tmp_path)
    try:
        (code, out, _), (jcode, jout, _), (bcode, bout, _) = await asyncio.wait_for(
            asyncio.gather(*watchers), 60)
    finally:
        handle.stop()
    assert code == 0 and out.strip().endswith(f"deployment_id {ok}: succeeded")
    assert "deployment:started" in out and "deployment:finished" in out
    lines = [json.loads(line) for line in jout.splitlines()]
    assert jcode == 0 and lines[0]["stream"] == "deployment:started"
    assert lines[-1]["stream"] == "deployment:finished"
    assert bcode == 1 and bout.strip().endswith(f"deployment_id {bad}: unhealthy")
    code, _, err = await cli(server.url, prefix, "watch", "--timeout", "0.5", "dep-nobody")
    assert code == 3 and "did not end" in err


async def test_emit_for_any_pipeline(server: ServerProcess, tmp_path: Path) -> None:
    prefix = unique_prefix()
    app = ("--app", "examples.docflow:pipeline")
    code, out, _ = await cli(server.url, prefix, *app, "emit", "--type", "doc:submitted",
                             "--data", json.dumps({"doc_id": "d-1"}), "--json")
    assert code == 1
    refused = json.loads(out)
    assert refused["status"] == "rejected" and refused["published"] is False
    assert [(r["code"], r["field"]) for r in refused["reasons"]] == [("missing_field", "text")]
    handle = spawn(["--redis-url", server.url, "--stream-prefix", prefix, *app], cwd=ROOT,
                   log_path=tmp_path / "service.log")
    try:
        data = json.dumps({"doc_id": "inv-9", "text": docflow.SAMPLES["invoice-1"]})
        code, out, err = await cli(server.url, prefix, *app, "emit", "--data", data, "--wait",
                                   "--json")
    finally:
        handle.stop()
    done = json.loads(out)
    assert done["doc_id"] == "inv-9" and done["status"] == "doc:published", err
    assert done["finished"]["data"]["label"] == "invoice"
    assert code == 1  # docs/reference.md, Commands: exit 0 only for the status `succeeded`


async def test_submit_after_the_server_forgot_its_scripts(
    server: ServerProcess, client: aioredis.Redis
) -> None:
    prefix = unique_prefix()
    async with Client(server.url, stream_prefix=prefix) as pc:
        first = await pc.submit(request("dep-script-1"))
        await client.script_flush()  # as a restarted server without its script cache
        second = await pc.submit(request("dep-script-2"))
        again = await pc.submit(request("dep-script-2"))
    assert (first, second, again) == ("dep-script-1", "dep-script-2", "dep-script-2")
    assert await client.xlen(f"{prefix}:deployment:started") == 2
