"""The commands' view of app loading, which lives in :mod:`printery.apps` (the client
loads apps the same way)."""

from __future__ import annotations

from printery.apps import (
    DEFAULT_APP,
    LoadedApp,
    build_pipeline,
    command_defaults,
    default_app_config,
    import_app,
    load_app_settings,
)

__all__ = [
    "DEFAULT_APP",
    "LoadedApp",
    "build_pipeline",
    "command_defaults",
    "default_app_config",
    "import_app",
    "load_app_settings",
]
