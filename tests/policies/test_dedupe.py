"""Dedupe: duplicates acked without a call, in the batch's one round trip."""


from tests.support.policy_fakes import LookUps, batch, entries, ids, outcomes

from printery.policies.base import Policy
from printery.policies.dedupe import Dedupe


async def test_a_recorded_key_is_acked_with_its_record_and_the_rest_run() -> None:
    look_up = LookUps(recorded={"task:1"})
    admitted = batch(entries(3), look_up=look_up)
    await Dedupe().admit(admitted)
    assert ids(admitted.entries) == ["0-0", "2-0"]
    assert outcomes(admitted.decided) == [("1-0", "duplicate")]
    assert admitted.decided[0].commit.record == "task:1"
    assert look_up.sent == [(["task:0", "task:1", "task:2"], [])]


async def test_entries_a_step_wrote_are_not_asked() -> None:
    look_up = LookUps(recorded={"task:0", "task:1"})
    items = entries(2)
    items[1][1].envelope.producer = "upstream"
    admitted = batch(items, look_up=look_up)
    await Dedupe(written_by={"upstream"}).admit(admitted)
    assert look_up.sent == [(["task:0"], [])]
    assert ids(admitted.entries) == ["1-0"]  # its commit checks the record, atomically


async def test_other_policies_reads_join_the_same_round_trip() -> None:
    class Reader(Policy):
        def reads(self, batch):  # type: ignore[no-untyped-def]
            return [("ZMSCORE", "over", *(m.correlation_id for _, m in batch.entries))]

    reader = Reader()
    look_up = LookUps(replies={"ZMSCORE": [None, None]})
    admitted = batch(entries(2), look_up=look_up, readers=[reader])
    await Dedupe().admit(admitted)
    replies, read_for = await admitted.replies(reader)
    assert replies == [[None, None]] and ids(read_for) == ["0-0", "1-0"]
    assert look_up.sent == [(["task:0", "task:1"], [("ZMSCORE", "over", "run-0", "run-1")])]
