"""Settings of the service and the operator tool (CONTRACT §1, §7).

Every setting comes from, in order of precedence, a command-line flag, an environment
variable, the TOML config file, or its default, and the whole set is validated here,
before anything connects: a bad value is a :class:`~printery.errors.ConfigError` whose
message is one line naming the setting (and where it came from), the value with secrets
shown as ``***``, and what is allowed. The CLI turns that into exit status 2.

Choices where the contract is silent: an environment variable set to the empty string
counts as unset (so ``REDIS_URL=`` in a compose file means "embedded server"); log level
and environment are case-insensitive (``warning`` is taken as ``warn``); relative paths
are relative to the working directory, not to the config file.
"""

from __future__ import annotations

import re
import tomllib
import types
from collections.abc import Collection, Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Annotated, Any, Literal, Union, get_args, get_origin
from urllib.parse import urlsplit

from annotated_types import Ge, Gt, MinLen
from pydantic import (
    BaseModel,
    BeforeValidator,
    ConfigDict,
    Field,
    ValidationError,
    ValidationInfo,
    field_validator,
)
from pydantic.fields import FieldInfo
from pydantic_core import ErrorDetails, PydanticCustomError

from printery.errors import ConfigError

__all__ = [
    "SETTINGS_DOC",
    "WORKER_ALIASES",
    "AggregatorSettings",
    "DependencyCheckerSettings",
    "HealthMonitorSettings",
    "NotifierSettings",
    "SettingDoc",
    "Settings",
    "TransportSettings",
    "ValidatorSettings",
    "WorkerSettings",
    "load_settings",
    "parse_http_addr",
    "redact_text",
    "redact_url",
]

#: The seed's short worker names, still accepted by ``--worker`` (CONTRACT, preamble).
WORKER_ALIASES: Mapping[str, str] = {
    "dependency": "dependency-checker",
    "health": "health-monitor",
}

# ``scheme://user:password@`` (user may be empty); the password runs to the last ``@``
# of the authority, so a password holding ``@`` is still masked whole.
_URL_CREDENTIAL = re.compile(r"(?P<head>[A-Za-z][A-Za-z0-9+.-]*://[^:/@\s]*):[^\s/]*@")
# redis-py also takes the password as a query argument.
_QUERY_SECRET = re.compile(r"(?i)(?P<head>[?&](?:password|pass|pwd|secret|token)=)[^&#\s]*")


def redact_text(text: str) -> str:
    """Mask every URL password (``://user:***@``) and password query argument in ``text``."""
    if "://" in text and "@" in text:
        text = _URL_CREDENTIAL.sub(r"\g<head>:***@", text)
    if "=" in text:
        text = _QUERY_SECRET.sub(r"\g<head>***", text)
    return text


def redact_url(url: str) -> str:
    """``url`` with its password masked: ``redis://:pw@host:6379`` -> ``redis://:***@host:6379``.

    The user name is kept (Redis ACL users are not secret); robust to malformed URLs,
    because its main use is printing the bad value of a setting.
    """
    return redact_text(url)


def _fail(allowed: str) -> PydanticCustomError:
    # The message template is the "what is allowed" part of the ConfigError.
    return PydanticCustomError("printery", "{allowed}", {"allowed": allowed})


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


def _no_bool(value: object) -> object:
    # pydantic's lax mode reads `true` as 1; a boolean where a number belongs is a mistake.
    if isinstance(value, bool):
        # Not `_fail`: the field's own description ("an integer >= 0") says it better.
        raise PydanticCustomError("bool_not_number", "a number, not true or false")
    return value


_TRUE = {"true", "1", "yes"}
_FALSE = {"false", "0", "no"}


def _to_bool(value: object) -> object:
    """Booleans from env and flags: true/false/1/0/yes/no, any case (CONTRACT §1)."""
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
    raise _fail("true or false (also 1/0, yes/no)")


def _lower(value: object) -> object:
    return value.strip().lower() if isinstance(value, str) else value


Int = Annotated[int, BeforeValidator(_no_bool)]
Float = Annotated[float, BeforeValidator(_no_bool), Field(allow_inf_nan=False)]
Bool = Annotated[bool, BeforeValidator(_to_bool)]
LogLevel = Literal["debug", "info", "warn", "error"]
Environment = Literal["development", "staging", "production"]


class _Table(BaseModel):
    """Base of every settings table: unknown keys are errors, instances are immutable."""

    model_config = ConfigDict(extra="forbid", frozen=True)


class TransportSettings(_Table):
    """``[transport]``: delivery limits shared by every stream worker (CONTRACT §4, §10)."""

    max_deliveries: Int = Field(default=5, ge=1)
    visibility_timeout: Float = Field(default=60.0, gt=0)
    payload_limit_bytes: Int = Field(default=1_048_576, ge=1)
    inline_limit_bytes: Int = Field(default=65_536, ge=1)
    blob_ttl: Int = Field(default=604_800, ge=1)
    #: Seconds an entry that every group has acknowledged stays in its stream (for
    #: ``trace``, ``replay`` and ``cost``); 0 keeps everything. Unacknowledged and unread
    #: entries are never trimmed, nor are ``dlq``, ``review`` and ``review:decided``.
    retention: Float = Field(default=604_800.0, ge=0)
    #: Seconds between retention sweeps.
    retention_interval: Float = Field(default=60.0, gt=0)
    #: Seconds between sweeps for messages of dead consumers; unset: half the visibility
    #: timeout, so an orphan waits at most 1.5 timeouts.
    claim_interval: Float | None = Field(default=None, gt=0)


class WorkerSettings(_Table):
    """``[workers.<name>]``; unset values fall back to the pipeline's own defaults."""

    concurrency: Int | None = Field(default=None, ge=1)
    #: Entries fetched per read (``XREADGROUP COUNT``).
    prefetch: Int | None = Field(default=None, ge=1)


class ValidatorSettings(_Table):
    approval_required: tuple[Environment, ...] = ("production",)


class DependencyCheckerSettings(_Table):
    probe_timeout: Float = Field(default=5.0, gt=0)
    retries: Int = Field(default=2, ge=0)


class HealthMonitorSettings(_Table):
    interval: Float = Field(default=1.0, gt=0)
    consecutive: Int = Field(default=3, ge=1)
    deadline: Float = Field(default=60.0, gt=0)
    probe_timeout: Float = Field(default=5.0, gt=0)


class AggregatorSettings(_Table):
    branch_deadline: Float = Field(default=120.0, gt=0)


class NotifierSettings(_Table):
    default_channels: tuple[str, ...] = Field(default=("log",), min_length=1)
    retries: Int = Field(default=3, ge=0)
    backoff_ms: Int = Field(default=500, gt=0)
    #: Name of the env var holding the HMAC secret, never the secret itself.
    webhook_secret_env: str = Field(default="PRINTERY_WEBHOOK_SECRET", min_length=1)
    allow_hosts: tuple[str, ...] = ()
    timeout: Float = Field(default=10.0, gt=0)
    max_response_bytes: Int = Field(default=65_536, ge=1)


#: Consumers per worker when neither the config file nor the pipeline says (CONTRACT §7).
DEFAULT_CONCURRENCY: Mapping[str, int] = {
    "validator": 1, "dependency-checker": 5, "health-monitor": 10, "notifier": 5, "aggregator": 1,
}

_APP = re.compile(r"^[A-Za-z_]\w*(\.[A-Za-z_]\w*)*:[A-Za-z_]\w*(\.[A-Za-z_]\w*)*$")
_REDIS_SCHEMES = ("redis", "rediss", "unix")


def _known(names: Collection[str] | None, name: str) -> str | None:
    """Canonical worker name for ``name`` (aliases resolved), or None if unknown."""
    if names is None or name in names:
        return name
    alias = WORKER_ALIASES.get(name)
    return alias if alias is not None and alias in names else None


def _worker_names(info: ValidationInfo) -> Collection[str] | None:
    context = info.context if isinstance(info.context, Mapping) else {}
    names = context.get("worker_names")
    return frozenset(names) if names else None


class Settings(_Table):
    """Every setting of ``printery-workers`` and ``printery``; see :func:`load_settings`."""

    redis_url: str | None = None
    log_level: LogLevel = "info"
    environment: Environment = "development"
    worker: str = "all"
    supervised: Bool = False
    max_restarts: Int = Field(default=3, ge=0)
    backoff_ms: Int = Field(default=1000, gt=0)
    health_check_interval: Float = Field(default=30.0, gt=0)
    shutdown_timeout: Float = Field(default=30.0, ge=0)
    exit_on_failure: Bool = False
    http_addr: str = "127.0.0.1:9464"
    stream_prefix: str = "materi:events:deployment"
    data_dir: Path = Path(".printery")
    app: str | None = None
    processes: Int = Field(default=1, ge=1)

    # Tables are frozen, so one shared default instance is safe.
    transport: TransportSettings = TransportSettings()
    workers: dict[str, WorkerSettings] = Field(default_factory=dict)
    validator: ValidatorSettings = ValidatorSettings()
    dependency_checker: DependencyCheckerSettings = DependencyCheckerSettings()
    health_monitor: HealthMonitorSettings = HealthMonitorSettings()
    aggregator: AggregatorSettings = AggregatorSettings()
    notifier: NotifierSettings = NotifierSettings()

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
        allowed = "a redis://, rediss:// or unix:// URL; unset means the embedded server"
        try:
            parts = urlsplit(value.strip())
            parts.port  # noqa: B018 - raises ValueError on a bad port
        except ValueError:
            raise _fail(allowed) from None
        if parts.scheme not in _REDIS_SCHEMES:
            raise _fail(allowed)
        if parts.scheme == "unix" and not parts.path:
            raise _fail(allowed)
        return value.strip()

    @field_validator("worker", mode="before")
    @classmethod
    def _worker(cls, value: object, info: ValidationInfo) -> object:
        if not isinstance(value, str):
            return value
        names = _worker_names(info)
        choices = ", ".join(sorted(names)) if names else "worker names"
        allowed = f"all, or one or more comma-separated of: {choices}"
        items = [item.strip().lower() for item in value.split(",") if item.strip()]
        if items == ["all"]:
            return "all"
        chosen: list[str] = []
        for item in items:
            canonical = _known(names, item)
            if canonical is None or item == "all":
                raise _fail(allowed)
            if canonical not in chosen:
                chosen.append(canonical)
        if not chosen:
            raise _fail(allowed)
        return ",".join(chosen)

    @field_validator("http_addr")
    @classmethod
    def _http_addr(cls, value: str) -> str:
        try:
            parse_http_addr(value)
        except ValueError as exc:
            raise _fail(str(exc)) from None
        return value.strip()

    @field_validator("stream_prefix")
    @classmethod
    def _stream_prefix(cls, value: str) -> str:
        # Glob characters would break SCAN MATCH over `<prefix>:process:*`.
        if not value or any(ch.isspace() or ch in "*?[]\\" for ch in value):
            raise _fail("a non-empty key prefix without spaces or * ? [ ] \\")
        return value

    @field_validator("data_dir", mode="before")
    @classmethod
    def _data_dir(cls, value: object) -> object:
        if isinstance(value, str | Path) and str(value).strip():
            return Path(value).expanduser()
        raise _fail("a directory path")

    @field_validator("app")
    @classmethod
    def _app(cls, value: str | None) -> str | None:
        if value is not None and not _APP.match(value.strip()):
            raise _fail("MODULE:ATTR, e.g. mypkg.pipeline:app")
        return value.strip() if value is not None else None

    @field_validator("workers", mode="before")
    @classmethod
    def _workers(cls, value: object, info: ValidationInfo) -> object:
        names = _worker_names(info)
        if not isinstance(value, Mapping) or names is None:
            return value
        canonical: dict[str, object] = {}
        for key, table in value.items():
            name = _known(names, str(key))
            if name is None:
                allowed = "a worker name: " + ", ".join(sorted(names))
                raise PydanticCustomError(
                    "printery_key", "{allowed}", {"allowed": allowed, "key": key, "value": table}
                )
            canonical[name] = table
        return canonical

    def selected_workers(self, all_names: Sequence[str]) -> list[str]:
        """The workers this process runs, in pipeline order (``all_names`` order).

        Checks the names again, so a ``Settings`` built without the loader's worker list
        still fails cleanly on an unknown name.
        """
        if self.worker == "all":
            return list(all_names)
        chosen = set()
        for item in self.worker.split(","):
            name = _known(all_names, item)
            if name is None:
                raise ConfigError(
                    "worker", item, "all, or comma-separated of: " + ", ".join(all_names)
                )
            chosen.add(name)
        return [name for name in all_names if name in chosen]

    def concurrency(self, worker: str, default: int = 1) -> int:
        """Consumers for ``worker``: config file, else CONTRACT §7's default, else ``default``."""
        tuning = self.workers.get(worker)
        if tuning is not None and tuning.concurrency is not None:
            return tuning.concurrency
        return DEFAULT_CONCURRENCY.get(worker, default)

    @property
    def http_bind(self) -> tuple[str, int] | None:
        """``(host, port)`` to serve HTTP on, or None when ``http_addr`` is ``off``."""
        return parse_http_addr(self.http_addr)

    @property
    def redacted_redis_url(self) -> str | None:
        """The Redis URL safe to print in logs, ``/status`` and ``--json`` output."""
        return redact_url(self.redis_url) if self.redis_url else None

    def secrets(self, env: Mapping[str, str]) -> list[str]:
        """Secret strings to scrub from logs: the Redis password and the webhook secret."""
        found: list[str] = []
        if self.redis_url:
            parts = urlsplit(self.redis_url)
            if parts.password:
                found.append(parts.password)
        secret = env.get(self.notifier.webhook_secret_env)
        if secret:
            found.append(secret)
        return found


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
        return f"{self.help} [env: {self.env}; default: {self.default}]"


def _doc(name: str, flag: str, env: str, metavar: str | None, help: str, default: str = "") -> (
    SettingDoc
):
    if not default:
        value = Settings.model_fields[name].default
        default = str(value).lower() if isinstance(value, bool) else str(value)
    return SettingDoc(name, flag, env, default, help, metavar)


#: Every command-line setting of CONTRACT §1, in ``--help`` order, keyed by setting name.
SETTINGS_DOC: Mapping[str, SettingDoc] = {
    doc.name: doc
    for doc in (
        _doc("redis_url", "--redis-url", "REDIS_URL", "URL",
             "redis://, rediss:// or unix:// URL; user and password allowed",
             "unset: embedded server"),
        _doc("log_level", "--log-level", "LOG_LEVEL", "LEVEL", "debug, info, warn or error"),
        _doc("environment", "--environment", "ENVIRONMENT", "ENV",
             "development, staging or production (of this service)"),
        _doc("worker", "--worker", "WORKER_MODE", "WORKERS",
             "all, or one or more worker names, comma-separated"),
        _doc("supervised", "--supervised", "SUPERVISED_MODE", None,
             "restart failed workers with backoff"),
        _doc("max_restarts", "--max-restarts", "MAX_RESTART_ATTEMPTS", "N",
             "restarts per worker before it is marked failed"),
        _doc("backoff_ms", "--backoff", "RESTART_BACKOFF_MS", "MS",
             "first restart delay; doubles per attempt, capped at 60 s, with jitter"),
        _doc("health_check_interval", "--health-check-interval", "HEALTH_CHECK_INTERVAL", "S",
             "seconds between supervisor health checks"),
        _doc("shutdown_timeout", "--shutdown-timeout", "SHUTDOWN_TIMEOUT", "S",
             "seconds to drain in-flight messages on shutdown"),
        _doc("exit_on_failure", "--exit-on-failure", "EXIT_ON_FAILURE", None,
             "in supervised mode, exit 1 once a worker is failed"),
        _doc("http_addr", "--http-addr", "HTTP_ADDR", "HOST:PORT",
             "health, status and metrics endpoint; off disables"),
        _doc("stream_prefix", "--stream-prefix", "STREAM_PREFIX", "PREFIX",
             "key prefix of every stream"),
        _doc("data_dir", "--data-dir", "PRINTERY_DATA_DIR", "DIR",
             "the embedded server's data", "./.printery"),
        _doc("app", "--app", "PRINTERY_APP", "MODULE:ATTR", "the pipeline to run",
             "the deployment pipeline"),
        _doc("processes", "--processes", "PRINTERY_PROCESSES", "N",
             "worker processes to run"),
        SettingDoc("config", "--config", "PRINTERY_CONFIG", "none", "TOML config file", "FILE"),
    )
}

# Flag keys the loader accepts: the setting name or the flag's own name (`backoff`).
_FLAG_KEYS = {
    **{name: name for name in SETTINGS_DOC},
    **{doc.flag.lstrip("-").replace("-", "_"): name for name, doc in SETTINGS_DOC.items()},
}


_SECRET_KEY = re.compile(r"(?i)password|secret|token|credential")


def _mask(key: str, value: object) -> object:
    """The bad value as it may be printed: URL passwords and secret-looking keys -> ***."""
    if _SECRET_KEY.search(key):
        return "***"
    if isinstance(value, str):
        return redact_text(value)
    if isinstance(value, Mapping):
        return {k: _mask(f"{key}.{k}", v) for k, v in value.items()}
    if isinstance(value, list | tuple):
        return [_mask(key, v) for v in value]
    return value


def _describe_type(tp: Any) -> str:
    origin, args = get_origin(tp), get_args(tp)
    if origin is Annotated:
        return _describe_type(args[0])
    if origin is Literal:
        return "one of " + ", ".join(str(arg) for arg in args)
    if origin in (Union, types.UnionType):
        kinds = [_describe_type(arg) for arg in args if arg is not type(None)]
        return " or ".join(kinds)
    if origin in (list, tuple):
        return f"a list of ({_describe_type(args[0])})"
    if origin is dict or (isinstance(tp, type) and issubclass(tp, BaseModel)):
        keys = "" if origin is dict else ": " + ", ".join(tp.model_fields)
        return "a table" + keys
    names = {bool: "true or false", int: "an integer", float: "a number", str: "a string"}
    return names.get(tp, "a path" if tp is Path else str(tp))


def _describe_field(info: FieldInfo, item: bool = False) -> str:
    """What a field allows, from its type and constraints; ``item``: one list item's."""
    if item:
        return _describe_type(get_args(info.annotation)[0])
    text = _describe_type(info.annotation)
    for meta in info.metadata:
        if isinstance(meta, Ge):
            text += f" >= {meta.ge}"
        elif isinstance(meta, Gt):
            text += f" > {meta.gt}"
        elif isinstance(meta, MinLen) and meta.min_length == 1:
            text = "a non-empty " + text.removeprefix("a ")
    return text + (", or unset" if type(None) in get_args(info.annotation) else "")


def _field_at(loc: Sequence[int | str]) -> tuple[FieldInfo | None, type[BaseModel] | None]:
    """The field a pydantic error location points at, and the table holding it."""
    tp: Any = Settings
    info: FieldInfo | None = None
    owner: type[BaseModel] | None = None
    for part in loc:
        if isinstance(tp, type) and issubclass(tp, BaseModel):
            owner, info = tp, tp.model_fields.get(str(part))
            if info is None:
                return None, owner
            tp = info.annotation
            if get_origin(tp) in (Union, types.UnionType):
                tp = next(arg for arg in get_args(tp) if arg is not type(None))
        elif get_origin(tp) in (dict, list, tuple):
            tp = get_args(tp)[0 if get_origin(tp) is tuple else -1]
        else:
            break
    return info, owner


def _describe_error(error: ErrorDetails) -> tuple[str, object, str]:
    """(dotted setting, printable value, what is allowed) of one pydantic error."""
    loc = list(error["loc"])
    ctx = error.get("ctx") or {}
    value = error["input"]
    if "key" in ctx:  # an unknown [workers.<name>] table
        loc.append(str(ctx["key"]))
        value = ctx["value"]
    setting = "".join(f"[{p}]" if isinstance(p, int) else f".{p}" for p in loc).lstrip(".")
    info, owner = _field_at(loc)
    if error["type"] in ("printery", "printery_key"):
        allowed = str(ctx["allowed"])
    elif error["type"] == "extra_forbidden":
        known = ", ".join(owner.model_fields) if owner is not None else ""
        allowed = f"no such key; known keys: {known}"
    elif info is not None:
        allowed = _describe_field(info, item=bool(loc) and isinstance(loc[-1], int))
    else:
        allowed = error["msg"]
    return setting, _mask(setting, value), " ".join(allowed.split())


def _read_config_file(path: Path, label: str) -> dict[str, Any]:
    try:
        with path.open("rb") as handle:
            return tomllib.load(handle)
    except OSError as exc:
        raise ConfigError(label, str(path), f"a readable TOML file; {exc.strerror}") from None
    except (tomllib.TOMLDecodeError, UnicodeDecodeError) as exc:
        detail = " ".join(str(exc).split())
        raise ConfigError(label, str(path), f"valid TOML; {detail}") from None


def load_settings(
    flags: Mapping[str, object | None],
    env: Mapping[str, str],
    *,
    worker_names: Collection[str] = (),
) -> Settings:
    """Merge flag > env var > config file > default and validate everything at once.

    ``flags`` is keyed by setting name (``max_restarts``) or flag name (``backoff``);
    ``None`` means "not given". An unknown flag key is a programming error (TypeError),
    so a mis-wired CLI option can never be silently ignored. ``worker_names`` are the
    pipeline's workers; ``--worker`` and ``[workers.*]`` are checked against them.
    Raises :class:`ConfigError` with a one-line message on any bad setting.
    """
    given: dict[str, object] = {}
    for key, value in flags.items():
        name = _FLAG_KEYS.get(key.lstrip("-").replace("-", "_"))
        if name is None:
            raise TypeError(f"load_settings: unknown flag {key!r}")
        if value is not None:
            given[name] = value

    data: dict[str, Any] = {}
    sources: dict[str, str] = {}
    config_doc = SETTINGS_DOC["config"]
    config_path, config_label = given.pop("config", None), config_doc.flag
    if config_path is None and env.get(config_doc.env):
        config_path, config_label = env[config_doc.env], config_doc.env
    if config_path is not None:
        path = Path(str(config_path)).expanduser()
        data.update(_read_config_file(path, f"config ({config_label})"))
        sources.update(dict.fromkeys(data, f"config file {path}"))
    for name, doc in SETTINGS_DOC.items():
        if name != "config" and env.get(doc.env, "") != "":
            data[name], sources[name] = env[doc.env], doc.env
    for name, value in given.items():
        data[name], sources[name] = value, SETTINGS_DOC[name].flag

    try:
        return Settings.model_validate(data, context={"worker_names": list(worker_names)})
    except ValidationError as exc:
        setting, value, allowed = _describe_error(exc.errors()[0])
        source = sources.get(setting.split(".", 1)[0].split("[", 1)[0])
        label = f"{setting} ({source})" if source else setting
        raise ConfigError(label, value, allowed) from None
