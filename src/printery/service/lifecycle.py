"""The lifecycle of one ``printery-workers`` process, written once for the service and for
the parent of ``--processes``.

:meth:`ProcessLifecycle.run` does, in this order:

1. logging, with the Redis password and the application's secrets registered for
   redaction, so no later line can leak them;
2. the server: the configured URL, or the embedded server of the data dir (found or
   started, with a lease held until the end), named in the first log line
   (docs/reference.md, printery-workers);
3. the event loop running :meth:`~ProcessLifecycle.main`, with SIGTERM and SIGINT
   handlers: the first signal asks for a graceful stop (:attr:`~ProcessLifecycle.stopping`
   is set and ``main`` winds down); a second SIGINT exits at once with 130 after
   :meth:`~ProcessLifecycle.interrupted`, the way an impatient operator expects from
   Ctrl-C twice; beside it, the embedded server is watched and restarted if it dies
   (a server that cannot come back makes the process exit 1);
4. :meth:`~ProcessLifecycle.cleanup`, then the server's lease released, whatever happened.

Exit statuses (docs/reference.md, Commands): :data:`EXIT_OK` after a graceful stop,
:data:`EXIT_FAILED` for a failure, :data:`EXIT_CONFIG` for bad configuration,
:data:`EXIT_INTERRUPTED`.
"""

from __future__ import annotations

import asyncio
import os
import signal
import sys
from abc import ABC, abstractmethod

from printery.base._util import log_failure, stop_tasks, wait_event, where
from printery.base.errors import describe
from printery.observe.logging import configure_logging, get_logger
from printery.observe.redact import redact_url
from printery.servers.embedded import EmbeddedServer
from printery.settings.config import Settings

__all__ = [
    "EXIT_CONFIG", "EXIT_FAILED", "EXIT_INTERRUPTED", "EXIT_OK", "ProcessLifecycle",
    "acquire_server",
]

EXIT_OK = 0
EXIT_FAILED = 1
EXIT_CONFIG = 2
EXIT_INTERRUPTED = 130

#: Seconds the tasks still running at exit get to end once cancelled.
EXIT_TASK_TIMEOUT = 5.0
#: Seconds between checks that the embedded server still runs.
SERVER_CHECK_INTERVAL = 1.0

log = get_logger("printery.service")


def acquire_server(settings: Settings) -> tuple[str, str, EmbeddedServer | None]:
    """``(url, url to show, embedded server or None)``: the configured URL, else the data
    dir's embedded server (found or started, with a lease the caller releases), named in
    the first log line (docs/reference.md, printery-workers)."""
    if settings.redis_url:
        shown = redact_url(settings.redis_url)
        log.info(f"using redis server at {shown}", url=shown)
        return settings.redis_url, shown, None
    embedded = EmbeddedServer(settings.data_dir)
    # The embedded module's own "started" line would come first; ours says it all.
    url = embedded.acquire(announce=False)
    how = "started" if embedded.started else "reused"
    log.info(
        f"using embedded server at {url} (data dir {embedded.data_dir}; {how})",
        url=url, data_dir=str(embedded.data_dir), server=how,
    )
    return url, url, embedded


class ProcessLifecycle(ABC):
    """One process from logging to exit status; subclasses write :meth:`main`.

    ``settings`` are already validated: every configuration error has exited 2 before
    this class connects to anything.
    """

    #: What the first signal's log line says is happening: ``shutdown requested: <...>``.
    stop_action = "draining"

    def __init__(self, settings: Settings) -> None:
        self.settings = settings
        self.url: str | None = None
        self.display_url: str | None = settings.redacted_redis_url
        self.stopping = asyncio.Event()
        self._signals = 0
        self._embedded: EmbeddedServer | None = None
        #: Why the embedded server cannot be trusted now (for ``/readyz``), or None.
        self.server_problem: str | None = None
        #: Why the embedded server is gone for good: the process exits 1.
        self.server_lost: str | None = None

    def run(self) -> int:
        """Run until :meth:`main` returns; the process exit status."""
        configure_logging(self.settings.log_level, secrets=self.settings.secrets(os.environ))
        try:
            self.url, self.display_url, self._embedded = acquire_server(self.settings)
        except Exception as exc:
            log.error("cannot start or reach the server", error=str(exc))
            return EXIT_FAILED
        try:
            return asyncio.run(self._main())
        except KeyboardInterrupt:  # Ctrl-C before the loop's own handlers were installed
            return EXIT_INTERRUPTED
        finally:
            self.cleanup()
            self._release_server()

    async def _main(self) -> int:
        loop = asyncio.get_running_loop()
        for sig in (signal.SIGTERM, signal.SIGINT):
            loop.add_signal_handler(sig, self._on_signal, sig)
        watch = asyncio.create_task(self._watch_server())
        watch.add_done_callback(log_failure)
        code = EXIT_FAILED
        try:
            code = await self.main()
        finally:
            if await self._stop_leftovers():
                self._exit_now(EXIT_FAILED if self.server_lost is not None else code)
        return EXIT_FAILED if self.server_lost is not None else code

    async def _stop_leftovers(self) -> bool:
        """End every task still running once :meth:`main` is done (the server watch, and
        any a stop left behind), each named in the log if it will not end; whether some
        would not (a handler that swallows its cancellation)."""
        current = asyncio.current_task()
        leftovers = [task for task in asyncio.all_tasks() if task is not current]
        left = await stop_tasks(leftovers, timeout=EXIT_TASK_TIMEOUT)
        for task in left:
            log.error("task did not stop at exit: left behind", task=task.get_name(), at=where(task))
        return bool(left)

    def _exit_now(self, code: int) -> None:
        """Exit with ``code`` without closing the event loop: closing it cancels every
        task and waits for each to end, and a task that swallows its cancellation never
        does (the process would run on after its stop). What :meth:`run` does after
        the loop is done here first."""
        log.error("exiting without the tasks left behind", exit_code=code)
        try:
            self.cleanup()
        finally:
            self._release_server()
            sys.stdout.flush()
            sys.stderr.flush()
            os._exit(code)

    async def _watch_server(self) -> None:
        """Every :data:`SERVER_CHECK_INTERVAL`, the embedded server is checked and
        restarted if it died (:meth:`EmbeddedServer.check`). A problem it cannot fix is
        kept in :attr:`server_problem` for ``/readyz``; a server that cannot be brought
        back stops the process, which then exits 1 with the reason."""
        embedded = self._embedded
        if embedded is None:
            return
        while not await wait_event(self.stopping, SERVER_CHECK_INTERVAL):
            try:
                problem = await asyncio.to_thread(embedded.check)
            except Exception as exc:
                self.server_lost = describe(exc)
                log.error(f"embedded server lost: exiting 1: {self.server_lost}")
                self.stopping.set()
                return
            if problem is not None and problem != self.server_problem:
                log.error(problem)
            self.server_problem = problem

    def _on_signal(self, sig: signal.Signals) -> None:
        self._signals += 1
        if self._signals > 1 and sig == signal.SIGINT:
            # The operator insists: no drain. Pending entries are redelivered later.
            log.warning("second SIGINT: exiting at once")
            self.interrupted()
            os._exit(EXIT_INTERRUPTED)
        if self._signals == 1:
            log.info(f"shutdown requested: {self.stop_action}", signal=sig.name,
                     timeout_s=self.settings.shutdown_timeout)
        self.stopping.set()

    def _release_server(self) -> None:
        if self._embedded is not None:
            try:
                self._embedded.release()
            except Exception as exc:
                log.warning("could not release the embedded server", error=str(exc))
            self._embedded = None

    @abstractmethod
    async def main(self) -> int:
        """The process's work, until :attr:`stopping` is set or it fails; its exit status."""

    def interrupted(self) -> None:  # noqa: B027 - an optional hook, empty by default
        """Last words before a second SIGINT's immediate exit (sync, quick)."""

    def cleanup(self) -> None:  # noqa: B027 - an optional hook, empty by default
        """After the event loop, before the server is released (sync)."""
