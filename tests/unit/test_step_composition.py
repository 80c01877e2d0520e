"""Steps composed one way (docs/reference.md, Pipelines and steps): whatever gives its
steps is added the same way, with what it is beyond them carried on them; every
definition refuses a keyword it does not take, naming the ones it does; a Loop as a
Map's ``each`` needs no type names. No server: definitions only."""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import pytest

from printery import (
    Aggregator,
    Loop,
    Map,
    Message,
    Pipeline,
    PipelineError,
    Step,
    StepSource,
    first_wins,
)


async def _noop(message: Message) -> None:
    return None


def _work(message: Message) -> str:
    return "draft"


def _check(message: Message) -> list[Any]:
    return []


def _loop(**options: Any) -> Loop:
    return Loop("extract", **{"work": _work, "validate": _check, "max_attempts": 2, **options})


def _map(**options: Any) -> Map:
    return Map("pages", **{"consumes": "doc", "produces": "merged",
                           "split": lambda m: m.data, "each": _work, **options})


def _aggregator(**options: Any) -> Aggregator:
    return Aggregator("join", **{"opens": "a", "opens_as": "a", "branches": {"b": "b"},
                                 "emits": "joined", "policy": first_wins(), **options})


class Pair:
    """A combinator of a user's own: two steps, the first one's output the second's input."""

    def steps(self) -> Sequence[Step]:
        return [Step("first", ("in",), ("middle",), _noop),
                Step("second", ("middle",), ("out",), _noop)]


# -- one way to give steps -------------------------------------------------------------------


def test_every_combinator_gives_its_steps_the_same_way() -> None:
    sources: list[StepSource] = [Step("plain", ("in",), ("out",), _noop), _loop(
        consumes="in", produces="out"), _aggregator(), _map(), Pair()]
    assert [[s.name for s in source.steps()] for source in sources] == [
        ["plain"], ["extract"], ["join"], ["pages", "pages:each", "pages:collect"],
        ["first", "second"]]


def test_add_takes_any_step_source_and_returns_its_first_step() -> None:
    pipeline = Pipeline("p", ingress=["in", "doc"])
    added = pipeline.add(Pair())
    assert added.name == "first" and list(pipeline.steps) == ["first", "second"]
    plain = Step("plain", ("doc",), ("done",), _noop)
    assert pipeline.add(plain) is plain
    assert pipeline.add(_map(produces="merged")).name == "pages"  # a Map: its split
    pipeline.validate()


def test_a_maps_shape_travels_on_its_split() -> None:
    pipeline = Pipeline("p", ingress=["doc"])
    pipeline.add(_map(max_items=7))
    split = pipeline.steps["pages"]
    assert split.map is not None and split.map.max_items == 7
    assert pipeline.maps == {"pages": split.map}
    assert [s.map for s in pipeline.steps.values()][1:] == [None, None]
    assert pipeline.describe()["steps"][0]["map"]["collect"] == "pages:collect"


def test_a_source_with_a_taken_name_adds_none_of_its_steps() -> None:
    pipeline = Pipeline("p", ingress=["in"])
    pipeline.add(Step("second", ("in",), ("other",), _noop))
    with pytest.raises(PipelineError, match="'second' declared twice"):
        pipeline.add(Pair())
    assert list(pipeline.steps) == ["second"]


def test_what_gives_no_steps_is_refused() -> None:
    pipeline = Pipeline("p", ingress=["in"])
    for wrong in (_noop, "step", object()):
        with pytest.raises(PipelineError, match="add takes a Step, or what gives its steps"):
            pipeline.add(wrong)  # type: ignore[arg-type]


def test_a_definition_is_not_changed_by_giving_its_steps() -> None:
    """What a worker needs is built per worker (``Step.bind``), not kept on the
    definition: giving the steps, twice, changes nothing of it."""
    fanned, joined = _map(), _aggregator()
    before = (dict(vars(fanned)), dict(vars(joined)))
    for _ in range(2):
        collect, joining = fanned.steps()[2], joined.steps()[0]
        assert collect.bind is not None and joining.bind is not None
        assert collect.on_context is None and joining.on_context is None
    assert (dict(vars(fanned)), dict(vars(joined))) == before


async def test_a_stateful_handler_outside_a_worker_says_so() -> None:
    collect, joining = _map().steps()[2], _aggregator().steps()[0]
    for step, what in ((collect, "map 'pages'"), (joining, "aggregator 'join'")):
        with pytest.raises(RuntimeError, match=f"{what}: .* runs in a worker built by "
                                               "Pipeline.build_workers"):
            await step.handler(None)  # type: ignore[arg-type]


# -- unknown options ---------------------------------------------------------------------------


@pytest.mark.parametrize(("build", "what", "known"), [
    (lambda: _loop(consumes="in", produces="out", concurency=3), "loop 'extract'",
     "consumes, produces, work, validate, max_attempts"),
    (lambda: _map(max_item=5), "map 'pages'", "consumes, produces, split, each, merge"),
    (lambda: _aggregator(deadlin=5), "aggregator 'join'", "opens, opens_as, branches"),
    (lambda: Step("plain", ("in",), ("out",), _noop, concurency=2), "step 'plain'",
     "consumes, produces, handler, concurrency"),
])
def test_a_misspelt_option_is_refused_naming_it_and_the_known_ones(
    build: Any, what: str, known: str
) -> None:
    with pytest.raises(PipelineError) as refused:
        build()
    said = str(refused.value)
    assert said.startswith(f"{what}: unknown option ")
    assert "concurency" in said or "max_item" in said or "deadlin" in said
    assert f"the options are {known}" in said


def test_a_consumer_setting_given_to_a_combinator_says_where_it_goes() -> None:
    with pytest.raises(PipelineError, match=r"unknown option prefetch \(prefetch: consumer "
                                            r"settings, given under \[workers.<step>\]"):
        _loop(consumes="in", produces="out", prefetch=10)


def test_a_misspelt_setting_of_the_step_decorator_is_refused() -> None:
    pipeline = Pipeline("p", ingress=["in"])
    with pytest.raises(PipelineError, match="unknown options concurency, prefech"):
        pipeline.step("s", consumes=["in"], concurency=3, prefech=10)(_noop)  # type: ignore[call-arg]


def test_a_required_option_left_out_is_still_a_type_error() -> None:
    with pytest.raises(TypeError, match="max_attempts"):
        Loop("l", consumes="a", produces="b", work=_work, validate=_check)  # type: ignore[call-arg]


# -- a Loop in a Map -----------------------------------------------------------------------------


def test_a_loop_as_each_needs_no_type_names() -> None:
    given = _loop()
    pipeline = Pipeline("p", ingress=["doc"])
    pipeline.add(_map(each=given))
    step = pipeline.steps["extract"]
    assert step.consumes == ("pages:item", "extract:loop")
    assert {"pages:result", "extract:exhausted"} <= set(step.produces)
    assert step.loop is not None and step.loop.produces == "pages:result"
    assert pipeline.steps["pages:collect"].consumes == ("pages:result", "extract:exhausted")
    pipeline.validate()
    assert not given.wired, "the Loop given is left as it was (the Map keeps a wired copy)"


def test_a_loop_as_each_may_still_spell_the_types() -> None:
    pipeline = Pipeline("p", ingress=["doc"])
    pipeline.add(_map(each=_loop(consumes="pages:item", produces="pages:result")))
    assert pipeline.steps["extract"].consumes[0] == "pages:item"
    pipeline.validate()


def test_a_loop_as_each_with_other_types_is_refused() -> None:
    with pytest.raises(PipelineError, match="must have consumes='pages:item'"):
        _map(each=_loop(consumes="other"))
    with pytest.raises(PipelineError, match="must have produces='pages:result'"):
        _map(each=_loop(produces="other"))


def test_a_loop_without_types_outside_a_map_is_refused_when_added() -> None:
    pipeline = Pipeline("p", ingress=["doc"])
    with pytest.raises(PipelineError, match="loop 'extract': consumes and produces are "
                                            "required"):
        pipeline.add(_loop())
    assert pipeline.steps == {}
    with pytest.raises(PipelineError, match="distinct"):
        _loop(consumes="")
