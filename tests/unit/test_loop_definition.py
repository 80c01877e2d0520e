"""A validation loop as the graph sees it (docs/reference.md, Validation loops): the only
cycle a pipeline accepts is inside a declared ``Loop``; any other is refused with its
steps named; a loop without a sensible bound is refused when defined; its exhausted type
ends a run; ``pipeline show`` draws it."""

from __future__ import annotations

from typing import Any

import pytest

from printery import (
    Budget,
    Limit,
    Loop,
    Message,
    Pipeline,
    PipelineError,
    Reason,
    Step,
    to_mermaid,
    to_text,
)


async def _noop(message: Message) -> None:
    return None


def _work(message: Message) -> dict[str, Any]:
    return {"text": "x"}


def _check(message: Message) -> list[Reason]:
    return []


def _loop(**kw: Any) -> Loop:
    args: dict[str, Any] = {"consumes": "request", "produces": "answer", "work": _work,
                            "validate": _check, "max_attempts": 3, **kw}
    return Loop("draft", **args)


def _pipeline(*steps: Step | Loop, **kw: Any) -> Pipeline:
    pipeline = Pipeline("p", ingress=["request"], **kw)
    for step in steps:
        pipeline.add(step)
    return pipeline


def test_a_declared_loop_is_the_only_cycle_accepted() -> None:
    pipeline = _pipeline(_loop(), Step("publish", ("answer",), ("published",), _noop))
    pipeline.validate()
    assert pipeline.dependencies() == {"draft": (), "publish": ("draft",)}
    step = pipeline.steps["draft"]
    assert step.consumes == ("request", "draft:loop")
    assert step.produces == ("draft:loop", "answer", "draft:exhausted")


def test_an_undeclared_cycle_is_refused_with_its_steps_named() -> None:
    pipeline = _pipeline(Step("write", ("request", "critique"), ("draft",), _noop),
                         Step("critic", ("draft",), ("critique",), _noop))
    with pytest.raises(PipelineError, match=r"cycle: (write -> critic -> write|critic -> write "
                                            r"-> critic).*declared Loop"):
        pipeline.validate()


def test_a_step_consuming_its_own_output_is_a_cycle_too() -> None:
    pipeline = _pipeline(Step("again", ("request", "again"), ("again",), _noop))
    with pytest.raises(PipelineError, match="cycle: again -> again"):
        pipeline.validate()


def test_a_cycle_through_a_loop_but_outside_it_is_refused() -> None:
    pipeline = _pipeline(_loop(consumes="question"),
                         Step("ask", ("request", "answer"), ("question",), _noop))
    with pytest.raises(PipelineError, match=r"cycle: .*draft.*ask|cycle: .*ask.*draft"):
        pipeline.validate()


@pytest.mark.parametrize("bad", [0, -1, 2.5, True, None, "3"])
def test_max_attempts_must_be_an_integer_of_at_least_one(bad: object) -> None:
    with pytest.raises(PipelineError, match=r"max_attempts=.* write an integer >= 1"):
        _loop(max_attempts=bad)


def test_max_attempts_is_required() -> None:
    with pytest.raises(TypeError, match="max_attempts"):
        Loop("draft", consumes="request", produces="answer", work=_work,  # type: ignore[call-arg]
             validate=_check)


def test_types_must_be_distinct() -> None:
    with pytest.raises(PipelineError, match="distinct"):
        _loop(produces="request")
    with pytest.raises(PipelineError, match="not callable"):
        _loop(validate="yes")


def test_the_exhausted_type_ends_a_run_even_when_consumed_or_outcomes_are_declared() -> None:
    # run:failed ends every run (docs/reference.md, Failures)
    assert _pipeline(_loop(exhausted="gave_up")).outcomes == ("answer", "gave_up", "run:failed",
                                                              "run:cancelled")
    consumed = _pipeline(_loop(), Step("notify", ("draft:exhausted",), ("sent",), _noop))
    assert "draft:exhausted" in consumed.outcomes and "draft:loop" not in consumed.outcomes
    declared = _pipeline(_loop(), outcomes=["answer"])
    assert declared.outcomes == ("answer", "draft:exhausted", "run:failed", "run:cancelled")


def test_review_adds_the_review_stream_and_describe_shows_the_loop() -> None:
    pipeline = _pipeline(_loop(review_kind="answer_review", fallback=_work))
    pipeline.validate()
    assert "review" in pipeline.steps["draft"].produces
    (step,) = pipeline.describe()["steps"]
    assert step["loop"] == {"max_attempts": 3, "stream": "draft:loop",
                            "attempt_type": "draft:attempt", "verdict_type": "draft:verdict",
                            "produces": "answer", "exhausted": "draft:exhausted",
                            "fallback": True, "review_kind": "answer_review"}


def test_pipeline_show_draws_the_loop() -> None:
    pipeline = _pipeline(_loop(review_kind="answer_review", fallback=_work),
                         Step("publish", ("answer",), (), _noop))
    text = to_text(pipeline)
    assert "  draft x1: request -> answer, draft:exhausted, review\n" in text
    assert ("    loop: validated, up to 3 attempts with feedback; then the fallback; then "
            "review 'answer_review' (approve: answer, reject: draft:exhausted)") in text
    assert "draft:loop" not in text
    chart = to_mermaid(pipeline)
    assert 'draft[["draft (loop)"]]' in chart
    assert 'draft -->|"retry with feedback, at most 3"| draft' in chart
    assert "draft -->|answer| publish" in chart
    assert "draft:loop" not in chart


def test_limits_budget_and_timeout_go_on_the_loops_step() -> None:
    limit = Limit("model", requests_per_minute=60)
    budget = Budget(tokens=1000)
    pipeline = Pipeline("p", ingress=["request"], cost_units=["tokens"])
    pipeline.add(_loop(limits=[limit], budget=budget, timeout=20, cost_units=["tokens"]))
    step = pipeline.steps["draft"]
    assert step.limits == (limit,) and step.budget == budget
    # The runtime's cancel comes a little after the loop's own deadline (a failed attempt).
    assert step.timeout == 21
    assert pipeline.budget_plan(step) is not None
    assert _loop().step().timeout == 301  # the default deadline of a work call: 300 s


@pytest.mark.parametrize(("kw", "match"), [
    ({"timeout": 0}, "timeout=0"), ({"timeout": "5"}, "timeout='5'"),
    ({"limits": ["model"]}, "not a Limit"), ({"budget": 5}, "not a Budget"),
])
def test_bad_loop_limits_budget_or_timeout_are_refused(kw: dict[str, Any], match: str) -> None:
    with pytest.raises(PipelineError, match=match):
        _loop(**kw).step()
