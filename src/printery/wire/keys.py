"""Every Redis key name printery uses, derived from one stream prefix.

With ``[transport] partitions = N`` > 1 (docs/reference.md, Partitions) every key a commit
or a submit touches lives in a partition: ``<prefix>:{p<k>}:<rest>``, k = 0..N-1. The
``{p<k>}`` hash tag puts all of partition k in one cluster slot, so one commit (the source
stream, its output streams, ``dlq``/``review``, idempotency records, join state, budget,
blobs of the run) stays one transaction on one node. A run's partition is
:func:`partition_of` its correlation id. With ``partitions = 1`` the keys are exactly the
unpartitioned ones (docs/reference.md, Streams and entries).

Keys that no commit touches stay unpartitioned: the process registry, the published
pipeline and flow-control limits (limits are shared by every run, so they cannot follow a
run's partition; one admission may touch several limits, so all limits share the
``{limit}`` hash tag: one slot).
"""

from __future__ import annotations

import re
import zlib
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field

from printery.base.errors import PartitionError

DLQ = "dlq"
REVIEW = "review"
REVIEW_DECIDED = "review:decided"
#: The outcome of a run one of whose entries was dead-lettered (reference: failures), written
#: by the runtime in the dead letter's transaction; any step may consume it.
RUN_FAILED = "run:failed"
#: The outcome of a cancelled run (reference: Cancelling a run), written with the run's
#: mark by the cancel itself; a step may consume it (compensation).
RUN_CANCELLED = "run:cancelled"
#: The figures of handler calls whose outputs the commit withheld (an outcome of a run that
#: had ended already): a copy of the call's first output, ``data`` emptied, with
#: ``withheld`` saying why. The call ran and its cost was charged, so the run's cost
#: readers count it (reference: Replay and cost); nothing consumes it.
WITHHELD = "withheld"


#: Record sets per idempotency index: generation g's records are in ``record_sets[g % 3]``
#: (commit.lua's records include rotates through them; the one a rotation makes current
#: expired a record ttl before).
RECORD_RING = 3


def record_set(index_key: str, generation: int) -> str:
    """The set holding generation ``generation``'s idempotency records of an index."""
    return f"{index_key}:r{generation % RECORD_RING}"


def record_sets(index_key: str) -> tuple[str, ...]:
    """The ring of an index's record sets, in generation order (``% RECORD_RING``)."""
    return tuple(record_set(index_key, g) for g in range(RECORD_RING))


def warned_field(field: str) -> str:
    """The field of a run's budget hash that says its ``field``'s soft warning was written."""
    return f"warned:{field}"


def raise_field(field: str) -> str:
    """The field of a run's budget hash holding what approved raises added to the limit
    of ``field`` (docs/reference.md, Budgets)."""
    return f"raise:{field}"


def budget_warning_key(run_id: str, field: str) -> str:
    """The idempotency key of a run's soft-budget warning of ``field`` (one per run and
    field); commit.lua writes it as the two parts of :func:`budget_warning_key_parts`
    around the run id."""
    before, after = budget_warning_key_parts(field)
    return f"{before}{run_id}{after}"


def budget_warning_key_parts(field: str) -> tuple[str, str]:
    return "budget:warning:", f":{field}"


def reservation_value(expires_ms: int, amounts: dict[str, str]) -> str:
    """A reservation in a run's reservations hash (reserve.lua writes it so): ``<expires
    ms> <field> <amount> ...``, a budget field name holding no space."""
    return " ".join([str(expires_ms), *(part for pair in amounts.items() for part in pair)])


def parse_reservation(value: str) -> tuple[float, dict[str, str]]:
    """A reservation's expiry (ms; 0 when unreadable) and its field -> amount pairs."""
    expires, *pairs = value.split() or ["0"]
    try:
        at = float(expires)
    except ValueError:
        at = 0.0
    return at, dict(zip(pairs[::2], pairs[1::2], strict=False))


def item_type(map_name: str) -> str:
    """The event type of a Map's items (reference: fan-out): ``<name>:item``."""
    return f"{map_name}:item"


def result_type(map_name: str) -> str:
    """The event type of a Map's per-item results: ``<name>:result`` (also what a
    failed item's dead letter writes for the Map's collector, under ``skip``)."""
    return f"{map_name}:result"


#: The commands' and the client's stream prefix for an app that declares none
#: (docs/reference.md, Commands); the framework's own :class:`~printery.Settings` default
#: is ``printery``.
COMMAND_STREAM_PREFIX = "materi:events:deployment"
#: Most partitions a keyspace may have (a cluster has 16384 slots).
MAX_PARTITIONS = 1024

_TAG = re.compile(r"^\{p(\d+)\}:")


def partition_of(correlation_id: str, partitions: int) -> int:
    """The partition of a run: CRC-32 (IEEE, as zlib/binascii/Go's hash/crc32 compute it)
    of the UTF-8 correlation id, modulo ``partitions``.

    Stable across processes, languages and versions (documented in the README so a
    producer writing raw ``XADD`` s can compute it); 0 when there is one partition.
    """
    if partitions <= 1:
        return 0
    return zlib.crc32(correlation_id.encode("utf-8")) % partitions


def new_id_in(partition: int, partitions: int, make: Callable[[], str]) -> str:
    """A fresh id (from ``make``) whose partition is ``partition``: for a run that names
    no id of its own but must live in a given partition (the one its entry is in, or its
    submit record's). About ``partitions`` draws on average."""
    while True:
        made = make()
        if partition_of(made, partitions) == partition:
            return made


@dataclass(frozen=True, slots=True)
class StreamKeys:
    """Key layout under a prefix: streams are ``<prefix>:<event type>``
    (docs/reference.md, Streams and entries), or ``<prefix>:{p<k>}:<event type>`` in
    partition k of ``partitions`` (docs/reference.md, Partitions).

    An instance is either the whole keyspace (``partition`` None) or one partition's view
    of it (:meth:`at`). With one partition the two are the same keys. The whole keyspace
    of several partitions answers only unpartitioned keys (registry, pipeline, limits);
    partitioned ones raise :class:`PartitionError` rather than guess a partition.
    """

    prefix: str
    partitions: int = 1
    partition: int | None = None
    #: :attr:`scope`, made once: every key of the hot path starts with it.
    _scope: str | None = field(default=None, init=False, repr=False, compare=False)

    def __post_init__(self) -> None:
        if not 1 <= self.partitions <= MAX_PARTITIONS:
            raise ValueError(f"partitions must be 1..{MAX_PARTITIONS}, not {self.partitions}")
        if self.partition is not None and not 0 <= self.partition < self.partitions:
            raise ValueError(f"partition {self.partition} outside 0..{self.partitions - 1}")
        if self.partitions == 1:
            object.__setattr__(self, "_scope", self.prefix)
        elif self.partition is not None:
            object.__setattr__(self, "_scope", f"{self.prefix}:{{p{self.partition}}}")

    # -- partitions --------------------------------------------------------------------

    @property
    def partitioned(self) -> bool:
        return self.partitions > 1

    def at(self, partition: int) -> StreamKeys:
        """The keys of one partition (with one partition: these keys)."""
        if not self.partitioned:
            return self if self.partition is None else StreamKeys(self.prefix)
        return StreamKeys(self.prefix, self.partitions, partition)

    def of(self, correlation_id: str) -> StreamKeys:
        """The keys of the partition of the run ``correlation_id``."""
        return self.at(partition_of(correlation_id, self.partitions))

    def each(self) -> Iterator[StreamKeys]:
        """Every partition's keys, in partition order (operator commands read them all)."""
        for k in range(self.partitions):
            yield self.at(k)

    @property
    def whole(self) -> StreamKeys:
        """The whole keyspace these (partition) keys belong to."""
        return StreamKeys(self.prefix, self.partitions)

    @property
    def scope(self) -> str:
        """The prefix of this partition's keys (``<prefix>:{p<k>}``; ``<prefix>`` when
        there is one partition)."""
        if self._scope is None:
            raise PartitionError(
                f"keyspace {self.prefix!r} has {self.partitions} partitions: name one "
                "(StreamKeys.at / StreamKeys.of)")
        return self._scope

    def locate(self, stream_key: str) -> tuple[int, str]:
        """``(partition, event type)`` of a stream key of this keyspace (any partition)."""
        rest = stream_key[len(self.prefix) + 1 :]
        if not self.partitioned:
            return 0, rest
        tag = _TAG.match(rest)
        if tag is None or int(tag.group(1)) >= self.partitions:
            raise PartitionError(f"{stream_key!r} is not a stream of a partition of "
                                 f"{self.prefix!r}")
        return int(tag.group(1)), rest[tag.end() :]

    def entry_ref(self, entry_id: str) -> str:
        """How commands name an entry of this partition's streams: ``<id>@p<k>`` (ids of
        two partitions' streams may be equal); the bare id with one partition."""
        return entry_id if not self.partitioned else f"{entry_id}@p{self.partition}"

    def resolve_ref(self, ref: str) -> tuple[list[StreamKeys], str]:
        """The partitions an entry named ``ref`` (:meth:`entry_ref`) may be in, and its
        stream entry id: the named one, or every partition for a bare id."""
        entry_id, at, part = ref.rpartition("@p")
        if at and self.partitioned and part.isdigit() and int(part) < self.partitions:
            return [self.at(int(part))], entry_id
        return list(self.each()), ref

    # -- keys of a partition -----------------------------------------------------------

    def stream(self, event_type: str) -> str:
        return f"{self.scope}:{event_type}"

    def event_type(self, stream_key: str) -> str:
        """Inverse of :meth:`stream` (of any partition's stream)."""
        return self.locate(stream_key)[1]

    @property
    def dlq(self) -> str:
        return self.stream(DLQ)

    @property
    def review(self) -> str:
        return self.stream(REVIEW)

    @property
    def review_decided(self) -> str:
        return self.stream(REVIEW_DECIDED)

    @property
    def withheld(self) -> str:
        return self.stream(WITHHELD)

    @property
    def stopped(self) -> str:
        """Sorted set of the runs that go no further, by when they stopped (ms): cancelled
        ones, and failed ones of a pipeline with ``on_failure="cancel"``. Their entries
        are settled where they are admitted, their running calls cancelled, and their
        commits write nothing but compensation (reference: Cancelling a run)."""
        return f"{self.scope}:stopped"

    @property
    def deadlines(self) -> str:
        """Sorted set of the running runs that have a deadline, by when it passes (ms)."""
        return f"{self.scope}:deadlines"

    def supersede(self, key: str) -> str:
        """The run last submitted with ``supersede=key`` (in the partition of the key)."""
        return f"{self.scope}:supersede:{key}"

    def idempotency_index(self, worker: str) -> str:
        """Where ``worker`` records the idempotency keys it committed: this hash names the
        current generation; the records are members of :func:`record_sets`."""
        return f"{self.scope}:idem:{worker}"

    def last_error(self, worker: str, stream: str, entry_id: str) -> str:
        """The last error of an entry's handler (kept across restarts, so the dead letter
        of an entry delivered once too often says why: reference: failures)."""
        return f"{self.scope}:lasterr:{worker}:{stream}:{entry_id}"

    def suspect(self, worker: str, stream: str, entry_id: str) -> str:
        """Hash of what ``worker``'s group knows of how an entry's deliveries ended
        (reference: failures, a crash blames the crasher): ``suspect`` (its process died
        while it may have run among others: it runs alone next), ``trial`` (the consumer
        running it alone now: should that process die, the death is the entry's) and
        ``handed`` (handed back by a live process: its next claim follows no death). In
        the partition of the entry's stream (one slot with it), kept for the record ttl."""
        return f"{self.scope}:suspect:{worker}:{stream}:{entry_id}"

    def once(self, key: str) -> str:
        """Guard that makes an output unique (written at most once, ever)."""
        return f"{self.scope}:once:{key}"

    def join(self, worker: str, correlation_id: str) -> str:
        """Hash of an aggregator's partial results for one correlation id."""
        return f"{self.scope}:join:{worker}:{correlation_id}"

    def join_deadlines(self, worker: str) -> str:
        """Sorted set: correlation id -> branch deadline (ms), for an aggregator's sweeper."""
        return f"{self.scope}:join-deadlines:{worker}"

    def submitted(self, idempotency_key: str) -> str:
        """Which run a submit of ``idempotency_key`` started (``<run id>\n<entry id>``)."""
        return f"{self.scope}:submit:{idempotency_key}"

    def run_start(self, run_id: str) -> str:
        """The id of a run's first entry, when it was submitted through the client:
        reading the run starts there instead of at the beginning of every stream."""
        return f"{self.scope}:run:{run_id}"

    def partials(self, run_id: str) -> str:
        """A run's partials stream (reference: streaming through the gate): the
        provisional output of its attempts in progress and their verdicts; capped, and
        lapsing an hour after its last write. Not a pipeline stream: never replayed nor
        traced."""
        return f"{self.scope}:partials:{run_id}"

    def budget(self, run_id: str) -> str:
        """Hash of what a run has spent, per unit (and per step with a budget of its
        own), and the raises of its limits (docs/reference.md, Budgets), counted in
        billionths of the unit (see :mod:`printery.rules.budgets`)."""
        return f"{self.budget_prefix}{run_id}"

    @property
    def budget_prefix(self) -> str:
        return f"{self.scope}:spent:"

    def reserved(self, run_id: str) -> str:
        """Hash of what entries of a run that have not committed yet reserved of its
        budget (a step's ``estimate=``), by the entry's reservation key, each with its
        expiry (see ``transport/lua/reserve.lua``)."""
        return f"{self.reserved_prefix}{run_id}"

    @property
    def reserved_prefix(self) -> str:
        return f"{self.scope}:reserved:"

    @property
    def budgets_over(self) -> str:
        """Sorted set of the runs whose spent reached a hard limit of their budget (by
        when their budget hash lapses at the latest): the only runs whose hash the check
        before handlers reads (docs/reference.md, Budgets)."""
        return f"{self.scope}:budgets-over"

    def blob(self, digest: str) -> str:
        return f"{self.scope}:blob:{digest}"

    def run_index(self, status: str = "") -> str:
        """Sorted set of run ids (the run index, :mod:`printery.runtime.run_index`): every run by
        its start (ms); with ``status``, the runs of that status by when they got it."""
        return f"{self.scope}:runs:{status}" if status else f"{self.scope}:runs"

    @property
    def run_statuses(self) -> str:
        """Set of the run statuses the run index has seen."""
        return f"{self.scope}:run-statuses"

    def run_info(self, run_id: str) -> str:
        """Hash of one run in the run index: ``started``, ``status``, ``ended``."""
        return f"{self.scope}:run-info:{run_id}"

    @property
    def known_groups(self) -> str:
        """Hash of the consumer groups this partition's streams have had
        (``<event type>\t<group>`` -> where the group's history begins: ``start``, ``end
        <id>``, ``exists``): whether the pipeline has run here before, so a group created
        later starts at the end of its stream (docs/reference.md, Streams and entries;
        :mod:`printery.transport.groups`)."""
        return f"{self.scope}:groups"

    def cost_minute(self, minute: int) -> str:
        """Hash unit -> amount: what the steps reported spending in one minute (unix
        minute); the console's "cost in the last hour" reads 60 of them."""
        return f"{self.scope}:cost-minute:{minute}"

    # -- keys of the whole keyspace ----------------------------------------------------

    def limit(self, key: str) -> str:
        """Where a flow-control limit keeps its state (``<this>:slots``, ``:held``,
        ``:started``, ``:tokens``).

        One hash tag for every limit: one admission may check several limits in one
        script, whose keys a cluster requires in one slot (so all limits live on one
        master; they are small and touched once per admission batch)."""
        return f"{self.prefix}:{{limit}}:{key}"

    def breaker(self, model: str) -> str:
        """Hash of the circuit breaker of the model ``model`` (docs/reference.md, Flow
        control and model steps; ``transport/lua/breaker.lua``): shared by every process and
        every step calling that model name. One hash tag for all breakers: /status reads
        them together."""
        return f"{self.prefix}:{{breaker}}:{model}"

    def process(self, process_id: str) -> str:
        """Heartbeat key of one running service process (the process registry)."""
        return f"{self.prefix}:process:{process_id}"

    def console_session(self, session_id: str) -> str:
        """An open console session (a string, alive for the session's max age); logging
        out deletes it (:mod:`printery.store.sessions`)."""
        return f"{self.prefix}:console-session:{session_id}"

    @property
    def pipeline(self) -> str:
        """Where a running service publishes its pipeline's description."""
        return f"{self.prefix}:pipeline"

    @property
    def budget_limits(self) -> str:
        """The budget limits the workers enforce, as the last service process to start
        recorded them (JSON; :mod:`printery.store.budgets`): what ``printery cost`` and
        ``/v1`` show a run's spent against, whatever their own import of the app says."""
        return f"{self.prefix}:budget-limits"

    @property
    def layout(self) -> str:
        """The key layout of the prefix (a hash; ``partitions``: the partition count),
        written once by the first worker process (docs/reference.md, Partitions,
        :mod:`printery.store.partitions`)."""
        return f"{self.prefix}:layout"

    @property
    def processes(self) -> str:
        """Sorted set: process id -> its last heartbeat (ms); lists the registry without
        a SCAN of the keyspace."""
        return f"{self.prefix}:processes"
