"""``printery-workers --processes N``: one parent supervising N service processes.

Why processes: a CPU-bound stage is limited by one interpreter's GIL; N OS processes of
the same service (same pipeline, same consumer groups, distinct consumer names) share
the work through Redis consumer groups with no coordination of their own.

Design, kept deliberately simple:

* Each child is ``python -m printery.cli.workers <the parent's own arguments>`` with
  ``--processes 1`` and ``--http-addr 127.0.0.1:<free port>`` appended (a later flag
  wins), so children validate and behave exactly like a single-process service.
* With no Redis URL the parent acquires the embedded server of the data dir first and
  holds it until every child has exited; children find it and take their own leases, so
  a crashing child never takes the server down with it.
* Each child is a :class:`~printery.supervisor.child.ChildProcess` worker of a
  :class:`~printery.WorkerManager`, the one supervisor of the project: a child that
  exits while the parent is not stopping is restarted after
  :func:`printery.compute_backoff` (``--backoff`` doubling per consecutive crash, without
  end; the count resets once a child has run for :data:`STABLE_AFTER` seconds). A child
  exiting 2 (bad configuration) cannot be fixed by restarting: the parent stops and
  exits 2.
* Logging, the server, signals and exit statuses are the service's own lifecycle
  (:class:`~printery.service.lifecycle.ProcessLifecycle`). SIGTERM/SIGINT: SIGTERM to every
  child, wait ``shutdown_timeout`` plus a margin, then SIGKILL stragglers; exit 0. A
  second SIGINT kills the children and exits 130.
* HTTP: the parent serves ``/status``, ``/readyz`` and ``/metrics`` on ``--http-addr``
  by asking each child's private endpoint. ``/status`` is the document of
  docs/reference.md, HTTP with the workers merged over the children (counters summed,
  ``pending`` the group's maximum, ``state`` the worst) plus ``processes``: one entry per
  child. ``/metrics`` is every child's exposition merged by a prometheus-client collector
  (counters and histograms summed, gauges by their meaning), plus
  ``printery_process_restarts_total``.
"""

from __future__ import annotations

import asyncio
import os
import signal
import sys
from collections.abc import Callable, Iterable, Iterator
from typing import Any

import httpx
from prometheus_client import CollectorRegistry, Counter, generate_latest
from prometheus_client.core import Metric
from prometheus_client.parser import text_string_to_metric_families
from prometheus_client.registry import Collector

from printery.base._util import hostname, idle, log_failure, now_rfc3339
from printery.base.errors import ConfigError
from printery.observe.logging import get_logger
from printery.pipeline.dag import Pipeline
from printery.runs.facade import Runs
from printery.servers.process import free_port
from printery.service.api import service_api
from printery.service.console import service_console
from printery.service.http import HttpServer
from printery.service.lifecycle import EXIT_CONFIG, EXIT_OK, ProcessLifecycle
from printery.settings.config import Settings
from printery.store import ServerError
from printery.store.partitions import resolve_keys
from printery.supervisor.child import ChildProcess
from printery.supervisor.manager import WorkerManager
from printery.transport.connection import connect
from printery.wire.keys import StreamKeys

__all__ = ["Parent", "merge_workers"]

log = get_logger("printery.processes")

#: Seconds a child must run before its crash count starts again from zero.
STABLE_AFTER = 30.0
#: Seconds between metric scrapes.
SCRAPE_INTERVAL = 1.0
#: Seconds given to children beyond the shutdown timeout before SIGKILL.
KILL_MARGIN = 10.0

# Worst first: the merged state of one worker over the children.
_STATE_RANK = ["failed", "unhealthy", "restarting", "starting", "stopping", "stopped", "running"]


class _Child(ChildProcess):
    """One child service: its index, its private HTTP port, its last scraped metrics."""

    def __init__(self, index: int, port: int, argv: list[str]) -> None:
        command = [sys.executable, "-m", "printery.cli.workers", *argv,
                   "--processes", "1", "--http-addr", f"127.0.0.1:{port}"]
        env = {**os.environ, "PRINTERY_PROCESSES": "1", "PRINTERY_CHILD_INDEX": str(index)}
        super().__init__(f"process-{index}", command, env=env, fatal_exits={EXIT_CONFIG})
        self.index = index
        self.port = port
        self.metrics_text = ""

    @property
    def base(self) -> str:
        return f"http://127.0.0.1:{self.port}"


def merge_workers(docs: Iterable[dict[str, dict[str, Any]]]) -> dict[str, dict[str, Any]]:
    """Merge per-child ``workers`` documents of ``/status`` into one per worker name."""
    merged: dict[str, dict[str, Any]] = {}
    for doc in docs:
        for name, st in doc.items():
            cur = merged.get(name)
            if cur is None:
                merged[name] = dict(st)
                continue
            ranks = [_STATE_RANK.index(s) if s in _STATE_RANK else 0
                     for s in (cur["state"], st["state"])]
            cur["state"] = _STATE_RANK[min(ranks)]
            cur["healthy"] = bool(cur["healthy"]) and bool(st["healthy"])
            cur["uptime_s"] = min(float(cur["uptime_s"]), float(st["uptime_s"]))
            for key in ("restarts", "errors", "processed", "consumers"):
                cur[key] = int(cur[key]) + int(st[key])
            cur["pending"] = max(int(cur["pending"]), int(st["pending"]))  # one group's PEL
            cur["last_error"] = cur["last_error"] or st["last_error"]
    return merged


def _combine(name: str, sample: str, old: float, new: float) -> float:
    """How two children's values of one series combine."""
    lowest = ("_up", "_uptime_seconds", "_start_time_seconds")
    if sample.endswith("_created") or name.endswith(lowest):
        return min(old, new)
    if name.endswith("_pending"):
        return max(old, new)
    return old + new


class _MergedChildren(Collector):
    """Re-exposes the children's scraped metrics as one set (parsed, then re-rendered by
    prometheus-client, never text pasted together)."""

    def __init__(self, texts: Callable[[], Iterable[str]]) -> None:
        self.texts = texts

    def collect(self) -> Iterator[Metric]:
        families: dict[str, Metric] = {}
        values: dict[str, dict[tuple[str, tuple[tuple[str, str], ...]], float]] = {}
        for text in self.texts():
            if not text:
                continue
            for fam in text_string_to_metric_families(text):
                if fam.name not in families:
                    families[fam.name] = Metric(fam.name, fam.documentation, fam.type)
                    values[fam.name] = {}
                series = values[fam.name]
                for s in fam.samples:
                    key = (s.name, tuple(sorted(s.labels.items())))
                    old = series.get(key)
                    series[key] = s.value if old is None else _combine(
                        fam.name, s.name, old, s.value
                    )
        for name, metric in families.items():
            for (sample, labels), value in values[name].items():
                metric.add_sample(sample, dict(labels), value)
            yield metric


class Parent(ProcessLifecycle):
    """Runs and supervises the child processes; see the module docstring."""

    stop_action = "stopping children"

    def __init__(self, settings: Settings, pipeline: Pipeline, argv: list[str]) -> None:
        super().__init__(settings)
        self.pipeline = pipeline
        self.children = [_Child(i, free_port(), list(argv)) for i in range(settings.processes)]
        self.registry = CollectorRegistry(auto_describe=False)
        self.registry.register(_MergedChildren(lambda: [c.metrics_text for c in self.children]))
        self.process_restarts = Counter(
            "printery_process_restarts_total", "Child processes restarted by the parent.",
            registry=self.registry,
        )
        self.manager = WorkerManager(
            supervised=True, max_restarts=None, backoff_ms=settings.backoff_ms,
            stable_after=STABLE_AFTER, health_check_interval=settings.health_check_interval,
            drain_timeout=settings.shutdown_timeout + KILL_MARGIN,
            on_restart=lambda _name: self.process_restarts.inc(),
        )
        for child in self.children:
            self.manager.register(child)
        self.started_at = now_rfc3339()
        self._http_client: httpx.AsyncClient | None = None

    # -- lifecycle -------------------------------------------------------------------------

    async def main(self) -> int:
        self._http_client = httpx.AsyncClient(timeout=2.0)
        await self.manager.start_all()
        http: HttpServer | None = None
        runs: Runs | None = None
        client = connect(self.url) if self.url is not None else None
        bind = self.settings.http_bind
        if bind is not None:
            api, console = None, None
            if client is not None:  # the API and console are served here, over a client of its own
                api, runs = service_api(client, await self._keys(client),
                                        self.pipeline, self.settings, os.environ)
                console = service_console(runs, self.settings, os.environ)
            http = HttpServer(self, api=api, console=console)
            port = await http.start(*bind)
            log.info("http listening", host=bind[0], port=port, processes=len(self.children))
        scraper = asyncio.create_task(self._scrape_loop())
        scraper.add_done_callback(log_failure)
        waits = [asyncio.create_task(self.stopping.wait()),
                 asyncio.create_task(self.manager.failed.wait())]
        await asyncio.wait(waits, return_when=asyncio.FIRST_COMPLETED)
        code = EXIT_OK
        if not self.stopping.is_set():  # only a fatal exit fails a child for good
            log.error("child exited with a configuration error: stopping",
                      children=[f.worker for f in self.manager.failures])
            code = EXIT_CONFIG
        for task in [scraper, *waits]:
            task.cancel()
        await asyncio.gather(scraper, *waits, return_exceptions=True)  # failures: logged
        await self.manager.stop_all(self.settings.shutdown_timeout + KILL_MARGIN)
        if http is not None:
            await http.stop()
        if runs is not None:
            await runs.close()
        if client is not None:
            await client.aclose()
        await self._http_client.aclose()
        log.info("all processes stopped", exit_code=code)
        return code

    async def _keys(self, client: Any) -> StreamKeys:
        """The keys of the layout recorded in the server (the children record it); the
        settings' when the server does not answer yet (logged)."""
        try:
            return await resolve_keys(client, self.settings)
        except (ServerError, OSError, ConfigError) as exc:  # a ConfigError stops the children
            log.warning("the recorded layout could not be read: the HTTP API uses the "
                        "partitions setting", error=str(exc))
            return self.settings.keys

    def interrupted(self) -> None:
        log.warning("second SIGINT: killing children")
        for child in self.children:
            child.send_signal(signal.SIGKILL)

    def cleanup(self) -> None:
        for child in self.children:
            child.kill()

    async def _scrape_loop(self) -> None:
        while True:
            for child in self.children:
                if not child.alive:
                    child.metrics_text = ""  # a dead child's series go with it
            await asyncio.gather(*(self._scrape(c) for c in self.children if c.alive))
            await idle(SCRAPE_INTERVAL)

    async def _scrape(self, child: _Child) -> None:
        assert self._http_client is not None
        try:
            resp = await self._http_client.get(child.base + "/metrics")
            if resp.status_code == 200:
                child.metrics_text = resp.text
        except httpx.HTTPError:
            pass

    async def _get(self, child: _Child, path: str) -> tuple[int, dict[str, Any]]:
        assert self._http_client is not None
        try:
            resp = await self._http_client.get(child.base + path)
            body = resp.json()
            return resp.status_code, body if isinstance(body, dict) else {}
        except (httpx.HTTPError, ValueError):
            return 0, {}

    # -- StatusProvider ----------------------------------------------------------------------

    async def status(self) -> dict[str, Any]:
        answers = await asyncio.gather(*(self._get(c, "/status") for c in self.children))
        docs = [body for code, body in answers if code == 200]
        connected = bool(docs) and all(d.get("redis", {}).get("connected") for d in docs)
        supervised = self.manager.get_status()
        s = self.settings
        return {
            "process": {
                "host": hostname(), "pid": os.getpid(), "started_at": self.started_at,
                "worker_mode": s.worker, "supervised": s.supervised,
                "environment": s.environment,
            },
            "redis": {"connected": connected, "url": self.display_url},
            "workers": merge_workers(d.get("workers", {}) for d in docs),
            "processes": [
                {
                    "index": c.index, "pid": c.pid, "alive": c.alive,
                    "restarts": supervised[c.name]["restarts"], "port": c.port,
                    "workers": body.get("workers", {}) if code == 200 else {},
                }
                for c, (code, body) in zip(self.children, answers, strict=True)
            ],
        }

    async def readiness(self) -> tuple[bool, list[str]]:
        answers = await asyncio.gather(*(self._get(c, "/readyz") for c in self.children))
        reasons = [self.server_problem] if self.server_problem is not None else []
        for child, (code, body) in zip(self.children, answers, strict=True):
            if code == 0:
                reasons.append(f"process {child.index} is not answering")
            elif code != 200:
                reasons.extend(f"process {child.index}: {r}" for r in body.get("reasons", []))
        return (not reasons, reasons)

    def metrics(self) -> bytes:
        return generate_latest(self.registry)
