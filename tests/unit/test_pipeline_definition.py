"""What a user writes from the README is accepted as written, and what could only fail
at run time is refused when the pipeline is defined, with a message saying what to write."""

from __future__ import annotations

import pytest

from printery import (
    Aggregator,
    JoinState,
    Message,
    Pipeline,
    PipelineError,
    Reason,
    Step,
    all_must_pass,
    any_pass,
    first_wins,
    to_text,
)


async def _noop(message: Message) -> None:
    return None


def test_reason_positional_as_the_docs_write_it() -> None:
    reason = Reason("low_confidence", "confidence", "below 0.5")
    assert reason == Reason(code="low_confidence", field="confidence", message="below 0.5")
    assert reason.as_dict() == {"code": "low_confidence", "field": "confidence", "message": "below 0.5"}
    assert Reason("empty") == Reason(code="empty", field="", message="")
    assert Reason.model_validate({"code": "c", "field": "f"}).field == "f"


def _aggregator(**kw: object) -> Aggregator:
    args: dict[str, object] = {"opens": "a", "opens_as": "a", "branches": {"b": "b"}, "emits": "c",
                               "policy": first_wins(), **kw}
    return Aggregator("join", **args)  # type: ignore[arg-type]


@pytest.mark.parametrize(("factory", "hint"), [
    (all_must_pass, "policy=all_must_pass(status_of="),
    (any_pass, "policy=any_pass(passed="),
    (first_wins, "policy=first_wins()"),
])
def test_policy_factory_uncalled_is_refused_with_what_to_write(factory: object, hint: str) -> None:
    with pytest.raises(PipelineError, match="policy factory") as caught:
        _aggregator(policy=factory)
    assert hint in str(caught.value) and "'join'" in str(caught.value)


def test_policy_of_the_wrong_shape_is_refused() -> None:
    with pytest.raises(PipelineError, match="one JoinState"):
        _aggregator(policy=lambda state, extra: None)
    with pytest.raises(PipelineError, match="not callable"):
        _aggregator(policy={"status": "ok"})

    def merge(state: JoinState) -> dict[str, str] | None:
        return None

    assert _aggregator(policy=merge).policy is merge


@pytest.mark.parametrize("bad", [0, -1, 1.5, True, "2"])
def test_concurrency_below_one_is_refused_when_defined(bad: object) -> None:
    pipeline = Pipeline("p", ingress=["in"])
    with pytest.raises(PipelineError, match=r"concurrency=.* integer >= 1"):
        pipeline.step("s", consumes=["in"], concurrency=bad)(_noop)  # type: ignore[arg-type]
    with pytest.raises(PipelineError, match="concurrency"):
        Step("s", ("in",), (), _noop, concurrency=bad)  # type: ignore[arg-type]
    with pytest.raises(PipelineError, match="aggregator 'join': concurrency"):
        _aggregator(concurrency=bad)
    assert pipeline.steps == {}


def test_text_view_shows_the_concurrency_in_effect() -> None:
    pipeline = Pipeline("p", ingress=["in"])
    pipeline.step("s", consumes=["in"], produces=["out"], concurrency=2)(_noop)
    assert "s x2: in -> out" in to_text(pipeline)
    assert "s x7: in -> out" in to_text(pipeline, {"s": 7})
    assert pipeline.describe({"s": 7})["steps"][0]["concurrency"] == 7


def test_a_run_id_is_checked_as_the_ingress_would_check_the_data_naming_it() -> None:
    """``Pipeline.run_id_reasons``: a submit's ``run_id`` (or a replay's new id) holds to
    the ingress step's rule for the correlation field; a model with no such field, which
    refuses it as unknown, leaves only the generic rule."""
    from pydantic import BaseModel, ConfigDict, Field

    class Strict(BaseModel):
        model_config = ConfigDict(extra="forbid")
        text: str

    class WithId(BaseModel):
        text: str
        doc_id: str | None = Field(default=None, pattern=r"^[a-z0-9-]+$")

    for model, refused in ((Strict, False), (WithId, True)):
        pipeline = Pipeline("docs", ingress=["doc:new"], correlation_field="doc_id")
        pipeline.add(Step("read", ["doc:new"], [], _noop, input_model=model))
        assert pipeline.run_id_reasons("doc:new", {"text": "t"}, "doc-1") == []
        upper = pipeline.run_id_reasons("doc:new", {"text": "t"}, "Doc 1")
        assert [r.field for r in upper] == (["run_id"] if refused else [])
        for bad in ("", "a\nb", "\x9b", "x" * 257):
            [reason] = pipeline.run_id_reasons("doc:new", {"text": "t"}, bad)
            assert (reason.code, reason.field) == ("invalid_field", "run_id")


def test_an_unknown_step_option_is_refused_at_definition() -> None:
    """A misspelt option (``concurency=3``) was taken and the step ran with the default."""
    p = Pipeline("typos", ingress=["a"])
    with pytest.raises(PipelineError, match=r"unknown options concurency, prefech; .*prefetch"):
        p.step("s", consumes=["a"], concurency=3, prefech=10)(_noop)
    with pytest.raises(PipelineError, match=r"step 'raw': unknown option retries"):
        Step("raw", consumes=("a",), produces=(), handler=_noop, settings={"retries": 2})
    p.step("t", consumes=["a"], prefetch=10, max_deliveries=3)(_noop)  # known ones pass
    assert dict(p.steps["t"].settings) == {"prefetch": 10, "max_deliveries": 3}
