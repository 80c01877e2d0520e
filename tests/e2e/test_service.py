"""``printery-workers`` as operators run it: a subprocess against a real server, real
signals, real HTTP (docs/reference.md, Commands; Streams and entries; HTTP; issue 4
acceptance)."""

from __future__ import annotations

import json
import signal
import time
from collections.abc import Iterator
from pathlib import Path

import pytest
import redis
from prometheus_client.parser import text_string_to_metric_families

from printery.servers.process import ServerProcess
from printery.testing import unique_prefix
from support.service import ServiceHandle, run_cli, spawn, started_entry

WORKERS = ["validator", "dependency-checker", "health-monitor", "aggregator", "notifier"]
GROUPS = {
    "deployment:started": {"validator"},
    "deployment:validated": {"dependency-checker", "health-monitor"},
    "deployment:rejected": {"aggregator"},
    "dependencies:checked": {"aggregator"},
    "health:checked": {"aggregator"},
    "deployment:finished": {"notifier"},
}
METRIC_NAMES = [
    "printery_messages", "printery_processing_seconds", "printery_worker_restarts",
    "printery_worker_up", "printery_worker_uptime_seconds", "printery_stream_pending",
    "printery_dlq", "printery_retries",
]


# -- configuration ---------------------------------------------------------------------------

BAD = [
    (["--log-level", "loud"], {}, "log_level"),
    (["--environment", "moon"], {}, "environment"),
    (["--worker", "nobody"], {}, "worker"),
    (["--max-restarts", "-1"], {}, "max_restarts"),
    (["--backoff", "soon"], {}, "backoff_ms"),
    (["--health-check-interval", "0"], {}, "health_check_interval"),
    (["--shutdown-timeout", "x"], {}, "shutdown_timeout"),
    (["--http-addr", "nowhere"], {}, "http_addr"),
    (["--redis-url", "http://:pw@host"], {}, "redis_url"),
    (["--stream-prefix", "a b"], {}, "stream_prefix"),
    (["--app", "no.such.module:app"], {}, "app"),
    (["--processes", "0"], {}, "processes"),
    ([], {"SUPERVISED_MODE": "maybe"}, "SUPERVISED_MODE"),
    ([], {"EXIT_ON_FAILURE": "2"}, "EXIT_ON_FAILURE"),
    ([], {"MAX_RESTART_ATTEMPTS": "many"}, "MAX_RESTART_ATTEMPTS"),
]


@pytest.mark.parametrize(("args", "env", "named"), BAD, ids=[b[2] for b in BAD])
def test_bad_setting_exits_2_with_one_line(
    args: list[str], env: dict[str, str], named: str, tmp_path: Path
) -> None:
    done = run_cli(args, env, cwd=tmp_path)
    assert done.returncode == 2, done.stderr
    lines = done.stderr.strip().splitlines()
    assert len(lines) == 1, done.stderr
    assert named in lines[0]
    assert not (tmp_path / ".printery").exists()  # nothing was started
    assert "pw@" not in lines[0]


def test_bad_config_file_key_and_password_masked(tmp_path: Path) -> None:
    cfg = tmp_path / "printery.toml"
    cfg.write_text('redis_url = "redis://:hunter2@localhost:1"\nflavour = "mint"\n')
    done = run_cli(["--config", str(cfg)], cwd=tmp_path)
    assert done.returncode == 2
    assert len(done.stderr.strip().splitlines()) == 1
    assert "flavour" in done.stderr
    cfg.write_text('redis_url = "http://:hunter2@localhost:1"\n')
    done = run_cli([], {"PRINTERY_CONFIG": str(cfg)}, cwd=tmp_path)
    assert done.returncode == 2 and "redis_url" in done.stderr
    assert "hunter2" not in done.stderr


def test_app_that_raises_on_import_is_a_config_error(tmp_path: Path) -> None:
    (tmp_path / "brokenapp.py").write_text("raise RuntimeError('broken at import')\n")
    done = run_cli(["--app", "brokenapp:pipeline"], cwd=tmp_path)
    assert done.returncode == 2
    assert len(done.stderr.strip().splitlines()) == 1
    assert "app" in done.stderr and "broken at import" in done.stderr


def test_help_shows_env_and_default(tmp_path: Path) -> None:
    done = run_cli(["--help"], cwd=tmp_path)
    assert done.returncode == 0
    text = " ".join(done.stdout.split())
    for env in ("REDIS_URL", "WORKER_MODE", "SUPERVISED_MODE", "RESTART_BACKOFF_MS",
                "HTTP_ADDR", "PRINTERY_DATA_DIR", "PRINTERY_APP", "PRINTERY_CONFIG",
                "PRINTERY_PROCESSES"):
        assert f"env: {env}" in text
    assert "default: 127.0.0.1:9464" in text


def test_precedence_flag_env_file(server: ServerProcess, tmp_path: Path) -> None:
    cfg = tmp_path / "printery.toml"
    cfg.write_text("supervised = true\nenvironment = 'production'\n[workers.validator]\n"
                   "concurrency = 2\n")
    svc = spawn(
        ["--redis-url", server.url, "--stream-prefix", unique_prefix("prec"),
         "--config", str(cfg), "--worker", "validator"],
        env={"ENVIRONMENT": "staging", "WORKER_MODE": "notifier"}, cwd=tmp_path,
    )
    try:
        proc = svc.json("/status")["process"]
        assert proc["environment"] == "staging"      # env beats file
        assert proc["worker_mode"] == "validator"     # flag beats env
        assert proc["supervised"] is True             # file beats default
        workers = svc.json("/status")["workers"]
        assert list(workers) == ["validator"]
        assert workers["validator"]["consumers"] == 2
    finally:
        assert svc.stop() == 0


# -- one running service ------------------------------------------------------------------


@pytest.fixture(scope="module")
def running(
    server: ServerProcess, tmp_path_factory: pytest.TempPathFactory
) -> Iterator[tuple[ServiceHandle, str]]:
    prefix = unique_prefix("svc")
    cwd = tmp_path_factory.mktemp("svc")
    svc = spawn(["--redis-url", server.url, "--stream-prefix", prefix], cwd=cwd)
    yield svc, prefix
    assert svc.stop() == 0, svc.log()


def _all_running(svc: ServiceHandle) -> bool:
    workers = svc.json("/status")["workers"]
    return list(workers) == WORKERS and all(w["state"] == "running" for w in workers.values())


def test_start_health_ready_status_groups(
    running: tuple[ServiceHandle, str], server: ServerProcess
) -> None:
    svc, prefix = running
    assert svc.get("/healthz").status_code == 200
    svc.wait_until(lambda: svc.get("/readyz").status_code == 200, what="/readyz 200")
    svc.wait_until(lambda: _all_running(svc), what="five workers running")
    doc = svc.json("/status")
    assert set(doc) >= {"process", "redis", "workers"}
    assert set(doc["process"]) >= {"host", "pid", "started_at", "worker_mode", "supervised",
                                   "environment"}
    assert doc["process"]["pid"] == svc.pid
    assert doc["redis"]["connected"] is True
    for w in doc["workers"].values():
        assert set(w) >= {"state", "healthy", "uptime_s", "restarts", "errors", "processed",
                          "consumers", "pending", "last_error"}
    r = redis.Redis.from_url(server.url, decode_responses=True)
    try:
        for event_type, groups in GROUPS.items():
            found = {g["name"] for g in r.xinfo_groups(f"{prefix}:{event_type}")}
            assert found >= groups, event_type  # the aggregator also opens joins on validated
        assert json.loads(r.get(f"{prefix}:pipeline") or "{}")["steps"]
        assert r.keys(f"{prefix}:process:*")  # registry heartbeat
    finally:
        r.close()


def test_metrics_has_every_name(running: tuple[ServiceHandle, str]) -> None:
    svc, _ = running
    text = svc.get("/metrics").text
    names = {fam.name for fam in text_string_to_metric_families(text)}
    for name in METRIC_NAMES:
        assert name in names, name


# -- graceful shutdown with work in flight ----------------------------------------------------


def _publish(r: redis.Redis, prefix: str, n: int) -> None:
    pipe = r.pipeline(transaction=False)
    for i in range(n):
        pipe.xadd(f"{prefix}:deployment:started", started_entry(f"dep-e2e-{i}"))
    pipe.execute()


def _sent(r: redis.Redis, prefix: str) -> list[str]:
    return [json.loads(f["data"])["deployment_id"]
            for _, f in r.xrange(f"{prefix}:notification:sent")]


def _pending_total(r: redis.Redis, prefix: str) -> int:
    total = 0
    for event_type in GROUPS:
        for group in r.xinfo_groups(f"{prefix}:{event_type}"):
            total += int(group["pending"])
    return total


@pytest.mark.parametrize("sig", [signal.SIGTERM, signal.SIGINT], ids=["SIGTERM", "SIGINT"])
def test_signal_drains_in_flight_and_loses_nothing(
    sig: signal.Signals, server: ServerProcess, tmp_path: Path
) -> None:
    prefix = unique_prefix("drain")
    r = redis.Redis.from_url(server.url, decode_responses=True)
    args = ["--redis-url", server.url, "--stream-prefix", prefix, "--shutdown-timeout", "10"]
    try:
        svc = spawn(args, cwd=tmp_path)
        svc.wait_until(lambda: _all_running(svc), what="workers running")
        _publish(r, prefix, 50)
        svc.wait_until(lambda: _pending_total(r, prefix) > 0 or _sent(r, prefix),
                       timeout=10, what="entries in flight")
        started = time.monotonic()
        code = svc.stop(sig, timeout=30)
        assert code == 0, svc.log()
        assert time.monotonic() - started < 10 + 5
        assert "shutdown requested" in svc.log()
        # Handlers that had started finished and were acked; what is still pending was
        # handed back (never started): its idle time is past the visibility timeout, so
        # the next consumer claims it at once. Nothing was abandoned half-way.
        for event_type in GROUPS:
            stream = f"{prefix}:{event_type}"
            for group in r.xinfo_groups(stream):
                for entry in r.xpending_range(stream, group["name"], "-", "+", 1000):
                    assert entry["time_since_delivered"] >= 60_000, (stream, entry)
        done = _sent(r, prefix)
        assert len(done) == len(set(done))
        # Nothing lost: a restarted service finishes every remaining deployment, once.
        svc2 = spawn(args, cwd=tmp_path)
        try:
            svc2.wait_until(lambda: len(_sent(r, prefix)) >= 50, timeout=30, what="all 50")
        finally:
            assert svc2.stop() == 0
        final = _sent(r, prefix)
        assert sorted(final) == sorted(f"dep-e2e-{i}" for i in range(50))
    finally:
        r.close()


# -- secrets ---------------------------------------------------------------------------------


def test_password_never_shown(tmp_path: Path) -> None:
    password = "s3cret-pw"
    with ServerProcess(tmp_path / "srv", password=password) as srv:
        svc = spawn(["--redis-url", srv.url, "--stream-prefix", unique_prefix("pw"),
                     "--log-level", "debug"], cwd=tmp_path)
        try:
            svc.wait_until(lambda: svc.get("/readyz").status_code == 200, what="ready")
            status = svc.get("/status").text
            metrics = svc.get("/metrics").text
            assert "***" in json.loads(status)["redis"]["url"]
            assert password not in status
            assert password not in metrics
        finally:
            assert svc.stop() == 0
        assert svc.log().strip()
        assert password not in svc.log()
