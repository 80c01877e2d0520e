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
* A child that exits while the parent is not stopping is restarted after
  :func:`printery.compute_backoff` (``--backoff`` doubling per consecutive crash; the
  count resets once a child has run for :data:`STABLE_AFTER` seconds). A child exiting 2
  (bad configuration) cannot be fixed by restarting: the parent stops and exits 2.
* SIGTERM/SIGINT: SIGTERM to every child, wait ``shutdown_timeout`` plus a margin, then
  SIGKILL stragglers; exit 0. A second SIGINT kills the children and exits 130.
* HTTP: the parent serves ``/status``, ``/readyz`` and ``/metrics`` on ``--http-addr``
  by asking each child's private endpoint. ``/status`` is the §8 document with the
  workers merged over the children (counters summed, ``pending`` the group's maximum,
  ``state`` the worst) plus ``processes``: one entry per child. ``/metrics`` is every
  child's exposition merged by a prometheus-client collector (counters and histograms
  summed, gauges by their meaning), plus ``printery_process_restarts_total``.
"""

from __future__ import annotations

import asyncio
import contextlib
import os
import signal
import subprocess
import sys
import time
from collections.abc import Iterable, Iterator
from dataclasses import dataclass, field
from typing import Any

import httpx
from prometheus_client import CollectorRegistry, Counter, generate_latest
from prometheus_client.core import Metric
from prometheus_client.parser import text_string_to_metric_families
from prometheus_client.registry import Collector

from printery._util import hostname, now_rfc3339
from printery.backoff import compute_backoff
from printery.config import Settings
from printery.http import HttpServer
from printery.logging import configure_logging, get_logger
from printery.pipeline.dag import Pipeline
from printery.service import acquire_server
from printery.transport.embedded import EmbeddedServer
from printery.transport.server import free_port

__all__ = ["Parent", "merge_workers"]

log = get_logger("printery.processes")

EXIT_CONFIG = 2
EXIT_INTERRUPTED = 130
#: Seconds a child must run before its crash count starts again from zero.
STABLE_AFTER = 30.0
#: Seconds between child exit checks and metric scrapes.
POLL_INTERVAL = 0.2
SCRAPE_INTERVAL = 1.0
#: Seconds given to children beyond the shutdown timeout before SIGKILL.
KILL_MARGIN = 10.0

# Worst first: the merged state of one worker over the children.
_STATE_RANK = ["failed", "unhealthy", "restarting", "starting", "stopping", "stopped", "running"]


@dataclass
class _Child:
    index: int
    port: int
    proc: subprocess.Popen[bytes] | None = None
    started: float = 0.0
    crashes: int = 0
    restarts: int = 0
    next_start: float = 0.0
    metrics_text: str = ""
    last_status: dict[str, Any] = field(default_factory=dict)

    @property
    def alive(self) -> bool:
        return self.proc is not None and self.proc.poll() is None

    @property
    def base(self) -> str:
        return f"http://127.0.0.1:{self.port}"


def merge_workers(docs: Iterable[dict[str, dict[str, Any]]]) -> dict[str, dict[str, Any]]:
    """Merge per-child ``workers`` documents of §8 into one per worker name."""
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

    def __init__(self, children: list[_Child]) -> None:
        self.children = children

    def collect(self) -> Iterator[Metric]:
        families: dict[str, Metric] = {}
        values: dict[str, dict[tuple[str, tuple[tuple[str, str], ...]], float]] = {}
        for child in self.children:
            if not child.metrics_text:
                continue
            for fam in text_string_to_metric_families(child.metrics_text):
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


class Parent:
    """Runs and supervises the child processes; see the module docstring."""

    def __init__(self, settings: Settings, pipeline: Pipeline, argv: list[str]) -> None:
        self.settings = settings
        self.pipeline = pipeline
        self.argv = list(argv)
        self.children = [_Child(i, free_port()) for i in range(settings.processes)]
        self.registry = CollectorRegistry(auto_describe=False)
        self.registry.register(_MergedChildren(self.children))
        self.process_restarts = Counter(
            "printery_process_restarts_total", "Child processes restarted by the parent.",
            registry=self.registry,
        )
        self.started_at = now_rfc3339()
        self.display_url = settings.redacted_redis_url
        self._embedded: EmbeddedServer | None = None
        self._stop = asyncio.Event()
        self._signals = 0
        self._code = 0
        self._http_client: httpx.AsyncClient | None = None

    # -- entry point -----------------------------------------------------------------------

    def run(self) -> int:
        configure_logging(self.settings.log_level, secrets=self.settings.secrets(os.environ))
        try:
            _, self.display_url, self._embedded = acquire_server(self.settings)
        except Exception as exc:
            log.error("cannot start or reach the server", error=str(exc))
            return 1
        try:
            return asyncio.run(self._main())
        except KeyboardInterrupt:  # Ctrl-C before the loop's own handlers were installed
            return EXIT_INTERRUPTED
        finally:
            self._kill_all()
            if self._embedded is not None:
                with contextlib.suppress(Exception):
                    self._embedded.release()

    # -- children --------------------------------------------------------------------------

    def _spawn(self, child: _Child) -> None:
        cmd = [
            sys.executable, "-m", "printery.cli.workers", *self.argv,
            "--processes", "1", "--http-addr", f"127.0.0.1:{child.port}",
        ]
        env = {**os.environ, "PRINTERY_PROCESSES": "1", "PRINTERY_CHILD_INDEX": str(child.index)}
        child.proc = subprocess.Popen(cmd, env=env)
        child.started = time.monotonic()
        log.info("child started", index=child.index, pid=child.proc.pid, port=child.port)

    def _check_children(self) -> None:
        now = time.monotonic()
        for child in self.children:
            if child.proc is None:
                if now >= child.next_start:
                    self._spawn(child)
                    child.restarts += 1
                    self.process_restarts.inc()
                continue
            code = child.proc.poll()
            if code is None:
                continue
            if code == EXIT_CONFIG:
                log.error("child exited with a configuration error: stopping", index=child.index)
                self._code = EXIT_CONFIG
                self._stop.set()
                return
            if now - child.started >= STABLE_AFTER:
                child.crashes = 0
            child.crashes += 1
            delay = compute_backoff(child.crashes, base_ms=self.settings.backoff_ms)
            log.warning("child exited: restarting", index=child.index, pid=child.proc.pid,
                        exit_code=code, attempt=child.crashes, delay_s=round(delay, 3))
            child.proc = None
            child.metrics_text = ""
            child.next_start = now + delay

    def _signal_children(self, sig: signal.Signals) -> None:
        for child in self.children:
            if child.alive and child.proc is not None:
                with contextlib.suppress(ProcessLookupError):
                    child.proc.send_signal(sig)

    def _kill_all(self) -> None:
        self._signal_children(signal.SIGKILL)
        for child in self.children:
            if child.proc is not None:
                with contextlib.suppress(Exception):
                    child.proc.wait(timeout=5)

    async def _stop_children(self) -> None:
        self._signal_children(signal.SIGTERM)
        deadline = time.monotonic() + self.settings.shutdown_timeout + KILL_MARGIN
        # Child exits are polled: there is no event to await for a subprocess.Popen.
        while any(c.alive for c in self.children) and time.monotonic() < deadline:  # noqa: ASYNC110
            await asyncio.sleep(0.05)
        if any(c.alive for c in self.children):
            log.warning("children did not stop in time: killing")
            self._kill_all()
        for child in self.children:
            if child.proc is not None and child.proc.returncode not in (0, None):
                log.warning("child exit status", index=child.index, exit_code=child.proc.returncode)

    # -- lifecycle -------------------------------------------------------------------------

    def _on_signal(self, sig: signal.Signals) -> None:
        self._signals += 1
        if self._signals > 1 and sig == signal.SIGINT:
            log.warning("second SIGINT: killing children and exiting")
            self._kill_all()
            os._exit(EXIT_INTERRUPTED)
        log.info("shutdown requested: stopping children", signal=sig.name)
        self._stop.set()

    async def _main(self) -> int:
        loop = asyncio.get_running_loop()
        for sig in (signal.SIGTERM, signal.SIGINT):
            loop.add_signal_handler(sig, self._on_signal, sig)
        self._http_client = httpx.AsyncClient(timeout=2.0)
        for child in self.children:
            self._spawn(child)
        http: HttpServer | None = None
        bind = self.settings.http_bind
        if bind is not None:
            http = HttpServer(self)
            port = await http.start(*bind)
            log.info("http listening", host=bind[0], port=port, processes=len(self.children))
        scraper = asyncio.create_task(self._scrape_loop())
        while not self._stop.is_set():
            self._check_children()
            with contextlib.suppress(TimeoutError):
                await asyncio.wait_for(self._stop.wait(), POLL_INTERVAL)
        scraper.cancel()
        with contextlib.suppress(BaseException):
            await scraper
        await self._stop_children()
        if http is not None:
            await http.stop()
        await self._http_client.aclose()
        log.info("all processes stopped", exit_code=self._code)
        return self._code

    async def _scrape_loop(self) -> None:
        while True:
            await asyncio.gather(*(self._scrape(c) for c in self.children if c.alive))
            await asyncio.sleep(SCRAPE_INTERVAL)

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
                    "index": c.index, "pid": c.proc.pid if c.proc else None, "alive": c.alive,
                    "restarts": c.restarts, "port": c.port,
                    "workers": body.get("workers", {}) if code == 200 else {},
                }
                for c, (code, body) in zip(self.children, answers, strict=True)
            ],
        }

    async def readiness(self) -> tuple[bool, list[str]]:
        answers = await asyncio.gather(*(self._get(c, "/readyz") for c in self.children))
        reasons: list[str] = []
        for child, (code, body) in zip(self.children, answers, strict=True):
            if code == 0:
                reasons.append(f"process {child.index} is not answering")
            elif code != 200:
                reasons.extend(f"process {child.index}: {r}" for r in body.get("reasons", []))
        return (not reasons, reasons)

    def metrics(self) -> bytes:
        return generate_latest(self.registry)
