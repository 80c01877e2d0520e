"""Trial: a suspect's next call runs its trial, once; other entries pass."""

from typing import Any
from weakref import WeakKeyDictionary

from tests.support.policy_fakes import entries

from printery.policies.trial import Trials


class Trial:
    def __init__(self) -> None:
        self.began: list[str] = []

    async def begin(self, message: Any) -> None:
        self.began.append(message.entry_id)


class Suspects:
    def __init__(self) -> None:
        self.trials: WeakKeyDictionary[Any, Trial] = WeakKeyDictionary()


async def test_only_the_suspect_runs_its_trial_and_only_once() -> None:
    suspects, trial = Suspects(), Trial()
    (d0, m0), (d1, m1) = entries(2)
    suspects.trials[d1] = trial
    policy = Trials(suspects)  # type: ignore[arg-type]
    await policy.before_call(d0, m0)
    await policy.before_call(d1, m1)
    await policy.before_call(d1, m1)  # its retry runs as any entry's
    assert trial.began == ["1-0"]
