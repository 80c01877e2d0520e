"""Run ``printery-workers`` as a real subprocess in tests: spawn with flags and env, wait
for its HTTP port, talk to it, signal it, collect its exit status and logs.

The port is chosen by the test (a free loopback port passed as ``--http-addr``) unless
the caller passes its own ``--http-addr``; the log goes to a file (not a pipe, so a
chatty service can never block on a full pipe buffer).
"""

from __future__ import annotations

import contextlib
import json
import os
import signal
import subprocess
import sys
import time
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

import httpx

from printery.servers.process import free_port

#: Env vars of the settings (docs/reference.md, Commands) removed from the inherited
#: environment, so a developer's shell (REDIS_URL, LOG_LEVEL...) cannot change what a test
#: sees.
SETTING_ENV = (
    "REDIS_URL", "LOG_LEVEL", "ENVIRONMENT", "WORKER_MODE", "SUPERVISED_MODE",
    "MAX_RESTART_ATTEMPTS", "RESTART_BACKOFF_MS", "HEALTH_CHECK_INTERVAL", "SHUTDOWN_TIMEOUT",
    "EXIT_ON_FAILURE", "HTTP_ADDR", "STREAM_PREFIX", "PRINTERY_DATA_DIR", "PRINTERY_APP",
    "PRINTERY_CONFIG", "PRINTERY_PROCESSES", "PRINTERY_PARTITIONS",
    # Tracing (docs/reference.md, Tracing) is on only where a test turns it on.
    "OTEL_EXPORTER_OTLP_ENDPOINT", "OTEL_EXPORTER_OTLP_TRACES_ENDPOINT", "OTEL_SDK_DISABLED",
    "OTEL_SERVICE_NAME",
)


class ServiceHandle:
    """A running ``printery-workers``; ``.proc`` is the ``Popen``."""

    def __init__(
        self, proc: subprocess.Popen[bytes], http_base: str | None, log_path: Path
    ) -> None:
        self.proc = proc
        self.http_base = http_base
        self.log_path = log_path

    @property
    def pid(self) -> int:
        return self.proc.pid

    def log(self) -> str:
        """Everything the service wrote to stdout and stderr so far."""
        try:
            return self.log_path.read_text(errors="replace")
        except OSError:
            return ""

    def get(self, path: str, timeout: float = 5.0) -> httpx.Response:
        assert self.http_base is not None, "started with --http-addr off"
        return httpx.get(self.http_base + path, timeout=timeout)

    def json(self, path: str) -> Any:
        return self.get(path).json()

    def wait_http(self, timeout: float = 20.0) -> None:
        """Until ``/healthz`` answers 200; fails early when the process exits."""
        deadline = time.monotonic() + timeout
        while True:
            if self.proc.poll() is not None:
                raise AssertionError(
                    f"service exited {self.proc.returncode} before serving HTTP:\n{self.log()}"
                )
            with contextlib.suppress(httpx.HTTPError):
                if self.get("/healthz", timeout=1.0).status_code == 200:
                    return
            if time.monotonic() > deadline:
                raise AssertionError(f"no HTTP within {timeout}s:\n{self.log()}")
            time.sleep(0.05)

    def wait_until(self, probe: Any, timeout: float = 20.0, what: str = "condition") -> Any:
        """Poll ``probe()`` until truthy (exceptions count as falsy)."""
        deadline = time.monotonic() + timeout
        last: Any = None
        while time.monotonic() < deadline:
            try:
                last = probe()
            except (httpx.HTTPError, KeyError, ValueError) as exc:
                last = exc
            if last and not isinstance(last, Exception):
                return last
            time.sleep(0.05)
        raise AssertionError(
            f"{what} not reached within {timeout}s (last: {last!r}):\n{self.log()}"
        )

    def stop(self, sig: signal.Signals = signal.SIGTERM, timeout: float = 40.0) -> int:
        """Send ``sig`` and wait for the exit status (SIGKILL and fail after ``timeout``)."""
        if self.proc.poll() is None:
            self.proc.send_signal(sig)
        return self.wait(timeout)

    def wait(self, timeout: float = 40.0) -> int:
        try:
            return self.proc.wait(timeout=timeout)
        except subprocess.TimeoutExpired:
            self.proc.kill()
            self.proc.wait(timeout=10)
            raise AssertionError(f"service did not exit within {timeout}s:\n{self.log()}") from None

    def kill(self) -> None:
        if self.proc.poll() is None:
            self.proc.kill()
            self.proc.wait(timeout=10)


def base_env(extra: Mapping[str, str] | None = None) -> dict[str, str]:
    """The current environment minus every setting's env var, plus ``extra``."""
    env = {k: v for k, v in os.environ.items() if k not in SETTING_ENV}
    env.update(extra or {})
    return env


def spawn(
    args: Sequence[str] = (),
    env: Mapping[str, str] | None = None,
    cwd: str | os.PathLike[str] | None = None,
    *,
    log_path: Path | None = None,
    http: bool = True,
    wait: bool = True,
    timeout: float = 20.0,
) -> ServiceHandle:
    """Start ``printery-workers ARGS`` (via this interpreter) and, with ``wait``, wait
    until its HTTP answers. ``env`` is added to :func:`base_env`. Without an explicit
    ``--http-addr`` in ``args`` and with ``http``, a free loopback port is used."""
    argv = list(args)
    http_base: str | None = None
    if not any(a == "--http-addr" or a.startswith("--http-addr=") for a in argv):
        if http:
            port = free_port()
            argv += ["--http-addr", f"127.0.0.1:{port}"]
            http_base = f"http://127.0.0.1:{port}"
        else:
            argv += ["--http-addr", "off"]
    else:
        i = argv.index("--http-addr") if "--http-addr" in argv else -1
        addr = argv[i + 1] if i >= 0 else ""
        if addr and addr != "off":
            http_base = "http://" + addr
    if log_path is None:
        log_dir = Path(cwd) if cwd is not None else Path.cwd()
        log_path = log_dir / f"service-{time.monotonic_ns()}.log"
    out = open(log_path, "wb")  # noqa: SIM115 - handed to the child
    try:
        proc = subprocess.Popen(
            [sys.executable, "-m", "printery.cli.workers", *argv],
            env=base_env(env), cwd=cwd, stdout=out, stderr=subprocess.STDOUT,
        )
    finally:
        out.close()
    handle = ServiceHandle(proc, http_base, log_path)
    if wait and http_base is not None:
        try:
            handle.wait_http(timeout)
        except BaseException:
            handle.kill()
            raise
    return handle


def run_cli(
    args: Sequence[str], env: Mapping[str, str] | None = None,
    cwd: str | os.PathLike[str] | None = None, timeout: float = 30.0,
) -> subprocess.CompletedProcess[str]:
    """Run ``printery-workers ARGS`` to completion (for configuration errors, --help)."""
    return subprocess.run(
        [sys.executable, "-m", "printery.cli.workers", *args],
        env=base_env(env), cwd=cwd, capture_output=True, text=True, timeout=timeout,
        check=False,
    )


def started_entry(deployment_id: str) -> dict[str, str]:
    """A ``deployment:started`` entry that runs end to end with nothing outside: a
    development request (no approval), no health URL or dependencies, the ``log`` channel."""
    return {"data": json.dumps({
        "deployment_id": deployment_id, "service": "billing-api", "version": "1.0.0",
        "environment": "development", "requested_by": "alice", "notify": ["log"],
    })}
