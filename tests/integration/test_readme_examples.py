"""Every Python block of the README runs as written: the pipeline is defined, runs end to
end on the real server, is replayed from a step and its cost summed; the AppConfig block
defines a loadable app. A new block must be added here, so none can rot unseen."""

from __future__ import annotations

import ast
import json
import re
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

import pytest
import redis.asyncio as aioredis

from printery import AppConfig, Client, ConsumerSettings, Pipeline, StreamKeys, WorkerManager
from printery.testing import unique_prefix, wait_for
from printery.transport.server import ServerProcess

README = Path(__file__).resolve().parents[2] / "README.md"
BLOCKS = re.findall(r"```python\n(.*?)```", README.read_text(), re.S)


def block(marker: str) -> str:
    [found] = [b for b in BLOCKS if marker in b]
    return found


PIPELINE = block('pipeline = Pipeline("docflow"')
APP_CONFIG = block("config = AppConfig(")
LIBRARY_CALLS = block("await replay(")
LOOP = block('answers.add(Loop(')


def test_every_block_is_run_here() -> None:
    assert len(BLOCKS) == 4, "a new README block: run it in this file"


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
    summarize = namespace["spent"]["steps"]["summarize"]
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


async def test_readme_loop_passes_on_attempt_two_with_the_reasons_as_feedback(
    server: ServerProcess, client: aioredis.Redis
) -> None:
    namespace: dict[str, Any] = {"__name__": "readme"}
    run_block(LOOP, namespace)
    answers: Pipeline = namespace["answers"]
    prefix = unique_prefix("readme-loop")
    manager = WorkerManager(drain_timeout=2)
    for worker, deps in answers.build_workers(client=client, keys=StreamKeys(prefix),
                                              settings=ConsumerSettings(block_ms=100)):
        manager.register(worker, deps)
    await manager.start_all()
    try:
        async with Client(server.url, stream_prefix=prefix, app=answers) as submitter:
            run_id = await submitter.submit({"question_id": "q-1", "text": "why?"})
            result = await submitter.result(run_id, timeout=20)
            trace = await submitter.entries(run_id)
    finally:
        await manager.stop_all(2)
    assert result.status == "answer" and result.data == {"text": "word word word word word"}
    verdicts = [e["data"] for e in trace if e.get("type") == "draft:verdict"]
    assert [(v["attempt"], v["next"]) for v in verdicts] == [(1, "retry"), (2, "passed")]
    assert verdicts[0]["reasons"] == [
        {"code": "too_short", "field": "text", "message": "3 words, want 5"}]
