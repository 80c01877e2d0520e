"""Every Redis key name printery uses, derived from one stream prefix."""

from __future__ import annotations

from dataclasses import dataclass

DLQ = "dlq"
REVIEW = "review"
REVIEW_DECIDED = "review:decided"
#: The commands' and the client's stream prefix for an app that declares none (CONTRACT
#: §1); the framework's own :class:`~printery.Settings` default is ``printery``.
COMMAND_STREAM_PREFIX = "materi:events:deployment"


@dataclass(frozen=True, slots=True)
class StreamKeys:
    """Key layout under a prefix: streams are ``<prefix>:<event type>`` (CONTRACT §2)."""

    prefix: str

    def stream(self, event_type: str) -> str:
        return f"{self.prefix}:{event_type}"

    def event_type(self, stream_key: str) -> str:
        """Inverse of :meth:`stream`."""
        return stream_key[len(self.prefix) + 1 :]

    @property
    def dlq(self) -> str:
        return self.stream(DLQ)

    @property
    def review(self) -> str:
        return self.stream(REVIEW)

    @property
    def review_decided(self) -> str:
        return self.stream(REVIEW_DECIDED)

    def idempotency_index(self, worker: str) -> str:
        """Where ``worker`` records the idempotency keys it committed: this hash names the
        current generation; the records are members of ``<index>:r<generation>`` sets."""
        return f"{self.prefix}:idem:{worker}"

    def once(self, key: str) -> str:
        """Guard that makes an output unique (written at most once, ever)."""
        return f"{self.prefix}:once:{key}"

    def join(self, worker: str, correlation_id: str) -> str:
        """Hash of an aggregator's partial results for one correlation id."""
        return f"{self.prefix}:join:{worker}:{correlation_id}"

    def join_deadlines(self, worker: str) -> str:
        """Sorted set: correlation id -> branch deadline (ms), for an aggregator's sweeper."""
        return f"{self.prefix}:join-deadlines:{worker}"

    def submitted(self, idempotency_key: str) -> str:
        """Which run a submit of ``idempotency_key`` started (``<run id>\n<entry id>``)."""
        return f"{self.prefix}:submit:{idempotency_key}"

    def run_start(self, run_id: str) -> str:
        """The id of a run's first entry, when it was submitted through the client:
        reading the run starts there instead of at the beginning of every stream."""
        return f"{self.prefix}:run:{run_id}"

    def budget(self, run_id: str) -> str:
        """Hash of what a run has spent, per unit (and per step with a budget of its
        own), and the raises of its limits (CONTRACT §13)."""
        return f"{self.budget_prefix}{run_id}"

    @property
    def budget_prefix(self) -> str:
        return f"{self.prefix}:budget:"

    def limit(self, key: str) -> str:
        """Where a flow-control limit keeps its state (``<this>:slots``, ``:starts``...)."""
        return f"{self.prefix}:limit:{key}"

    def blob(self, digest: str) -> str:
        return f"{self.prefix}:blob:{digest}"

    def process(self, process_id: str) -> str:
        """Heartbeat key of one running service process (the process registry)."""
        return f"{self.prefix}:process:{process_id}"

    @property
    def pipeline(self) -> str:
        """Where a running service publishes its pipeline's description."""
        return f"{self.prefix}:pipeline"

    @property
    def processes(self) -> str:
        """Sorted set: process id -> its last heartbeat (ms); lists the registry without
        a SCAN of the keyspace."""
        return f"{self.prefix}:processes"

    def run_index(self, status: str = "") -> str:
        """Sorted set of run ids (the run index, :mod:`printery.run_index`): every run by
        its start (ms); with ``status``, the runs of that status by when they got it."""
        return f"{self.prefix}:runs:{status}" if status else f"{self.prefix}:runs"

    @property
    def run_statuses(self) -> str:
        """Set of the run statuses the run index has seen."""
        return f"{self.prefix}:run-statuses"

    def run_info(self, run_id: str) -> str:
        """Hash of one run in the run index: ``started``, ``status``, ``ended``."""
        return f"{self.prefix}:run-info:{run_id}"

    def cost_minute(self, minute: int) -> str:
        """Hash unit -> amount: what the steps reported spending in one minute (unix
        minute); the console's "cost in the last hour" reads 60 of them."""
        return f"{self.prefix}:cost-minute:{minute}"
