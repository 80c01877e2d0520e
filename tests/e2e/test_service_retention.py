"""The retention sweep of a running ``printery-workers`` (issue 6 item 6): history older
than ``transport.retention`` goes once every group has acknowledged it; an entry a group
has not read stays, and ``dlq`` is never trimmed; the run index forgets finished runs as
old."""

from __future__ import annotations

from pathlib import Path

import redis
from prometheus_client.parser import text_string_to_metric_families

from printery.servers.process import ServerProcess
from printery.testing import unique_prefix
from printery.wire.keys import StreamKeys
from support.service import spawn, started_entry

DEPLOYMENTS = 20


def _trimmed(text: str) -> dict[str, float]:
    return {
        sample.labels["event_type"]: sample.value
        for family in text_string_to_metric_families(text)
        if family.name == "printery_stream_trimmed"
        for sample in family.samples if sample.name.endswith("_total")
    }


def test_sweep_trims_acknowledged_history_only(server: ServerProcess, tmp_path: Path) -> None:
    prefix = unique_prefix("ret")
    r = redis.Redis.from_url(server.url, decode_responses=True)
    started, validated = f"{prefix}:deployment:started", f"{prefix}:deployment:validated"
    for i in range(DEPLOYMENTS):
        r.xadd(started, started_entry(f"dep-ret-{i}"))
    # A group that never reads: nothing of deployment:started may go while it lags.
    r.xgroup_create(started, "laggard", id="0")
    r.xadd(f"{prefix}:dlq", {"data": "{}", "reason_code": "invalid_input"})
    config = tmp_path / "printery.toml"
    config.write_text("[transport]\nretention = 0.5\nretention_interval = 0.2\n")
    svc = spawn(["--redis-url", server.url, "--stream-prefix", prefix, "--config", str(config)],
                cwd=tmp_path)
    try:
        # Every group of deployment:validated reads and acknowledges each entry; a sweep
        # after they aged past 0.5 s removes them all. notification:sent, which no group
        # reads, goes by age alone once all are written.
        svc.wait_until(lambda: _trimmed(svc.get("/metrics").text).get("deployment:validated")
                       == DEPLOYMENTS, what="deployment:validated trimmed")
        svc.wait_until(lambda: _trimmed(svc.get("/metrics").text).get("notification:sent")
                       == DEPLOYMENTS, what="notification:sent trimmed")
        assert r.xlen(validated) == 0 and r.xlen(f"{prefix}:notification:sent") == 0
        assert r.xlen(started) == DEPLOYMENTS, "the laggard group has read nothing"
        assert r.xlen(f"{prefix}:dlq") == 1, "dlq is never trimmed"
        # The run index forgets the runs whose outcome aged past the retention too.
        runs = StreamKeys(prefix).run_index()
        svc.wait_until(lambda: r.zcard(runs) == 0, what="every finished run forgotten")
        assert "runs_forgotten" in svc.log()
    finally:
        assert svc.stop() == 0, svc.log()
        r.close()
