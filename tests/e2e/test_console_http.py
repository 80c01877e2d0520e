"""The web console's rules over plain HTTP against a real ``printery-workers``
(docs/reference.md, The API: /v1; The web console): login and its cookie, CSRF on every
form POST, 403 beyond loopback without a token, pages answered from the run index without
a SCAN of the keyspace, and no secret (Redis password, API token, webhook secret) in any
page, an error page included."""

from __future__ import annotations

import concurrent.futures
import json
import re
import threading
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import httpx
import pytest
import redis

from printery.servers.process import ServerProcess, free_port
from printery.service.console.views import REVIEWS_SHOWN
from printery.testing import unique_prefix
from support.service import ServiceHandle, spawn

TOKEN = "console-api-token-7f3a9c"
REDIS_PASSWORD = "redis-pw-5d1e8b"
WEBHOOK_SECRET = "webhook-secret-b42c6e"
SECRETS = (TOKEN, REDIS_PASSWORD, WEBHOOK_SECRET)
PAGES = ("/", "/runs", "/runs?status=succeeded", "/reviews", "/dlq", "/pipeline")


def deployment(environment: str = "development") -> dict[str, Any]:
    return {"service": "billing-api", "version": "1.2.3", "environment": environment,
            "requested_by": "alice", "notify": ["log"]}


@pytest.fixture
def secured(tmp_path: Path) -> Iterator[tuple[ServiceHandle, ServerProcess, str]]:
    """A server with a password and a service with a token and a webhook secret."""
    server = ServerProcess(tmp_path / "server", password=REDIS_PASSWORD)
    server.start()
    prefix = unique_prefix()
    handle = spawn(["--redis-url", server.url, "--stream-prefix", prefix],
                   env={"PRINTERY_API_TOKEN": TOKEN, "PRINTERY_WEBHOOK_SECRET": WEBHOOK_SECRET},
                   cwd=tmp_path)
    try:
        yield handle, server, prefix
    finally:
        handle.stop()
        server.stop()


def logged_in(handle: ServiceHandle) -> httpx.Client:
    """A client that logged in through the form, holding the session cookie."""
    client = httpx.Client(base_url=str(handle.http_base), timeout=10)
    form = client.get("/login")
    answer = client.post("/login", data={"csrf": csrf_of(form.text), "token": TOKEN,
                                         "next": "/runs"})
    assert answer.status_code == 303 and answer.headers["location"] == "/runs"
    cookie = answer.headers["set-cookie"]
    assert "HttpOnly" in cookie and "SameSite=Strict" in cookie and TOKEN not in cookie
    assert "Max-Age=" in cookie  # a session that ends: [console] session_ttl
    return client


def csrf_of(html: str) -> str:
    found = re.search(r'name="csrf" value="([0-9a-f]{64})"', html)
    assert found, "a form without a CSRF token"
    return found.group(1)


def finished(handle: ServiceHandle, client: httpx.Client, run_id: str) -> bool:
    return "succeeded" in client.get(f"/runs/{run_id}").text


def test_login_csrf_and_refusals(secured: tuple[ServiceHandle, ServerProcess, str]) -> None:
    handle, server, prefix = secured
    anonymous = httpx.Client(base_url=str(handle.http_base), timeout=10)
    assert anonymous.get("/").status_code == 303  # to the login form
    assert anonymous.get("/live/overview").status_code == 401
    assert anonymous.post("/dlq/1-0/replay", data={"csrf": "x"}).status_code == 401
    form = anonymous.get("/login").text
    wrong = anonymous.post("/login", data={"csrf": csrf_of(form), "token": "guess"})
    assert wrong.status_code == 401 and "set-cookie" not in wrong.headers
    assert anonymous.post("/login", data={"token": TOKEN}).status_code == 403  # no CSRF

    client = logged_in(handle)
    conn = redis.Redis.from_url(server.url, decode_responses=True)
    conn.xadd(f"{prefix}:deployment:started", {"data": "{not json"})
    handle.wait_until(lambda: conn.xlen(f"{prefix}:dlq") == 1, what="a dead letter")
    [(letter, _)] = conn.xrange(f"{prefix}:dlq")
    page = client.get("/dlq").text
    assert letter in page
    for data in ({}, {"csrf": ""}, {"csrf": "0" * 64}):
        refused = client.post(f"/dlq/{letter}/replay", data=data)
        assert refused.status_code == 403 and "CSRF" in refused.text
    assert conn.xlen(f"{prefix}:dlq") == 1  # nothing happened
    done = client.post(f"/dlq/{letter}/purge", data={"csrf": csrf_of(page)})
    assert done.status_code == 303 and conn.xlen(f"{prefix}:dlq") == 0
    # The bearer header still opens /v1 (and the console), the cookie alone not /v1.
    assert client.get("/v1/dlq").status_code == 401
    assert anonymous.get("/", headers={"Authorization": f"Bearer {TOKEN}"}).status_code == 200
    conn.close()


def test_no_secret_in_any_page_even_an_error_page(
    secured: tuple[ServiceHandle, ServerProcess, str],
) -> None:
    handle, server, _ = secured
    client = logged_in(handle)
    run_id = client.post("/v1/runs", json={"data": deployment()},
                         headers={"Authorization": f"Bearer {TOKEN}"}).json()["run_id"]
    client.post("/v1/runs", json={"data": deployment("production")},
                headers={"Authorization": f"Bearer {TOKEN}"})
    handle.wait_until(lambda: finished(handle, client, run_id), what="the run")
    handle.wait_until(lambda: "approval" in client.get("/reviews").text, what="the review")
    pages = {path: client.get(path) for path in (*PAGES, f"/runs/{run_id}", "/login",
                                                  "/runs/no-such-run")}
    server.stop()  # every page now fails: the error page
    pages["error"] = client.get("/")
    pages["error run"] = client.get(f"/runs/{run_id}")
    assert pages["error"].status_code == 503 and "Redis is not answering" in pages["error"].text
    assert pages["/runs/no-such-run"].status_code == 404
    for path, answer in pages.items():
        assert "<html" in answer.text, path
        for secret in SECRETS:
            assert secret not in answer.text, f"{path} shows a secret"
            assert secret not in str(answer.headers), f"{path} sends a secret"


def test_pages_never_scan_the_keyspace(
    secured: tuple[ServiceHandle, ServerProcess, str],
) -> None:
    handle, server, prefix = secured
    client = logged_in(handle)
    conn = redis.Redis.from_url(server.url, decode_responses=True)
    # A run an external producer starts with a plain XADD is indexed when handled.
    raw = "dep-raw-producer-1"
    conn.xadd(f"{prefix}:deployment:started",
              {"data": json.dumps({**deployment(), "deployment_id": raw})})
    handle.wait_until(lambda: raw in client.get("/runs?status=succeeded").text,
                      what="the raw run indexed with its status")
    assert raw in client.get(f"/runs?q={raw}").text

    def scans() -> int:
        stats = conn.info("commandstats")
        return sum(int(stats.get(f"cmdstat_{name}", {}).get("calls", 0))
                   for name in ("scan", "keys"))

    before = scans()
    for path in (*PAGES, f"/runs/{raw}"):
        assert client.get(path).status_code == 200, path
    assert scans() == before
    conn.close()


def test_forbidden_beyond_loopback_without_a_token(server: ServerProcess, tmp_path: Path) -> (
    None
):
    port = free_port("0.0.0.0")
    handle = spawn(["--redis-url", server.url, "--stream-prefix", unique_prefix(),
                    "--http-addr", f"0.0.0.0:{port}"], cwd=tmp_path)
    try:
        for path in ("/", "/runs", "/login", "/live/overview"):
            answer = httpx.get(f"http://127.0.0.1:{port}{path}", timeout=10)
            assert answer.status_code == 403 and "PRINTERY_API_TOKEN" in answer.text, path
    finally:
        handle.stop()


def test_a_rejection_that_ends_the_run_is_indexed_with_its_status(
    secured: tuple[ServiceHandle, ServerProcess, str],
) -> None:
    handle, _, _ = secured
    client = logged_in(handle)
    bearer = {"Authorization": f"Bearer {TOKEN}"}
    run_id = client.post("/v1/runs", json={"data": deployment("production")},
                         headers=bearer).json()["run_id"]

    def review() -> str:
        return next((r["id"] for r in client.get("/v1/reviews", headers=bearer).json()
                     if r.get("deployment_id") == run_id), "")

    review_id = handle.wait_until(review, what="the approval review")
    page = client.get("/reviews").text
    answer = client.post(f"/reviews/{review_id}/reject",
                         data={"csrf": csrf_of(page), "by": "carol", "note": "not today"})
    assert answer.status_code == 303 and answer.headers["location"].startswith(f"/runs/{run_id}")
    handle.wait_until(lambda: run_id in client.get("/runs?status=rejected").text,
                      what="the run listed as rejected")
    assert run_id not in client.get("/runs?status=running").text


def test_a_decision_after_the_run_ended_changes_nothing_and_the_console_says_so(
    secured: tuple[ServiceHandle, ServerProcess, str],
) -> None:
    """A review still open when its run ended (rejected): the console's Approve button
    says the decision changed nothing; no ``deployment:validated`` is written."""
    handle, server, prefix = secured
    client = logged_in(handle)
    bearer = {"Authorization": f"Bearer {TOKEN}"}
    run_id = client.post("/v1/runs", json={"data": deployment("production")},
                         headers=bearer).json()["run_id"]

    def review() -> str:
        return next((r["id"] for r in client.get("/v1/reviews", headers=bearer).json()
                     if r.get("deployment_id") == run_id), "")

    review_id = handle.wait_until(review, what="the approval review")
    conn = redis.Redis.from_url(server.url, decode_responses=True)
    try:
        fields = conn.xrange(f"{prefix}:review", review_id, review_id)[0][1]
        again = conn.xadd(f"{prefix}:review", fields)  # a second review of the same run
        assert client.post(f"/v1/reviews/{review_id}/reject", json={"by": "carol"},
                           headers=bearer).status_code == 200
        page = client.get("/reviews").text
        answer = client.post(f"/reviews/{again}/approve",
                             data={"csrf": csrf_of(page), "by": "dave"})
        assert answer.status_code == 303
        shown = client.get(answer.headers["location"]).text
        assert "had already ended (rejected)" in shown and "changed nothing" in shown
        assert conn.xlen(f"{prefix}:deployment:validated") == 0
        assert conn.xlen(f"{prefix}:review") == 0
    finally:
        conn.close()


def test_every_page_over_three_partitions(server: ServerProcess, tmp_path: Path) -> None:
    """docs/reference.md, Partitions with the console: runs of several partitions are
    listed, counted and shown, and the streams' lengths and groups add up over the
    partitions."""
    handle = spawn(["--redis-url", server.url, "--stream-prefix", unique_prefix(),
                    "--partitions", "3"], env={"PRINTERY_API_TOKEN": TOKEN}, cwd=tmp_path)
    try:
        client = logged_in(handle)
        bearer = {"Authorization": f"Bearer {TOKEN}"}
        runs = [client.post("/v1/runs", json={"data": deployment()}, headers=bearer
                            ).json()["run_id"] for _ in range(6)]
        for run_id in runs:
            handle.wait_until(lambda run_id=run_id: finished(handle, client, run_id),
                              what=f"run {run_id} succeeded")
        listed = client.get("/runs?status=succeeded").text
        assert all(run_id in listed for run_id in runs)
        for path in PAGES:
            assert client.get(path).status_code == 200, path
        # An id the run index does not know: 404 at once, no read of the streams.
        assert client.get("/runs/dep-never-submitted").status_code == 404
        overview = client.get("/").text
        started = re.search(r"<td>deployment:started</td><td class=\"num\">(\d+)</td>", overview)
        assert started is not None and started.group(1) == "6", overview[:2000]
    finally:
        handle.stop()


def test_reviews_are_paged(secured: tuple[ServiceHandle, ServerProcess, str]) -> None:
    """The reviews page shows a page of forms, how many are open, and a link to the next
    page: it never renders (nor polls) every open review."""
    handle, server, prefix = secured
    conn = redis.Redis.from_url(server.url, decode_responses=True)
    ids = [conn.xadd(f"{prefix}:review", {
        "data": json.dumps(deployment("production")), "kind": "approval", "step": "validator",
        "deployment_id": f"dep-{n}", "reason": "why", "resume_type": "deployment:validated",
        "reject_type": "deployment:rejected"}) for n in range(REVIEWS_SHOWN + 2)]
    conn.close()
    client = logged_in(handle)
    first = client.get("/reviews").text
    assert first.count('class="card review"') == REVIEWS_SHOWN
    assert f"{REVIEWS_SHOWN + 2} open · showing {REVIEWS_SHOWN}" in first
    following = f'/reviews?after={ids[REVIEWS_SHOWN - 1]}'
    assert f'href="{following}"' in first
    second = client.get(following).text
    assert second.count('class="card review"') == 2 and f"review-{ids[-1]}" in second
    assert "from the oldest" in second
    # The live part of the second page polls that page, not the first.
    with client.stream("GET", f"/live/reviews?after={ids[REVIEWS_SHOWN - 1]}") as live:
        assert live.status_code == 200
        event = next(line for line in live.iter_lines() if line.startswith("data:"))
    assert json.loads(event[5:])["html"].count('class="card review"') == 2


def cookie_of(client: httpx.Client) -> str:
    value = client.cookies.get("printery_session")
    assert value, "no session cookie"
    return value


def holding(handle: ServiceHandle, cookie: str) -> httpx.Client:
    """A client that never logged in, holding a copy of ``cookie``."""
    return httpx.Client(base_url=str(handle.http_base), timeout=10,
                        cookies={"printery_session": cookie})


def refused(client: httpx.Client) -> bool:
    """The cookie opens nothing: a page sends to the login form, a live fragment and a
    form POST answer 401."""
    page = client.get("/runs")
    return (page.status_code == 303 and page.headers["location"].startswith("/login")
            and client.get("/live/overview").status_code == 401
            and client.post("/dlq/1-0/purge", data={"csrf": "0" * 64}).status_code == 401)


def last_event(handle: ServiceHandle, cookie: str, opened: threading.Event) -> str:
    """Follow ``/live/overview`` with ``cookie`` until the server ends the stream: the
    name of its last event ("" for a plain fragment)."""
    event = ""
    with holding(handle, cookie).stream("GET", "/live/overview",
                                        timeout=httpx.Timeout(10, read=30)) as answer:
        assert answer.status_code == 200
        for line in answer.iter_lines():
            if line.startswith("data:"):
                opened.set()
            if line.startswith("event:"):
                event = line.removeprefix("event:").strip()
    return event


def test_logout_ends_the_session_a_copied_cookie_included(
    secured: tuple[ServiceHandle, ServerProcess, str],
) -> None:
    handle, server, prefix = secured
    first, second = logged_in(handle), logged_in(handle)
    cookie = cookie_of(first)
    assert cookie != cookie_of(second), "every login opens a session of its own"
    copy = holding(handle, cookie)
    assert copy.get("/runs").status_code == 200  # the copy passes while the session is open
    opened = threading.Event()
    conn = redis.Redis.from_url(server.url, decode_responses=True)
    with concurrent.futures.ThreadPoolExecutor(1) as pool:
        live = pool.submit(last_event, handle, cookie, opened)
        assert opened.wait(15), "the live overview did not answer"
        assert len(conn.keys(f"{prefix}:console-session:*")) == 2
        out = first.post("/logout", data={"csrf": csrf_of(first.get("/runs").text)})
        assert out.status_code == 303 and out.headers["location"] == "/login"
        assert refused(copy) and refused(holding(handle, cookie))
        assert live.result(timeout=15) == "end"  # the live stream opened before ends too
    assert len(conn.keys(f"{prefix}:console-session:*")) == 1
    assert second.get("/runs").status_code == 200  # another session lives on
    conn.close()


@pytest.fixture
def short_sessions(tmp_path: Path, server: ServerProcess) -> Iterator[tuple[ServiceHandle, str]]:
    """A service whose console sessions last 3 s."""
    config = tmp_path / "sessions.toml"
    config.write_text("[console]\nsession_ttl = 3\n")
    prefix = unique_prefix()
    handle = spawn(["--redis-url", server.url, "--stream-prefix", prefix, "--config", str(config)],
                   env={"PRINTERY_API_TOKEN": TOKEN}, cwd=tmp_path)
    try:
        yield handle, prefix
    finally:
        handle.stop()


def test_a_session_expires_at_its_max_age(short_sessions: tuple[ServiceHandle, str]) -> None:
    handle, _ = short_sessions
    client = logged_in(handle)
    cookie = cookie_of(client)
    assert client.get("/runs").status_code == 200
    handle.wait_until(lambda: refused(holding(handle, cookie)), timeout=15,
                      what="the session refused once past its max age")
    assert client.get("/runs").status_code == 303  # the login's own client too


def test_a_new_token_ends_every_session(tmp_path: Path, server: ServerProcess) -> None:
    """The cookie is signed with the token: a service restarted with another token
    refuses it, though its session is still open in the server."""
    prefix = unique_prefix()
    args = ["--redis-url", server.url, "--stream-prefix", prefix]
    handle = spawn(args, env={"PRINTERY_API_TOKEN": TOKEN}, cwd=tmp_path)
    try:
        cookie = cookie_of(logged_in(handle))
    finally:
        handle.stop()
    rotated = spawn(args, env={"PRINTERY_API_TOKEN": "a-new-token-3b9e"}, cwd=tmp_path)
    try:
        conn = redis.Redis.from_url(server.url, decode_responses=True)
        assert len(conn.keys(f"{prefix}:console-session:*")) == 1  # still open
        conn.close()
        assert refused(holding(rotated, cookie))
    finally:
        rotated.stop()
