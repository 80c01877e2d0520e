"""Cost per step (issue 7, docs/reference.md, Replay and cost): a user's pipeline whose
handlers report costs shows the exact sums in ``printery cost --json`` and in
``printery_step_cost_total`` of the running service's ``/metrics``."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import textwrap
from pathlib import Path
from typing import Any

import redis
from prometheus_client.parser import text_string_to_metric_families

from printery.servers.process import ServerProcess
from printery.testing import unique_prefix
from support.service import spawn

# Only the public API, the way the README tells users to write a pipeline. Amounts are
# exact in binary floating point, so sums can be compared with ==.
COST_APP = textwrap.dedent(
    """
    from printery import Message, Output, Pipeline

    pipeline = Pipeline("costs", ingress=["doc"], cost_units=["tokens", "usd", "bytes"])


    @pipeline.step("summarize", consumes=["doc"], produces=["summary"],
                   cost_units=["tokens", "usd"])
    async def summarize(msg: Message) -> Output:
        n = msg.data["n"]
        msg.report_cost("tokens", 10 * n)
        msg.report_cost("usd", 0.25 * n)
        return Output("summary", {"n": n})


    @pipeline.step("publish", consumes=["summary"], produces=["published"],
                   cost_units=["bytes"])
    async def publish(msg: Message) -> Output:
        msg.report_cost("bytes", 100 * msg.data["n"])
        return Output("published", msg.data)
    """
)
DOCS = [1, 2, 3, 4, 5, 6]


def _step_cost(metrics_text: str) -> dict[tuple[str, str], float]:
    return {
        (sample.labels["worker"], sample.labels["unit"]): sample.value
        for family in text_string_to_metric_families(metrics_text)
        if family.name == "printery_step_cost"
        for sample in family.samples if sample.name == "printery_step_cost_total"
    }


def _cost_json(url: str, prefix: str, cwd: Path, *args: str) -> Any:
    env = {k: v for k, v in os.environ.items() if k not in ("REDIS_URL", "STREAM_PREFIX")}
    env["PRINTERY_APP"] = "costapp:pipeline"
    done = subprocess.run(
        [sys.executable, "-m", "printery.cli.operator", "--redis-url", url,
         "--stream-prefix", prefix, "cost", *args, "--json"],
        capture_output=True, text=True, timeout=60, env=env, cwd=cwd, check=False,
    )
    assert done.returncode == 0, done.stderr
    return json.loads(done.stdout)


def test_reported_costs_sum_exactly_in_cli_and_metrics(
    server: ServerProcess, tmp_path: Path
) -> None:
    (tmp_path / "costapp.py").write_text(COST_APP)
    prefix = unique_prefix("cost")
    r = redis.Redis.from_url(server.url, decode_responses=True)
    svc = spawn(["--redis-url", server.url, "--stream-prefix", prefix,
                 "--app", "costapp:pipeline"], cwd=tmp_path)
    try:
        for i, n in enumerate(DOCS):
            r.xadd(f"{prefix}:doc", {"data": json.dumps({"n": n}), "correlation_id": f"doc-{i}"})
        svc.wait_until(lambda: r.xlen(f"{prefix}:published") == len(DOCS),
                       what="every document published")
        total = sum(DOCS)
        expected = {
            ("summarize", "tokens"): 10.0 * total,
            ("summarize", "usd"): 0.25 * total,
            ("publish", "bytes"): 100.0 * total,
        }
        svc.wait_until(lambda: _step_cost(svc.get("/metrics").text) == expected,
                       what="printery_step_cost_total equal to the reported sums")

        summary = _cost_json(server.url, prefix, tmp_path)
        assert {name: step["cost"] for name, step in summary["steps"].items()} == {
            "summarize": {"tokens": 10 * total, "usd": 0.25 * total},
            "publish": {"bytes": 100 * total},
        }
        assert summary["steps"]["summarize"]["calls"] == len(DOCS)
        assert summary["total"]["cost"] == {"tokens": 10 * total, "usd": 0.25 * total,
                                            "bytes": 100 * total}
        one = _cost_json(server.url, prefix, tmp_path, "doc-3")
        assert one["steps"]["summarize"]["cost"] == {"tokens": 40, "usd": 1.0}
        assert one["steps"]["publish"]["cost"] == {"bytes": 400}
    finally:
        assert svc.stop() == 0, svc.log()
        r.close()
