"""Gates fail closed and handlers return outputs (docs/reference.md, Failures), on the
pure functions: what a validator may answer, what a submit does with an ``input_check``
that answers anything else, and what a handler may return."""

from __future__ import annotations

from typing import Any

import pytest

from printery import Output, Pipeline, Reason, Reject
from printery.base.errors import OutputContractError
from printery.pipeline.step import checked_reasons
from printery.runtime.handler import outputs_of


@pytest.mark.parametrize("answer", [
    None, "", "fine", b"x", 0, True, {"code": "x"}, [None], ["code"], [1],
    [{"code": 1}], [{"code": 1, "field": None}], [{"code": "x", "field": None}],
    [{"code": "x", "message": 3}], [{"field": "f"}], [{"code": ""}], [{"code": "  "}],
    [{"code": "x", "extra": "y"}], [Reason("")], [Reason("  ")], (r for r in ()),
])
def test_anything_but_a_list_of_reasons_is_a_validator_error(answer: Any) -> None:
    with pytest.raises(Reject) as caught:
        checked_reasons(answer, "check")
    assert caught.value.reason_code == "validator_error"
    assert str(caught.value).startswith("check returned ")


def test_reasons_and_mappings_of_strings_are_reasons() -> None:
    assert checked_reasons([], "check") == []
    assert checked_reasons((), "check") == []
    found = checked_reasons([Reason("a", "f", "m"), {"code": "b"},
                             {"code": "c", "field": "x", "message": "y"}], "check")
    assert [r.as_dict() for r in found] == [
        {"code": "a", "field": "f", "message": "m"},
        {"code": "b", "field": "", "message": ""},
        {"code": "c", "field": "x", "message": "y"},
    ]


def test_an_input_check_that_forgets_to_return_refuses_the_submit() -> None:
    p = Pipeline("p", ingress=["in"])

    def forgetful(data: Any) -> Any:
        if data.get("bad"):
            return [Reason("bad", "bad")]
        return None  # forgot `return []`

    @p.step("a", consumes=["in"], input_check=forgetful)
    async def a(message: Any) -> None:
        return None

    (reason,) = p.input_reasons("in", {"ok": 1})
    assert reason.code == "validator_error" and "returned None" in reason.message
    assert [r.code for r in p.input_reasons("in", {"bad": 1})] == ["bad"]


@pytest.mark.parametrize("result", ["hello", b"x", 3, {"type": "out"}, ["x"],
                                    [Output("a", 1), None], (x for x in ["y"])])
def test_a_handler_result_that_is_not_outputs_is_refused_with_what_it_must_be(
    result: Any
) -> None:
    with pytest.raises(OutputContractError,
                       match="a handler returns an Output, a list of Output, or None"):
        outputs_of(result)


def test_outputs_are_taken_as_they_are() -> None:
    one = Output("a", 1)
    listed = [one, Output("b", 2)]
    assert outputs_of(None) == [] and outputs_of(one) == [one]
    assert outputs_of(listed) is listed
    assert outputs_of((one,)) == [one]
