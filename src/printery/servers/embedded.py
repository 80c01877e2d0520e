"""The embedded default (docs/reference.md, printery-workers): one shared server per data
dir, no system install.

With no Redis URL, every ``printery-workers`` of a data dir shares one server started
from the packaged binary, with its append-only file under ``<data_dir>/data``. The
server outlives the process that started it (it runs in its own session), so stopping
one of several services never pulls the server from under the others. It stops when
the last service of the data dir lets go.

Layout of the data dir::

    server.lock         flock'ed around find-or-start and release (one at a time)
    server.json         pid, host, port, binary and run id of the running server
    leases/*.lease      one per holder, flock'ed (shared) for as long as it holds
    data/               the server's working dir: AOF, server.log

Why leases are files with locks rather than a counter: a counter is wrong after a
``kill -9``; a lock dies with its process, so a crashed holder never keeps the server
alive, and a stale state file (the server died) is recognised and replaced.
"""

from __future__ import annotations

import contextlib
import fcntl
import logging
import os
import secrets
import signal
import threading
import time
from collections.abc import Iterator
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any

import psutil

from printery.base import _json
from printery.base._util import now_rfc3339
from printery.base.errors import ServerStartError
from printery.servers.process import ServerProcess, server_info

log = logging.getLogger(__name__)

#: Where the embedded server keeps its state when no ``--data-dir`` is given.
DEFAULT_DATA_DIR = Path(".printery")

STATE_FILE = "server.json"
LOCK_FILE = "server.lock"
LEASES_DIR = "leases"
DATA_SUBDIR = "data"

#: Attempts at starting on a fresh port: another program may take a free port between
#: our probe and the server's bind.
_START_ATTEMPTS = 3


@dataclass(frozen=True, slots=True)
class ServerState:
    """What ``server.json`` records about the running server.

    ``run_id`` is the server's own random id (``INFO server``): a server that answers on
    the port with this run id is certainly ours, whatever became of the pid.
    """

    pid: int
    host: str
    port: int
    binary: str
    run_id: str
    started_at: str

    @property
    def url(self) -> str:
        return f"redis://{self.host}:{self.port}/0"


class EmbeddedServer:
    """This process's hold on the shared server of one data dir.

    :meth:`acquire` finds or starts the server and takes a lease; :meth:`release` gives
    the lease back and stops the server when no other live lease remains. Both are
    synchronous: they run once, at startup and shutdown, before and after the event loop
    matters. Each instance holds its own lease, so two holders in one process count as
    two. Not thread-safe: one instance belongs to one thread of control.
    """

    def __init__(
        self,
        data_dir: str | os.PathLike[str] = DEFAULT_DATA_DIR,
        *,
        start_timeout: float = 10.0,
        stop_timeout: float = 10.0,
    ) -> None:
        # Resolved now: a later chdir must not move the data dir under us.
        self.data_dir = Path(data_dir).resolve()
        self.start_timeout = start_timeout
        self.stop_timeout = stop_timeout
        #: True when the last :meth:`acquire` started the server rather than finding it.
        self.started = False
        self._url: str | None = None
        #: The server this instance last knew to be the data dir's (for a lost data dir).
        self._state: ServerState | None = None
        self._lease_fd: int | None = None
        self._lease_path: Path | None = None

    @property
    def aof_dir(self) -> Path:
        """The server's working dir, where the append-only file lives."""
        return self.data_dir / DATA_SUBDIR

    @property
    def url(self) -> str | None:
        """The URL while this instance holds a lease, else None."""
        return self._url

    def acquire(self, *, announce: bool = True) -> str:
        """Return the URL of the data dir's server, starting it if none runs; take a lease.

        Idempotent: a second call on a holding instance returns the same URL.
        ``announce=False`` leaves the "started" log line to a caller that says it itself.
        Raises :class:`ServerStartError` when the server cannot be started, or when
        another process keeps the data dir locked past the start and stop timeouts.
        """
        if self._url is not None:
            return self._url
        (self.data_dir / LEASES_DIR).mkdir(parents=True, exist_ok=True)
        with self._dir_lock():
            state = _live_state(self.data_dir)
            self.started = state is None
            if state is None:
                state = self._start(announce)
            self._take_lease()
        self._url, self._state = state.url, state
        return self._url

    def check(self) -> str | None:
        """Keep the data dir's server alive while holding it: None when all is well (a
        dead server is restarted on the same port and append-only file), else why the
        server cannot be trusted. Raises :class:`ServerStartError` when it is gone and
        cannot be brought back, which no waiting heals.
        """
        if self._url is None:
            return None
        if not self.data_dir.is_dir():
            if self._state is None or not _is_ours(self._state):
                raise ServerStartError(f"data dir {self.data_dir} deleted and its server gone")
            return f"embedded server's data dir {self.data_dir} was deleted"
        state = _read_state(self.data_dir)
        if state is not None and state.url == self._url and _pid_alive(state.pid):
            return None
        with self._dir_lock():  # one holder restarts it; the others find it restarted
            state = _read_state(self.data_dir)
            if state is None or not _is_ours(state, patience=2.0):
                log.warning("embedded server %s is gone: restarting it", self._url)
                _stop_servers(self.aof_dir, self.stop_timeout)
                server = ServerProcess(self.aof_dir, port=self._state.port if self._state else None)
                server.start(self.start_timeout)
                state = self._record(server)
                log.warning("embedded server restarted: %s (pid %d)", state.url, state.pid)
            if state.url != self._url:
                raise ServerStartError(f"the server of {self.data_dir} moved to {state.url}")
            self._state = state
        return None

    def release(self) -> None:
        """Give back this instance's lease; stop the server if it was the last live one.

        Idempotent, and a no-op when nothing was acquired. A crashed holder needs no
        release: its lease lock went with it.
        """
        if self._lease_fd is None:
            return
        if not self.data_dir.is_dir():
            # Deleted under us: no lease or state can be counted, and no new holder can
            # find the server, so it is stopped rather than left running unseen.
            self._drop_lease()
            self._url = None
            _stop_servers(self.aof_dir, self.stop_timeout)
            log.warning("data dir %s was deleted: its server is stopped", self.data_dir)
            return
        with self._dir_lock():
            self._drop_lease()
            self._url = None
            remaining = self._live_leases()
            if remaining:
                log.debug("embedded server kept: %d other holder(s)", remaining)
                return
            state = _read_state(self.data_dir)
            _stop_servers(self.aof_dir, self.stop_timeout)
            (self.data_dir / STATE_FILE).unlink(missing_ok=True)
            if state is not None:
                log.info("embedded server stopped (pid %d)", state.pid)

    def __enter__(self) -> str:
        return self.acquire()

    def __exit__(self, *exc: object) -> None:
        self.release()

    # -- internals ---------------------------------------------------------------

    @contextlib.contextmanager
    def _dir_lock(self) -> Iterator[None]:
        """Exclusive flock on ``server.lock``, bounded: a wedged holder gives an error."""
        fd = os.open(self.data_dir / LOCK_FILE, os.O_RDWR | os.O_CREAT, 0o600)
        try:
            # Long enough for a holder to start or stop a server in its turn.
            deadline = time.monotonic() + self.start_timeout + self.stop_timeout + 5.0
            while True:
                try:
                    fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
                    break
                except BlockingIOError:
                    if time.monotonic() >= deadline:
                        raise ServerStartError(
                            f"{self.data_dir / LOCK_FILE} stayed locked by another process"
                        ) from None
                    time.sleep(0.02)
            yield
        finally:
            os.close(fd)  # closing the descriptor releases the lock

    def _start(self, announce: bool = True) -> ServerState:
        """Start a server in the AOF dir and record it; caller holds the dir lock."""
        # A server still running in our AOF dir without a live state (hung, or its state
        # file was removed) would share the append-only file with the new one.
        _stop_servers(self.aof_dir, self.stop_timeout)
        state = self._record(_start_server(self.aof_dir, True, self.start_timeout))
        (log.info if announce else log.debug)(
            "embedded server started: %s (pid %d, append-only file in %s)",
            state.url,
            state.pid,
            self.aof_dir,
        )
        return state

    def _record(self, server: ServerProcess) -> ServerState:
        process = server.process
        assert process is not None
        info = server_info(server.host, server.port, timeout=2.0)
        if info is None:
            server.stop()
            raise ServerStartError(f"server on port {server.port} did not answer INFO")
        # The server outlives this object; a daemon thread reaps it whenever it exits,
        # so it never lingers as a zombie of this process and Popen never warns.
        threading.Thread(target=process.wait, name="printery-server-reaper", daemon=True).start()
        state = ServerState(
            pid=process.pid,
            host=server.host,
            port=server.port,
            binary=server.binary,
            run_id=str(info["run_id"]),
            started_at=now_rfc3339(),
        )
        _write_atomic(self.data_dir / STATE_FILE, _json.dumps(asdict(state)))
        return state

    def _take_lease(self) -> None:
        path = self.data_dir / LEASES_DIR / f"{os.getpid()}-{secrets.token_hex(4)}.lease"
        fd = os.open(path, os.O_RDWR | os.O_CREAT, 0o600)
        # Shared: holders never block each other; a checker's exclusive try fails while
        # any holder lives. Non-inheritable (PEP 446), so the server never holds it.
        fcntl.flock(fd, fcntl.LOCK_SH)
        self._lease_fd, self._lease_path = fd, path

    def _drop_lease(self) -> None:
        if self._lease_path is not None:
            self._lease_path.unlink(missing_ok=True)
        if self._lease_fd is not None:
            os.close(self._lease_fd)
        self._lease_fd, self._lease_path = None, None

    def _live_leases(self) -> int:
        """Count leases whose holder lives; remove the ones left by dead processes."""
        live = 0
        for path in (self.data_dir / LEASES_DIR).glob("*.lease"):
            try:
                fd = os.open(path, os.O_RDWR)
            except FileNotFoundError:
                continue
            try:
                fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
            except BlockingIOError:
                live += 1
            else:
                path.unlink(missing_ok=True)
            finally:
                os.close(fd)
        return live


def find_running(data_dir: str | os.PathLike[str] = DEFAULT_DATA_DIR) -> str | None:
    """The URL of the running server of ``data_dir``, or None; never starts or changes one.

    For the operator tool, which talks to a service's server but must not own one.
    """
    state = _read_state(Path(data_dir).resolve())
    if state is not None and _is_ours(state):
        return state.url
    return None


def start_ephemeral(
    tmpdir: str | os.PathLike[str], appendonly: bool = False, timeout: float = 10.0
) -> ServerProcess:
    """Start a private, unshared server in ``tmpdir`` (``printery bench`` and ``demo``).

    No state file, no lease: the caller owns it and must call ``stop()``. Without
    ``appendonly`` nothing is persisted, so a benchmark measures the server, not the disk.
    """
    return _start_server(Path(tmpdir), appendonly, timeout)


# -- state and process helpers -----------------------------------------------------


def _start_server(directory: Path, appendonly: bool, timeout: float) -> ServerProcess:
    """Start a server on a free port, retrying on a fresh port when the bind loses a race."""
    for attempt in range(1, _START_ATTEMPTS + 1):
        server = ServerProcess(directory, appendonly=appendonly)
        try:
            server.start(timeout)
            return server
        except ServerStartError:
            if attempt == _START_ATTEMPTS:
                raise
    raise AssertionError("unreachable")


def _read_state(data_dir: Path) -> ServerState | None:
    """The recorded state, or None when missing or unreadable (treated as stale)."""
    try:
        raw = _json.loads((data_dir / STATE_FILE).read_bytes())
        return ServerState(
            pid=int(raw["pid"]),
            host=str(raw["host"]),
            port=int(raw["port"]),
            binary=str(raw["binary"]),
            run_id=str(raw["run_id"]),
            started_at=str(raw["started_at"]),
        )
    except (OSError, ValueError, KeyError, TypeError):
        return None


def _live_state(data_dir: Path) -> ServerState | None:
    """The recorded server if it is alive and answering; else forget the record."""
    state = _read_state(data_dir)
    if state is not None and _is_ours(state, patience=2.0):
        return state
    if state is not None:
        log.warning("embedded server state is stale (pid %d not answering): replacing", state.pid)
    (data_dir / STATE_FILE).unlink(missing_ok=True)
    return None


def _is_ours(state: ServerState, patience: float = 0.0) -> bool:
    """True when the recorded pid lives and the server on its port has its run id.

    ``patience`` retries while the process lives: a server busy with a long command
    should not be taken for a dead one and replaced.
    """
    deadline = time.monotonic() + patience
    while True:
        if not _pid_alive(state.pid):
            return False
        info = server_info(state.host, state.port, timeout=0.5)
        if info is not None:
            return str(info.get("run_id")) == state.run_id and int(info["process_id"]) == state.pid
        if time.monotonic() >= deadline:
            return False
        time.sleep(0.1)


def _pid_alive(pid: int) -> bool:
    try:
        return bool(psutil.Process(pid).status() != psutil.STATUS_ZOMBIE)
    except psutil.Error:
        return False


def _servers_in(aof_dir: Path) -> list[Any]:
    """Live server processes whose working dir is ``aof_dir`` (``--dir`` chdirs there)."""
    target = str(aof_dir.resolve())
    found = []
    for proc in psutil.process_iter(["cwd", "name", "status"]):
        info = proc.info
        if (
            info["cwd"] == target
            and "server" in (info["name"] or "")
            and (info["status"] != psutil.STATUS_ZOMBIE)
        ):
            found.append(proc)
    return found


def _stop_servers(aof_dir: Path, timeout: float) -> None:
    """SIGTERM every server of ``aof_dir`` (it fsyncs the AOF and exits), SIGKILL if stuck.

    Identified by working dir rather than by recorded pid, so a server that lost its
    state file is found too and a recycled pid is never signalled.
    """
    procs = _servers_in(aof_dir)
    for sig in (signal.SIGTERM, signal.SIGKILL):
        for proc in procs:
            with contextlib.suppress(psutil.Error):
                proc.send_signal(sig)
        deadline = time.monotonic() + timeout
        while procs and time.monotonic() < deadline:
            procs = [p for p in procs if _pid_alive(p.pid)]
            if procs:
                time.sleep(0.02)
        if not procs:
            return
        log.warning("embedded server pid(s) %s ignored %s", [p.pid for p in procs], sig.name)
    raise ServerStartError(f"could not stop the server in {aof_dir}")


def _write_atomic(path: Path, text: str) -> None:
    """Write via a temporary file and rename, so a reader never sees half a state."""
    tmp = path.with_name(f".{path.name}.{os.getpid()}.tmp")
    with open(tmp, "w", encoding="utf-8") as fh:
        fh.write(text)
        fh.flush()
        os.fsync(fh.fileno())
    os.replace(tmp, path)
