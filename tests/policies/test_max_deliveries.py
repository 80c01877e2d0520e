"""Max deliveries: an entry past its limit is dead-lettered without a call."""


from tests.support.policy_fakes import Failures, batch, entry, ids

from printery.policies.max_deliveries import MaxDeliveries


async def test_only_an_entry_over_the_limit_is_dead_lettered() -> None:
    failures = Failures()
    admitted = batch([entry(0, deliveries=3), entry(1, deliveries=4), entry(2, deliveries=1)])
    await MaxDeliveries(failures, 3).admit(admitted)  # type: ignore[arg-type]
    assert ids(admitted.entries) == ["0-0", "2-0"]
    assert failures.letters == [("1-0", "max_deliveries_exceeded")]
    assert [item.outcome for item in admitted.decided] == ["dead_lettered"]
