"""Run index: a commit that starts or ends its run carries its mark."""

from typing import Any

from tests.support.policy_fakes import entries

from printery.policies.run_index import IndexRuns
from printery.transport.commit import Append, EntryCommit


class Index:
    def mark(self, source: str, run: str, appends: Any, costs: Any = None) -> Any:
        return ("ends", run) if any(a.stream == "outcome" for a in appends) else None


async def test_the_mark_goes_with_a_commit_that_has_one_and_no_other() -> None:
    policy = IndexRuns(Index())  # type: ignore[arg-type]
    (_, message), = entries(1)
    plain = EntryCommit("s", "c", "1-0", "k", (Append("step:out", {}),))
    ending = plain._replace(appends=(Append("outcome", {}),))
    assert policy.on_commit(message, plain, "ok") is plain
    assert policy.on_commit(message, ending, "ok").mark == ("ends", "run-0")
