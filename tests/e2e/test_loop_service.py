"""A validation loop under ``printery-workers --app`` (docs/reference.md, Validation
loops): the process is killed (SIGKILL, by its own worker) in the middle of attempt 2;
another process takes the entry over once its lease expires, and the run ends with exactly
one entry per attempt and verdict, attempt 3 seeing exactly attempts 1 and 2 as its
feedback."""

from __future__ import annotations

import json
import signal
import textwrap
from pathlib import Path

import redis

from printery.servers.process import ServerProcess
from printery.testing import unique_prefix
from support.operator_cli import cli_sync
from support.service import spawn

APP = textwrap.dedent(
    """
    import os
    import pathlib
    import signal

    from printery import Loop, Message, Pipeline, Reason

    MARK = pathlib.Path(os.environ["LOOP_MARK"])
    pipeline = Pipeline("killed", ingress=["request"])


    async def work(message: Message) -> dict:
        if message.attempt == 2 and not MARK.exists():
            MARK.write_text(str(os.getpid()))
            os.kill(os.getpid(), signal.SIGKILL)
        return {"text": f"draft {message.attempt}"}


    def validate(message: Message) -> list:
        text = message.data["text"]
        return [] if text == "draft 3" else [Reason("not_yet", "text", text)]


    pipeline.add(Loop("draft", consumes="request", produces="answer", work=work,
                      validate=validate, max_attempts=3))
    """
)


def test_a_process_killed_mid_loop_loses_and_repeats_no_attempt(
    server: ServerProcess, tmp_path: Path
) -> None:
    (tmp_path / "loopapp.py").write_text(APP)
    (tmp_path / "fast.toml").write_text("[transport]\nvisibility_timeout = 1\n")
    mark = tmp_path / "killed-once"
    prefix = unique_prefix("loop-kill")
    args = ["--redis-url", server.url, "--stream-prefix", prefix, "--app", "loopapp:pipeline",
            "--config", str(tmp_path / "fast.toml")]
    env = {"LOOP_MARK": str(mark)}
    r = redis.Redis.from_url(server.url, decode_responses=True)
    first = spawn(args, env=env, cwd=tmp_path)
    second = None
    try:
        r.xadd(f"{prefix}:request", {"data": json.dumps({"correlation_id": "run-1", "q": "?"})})
        assert first.wait(timeout=30) == -signal.SIGKILL
        assert mark.read_text() == str(first.pid)
        assert r.xlen(f"{prefix}:answer") == 0
        second = spawn(args, env=env, cwd=tmp_path)
        second.wait_until(lambda: r.xlen(f"{prefix}:answer") == 1, timeout=30, what="the answer")
        loop = [fields for _, fields in r.xrange(f"{prefix}:draft:loop")]
        kinds = [(f["type"], json.loads(f["data"])["attempt"]) for f in loop]
        assert kinds == [("draft:attempt", 1), ("draft:verdict", 1), ("draft:attempt", 2),
                         ("draft:verdict", 2), ("draft:attempt", 3), ("draft:verdict", 3)]
        third = json.loads(loop[4]["data"])
        assert third["feedback"] == [
            {"attempt": n, "data": {"text": f"draft {n}"},
             "reasons": [{"code": "not_yet", "field": "text", "message": f"draft {n}"}]}
            for n in (1, 2)]
        ((_, answer),) = r.xrange(f"{prefix}:answer")
        assert json.loads(answer["data"]) == {"text": "draft 3"}

        # The operator sees the loop: drawn by `pipeline show`, each entry in `trace`.
        def printery(*argv: str) -> str:
            done = cli_sync(server.url, prefix, "--app", "loopapp:pipeline", *argv,
                            cwd=str(tmp_path), env=env)
            assert done.returncode == 0, done.stderr
            return done.stdout

        assert "loop: validated, up to 3 attempts with feedback; then draft:exhausted" in (
            printery("pipeline", "show"))
        assert 'draft -->|"retry with feedback, at most 3"| draft' in printery(
            "pipeline", "show", "--mermaid")
        trace = printery("trace", "run-1")
        assert "draft:verdict #2 retry" in trace and "draft:verdict #3 passed" in trace
        # Replayed from the loop, it starts afresh: attempt 1, no feedback.
        replayed = json.loads(printery("replay", "run-1", "--from", "draft", "--json"))
        new_id = replayed["new_id"]
        second.wait_until(lambda: r.xlen(f"{prefix}:answer") == 2, timeout=30, what="replayed")
        again = [json.loads(f["data"]) for _, f in r.xrange(f"{prefix}:draft:loop")
                 if f["correlation_id"] == new_id and f["type"] == "draft:attempt"]
        assert (again[0]["attempt"], again[0]["feedback"]) == (1, [])
        assert [a["attempt"] for a in again] == [1, 2, 3]
    finally:
        if second is not None:
            assert second.stop() == 0
        first.kill()
        r.close()
