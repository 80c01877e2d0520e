"""A multi-page document fanned out page by page to a streaming model, each page judged
by a gate that can retract the draft its followers saw, then merged in page order; on the
public API only (docs/reference.md: Fan-out: ``Map``; Streaming through the gate):

    doc:submitted ──> pages (Map: one item a page) ──> doc:extracted (every page, in order)
                        └─ extract, each page (Loop: work → validate → feedback, 2 attempts)
                             └─ the model's quota gone: fallback (no model), validated too

- **The model** is ``OpenAICompatible(...).complete(..., stream=True)`` on the endpoint
  ``DOCS_MODEL_URL`` (``DOCS_MODEL``: the model, ``DOCS_MODEL_KEY``: its key's env var).
  Unset, the example starts **a local streaming server on loopback**
  (:mod:`examples.local_model`) whose stand-in model answers with the page's first
  sentence, or with the sentences that carry figures once told it left some out; asked
  about page 3, it answers 429 ``insufficient_quota``: that page's fallback runs at once.
- **The gate** wants the page's figures (found by a regular expression, not by the
  model) in its summary of at most 40 words.
- **A reserved budget**: the run may spend 1,000 tokens and each call reserves 200 before
  it runs (``estimate=``), settled at its commit: pages running at once cannot together
  overshoot it.

Run it offline end to end (a throwaway server and the local model):
``python -m examples.documents``; as a service:
``DOCS_MODEL_URL=... printery-workers --app examples.documents:pipeline``.
"""

from __future__ import annotations

import asyncio
import contextlib
import functools
import os
import re
import sys
import tempfile
from collections.abc import Callable
from typing import Any

from examples.local_model import StreamModel, serving
from printery import (
    Budget,
    Client,
    ConsumerSettings,
    Loop,
    Map,
    Message,
    Partial,
    Pipeline,
    Reason,
    RunResult,
    Verdict,
    WorkerManager,
)
from printery.pipeline.models import OpenAICompatible
from printery.runs.cost import budget_status

DOCUMENT = {"doc_id": "report-q3", "pages": [
    "Revenue rose to 4.2 million euros in the third quarter. Growth came mostly from the "
    "new subscription plans, which customers took up faster than planned.",
    "Costs were kept under control in every region. Staff costs fell by 3 percent to 1.1 "
    "million euros, as the support team moved to the new tooling.",
    "The outlook is cautious. We expect revenue of 4.5 million euros in the fourth quarter, "
    "and no new hires before 2027.",
    "Cash at the end of the quarter stood at 2.8 million euros, up from 2.1 million. The "
    "board proposes no dividend.",
]}
#: The page whose model call finds the local provider's quota gone.
QUOTA_PAGE = 3
BUDGET, ESTIMATE = 1_000, 200


def figures(text: str) -> list[str]:
    return re.findall(r"\d+(?:\.\d+)?", text)


def with_figures(text: str) -> str:
    """The sentences of ``text`` that carry figures (else its first), verbatim."""
    sentences = re.split(r"(?<=\.)\s+", text.strip())
    return " ".join([s for s in sentences if figures(s)] or sentences[:1])


def stand_in(body: dict[str, Any]) -> list[str]:
    """The local model's answer, word by word: the page's first sentence; once told that
    figures were left out, the sentences that carry them."""
    prompt = body["messages"][-1]["content"]
    page = prompt.split("\n")[1]
    answer = with_figures(page) if "refused" in prompt else page.split(". ")[0] + "."
    return [word + " " for word in answer.split()]


#: The local streaming server (its ``url`` is set once it serves): 150 tokens a call.
LOCAL = StreamModel(answer=stand_in, prompt_tokens=120, completion_tokens=30,
                    out_of_quota=lambda body: body["messages"][-1]["content"]
                    .startswith(f"Page {QUOTA_PAGE}:"))


@functools.cache
def _llm(url: str) -> OpenAICompatible:
    return OpenAICompatible(url, os.environ.get("DOCS_MODEL", "gpt-4o-mini"),
                            api_key_env=os.environ.get("DOCS_MODEL_KEY", "OPENAI_API_KEY"))


pipeline = Pipeline("documents", ingress=["doc:submitted"], correlation_field="doc_id",
                    id_prefix="doc", cost_units=["tokens"],
                    budget=Budget(tokens=BUDGET, on_exceeded="stop"))


async def extract(message: Message) -> dict[str, Any]:
    """One attempt at a page's summary, streamed as the model writes it; the gate's
    reasons for the earlier attempts go into the prompt."""
    page = message.data
    notes = [f"Attempt {f['attempt']} was refused: "
             + "; ".join(r["message"] for r in f["reasons"]) for f in message.feedback]
    done = await _llm(os.environ.get("DOCS_MODEL_URL") or LOCAL.url).complete(
        message, stream=True, temperature=0, max_tokens=120, messages=[
            {"role": "system", "content": "Summarise the page in one sentence of at most "
                                          "40 words. Keep every figure it gives."},
            {"role": "user", "content": f"Page {page['page']}:\n{page['text']}\n"
                                        + "\n".join(notes)}])
    return {"page": page["page"], "summary": done.text.strip(), "by": "model",
            "figures": figures(page["text"])}


def figures_only(message: Message) -> dict[str, Any]:
    """The fallback, with no model: the page's sentences that carry figures."""
    page = message.data
    return {"page": page["page"], "summary": with_figures(page["text"]), "by": "fallback",
            "figures": figures(page["text"])}


def check(message: Message) -> list[Reason]:
    summary = message.data["summary"]
    missing = [f for f in message.data["figures"] if f not in figures(summary)]
    reasons = []
    if missing:
        reasons.append(Reason("missing_figure", "summary",
                              f"the summary leaves out {', '.join(missing)}"))
    if not summary or len(summary.split()) > 40:
        reasons.append(Reason("length", "summary", f"{len(summary.split())} words, 1 to 40"))
    return reasons


pipeline.add(Map(
    "pages", consumes="doc:submitted", produces="doc:extracted",
    split=lambda m: [{"page": n, "text": text} for n, text in enumerate(m.data["pages"], 1)],
    each=Loop("extract", work=extract,  # the Map wires it to its items and results
              validate=check, max_attempts=2, fallback=figures_only, concurrency=4,
              cost_units=["tokens"], estimate={"tokens": ESTIMATE}),
    merge=lambda outputs: {"pages": [{k: o[k] for k in ("page", "by", "summary")}
                                     for o in outputs]},
))


async def follow(client: Client, run_id: str, show: Callable[[str], None]) -> None:
    """What a follower of the run sees: each page's draft as the model writes it, then the
    gate's verdict that commits it or retracts it with the reasons."""
    drafts: dict[tuple[int | None, int], str] = {}
    async for item in client.watch(run_id, timeout=60):
        if isinstance(item, Partial):
            drafts[item.item, item.attempt] = drafts.get((item.item, item.attempt), "") + item.text
        elif isinstance(item, Verdict):
            text = drafts.pop((item.item, item.attempt), "").strip()
            verdict = "committed" if item.passed else "retracted"
            show(f"streamed page {(item.item or 0) + 1} draft {item.attempt} {verdict}: {text}")
            for reason in item.reasons:
                show(f"{'':9}{reason['code']}: {reason['message']}")


async def run_once(
    url: str, prefix: str, show: Callable[[str], None] = print
) -> tuple[RunResult, list[dict[str, Any]]]:
    """Run the pipeline's workers, submit :data:`DOCUMENT` while following it, and return
    its result and its budget rows (what ``printery cost RUN_ID`` shows)."""
    async with contextlib.AsyncExitStack() as stack:
        if not os.environ.get("DOCS_MODEL_URL"):
            await stack.enter_async_context(serving(LOCAL))
            show(f"model    a local streaming server, {LOCAL.url} (DOCS_MODEL_URL is unset)")
        client = await stack.enter_async_context(
            Client(url, stream_prefix=prefix, app=pipeline))
        manager = WorkerManager(drain_timeout=2)
        for worker, deps in pipeline.build_workers(
            client=client.redis, keys=client.keys, settings=ConsumerSettings(block_ms=100)
        ):
            manager.register(worker, deps)
        await manager.start_all()
        stack.push_async_callback(manager.stop_all, 2)
        # Followed from before it is submitted: a follower that joins later is not shown
        # the attempts judged before it joined (the run's entries still have them all).
        following = asyncio.ensure_future(follow(client, str(DOCUMENT["doc_id"]), show))
        run_id = await client.submit(DOCUMENT)
        result = await client.result(run_id, timeout=60)
        await following
        return result, await budget_status(client.redis, client.keys, pipeline, run_id) or []


def account(result: RunResult, budget: list[dict[str, Any]]) -> list[str]:
    """Each page once, in page order, by whom, what the gate refused on the way, and what
    the run spent and still holds reserved (``printery cost RUN_ID``)."""
    refused = sorted((int(e["item"]), e["data"]["attempt"], r["code"]) for e in result.entries
                     if e.get("type") == "extract:verdict" and not e["data"]["passed"]
                     for r in e["data"]["reasons"])
    if result.status != "doc:extracted":
        return [f"result   {result.status}: {result.data}"]
    lines = [f"result   {result.status}, {len(result.data['pages'])} pages in order"]
    for page in result.data["pages"]:
        lines.append(f"page {page['page']}   {page['by']:9} {page['summary']}")
        lines += [f"{'':9}attempt {n} did not pass: {code}" for item, n, code in refused
                  if item + 1 == page["page"]]
    return lines + [f"{row['unit']:8} spent {row['spent']:g} of {row['limit']:g}, reserved "
                    f"{row['reserved']:g} ({ESTIMATE} reserved before each call, settled by "
                    f"its commit)" for row in budget]


def main() -> int:
    from printery.observe.logging import configure_logging

    configure_logging("error")  # to stderr: the account (stdout) says what happened
    url = os.environ.get("REDIS_URL")
    server = None
    if not url:
        from printery.servers.embedded import start_ephemeral

        server = start_ephemeral(tempfile.mkdtemp(prefix="documents-"))
        url = server.url
    try:
        result, budget = asyncio.run(run_once(url, f"documents:{os.getpid()}"))
    finally:
        if server is not None:
            server.stop()
    print("\n".join(account(result, budget)))
    return 0 if result.status == "doc:extracted" else 1


if __name__ == "__main__":
    sys.exit(main())
