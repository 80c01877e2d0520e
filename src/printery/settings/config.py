"""Settings of the service and the operator tool (docs/reference.md, Commands;
Configuration).

Every setting comes from, in order of precedence, a command-line flag, an environment
variable, the TOML config file, or its default, and the whole set is validated here,
before anything connects: a bad value is a :class:`~printery.base.errors.ConfigError` whose
message is one line naming the setting (and where it came from), the value with secrets
shown as ``***``, and what is allowed. The CLI turns that into exit status 2.

The framework's settings know nothing of any application. An application declares what
it adds with an :class:`AppConfig` attached to its ``--app`` target: its own TOML tables
(pydantic models, validated here with the same one-line errors), defaults of framework
settings it wants different, other names for its workers, and the env vars holding its
secrets. Loading is two passes over the same inputs: the first, before the app is known,
validates the framework's settings and sets unknown top-level tables aside (it is how
``app`` is found); the second validates everything again with the app's
:class:`AppConfig`. Both happen before anything connects.

Choices where the contract is silent: an environment variable set to the empty string
counts as unset (so ``REDIS_URL=`` in a compose file means "embedded server"); log level
and environment are case-insensitive (``warning`` is taken as ``warn``); relative paths
are relative to the working directory, not to the config file.
"""

from __future__ import annotations

import re
from collections.abc import Callable, Collection, Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Annotated, Literal, TypeVar
from urllib.parse import parse_qs, urlsplit

from pydantic import BaseModel, BeforeValidator, Field, PrivateAttr, ValidationInfo, field_validator
from pydantic_core import PydanticCustomError

from printery.base.errors import ConfigError
from printery.observe.redact import redact_url
from printery.settings.config_doc import SettingDoc, settings_doc
from printery.settings.config_tables import (
    ConsoleSettings,
    ReviewSettings,
    SettingsTable,
    TelemetrySettings,
    TransportSettings,
    WorkerSettings,
    not_allowed,
)
from printery.transport.connection import CLUSTER_SCHEMES, cluster_nodes
from printery.wire.keys import StreamKeys

__all__ = [
    "SETTINGS_DOC",
    "AppConfig",
    "ConsoleSettings",
    "ReviewSettings",
    "SettingDoc",
    "Settings",
    "SettingsTable",
    "TelemetrySettings",
    "TransportSettings",
    "WorkerSettings",
    "parse_http_addr",
]

M = TypeVar("M", bound=BaseModel)
T = TypeVar("T")

def parse_http_addr(addr: str) -> tuple[str, int] | None:
    """Parse ``HOST:PORT`` (``[::1]:PORT`` for IPv6) into ``(host, port)``; ``off`` -> None.

    An empty host (``:9464``) means every interface, as in Go's ``net.Listen``; port 0
    asks the OS for a free port. Raises ``ValueError`` naming what is allowed.
    """
    text = addr.strip()
    if text.lower() == "off":
        return None
    allowed = "HOST:PORT with port 0-65535, [IPv6]:PORT, or off"
    host, sep, port_text = text.rpartition(":")
    if not sep or not (port_text.isascii() and port_text.isdigit()) or int(port_text) > 65535:
        raise ValueError(allowed)
    if host.startswith("[") and host.endswith("]"):
        host = host[1:-1]
    if ":" in host and not text.startswith("["):
        raise ValueError(allowed)  # a bare IPv6 address is ambiguous without brackets
    if any(ch.isspace() or ch in "[]/@" for ch in host):
        raise ValueError(allowed)
    return (host or "0.0.0.0", int(port_text))


_TRUE = {"true", "1", "yes"}
_FALSE = {"false", "0", "no"}


def _to_bool(value: object) -> object:
    """Booleans from env and flags: true/false/1/0/yes/no, any case (docs/reference.md,
    Commands)."""
    if isinstance(value, bool):
        return value
    if isinstance(value, int) and value in (0, 1):
        return bool(value)
    if isinstance(value, str):
        word = value.strip().lower()
        if word in _TRUE:
            return True
        if word in _FALSE:
            return False
    raise not_allowed("true or false (also 1/0, yes/no)")


def _lower(value: object) -> object:
    return value.strip().lower() if isinstance(value, str) else value


Bool = Annotated[bool, BeforeValidator(_to_bool)]
LogLevel = Literal["debug", "info", "warn", "error"]
Environment = Literal["development", "staging", "production"]


_APP = re.compile(r"^[A-Za-z_]\w*(\.[A-Za-z_]\w*)*:[A-Za-z_]\w*(\.[A-Za-z_]\w*)*$")
_REDIS_SCHEMES = ("redis", "rediss", "unix", *CLUSTER_SCHEMES)
# Where an AppConfig is attached to its target (a factory or a Pipeline).
_APP_CONFIG_ATTR = "__printery_app_config__"


@dataclass(frozen=True)
class AppConfig:
    """What an application adds to printery's settings; attach it to the ``--app`` target.

    - ``tables``: the application's own top-level TOML tables, name -> pydantic model
      (subclass :class:`SettingsTable`: unknown keys are errors). They are validated with
      the framework's settings, before anything connects, with the same one-line errors;
      the factory reads them with :meth:`Settings.table`.
    - ``defaults``: framework settings the application defaults differently, e.g.
      ``{"stream_prefix": "docs"}``; flags, env vars and the config file still win.
    - ``worker_aliases``: other names ``--worker`` and ``[workers.<name>]`` accept,
      alias -> worker name. Per-worker concurrency is each step's ``concurrency``,
      overridable by ``[workers.<name>] concurrency``.
    - ``secret_envs``: ``settings -> names of env vars holding secrets``; their values
      are redacted from logs like the Redis password.

    Used as a decorator (``@config`` over the factory) or called on a ``Pipeline``
    (``config(pipeline)``); the loader reads it from the target without calling it.
    """

    tables: Mapping[str, type[BaseModel]] = field(default_factory=dict)
    defaults: Mapping[str, object] = field(default_factory=dict)
    worker_aliases: Mapping[str, str] = field(default_factory=dict)
    secret_envs: Callable[[Settings], Iterable[str]] | None = None

    def __post_init__(self) -> None:
        for name, model in self.tables.items():
            if name in Settings.model_fields or not name.isidentifier():
                raise ValueError(f"AppConfig: table name {name!r} is taken or not an identifier")
            if not (isinstance(model, type) and issubclass(model, BaseModel)):
                raise TypeError(f"AppConfig: table {name!r} must be a pydantic model class")
        for name in self.defaults:
            if name not in Settings.model_fields or name == "app":
                raise ValueError(f"AppConfig: {name!r} is not a framework setting it can default")

    def __call__(self, target: T) -> T:
        """Attach this configuration to ``target`` (a factory or a ``Pipeline``)."""
        setattr(target, _APP_CONFIG_ATTR, self)
        return target

    @staticmethod
    def of(target: object) -> AppConfig:
        """The configuration attached to ``target``; an empty one when there is none."""
        found = getattr(target, _APP_CONFIG_ATTR, None)
        return found if isinstance(found, AppConfig) else _NO_APP


def _canonical(
    name: str, names: Collection[str] | None, aliases: Mapping[str, str]
) -> str | None:
    """Worker name for ``name`` (aliases resolved), or None if ``names`` lacks it."""
    if names is None:
        return aliases.get(name, name)
    if name in names:
        return name
    alias = aliases.get(name)
    return alias if alias is not None and alias in names else None


def _workers_context(info: ValidationInfo) -> tuple[Collection[str] | None, Mapping[str, str]]:
    context = info.context if isinstance(info.context, Mapping) else {}
    names = context.get("worker_names")
    return (frozenset(names) if names else None), context.get("worker_aliases") or {}


class Settings(SettingsTable):
    """Every setting of ``printery-workers`` and ``printery``; see :func:`load_settings`.

    Settings loaded for an application also hold its tables (:meth:`table`) and its
    :class:`AppConfig` (:attr:`app_config`).
    """

    redis_url: str | None = None
    log_level: LogLevel = "info"
    environment: Environment = "development"
    worker: str = "all"
    supervised: Bool = False
    max_restarts: int = Field(default=3, ge=0)
    backoff_ms: int = Field(default=1000, gt=0)
    health_check_interval: float = Field(default=30.0, gt=0)
    shutdown_timeout: float = Field(default=30.0, ge=0)
    exit_on_failure: Bool = False
    http_addr: str = "127.0.0.1:9464"
    stream_prefix: str = "printery"
    data_dir: Path = Path(".printery")
    app: str | None = None
    processes: int = Field(default=1, ge=1)
    api_token_env: str = Field(default="PRINTERY_API_TOKEN", pattern=r"^[A-Za-z_][A-Za-z0-9_]{0,127}$")

    # Tables are frozen, so one shared default instance is safe.
    transport: TransportSettings = TransportSettings()
    workers: dict[str, WorkerSettings] = Field(default_factory=dict)
    review: dict[str, ReviewSettings] = Field(default_factory=dict)
    telemetry: TelemetrySettings = TelemetrySettings()
    console: ConsoleSettings = ConsoleSettings()

    _app_config: AppConfig | None = PrivateAttr(default=None)

    @field_validator("log_level", mode="before")
    @classmethod
    def _log_level(cls, value: object) -> object:
        value = _lower(value)
        return "warn" if value == "warning" else value

    _environment = field_validator("environment", mode="before")(_lower)

    @field_validator("redis_url")
    @classmethod
    def _redis_url(cls, value: str | None) -> str | None:
        if value is None:
            return None
        allowed = ("a redis://, rediss://, unix://, redis+cluster://HOST:PORT[,HOST:PORT...] "
                   "or rediss+cluster:// URL; unset means the embedded server")
        parts = urlsplit(value.strip())
        if parts.scheme not in _REDIS_SCHEMES:
            raise not_allowed(allowed)
        try:
            if parts.scheme in CLUSTER_SCHEMES:
                cluster_nodes(value.strip())
            else:
                parts.port  # noqa: B018 - raises ValueError on a bad port
        except ValueError as exc:
            raise not_allowed(f"{allowed} ({exc})" if parts.scheme in CLUSTER_SCHEMES else allowed) from None
        if parts.scheme == "unix" and not parts.path:
            raise not_allowed(allowed)
        database = parts.path.strip("/") if parts.scheme in ("redis", "rediss") else ""
        if database and not database.isdigit():  # redis-py would read "/abc" as db 0
            raise not_allowed(f"{allowed}; the path a database number (/0, /1, ...), "
                              f"not {database!r}")
        return value.strip()

    @field_validator("worker", mode="before")
    @classmethod
    def _worker(cls, value: object, info: ValidationInfo) -> object:
        if not isinstance(value, str):
            return value
        names, aliases = _workers_context(info)
        choices = ", ".join(sorted(names)) if names else "worker names"
        allowed = f"all, or one or more comma-separated of: {choices}"
        items = [item.strip().lower() for item in value.split(",") if item.strip()]
        if items == ["all"]:
            return "all"
        chosen: list[str] = []
        for item in items:
            canonical = _canonical(item, names, aliases)
            if canonical is None or item == "all":
                raise not_allowed(allowed)
            if canonical not in chosen:
                chosen.append(canonical)
        if not chosen:
            raise not_allowed(allowed)
        return ",".join(chosen)

    @field_validator("http_addr")
    @classmethod
    def _http_addr(cls, value: str) -> str:
        try:
            parse_http_addr(value)
        except ValueError as exc:
            raise not_allowed(str(exc)) from None
        return value.strip()

    @field_validator("stream_prefix")
    @classmethod
    def _stream_prefix(cls, value: str) -> str:
        # Glob characters would break SCAN MATCH over `<prefix>:process:*`.
        if not value or any(ch.isspace() or ch in "*?[]\\" for ch in value):
            raise not_allowed("a non-empty key prefix without spaces or * ? [ ] \\")
        return value

    @field_validator("data_dir", mode="before")
    @classmethod
    def _data_dir(cls, value: object) -> object:
        if isinstance(value, str | Path) and str(value).strip():
            return Path(value).expanduser()
        raise not_allowed("a directory path")

    @field_validator("app")
    @classmethod
    def _app(cls, value: str | None) -> str | None:
        if value is not None and not _APP.match(value.strip()):
            raise not_allowed("MODULE:ATTR, e.g. mypkg.pipeline:app")
        return value.strip() if value is not None else None

    @field_validator("workers", mode="before")
    @classmethod
    def _workers(cls, value: object, info: ValidationInfo) -> object:
        names, aliases = _workers_context(info)
        if not isinstance(value, Mapping):
            return value
        canonical: dict[str, object] = {}
        for key, table in value.items():
            name = _canonical(str(key), names, aliases)
            if name is None:
                allowed = "a worker name: " + ", ".join(sorted(names or ()))
                raise PydanticCustomError(
                    "printery_key", "{allowed}", {"allowed": allowed, "key": key, "value": table}
                )
            canonical[name] = table
        return canonical

    @field_validator("review", mode="before")
    @classmethod
    def _review(cls, value: object, info: ValidationInfo) -> object:
        """``[review.<kind>]`` names a kind of the pipeline, as ``[workers.<name>]`` names
        a worker; checked once the pipeline is known and names kinds at all (a pipeline
        declaring none writes only kinds its steps make up, which no table can check)."""
        context = info.context if isinstance(info.context, Mapping) else {}
        kinds = frozenset(context.get("review_kinds") or ())
        if not kinds or not isinstance(value, Mapping):
            return value
        for key, table in value.items():
            if str(key) not in kinds:
                allowed = ("a review kind of the pipeline: " + ", ".join(sorted(kinds))
                           + " (a kind a step writes by itself is declared with "
                           "Pipeline.review_kind)")
                raise PydanticCustomError(
                    "printery_key", "{allowed}", {"allowed": allowed, "key": key, "value": table}
                )
        return value

    def for_app(self, config: AppConfig) -> Settings:
        """These settings as loaded for ``config``'s application (the loader's last step:
        :attr:`app_config` and :meth:`table` answer from it)."""
        self._app_config = config
        return self

    @property
    def app_config(self) -> AppConfig:
        """The :class:`AppConfig` these settings were loaded with (empty when none)."""
        return self._app_config or _NO_APP

    def table(self, name: str, model: type[M]) -> M:
        """The application's validated ``[name]`` table, as declared in its AppConfig."""
        declared = self.app_config.tables.get(name)
        value = getattr(self, name, None) if declared is not None else None
        if declared is None or value is None:
            raise KeyError(f"no table [{name}]: these settings were not loaded with an "
                           "AppConfig declaring it")
        if not isinstance(value, model):
            raise TypeError(f"table [{name}] is a {type(value).__name__}, not {model.__name__}")
        return value

    def selected_workers(self, all_names: Sequence[str]) -> list[str]:
        """The workers this process runs, in pipeline order (``all_names`` order).

        Checks the names again, so a ``Settings`` built without the loader's worker list
        still fails cleanly on an unknown name.
        """
        if self.worker == "all":
            return list(all_names)
        chosen = set()
        for item in self.worker.split(","):
            name = _canonical(item, all_names, self.app_config.worker_aliases)
            if name is None:
                raise ConfigError(
                    "worker", item, "all, or comma-separated of: " + ", ".join(all_names)
                )
            chosen.add(name)
        return [name for name in all_names if name in chosen]

    def concurrency(self, worker: str, default: int = 1) -> int:
        """Consumers for ``worker``: ``[workers.<name>] concurrency``, else ``default``
        (the step's own ``concurrency``)."""
        tuning = self.workers.get(worker)
        if tuning is not None and tuning.concurrency is not None:
            return tuning.concurrency
        return default

    def review_timeouts(self) -> dict[str, float]:
        """Review kind -> seconds before an undecided review of it is rejected."""
        return {kind: table.timeout for kind, table in self.review.items()
                if table.timeout is not None}

    @property
    def keys(self) -> StreamKeys:
        """Every key name of this deployment: the stream prefix in its partitions (the
        setting; unset, 1 until the recorded layout is read: :mod:`printery.store.partitions`)."""
        return StreamKeys(self.stream_prefix, self.transport.partitions or 1)

    def with_partitions(self, partitions: int) -> Settings:
        """These settings with the partition count of the recorded layout."""
        transport = self.transport.model_copy(update={"partitions": partitions})
        return self.model_copy(update={"transport": transport})

    @property
    def http_bind(self) -> tuple[str, int] | None:
        """``(host, port)`` to serve HTTP on, or None when ``http_addr`` is ``off``."""
        return parse_http_addr(self.http_addr)

    @property
    def cluster_partitions_problem(self) -> str | None:
        """Why these partitions cannot run on the cluster of ``redis_url`` (None: they can).

        One partition keeps the unpartitioned keys, which carry no hash tag: a commit's
        keys would be in several slots, which a cluster refuses (CROSSSLOT)."""
        if (self.redis_url and urlsplit(self.redis_url).scheme in CLUSTER_SCHEMES
                and self.transport.partitions is not None and self.transport.partitions < 2):
            return ("2 or more on a cluster (redis+cluster://): one partition's keys carry "
                    "no hash tag; 3 x the master count is a good start")
        return None

    @property
    def redacted_redis_url(self) -> str | None:
        """The Redis URL safe to print in logs, ``/status`` and ``--json`` output."""
        return redact_url(self.redis_url) if self.redis_url else None

    def secrets(self, env: Mapping[str, str]) -> list[str]:
        """Secret strings to scrub from logs: the Redis password, the API token and the
        values of the application's ``secret_envs``."""
        found: list[str] = [env[self.api_token_env]] if env.get(self.api_token_env) else []
        if self.redis_url:
            parts = urlsplit(self.redis_url)
            if parts.password:
                found.append(parts.password)
            # redis-py takes the password from the query too (``?password=``).
            found += [value for value in parse_qs(parts.query).get("password", []) if value]
        secret_envs = self.app_config.secret_envs
        for name in secret_envs(self) if secret_envs is not None else ():
            if env.get(name):
                found.append(env[name])
        return found


_NO_APP = AppConfig()


#: Every command-line setting (docs/reference.md, Commands), in ``--help`` order, keyed by
#: setting name (the table is :mod:`printery.settings.config_doc`'s, the defaults the settings'
#: own).
SETTINGS_DOC: Mapping[str, SettingDoc] = settings_doc(lambda name: Settings.model_fields[name].default)
