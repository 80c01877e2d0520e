"""Placement: an entry outside its run's partition is moved there and acked here."""


from tests.support.policy_fakes import batch, entries, ids, outcomes

from printery.policies.placement import Placement


class Placer:
    """Places runs whose id ends in an odd digit elsewhere; names runs ``here-1``."""

    def __init__(self) -> None:
        self.moved: list[str] = []

    def named(self, fields):  # type: ignore[no-untyped-def]
        return fields if "correlation_id" in fields else {**fields, "correlation_id": "here-1"}

    async def placed(self, delivery, fields, envelope):  # type: ignore[no-untyped-def]
        if int(envelope.correlation_id[-1]) % 2:
            self.moved.append(delivery.entry_id)
            return True
        return False


async def test_an_entry_of_another_partition_is_routed_and_acked() -> None:
    placer = Placer()
    admitted = batch(entries(3))
    await Placement(placer).admit(admitted)  # type: ignore[arg-type]
    assert ids(admitted.entries) == ["0-0", "2-0"]
    assert outcomes(admitted.decided) == [("1-0", "routed")]
    assert placer.moved == ["1-0"]


async def test_an_entry_naming_no_run_gets_one_of_this_partition_before_it_is_decoded() -> None:
    placement = Placement(Placer())  # type: ignore[arg-type]
    assert placement.named({"type": "t"}) == {"type": "t", "correlation_id": "here-1"}
    assert placement.named({"correlation_id": "r"}) == {"correlation_id": "r"}
