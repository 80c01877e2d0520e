"""A pipeline whose run can end while one of its reviews is open, for the tests of "a run
gets one outcome" (docs/reference.md, Review inbox; The API: /v1): ``summarize`` always
fails and escalates to a review of kind ``unsure`` (approval writes ``doc:summary``, a
rejection the outcome ``doc:unsummarized``); the join ``join`` waits for the summary and
at its deadline ends the run ``partial`` (its outcome ``doc:done``). ``pipeline`` is the
one ``printery --app support.ended_app:pipeline`` loads (the CLI needs its review kinds
and outcomes, not its deadline)."""

from __future__ import annotations

from typing import Any

from printery import REVIEW, Aggregator, JoinState, Message, Output, Pipeline, Step, escalate

#: The run's correlation field.
FIELD = "doc_id"
#: The review kind of an unsure summary.
KIND = "unsure"


async def _unsure(message: Message) -> Output:
    raise RuntimeError("the summary model is unsure")


def _summary_or_partial(state: JoinState) -> Any | None:
    if state.complete:
        return {"status": "done", "summary": state.arrived["summary"]}
    if state.timed_out:
        return {"status": "partial", "missing": list(state.missing)}
    return None


def build(deadline: float = 120.0) -> Pipeline:
    """The pipeline, its join's deadline ``deadline`` seconds."""
    built = Pipeline("ended", ingress=["doc"], correlation_field=FIELD)
    built.add(Step("summarize", ("doc",), ("doc:summary", "doc:unsummarized", REVIEW),
                   escalate(_unsure, attempts=1, review_kind=KIND, on_approve="doc:summary",
                            on_reject="doc:unsummarized")))
    built.add(Aggregator("join", opens="doc", opens_as="doc", branches={"doc:summary": "summary"},
                         emits="doc:done", policy=_summary_or_partial, deadline=deadline,
                         sweep_interval=0.05).step())
    return built


pipeline = build()
