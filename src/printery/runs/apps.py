"""Loading an app: the settings with the app's hook, then the app.

``printery-workers``, ``printery`` and :class:`~printery.Client` load in the same order,
all before anything connects (a problem at any step is a :class:`ConfigError`: exit 2, one line):

1. the framework's settings, with the app's own tables set aside (this finds ``app``);
2. the app's target (``MODULE:ATTR``) imported, not called, and its
   :class:`~printery.AppConfig` read from it;
3. every setting validated again with that hook: the app's tables, its defaults (the
   deployment pipeline's stream prefix; for an app that declares none, the
   commands' default: docs/reference.md, Commands), its worker aliases;
4. when the command needs the pipeline, the factory called with those settings.
"""

from __future__ import annotations

import dataclasses
import importlib
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

from printery.base.errors import ConfigError
from printery.pipeline.dag import Pipeline
from printery.settings.config import AppConfig, Settings
from printery.settings.config_load import load_settings
from printery.wire.keys import COMMAND_STREAM_PREFIX

#: The app of both commands when neither ``--app`` nor ``PRINTERY_APP`` names one.
DEFAULT_APP = "printery.deploy.app:pipeline"


def _crashed(spec: str, exc: Exception) -> ConfigError:
    detail = " ".join(f"{type(exc).__name__}: {exc}".split())
    return ConfigError("app", spec, f"a module that imports cleanly ({detail})")


def import_app(spec: str) -> Any:
    """The object ``MODULE:ATTR`` names (a Pipeline or a factory), not yet called."""
    module_name, _, attr = spec.partition(":")
    if not module_name or not attr:
        raise ConfigError("app", spec, "MODULE:ATTR naming a Pipeline or a factory")
    try:
        module = importlib.import_module(module_name)
    except ImportError as exc:
        raise ConfigError("app", spec, f"an importable module ({exc})") from None
    except Exception as exc:  # the user's module raised at import
        raise _crashed(spec, exc) from None
    target: Any = getattr(module, attr, None)
    if target is None:
        raise ConfigError("app", spec, f"module {module_name} has no attribute {attr}")
    return target


def default_app_config() -> AppConfig:
    """The hook of :data:`DEFAULT_APP`, for ``--help`` texts."""
    return AppConfig.of(import_app(DEFAULT_APP))


@dataclass(frozen=True)
class LoadedApp:
    """Validated settings and the app they were validated for."""

    spec: str
    target: Any
    settings: Settings

    def pipeline(self) -> Pipeline:
        """Call the factory with the settings (or take the Pipeline) and validate it."""
        return build_pipeline(self.spec, self.target, self.settings)


def load_app_settings(
    flags: Mapping[str, object | None], env: Mapping[str, str]
) -> LoadedApp:
    """Steps 1-3 of the module docstring: the settings, validated with the app's hook."""
    first = load_settings(flags, env, app_pending=True)
    spec = first.app or DEFAULT_APP
    target = import_app(spec)
    settings = load_settings(flags, env, app=command_defaults(AppConfig.of(target)))
    return LoadedApp(spec, target, settings)


def command_defaults(config: AppConfig) -> AppConfig:
    """``config`` with the commands' own defaults under the app's: docs/reference.md
    (Commands) gives ``--stream-prefix`` one default, ``materi:events:deployment``,
    whatever ``--app`` runs, so an app that declares no prefix of its own gets that one
    from the commands (the framework's :class:`Settings`, for library use, defaults to
    ``printery``)."""
    return dataclasses.replace(
        config, defaults={"stream_prefix": COMMAND_STREAM_PREFIX, **config.defaults})


def build_pipeline(spec: str, target: Any, settings: Settings) -> Pipeline:
    """A :class:`Pipeline` from ``target``: itself, or what the factory returns for
    ``settings``; validated here, before anything connects (a bad app exits 2)."""
    try:
        pipeline = target if isinstance(target, Pipeline) else (
            target(settings) if callable(target) else None
        )
    except ConfigError:
        raise
    except Exception as exc:  # the user's factory raised
        raise _crashed(spec, exc) from None
    if not isinstance(pipeline, Pipeline):
        raise ConfigError("app", spec, "a printery.Pipeline or a callable returning one")
    try:
        pipeline.validate()
    except Exception as exc:
        raise ConfigError("app", spec, f"a valid pipeline ({exc})") from None
    return pipeline


def load_app(
    app: Pipeline | str | None, flags: Mapping[str, object | None], env: Mapping[str, str]
) -> tuple[Settings, Pipeline]:
    """Settings and pipeline for library use (the client): ``app`` a :class:`Pipeline`,
    ``MODULE:ATTR``, or None for the ``app`` setting (else :data:`DEFAULT_APP`)."""
    if isinstance(app, Pipeline):
        settings = load_settings(flags, env, app=command_defaults(AppConfig.of(app)))
        app.validate()
        return settings, app
    loaded = load_app_settings({**flags, "app": app}, env)
    return loaded.settings, loaded.pipeline()
