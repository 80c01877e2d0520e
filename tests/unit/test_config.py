"""Settings: precedence, validation and one-line errors (docs/reference.md, Commands;
Configuration)."""

from __future__ import annotations

from pathlib import Path

import pytest

from printery.base.errors import ConfigError
from printery.deploy.app import build_pipeline
from printery.deploy.settings import CONFIG as DEPLOY_APP
from printery.deploy.settings import (
    AggregatorSettings,
    DependencyCheckerSettings,
    HealthMonitorSettings,
    NotifierSettings,
    ValidatorSettings,
)
from printery.observe.redact import redact_url
from printery.settings.config import (
    SETTINGS_DOC,
    Settings,
    parse_http_addr,
)
from printery.settings.config_load import load_settings

WORKERS = ["validator", "dependency-checker", "health-monitor", "aggregator", "notifier"]


def load(flags: dict[str, object] | None = None, env: dict[str, str] | None = None) -> Settings:
    """Settings as ``printery-workers`` loads them for the default app (docs/reference.md,
    Commands; Configuration)."""
    return load_settings(flags or {}, env or {}, app=DEPLOY_APP, worker_names=WORKERS)


def config_error(flags: dict[str, object] | None = None, env: dict[str, str] | None = None) -> str:
    with pytest.raises(ConfigError) as info:
        load(flags, env)
    message = str(info.value)
    assert "\n" not in message
    return message


def write_config(tmp_path: Path, text: str) -> str:
    path = tmp_path / "printery.toml"
    path.write_text(text)
    return str(path)


def test_defaults_match_the_contract() -> None:
    settings = load()
    assert settings.redis_url is None
    assert settings.log_level == "info"
    assert settings.environment == "development"
    assert settings.worker == "all"
    assert settings.supervised is False
    assert (settings.max_restarts, settings.backoff_ms) == (3, 1000)
    assert (settings.health_check_interval, settings.shutdown_timeout) == (30, 30)
    assert settings.exit_on_failure is False
    assert settings.http_bind == ("127.0.0.1", 9464)
    assert settings.stream_prefix == "materi:events:deployment"
    assert settings.data_dir == Path(".printery")
    assert settings.app is None
    assert settings.processes == 1
    assert settings.transport.max_deliveries == 5
    assert settings.transport.visibility_timeout == 60
    assert settings.transport.payload_limit_bytes == 1_048_576
    assert settings.transport.inline_limit_bytes == 65_536
    assert settings.transport.blob_ttl == 604_800
    assert settings.table("validator", ValidatorSettings).approval_required == ("production",)
    assert settings.table("dependency_checker", DependencyCheckerSettings).probe_timeout == 5
    assert settings.table("health_monitor", HealthMonitorSettings).consecutive == 3
    assert settings.table("aggregator", AggregatorSettings).branch_deadline == 120
    notifier = settings.table("notifier", NotifierSettings)
    assert notifier.default_channels == ("log",)
    assert notifier.webhook_secret_env == "PRINTERY_WEBHOOK_SECRET"
    # Per-worker concurrency: each step's own, unless [workers.<name>] says otherwise.
    steps = build_pipeline().steps
    concurrency = {name: settings.concurrency(name, step.concurrency) for name, step in steps.items()}
    assert concurrency == {"validator": 1, "dependency-checker": 5, "health-monitor": 10,
                           "aggregator": 1, "notifier": 5}


@pytest.mark.parametrize(
    ("env", "setting"),
    [
        ({"REDIS_URL": "http://localhost:6379"}, "redis_url"),
        ({"REDIS_URL": "redis://localhost:notaport"}, "redis_url"),
        ({"REDIS_URL": "redis://localhost:6379/abc"}, "redis_url"),  # was db 0, silently
        ({"LOG_LEVEL": "verbose"}, "log_level"),
        ({"ENVIRONMENT": "prod"}, "environment"),
        ({"WORKER_MODE": "validator,nope"}, "worker"),
        ({"WORKER_MODE": "all,validator"}, "worker"),
        ({"WORKER_MODE": ","}, "worker"),
        ({"SUPERVISED_MODE": "maybe"}, "supervised"),
        ({"MAX_RESTART_ATTEMPTS": "-1"}, "max_restarts"),
        ({"MAX_RESTART_ATTEMPTS": "three"}, "max_restarts"),
        ({"RESTART_BACKOFF_MS": "0"}, "backoff_ms"),
        ({"RESTART_BACKOFF_MS": "1.5"}, "backoff_ms"),
        ({"HEALTH_CHECK_INTERVAL": "0"}, "health_check_interval"),
        ({"HEALTH_CHECK_INTERVAL": "nan"}, "health_check_interval"),
        ({"SHUTDOWN_TIMEOUT": "-1"}, "shutdown_timeout"),
        ({"EXIT_ON_FAILURE": "2"}, "exit_on_failure"),
        ({"HTTP_ADDR": "localhost:65536"}, "http_addr"),
        ({"HTTP_ADDR": "localhost"}, "http_addr"),
        ({"HTTP_ADDR": "::1:80"}, "http_addr"),
        ({"STREAM_PREFIX": "has space"}, "stream_prefix"),
        ({"STREAM_PREFIX": "glob*"}, "stream_prefix"),
        ({"PRINTERY_APP": "no-colon"}, "app"),
        ({"PRINTERY_PROCESSES": "0"}, "processes"),
    ],
)
def test_each_bad_env_value_names_setting_value_and_env_var(
    env: dict[str, str], setting: str
) -> None:
    message = config_error(env=env)
    (env_var, value), = env.items()
    assert message.startswith(f"invalid {setting} ({env_var}): ")
    assert repr(value) in message
    # "what is allowed" follows in parentheses
    assert message.endswith(")")


@pytest.mark.parametrize(
    ("flags", "expected"),
    [
        ({"max_restarts": -2}, "invalid max_restarts (--max-restarts): -2 (an integer >= 0)"),
        ({"backoff": 0}, "invalid backoff_ms (--backoff): 0 (an integer > 0)"),
        ({"log_level": "loud"}, "invalid log_level (--log-level): 'loud' (one of debug, info,"),
        ({"data_dir": ""}, "invalid data_dir (--data-dir): '' (a directory path)"),
    ],
)
def test_bad_flag_values_name_the_flag(flags: dict[str, object], expected: str) -> None:
    assert config_error(flags=flags).startswith(expected)


def test_redis_password_is_masked_in_the_error() -> None:
    message = config_error(env={"REDIS_URL": "redis://:hunter2@host:99999"})
    assert "hunter2" not in message
    assert "'redis://:***@host:99999'" in message
    message = config_error(env={"REDIS_URL": "http://admin:hunter2@host"})
    assert "hunter2" not in message and "admin:***@" in message


def test_password_masked_in_config_file_errors(tmp_path: Path) -> None:
    path = write_config(tmp_path, 'redis_password = "hunter2"\n')
    message = config_error(env={"PRINTERY_CONFIG": path})
    assert "hunter2" not in message and "'***'" in message
    path = write_config(tmp_path, '[notifier]\ndefault_channels = "webhook+https://u:pw@x/h"\n')
    message = config_error(env={"PRINTERY_CONFIG": path})
    assert "pw@" not in message and "u:***@x" in message


def test_redact_url() -> None:
    assert redact_url("redis://:secret@host:6379") == "redis://:***@host:6379"
    assert redact_url("rediss://user:p@ss@host/0") == "rediss://user:***@host/0"
    assert redact_url("redis://host:6379") == "redis://host:6379"
    assert redact_url("redis://host/0?password=secret&db=1") == "redis://host/0?password=***&db=1"
    assert redact_url("unix://:secret@/tmp/redis.sock") == "unix://:***@/tmp/redis.sock"


@pytest.mark.parametrize(
    ("text", "value"),
    [("true", True), ("FALSE", False), ("1", True), ("0", False), ("yes", True), ("No", False)],
)
def test_env_booleans(text: str, value: bool) -> None:
    settings = load(env={"SUPERVISED_MODE": text, "EXIT_ON_FAILURE": text})
    assert settings.supervised is value
    assert settings.exit_on_failure is value


def test_precedence_flag_over_env_over_file_over_default(tmp_path: Path) -> None:
    path = write_config(
        tmp_path,
        'max_restarts = 7\nbackoff_ms = 250\nlog_level = "debug"\n'
        'stream_prefix = "from-file"\n',
    )
    settings = load(
        flags={"config": path, "max_restarts": 9},
        env={"MAX_RESTART_ATTEMPTS": "8", "RESTART_BACKOFF_MS": "300"},
    )
    assert settings.max_restarts == 9  # flag
    assert settings.backoff_ms == 300  # env beats file
    assert settings.log_level == "debug"  # file beats default
    assert settings.stream_prefix == "from-file"
    assert settings.health_check_interval == 30  # default


def test_config_path_from_env_and_flag_wins(tmp_path: Path) -> None:
    a = write_config(tmp_path, "max_restarts = 1\n")
    b = tmp_path / "b.toml"
    b.write_text("max_restarts = 2\n")
    assert load(env={"PRINTERY_CONFIG": a}).max_restarts == 1
    assert load(flags={"config": str(b)}, env={"PRINTERY_CONFIG": a}).max_restarts == 2


def test_none_flags_are_not_given_and_empty_env_is_unset() -> None:
    settings = load(flags={"max_restarts": None, "redis_url": None}, env={"REDIS_URL": ""})
    assert settings.max_restarts == 3
    assert settings.redis_url is None


def test_unknown_flag_key_is_a_programming_error() -> None:
    with pytest.raises(TypeError):
        load(flags={"max_restart": 1})


@pytest.mark.parametrize(
    ("text", "setting"),
    [
        ("bogus = 1\n", "bogus"),
        ("[transport]\nmax_delivery = 5\n", "transport.max_delivery"),
        ("[workers.nobody]\nconcurrency = 2\n", "workers.nobody"),
        ("[workers.validator]\nthreads = 2\n", "workers.validator.threads"),
        ("[health_monitor]\nfrequency = 2\n", "health_monitor.frequency"),
        ("[review.approval]\ndeadline = 2\n", "review.approval.deadline"),
        ('[telemetry]\nendpoint = "http://collector:4318"\n', "telemetry.endpoint"),
    ],
)
def test_unknown_config_keys_are_rejected(tmp_path: Path, text: str, setting: str) -> None:
    message = config_error(env={"PRINTERY_CONFIG": write_config(tmp_path, text)})
    assert message.startswith(f"invalid {setting} (config file ")


@pytest.mark.parametrize(
    ("text", "expected"),
    [
        ("[transport]\nmax_deliveries = 0\n", "transport.max_deliveries"),
        ("[transport]\nvisibility_timeout = -1\n", "transport.visibility_timeout"),
        ("[workers.dependency]\nconcurrency = 0\n", "workers.dependency-checker.concurrency"),
        ('[validator]\napproval_required = ["prod"]\n', "validator.approval_required[0]"),
        ("[health_monitor]\nconsecutive = 0\n", "health_monitor.consecutive"),
        ("[notifier]\ndefault_channels = []\n", "notifier.default_channels"),
        ("max_restarts = true\n", "max_restarts"),
        ("supervised = 3\n", "supervised"),
        ("transport = 1\n", "transport"),
        ("[review.approval]\ntimeout = 0\n", "review.approval.timeout"),
        ('[review.approval]\ntimeout = "soon"\n', "review.approval.timeout"),
        ("[review.approval]\ntimeout = true\n", "review.approval.timeout"),
        ("review = 3\n", "review"),
        ('[telemetry]\notlp_endpoint = "collector:4318"\n', "telemetry.otlp_endpoint"),
        ('[telemetry]\notlp_endpoint = "grpc://collector:4317"\n', "telemetry.otlp_endpoint"),
        ("[telemetry]\notlp_endpoint = 4318\n", "telemetry.otlp_endpoint"),
        ("[console]\nsession_ttl = 0\n", "console.session_ttl"),
        ('[console]\nsession_ttl = "12h"\n', "console.session_ttl"),
        ("[console]\nsessions = 1\n", "console.sessions"),
    ],
)
def test_bad_config_file_values(tmp_path: Path, text: str, expected: str) -> None:
    message = config_error(env={"PRINTERY_CONFIG": write_config(tmp_path, text)})
    assert message.startswith(f"invalid {expected} (config file ")


def test_a_file_value_a_flag_overrides_is_still_checked(tmp_path: Path) -> None:
    """It was not (found by a hostile run): the file broke the day the flag was dropped."""
    path = write_config(tmp_path, "redis_url = 5\n")
    with pytest.raises(ConfigError) as info:
        load(flags={"config": path, "redis_url": "redis://localhost:6379/0"})
    assert str(info.value).startswith(f"invalid redis_url (config file {path})")
    assert load(flags={"config": write_config(tmp_path, 'redis_url = "redis://a:1"\n'),
                       "redis_url": "redis://b:2"}).redis_url == "redis://b:2"


def test_a_default_channel_notify_would_refuse_is_a_bad_setting(tmp_path: Path) -> None:
    """It was accepted, and every deployment then notified nobody (a log line each)."""
    message = config_error(env={"PRINTERY_CONFIG": write_config(
        tmp_path, '[notifier]\ndefault_channels = ["log", "ftp://nowhere"]\n')})
    assert message.startswith("invalid notifier.default_channels (config file ")
    assert "unknown channel 'ftp://nowhere': expected 'log'" in message


def test_review_deadlines_per_kind(tmp_path: Path) -> None:
    path = write_config(tmp_path, "[review.approval]\ntimeout = 90\n[review.other]\n")
    settings = load_settings({"config": path}, {}, app=DEPLOY_APP)
    assert settings.review_timeouts() == {"approval": 90.0}
    assert load_settings({}, {}).review_timeouts() == {}


def test_config_file_tables_and_aliases(tmp_path: Path) -> None:
    path = write_config(
        tmp_path,
        '[workers.health]\nconcurrency = 4\nprefetch = 20\n'
        '[notifier]\nallow_hosts = ["hooks.example"]\n'
        '[transport]\nclaim_interval = 5\nretention = 100000\n',
    )
    settings = load(env={"PRINTERY_CONFIG": path})
    assert settings.concurrency("health-monitor", 10) == 4
    assert settings.workers["health-monitor"].prefetch == 20
    assert settings.table("notifier", NotifierSettings).allow_hosts == ("hooks.example",)
    assert settings.transport.claim_interval == 5
    assert settings.transport.retention == 100_000


def test_telemetry_table(tmp_path: Path) -> None:
    """``[telemetry] otlp_endpoint`` (docs/reference.md, Tracing): unset by default
    (tracing off)."""
    assert load().telemetry.otlp_endpoint is None
    path = write_config(tmp_path, '[telemetry]\notlp_endpoint = " http://collector:4318 "\n')
    assert load(env={"PRINTERY_CONFIG": path}).telemetry.otlp_endpoint == "http://collector:4318"


def test_missing_and_unparsable_config_files(tmp_path: Path) -> None:
    missing = str(tmp_path / "absent.toml")
    message = config_error(flags={"config": missing})
    assert message.startswith(f"invalid config (--config): {missing!r} (a readable TOML file")
    broken = write_config(tmp_path, "max_restarts = [\n")
    message = config_error(env={"PRINTERY_CONFIG": broken})
    assert message.startswith(f"invalid config (PRINTERY_CONFIG): {broken!r} (valid TOML")


def test_worker_selection_and_aliases() -> None:
    settings = load(env={"WORKER_MODE": "notifier, dependency,health"})
    assert settings.worker == "notifier,dependency-checker,health-monitor"
    selected = settings.selected_workers(WORKERS)
    assert selected == ["dependency-checker", "health-monitor", "notifier"]
    assert load().selected_workers(WORKERS) == WORKERS
    with pytest.raises(ConfigError, match="invalid worker"):
        Settings(worker="ghost").selected_workers(WORKERS)


def test_case_insensitive_levels_and_environments() -> None:
    settings = load(env={"LOG_LEVEL": "WARNING", "ENVIRONMENT": "Production"})
    assert (settings.log_level, settings.environment) == ("warn", "production")


def test_parse_http_addr() -> None:
    assert parse_http_addr("127.0.0.1:9464") == ("127.0.0.1", 9464)
    assert parse_http_addr("[::1]:0") == ("::1", 0)
    assert parse_http_addr(":80") == ("0.0.0.0", 80)
    assert parse_http_addr("OFF") is None
    for bad in ("host", "host:-1", "host:99999", "::1:80", "a b:80"):
        with pytest.raises(ValueError):
            parse_http_addr(bad)


def test_secrets_for_log_redaction() -> None:
    settings = load(env={"REDIS_URL": "redis://:pw1@localhost:6379/0"})
    assert settings.redacted_redis_url == "redis://:***@localhost:6379/0"
    assert settings.secrets({"PRINTERY_WEBHOOK_SECRET": "hmac"}) == ["pw1", "hmac"]
    # A password in the query (as redis-py takes it) is a secret string as well, so it is
    # masked wherever it appears, not only inside the URL.
    in_query = load(env={"REDIS_URL": "redis://localhost:6379/0?password=pw2&db=1"})
    assert in_query.secrets({}) == ["pw2"]
    assert "pw2" not in in_query.redacted_redis_url


def test_settings_doc_covers_every_command_line_setting() -> None:
    assert set(SETTINGS_DOC) == {
        "redis_url", "log_level", "environment", "worker", "supervised", "max_restarts",
        "backoff_ms", "health_check_interval", "shutdown_timeout", "exit_on_failure",
        "http_addr", "stream_prefix", "data_dir", "app", "processes", "config",
        "api_token_env", "transport.partitions",
    }
    doc = SETTINGS_DOC["max_restarts"]
    assert (doc.flag, doc.env, doc.default) == ("--max-restarts", "MAX_RESTART_ATTEMPTS", "3")
    assert doc.help_text.endswith("[env: MAX_RESTART_ATTEMPTS; default: 3]")
    assert SETTINGS_DOC["supervised"].metavar is None
    assert SETTINGS_DOC["supervised"].default == "false"
    assert SETTINGS_DOC["http_addr"].default == "127.0.0.1:9464"


def test_console_table(tmp_path: Path) -> None:
    """``[console] session_ttl`` (docs/reference.md, The web console): 12 hours unless
    the config file says otherwise."""
    assert load().console.session_ttl == 43_200
    path = write_config(tmp_path, "[console]\nsession_ttl = 900\n")
    assert load(env={"PRINTERY_CONFIG": path}).console.session_ttl == 900
