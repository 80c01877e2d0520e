"""The review inbox of any pipeline (docs/reference.md, Review inbox) on
``examples/docflow.py``: a document the classifier is unsure of waits for a human, who
approves it with edited data (the run resumes with exactly that data and ends) or rejects
it; a kind's deadline rejects it by ``timeout``. Decisions through the real ``printery``
CLI, workers on a real server."""

from __future__ import annotations

import asyncio
import json
import os
import sys
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

import pytest
import redis.asyncio as aioredis
from examples import docflow

from printery import ConsumerSettings, StreamKeys
from printery.servers.process import ServerProcess
from printery.testing import wait_for
from support.service import spawn
from support.spine import running_pipeline

ROOT = Path(__file__).resolve().parents[2]
APP = "examples.docflow:pipeline"
UNSURE_TEXT = "Some note without a clear category at all."


async def cli(url: str, prefix: str, *args: str, stdin: str | None = None) -> tuple[int, str, str]:
    """``printery --app examples.docflow:pipeline ARGS`` from the repository root."""
    env = {k: v for k, v in os.environ.items() if k not in ("REDIS_URL", "STREAM_PREFIX")}
    proc = await asyncio.create_subprocess_exec(
        sys.executable, "-m", "printery.cli.operator", "--redis-url", url,
        "--stream-prefix", prefix, "--app", APP, *args, env=env, cwd=ROOT,
        stdin=asyncio.subprocess.PIPE, stdout=asyncio.subprocess.PIPE,
        stderr=asyncio.subprocess.PIPE)
    out, err = await asyncio.wait_for(proc.communicate(stdin.encode() if stdin else None), 60)
    assert proc.returncode is not None
    return proc.returncode, out.decode(), err.decode()


@pytest.fixture
async def docflow_workers(server: ServerProcess, client: aioredis.Redis,
                          prefix: str) -> AsyncIterator[StreamKeys]:
    keys = StreamKeys(prefix)
    async with running_pipeline(docflow.pipeline, client=client, keys=keys,
                                settings=ConsumerSettings(block_ms=100)):
        yield keys


async def submit(client: aioredis.Redis, keys: StreamKeys, doc_id: str, text: str) -> None:
    await client.xadd(keys.stream("doc:submitted"),
                      {"data": json.dumps({"doc_id": doc_id, "text": text})})


async def open_review(client: aioredis.Redis, keys: StreamKeys, doc_id: str) -> tuple[str, Any]:
    async def found() -> tuple[str, Any] | None:
        for entry_id, fields in await client.xrange(keys.review):
            if fields["doc_id"] == doc_id:
                return entry_id, fields
        return None

    found_review = await wait_for(found, timeout=20, message=f"a review of {doc_id}")
    assert found_review is not None
    return found_review


async def entries(client: aioredis.Redis, keys: StreamKeys, event_type: str,
                  doc_id: str) -> list[dict[str, Any]]:
    return [{**f, "data": json.loads(f["data"])}
            for _, f in await client.xrange(keys.stream(event_type)) if f["doc_id"] == doc_id]


async def test_approve_with_edited_data_resumes_with_exactly_that_data(
        server: ServerProcess, client: aioredis.Redis, docflow_workers: StreamKeys) -> None:
    keys, prefix = docflow_workers, docflow_workers.prefix
    await submit(client, keys, "note-e", UNSURE_TEXT)
    review_id, fields = await open_review(client, keys, "note-e")
    assert (fields["kind"], fields["step"]) == ("low_confidence", "gate")
    assert (fields["resume_type"], fields["reject_type"]) == ("doc:approved", "doc:refused")

    code, out, err = await cli(server.url, prefix, "review", "list")
    assert code == 0, err
    assert out.splitlines()[0].split() == ["id", "kind", "step", "doc_id", "reason"]
    assert review_id in out and "note-e" in out
    code, out, err = await cli(server.url, prefix, "review", "show", review_id)
    assert code == 0, err
    assert "resume_type: doc:approved" in out and '"confidence": 0.3' in out
    code, out, err = await cli(server.url, prefix, "review", "show", review_id, "--json")
    assert code == 0, err
    shown = json.loads(out)
    assert shown["doc_id"] == "note-e" and shown["data"]["label"] == "other"

    # Edited data the resumed step's input model refuses: exit 2, nothing written.
    code, _, err = await cli(server.url, prefix, "review", "approve", review_id, "--by", "ana",
                             "--data", json.dumps({"doc_id": "note-e"}))
    assert code == 2 and "publish" in err and "label" in err
    code, _, err = await cli(server.url, prefix, "review", "approve", review_id, "--by", "ana",
                             "--data", "{not json")
    assert code == 2 and "not valid JSON" in err
    assert await client.xlen(keys.review) == 1 and await client.xlen(keys.review_decided) == 0

    edited = {**shown["data"], "label": "memo", "summary": "a corrected summary",
              "confidence": 1.0}
    code, out, err = await cli(server.url, prefix, "review", "approve", review_id, "--by", "ana",
                               "--note", "it is a memo", "--file", "-", "--json",
                               stdin=json.dumps(edited))
    assert code == 0, err
    decision = json.loads(out)
    assert decision["decision"] == "approved" and decision["outputs"] == ["doc:approved"]

    published = await wait_for(lambda: entries(client, keys, "doc:published", "note-e"),
                               timeout=20, message="the run ends")
    [approved] = await entries(client, keys, "doc:approved", "note-e")
    assert approved["data"] == edited, "the run resumes with exactly the edited data"
    assert approved["producer"] == "printery-cli"
    assert published[0]["data"] == {"doc_id": "note-e", "label": "memo",
                                    "summary": "a corrected summary"}
    [(_, decided)] = await client.xrange(keys.review_decided)
    assert {k: decided[k] for k in ("review_id", "doc_id", "decision", "by", "note")} == {
        "review_id": review_id, "doc_id": "note-e", "decision": "approved", "by": "ana",
        "note": "it is a memo"}
    assert await client.xlen(keys.review) == 0

    code, _, err = await cli(server.url, prefix, "review", "approve", review_id, "--by", "ana")
    assert code == 1 and "already decided" in err
    code, _, err = await cli(server.url, prefix, "review", "show", review_id)
    assert code == 1


async def test_reject_writes_the_rejection(server: ServerProcess, client: aioredis.Redis,
                                           docflow_workers: StreamKeys) -> None:
    keys, prefix = docflow_workers, docflow_workers.prefix
    await submit(client, keys, "spam-r", "Free cruise for you, click here now.")
    review_id, fields = await open_review(client, keys, "spam-r")
    escalated = json.loads(fields["data"])
    code, _, err = await cli(server.url, prefix, "review", "reject", review_id, "--by", "bo",
                             "--note", "spam")
    assert code == 0, err
    [refused] = await entries(client, keys, "doc:refused", "spam-r")
    assert refused["data"] == {
        "doc_id": "spam-r", "status": "rejected", "request": escalated,
        "reasons": [{"code": "rejected_by_reviewer", "field": "", "message": "spam"}]}
    assert await entries(client, keys, "doc:approved", "spam-r") == []
    code, _, err = await cli(server.url, prefix, "review", "reject", review_id, "--by", "bo")
    assert code == 1 and "already decided" in err
    assert len(await entries(client, keys, "doc:refused", "spam-r")) == 1


async def test_two_reviewers_at_once_one_decision(server: ServerProcess, client: aioredis.Redis,
                                                  docflow_workers: StreamKeys) -> None:
    keys, prefix = docflow_workers, docflow_workers.prefix
    await submit(client, keys, "note-twice", UNSURE_TEXT)
    review_id, _ = await open_review(client, keys, "note-twice")
    results = await asyncio.gather(
        cli(server.url, prefix, "review", "approve", review_id, "--by", "ana"),
        cli(server.url, prefix, "review", "reject", review_id, "--by", "bo"),
    )
    assert sorted(code for code, _, _ in results) == [0, 1]
    assert await client.xlen(keys.review_decided) == 1
    written = (await entries(client, keys, "doc:approved", "note-twice")
               + await entries(client, keys, "doc:refused", "note-twice"))
    assert len(written) == 1


async def test_a_deadline_rejects_by_timeout(server: ServerProcess, client: aioredis.Redis,
                                             prefix: str, tmp_path: Path) -> None:
    keys = StreamKeys(prefix)
    config = tmp_path / "printery.toml"
    config.write_text("[review.low_confidence]\ntimeout = 1\n")
    svc = spawn(["--redis-url", server.url, "--stream-prefix", prefix, "--app", APP,
                 "--config", str(config)], cwd=ROOT, log_path=tmp_path / "service.log")
    try:
        await submit(client, keys, "note-late", UNSURE_TEXT)
        refused = await wait_for(lambda: entries(client, keys, "doc:refused", "note-late"),
                                 timeout=30, message="the deadline's rejection")
        assert refused[0]["data"]["status"] == "rejected"
        assert refused[0]["data"]["reasons"][0]["code"] == "rejected_by_reviewer"
        [(_, decided)] = await client.xrange(keys.review_decided)
        assert (decided["by"], decided["decision"]) == ("timeout", "rejected")
        assert await client.xlen(keys.review) == 0
    finally:
        assert svc.stop() == 0, svc.log()


async def test_deployment_approval_takes_no_edited_data(
        server: ServerProcess, client: aioredis.Redis, prefix: str) -> None:
    request = {"deployment_id": "dep-e", "service": "billing-api", "version": "1.0.0",
               "environment": "production", "requested_by": "alice"}
    review_id = str(await client.xadd(f"{prefix}:review", {
        "data": json.dumps(request), "type": "review", "deployment_id": "dep-e",
        "kind": "approval", "step": "validator", "reason": "production requires approval",
        "resume_type": "deployment:validated", "reject_type": "deployment:rejected"}))
    env = {k: v for k, v in os.environ.items() if k not in ("REDIS_URL", "STREAM_PREFIX")}
    proc = await asyncio.create_subprocess_exec(
        sys.executable, "-m", "printery.cli.operator", "--redis-url", server.url,
        "--stream-prefix", prefix, "review", "approve", review_id, "--by", "bob",
        "--data", json.dumps({**request, "version": "9.9.9"}), env=env,
        stdout=asyncio.subprocess.PIPE, stderr=asyncio.subprocess.PIPE)
    _, err = await asyncio.wait_for(proc.communicate(), 60)
    assert proc.returncode == 2 and "takes no edited data" in err.decode()
    assert await client.xlen(f"{prefix}:review") == 1
    assert await client.exists(f"{prefix}:deployment:validated") == 0
