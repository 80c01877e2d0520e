"""The chaos run (issue 6 item 1), shared by the in-suite test and the soak.

Three ``printery-workers`` processes and one append-only server, reached through a TCP
proxy the run owns; real local health endpoints and a real webhook sink (the deployment
sandbox). While deployments flow: kill -9 a random service process every few seconds and
start it again, restart the server once, cut every connection for two seconds once. At
the end it counts: one ``deployment:finished`` per deployment, one webhook POST per
deployment and channel (distinct idempotency keys; raw repeats are reported, the
contract allows them after a kill between POST and record), an empty ``dlq`` and nothing
pending.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import os
import random
import signal
import subprocess
import sys
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import redis.asyncio as aioredis
from redis.exceptions import ConnectionError as RedisConnectionError
from redis.exceptions import TimeoutError as RedisTimeoutError

from printery.deploy.delivery import IDEMPOTENCY_HEADER
from printery.deploy.sandbox import Sandbox
from printery.servers.process import ServerProcess
from printery.wire.envelope import Codec

STARTED, FINISHED, SENT = "deployment:started", "deployment:finished", "notification:sent"

CONFIG = """\
[transport]
visibility_timeout = 3
claim_interval = 0.5

[health_monitor]
interval = 0.05
consecutive = 1
deadline = 30
probe_timeout = 2

[dependency_checker]
probe_timeout = 2
retries = 2

[notifier]
retries = 5
backoff_ms = 100
timeout = 5

[aggregator]
branch_deadline = 90
"""


@dataclass
class Figures:
    deployments: int = 0
    finished: int = 0
    duplicates_finished: int = 0
    lost: int = 0
    webhook_keys: int = 0
    webhook_posts: int = 0
    missing_webhooks: int = 0
    sent_duplicates: int = 0
    dlq: int = 0
    pending: int = 0
    kills: int = 0
    restarts: int = 0
    server_restarts: int = 0
    connection_cuts: int = 0
    #: Masters killed with kill -9 whose replica the cluster promoted (the cluster run).
    master_failovers: int = 0
    seconds: float = 0.0
    #: ``deployment:finished`` statuses (all ``succeeded`` unless a deadline was missed).
    statuses: dict[str, int] = field(default_factory=dict)
    notes: list[str] = field(default_factory=list)

    def line(self) -> str:
        return (
            f"deployments: {self.deployments}, finished: {self.finished}, "
            f"duplicates found: {self.duplicates_finished + self.sent_duplicates}, "
            f"lost: {self.lost}, webhook keys: {self.webhook_keys} "
            f"(POSTs {self.webhook_posts}, repeats deduped by key "
            f"{self.webhook_posts - self.webhook_keys}, missing {self.missing_webhooks}), "
            f"dlq: {self.dlq}, pending: {self.pending}, kills: {self.kills}, "
            f"process restarts: {self.restarts}, server restarts: {self.server_restarts}, "
            f"connection cuts: {self.connection_cuts}, "
            f"master failovers: {self.master_failovers}, seconds: {self.seconds:.1f}, "
            f"statuses: {dict(sorted(self.statuses.items()))}"
        )

    @property
    def ok(self) -> bool:
        return (self.finished == self.deployments and self.duplicates_finished == 0
                and self.lost == 0 and self.missing_webhooks == 0 and self.sent_duplicates == 0
                and self.dlq == 0 and self.pending == 0)


class CuttingProxy:
    """Plain TCP proxy; :meth:`cut` drops every connection and refuses new ones for a while."""

    def __init__(self, upstream_port: int) -> None:
        self.upstream_port = upstream_port
        self.port = 0
        self.blocked_until = 0.0
        self._writers: set[asyncio.StreamWriter] = set()
        self._tasks: set[asyncio.Task[Any]] = set()
        self._server: asyncio.Server | None = None

    async def start(self) -> None:
        self._server = await asyncio.start_server(self._serve, "127.0.0.1", self.port)
        self.port = self._server.sockets[0].getsockname()[1]

    async def stop(self) -> None:
        if self._server:
            self._server.close()
        self._drop()
        for task in list(self._tasks):
            task.cancel()
        await asyncio.gather(*self._tasks, return_exceptions=True)

    def cut(self, seconds: float) -> None:
        self.blocked_until = time.monotonic() + seconds
        self._drop()

    def _drop(self) -> None:
        for writer in list(self._writers):
            with contextlib.suppress(Exception):
                writer.transport.abort()
        self._writers.clear()

    async def _serve(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        task = asyncio.current_task()
        if task is not None:
            self._tasks.add(task)
            task.add_done_callback(self._tasks.discard)
        # The proxy stopping cancels this task: end quietly (asyncio would log it).
        with contextlib.suppress(asyncio.CancelledError):
            await self._relay(reader, writer)

    async def _relay(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        if time.monotonic() < self.blocked_until:
            writer.transport.abort()
            return
        try:
            up_reader, up_writer = await asyncio.open_connection("127.0.0.1", self.upstream_port)
        except OSError:
            writer.transport.abort()
            return
        self._writers.update((writer, up_writer))
        try:
            await asyncio.gather(_pipe(reader, up_writer), _pipe(up_reader, writer))
        finally:
            for w in (writer, up_writer):
                self._writers.discard(w)
                with contextlib.suppress(Exception):
                    w.transport.abort()


async def _pipe(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
    with contextlib.suppress(ConnectionError, OSError):
        while chunk := await reader.read(65536):
            writer.write(chunk)
            await writer.drain()
    with contextlib.suppress(Exception):
        writer.transport.abort()


class Service:
    def __init__(self, index: int, url: str, prefix: str, workdir: Path, config: Path) -> None:
        self.index = index
        self.args = [
            sys.executable, "-m", "printery.cli.workers", "--redis-url", url,
            "--stream-prefix", prefix, "--http-addr", "off", "--supervised",
            "--config", str(config), "--log-level", "warn", "--shutdown-timeout", "5",
            "--health-check-interval", "1", "--max-restarts", "100", "--backoff", "100",
        ]
        self.log = workdir / f"service-{index}.log"
        self.proc: subprocess.Popen[bytes] | None = None

    def start(self) -> None:
        env = {k: v for k, v in os.environ.items()
               if k not in ("REDIS_URL", "STREAM_PREFIX", "PRINTERY_CONFIG", "HTTP_ADDR")}
        with self.log.open("ab") as out:
            self.proc = subprocess.Popen(self.args, stdout=out, stderr=subprocess.STDOUT, env=env)

    def kill(self) -> None:
        if self.proc and self.proc.poll() is None:
            self.proc.kill()
            self.proc.wait(10)

    def terminate(self) -> None:
        if self.proc and self.proc.poll() is None:
            self.proc.send_signal(signal.SIGTERM)

    def stop(self) -> None:
        if self.proc and self.proc.poll() is None:
            self.proc.send_signal(signal.SIGTERM)
            try:
                self.proc.wait(20)
            except subprocess.TimeoutExpired:
                self.kill()


def deployment_request(codec: Codec, sandbox: Sandbox, i: int) -> dict[str, str]:
    deployment_id = f"dep-chaos-{i:06d}"
    data = {
        "deployment_id": deployment_id, "service": f"svc-{i % 50}", "version": "1.0.0",
        "environment": "staging", "requested_by": "chaos",
        "health_url": sandbox.url("/svc/healthy/1.0.0"),
        "notify": [f"webhook+{sandbox.url('/hooks/ok')}"],
    }
    return codec.encode(codec.new(STARTED, data, correlation_id=deployment_id, producer="chaos"))


async def _publish(url: str, prefix: str, sandbox: Sandbox, n: int, over: float) -> None:
    """Publish ``n`` deployments evenly over ``over`` seconds, the way producers do, so
    the pipeline runs in a steady state under the chaos rather than draining one huge
    backlog (whose age alone would exceed the aggregator's branch deadline). A batch cut
    by the server restart is sent again: the validator decides each id once."""
    codec = Codec(correlation_field="deployment_id", id_prefix="dep")
    client = aioredis.Redis.from_url(url, decode_responses=True)
    batches = max(1, int(over / 0.25))
    size = -(-n // batches)
    begun = time.monotonic()
    try:
        for b, start in enumerate(range(0, n, size)):
            while True:
                try:
                    pipe = client.pipeline(transaction=True)
                    for i in range(start, min(n, start + size)):
                        pipe.xadd(f"{prefix}:{STARTED}", deployment_request(codec, sandbox, i))
                    await pipe.execute()
                    break
                except (RedisConnectionError, RedisTimeoutError, OSError):
                    await asyncio.sleep(0.2)
            await asyncio.sleep(max(0.0, begun + (b + 1) * over / batches - time.monotonic()))
    finally:
        await client.aclose()


def status_of(data: str) -> str:
    try:
        return str(json.loads(data).get("status", ""))
    except (ValueError, AttributeError):
        return "undecodable"


async def count_by(
    client: aioredis.Redis, stream: str, field_name: str, key: Any = str
) -> dict[str, int]:
    """How many entries of ``stream`` have each value of ``key(field)``."""
    counts: dict[str, int] = {}
    last = "-"
    while True:
        batch = await client.xrange(stream, last, "+", count=5000)
        if last != "-":
            batch = batch[1:]
        if not batch:
            return counts
        for _id, fields in batch:
            value = key(fields.get(field_name, ""))
            counts[value] = counts.get(value, 0) + 1
        last = batch[-1][0]


async def pending_entries(client: aioredis.Redis, prefix: str) -> int:
    total = 0
    async for key in client.scan_iter(match=f"{prefix}:*", _type="stream"):
        for group in await client.xinfo_groups(key):
            total += int(group["pending"]) + int(group.get("lag") or 0)
    return total


async def run_chaos(
    workdir: Path, *, deployments: int, duration: float, seed: int = 1,
    kill_every: float = 3.0, processes: int = 3, log: Any = print,
) -> Figures:
    """Run the chaos scenario; ``duration`` bounds the chaos phase, after which the run
    waits (bounded) for the pipeline to finish everything."""
    rng = random.Random(seed)
    await asyncio.to_thread(workdir.mkdir, parents=True, exist_ok=True)
    figures = Figures(deployments=deployments)
    server = ServerProcess(workdir / "server")
    server.start()
    proxy = CuttingProxy(server.port)
    await proxy.start()
    sandbox = Sandbox(slow_seconds=5)
    await sandbox.start()
    config = workdir / "printery.toml"
    await asyncio.to_thread(config.write_text, CONFIG)
    prefix = f"chaos:{rng.randrange(16**8):08x}"
    url = f"redis://127.0.0.1:{proxy.port}/0"
    client = aioredis.Redis(port=server.port, decode_responses=True)
    services = [Service(i, url, prefix, workdir, config) for i in range(processes)]
    begun = time.monotonic()
    publisher: asyncio.Task[None] | None = None
    try:
        for service in services:
            service.start()
        ids = [f"dep-chaos-{i:06d}" for i in range(deployments)]
        publisher = asyncio.create_task(_publish(
            f"redis://127.0.0.1:{server.port}/0", prefix, sandbox, deployments,
            over=duration * 0.7))
        publisher.add_done_callback(
            lambda t: t.cancelled() or t.exception() or log(f"published {deployments} deployments"))
        server_restart_at = begun + duration * 0.35
        cut_at = begun + duration * 0.6
        next_kill = begun + kill_every

        async def finished() -> int:
            return int(await client.xlen(f"{prefix}:{FINISHED}"))

        chaos_end = begun + duration
        while time.monotonic() < chaos_end:
            now = time.monotonic()
            if now >= next_kill:
                victim = rng.choice(services)
                victim.kill()
                figures.kills += 1
                victim.start()
                figures.restarts += 1
                next_kill = now + kill_every * rng.uniform(0.6, 1.4)
            if figures.server_restarts == 0 and now >= server_restart_at:
                await asyncio.to_thread(server.restart)
                await client.aclose()
                client = aioredis.Redis(port=server.port, decode_responses=True)
                figures.server_restarts += 1
                log("server restarted")
            if figures.connection_cuts == 0 and now >= cut_at:
                proxy.cut(2.0)
                figures.connection_cuts += 1
                log("every connection cut for 2 s")
            if publisher.done() and publisher.exception() is not None:
                raise RuntimeError("publishing failed") from publisher.exception()
            if (figures.server_restarts and figures.connection_cuts and figures.kills >= 3
                    and await finished() >= deployments):
                break
            await asyncio.sleep(0.1)
        log(f"chaos over after {time.monotonic() - begun:.1f}s "
            f"(finished so far: {await finished()})")

        # Let the pipeline finish (bounded): everything finished, sent, nothing pending.
        settle_deadline = time.monotonic() + max(60.0, duration)
        while time.monotonic() < settle_deadline:
            done = await finished() >= deployments
            sent = int(await client.xlen(f"{prefix}:{SENT}")) >= deployments
            if done and sent and await pending_entries(client, prefix) == 0:
                break
            await asyncio.sleep(0.25)
        figures.seconds = time.monotonic() - begun

        finished_by = await count_by(client, f"{prefix}:{FINISHED}", "deployment_id")
        figures.statuses = await count_by(client, f"{prefix}:{FINISHED}", "data", key=status_of)
        sent_by = await count_by(client, f"{prefix}:{SENT}", "deployment_id")
        figures.finished = sum(1 for d in ids if finished_by.get(d))
        figures.duplicates_finished = sum(c - 1 for c in finished_by.values() if c > 1)
        figures.sent_duplicates = sum(c - 1 for c in sent_by.values() if c > 1)
        figures.lost = sum(1 for d in ids if not finished_by.get(d))
        keys = {r.headers.get(IDEMPOTENCY_HEADER, "") for r in sandbox.received}
        figures.webhook_posts = len(sandbox.received)
        figures.webhook_keys = len(keys - {""})
        figures.missing_webhooks = max(0, deployments - figures.webhook_keys)
        figures.dlq = int(await client.xlen(f"{prefix}:dlq"))
        figures.pending = await pending_entries(client, prefix)
        return figures
    finally:
        if publisher is not None:
            publisher.cancel()
        await _release(services, server, client, proxy, sandbox)


async def stop_services(services: list[Service]) -> None:
    """SIGTERM every service, then wait for them together, off the event loop: the proxy
    and the sandbox their connections go to run on it, and a loop blocked in a wait
    relayed nothing, so each service's last writes waited out its socket timeout (20 s,
    then a SIGKILL, at the end of every chaos run)."""
    for service in services:
        service.terminate()
    await asyncio.gather(*(asyncio.to_thread(service.stop) for service in services))


async def _release(
    services: list[Service], server: ServerProcess, client: aioredis.Redis,
    proxy: CuttingProxy, sandbox: Sandbox,
) -> None:
    """Stop everything the run started; each step on its own, so an interrupted or failed
    run still leaves no process behind."""
    await stop_services(services)
    server.stop()
    for step in (client.aclose, proxy.stop, sandbox.stop):
        with contextlib.suppress(Exception):
            await step()
