"""The one redaction rule set (``printery.observe.redact``): every case the logs, the settings'
errors, the operator's output and the deployment app's events rely on."""

from __future__ import annotations

import pytest

from printery.observe.redact import Redactor, is_secret_key, redact_text, redact_url


@pytest.mark.parametrize(
    ("text", "shown"),
    [
        # URL passwords; user names kept (Redis ACL users are not secret).
        ("redis://:secret@host:6379", "redis://:***@host:6379"),
        ("rediss://user:p@ss@host/0", "rediss://user:***@host/0"),  # '@' in the password
        ("unix://:secret@/tmp/redis.sock", "unix://:***@/tmp/redis.sock"),
        ("webhook+https://u:pw@hooks/x", "webhook+https://u:***@hooks/x"),
        ("redis://host:6379", "redis://host:6379"),
        ("redis://user@host", "redis://user@host"),
        # Secret query arguments, any case; others untouched.
        ("redis://host/0?password=secret&db=1", "redis://host/0?password=***&db=1"),
        ("https://h/x?TOKEN=t1&v=1&api_key=k#frag", "https://h/x?TOKEN=***&v=1&api_key=***#frag"),
        ("https://h/x?pass=a&pwd=b&sig=c&key=d", "https://h/x?pass=***&pwd=***&sig=***&key=***"),
        ("https://h/x?monkey=1&keys=2", "https://h/x?monkey=1&keys=2"),
        # In free text and JSON documents: each URL on its own.
        ("lost redis://:pw@db then http://x@y", "lost redis://:***@db then http://x@y"),
        ('{"a":"redis://:pw@h","b":"me@example.com"}', '{"a":"redis://:***@h","b":"me@example.com"}'),
        ("no url here: a@b c=d", "no url here: a@b c=d"),
    ],
)
def test_text_rules(text: str, shown: str) -> None:
    assert redact_text(text) == shown
    assert redact_url(text) == shown


@pytest.mark.parametrize(
    ("url", "shown"),
    [
        ("https://user:pw@hooks.example.com/x", "https://***@hooks.example.com/x"),
        ("https://tok3n@hooks.example.com/x", "https://***@hooks.example.com/x"),
        ("https://a:p@ss@h/x?token=abc&v=1", "https://***@h/x?token=***&v=1"),
        ("http://u:p@[::1/x", "http://***@[::1/x"),  # malformed, still scrubbed
        ("http://127.0.0.1:9000/hooks", "http://127.0.0.1:9000/hooks"),
    ],
)
def test_user_info_masked_whole_for_outside_urls(url: str, shown: str) -> None:
    assert redact_url(url, keep_user=False) == shown


@pytest.mark.parametrize(
    ("key", "secret"),
    [
        ("password", True), ("redis_password", True), ("notifier.webhook_secret", True),
        ("token", True), ("Authorization", True), ("api_key", True), ("apikey", True),
        ("credentials", True), ("tokens", False), ("webhook_secret_env", False),
        ("idempotency_key", False), ("key", False), ("passage", False),
    ],
)
def test_secret_keys(key: str, secret: bool) -> None:
    assert is_secret_key(key) is secret


def test_redactor_masks_configured_secrets_longest_first_and_nested_values() -> None:
    redactor = Redactor(["abc", "abcdef", ""])
    assert redactor.text("xx abcdef yy abc") == "xx *** yy ***"
    value = {"url": "redis://:pw@h", "password": "plain", "list": ("abc", 3, None),
             "empty_token": "", "n": 1.5}
    assert redactor.scrub(value) == {"url": "redis://:***@h", "password": "***",
                                     "list": ["***", 3, None], "empty_token": "", "n": 1.5}
    events = {"event": "abcdef", "_record": "abc", "secret": None}
    assert redactor(None, "info", events) == {"event": "***", "_record": "abc", "secret": None}
