"""Runs listed (``GET /v1/runs``, ``Client.runs``, ``printery runs``) and success declared
(``Pipeline(success=...)``: what ``printery watch`` and ``emit --wait`` exit 0 for), on a
custom pipeline served by a real ``printery-workers`` over real HTTP (docs/reference.md,
The API: /v1; Runs; Commands)."""

from __future__ import annotations

import json
import textwrap
from collections.abc import Iterator
from datetime import datetime
from pathlib import Path
from typing import Any

import httpx
import pytest

from printery import Client, InvalidInput, Pipeline, PipelineError, RunSummary, SyncClient
from printery.servers.process import ServerProcess
from printery.testing import unique_prefix
from support.operator_cli import cli_sync
from support.service import ServiceHandle, spawn

#: A run ends with the status its data asks for (``published`` is the pipeline's success),
#: or, asked to ``wait``, does not end; each reports the cost its data names.
APP = textwrap.dedent(
    """
    from printery import Message, Output, Pipeline

    pipeline = Pipeline("papers", ingress=["paper"], correlation_field="paper_id",
                        id_prefix="pap", cost_units=["usd"], success=("published", "kept"))


    @pipeline.step("publisher", consumes=["paper"], produces=["paper:done"], cost_units=["usd"])
    async def publish(message: Message) -> Output | None:
        message.report_cost("usd", message.data.get("usd", 0.25))
        if message.data["outcome"] == "wait":
            return None
        return Output("paper:done", {"status": message.data["outcome"]})
    """
)
APP_ARGS = ("--app", "papersapp:pipeline")


@pytest.fixture
def papers(server: ServerProcess, tmp_path: Path) -> Iterator[tuple[ServiceHandle, str, Path]]:
    (tmp_path / "papersapp.py").write_text(APP)
    prefix = unique_prefix("papers")
    handle = spawn(["--redis-url", server.url, "--stream-prefix", prefix, *APP_ARGS],
                   cwd=tmp_path)
    yield handle, prefix, tmp_path
    handle.stop()


def submit(handle: ServiceHandle, outcome: str, usd: float = 0.25) -> str:
    answer = httpx.post(f"{handle.http_base}/v1/runs",
                        json={"data": {"outcome": outcome, "usd": usd}}, timeout=10)
    assert answer.status_code == 202, answer.text
    return str(answer.json()["run_id"])


def get(handle: ServiceHandle, path: str) -> httpx.Response:
    return httpx.get(f"{handle.http_base}{path}", timeout=10)


def ended(handle: ServiceHandle, run_id: str) -> dict[str, Any]:
    """The run's ``GET /v1/runs/{id}`` once it ended."""
    return dict(handle.wait_until(
        lambda: (r := get(handle, f"/v1/runs/{run_id}")).status_code == 200
        and r.json()["status"] != "running" and r.json(), what=f"run {run_id} ended"))


def every_page(handle: ServiceHandle, path: str) -> list[list[dict[str, Any]]]:
    """Each page of a listing, following its ``Link: rel="next"`` to the end."""
    pages: list[list[dict[str, Any]]] = []
    following: str | None = path
    while following is not None:
        answer = get(handle, following)
        assert answer.status_code == 200, answer.text
        pages.append(answer.json())
        link = answer.headers.get("Link")
        following = None
        if link is not None:
            assert link.endswith('>; rel="next"'), link
            following = link[1:link.index(">")]
        assert len(pages) < 20, "the pages never end"
    return pages


def test_runs_are_listed_newest_first_a_page_at_a_time(
    papers: tuple[ServiceHandle, str, Path],
) -> None:
    """Runs of three statuses (and one still running) listed over HTTP: a page of two at
    a time, following the Link, lists every run once, newest first; the status and since
    filters; each run's cost is its own answer's; a bad parameter is a 400 naming it."""
    handle, _, _ = papers
    published = [submit(handle, "published", usd=0.5 * n) for n in (1, 2, 3)]
    held = [submit(handle, "held"), submit(handle, "held")]
    waiting = submit(handle, "wait")
    answers = {run_id: ended(handle, run_id) for run_id in [*published, *held]}

    pages = every_page(handle, "/v1/runs?limit=2")
    assert [len(page) for page in pages] == [2, 2, 2, 0]  # the last full page links on
    listed = [run for page in pages for run in page]
    assert sorted(run["run_id"] for run in listed) == sorted([*published, *held, waiting])
    order = [(datetime.fromisoformat(run["started"]), run["run_id"]) for run in listed]
    assert order == sorted(order, reverse=True)  # newest first (a tie: by id)
    assert order[0][1] == waiting and order[-1][1] == published[0]
    assert get(handle, "/v1/runs").json() == listed  # one page of the default limit
    by_id = {run["run_id"]: run for run in listed}
    for run in listed:
        assert set(run) == {"run_id", "status", "started", "ended", "cost"}
        assert run["started"].endswith("Z")
    for run_id, answer in answers.items():
        assert by_id[run_id]["status"] == answer["status"]
        assert by_id[run_id]["cost"] == answer["cost"]
        assert datetime.fromisoformat(by_id[run_id]["ended"]) >= datetime.fromisoformat(
            by_id[run_id]["started"])
    assert [by_id[run_id]["cost"] for run_id in published] == [
        {"usd": 0.5}, {"usd": 1.0}, {"usd": 1.5}]
    assert by_id[waiting]["status"] == "running" and by_id[waiting]["ended"] is None
    assert by_id[waiting]["cost"] == get(handle, f"/v1/runs/{waiting}").json()["cost"]

    def ids(path: str) -> list[str]:
        return [run["run_id"] for page in every_page(handle, path) for run in page]

    assert sorted(ids("/v1/runs?status=held&limit=1")) == sorted(held)
    assert ids("/v1/runs?status=running") == [waiting]
    assert sorted(ids("/v1/runs?status=published&since=1h")) == sorted(published)
    assert ids("/v1/runs?status=never-seen") == []
    assert ids("/v1/runs?since=0s") == []
    assert len(ids("/v1/runs?since=10m&limit=1000")) == 6
    for bad, code in (("limit=0", "invalid_limit"), ("limit=1001", "invalid_limit"),
                      ("limit=x", "invalid_limit"), ("status=", "invalid_status"),
                      ("status=%07", "invalid_status"), ("since=soon", "invalid_since"),
                      ("after=not-a-cursor", "invalid_after")):
        answer = get(handle, f"/v1/runs?{bad}")
        assert answer.status_code == 400, (bad, answer.text)
        assert answer.json()["error"] == code and answer.json()["detail"], answer.json()


async def test_the_client_lists_runs_as_typed_summaries(
    papers: tuple[ServiceHandle, str, Path], server: ServerProcess,
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    handle, prefix, work = papers
    monkeypatch.syspath_prepend(str(work))
    published = [submit(handle, "published"), submit(handle, "published")]
    held = submit(handle, "held", usd=2.0)
    for run_id in [*published, held]:
        ended(handle, run_id)
    async with Client(server.url, stream_prefix=prefix, app="papersapp:pipeline") as client:
        runs = await client.runs()
        assert sorted(run.run_id for run in runs) == sorted([held, *published])
        order = [(run.started, run.run_id) for run in runs]
        assert order == sorted(order, reverse=True)
        [only] = await client.runs(status="held", since="1h")
        assert isinstance(only, RunSummary) and only.run_id == held
        assert only.status == "held" and only.cost == {"usd": 2.0}
        assert only.ended is not None and only.started <= only.ended
        first = await client.runs(limit=1)
        second = await client.runs(limit=1, after=first[0].cursor)
        assert [run.run_id for run in first + second] == [run.run_id for run in runs[:2]]
        for bad in ({"status": ""}, {"limit": 0}, {"since": "soon"}, {"after": "x"}):
            with pytest.raises(InvalidInput):
                await client.runs(**bad)  # type: ignore[arg-type]
    with SyncClient(server.url, stream_prefix=prefix, app="papersapp:pipeline") as sync:
        assert [run.run_id for run in sync.runs(status="published")] == [
            run.run_id for run in runs if run.status == "published"]


def test_printery_runs_text_and_json(
    papers: tuple[ServiceHandle, str, Path], server: ServerProcess,
) -> None:
    handle, prefix, work = papers
    published, held = submit(handle, "published", usd=0.75), submit(handle, "held")
    for run_id in (published, held):
        ended(handle, run_id)

    def printery(*argv: str) -> Any:
        return cli_sync(server.url, prefix, *APP_ARGS, *argv, cwd=str(work))

    done = printery("runs", "--json")
    assert done.returncode == 0, done.stderr
    listed = json.loads(done.stdout)
    assert listed == get(handle, "/v1/runs").json()
    assert {run["run_id"]: run["status"] for run in listed} == {published: "published",
                                                                held: "held"}
    text = printery("runs")
    assert text.returncode == 0, text.stderr
    header, rule, *rows = text.stdout.splitlines()
    assert header.split() == ["paper_id", "status", "started", "ended", "cost"]
    assert set(rule) <= {"-", " "}
    shown = {row.split()[0]: row.split() for row in rows}
    assert shown[published][1] == "published" and shown[published][-1] == "usd=0.75"
    assert shown[held][1] == "held"
    only = printery("runs", "--status", "held", "--since", "1h")
    assert only.returncode == 0 and [row.split()[0] for row in only.stdout.splitlines()[2:]] == [
        held]
    for bad in (("--status", ""), ("--since", "soon"), ("--limit", "0"), ("--limit", "1001")):
        refused = printery("runs", *bad)
        assert refused.returncode == 2, (bad, refused.stdout, refused.stderr)


def test_success_decides_what_watch_and_emit_wait_exit_0_for(
    papers: tuple[ServiceHandle, str, Path], server: ServerProcess,
) -> None:
    """The app declares ``success=("published", "kept")``: ``emit --wait`` and ``watch``
    exit 0 for those statuses and 1 for any other (``held``), where before only
    ``succeeded`` was a success."""
    _, prefix, work = papers

    def printery(*argv: str) -> Any:
        return cli_sync(server.url, prefix, *APP_ARGS, *argv, cwd=str(work))

    exits = {}
    for outcome in ("published", "kept", "held"):
        done = printery("emit", "--data", json.dumps({"outcome": outcome}), "--wait", "--json",
                        "--timeout", "30")
        assert json.loads(done.stdout)["status"] == outcome, done.stderr
        exits[outcome] = done.returncode
        watched = printery("watch", "--timeout", "30", json.loads(done.stdout)["paper_id"])
        assert watched.stdout.strip().endswith(f": {outcome}"), watched.stdout
        exits[f"watch {outcome}"] = watched.returncode
    assert exits == {"published": 0, "kept": 0, "held": 1,
                     "watch published": 0, "watch kept": 0, "watch held": 1}


@pytest.mark.parametrize("success", [(), ("ok", 3), "published", ("ok", ""), ("a\nb",)])
def test_success_is_checked_where_the_pipeline_is_defined(success: Any) -> None:
    with pytest.raises(PipelineError):
        Pipeline("p", ingress=["x"], success=success)


def test_success_defaults_to_succeeded() -> None:
    assert Pipeline("p", ingress=["x"]).success == ("succeeded",)
    assert Pipeline("p", ingress=["x"], success=["published"]).success == ("published",)


def test_a_run_that_is_not_an_object_is_refused_by_both_doors(
    papers: tuple[ServiceHandle, str, Path], server: ServerProcess,
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """This pipeline's step checks nothing of its input: a string, a list, a number or
    null was taken (202) and then failed every delivery. Refused now, nothing written."""
    handle, prefix, work = papers
    monkeypatch.syspath_prepend(str(work))
    for data in ("str", [1, 2], 5, None, True):
        answer = httpx.post(f"{handle.http_base}/v1/runs", json={"data": data}, timeout=10)
        assert answer.status_code == 400, (data, answer.text)
        body = answer.json()
        assert body["error"] == "invalid_input"
        assert [(r["code"], r["field"]) for r in body["reasons"]] == [("invalid_field", "data")]
    with SyncClient(server.url, stream_prefix=prefix, app="papersapp:pipeline") as client:
        for data in ("str", [1, 2], 5, None):
            with pytest.raises(InvalidInput) as caught:
                client.submit(data)
            assert [(r.code, r.field) for r in caught.value.reasons] == [
                ("invalid_field", "data")]
        assert client.runs() == []
    assert get(handle, "/v1/runs").json() == []
