"""Which limit holds an entry (docs/reference.md, Flow control): ``/status``
(``workers.<step>.limits``) counts a waiting entry on the limit that holds it, not on
every limit of its step, and ``printery_limit_wait_seconds{limit}`` puts its wait there
too; the ``limit`` label is the limit's key (a key function's limit: its name). Real
server, real workers."""

from __future__ import annotations

import asyncio
from collections.abc import Callable

import redis.asyncio as aioredis

from printery import Limit, StreamWorker
from printery.observe.metrics import Metrics, MetricsObserver
from printery.runtime.consumer import ConsumerSettings
from printery.runtime.handler import Message, Output
from printery.runtime.limit_waits import limit_labels
from printery.testing import wait_for
from printery.wire.keys import StreamKeys
from support.spine import publish, running


def tenant(message: Message) -> str:
    return "tenant-a"


def wait_seconds(metrics: Metrics, limit: str) -> tuple[float, float]:
    """``(count, sum)`` of ``printery_limit_wait_seconds{limit}``."""
    found = {}
    for line in metrics.render().decode().splitlines():
        for part in ("count", "sum"):
            if line.startswith(f'printery_limit_wait_seconds_{part}{{limit="{limit}"}}'):
                found[part] = float(line.split()[-1])
    return found["count"], found["sum"]


def limited_worker(client: aioredis.Redis, keys: StreamKeys, metrics: Metrics,
                   limits: list[Limit], handler: Callable[[Message], object],
                   window: float = 60.0) -> StreamWorker:
    async def handle(message: Message) -> Output:
        await handler(message)  # type: ignore[misc]
        return Output("out", message.data)

    return StreamWorker(
        "w", client=client, keys=keys, consumes=["in"], handler=handle,
        settings=ConsumerSettings(concurrency=4, block_ms=100, visibility_timeout=5.0,
                                  claim_interval=0.1, limit_window=window),
        observer=MetricsObserver(metrics), limits=limits)


async def test_an_entry_waiting_for_a_slot_is_counted_on_the_concurrency_limit(
    client: aioredis.Redis, prefix: str
) -> None:
    keys, metrics = StreamKeys(prefix), Metrics(process_metrics=False)
    release = asyncio.Event()
    started: list[int] = []

    async def handler(message: Message) -> None:
        started.append(message.data["n"])
        await release.wait()

    worker = limited_worker(client, keys, metrics, [
        Limit("api-key", concurrency=1, name="api"),
        Limit(tenant, requests_per_minute=1000)], handler)
    async with running(worker) as manager:
        await publish(client, keys, "in", 2)

        def limits() -> dict[str, dict[str, float]]:
            found: dict[str, dict[str, float]] = manager.get_status()["w"].get("limits", {})
            return found

        async def one_waits() -> bool:
            return len(started) == 1 and limits().get("api-key", {}).get("waiting") == 1

        await wait_for(one_waits, timeout=10, message="one entry waiting for a slot")
        assert {name: status["waiting"] for name, status in limits().items()} == {
            "api-key": 1, "w:tenant": 0}
        release.set()

        async def both() -> bool:
            return await client.xlen(keys.stream("out")) == 2

        await wait_for(both, timeout=10, message="both entries handled")
        assert {name: status["waiting"] for name, status in limits().items()} == {
            "api-key": 0, "w:tenant": 0}
        waited = limits()
    api_count, api_sum = wait_seconds(metrics, "api-key")
    tenant_count, tenant_sum = wait_seconds(metrics, "w:tenant")
    assert (api_count, tenant_count) == (2.0, 2.0), "one observation per admitted call"
    assert api_sum > tenant_sum, "the slot held it: its wait is the concurrency limit's"
    assert waited["api-key"]["waited_s"] >= waited["w:tenant"]["waited_s"]
    assert 'limit="api"' not in metrics.render().decode(), "the key labels it, not its name"


async def test_an_entry_waiting_for_a_window_is_counted_on_the_rate_limit(
    client: aioredis.Redis, prefix: str
) -> None:
    """One start a window (shortened to 2 s for the test) per tenant: the second entry
    waits for the tenant's window, not for the API's slots (of which it has plenty)."""
    keys, metrics = StreamKeys(prefix), Metrics(process_metrics=False)
    started: list[int] = []

    async def handler(message: Message) -> None:
        started.append(message.data["n"])

    worker = limited_worker(client, keys, metrics, [
        Limit("api-key", concurrency=5),
        Limit(tenant, requests_per_minute=1, name="per-tenant")], handler, window=2.0)
    async with running(worker) as manager:
        await publish(client, keys, "in", 2)

        def waiting() -> dict[str, float]:
            found = manager.get_status()["w"].get("limits", {})
            return {name: status["waiting"] for name, status in found.items()}

        async def one_waits() -> bool:
            return len(started) == 1 and waiting().get("per-tenant") == 1

        await wait_for(one_waits, timeout=10, message="one entry waiting for the window")
        assert waiting() == {"api-key": 0, "per-tenant": 1}

        async def both() -> bool:
            return await client.xlen(keys.stream("out")) == 2

        await wait_for(both, timeout=10, message="the window's next start")
        assert waiting() == {"api-key": 0, "per-tenant": 0}
    tenant_count, tenant_sum = wait_seconds(metrics, "per-tenant")
    api_count, api_sum = wait_seconds(metrics, "api-key")
    assert (tenant_count, api_count) == (2.0, 2.0)
    assert tenant_sum >= 1.0, "the window held the second call about 2 s"
    assert api_sum < 0.5 * tenant_sum, "the API's slots held nothing"


def test_labels_are_keys_and_never_shared_by_two_limits_of_a_step() -> None:
    def per_customer(message: Message) -> str:
        return "c"

    assert limit_labels([
        Limit("openai", concurrency=2, name="llm"),
        Limit(per_customer, requests_per_minute=5),
        Limit(lambda m: "x", requests_per_minute=5),
        Limit(lambda m: "y", requests_per_minute=5),
        Limit(per_customer, requests_per_minute=9, name="customers"),
        Limit("openai", tokens_per_minute=100),
    ], "draft") == ("openai", "draft:per_customer", "draft:<lambda>", "draft:<lambda>#4",
                    "customers", "openai")
