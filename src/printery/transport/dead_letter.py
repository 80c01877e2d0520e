"""A dead letter written on its own (an operator's ``printery pending dlq``, a join a sweep
decided): one commit of the dead-letter kind (:class:`~printery.transport.commit.EntryCommit`
``letter``), through the one commit script (reference: failures). The runtime's dead
letters go through its committer with the rest of their batch; these have none.

The run's ``run:failed`` names the dlq entry's id, which exists only once its ``XADD``
ran: the commit script writes both. A retry after a lost reply finds the entry acked and
writes nothing twice (the fence)."""

from __future__ import annotations

from printery.transport.commit import DeadLetterWrite, EntryCommit, commit_alone
from printery.transport.scripts import Scripts

__all__ = ["DeadLetterWrite", "letter_commit", "write_dead_letter"]


def letter_commit(write: DeadLetterWrite) -> EntryCommit:
    """The commit of one dead letter."""
    return EntryCommit(write.source, write.consumer, write.entry_id, "", (), letter=write)


async def write_dead_letter(scripts: Scripts, write: DeadLetterWrite) -> str | None:
    """Dead-letter one entry; the dlq entry's id, or None when the entry is no longer
    held as ``write`` says (acked meanwhile, or another consumer's now). Raises the
    script's error."""
    (reply,) = await commit_alone(scripts, [letter_commit(write)])
    if isinstance(reply, Exception):
        raise reply
    if reply == -1 or reply is None:
        return None
    return str(reply)
