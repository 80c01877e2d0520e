"""Replay skip: a replay's copy for other steps is acked, not run."""


from tests.support.policy_fakes import batch, entry, ids, outcomes

from printery.policies.replay_skip import ReplaySkip
from printery.wire.fields import REPLAY_FOR


async def test_a_copy_for_other_steps_is_skipped_and_one_for_this_step_runs() -> None:
    items = [entry(0, extra={REPLAY_FOR: "other,third"}), entry(1, extra={REPLAY_FOR: "x,step"}),
             entry(2)]
    admitted = batch(items)
    await ReplaySkip("step").admit(admitted)
    assert ids(admitted.entries) == ["1-0", "2-0"]
    assert outcomes(admitted.decided) == [("0-0", "skipped")]
    assert admitted.decided[0].commit.appends == ()


async def test_a_batch_without_replays_is_left_as_it_is() -> None:
    items = [entry(0), entry(1)]
    admitted = batch(items)
    await ReplaySkip("step").admit(admitted)
    assert admitted.entries is items and not admitted.decided
