"""The documentation table of the command-line settings (docs/reference.md, Commands).

Each setting's flag, env var, metavar, help and default, in ``--help`` order: what
``printery-workers --help`` is rendered from (:mod:`printery.cli.workers`) and the loader
names flags by (:mod:`printery.settings.config_load`). It is words about the settings, not their
rules, so it lives apart from :mod:`printery.settings.config`, which validates them. It does not
import the settings either: a default the table does not write is read from the
setting's own field (``default_of``), so each default is written once;
:data:`printery.settings.config.SETTINGS_DOC` is this table over :class:`~printery.settings.config.Settings`.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass

__all__ = ["SettingDoc", "settings_doc"]


@dataclass(frozen=True, slots=True)
class SettingDoc:
    """One command-line setting, for rendering ``--help`` with env var and default."""

    name: str
    flag: str
    env: str
    default: str
    help: str
    metavar: str | None = None  # None: a boolean switch

    @property
    def help_text(self) -> str:
        """``help`` plus env var and default, the way ``--help`` shows them."""
        return self.help_with_default(self.default)

    def help_with_default(self, default: str) -> str:
        """:attr:`help_text` with another default (one an application sets)."""
        return f"{self.help} [env: {self.env}; default: {default}]"


def settings_doc(default_of: Callable[[str], object]) -> dict[str, SettingDoc]:
    """Every command-line setting (docs/reference.md, Commands), in ``--help`` order,
    keyed by setting name; ``default_of(name)`` is the default of a setting whose row
    writes none."""

    def row(name: str, flag: str, env: str, metavar: str | None, help: str,
            default: str = "") -> SettingDoc:
        if not default:
            value = default_of(name)
            default = str(value).lower() if isinstance(value, bool) else str(value)
        return SettingDoc(name, flag, env, default, help, metavar)

    return {
        doc.name: doc
        for doc in (
            row("redis_url", "--redis-url", "REDIS_URL", "URL",
                "redis://, rediss://, unix://, redis+cluster:// or rediss+cluster:// URL; "
                "user and password allowed",
                "unset: embedded server"),
            row("log_level", "--log-level", "LOG_LEVEL", "LEVEL", "debug, info, warn or error"),
            row("environment", "--environment", "ENVIRONMENT", "ENV",
                "development, staging or production (of this service)"),
            row("worker", "--worker", "WORKER_MODE", "WORKERS",
                "all, or one or more worker names, comma-separated"),
            row("supervised", "--supervised", "SUPERVISED_MODE", None,
                "restart failed workers with backoff"),
            row("max_restarts", "--max-restarts", "MAX_RESTART_ATTEMPTS", "N",
                "restarts per worker before it is marked failed"),
            row("backoff_ms", "--backoff", "RESTART_BACKOFF_MS", "MS",
                "first restart delay; doubles per attempt, capped at 60 s, with jitter"),
            row("health_check_interval", "--health-check-interval", "HEALTH_CHECK_INTERVAL", "S",
                "seconds between supervisor health checks"),
            row("shutdown_timeout", "--shutdown-timeout", "SHUTDOWN_TIMEOUT", "S",
                "seconds to drain in-flight messages on shutdown"),
            row("exit_on_failure", "--exit-on-failure", "EXIT_ON_FAILURE", None,
                "in supervised mode, exit 1 once a worker is failed"),
            row("http_addr", "--http-addr", "HTTP_ADDR", "HOST:PORT",
                "health, status and metrics endpoint; off disables"),
            row("stream_prefix", "--stream-prefix", "STREAM_PREFIX", "PREFIX",
                "key prefix of every stream"),
            row("data_dir", "--data-dir", "PRINTERY_DATA_DIR", "DIR",
                "the embedded server's data", "./.printery"),
            row("app", "--app", "PRINTERY_APP", "MODULE:ATTR",
                "the pipeline to run: a Pipeline or a factory taking the settings",
                "the command's default app"),
            row("processes", "--processes", "PRINTERY_PROCESSES", "N",
                "worker processes to run"),
            row("api_token_env", "--api-token-env", "PRINTERY_API_TOKEN_ENV", "NAME",
                "name of the env var holding the bearer token of the HTTP API (/v1)"),
            SettingDoc("transport.partitions", "--partitions", "PRINTERY_PARTITIONS", "recorded",
                      "partitions of every stream (docs/reference.md, Partitions); unset: the "
                      "count recorded in <prefix>:layout (first start: 3 x masters on a "
                      "cluster, else 1)", "N"),
            SettingDoc("config", "--config", "PRINTERY_CONFIG", "none", "TOML config file", "FILE"),
        )
    }
