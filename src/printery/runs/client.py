"""The way into printery from an application (docs/reference.md, Runs): submit work, wait
for its result, follow it live. :class:`Client` for asyncio code, :class:`SyncClient` for
code without an event loop.

A submit is validated against the ingress step's input before anything is written, and
is one round trip: a script checks the idempotency key and appends the complete entry
(every field of an entry) in one step, so the same key gives the same run id however many
processes submit it at once.
"""

from __future__ import annotations

import asyncio
import os
import threading
import time
from collections.abc import AsyncIterator, Coroutine, Iterator
from types import TracebackType
from typing import Any, TypeVar

from printery.base.errors import ConfigError
from printery.pipeline.dag import Pipeline
from printery.runs.apps import load_app
from printery.runs.facade import PRODUCER, Runs
from printery.runs.listing import DEFAULT_LIMIT, RunSummary, list_runs, listing_of
from printery.runs.partials import Partial, Verdict
from printery.runs.reader import RunResult
from printery.servers.embedded import find_running
from printery.store import Redis
from printery.store.partitions import resolve_keys
from printery.transport.connection import connect
from printery.transport.streams import public_api

__all__ = ["Client", "RunResult", "RunSummary", "SyncClient"]

T = TypeVar("T")


class Client:
    """Submits runs to a pipeline and follows them; an async context manager.

    ``redis_url`` None: the ``REDIS_URL`` setting, else the embedded server of the data
    dir (docs/reference.md, printery-workers). ``app``: a :class:`Pipeline` or
    ``MODULE:ATTR`` (default: the ``PRINTERY_APP`` setting, else the deployment pipeline).
    Settings resolve as for the commands: argument > env var > config file
    (``PRINTERY_CONFIG``) > the app's defaults.
    """

    def __init__(
        self,
        redis_url: str | None = None,
        *,
        stream_prefix: str | None = None,
        data_dir: str | None = None,
        app: Pipeline | str | None = None,
        producer: str = PRODUCER,
    ) -> None:
        self.settings, self.pipeline = load_app(
            app, {"redis_url": redis_url, "stream_prefix": stream_prefix, "data_dir": data_dir},
            os.environ,
        )
        self.keys = self.settings.keys
        self.producer = producer
        self._client: Redis | None = None
        self._run_ops: Runs | None = None

    @property
    def redis(self) -> Redis:
        """The connected client (after ``async with`` or :meth:`connect`)."""
        if self._client is None:
            raise RuntimeError("Client is not connected: use `async with Client(...)`")
        return self._client

    async def connect(self) -> Client:
        if self._client is None:
            url = self.settings.redis_url or find_running(self.settings.data_dir)
            if url is None:
                raise ConfigError(
                    "redis_url", None,
                    f"a Redis URL, or a running embedded server for data dir "
                    f"{self.settings.data_dir} (start `printery-workers`)")
            self._client = connect(url, max_connections=64)
            try:  # the recorded partition count (docs/reference.md, Partitions)
                self.keys = await public_api(resolve_keys)(self._client, self.settings)
            except BaseException:
                client, self._client = self._client, None
                await client.aclose()
                raise
            self._run_ops = Runs(self._client, self.keys, self.pipeline, producer=self.producer,
                                 replicated=self.settings.transport.submit_wait,
                                 payload_limit=self.settings.transport.payload_limit_bytes)
        return self

    async def aclose(self) -> None:
        client, self._client = self._client, None
        runs, self._run_ops = self._run_ops, None
        if runs is not None:
            await runs.close()
        if client is not None:
            await client.aclose()

    async def __aenter__(self) -> Client:
        return await self.connect()

    async def __aexit__(
        self, exc_type: type[BaseException] | None, exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        await self.aclose()

    @public_api
    async def submit(
        self, data: Any, *, event_type: str | None = None, run_id: str | None = None,
        idempotency_key: str | None = None, traceparent: str | None = None,
        deadline: float | None = None, supersede: str | None = None,
    ) -> str:
        """Publish one ingress entry and return its run id. The same ``idempotency_key``
        (default ``<event type>:<run id>``) gives the same run id and one run. Raises
        :class:`InvalidInput` (nothing written) when the ingress step refuses ``data``.
        ``traceparent``: the producer's W3C trace context; the run's spans join its
        trace (docs/reference.md, Tracing). ``deadline``: seconds after which the run is
        cancelled if still running; ``supersede``: cancel the running run submitted last
        with this key first (docs/reference.md, Cancelling a run)."""
        run, _ = await (await self._runs()).submit(
            data, event_type=event_type, run_id=run_id, idempotency_key=idempotency_key,
            traceparent=traceparent, deadline=deadline, supersede=supersede)
        return run

    @public_api
    async def cancel(self, run_id: str, *, reason: str = "", by: str | None = None) -> bool:
        """Cancel a run: True when this call ended it, False when it had ended already
        (nothing changes). Raises :class:`UnknownRun` for a run with no entry and none
        submitted. Of any number of concurrent cancels of one run, exactly one returns
        True (docs/reference.md, Cancelling a run)."""
        return (await (await self._runs()).cancel(run_id, reason=reason, by=by)).cancelled

    @public_api
    async def result(self, run_id: str, *, timeout: float | None = None) -> RunResult:
        """The run once it has ended (its outcome entry written), from any process, also
        after the fact. Raises :class:`TimeoutError` at ``timeout`` seconds."""
        return await (await self._runs()).reader.result(run_id, timeout=timeout)

    async def watch(
        self, run_id: str, *, timeout: float | None = None
    ) -> AsyncIterator[dict[str, Any] | Partial | Verdict]:
        """The run's entries as ``trace`` shows them, in order, from the first, live,
        ending after the outcome entry; between them, what its steps show while they
        work (:class:`~printery.Partial`) and the verdicts that commit or retract it
        (:class:`~printery.Verdict`; reference: streaming through the gate)."""
        runs = await self._runs()
        deadline = None if timeout is None else time.monotonic() + timeout
        async for item in runs.reader.watch(run_id, deadline=deadline):
            yield item

    @public_api
    async def entries(self, run_id: str) -> list[dict[str, Any]]:
        """Every entry of the run so far (after its outcome too). Raises
        :class:`UnknownRun` when there is none."""
        return await (await self._runs()).entries(run_id)

    @public_api
    async def runs(
        self, status: str | None = None, since: float | str | None = None,
        limit: int = DEFAULT_LIMIT, *, after: str | None = None,
    ) -> list[RunSummary]:
        """A page of runs, newest first, as ``GET /v1/runs`` lists them: of ``status``
        only, started (or, with a status, given it) in the last ``since`` (seconds, or
        a duration such as ``"10m"``), at most ``limit`` (1 to 1000), after the run whose
        :attr:`~RunSummary.cursor` is ``after`` (the next page). Raises
        :class:`InvalidInput` for an argument out of its range."""
        listing = listing_of(status, since, limit, after)
        page, _ = await list_runs((await self._runs()).reader, listing)
        return page

    async def _runs(self) -> Runs:
        await self.connect()
        assert self._run_ops is not None
        return self._run_ops


class SyncClient:
    """:class:`Client` for code without an event loop: the same methods, blocking. It
    runs a private event loop in a thread of its own; use it as a context manager or
    call :meth:`close`."""

    def __init__(
        self,
        redis_url: str | None = None,
        *,
        stream_prefix: str | None = None,
        data_dir: str | None = None,
        app: Pipeline | str | None = None,
    ) -> None:
        self._client = Client(redis_url, stream_prefix=stream_prefix, data_dir=data_dir, app=app)
        self.pipeline = self._client.pipeline
        self._loop = asyncio.new_event_loop()
        self._thread = threading.Thread(target=self._loop.run_forever, name="printery-client",
                                        daemon=True)
        self._thread.start()

    def _call(self, coro: Coroutine[Any, Any, T]) -> T:
        return asyncio.run_coroutine_threadsafe(coro, self._loop).result()

    def submit(
        self, data: Any, *, event_type: str | None = None, run_id: str | None = None,
        idempotency_key: str | None = None, traceparent: str | None = None,
        deadline: float | None = None, supersede: str | None = None,
    ) -> str:
        return self._call(self._client.submit(data, event_type=event_type, run_id=run_id,
                                              idempotency_key=idempotency_key,
                                              traceparent=traceparent, deadline=deadline,
                                              supersede=supersede))

    def cancel(self, run_id: str, *, reason: str = "", by: str | None = None) -> bool:
        return self._call(self._client.cancel(run_id, reason=reason, by=by))

    def result(self, run_id: str, *, timeout: float | None = None) -> RunResult:
        return self._call(self._client.result(run_id, timeout=timeout))

    def entries(self, run_id: str) -> list[dict[str, Any]]:
        return self._call(self._client.entries(run_id))

    def runs(
        self, status: str | None = None, since: float | str | None = None,
        limit: int = DEFAULT_LIMIT, *, after: str | None = None,
    ) -> list[RunSummary]:
        return self._call(self._client.runs(status, since, limit, after=after))

    def watch(self, run_id: str, *, timeout: float | None = None) -> Iterator[
        dict[str, Any] | Partial | Verdict
    ]:
        """The run's entries as they are written, and its partials and verdicts (see
        :meth:`Client.watch`)."""
        iterator = self._client.watch(run_id, timeout=timeout).__aiter__()
        while True:
            try:
                yield self._call(_next(iterator))
            except StopAsyncIteration:
                return

    def close(self) -> None:
        if self._loop.is_closed():
            return
        self._call(self._client.aclose())
        self._loop.call_soon_threadsafe(self._loop.stop)
        self._thread.join(timeout=10)
        self._loop.close()

    def __enter__(self) -> SyncClient:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()


async def _next(iterator: AsyncIterator[T]) -> T:
    return await iterator.__anext__()
