"""Fuzzed HTTP requests against a running ``printery-workers`` (issue 6 item 5): random
methods, paths, query strings, headers, bodies and raw garbage never crash the service.
Every request gets a well-formed answer below 500 (or the connection is closed on a
request line that is not HTTP at all), and the service keeps serving and processing."""

from __future__ import annotations

import socket
from collections.abc import Callable, Iterator

import pytest
import redis
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from printery.servers.process import ServerProcess
from printery.testing import unique_prefix
from support.service import ServiceHandle, spawn, started_entry

METHODS = st.one_of(
    st.sampled_from(["GET", "HEAD", "POST", "PUT", "DELETE", "OPTIONS", "PATCH", "TRACE"]),
    st.text(alphabet="ABCDEFGHIJKLMNOPQRSTUVWXYZ", min_size=1, max_size=12),
)
PATHS = st.one_of(
    st.sampled_from(["/healthz", "/readyz", "/status", "/metrics", "/", "/status/", "//status",
                     "/metrics?x=1", "/%2e%2e/etc/passwd", "/healthz#frag"]),
    st.text(alphabet=st.characters(min_codepoint=0x21, max_codepoint=0x7E), max_size=300)
    .map(lambda p: "/" + p),
)
HEADER_NAME = st.text(alphabet="abcdefghijklmnopqrstuvwxyz-", min_size=1, max_size=20)
HEADER_VALUE = st.text(alphabet=st.characters(min_codepoint=0x20, max_codepoint=0x7E),
                       max_size=200)
HEADERS = st.lists(st.tuples(HEADER_NAME, HEADER_VALUE), max_size=8)
BODIES = st.one_of(st.just(b""), st.binary(max_size=4096),
                   st.integers(0, 64).map(lambda depth: ("[" * depth + "]" * depth).encode()))
GARBAGE = st.binary(min_size=1, max_size=2048)

#: Tallies for the figures line printed at the end of the run.
SEEN: dict[str, int] = {}


def _exchange(port: int, raw: bytes, *, half_close: bool = False) -> bytes:
    """Send ``raw`` on a fresh connection; everything the server answers until it closes
    (a socket timeout after 5 s fails the test). ``half_close`` ends our side at once,
    for garbage that may never form a complete request (a server may then drop the
    connection without answering); a well-formed request asks for ``Connection: close``
    instead, since aiohttp takes a half-close as the client having gone away."""
    with socket.create_connection(("127.0.0.1", port), timeout=5) as sock:
        sock.sendall(raw)
        if half_close:
            sock.shutdown(socket.SHUT_WR)
        chunks = []
        while True:
            chunk = sock.recv(65536)
            if not chunk:
                return b"".join(chunks)
            chunks.append(chunk)


def _status(answer: bytes) -> int | None:
    """The status code of the first response, or None when the server just closed."""
    if not answer:
        return None
    line = answer.split(b"\r\n", 1)[0].split(b" ")
    assert line[0].startswith(b"HTTP/1."), answer[:200]
    return int(line[1])


@pytest.fixture(scope="module")
def service(
    server: ServerProcess, tmp_path_factory: pytest.TempPathFactory
) -> Iterator[tuple[ServiceHandle, int, str]]:
    prefix = unique_prefix("fuzzhttp")
    svc = spawn(["--redis-url", server.url, "--stream-prefix", prefix],
                cwd=tmp_path_factory.mktemp("fuzzhttp"))
    assert svc.http_base is not None
    port = int(svc.http_base.rsplit(":", 1)[1])
    svc.wait_until(lambda: svc.get("/readyz").status_code == 200, what="/readyz 200")
    yield svc, port, prefix
    assert svc.stop() == 0, svc.log()


@settings(max_examples=150, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(method=METHODS, path=PATHS, headers=HEADERS, body=BODIES)
def test_fuzzed_requests_get_answers_below_500(
    service: tuple[ServiceHandle, int, str], method: str, path: str,
    headers: list[tuple[str, str]], body: bytes,
) -> None:
    _svc, port, _ = service
    lines = [f"{method} {path} HTTP/1.1", "Host: 127.0.0.1", "Connection: close",
             *(f"{name}: {value}" for name, value in headers if name.lower() not in
               ("host", "connection", "content-length", "transfer-encoding")),
             f"Content-Length: {len(body)}"]
    status = _status(_exchange(port, ("\r\n".join(lines) + "\r\n\r\n").encode() + body))
    # 503 is /readyz's honest "not ready" (a worker busy restarting), not a failure.
    assert status is not None, (method, path)
    assert status < 500 or (status == 503 and "readyz" in path), (method, path, status)
    SEEN[str(status)] = SEEN.get(str(status), 0) + 1


@settings(max_examples=100, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(raw=GARBAGE)
def test_raw_garbage_is_refused_not_fatal(
    service: tuple[ServiceHandle, int, str], raw: bytes
) -> None:
    _svc, port, _ = service
    status = _status(_exchange(port, raw, half_close=True))
    assert status is None or 400 <= status < 500, status
    SEEN["garbage"] = SEEN.get("garbage", 0) + 1


def test_service_still_serves_and_processes(
    service: tuple[ServiceHandle, int, str], server: ServerProcess,
    report_figures: Callable[[str], None],
) -> None:
    svc, _, prefix = service
    assert svc.proc.poll() is None, "the service survived the fuzzing"
    assert svc.get("/healthz").status_code == 200
    svc.wait_until(lambda: svc.get("/readyz").status_code == 200, what="/readyz 200")
    r = redis.Redis.from_url(server.url, decode_responses=True)
    try:
        r.xadd(f"{prefix}:deployment:started", started_entry("dep-after-fuzz"))
        svc.wait_until(lambda: r.xlen(f"{prefix}:notification:sent") == 1,
                       what="a deployment still runs end to end")
    finally:
        r.close()
    report_figures(f"fuzzed HTTP requests by status: {dict(sorted(SEEN.items()))}, "
                   "service crashes: 0")


