"""``printery demo``: the five-minute tour in one command.

Starts a throwaway server from the packaged binary (in a temp dir, so the demo never
touches ``./.printery``), local stand-in services and a webhook sink, and the five
workers in this process; submits one deployment per outcome plus one whose webhook fails
over to review through the public :class:`~printery.Client`, as an application does, and
waits for their outcomes with it; prints the outcome table and one trace; stops
everything; exits 0.
"""

from __future__ import annotations

import asyncio
import tempfile
import uuid
from typing import Any

import click

from printery import Client, ConsumerSettings, WorkerManager
from printery.base import _json
from printery.base._util import new_id
from printery.base.errors import InvalidInput
from printery.cli.ops_common import OpsContext, table
from printery.cli.ops_trace import trace
from printery.deploy.app import build_pipeline
from printery.deploy.events import NOTIFICATION_SENT
from printery.deploy.sandbox import Sandbox
from printery.deploy.settings import DeploySettings
from printery.observe.logging import configure_logging
from printery.servers.embedded import start_ephemeral
from printery.wire.fields import KIND
from printery.wire.keys import REVIEW

#: Seconds a run is given to end, and then its notifier to record its deliveries.
OUTCOME_TIMEOUT = 60.0
NOTIFIED_TIMEOUT = 10.0

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
    pipeline = build_pipeline(DeploySettings.model_validate(DEMO_SETTINGS))
    manager = WorkerManager(drain_timeout=3)
    try:
        async with Client(url, stream_prefix=prefix, app=pipeline,
                          producer="printery-demo") as client:
            for worker, deps in pipeline.build_workers(
                client=client.redis, keys=client.keys, settings=ConsumerSettings(block_ms=200)
            ):
                manager.register(worker, deps)
            await manager.start_all()
            rows = [await _submit(client, name, request) for name, request in scenarios(sandbox)]
            stderr = click.get_text_stream("stderr")  # type: ignore[operator]
            with click.progressbar(length=len(rows), label="deployments finished",
                                   file=stderr) as bar:
                await asyncio.gather(*(_outcome(client, row, bar) for row in rows))
            return rows
    finally:
        await manager.stop_all(3)
        await sandbox.stop()


async def _submit(client: Client, name: str, request: dict[str, Any]) -> dict[str, Any]:
    """The scenario's row: submitted, or refused by the ingress step before anything is
    written (what an application sees of a request the validator rejects)."""
    field = client.pipeline.correlation_field
    request = {**request, field: new_id(client.pipeline.id_prefix)}
    row: dict[str, Any] = {"scenario": name, "deployment_id": request[field]}
    try:
        await client.submit(request)
    except InvalidInput as exc:
        row.update(status="rejected", review="",
                   reasons=",".join(sorted({r.code for r in exc.reasons})))
    return row


async def _outcome(client: Client, row: dict[str, Any], bar: Any) -> None:
    """The run's outcome in ``row``, then the notifier's records of it: the table shows
    the review a failed delivery opens, which the notifier writes after the outcome (one
    commit with its ``notification:sent`` entries, so once one of those is there, all of
    them are)."""
    if "status" in row:
        bar.update(1)
        return
    run_id = row["deployment_id"]
    try:
        result = await client.result(run_id, timeout=OUTCOME_TIMEOUT)
    except TimeoutError:
        row.update(status="timeout", reasons="", review="")
        bar.update(1)
        return
    bar.update(1)
    row["status"] = result.data["status"]
    row["reasons"] = ",".join(sorted({r["code"] for r in result.data.get("reasons", [])}))
    loop = asyncio.get_running_loop()
    deadline = loop.time() + NOTIFIED_TIMEOUT
    entries = await client.entries(run_id)
    while not any(e.get("type") == NOTIFICATION_SENT for e in entries) and loop.time() < deadline:
        await asyncio.sleep(0.05)
        entries = await client.entries(run_id)
    row["review"] = next((str(e.get(KIND, "")) for e in entries if e.get("type") == REVIEW), "")


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
