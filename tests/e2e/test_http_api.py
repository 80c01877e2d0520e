"""The HTTP API ``/v1`` (docs/reference.md, The API: /v1) of a real ``printery-workers``
over real HTTP: runs (submit, get, server-sent events), auth, limits, and malformed
input."""

from __future__ import annotations

import json
import threading
from collections.abc import Iterator
from pathlib import Path
from typing import Any
from urllib.parse import quote

import httpx
import pytest
import redis
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from printery.servers.process import ServerProcess, free_port
from printery.testing import unique_prefix
from support.operator_cli import cli_sync
from support.service import ServiceHandle, spawn

TOKEN = "s3cret-token-for-tests"
LIMIT = 4096


def request(deployment_id: str | None = None) -> dict[str, Any]:
    data: dict[str, Any] = {"service": "billing-api", "version": "1.0.0",
                            "environment": "development", "requested_by": "alice",
                            "notify": ["log"]}
    if deployment_id:
        data["deployment_id"] = deployment_id
    return data


@pytest.fixture(scope="module")
def api(tmp_path_factory: pytest.TempPathFactory, server: ServerProcess) -> Iterator[
    tuple[ServiceHandle, str]
]:
    """One service for the module, with a token and a small payload limit."""
    work = tmp_path_factory.mktemp("api")
    config = work / "printery.toml"
    config.write_text(f"[transport]\npayload_limit_bytes = {LIMIT}\n")
    prefix = unique_prefix()
    handle = spawn(["--redis-url", server.url, "--stream-prefix", prefix, "--config", str(config)],
                   env={"PRINTERY_API_TOKEN": TOKEN}, cwd=work)
    yield handle, prefix
    handle.stop()


def call(handle: ServiceHandle, method: str, path: str, *, token: str | None = TOKEN,
         **kwargs: Any) -> httpx.Response:
    headers = kwargs.pop("headers", {})
    if token is not None:
        headers["Authorization"] = f"Bearer {token}"
    assert handle.http_base is not None
    return httpx.request(method, handle.http_base + path, headers=headers, timeout=10, **kwargs)


def events(handle: ServiceHandle, run_id: str, timeout: float = 40) -> list[dict[str, Any]]:
    """Every ``data:`` line of the run's event stream, until the server closes it."""
    assert handle.http_base is not None
    found = []
    with httpx.stream("GET", f"{handle.http_base}/v1/runs/{run_id}/events",
                      headers={"Authorization": f"Bearer {TOKEN}"}, timeout=timeout) as response:
        assert response.status_code == 200
        assert response.headers["content-type"].startswith("text/event-stream")
        for line in response.iter_lines():
            if line.startswith("data: "):
                found.append(json.loads(line[len("data: "):]))
    return found


def event_lines(handle: ServiceHandle, run_id: str) -> list[str]:
    """Every line of the run's event stream, until the server closes it."""
    assert handle.http_base is not None
    with httpx.stream("GET", f"{handle.http_base}/v1/runs/{run_id}/events",
                      headers={"Authorization": f"Bearer {TOKEN}"}, timeout=40) as response:
        return list(response.iter_lines())


def test_submit_follow_and_get_a_run(api: tuple[ServiceHandle, str]) -> None:
    handle, _ = api
    answer = call(handle, "POST", "/v1/runs", json={"data": request()})
    assert answer.status_code == 202, answer.text
    run_id = answer.json()["run_id"]
    assert answer.json()["entry_id"]
    streamed = events(handle, run_id)
    assert streamed[0]["stream"] == "deployment:started"
    assert streamed[-1]["stream"] == "deployment:finished"
    ms = [int(e["id"].split("-")[0]) for e in streamed]  # in one ms: in causal order
    assert ms == sorted(ms)
    event_ids = [line for line in event_lines(handle, run_id) if line.startswith("id: ")]
    assert len(set(event_ids)) == len(event_ids) == len(streamed)
    run = call(handle, "GET", f"/v1/runs/{run_id}").json()
    assert run["run_id"] == run_id and run["status"] == "succeeded"
    assert [e["id"] for e in run["entries"]][: len(streamed)] == [e["id"] for e in streamed]
    steps = {s["step"]: s for s in run["steps"]}
    assert set(steps) == {"validator", "dependency-checker", "health-monitor", "aggregator",
                          "notifier"}
    assert steps["validator"]["status"] == "done"
    # After the run ended, the event stream replays it from the first entry and closes.
    assert [e["id"] for e in events(handle, run_id, timeout=10)] == [e["id"] for e in streamed]


def test_same_idempotency_key_same_run(api: tuple[ServiceHandle, str]) -> None:
    handle, _ = api
    body = {"data": request(), "idempotency_key": "http-key-1"}
    first = call(handle, "POST", "/v1/runs", json=body).json()
    second = call(handle, "POST", "/v1/runs", json=body).json()
    assert first == second


def test_invalid_data_is_400_with_reasons_and_nothing_written(
    api: tuple[ServiceHandle, str], server: ServerProcess
) -> None:
    handle, prefix = api
    conn = redis.Redis.from_url(server.url, decode_responses=True)
    before = conn.xlen(f"{prefix}:deployment:started")
    answer = call(handle, "POST", "/v1/runs",
                  json={"data": {"service": "Bad Name", "version": "x", "environment": "moon"}})
    assert answer.status_code == 400
    body = answer.json()
    assert body["error"] == "invalid_input"
    codes = {(r["code"], r["field"]) for r in body["reasons"]}
    assert {("missing_field", "requested_by"), ("invalid_field", "service"),
            ("invalid_version", "version"), ("unknown_environment", "environment")} <= codes
    assert conn.xlen(f"{prefix}:deployment:started") == before
    conn.close()


def test_a_traceparent_header_travels_on_the_ingress_entry(
    api: tuple[ServiceHandle, str], server: ServerProcess
) -> None:
    """A producer's W3C ``traceparent`` header (docs/reference.md, Tracing) is written on
    the entry, tracing on or off; an invalid one is a 400 naming it, and nothing is
    written."""
    handle, prefix = api
    conn = redis.Redis.from_url(server.url, decode_responses=True)
    stream = f"{prefix}:deployment:started"
    given = "00-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-01"
    answer = call(handle, "POST", "/v1/runs", json={"data": request()},
                  headers={"traceparent": given})
    assert answer.status_code == 202
    (_, fields), = conn.xrange(stream, min=answer.json()["entry_id"], count=1)
    assert fields["traceparent"] == given
    before = conn.xlen(stream)
    bad = call(handle, "POST", "/v1/runs", json={"data": request()},
               headers={"traceparent": "00-xyz-00f067aa0ba902b7-01"})
    assert bad.status_code == 400
    assert [r["field"] for r in bad.json()["reasons"]] == ["traceparent"]
    assert conn.xlen(stream) == before
    conn.close()


def test_client_errors_are_4xx(api: tuple[ServiceHandle, str]) -> None:
    handle, _ = api
    assert call(handle, "POST", "/v1/runs", content=b"{not json").status_code == 400
    assert call(handle, "POST", "/v1/runs", json=[1, 2]).status_code == 400
    missing = call(handle, "POST", "/v1/runs", json={"nodata": 1})
    assert missing.status_code == 400
    assert {r["field"] for r in missing.json()["reasons"]} == {"nodata", "data"}
    # Data that is not an object is no step's input: refused at the door (it was a 202,
    # then five failing deliveries).
    for data in ("str", [1], 3, None):
        refused = call(handle, "POST", "/v1/runs", json={"data": data})
        assert refused.status_code == 400 and refused.json()["error"] == "invalid_input"
        assert [r["field"] for r in refused.json()["reasons"]] == ["data"], refused.json()
    big = call(handle, "POST", "/v1/runs", content=b'{"data": "' + b"x" * LIMIT + b'"}')
    assert big.status_code == 413
    # Without a declared length (chunked), the body is not read past the limit either.
    chunked = call(handle, "POST", "/v1/runs", content=iter([b'{"data": "', b"x" * LIMIT, b'"}']))
    assert chunked.status_code == 413
    assert call(handle, "GET", "/v1/runs/dep-nobody").status_code == 404
    # An id past 64 bits is no review id (it was a 500 from the server's refusal).
    huge = call(handle, "GET", "/v1/reviews?limit=1&after=99999999999999999999999-0")
    assert huge.status_code == 400 and huge.json()["error"] == "invalid_after", huge.text


def test_a_run_id_apart_from_the_data_is_held_to_the_ids_rule(
    api: tuple[ServiceHandle, str],
) -> None:
    """``run_id`` is the deployment id: refused where ``data.deployment_id`` would be (a
    hostile run had "\u2603" and ids with newlines and escapes accepted and run), and
    where it contradicts the data's own."""
    handle, _ = api
    for bad in ("\u2603", "a b\nc\x1b[31m", "x" * 129):
        answer = call(handle, "POST", "/v1/runs", json={"data": request(), "run_id": bad})
        assert answer.status_code == 400, (bad, answer.text)
        assert [r["field"] for r in answer.json()["reasons"]] == ["run_id"], answer.json()
    differs = call(handle, "POST", "/v1/runs", json={"data": request("d-one"), "run_id": "d-two"})
    assert differs.status_code == 400 and differs.json()["reasons"][0]["field"] == "run_id"
    assert call(handle, "GET", "/v1/runs/d-two").status_code == 404
    same = call(handle, "POST", "/v1/runs", json={"data": request("d-same"), "run_id": "d-same"})
    fine = call(handle, "POST", "/v1/runs", json={"data": request(), "run_id": "d.fine:1"})
    assert (same.status_code, fine.status_code) == (202, 202)
    assert fine.json()["run_id"] == "d.fine:1"
    assert events(handle, "d.fine:1")[0]["deployment_id"] == "d.fine:1"


def test_an_entry_naming_its_run_by_a_bad_id_is_rejected(
    api: tuple[ServiceHandle, str], server: ServerProcess
) -> None:
    """A producer's entry whose deployment_id field breaks the pattern, the request
    naming none, is rejected as the request naming it would be (it used to run)."""
    handle, prefix = api
    conn = redis.Redis.from_url(server.url, decode_responses=True)
    conn.xadd(f"{prefix}:deployment:started",
              {"deployment_id": "bad id", "data": json.dumps(request())})
    conn.close()
    followed = events(handle, quote("bad id"))
    assert followed[-1]["data"]["status"] == "rejected"
    rejected = [e for e in followed if e.get("type") == "deployment:rejected"]
    assert len(rejected) == 1, followed
    [rejected] = rejected
    assert [r["field"] for r in rejected["data"]["reasons"]] == ["deployment_id"]


def test_auth(api: tuple[ServiceHandle, str]) -> None:
    handle, _ = api
    assert call(handle, "GET", "/v1/runs/x", token=None).status_code == 401
    assert call(handle, "GET", "/v1/runs/x", token="wrong").status_code == 401
    assert call(handle, "GET", "/v1/runs/x", token=TOKEN).status_code == 404
    for open_path in ("/healthz", "/metrics", "/status", "/readyz"):
        assert call(handle, "GET", open_path, token=None).status_code in (200, 503)


def test_public_listener_without_token_answers_403(server: ServerProcess, tmp_path: Path) -> None:
    port = free_port()
    handle = spawn(["--redis-url", server.url, "--stream-prefix", unique_prefix(),
                    "--http-addr", f"0.0.0.0:{port}"], cwd=tmp_path)
    try:
        base = f"http://127.0.0.1:{port}"
        handle.http_base = base
        handle.wait_http()
        assert httpx.get(base + "/v1/runs/x", timeout=5).status_code == 403
        assert httpx.get(base + "/healthz", timeout=5).status_code == 200
        assert "without a token" in handle.log()
    finally:
        handle.stop()


def test_sse_client_that_disconnects_costs_nothing(
    api: tuple[ServiceHandle, str], server: ServerProcess
) -> None:
    """A client that goes away mid-stream stops the service's reading for it, and is no
    error: nothing at error level, no traceback in the log (a debug line at most)."""
    handle, _ = api
    conn = redis.Redis.from_url(server.url, decode_responses=True)

    def blocked_reads() -> int:
        return sum(1 for c in conn.client_list() if c.get("cmd") == "xread" and "b" in c["flags"])

    assert handle.http_base is not None
    production = {**request(), "environment": "production"}  # held for a review: running
    run_id = call(handle, "POST", "/v1/runs", json={"data": production}).json()["run_id"]
    _wait_review(handle, run_id)
    logged = len(handle.log())
    # The API's event stream, and the console's live run page (same server, same rule).
    for path in (f"/v1/runs/{run_id}/events", f"/live/run/{run_id}"):
        with httpx.stream("GET", f"{handle.http_base}{path}",
                          headers={"Authorization": f"Bearer {TOKEN}"}, timeout=10) as response:
            assert response.status_code == 200
            lines = response.iter_lines()
            assert any(line.startswith("data: ") for line in lines)  # an event came
            handle.wait_until(lambda: blocked_reads() >= 1, what="a blocked XREAD for it")
        # Disconnected: the service stops reading for it within its block time.
        handle.wait_until(lambda: blocked_reads() == 0, timeout=10, what="no XREAD left")
    since = handle.log()[logged:]
    for sign in ("Traceback", "ConnectionResetError", "http handler failed", '"level":"error"'):
        assert sign not in since, since
    conn.close()


@settings(max_examples=60, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(body=st.one_of(
    st.binary(max_size=300),
    st.recursive(st.none() | st.booleans() | st.integers() | st.text(max_size=20),
                 lambda inner: st.lists(inner, max_size=4)
                 | st.dictionaries(st.sampled_from(["data", "event_type", "run_id",
                                                    "idempotency_key", "x"]), inner, max_size=4),
                 max_leaves=12).map(lambda v: json.dumps(v).encode()),
))
def test_malformed_input_never_gets_a_500(api: tuple[ServiceHandle, str], body: bytes) -> None:
    handle, _ = api
    answer = call(handle, "POST", "/v1/runs", content=body)
    assert answer.status_code < 500, answer.text
    assert answer.status_code in (202, 400, 413)
    answer.json()  # always JSON


def test_run_ids_from_the_path_never_get_a_500(api: tuple[ServiceHandle, str]) -> None:
    handle, _ = api
    for run_id in ("%00", "a" * 2000, "..", "%F0%9F%92%A9", "x%0Ay"):
        answer = call(handle, "GET", f"/v1/runs/{run_id}")
        assert answer.status_code == 404, (run_id, answer.status_code)


def _wait_review(handle: ServiceHandle, run_id: str, field: str = "deployment_id") -> dict[str, Any]:
    def find() -> dict[str, Any] | None:
        for review in call(handle, "GET", "/v1/reviews").json():
            if review.get(field) == run_id:
                return dict(review)
        return None

    return dict(handle.wait_until(find, timeout=30, what=f"a review of {run_id}"))


def test_reviews_through_http(api: tuple[ServiceHandle, str]) -> None:
    handle, _ = api
    production = {**request(), "environment": "production"}
    approved = call(handle, "POST", "/v1/runs", json={"data": production}).json()["run_id"]
    review = _wait_review(handle, approved)
    shown = call(handle, "GET", f"/v1/reviews/{review['id']}")
    assert shown.status_code == 200 and shown.json()["kind"] == "approval"
    # Listed a page at a time: a full page links to the next.
    every = [r["id"] for r in call(handle, "GET", "/v1/reviews").json()]
    first = call(handle, "GET", "/v1/reviews?limit=1")
    assert [r["id"] for r in first.json()] == every[:1]
    following = first.headers["Link"].split(">")[0].lstrip("<")
    assert following == f"/v1/reviews?limit=1&after={quote(every[0], safe='')}"
    assert [r["id"] for r in call(handle, "GET", following).json()] == every[1:2]
    assert "Link" not in call(handle, "GET", f"/v1/reviews?limit={len(every) + 1}").headers
    for bad in ("limit=0", "limit=1001", "limit=x", "after=not-an-id"):
        assert call(handle, "GET", f"/v1/reviews?{bad}").status_code == 400, bad
    path = f"/v1/reviews/{review['id']}/approve"
    assert call(handle, "POST", path, json={}).status_code == 400  # who decides?
    assert call(handle, "POST", path, json={"by": "alice"}).status_code == 409  # the requester
    edited = call(handle, "POST", path, json={"by": "bob", "data": {"x": 1}})
    assert edited.status_code == 400  # a deployment approval takes no edited data
    decision = call(handle, "POST", path, json={"by": "bob", "note": "ok"})
    assert decision.status_code == 200, decision.text
    assert decision.json()["decision"] == "approved" and decision.json()["by"] == "bob"
    assert call(handle, "POST", path, json={"by": "bob"}).status_code == 404  # decided
    assert events(handle, approved)[-1]["data"]["status"] == "succeeded"

    rejected = call(handle, "POST", "/v1/runs", json={"data": production}).json()["run_id"]
    assert rejected != approved
    review = _wait_review(handle, rejected)
    answer = call(handle, "POST", f"/v1/reviews/{review['id']}/reject",
                  json={"by": "carol", "note": "not today"})
    assert answer.status_code == 200 and answer.json()["decision"] == "rejected"
    assert events(handle, rejected)[-1]["data"]["status"] == "rejected"
    assert call(handle, "GET", "/v1/reviews/0-1").status_code == 404


def test_dead_letters_through_http(api: tuple[ServiceHandle, str], server: ServerProcess) -> None:
    handle, prefix = api
    conn = redis.Redis.from_url(server.url, decode_responses=True)
    bad = conn.xadd(f"{prefix}:deployment:started", {"data": "{not json"})

    def dead() -> list[dict[str, Any]]:
        return [d for d in call(handle, "GET", "/v1/dlq").json() if d.get("source_id") == bad]

    [letter] = handle.wait_until(dead, what="the dead letter")
    assert letter["reason_code"] == "undecodable" and letter["data"] == "{not json"
    replayed = call(handle, "POST", f"/v1/dlq/{letter['id']}/replay")
    assert replayed.status_code == 200 and replayed.json()["replayed"] is True
    assert call(handle, "POST", f"/v1/dlq/{letter['id']}/replay").status_code == 404
    # The replayed entry is dead-lettered again (still not JSON): delete that one.
    [again] = handle.wait_until(
        lambda: [d for d in call(handle, "GET", "/v1/dlq").json()
                 if d.get("source_id") == replayed.json()["new_id"]], what="the second letter")
    assert call(handle, "DELETE", f"/v1/dlq/{again['id']}").status_code == 200
    assert call(handle, "DELETE", f"/v1/dlq/{again['id']}").status_code == 404
    assert call(handle, "DELETE", "/v1/dlq/not-an-id").status_code == 404
    conn.close()


def test_bytes_that_are_not_utf8_are_shown_not_a_500(
    api: tuple[ServiceHandle, str], server: ServerProcess
) -> None:
    """A byte that is not UTF-8 in an entry (here: the data of one, an extra field of
    another that runs to its outcome) shows as U+FFFD in every JSON answer and page that
    shows the entry; before, they answered 500 and the event stream sent nothing."""
    handle, prefix = api
    conn = redis.Redis.from_url(server.url)
    started = f"{prefix}:deployment:started"
    bad = conn.xadd(started, {"deployment_id": "bin-1", "data": b"\xff\xfe"}).decode()
    good = json.dumps(request()).encode()
    conn.xadd(started, {"deployment_id": "bin-2", "data": good, "producer": b"ext\xff"})
    conn.xadd(started, {"deployment_id": b"bin\xfe3", "data": good})  # a run id with one
    conn.close()

    def dead() -> list[dict[str, Any]]:
        answer = call(handle, "GET", "/v1/dlq")
        assert answer.status_code == 200, answer.text
        return [d for d in answer.json() if d.get("source_id") == bad]

    [letter] = handle.wait_until(dead, what="the dead letter")
    assert letter["reason_code"] == "undecodable" and letter["data"] == "\ufffd\ufffd"
    run = handle.wait_until(
        lambda: (r := call(handle, "GET", "/v1/runs/bin-2")).status_code == 200
        and r.json()["status"] != "running" and r.json(), what="run bin-2 ended")
    assert run["status"] == "succeeded"
    assert any(e.get("producer") == "ext\ufffd" for e in run["entries"]), run["entries"]
    followed = events(handle, "bin-2")
    assert followed[0]["producer"] == "ext\ufffd"
    assert followed[-1]["type"] == "deployment:finished"
    page = call(handle, "GET", "/dlq")
    assert page.status_code == 200 and "\ufffd\ufffd" in page.text
    for path in ("/", "/runs"):  # they list the run whose id holds the byte
        assert call(handle, "GET", path).status_code == 200, path
    for args in (("dlq", "list", "--json"), ("trace", "bin-2", "--json")):
        done = cli_sync(server.url, prefix, *args)
        assert done.returncode == 0, done.stderr
        assert "\ufffd" in json.dumps(json.loads(done.stdout), ensure_ascii=False)


def test_docflow_review_approved_with_edited_data_over_http(
    server: ServerProcess, tmp_path: Path
) -> None:
    prefix = unique_prefix()
    root = Path(__file__).resolve().parents[2]
    handle = spawn(["--redis-url", server.url, "--stream-prefix", prefix,
                    "--app", "examples.docflow:pipeline"], cwd=root,
                   env={"PRINTERY_API_TOKEN": TOKEN}, log_path=tmp_path / "service.log")
    try:
        run = call(handle, "POST", "/v1/runs", json={"data": {
            "doc_id": "unsure-1", "text": "Some note without a clear category at all."}})
        assert run.status_code == 202, run.text
        review = _wait_review(handle, "unsure-1", field="doc_id")
        assert review["kind"] == "low_confidence"
        path = f"/v1/reviews/{review['id']}/approve"
        refused = call(handle, "POST", path, json={"by": "ana", "data": {"doc_id": "unsure-1"}})
        assert refused.status_code == 400  # publish's input model wants label and summary
        assert {r["field"] for r in refused.json()["reasons"]} >= {"label", "summary"}
        edited = {**review["data"], "label": "memo"}
        assert call(handle, "POST", path, json={"by": "ana", "data": edited}).status_code == 200
        final = events(handle, "unsure-1")[-1]
    finally:
        handle.stop()
    assert final["stream"] == "doc:published" and final["data"]["label"] == "memo"


def test_event_stream_survives_a_server_restart(own_server: ServerProcess, tmp_path: Path) -> None:
    """The stream is open before the service runs the run; the server restarts under it;
    every entry still arrives, in order, and the stream ends after the outcome."""
    prefix = unique_prefix()
    handle = spawn(["--redis-url", own_server.url, "--stream-prefix", prefix, "--worker",
                    "validator"], env={"PRINTERY_API_TOKEN": TOKEN}, cwd=tmp_path)
    try:
        run_id = call(handle, "POST", "/v1/runs", json={"data": request()}).json()["run_id"]
        found: list[dict[str, Any]] = []
        failures: list[BaseException] = []

        def read() -> None:
            try:
                with httpx.stream("GET", f"{handle.http_base}/v1/runs/{run_id}/events",
                                  headers={"Authorization": f"Bearer {TOKEN}"},
                                  timeout=90) as response:
                    for line in response.iter_lines():
                        if line.startswith("data: "):
                            found.append(json.loads(line[len("data: "):]))
            except BaseException as exc:  # reported by the test below
                failures.append(exc)

        reader = threading.Thread(target=read)
        reader.start()
        handle.wait_until(lambda: any(e["stream"] == "deployment:validated" for e in found),
                          what="the validated entry on the stream")
        own_server.stop()
        own_server.start()
        # The rest of the pipeline runs only now, in a second process.
        rest = spawn(["--redis-url", own_server.url, "--stream-prefix", prefix, "--worker",
                      "dependency-checker,health-monitor,aggregator,notifier"], cwd=tmp_path)
        try:
            reader.join(90)
        finally:
            rest.stop()
    finally:
        handle.stop()
    assert not reader.is_alive() and not failures, failures
    streams = [e["stream"] for e in found]
    assert streams[0] == "deployment:started" and streams[-1] == "deployment:finished"
    assert "deployment:validated" in streams
    ms = [int(e["id"].split("-")[0]) for e in found]
    assert ms == sorted(ms)
