"""Loading settings: flag > env var > config file > default, validated at once before
anything connects, and every error as one line naming the setting, where it came from,
the value (secrets masked) and what is allowed (see :mod:`printery.settings.config`)."""

from __future__ import annotations

import functools
import tomllib
import types
from collections.abc import Collection, Mapping, Sequence
from pathlib import Path
from typing import Annotated, Any, Literal, Union, get_args, get_origin

from annotated_types import Ge, Gt, Le, MinLen
from pydantic import BaseModel, Field, ValidationError, create_model
from pydantic.fields import FieldInfo
from pydantic_core import ErrorDetails

from printery.base.errors import ConfigError
from printery.observe.redact import Redactor
from printery.settings.config import SETTINGS_DOC, AppConfig, Settings

__all__ = ["load_settings"]

# Flag keys the loader accepts: the setting name or the flag's own name (`backoff`).
_FLAG_KEYS = {
    **{name: name for name in SETTINGS_DOC},
    **{doc.flag.lstrip("-").replace("-", "_"): name for name, doc in SETTINGS_DOC.items()},
}


def _mask(key: str, value: object) -> object:
    """The bad value as it may be printed (:mod:`printery.observe.redact`'s rules)."""
    return Redactor().field(key, value)


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
        elif isinstance(meta, Le):
            text += f" <= {meta.le}"
        elif isinstance(meta, MinLen) and meta.min_length == 1:
            text = "a non-empty " + text.removeprefix("a ")
    return text + (", or unset" if type(None) in get_args(info.annotation) else "")


def _field_at(
    root: type[BaseModel], loc: Sequence[int | str]
) -> tuple[FieldInfo | None, type[BaseModel] | None]:
    """The field a pydantic error location points at, and the table holding it."""
    tp: Any = root
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


def _describe_error(root: type[BaseModel], error: ErrorDetails) -> tuple[str, object, str]:
    """(dotted setting, printable value, what is allowed) of one pydantic error."""
    loc = list(error["loc"])
    ctx = error.get("ctx") or {}
    value = None if error["type"] == "missing" else error["input"]
    if "key" in ctx:  # an unknown [workers.<name>] or [review.<kind>] table
        loc.append(str(ctx["key"]))
        value = ctx["value"]
    setting = "".join(f"[{p}]" if isinstance(p, int) else f".{p}" for p in loc).lstrip(".")
    info, owner = _field_at(root, loc)
    if error["type"] in ("printery", "printery_key"):
        allowed = str(ctx["allowed"])
    elif error["type"] == "value_error":  # a table's own validator: its words
        allowed = str(error["msg"]).removeprefix("Value error, ")
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


@functools.lru_cache(maxsize=16)
def _settings_model(tables: tuple[tuple[str, type[BaseModel]], ...]) -> type[Settings]:
    """:class:`Settings` with an application's tables as more fields."""
    if not tables:
        return Settings
    fields: dict[str, Any] = {}
    for name, table in tables:
        optional = not any(info.is_required() for info in table.model_fields.values())
        fields[name] = (table, Field(default_factory=table) if optional else ...)
    model: type[Settings] = create_model("AppSettings", __base__=Settings, **fields)
    return model


def _put(data: dict[str, Any], sources: dict[str, str], name: str, value: object,
         source: str) -> None:
    """Set one setting given by env var or flag; a dotted name (``transport.partitions``)
    is a key of a table, merged into what the config file gave that table."""
    table, dot, key = name.partition(".")
    if dot:
        found = data.get(table)
        data[table] = {**(found if isinstance(found, dict) else {}), key: value}
    else:
        data[name] = value
    sources[name] = source


def load_settings(
    flags: Mapping[str, object | None],
    env: Mapping[str, str],
    *,
    app: AppConfig | None = None,
    worker_names: Collection[str] = (),
    review_kinds: Collection[str] = (),
    app_pending: bool = False,
) -> Settings:
    """Merge flag > env var > config file > default and validate everything at once.

    ``flags`` is keyed by setting name (``max_restarts``) or flag name (``backoff``);
    ``None`` means "not given". An unknown flag key is a programming error (TypeError),
    so a mis-wired CLI option can never be silently ignored. ``app`` is the
    application's :class:`AppConfig`: its defaults sit between the config file and the
    framework's defaults, its tables are validated with the rest, its worker aliases
    are accepted. ``worker_names`` are the pipeline's workers; ``--worker`` and
    ``[workers.*]`` are checked against them; ``review_kinds`` the pipeline's review
    kinds, which ``[review.*]`` is checked against (when there are any).
    ``app_pending``: the application is not known yet (this pass finds ``app``), so
    top-level tables the framework does not know, and ``[workers.*]`` (which may use the
    app's aliases), are set aside for the next pass instead of refused.
    Raises :class:`ConfigError` with a one-line message on any bad setting.
    """
    given: dict[str, object] = {}
    for key, value in flags.items():
        name = _FLAG_KEYS.get(key.lstrip("-").replace("-", "_"))
        if name is None:
            raise TypeError(f"load_settings: unknown flag {key!r}")
        if value is not None:
            given[name] = value

    config = app or AppConfig()
    data: dict[str, Any] = dict(config.defaults)
    sources: dict[str, str] = dict.fromkeys(config.defaults, "default of the app")
    config_doc = SETTINGS_DOC["config"]
    config_path, config_label = given.pop("config", None), config_doc.flag
    if config_path is None and env.get(config_doc.env):
        config_path, config_label = env[config_doc.env], config_doc.env
    if config_path is not None:
        path = Path(str(config_path)).expanduser()
        from_file = _read_config_file(path, f"config ({config_label})")
        if app_pending:  # `[workers.<alias>]` too: the aliases are the app's
            from_file = {key: value for key, value in from_file.items() if key != "workers"
                         and (key in Settings.model_fields or not isinstance(value, dict))}
        data.update(from_file)
        sources.update(dict.fromkeys(from_file, f"config file {path}"))
    for name, doc in SETTINGS_DOC.items():
        if name != "config" and env.get(doc.env, "") != "":
            _put(data, sources, name, env[doc.env], doc.env)
    for name, value in given.items():
        _put(data, sources, name, value, SETTINGS_DOC[name].flag)

    model = _settings_model(tuple(config.tables.items()))
    context = {"worker_names": list(worker_names), "worker_aliases": config.worker_aliases,
               "review_kinds": list(review_kinds)}
    try:
        settings: Settings = model.model_validate(data, context=context)
    except ValidationError as exc:
        setting, value, allowed = _describe_error(model, exc.errors()[0])
        source = sources.get(setting) or sources.get(setting.split(".", 1)[0].split("[", 1)[0])
        label = f"{setting} ({source})" if source else setting
        raise ConfigError(label, value, allowed) from None
    if config_path is not None and any(sources.get(key) != f"config file {path}"
                                       for key in from_file):
        # A value of the file that an env var or flag overrides is a bad setting all the
        # same: it would start failing the day the override is dropped.
        try:
            model.model_validate({**config.defaults, **from_file}, context=context)
        except ValidationError as exc:
            setting, value, allowed = _describe_error(model, exc.errors()[0])
            raise ConfigError(f"{setting} (config file {path})", value, allowed) from None
    problem = settings.cluster_partitions_problem
    if problem is not None:
        source = sources.get("transport.partitions")
        label = f"transport.partitions ({source})" if source else "transport.partitions"
        raise ConfigError(label, settings.transport.partitions, problem)
    return settings.for_app(config)
