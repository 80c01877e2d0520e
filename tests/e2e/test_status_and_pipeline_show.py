"""What the operator sees is what runs: `pipeline show` gives the concurrency in effect
(config file included), and `printery status` counters are current within a second."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path
from typing import Any

import redis

from printery.servers.process import ServerProcess
from printery.testing import wait_for_sync
from support.service import base_env, spawn, started_entry


def operator(*args: str, env: dict[str, str] | None = None, cwd: Path | None = None) -> subprocess.CompletedProcess[str]:
    return subprocess.run([sys.executable, "-m", "printery.cli.operator", *args],
                          env=base_env(env), cwd=cwd, capture_output=True, text=True, timeout=60)


def test_pipeline_show_gives_the_concurrency_the_config_file_sets(tmp_path: Path) -> None:
    config = tmp_path / "printery.toml"
    config.write_text('[workers.health-monitor]\nconcurrency = 3\n\n[workers.dependency]\nconcurrency = 7\n')
    text = operator("--config", str(config), "pipeline", "show")
    assert text.returncode == 0, text.stderr
    assert "health-monitor x3:" in text.stdout
    assert "dependency-checker x7:" in text.stdout  # named by its alias in the file
    assert "notifier x5:" in text.stdout  # the step's own default where the file is silent
    by_env = operator("pipeline", "show", "--json", env={"PRINTERY_CONFIG": str(config)})
    steps = {s["name"]: s["concurrency"] for s in json.loads(by_env.stdout)["steps"]}
    assert steps["health-monitor"] == 3 and steps["dependency-checker"] == 7 and steps["validator"] == 1


def test_status_counters_are_current_within_a_second(server: ServerProcess, prefix: str,
                                                     tmp_path: Path) -> None:
    r = redis.Redis.from_url(server.url, decode_responses=True)
    service = spawn(["--redis-url", server.url, "--stream-prefix", prefix], cwd=tmp_path)
    try:
        def workers() -> dict[str, Any]:
            keys = list(r.scan_iter(f"{prefix}:process:*"))
            return json.loads(r.get(keys[0]) or "{}").get("workers", {}) if keys else {}

        wait_for_sync(workers, timeout=20, message="first heartbeat")
        r.xadd(f"{prefix}:deployment:started", started_entry("dep-status-1"))
        wait_for_sync(lambda: r.xlen(f"{prefix}:notification:sent"), timeout=30,
                      message="the deployment's notification")
        # The notifier's commit is done; its counter is in the registry at the next beat.
        wait_for_sync(lambda: workers().get("notifier", {}).get("processed") == 1, timeout=2.0,
                      interval=0.05, message="status counters current")
        result = operator("--redis-url", server.url, "--stream-prefix", prefix, "status", "--json",
                          cwd=tmp_path)
        [proc] = json.loads(result.stdout)
        assert proc["workers"]["validator"]["processed"] == 1
        assert proc["workers"]["notifier"]["processed"] == 1
    finally:
        assert service.stop() == 0
    assert os.path.exists(service.log_path)
