"""What both commands share: loading the pipeline app, finding the server."""

from __future__ import annotations

import importlib
from typing import Any

from printery.config import Settings
from printery.errors import ConfigError
from printery.pipeline.dag import Pipeline

DEFAULT_APP = "printery.deploy.app:pipeline"
DEPLOY_WORKERS = ("validator", "dependency-checker", "health-monitor", "aggregator", "notifier")


def load_app(spec: str | None, settings: Settings) -> Pipeline:
    """Import ``MODULE:ATTR``: a :class:`Pipeline`, or a factory taking the settings.

    The pipeline is validated here, before anything connects (a bad app exits 2).
    """
    spec = spec or DEFAULT_APP
    module_name, _, attr = spec.partition(":")
    if not module_name or not attr:
        raise ConfigError("app", spec, "MODULE:ATTR naming a Pipeline or a factory")
    try:
        module = importlib.import_module(module_name)
    except ImportError as exc:
        raise ConfigError("app", spec, f"an importable module ({exc})") from None
    target: Any = getattr(module, attr, None)
    if target is None:
        raise ConfigError("app", spec, f"module {module_name} has no attribute {attr}")
    pipeline = target if isinstance(target, Pipeline) else target(settings) if callable(target) else None
    if not isinstance(pipeline, Pipeline):
        raise ConfigError("app", spec, "a printery.Pipeline or a callable returning one")
    try:
        pipeline.validate()
    except Exception as exc:
        raise ConfigError("app", spec, f"a valid pipeline ({exc})") from None
    return pipeline
