"""Logging: JSON lines off a terminal, console on one, secrets never printed."""

from __future__ import annotations

import io
import json
import logging
from collections.abc import Iterator

import pytest
import structlog

from printery.observe.logging import configure_logging, get_logger
from printery.observe.redact import Redactor


class FakeTty(io.StringIO):
    def isatty(self) -> bool:
        return True


@pytest.fixture(autouse=True)
def _reset_logging() -> Iterator[None]:
    yield
    structlog.reset_defaults()
    root = logging.getLogger()
    for handler in [h for h in root.handlers if h.get_name() == "printery"]:
        root.removeHandler(handler)


def lines(stream: io.StringIO) -> list[dict[str, object]]:
    return [json.loads(line) for line in stream.getvalue().splitlines()]


def test_json_lines_when_not_a_tty() -> None:
    out = io.StringIO()
    configure_logging("info", stream=out)
    get_logger("printery.test").info("started", workers=3)
    (record,) = lines(out)
    assert record["event"] == "started"
    assert record["workers"] == 3
    assert record["level"] == "info"
    assert record["logger"] == "printery.test"
    timestamp = str(record["timestamp"])
    assert timestamp.endswith("Z") and "T" in timestamp


def test_console_format_on_a_tty() -> None:
    out = FakeTty()
    configure_logging("info", stream=out)
    get_logger("x").info("hello", answer=42)
    text = out.getvalue()
    assert "hello" in text and "answer" in text
    with pytest.raises(json.JSONDecodeError):
        json.loads(text)


def test_level_filters_and_warn_alias() -> None:
    out = io.StringIO()
    configure_logging("warn", stream=out)
    log = get_logger("x")
    log.info("dropped")
    log.warning("kept")
    assert [r["event"] for r in lines(out)] == ["kept"]
    with pytest.raises(ValueError):
        configure_logging("loud", stream=out)


def test_secrets_and_url_passwords_are_redacted_everywhere() -> None:
    out = io.StringIO()
    configure_logging("debug", json=True, secrets=["s3cr3t-token"], stream=out)
    log = get_logger("x")
    log.info(
        "connecting to redis://:hunter2@db:6379",
        url="rediss://app:hunter2@db:6380/0",
        nested={"channels": ["webhook+https://u:pw@hooks/x"], "password": "plain"},
        note="header was s3cr3t-token",
    )
    try:
        raise RuntimeError("cannot reach redis://:hunter2@db with s3cr3t-token")
    except RuntimeError:
        log.exception("failed")
    text = out.getvalue()
    for secret in ("hunter2", "s3cr3t-token", ":pw@", "plain"):
        assert secret not in text
    first, second = lines(out)
    assert first["event"] == "connecting to redis://:***@db:6379"
    assert first["url"] == "rediss://app:***@db:6380/0"
    assert first["nested"] == {"channels": ["webhook+https://u:***@hooks/x"], "password": "***"}
    assert first["note"] == "header was ***"
    assert "RuntimeError: cannot reach redis://:***@db with ***" in str(second["exception"])


def test_stdlib_records_share_format_and_redaction() -> None:
    out = io.StringIO()
    configure_logging("info", json=True, secrets=["topsecret"], stream=out)
    logging.getLogger("aiohttp.server").warning("lost %s", "redis://:topsecret@h")
    (record,) = lines(out)
    assert record["event"] == "lost redis://:***@h"
    assert record["logger"] == "aiohttp.server"
    assert record["level"] == "warning"


def test_reconfiguring_replaces_the_root_handler() -> None:
    configure_logging("info", stream=io.StringIO())
    configure_logging("info", stream=io.StringIO())
    ours = [h for h in logging.getLogger().handlers if h.get_name() == "printery"]
    assert len(ours) == 1


def test_logger_made_at_import_time_follows_later_configuration() -> None:
    early = get_logger("early")
    out = io.StringIO()
    configure_logging("info", stream=out)
    early.info("late")
    assert lines(out)[0]["logger"] == "early"


def test_default_stream_is_stderr(capsys: pytest.CaptureFixture[str]) -> None:
    configure_logging("info")
    get_logger("x").info("to stderr")
    captured = capsys.readouterr()
    assert captured.out == ""
    assert json.loads(captured.err)["event"] == "to stderr"


def test_redactor_masks_longest_secret_first() -> None:
    redactor = Redactor(["abc", "abcdef", ""])
    assert redactor.text("xx abcdef yy abc") == "xx *** yy ***"
