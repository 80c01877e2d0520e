"""The composition root of ``printery-workers``: one :class:`Service` runs one process.

Everything the other modules provide is wired here, in the order the contract needs:

1. logging, with the Redis password and the app's secrets registered for redaction, so
   no later line can leak them; the first line names the server in use (docs/reference.md,
   printery-workers);
2. the server: the given URL, or the embedded server of the data dir (found or started);
   these two, the signals and the exit statuses are the process lifecycle shared with
   the parent of ``--processes`` (:mod:`printery.service.lifecycle`);
3. every consumer group of the pipeline, whichever workers this process runs, *before*
   any worker reads (docs/reference.md, Streams and entries): a process running only
   ``notifier`` must not let ``validator``'s entries published meanwhile go unseen by a
   later process;
4. the selected workers, started by the :class:`WorkerManager` in dependency order;
5. HTTP (``/healthz``, ``/readyz``, ``/status``, ``/metrics``; started before step 3,
   so a service waiting for its server says why), the process registry heartbeat and a
   gauge updater, which only observe, the retention sweep (``transport.retention``),
   which trims only what every group has acknowledged, the sweep of consumers left by
   dead processes (``runtime.departed``), and the review deadlines (``[review.<kind>]
   timeout``), which reject what waited too long; the API ``/v1`` (:mod:`printery.service.api`).

Shutdown is the reverse. SIGTERM/SIGINT start a graceful stop (drain within
``shutdown_timeout``, ack what finished, leave the rest pending for redelivery); a second
SIGINT exits at once with 130, the way an impatient operator expects from Ctrl-C twice.
"""

from __future__ import annotations

import asyncio
import contextlib
import os
import time
from collections.abc import Mapping
from typing import Any

from printery.base import _json
from printery.base._util import hostname, log_failure, now_rfc3339, settle_gc, stop_tasks, where
from printery.base.errors import ConfigError, describe
from printery.observe import telemetry
from printery.observe.logging import get_logger
from printery.observe.metrics import Metrics, MetricsObserver
from printery.observe.redact import redact_url
from printery.pipeline.dag import Pipeline
from printery.runs.cost import enforced_limits
from printery.runs.facade import Runs
from printery.runtime.breaker import breaker_states
from printery.runtime.consumer import ConsumerSettings
from printery.runtime.payloads import PayloadStore
from printery.service.api import service_api
from printery.service.console import service_console
from printery.service.groups import prepare_groups
from printery.service.housekeeping import Housekeeping, remove_consumers
from printery.service.http import HttpServer
from printery.service.lifecycle import (
    EXIT_CONFIG,
    EXIT_FAILED,
    EXIT_INTERRUPTED,
    EXIT_OK,
    ProcessLifecycle,
)
from printery.service.registry import ProcessRegistry
from printery.settings.config import Settings
from printery.store import Outage, Redis, ServerError
from printery.store.budgets import record_budget_limits
from printery.store.layout import describe_pipeline
from printery.store.partitions import resolve_keys
from printery.store.servers import answers
from printery.supervisor.manager import WorkerManager
from printery.transport.connection import connect
from printery.transport.refusal import refused

__all__ = ["EXIT_FAILED", "EXIT_INTERRUPTED", "EXIT_OK", "Service"]

log = get_logger("printery.service")

#: Seconds a readiness/status PING may take before Redis counts as not answering.
PING_TIMEOUT = 2.0
#: Seconds the observers (registry, sweeps) have to stop once cancelled.
OBSERVER_STOP_TIMEOUT = 5.0


class Service(ProcessLifecycle):
    """One ``printery-workers`` process: call :meth:`run` from synchronous code.

    ``pipeline`` is already loaded and validated, ``settings`` already validated: every
    configuration error has exited 2 before this class connects to anything.
    """

    def __init__(self, settings: Settings, pipeline: Pipeline) -> None:
        super().__init__(settings)
        self.pipeline = pipeline
        self.workers = settings.selected_workers(list(pipeline.steps))
        self.keys = settings.keys
        self.prom = Metrics()
        self.started_at = now_rfc3339()
        self.pid = os.getpid()
        self.host = hostname()
        self.process_id = f"{self.host}:{self.pid}:{int(time.time() * 1000):x}"
        #: What this process's consumer names begin with (``consumer_name``).
        self.owner = f"{self.host}:{self.pid}"
        self.client: Redis | None = None
        self.manager: WorkerManager | None = None
        self.http: HttpServer | None = None
        self.runs: Runs | None = None
        self.http_port: int | None = None
        self.registry: ProcessRegistry | None = None
        self._tasks: list[asyncio.Task[None]] = []
        self._redis_ok = False
        #: Why the service is not serving yet while it waits for the server, for /readyz.
        self._waiting_for: str | None = None

    # -- lifecycle -------------------------------------------------------------------------

    async def main(self) -> int:
        assert self.url is not None
        s = self.settings
        self.client = connect(self.url)
        try:
            traced = s.telemetry.otlp_endpoint
            if telemetry.start(traced, os.environ):  # before any worker asks for its tracer
                log.info("tracing on", otlp_endpoint=redact_url(telemetry.endpoint(traced, os.environ) or "",
                                                        keep_user=False))
            await self._start_http()
            await self._prepare_streams(self.client)
            self.manager = self._build_manager(self.client)
            await self.manager.start_all()
            await self._start_observers()
            settle_gc()
            log.info("service started", workers=self.workers, worker_mode=s.worker,
                     supervised=s.supervised, environment=s.environment,
                     http_port=self.http_port, pid=self.pid)
            code = await self._wait()
        except ConfigError as exc:  # refused credentials or ACL: waiting cannot heal it
            log.error(" ".join(str(exc).split()), setting=exc.setting)
            code = EXIT_CONFIG
        except Exception as exc:
            if self.stopping.is_set():  # stopped while still waiting for the server
                code = EXIT_OK
            else:
                log.error("service failed", error=f"{type(exc).__name__}: {exc}")
                code = EXIT_FAILED
        await self._shutdown()
        log.info("service stopped", exit_code=code)
        return code

    async def _prepare_streams(self, client: Redis) -> None:
        """Every group of the pipeline, then its description for ``printery pipeline show``
        and the budget limits it enforces for ``printery cost`` and ``/v1``.

        A server that is not up yet (started after us by systemd or compose) is waited
        for with backoff, not treated as a failure (docs/reference.md, Commands): each
        attempt is logged, ``/readyz`` says what we wait for, and a signal still stops us.
        Credentials or an ACL that the server refuses raise :class:`ConfigError`: no wait
        heals them. The wait is the one outage policy (:mod:`printery.store.outage`), with
        a longer backoff (200 ms doubling to 5 s) and a line per attempt.
        """

        async def prepare() -> None:
            try:
                await self._read_layout(client)
                await prepare_groups(client, self.keys, self.pipeline)
                await describe_pipeline(client, self.keys, _json.dumps(self.pipeline.describe()))
                await record_budget_limits(client, self.keys, enforced_limits(self.pipeline))
            except (ServerError, OSError) as exc:
                refusal = refused(exc, self.display_url, self.settings.stream_prefix)
                if refusal is not None:
                    raise refusal from exc
                raise

        def waiting(exc: BaseException, attempt: int, delay: float) -> None:
            self._waiting_for = (
                f"redis at {self.display_url} is not reachable: {describe(exc)}"
                f" (attempt {attempt})"
            )
            log.warning("server not reachable: retrying", url=self.display_url,
                        attempt=attempt, retry_in_s=round(delay, 2), error=describe(exc))

        outage = Outage("service", self.stopping, base_ms=200, cap_ms=5000, on_attempt=waiting)
        await outage.retrying(prepare)
        self._waiting_for = None

    async def _read_layout(self, client: Redis) -> None:
        """The partition count recorded in the server, recorded now by the first process
        (:mod:`printery.store.partitions`); the HTTP API, started before the server answered, is
        started again over the recorded keys when they are not the ones it was given."""
        keys = await resolve_keys(client, self.settings, event_types=self.pipeline.event_types(),
                                  writer=f"printery-workers {self.process_id}")
        if keys == self.keys:
            return
        log.info("partitions of the recorded layout", partitions=keys.partitions, key=keys.layout)
        self.settings = self.settings.with_partitions(keys.partitions)
        self.keys = keys
        if self.http is not None:
            http, self.http = self.http, None
            await http.stop()
            if self.runs is not None:
                await self.runs.close()
            await self._start_http(port=self.http_port)

    def _build_manager(self, client: Redis) -> WorkerManager:
        s = self.settings
        manager = WorkerManager(
            supervised=s.supervised,
            max_restarts=s.max_restarts,
            backoff_ms=s.backoff_ms,
            health_check_interval=s.health_check_interval,
            drain_timeout=s.shutdown_timeout,
            on_restart=lambda name: self.prom.worker_restarts.labels(name).inc(),
        )
        base = ConsumerSettings(
            max_deliveries=s.transport.max_deliveries,
            visibility_timeout=s.transport.visibility_timeout,
            claim_interval=s.transport.claim_interval,
            abandon_after=s.transport.abandon_after,
        )
        overrides = worker_overrides(
            s, {name: self.pipeline.steps[name].concurrency for name in self.workers}
        )
        payloads = PayloadStore(
            client, self.keys,
            limit=s.transport.payload_limit_bytes,
            inline_limit=s.transport.inline_limit_bytes,
            ttl=s.transport.blob_ttl,
        )
        built = self.pipeline.build_workers(
            client=client, keys=self.keys, settings=base, overrides=overrides,
            observer=MetricsObserver(self.prom), payloads=payloads, only=self.workers,
        )
        for worker, deps in built:
            manager.register(worker, deps)
            self._init_series(worker.name)
        return manager

    def _init_series(self, name: str) -> None:
        """Create each worker's series at zero, so scrapes see them before any traffic."""
        m = self.prom
        m.init_worker(name)
        m.worker_restarts.labels(name)
        m.retries.labels(name)
        m.set_worker(name, up=False, uptime_s=0.0, pending=0)

    async def _start_http(self, port: int | None = None) -> None:
        """Before the server is reached: ``/healthz`` answers and ``/readyz`` says why
        the service is not ready while it waits (``port``: the one it had, when it is
        started again)."""
        bind = self.settings.http_bind
        if bind is not None:
            if port is not None:
                bind = (bind[0], port)
            assert self.client is not None
            api, self.runs = service_api(self.client, self.keys, self.pipeline, self.settings,
                                         os.environ)
            console = service_console(self.runs, self.settings, os.environ)
            self.http = HttpServer(self, api=api, console=console)
            self.http_port = await self.http.start(*bind)
            log.info("http listening", host=bind[0], port=self.http_port)

    async def _start_observers(self) -> None:
        assert self.client is not None
        self.registry = ProcessRegistry(self.client, self.keys, self.process_id)
        self.housekeeping = Housekeeping(self.client, self.keys, self.pipeline, self.settings,
                                         self.prom, self.registry, self.owner)
        observers = [self.registry.run(self._registry_status),
                     *self.housekeeping.sweeps(lambda: self.manager)]
        for observer in observers:
            task = asyncio.create_task(observer, name=getattr(observer, "__qualname__", None))
            task.add_done_callback(log_failure)  # an observer that fails says so at once
            self._tasks.append(task)

    async def _wait(self) -> int:
        """Block until a stop signal, or a worker failure that should end the process."""
        assert self.manager is not None
        s = self.settings
        stop = asyncio.create_task(self.stopping.wait())
        waits: list[asyncio.Task[Any]] = [stop]
        if not s.supervised or s.exit_on_failure:
            waits.append(asyncio.create_task(self.manager.failed.wait()))
        await asyncio.wait(waits, return_when=asyncio.FIRST_COMPLETED)
        for task in waits:
            task.cancel()
        if self.stopping.is_set():
            return EXIT_OK
        failures = self.manager.failures
        log.error(
            "worker failed: exiting 1: " + ", ".join(f.worker for f in failures),
            workers=[f.worker for f in failures], reasons=[f.reason for f in failures],
        )
        return EXIT_FAILED

    async def _shutdown(self) -> None:
        if self.manager is not None:
            await self.manager.stop_all(self.settings.shutdown_timeout)
        # Failures: logged by their done callbacks. A stop never waits on an observer.
        for task in await stop_tasks(self._tasks, timeout=OBSERVER_STOP_TIMEOUT):
            log.error("observer did not stop: left behind", task=task.get_name(), at=where(task))
        if self.registry is not None and self.client is not None:
            await self.registry.remove()
            await remove_consumers(self.client, self.keys, self.pipeline,
                                   lambda who: who == self.owner, min_idle=0)
        if self.http is not None:
            await self.http.stop()
        if self.runs is not None:
            await self.runs.close()
        if telemetry.is_on():
            await asyncio.to_thread(telemetry.shutdown)  # the spans still buffered go out
        if self.client is not None:
            with contextlib.suppress(Exception):
                await self.client.aclose()

    # -- StatusProvider ----------------------------------------------------------------------

    async def _ping(self) -> bool:
        if self.client is None:
            return False
        try:
            async with asyncio.timeout(PING_TIMEOUT):
                self._redis_ok = await answers(self.client)
        except (ServerError, OSError, TimeoutError):
            self._redis_ok = False
        return self._redis_ok

    def _process_doc(self) -> dict[str, Any]:
        s = self.settings
        return {
            "host": self.host, "pid": self.pid, "started_at": self.started_at,
            "worker_mode": s.worker, "supervised": s.supervised, "environment": s.environment,
        }

    def _workers_doc(self) -> dict[str, dict[str, Any]]:
        return self.manager.get_status() if self.manager is not None else {}

    async def status(self) -> dict[str, Any]:
        """The ``/status`` document (docs/reference.md, HTTP); the URL is the redacted
        one."""
        connected = await self._ping()
        return {
            "process": self._process_doc(),
            "redis": {"connected": connected, "url": self.display_url},
            "workers": self._workers_doc(),
            "breakers": await self._breakers_doc() if connected else {},
        }

    async def _breakers_doc(self) -> dict[str, dict[str, Any]]:
        """The circuit breaker of each model the app made with one, as the server holds
        it ({} when the server does not answer)."""
        if self.client is None:
            return {}
        try:
            async with asyncio.timeout(PING_TIMEOUT):
                return await breaker_states(self.client, self.keys)
        except (ServerError, OSError, TimeoutError):
            return {}

    async def readiness(self) -> tuple[bool, list[str]]:
        reasons: list[str] = []
        if not await self._ping():
            reasons.append("redis is not answering")
        if self._waiting_for is not None:
            reasons.append(self._waiting_for)
        if self.server_problem is not None:
            reasons.append(self.server_problem)
        if self.manager is None:
            reasons.append("workers not started")
        else:
            health = await self.manager.health_check()
            reasons.extend(f"worker {name} is not healthy" for name, ok in health.items() if not ok)
        return (not reasons, reasons)

    def metrics(self) -> bytes:
        return self.prom.render()

    async def _registry_status(self) -> dict[str, Any]:
        """What ``printery status`` shows for this process."""
        return {
            **self._process_doc(),
            "process_id": self.process_id,
            "http_port": self.http_port,
            "redis": {"connected": self._redis_ok, "url": self.display_url},
            "workers": self._workers_doc(),
        }


def worker_overrides(settings: Settings, names: Mapping[str, int]) -> dict[str, dict[str, float]]:
    """``[workers.<name>]`` tuning as ``build_workers`` overrides (concurrency, prefetch,
    timeout)."""
    out: dict[str, dict[str, float]] = {}
    for name, default in names.items():
        fields: dict[str, float] = {"concurrency": settings.concurrency(name, default)}
        tuning = settings.workers.get(name)
        if tuning is not None and tuning.prefetch is not None:
            fields["prefetch"] = tuning.prefetch
        if tuning is not None and tuning.timeout is not None:
            fields["timeout"] = tuning.timeout
        out[name] = fields
    return out
