"""Every Python block of the README runs as written: the pipeline is defined, runs end to
end on the real server, is replayed from a step and its cost summed; the AppConfig block
defines a loadable app. A new block must be added here, so none can rot unseen."""

from __future__ import annotations

import ast
import asyncio
import json
import re
import textwrap
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

import pytest
import redis.asyncio as aioredis
from examples import docflow

from printery import AppConfig, ConsumerSettings, Pipeline, StreamKeys, WorkerManager
from printery.servers.process import ServerProcess
from printery.service.groups import prepare_groups
from printery.testing import unique_prefix, wait_for
from support.service import spawn

README = Path(__file__).resolve().parents[2] / "README.md"
BLOCKS = re.findall(r"```python\n(.*?)```", README.read_text(), re.S)


def block(marker: str) -> str:
    [found] = [b for b in BLOCKS if marker in b]
    return found


PIPELINE = block('pipeline = Pipeline("docflow"')
APP_CONFIG = block("config = AppConfig(")
BUDGETS = block("budget=Budget(")
LIBRARY_CALLS = block("await replay(")
ASYNC_CLIENT = block("async with Client(")
SYNC_CLIENT = block("with SyncClient(")
LIMITS = block("llm = OpenAICompatible(")
QUOTA = block("fallback=draft_elsewhere")
LOOP = block('answers.add(Loop(')
RENAME = textwrap.dedent(block('renamed_from="summarize"'))  # in a list item
MIDDLEWARE = block("class RedactCards(Middleware)")


def test_every_block_is_run_here() -> None:
    assert len(BLOCKS) == 11, "a new README block: run it in this file"


def run_block(source: str, namespace: dict[str, Any]) -> Any:
    """``source`` in ``namespace``; a coroutine to await when it uses top-level await."""
    code = compile(source, str(README), "exec", flags=ast.PyCF_ALLOW_TOP_LEVEL_AWAIT)
    return eval(code, namespace)


@pytest.fixture
def readme_pipeline() -> Pipeline:
    namespace: dict[str, Any] = {"__name__": "readme"}
    run_block(PIPELINE, namespace)
    pipeline: Pipeline = namespace["pipeline"]
    pipeline.validate()
    return pipeline


@pytest.fixture
async def running(client: aioredis.Redis, readme_pipeline: Pipeline) -> AsyncIterator[Pipeline]:
    # The README's library calls use StreamKeys("docs"): the workers run on it too.
    manager = WorkerManager(drain_timeout=2)
    for worker, deps in readme_pipeline.build_workers(
        client=client, keys=StreamKeys("docs"), settings=ConsumerSettings(block_ms=100)
    ):
        manager.register(worker, deps)
    await manager.start_all()
    yield readme_pipeline
    await manager.stop_all(2)


async def _entries(client: aioredis.Redis, event_type: str, doc_id: str) -> list[dict[str, str]]:
    return [f for _, f in await client.xrange(f"docs:{event_type}") if f.get("doc_id") == doc_id]


async def test_readme_pipeline_runs_replays_and_counts_cost(client: aioredis.Redis, running: Pipeline) -> None:
    await client.xadd("docs:doc:submitted",
                      {"data": json.dumps({"doc_id": "doc-42", "text": "  Invoice 42: two widgets "})})
    [approved] = await wait_for(lambda: _entries(client, "doc:approved", "doc-42"), timeout=20)
    assert json.loads(approved["data"]) == {"missing": [], "summary": "Invoice 42: two widgets",
                                            "label": "invoice"}

    namespace: dict[str, Any] = {"__name__": "readme", "client": client, "pipeline": running}
    await run_block(LIBRARY_CALLS, namespace)
    assert namespace["again"].new_id == "doc-42-r1"
    await wait_for(lambda: _entries(client, "doc:approved", "doc-42-r1"), timeout=20)
    [classified] = await _entries(client, "doc:classified", "doc-42-r1")
    assert classified["producer"] == "printery-replay", "classify is a sibling: not run again"
    assert namespace["spent"]["steps"]["summarize"]["calls"] >= 1
    # The block's cost_summary ran as the replay began; once the replayed run is approved
    # its summarize ran too, and the same call counts both.
    spent = await namespace["cost_summary"](client, namespace["keys"], running, since_seconds=3600)
    summarize = spent["steps"]["summarize"]
    assert summarize["calls"] >= 2 and summarize["cost"]["tokens"] >= 8  # 4 words, run twice


async def test_readme_refuses_a_document_with_reasons(client: aioredis.Redis, running: Pipeline) -> None:
    await client.xadd("docs:doc:submitted", {"data": json.dumps({"doc_id": "doc-43", "text": "Dear Sir"})})
    [refused] = await wait_for(lambda: _entries(client, "doc:refused", "doc-43"), timeout=20)
    assert json.loads(refused["data"])["reasons"] == [
        {"code": "not_an_invoice", "field": "label", "message": "only invoices are approved"}]


def test_readme_app_config_block_defines_a_loadable_app() -> None:
    namespace: dict[str, Any] = {"__name__": "readme"}
    run_block(APP_CONFIG, namespace)
    config = AppConfig.of(namespace["pipeline"])
    assert set(config.tables) == {"ocr"} and config.defaults == {"stream_prefix": "docs"}


async def test_readme_async_client_block(
    client: aioredis.Redis, server: ServerProcess, monkeypatch: pytest.MonkeyPatch,
    capsys: pytest.CaptureFixture[str],
) -> None:
    prefix = unique_prefix()
    monkeypatch.setenv("REDIS_URL", server.url)
    monkeypatch.setenv("STREAM_PREFIX", prefix)
    manager = WorkerManager(drain_timeout=2)
    for worker, deps in docflow.pipeline.build_workers(
        client=client, keys=StreamKeys(prefix), settings=ConsumerSettings(block_ms=100)
    ):
        manager.register(worker, deps)
    await manager.start_all()
    try:
        namespace: dict[str, Any] = {"__name__": "readme"}
        await asyncio.wait_for(run_block(ASYNC_CLIENT, namespace), 60)
    finally:
        await manager.stop_all(2)
    assert namespace["result"].status == "doc:published"
    lines = [line for line in capsys.readouterr().out.splitlines() if "[info" not in line]
    assert lines[0].startswith("doc:published {") and lines[-2].split()[1] == "doc:published"
    # The listing of the run the block submitted: its id, start, end and cost.
    assert lines[-1].startswith("inv-1 ") and lines[-1].endswith(str(namespace["result"].cost))


def test_readme_sync_client_block(
    server: ServerProcess, monkeypatch: pytest.MonkeyPatch, tmp_path: Path,
    capsys: pytest.CaptureFixture[str],
) -> None:
    prefix = unique_prefix()
    monkeypatch.setenv("REDIS_URL", server.url)
    monkeypatch.setenv("STREAM_PREFIX", prefix)
    handle = spawn(["--redis-url", server.url, "--stream-prefix", prefix], cwd=tmp_path)
    try:
        run_block(SYNC_CLIENT, {"__name__": "readme"})
    finally:
        handle.stop()
    assert capsys.readouterr().out.strip().splitlines()[-1] == "succeeded"

def test_readme_budget_block_defines_a_budgeted_pipeline() -> None:
    namespace: dict[str, Any] = {}
    run_block(BUDGETS, namespace)
    budgeted: Pipeline = namespace["pipeline"]
    budgeted.validate()
    assert "budget:exceeded" in budgeted.outcomes
    assert "budget_exceeded" in budgeted.review_kinds
    assert budgeted.steps["draft"].budget is not None
def test_readme_flow_control_block_defines_a_limited_model_step() -> None:
    namespace: dict[str, Any] = {"__name__": "readme"}
    run_block(LIMITS, namespace)
    pipeline: Pipeline = namespace["pipeline"]
    pipeline.validate()
    api, tenant = pipeline.steps["draft"].limits
    assert (api.concurrency, api.requests_per_minute, api.tokens_per_minute) == (4, 500, 200_000)
    assert tenant.label == "per-tenant" and tenant.requests_per_minute == 60


def test_readme_quota_block_sends_a_saturated_or_exhausted_provider_to_the_fallback() -> None:
    namespace: dict[str, Any] = {"__name__": "readme"}
    run_block(LIMITS, namespace)
    run_block(QUOTA, namespace)
    pipeline: Pipeline = namespace["pipeline"]
    pipeline.validate()
    step = pipeline.steps["draft_any"]
    (limit,) = step.limits
    assert limit.max_wait == 5 and step.falls_back is not None


async def test_readme_rename_block_takes_over_the_old_steps_group(
        client: aioredis.Redis) -> None:
    namespace: dict[str, Any] = {"__name__": "readme"}
    run_block(RENAME, namespace)
    pipeline: Pipeline = namespace["pipeline"]
    pipeline.validate()
    keys = StreamKeys(unique_prefix("rename"))
    stream = keys.stream("doc:extracted")
    await client.xgroup_create(stream, "summarize", id="0", mkstream=True)
    await client.xadd(stream, {"data": json.dumps({"text": "old"})})
    await client.xreadgroup("summarize", "c", {stream: ">"})  # left pending by the old name
    await prepare_groups(client, keys, pipeline)
    assert [g["name"] for g in await client.xinfo_groups(stream)] == ["summarise"]
    assert (await client.xpending(stream, "summarise"))["pending"] == 1


async def test_readme_middleware_block_redacts_before_the_handler_and_audits_in_the_commit(
    client: aioredis.Redis,
) -> None:
    namespace: dict[str, Any] = {"__name__": "readme"}
    run_block(MIDDLEWARE, namespace)
    support: Pipeline = namespace["support"]
    support.validate()
    keys = StreamKeys(unique_prefix("mw"))
    manager = WorkerManager(drain_timeout=2)
    for worker, deps in support.build_workers(client=client, keys=keys,
                                              settings=ConsumerSettings(block_ms=100)):
        manager.register(worker, deps)
    await manager.start_all()
    try:
        await client.xadd(keys.stream("ticket"), {"data": json.dumps(
            {"text": "my card 4242424242424242 was charged twice"}), "correlation_id": "t-1"})
        [answer] = await wait_for(lambda: _read(client, keys.stream("answer")), timeout=20)
        [audit] = await wait_for(lambda: _read(client, keys.stream("audit")), timeout=20)
    finally:
        await manager.stop_all(2)
    assert json.loads(answer["data"]) == {"text": "re: my card [card] was charged twice"}
    assert json.loads(audit["data"]) == {"step": "answer", "wrote": ["answer"]}
    assert audit["correlation_id"] == answer["correlation_id"] == "t-1"


async def _read(client: aioredis.Redis, stream: str) -> list[dict[str, str]]:
    return [fields for _, fields in await client.xrange(stream)]
