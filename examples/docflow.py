"""A document pipeline of the kind the orchestration ideas describe, on the public API only:

    extract ──> summarize ─┐
        │  └──> classify ──┴─> join (aggregator) ──> gate (validator) ──> publish
        └──────────────── opens the join ─────────┘          └─> review (a human)

Plain functions stand in for model calls. A document the classifier is unsure of goes to
review: a reviewer approves it with corrected data (the run resumes at ``publish`` with
exactly that data) or rejects it (``doc:refused``, status ``rejected``). The demo run
plays the reviewer through :mod:`printery.inbox.reviews`; against a service, a person does:

    printery --app examples.docflow:pipeline review list
    printery --app examples.docflow:pipeline review approve ID --by ana \
        --data '{"doc_id": "note-1", "label": "note", "summary": "...", "confidence": 1}'

Run it end to end on a real server:

    python -m examples.docflow                 # starts a throwaway server of its own
    REDIS_URL=redis://127.0.0.1:6379 python -m examples.docflow

or as a service: ``printery-workers --app examples.docflow:pipeline``.
"""

from __future__ import annotations

import asyncio
import os
import sys
import tempfile
import uuid
from typing import Any

import redis.asyncio as aioredis
from pydantic import BaseModel

from printery import (
    REVIEW,
    Aggregator,
    ConsumerSettings,
    JoinState,
    Message,
    Output,
    Pipeline,
    Reason,
    StreamKeys,
    WorkerManager,
    review_output,
)
from printery.inbox import reviews


class Submitted(BaseModel):
    doc_id: str
    text: str


class Summary(BaseModel):
    doc_id: str
    summary: str


class Classification(BaseModel):
    doc_id: str
    label: str
    confidence: float


class Publishable(BaseModel):
    """What ``publish`` needs: also what a reviewer's edited data must hold."""

    doc_id: str
    label: str
    summary: str


pipeline = Pipeline(
    "docflow", ingress=["doc:submitted"], correlation_field="doc_id", id_prefix="doc",
    cost_units=["tokens"],
)


@pipeline.step("extract", consumes=["doc:submitted"], produces=["doc:extracted"],
               input_model=Submitted)
async def extract(message: Message) -> Output:
    text = " ".join(message.data["text"].split())
    return Output("doc:extracted", {"doc_id": message.correlation_id, "text": text,
                                    "words": len(text.split())})


@pipeline.step("summarize", consumes=["doc:extracted"], produces=["doc:summarized"],
               output_models={"doc:summarized": Summary}, cost_units=["tokens"])
async def summarize(message: Message) -> Output:
    words = message.data["text"].split()
    message.report_cost("tokens", len(words))  # what a model call would bill
    return Output("doc:summarized", {"doc_id": message.correlation_id,
                                     "summary": " ".join(words[:12])})


@pipeline.step("classify", consumes=["doc:extracted"], produces=["doc:classified"],
               output_models={"doc:classified": Classification})
async def classify(message: Message) -> Output:
    text = message.data["text"].lower()
    label = "invoice" if "invoice" in text else "letter" if "dear" in text else "other"
    confidence = 0.9 if label != "other" else 0.3
    return Output("doc:classified", {"doc_id": message.correlation_id, "label": label,
                                     "confidence": confidence})


def merge(state: JoinState) -> dict[str, Any] | None:
    """Both branches must report; at the deadline, what arrived is passed on with a gap."""
    if not (state.complete or state.timed_out):
        return None
    return {"doc_id": state.correlation_id, "missing": list(state.missing),
            **state.arrived.get("summarize", {}), **state.arrived.get("classify", {})}


pipeline.add(Aggregator(
    "join", opens="doc:extracted", opens_as="extract",
    branches={"doc:summarized": "summarize", "doc:classified": "classify"},
    emits="doc:analyzed", policy=merge, deadline=30,
).step())


def check(analysis: dict[str, Any]) -> list[Reason]:
    """The gate before the side effect: deterministic rules, machine-actionable reasons."""
    reasons = []
    if analysis.get("missing"):
        reasons.append(Reason(code="branch_missing", field=",".join(analysis["missing"]),
                              message="an analysis branch did not report"))
    if not analysis.get("summary"):
        reasons.append(Reason(code="empty_summary", field="summary", message="nothing to publish"))
    if float(analysis.get("confidence", 0)) < 0.5:
        reasons.append(Reason(code="low_confidence", field="confidence",
                              message=f"classifier confidence {analysis.get('confidence')}"))
    return reasons


#: The review kind of a document the classifier is unsure of (declared, so that a typo in
#: its `[review.low_confidence]` table is refused).
UNSURE = "low_confidence"
pipeline.review_kind(UNSURE)


@pipeline.step("gate", consumes=["doc:analyzed"],
               produces=["doc:approved", "doc:refused", REVIEW])
async def gate(message: Message) -> Output:
    reasons = check(message.data)
    if [r.code for r in reasons] == ["low_confidence"]:
        # Only unsure, nothing broken: a human decides, and may correct the label.
        return review_output(message, kind=UNSURE, reason=reasons[0].message,
                             on_approve="doc:approved", on_reject="doc:refused")
    if reasons:
        return Output("doc:refused", {"doc_id": message.correlation_id,
                                      "reasons": [r.as_dict() for r in reasons]})
    return Output("doc:approved", message.data)


@pipeline.step("publish", consumes=["doc:approved"], produces=["doc:published"],
               input_model=Publishable)
async def publish(message: Message) -> Output:
    return Output("doc:published", {"doc_id": message.correlation_id,
                                    "label": message.data["label"],
                                    "summary": message.data["summary"]})


async def demo_reviewer(client: aioredis.Redis, keys: StreamKeys) -> None:
    """Stands in for a person at ``printery review``: spam is rejected, anything else is
    approved as a note, with the label corrected in the data it resumes with."""
    for review in await reviews.list_reviews(client, keys, pipeline):
        data = review["data"]
        if "free" in str(data.get("summary", "")).lower():
            await reviews.reject(client, keys, pipeline, review["id"], by="demo-reviewer",
                                 note="spam")
        else:
            await reviews.approve(client, keys, pipeline, review["id"], by="demo-reviewer",
                                  data={**data, "label": "note", "confidence": 1.0})


async def run_once(url: str, prefix: str, docs: dict[str, str], timeout: float = 30) -> dict[str, Any]:
    """Run the pipeline, submit ``docs``, wait for each to be published or refused."""
    from printery.base._json import dumps, loads
    from printery.transport.connection import connect

    client = connect(url, block_ms=100)
    keys = StreamKeys(prefix)
    manager = WorkerManager(drain_timeout=2)
    for worker, deps in pipeline.build_workers(
        client=client, keys=keys, settings=ConsumerSettings(block_ms=100)
    ):
        manager.register(worker, deps)
    await manager.start_all()
    try:
        for doc_id, text in docs.items():
            await client.xadd(keys.stream("doc:submitted"),
                              {"data": dumps({"doc_id": doc_id, "text": text})})
        outcomes: dict[str, Any] = {}
        loop = asyncio.get_running_loop()
        deadline = loop.time() + timeout
        while len(outcomes) < len(docs) and loop.time() < deadline:
            for kind in ("doc:published", "doc:refused"):
                for _id, fields in await client.xrange(keys.stream(kind)):
                    outcomes[fields["doc_id"]] = {"outcome": kind, **loads(fields["data"])}
            await demo_reviewer(client, keys)
            await asyncio.sleep(0.05)
        return outcomes
    finally:
        await manager.stop_all(2)
        await client.aclose()


SAMPLES = {
    "invoice-1": "Invoice 42: three widgets, total 99 EUR, due in 30 days.",
    # Unsure: a reviewer approves it with the label corrected, or rejects it.
    "note-1": "Some note without a clear category at all.",
    "spam-1": "Free cruise for you, click here now.",
    # A large document: it travels between steps by reference, not inline.
    "letter-big": "Dear reader, " + "lorem ipsum dolor sit amet " * 8000,
}


def main() -> int:
    url = os.environ.get("REDIS_URL")
    server = None
    if not url:
        from printery.servers.embedded import start_ephemeral

        server = start_ephemeral(tempfile.mkdtemp(prefix="docflow-"))
        url = server.url
    try:
        outcomes = asyncio.run(run_once(url, f"docflow:{uuid.uuid4().hex[:8]}", SAMPLES))
    finally:
        if server is not None:
            server.stop()
    for doc_id in SAMPLES:
        result = outcomes.get(doc_id, {"outcome": "timeout"})
        detail = result.get("label") or [r["code"] for r in result.get("reasons", [])]
        print(f"{doc_id:12} {result['outcome']:14} {detail}")
    return 0 if len(outcomes) == len(SAMPLES) else 1


if __name__ == "__main__":
    sys.exit(main())
