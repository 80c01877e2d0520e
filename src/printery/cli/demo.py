"""``printery demo``: the five-minute tour in one command.

Starts a throwaway server from the packaged binary (in a temp dir, so the demo never
touches ``./.printery``), local stand-in services and a webhook sink, and the five
workers in this process; emits one deployment per outcome plus one whose webhook fails
over to review; prints the outcome table and one trace; stops everything; exits 0.
"""

from __future__ import annotations

import asyncio
import tempfile
import uuid
from typing import Any

import click

from printery import ConsumerSettings, WorkerManager, _json
from printery.cli.ops_common import OpsContext, table
from printery.cli.ops_trace import trace
from printery.deploy.app import build_pipeline
from printery.deploy.events import FINISHED, STARTED
from printery.deploy.sandbox import Sandbox
from printery.deploy.settings import DeploySettings
from printery.fields import KIND
from printery.keys import StreamKeys
from printery.logging import configure_logging
from printery.transport.connection import connect
from printery.transport.embedded import start_ephemeral

DEMO_SETTINGS = {
    "health_monitor": {"interval": 0.2, "consecutive": 2, "deadline": 3, "probe_timeout": 1},
    "dependency_checker": {"probe_timeout": 1, "retries": 1},
    "notifier": {"retries": 1, "backoff_ms": 100, "timeout": 2},
    "aggregator": {"branch_deadline": 30},
}


def scenarios(sandbox: Sandbox) -> list[tuple[str, dict[str, Any]]]:
    ok_hook = f"webhook+{sandbox.url('/hooks/ok')}"
    base = {"service": "billing-api", "version": "1.4.2", "environment": "staging",
            "requested_by": "alice", "health_url": sandbox.url("/svc/healthy/1.4.2"),
            "notify": [ok_hook, "log"]}
    ledger = {"service": "ledger", "health_url": sandbox.url("/svc/healthy/2.3.0"),
              "version": ">=2.0,<3"}
    return [
        ("succeeded", {**base, "dependencies": [ledger]}),
        ("rejected", {**base, "version": "one.two", "environment": "moon"}),
        ("blocked", {**base, "dependencies": [
            ledger, {"service": "payments", "health_url": sandbox.url("/svc/failing")}]}),
        ("unhealthy", {**base, "health_url": sandbox.url("/svc/healthy/1.4.1")}),
        ("webhook fails -> review", {**base, "notify": [f"webhook+{sandbox.url('/hooks/fail')}"]}),
    ]


async def run_demo(url: str, prefix: str) -> list[dict[str, Any]]:
    sandbox = Sandbox(slow_seconds=10)
    await sandbox.start()
    client = connect(url, block_ms=200)
    pipeline = build_pipeline(DeploySettings.model_validate(DEMO_SETTINGS))
    keys = StreamKeys(prefix)
    codec = pipeline.codec()
    manager = WorkerManager(drain_timeout=3)
    for worker, deps in pipeline.build_workers(
        client=client, keys=keys, settings=ConsumerSettings(block_ms=200)
    ):
        manager.register(worker, deps)
    await manager.start_all()
    rows: list[dict[str, Any]] = []
    try:
        for name, request in scenarios(sandbox):
            envelope = codec.new(STARTED, request, producer="printery-demo")
            await client.xadd(keys.stream(STARTED), dict(codec.encode(envelope)))  # type: ignore[arg-type]
            rows.append({"scenario": name, "deployment_id": envelope.correlation_id})
        wanted = {r["deployment_id"] for r in rows}
        finished: dict[str, dict[str, Any]] = {}
        loop = asyncio.get_running_loop()
        deadline = loop.time() + 60
        stderr = click.get_text_stream("stderr")  # type: ignore[operator]
        with click.progressbar(length=len(rows), label="deployments finished", file=stderr) as bar:
            while len(finished) < len(rows) and loop.time() < deadline:
                for _id, fields in await client.xrange(keys.stream(FINISHED)):
                    cid = fields.get("deployment_id", "")
                    if cid in wanted and cid not in finished:
                        finished[cid] = codec.decode(fields, FINISHED).data
                        bar.update(1)
                await asyncio.sleep(0.1)
        # Let the notifier record its deliveries before the table is printed.
        await asyncio.sleep(1.0)
        review_entries = await client.xrange(keys.review)
        reviews = {f.get("deployment_id"): f.get(KIND) for _, f in review_entries}
        for row in rows:
            result = finished.get(row["deployment_id"], {"status": "timeout", "reasons": []})
            row["status"] = result["status"]
            row["reasons"] = ",".join(sorted({r["code"] for r in result.get("reasons", [])}))
            row["review"] = reviews.get(row["deployment_id"], "")
        return rows
    finally:
        await manager.stop_all(3)
        await client.aclose()
        await sandbox.stop()


@click.command()
@click.option("--json", "as_json", is_flag=True, help="print the outcome table as JSON")
@click.pass_context
def demo(ctx: click.Context, as_json: bool) -> None:
    """The five-minute tour: server, demo services, workers, one deployment per outcome."""
    configure_logging("error")
    server = start_ephemeral(tempfile.mkdtemp(prefix="printery-demo-"), appendonly=False)
    prefix = f"printery-demo:{uuid.uuid4().hex[:8]}"
    try:
        rows = asyncio.run(run_demo(server.url, prefix))
        if as_json:
            click.echo(_json.dumps(rows))
        else:
            click.echo(table(
                [(r["scenario"], r["deployment_id"], r["status"], r["reasons"], r["review"])
                 for r in rows],
                ["scenario", "deployment_id", "status", "reasons", "review"],
            ))
            click.echo(f"\ntrace of {rows[0]['deployment_id']} (the successful one):")
            ctx.obj = OpsContext(flags={"redis_url": server.url, "stream_prefix": prefix,
                                        "data_dir": None, "config": None})
            ctx.invoke(trace, deployment_id=rows[0]["deployment_id"], as_json=False)
    finally:
        server.stop()
    expected = ["succeeded", "rejected", "blocked", "unhealthy", "succeeded"]
    if [r["status"] for r in rows] != expected:
        raise SystemExit(1)
