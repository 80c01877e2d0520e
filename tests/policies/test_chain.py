"""The chain: each hook runs only for the policies that define it, in order."""

from typing import Any

from tests.support.policy_fakes import LookUps, entries, ids, outcomes, written

from printery.policies.base import Batch, Policy, acked
from printery.policies.chain import Chain
from printery.runtime.accounting import Decided


class Drop(Policy):
    """Decides the entry it names; records what it saw."""

    def __init__(self, entry_id: str, seen: list[tuple[str, list[str]]]) -> None:
        self.entry_id = entry_id
        self.seen = seen
        self.name = f"drop {entry_id}"

    async def admit(self, batch: Batch) -> None:
        self.seen.append((self.entry_id, ids(batch.entries)))
        kept = []
        for delivery, message in batch.entries:
            if delivery.entry_id == self.entry_id:
                batch.decide(Decided(delivery, acked(delivery), "skipped"))
            else:
                kept.append((delivery, message))
        batch.keep(kept)


class Around(Policy):
    def __init__(self, tag: str, calls: list[str]) -> None:
        self.tag = tag
        self.calls = calls

    def wrap(self, call: Any) -> Any:
        async def around(delivery: Any, message: Any) -> Any:
            self.calls.append(f"{self.tag}>")
            try:
                return await call(delivery, message)
            finally:
                self.calls.append(f"<{self.tag}")
        return around


async def handler(message: Any) -> None:
    return None


async def test_admit_hooks_run_in_order_each_on_what_the_ones_before_left() -> None:
    seen: list[tuple[str, list[str]]] = []
    chain = Chain([Drop("0-0", seen), Drop("1-0", seen)], handler)
    decided: list[Decided] = []
    left = await chain.admit(entries(3), decided, look_up=LookUps(), written=written,
                             none_over=False)
    assert seen == [("0-0", ["0-0", "1-0", "2-0"]), ("1-0", ["1-0", "2-0"])]
    assert ids(left) == ["2-0"] and outcomes(decided) == [("0-0", "skipped"), ("1-0", "skipped")]


async def test_a_batch_left_empty_stops_the_admit_hooks() -> None:
    seen: list[tuple[str, list[str]]] = []
    chain = Chain([Drop("0-0", seen), Drop("1-0", seen)], handler)
    left = await chain.admit(entries(1), [], look_up=LookUps(), written=written, none_over=False)
    assert left == [] and [entry for entry, _ in seen] == ["0-0"]


async def test_a_hook_no_policy_defines_is_compiled_away() -> None:
    chain = Chain([Drop("0-0", [])], handler)
    assert chain.wrapped is None and not chain.attempting and not chain.before
    assert not chain.committing and not chain.after and chain.admitting


async def test_wraps_nest_with_the_first_policy_outermost() -> None:
    calls: list[str] = []
    chain = Chain([Around("a", calls), Around("b", calls)], handler)
    assert chain.wrapped is not None
    (delivery, message), = entries(1)
    await chain.wrapped(delivery, message)
    assert calls == ["a>", "b>", "<b", "<a"]
