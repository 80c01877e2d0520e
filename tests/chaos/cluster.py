"""The chaos run on a Valkey Cluster (issue 18 item 3): three ``printery-workers``
processes on ``redis+cluster://`` with partitioned streams, real health endpoints and a
real webhook sink. While deployments flow: kill -9 a random service process every few
seconds and start it again, and kill -9 the master holding partition 0 once (its replica
is promoted by the cluster), then start it again (it rejoins as a replica). The counts
are those of the single-server run (:mod:`tests.chaos.driver`), over every partition.

No TCP proxy here: cluster nodes announce their own addresses, so clients reconnect to
the nodes themselves; a killed master's connections break the way a cut does.
"""

from __future__ import annotations

import asyncio
import contextlib
import random
import time
from pathlib import Path
from typing import Any

from tests.chaos.driver import (
    CONFIG,
    FINISHED,
    SENT,
    STARTED,
    Figures,
    Service,
    count_by,
    deployment_request,
    pending_entries,
    status_of,
    stop_services,
)
from tests.support.cluster import Node, ValkeyCluster

from printery.deploy.delivery import IDEMPOTENCY_HEADER
from printery.deploy.sandbox import Sandbox
from printery.transport.connection import connect
from printery.transport.streams import CONNECTION_ERRORS
from printery.wire.envelope import Codec
from printery.wire.keys import StreamKeys


async def _publish(url: str, keys: StreamKeys, sandbox: Sandbox, n: int, over: float) -> None:
    """Publish ``n`` deployments evenly over ``over`` seconds, each to its run's partition
    (what a raw producer does, docs/reference.md, Partitions). A batch that failed during
    the failover is sent again: the validator decides each deployment id once."""
    codec = Codec(correlation_field="deployment_id", id_prefix="dep")
    client = connect(url)
    batches = max(1, int(over / 0.25))
    size = -(-n // batches)
    begun = time.monotonic()
    try:
        for b, start in enumerate(range(0, n, size)):
            while True:
                try:
                    pipe = client.pipeline(transaction=False)
                    for i in range(start, min(n, start + size)):
                        request = deployment_request(codec, sandbox, i)
                        pipe.xadd(keys.of(request["deployment_id"]).stream(STARTED), request)
                    await pipe.execute()
                    break
                except CONNECTION_ERRORS:
                    await asyncio.sleep(0.2)
            await asyncio.sleep(max(0.0, begun + (b + 1) * over / batches - time.monotonic()))
    finally:
        await client.aclose()


async def _count_all(client: Any, keys: StreamKeys, event_type: str, field: str,
                     key: Any = str) -> dict[str, int]:
    counts: dict[str, int] = {}
    for part in keys.each():
        for value, count in (await count_by(client, part.stream(event_type), field, key)).items():
            counts[value] = counts.get(value, 0) + count
    return counts


async def _length(client: Any, keys: StreamKeys, event_type: str) -> int:
    return sum([int(await client.xlen(part.stream(event_type))) for part in keys.each()])


async def _settle(client: Any, keys: StreamKeys, deployments: int, prefix: str, timeout: float) -> None:
    """Wait (bounded) until everything finished and was notified and nothing is pending."""
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        with contextlib.suppress(*CONNECTION_ERRORS):
            if (await _length(client, keys, FINISHED) >= deployments
                    and await _length(client, keys, SENT) >= deployments
                    and await pending_entries(client, prefix) == 0):
                return
        await asyncio.sleep(0.25)


async def _tally(figures: Figures, client: Any, keys: StreamKeys, sandbox: Sandbox) -> None:
    """The counts of the single-server run, over every partition."""
    ids = [f"dep-chaos-{i:06d}" for i in range(figures.deployments)]
    finished_by = await _count_all(client, keys, FINISHED, "deployment_id")
    figures.statuses = await _count_all(client, keys, FINISHED, "data", key=status_of)
    sent_by = await _count_all(client, keys, SENT, "deployment_id")
    figures.finished = sum(1 for d in ids if finished_by.get(d))
    figures.duplicates_finished = sum(c - 1 for c in finished_by.values() if c > 1)
    figures.sent_duplicates = sum(c - 1 for c in sent_by.values() if c > 1)
    figures.lost = sum(1 for d in ids if not finished_by.get(d))
    received = {r.headers.get(IDEMPOTENCY_HEADER, "") for r in sandbox.received}
    figures.webhook_posts = len(sandbox.received)
    figures.webhook_keys = len(received - {""})
    figures.missing_webhooks = max(0, figures.deployments - figures.webhook_keys)
    figures.dlq = sum([int(await client.xlen(part.dlq)) for part in keys.each()])
    figures.pending = await pending_entries(client, keys.prefix)


def _fail_over(cluster: ValkeyCluster, master: Node, *, rejoin: bool, log: Any) -> Node:
    """kill -9 ``master``, wait for its replica's promotion and, with ``rejoin``, start it
    again and wait until it is back as a replica (issue 31); the promoted node."""
    promoted = cluster.kill_master(master)
    log(f"replica {promoted.address} promoted")
    if rejoin:
        cluster.rejoin(master)
        log(f"{master.address} back as a replica")
    return promoted


async def run_cluster_chaos(
    workdir: Path, *, deployments: int, duration: float, partitions: int = 3, seed: int = 1,
    kill_every: float = 3.0, kill_master: bool = True, processes: int = 3, log: Any = print,
    rejoin_master: bool = True,
) -> Figures:
    """Run the scenario on a fresh cluster; ``kill_every`` 0 kills no service process,
    ``kill_master`` False kills no master (the plain end-to-end run). ``duration`` bounds
    the chaos phase; then the run waits (bounded) for the pipeline to finish everything."""
    rng = random.Random(seed)
    await asyncio.to_thread(workdir.mkdir, parents=True, exist_ok=True)
    figures = Figures(deployments=deployments)
    cluster = ValkeyCluster(workdir / "cluster")
    await asyncio.to_thread(cluster.start)
    sandbox = Sandbox(slow_seconds=5)
    config = workdir / "printery.toml"
    await asyncio.to_thread(config.write_text, CONFIG.replace(
        "[transport]\n", f"[transport]\npartitions = {partitions}\n"))
    prefix = f"chaos:{rng.randrange(16**8):08x}"
    keys = StreamKeys(prefix, partitions)
    client = connect(cluster.url)
    services = [Service(i, cluster.url, prefix, workdir, config) for i in range(processes)]
    begun = time.monotonic()
    publisher: asyncio.Task[None] | None = None
    failover: asyncio.Task[Any] | None = None
    try:
        await sandbox.start()
        for service in services:
            service.start()
        publisher = asyncio.create_task(_publish(cluster.url, keys, sandbox, deployments,
                                                 over=duration * 0.7))
        master_kill_at = begun + duration * 0.4 if kill_master else float("inf")
        next_kill = begun + kill_every if kill_every > 0 else float("inf")
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
            if failover is None and now >= master_kill_at:
                master = await asyncio.to_thread(cluster.master_of, keys.at(0).stream(STARTED))
                failover = asyncio.create_task(asyncio.to_thread(
                    _fail_over, cluster, master, rejoin=rejoin_master, log=log))
                log(f"master {master.address} killed")
            if failover is not None and failover.done() and not figures.master_failovers:
                failover.result()  # raises when the promotion (or the return) did not happen
                figures.master_failovers += 1
            if publisher.done() and publisher.exception() is not None:
                raise RuntimeError("publishing failed") from publisher.exception()
            chaos_done = ((not kill_master or figures.master_failovers)
                          and (kill_every <= 0 or figures.kills >= 3))
            if (chaos_done and publisher.done()
                    and await _length(client, keys, FINISHED) >= deployments):
                break
            await asyncio.sleep(0.1)
        if failover is not None and not figures.master_failovers:
            await failover
            figures.master_failovers += 1
        log(f"chaos over after {time.monotonic() - begun:.1f}s")

        await _settle(client, keys, deployments, prefix, max(60.0, duration))
        figures.seconds = time.monotonic() - begun
        await _tally(figures, client, keys, sandbox)
        return figures
    finally:
        for task in (publisher, failover):
            if task is not None:
                task.cancel()
        await stop_services(services)
        await asyncio.to_thread(cluster.stop)
        for step in (client.aclose, sandbox.stop):
            with contextlib.suppress(Exception):
                await step()


async def run_master_failover(
    workdir: Path, *, deployments: int = 200, partitions: int = 9, url_nodes: str = "all",
    processes: int = 1, kill_after: int = 20, within: float = 100.0, node_timeout_ms: int = 1000,
    log: Any = print,
) -> tuple[Figures, float]:
    """Issue 31's scenario: ``deployments`` submitted to ``processes`` services on a fresh
    3+3 cluster with ``partitions`` partitions; once ``kill_after`` have finished, kill -9
    the master that holds most partitions, wait for its replica's promotion, start the
    killed node again (it rejoins as a replica). Returns the figures and the seconds from
    the kill until everything finished with nothing pending (``inf``: not within
    ``within`` seconds of the kill). ``url_nodes`` "all" names the six nodes in the URL,
    "one" only the master that is killed (the hardest single node to name)."""
    await asyncio.to_thread(workdir.mkdir, parents=True, exist_ok=True)
    figures = Figures(deployments=deployments)
    cluster = ValkeyCluster(workdir / "cluster", node_timeout_ms=node_timeout_ms)
    await asyncio.to_thread(cluster.start)
    sandbox = Sandbox(slow_seconds=5)
    config = workdir / "printery.toml"
    await asyncio.to_thread(config.write_text, CONFIG.replace(
        "[transport]\n", f"[transport]\npartitions = {partitions}\n"))
    prefix = f"failover:{random.Random(deployments).randrange(16**8):08x}"
    keys = StreamKeys(prefix, partitions)
    held = await asyncio.to_thread(
        cluster.partition_masters, [keys.at(k).stream(STARTED) for k in range(partitions)])
    victim_port = max(held, key=lambda port: len(held[port]))
    victim = next(node for node in cluster.nodes if node.port == victim_port)
    url = cluster.url if url_nodes == "all" else f"redis+cluster://{victim.address}"
    client = connect(cluster.url)
    services = [Service(i, url, prefix, workdir, config) for i in range(processes)]
    begun = time.monotonic()
    publisher: asyncio.Task[None] | None = None
    after_kill = float("inf")
    try:
        await sandbox.start()
        for service in services:
            service.start()
        publisher = asyncio.create_task(_publish(cluster.url, keys, sandbox, deployments, over=1.0))
        deadline = begun + 60
        while await _length(client, keys, FINISHED) < kill_after:
            if time.monotonic() > deadline:
                raise RuntimeError(f"fewer than {kill_after} finished in 60 s before the kill")
            await asyncio.sleep(0.1)
        finished_before = await _length(client, keys, FINISHED)
        killed_at = time.monotonic()
        log(f"kill -9 of {victim.address} (holds {len(held[victim_port])} of {partitions} "
            f"partitions) with {finished_before} finished")
        promoted = await asyncio.to_thread(cluster.kill_master, victim)
        figures.master_failovers = 1
        log(f"replica {promoted.address} promoted after {time.monotonic() - killed_at:.1f}s")
        rejoin = asyncio.create_task(asyncio.to_thread(cluster.rejoin, victim))
        rejoin.add_done_callback(lambda t: t.cancelled() or t.exception() or log(
            f"{victim.address} back as a replica after {time.monotonic() - killed_at:.1f}s"))
        await publisher
        while time.monotonic() < killed_at + within:
            with contextlib.suppress(*CONNECTION_ERRORS):
                if (await _length(client, keys, FINISHED) >= deployments
                        and await _length(client, keys, SENT) >= deployments
                        and await pending_entries(client, prefix) == 0):
                    after_kill = time.monotonic() - killed_at
                    break
            await asyncio.sleep(0.25)
        await rejoin  # the node's return is part of the scenario: it must have happened
        figures.seconds = time.monotonic() - begun
        await _tally(figures, client, keys, sandbox)
        if after_kill == float("inf"):  # what the service said, for the failure's report
            figures.notes += [f"{service.log}: {line}" for service in services
                              for line in (await asyncio.to_thread(service.log.read_text)).splitlines()[-20:]]
        log(f"finished {after_kill:.1f}s after the kill: {figures.line()}")
        return figures, after_kill
    finally:
        if publisher is not None:
            publisher.cancel()
        await stop_services(services)
        await asyncio.to_thread(cluster.stop)
        for step in (client.aclose, sandbox.stop):
            with contextlib.suppress(Exception):
                await step()
