"""The files people deploy with are read the way Docker, Compose, Kubernetes and systemd
read them, and the command line and environment they give is run for real (against the
session's server, or the embedded one) until the service is ready. Docker itself is not
needed: what the image would run is run here from this checkout's virtualenv."""

from __future__ import annotations

import json
import re
import shlex
import shutil
import subprocess
import sys
from collections.abc import Iterator, Mapping, Sequence
from pathlib import Path
from typing import Any

import httpx
import pytest
import redis
import yaml

from printery.servers.process import ServerProcess, free_port
from printery.testing import wait_for_sync
from support.service import ServiceHandle, base_env

ROOT = Path(__file__).resolve().parents[2]
BIN = Path(sys.executable).parent


# -- reading the files ---------------------------------------------------------------------------

def dockerfile() -> list[tuple[str, str]]:
    """(INSTRUCTION, arguments) of the final stage, continuation lines joined."""
    text = re.sub(r"\\\n", " ", (ROOT / "Dockerfile").read_text())
    instructions = []
    for line in text.splitlines():
        line = line.strip()
        if line and not line.startswith("#"):
            word, _, rest = line.partition(" ")
            if word.upper() == "FROM":
                instructions = []  # a new stage: only the last one is the image
            instructions.append((word.upper(), rest.strip()))
    return instructions


def docker_env(instructions: Sequence[tuple[str, str]]) -> dict[str, str]:
    env: dict[str, str] = {}
    for word, rest in instructions:
        if word == "ENV":
            env.update(item.split("=", 1) for item in shlex.split(rest))  # type: ignore[misc]
    return env


def docker_argv(instructions: Sequence[tuple[str, str]]) -> list[str]:
    exec_form = {w: json.loads(rest) for w, rest in instructions if w in ("ENTRYPOINT", "CMD")}
    return [*exec_form["ENTRYPOINT"], *exec_form.get("CMD", [])]


def unit() -> dict[str, list[str]]:
    """Key -> every value, of the systemd unit (keys repeat, as Environment= does)."""
    values: dict[str, list[str]] = {}
    for line in (ROOT / "deploy/systemd/printery-workers.service").read_text().splitlines():
        if "=" in line and not line.startswith(("#", "[")):
            key, _, value = line.partition("=")
            values.setdefault(key.strip(), []).append(value.strip())
    return values


def k8s_container() -> tuple[dict[str, Any], dict[str, Any]]:
    docs = list(yaml.safe_load_all((ROOT / "deploy/kubernetes/printery.yaml").read_text()))
    [deployment] = [d for d in docs if d and d["kind"] == "Deployment"]
    [container] = deployment["spec"]["template"]["spec"]["containers"]
    return deployment, container


def seconds(value: str | int) -> float:
    text = str(value)
    return float(text[:-1]) * (60 if text.endswith("m") else 1) if text[-1] in "sm" else float(text)


# -- running what they say -----------------------------------------------------------------------

class Launch:
    """Runs a deploy file's command line with its environment, adapted to the test only
    where it must be: the executable from this virtualenv, a free loopback port, a
    temporary data dir, the test's server and stream prefix."""

    def __init__(self, tmp_path: Path, prefix: str) -> None:
        self.tmp_path, self.prefix = tmp_path, prefix
        self.started: list[ServiceHandle] = []

    def start(self, argv: Sequence[str], env: Mapping[str, str], redis_url: str | None) -> ServiceHandle:
        executable = BIN / Path(argv[0]).name
        assert executable.exists(), f"{argv[0]} is not a printery command"
        port = free_port()
        data_dir = self.tmp_path / f"data-{len(self.started)}"
        run_env = {**env, "HTTP_ADDR": f"127.0.0.1:{port}", "PRINTERY_DATA_DIR": str(data_dir),
                   "STREAM_PREFIX": self.prefix}
        if redis_url is not None:
            run_env["REDIS_URL"] = redis_url
        log_path = self.tmp_path / f"service-{len(self.started)}.log"
        with open(log_path, "wb") as out:
            proc = subprocess.Popen([str(executable), *argv[1:]], env=base_env(run_env),
                                    cwd=self.tmp_path, stdout=out, stderr=subprocess.STDOUT)
        handle = ServiceHandle(proc, f"http://127.0.0.1:{port}", log_path)
        self.started.append(handle)
        return handle

    def ready(self, handle: ServiceHandle) -> None:
        handle.wait_http(30)
        handle.wait_until(lambda: handle.get("/readyz").status_code == 200, timeout=30,
                          what="/readyz 200")

    def stop_all(self) -> None:
        for handle in self.started:
            assert handle.stop() == 0, handle.log()


@pytest.fixture
def launch(tmp_path: Path, prefix: str) -> Iterator[Launch]:
    launcher = Launch(tmp_path, prefix)
    try:
        yield launcher
    finally:
        for handle in launcher.started:
            handle.kill()


def registered(server: ServerProcess, prefix: str) -> int:
    return len(list(redis.Redis.from_url(server.url).scan_iter(f"{prefix}:process:*")))


# -- the files -----------------------------------------------------------------------------------

def test_license_is_the_mit_license_the_package_declares() -> None:
    assert 'license = "MIT"' in (ROOT / "pyproject.toml").read_text()
    assert (ROOT / "LICENSE").read_text().startswith("MIT License")


def test_dockerfile_runs_non_root_on_an_external_server_and_on_the_embedded_one(
        launch: Launch, server: ServerProcess, prefix: str) -> None:
    image = dockerfile()
    users = [rest for word, rest in image if word == "USER"]
    assert users and users[-1].split(":")[0] not in ("root", "0"), "the image runs as root"
    env = docker_env(image)
    exposed = [rest for word, rest in image if word == "EXPOSE"]
    assert exposed == [env["HTTP_ADDR"].rsplit(":", 1)[1]]
    assert "REDIS_URL" not in env, "unset by default: the embedded server"
    argv = docker_argv(image)

    external = launch.start(argv, env, server.url)
    launch.ready(external)
    assert external.json("/status")["redis"]["connected"] is True
    embedded = launch.start(argv, env, None)
    launch.ready(embedded)
    assert "embedded" in embedded.log()
    launch.stop_all()


def test_compose_file_runs_two_replicas_of_the_service_on_redis(
        launch: Launch, server: ServerProcess, prefix: str) -> None:
    compose = yaml.safe_load((ROOT / "compose.yaml").read_text())
    services = compose["services"]
    service = services["printery-workers"]
    assert service["deploy"]["replicas"] == 2
    assert service["environment"]["REDIS_URL"].startswith("redis://redis:")
    assert "redis" in services and "redis" in service["depends_on"]
    assert "/readyz" in " ".join(service["healthcheck"]["test"])
    env = {**docker_env(dockerfile()), **{k: str(v) for k, v in service["environment"].items()}}
    assert seconds(service["stop_grace_period"]) > float(env["SHUTDOWN_TIMEOUT"])
    # The image's entrypoint with the service's command, as Compose runs it.
    argv = [*json.loads(dict(dockerfile())["ENTRYPOINT"]), *service["command"]]

    replicas = [launch.start(argv, env, server.url) for _ in range(service["deploy"]["replicas"])]
    for replica in replicas:
        launch.ready(replica)
    wait_for_sync(lambda: registered(server, prefix) == 2, timeout=10, message="both replicas registered")
    launch.stop_all()


def test_kubernetes_deployment_probes_grace_period_and_command(
        launch: Launch, server: ServerProcess) -> None:
    deployment, container = k8s_container()
    pod = deployment["spec"]["template"]["spec"]
    env = {e["name"]: e.get("value", "") for e in container["env"]}
    assert container["livenessProbe"]["httpGet"]["path"] == "/healthz"
    assert container["readinessProbe"]["httpGet"]["path"] == "/readyz"
    ports = {p["name"]: p["containerPort"] for p in container["ports"]}
    for probe in ("livenessProbe", "readinessProbe"):
        assert ports[container[probe]["httpGet"]["port"]] == int(env["HTTP_ADDR"].rsplit(":", 1)[1])
    assert pod["terminationGracePeriodSeconds"] > float(env["SHUTDOWN_TIMEOUT"])
    assert pod["securityContext"]["runAsNonRoot"] is True
    assert next(e for e in container["env"] if e["name"] == "REDIS_URL")["valueFrom"]["secretKeyRef"]

    handle = launch.start([*container["command"], *container["args"]], env, server.url)
    launch.ready(handle)
    assert httpx.get(handle.http_base + "/healthz", timeout=5).json() == {"status": "ok"}
    launch.stop_all()


def test_systemd_unit_verifies_and_its_exec_start_runs(
        launch: Launch, server: ServerProcess, tmp_path: Path) -> None:
    values = unit()
    env = dict(item.split("=", 1) for item in values["Environment"])
    assert seconds(values["TimeoutStopSec"][0]) > float(env["SHUTDOWN_TIMEOUT"])
    assert values["KillMode"] == ["mixed"], "SIGTERM to printery-workers only, not its server"
    assert values["User"] != ["root"]
    [exec_start] = values["ExecStart"]
    argv = shlex.split(exec_start)

    analyze = shutil.which("systemd-analyze")
    if analyze is not None:
        # Verified as written, but with ExecStart pointing at this checkout's command.
        copy = tmp_path / "units" / "printery-workers.service"
        copy.parent.mkdir()
        source = (ROOT / "deploy/systemd/printery-workers.service").read_text()
        copy.write_text(source.replace(argv[0], str(BIN / Path(argv[0]).name)))
        verify = subprocess.run([analyze, "verify", str(copy)], capture_output=True, text=True,
                                timeout=60)
        assert verify.returncode == 0 and not verify.stderr.strip(), verify.stderr

    handle = launch.start(argv, env, server.url)
    launch.ready(handle)
    launch.stop_all()
