"""Runs the deployment pipeline in-process against the real server, with real HTTP."""

from __future__ import annotations

import asyncio
from collections.abc import Iterable
from dataclasses import dataclass
from typing import Any

import redis.asyncio as aioredis

from printery import ConsumerSettings, WorkerManager
from printery.deploy.app import build_pipeline
from printery.deploy.sandbox import Sandbox
from printery.deploy.settings import DeploySettings
from printery.testing import wait_for
from printery.wire.envelope import Codec
from printery.wire.keys import StreamKeys

FAST = {
    "health_monitor": {"interval": 0.05, "consecutive": 2, "deadline": 1.5, "probe_timeout": 1},
    "dependency_checker": {"probe_timeout": 1, "retries": 0},
    "notifier": {"retries": 1, "backoff_ms": 20, "timeout": 2},
    "aggregator": {"branch_deadline": 20},
}


def fast_settings(**overrides: Any) -> DeploySettings:
    data: dict[str, Any] = {k: dict(v) for k, v in FAST.items()}
    for key, value in overrides.items():
        if isinstance(value, dict) and key in data:
            data[key].update(value)
        else:
            data[key] = value
    return DeploySettings.model_validate(data)


@dataclass
class DeployRun:
    client: aioredis.Redis
    keys: StreamKeys
    manager: WorkerManager
    sandbox: Sandbox
    codec: Codec

    def request(self, service: str = "billing-api", **fields: Any) -> dict[str, Any]:
        base: dict[str, Any] = {
            "service": service, "version": "1.4.2", "environment": "staging",
            "requested_by": "alice",
            "health_url": self.sandbox.url("/svc/healthy/1.4.2"),
            "notify": [f"webhook+{self.sandbox.url('/hooks/ok')}"],
        }
        base.update(fields)
        return {k: v for k, v in base.items() if v is not None}

    async def emit(self, data: dict[str, Any], **extra: str) -> str:
        envelope = self.codec.new("deployment:started", data, producer="test")
        fields = self.codec.encode(envelope)
        fields.update(extra)
        await self.client.xadd(self.keys.stream("deployment:started"), fields)
        return envelope.correlation_id

    async def entries(self, event_type: str, deployment_id: str | None = None) -> list[dict[str, Any]]:
        found = []
        for entry_id, fields in await self.client.xrange(self.keys.stream(event_type)):
            if deployment_id is None or fields.get("deployment_id") == deployment_id:
                found.append({**fields, "id": entry_id, "data": self.codec.decode(fields, event_type).data})
        return found

    async def finished(self, deployment_id: str, timeout: float = 15.0) -> dict[str, Any]:
        async def probe() -> list[dict[str, Any]]:
            return await self.entries("deployment:finished", deployment_id)

        found = await wait_for(probe, timeout=timeout, message=f"{deployment_id} finished")
        return dict(found[0]["data"])

    async def sent(self, deployment_id: str, count: int, timeout: float = 10.0) -> list[dict[str, Any]]:
        async def probe() -> list[dict[str, Any]]:
            rows = await self.entries("notification:sent", deployment_id)
            return rows if len(rows) >= count else []

        rows = await wait_for(probe, timeout=timeout, message=f"{count} notifications")
        return [r["data"] for r in rows]


async def start_pipeline(
    client: aioredis.Redis, prefix: str, settings: DeploySettings, *, only: Iterable[str] | None = None
) -> DeployRun:
    sandbox = Sandbox(slow_seconds=5)
    await sandbox.start()
    pipeline = build_pipeline(settings)
    keys = StreamKeys(prefix)
    manager = WorkerManager(drain_timeout=2)
    base = ConsumerSettings(block_ms=100, visibility_timeout=10, retry_backoff_ms=20)
    for worker, deps in pipeline.build_workers(client=client, keys=keys, settings=base, only=only):
        manager.register(worker, deps)
    await manager.start_all()
    return DeployRun(client, keys, manager, sandbox, pipeline.codec())


async def stop_pipeline(run: DeployRun) -> None:
    await run.manager.stop_all(2)
    await run.sandbox.stop()
    await asyncio.sleep(0)
