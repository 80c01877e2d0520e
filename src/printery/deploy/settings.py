"""The deployment application's own settings (docs/reference.md, Configuration) and what
it tells printery.

Its TOML tables (``[validator]``, ``[dependency_checker]``, ``[health_monitor]``,
``[aggregator]``, ``[notifier]``) are declared here, not in the framework: :data:`CONFIG`
hands them to printery's settings loader, which validates them with its own settings,
before anything connects, with the same one-line errors. :data:`CONFIG` also sets the
application's default stream prefix, the seed's short worker names (``dependency``,
``health``) and the env var that holds the webhook secret, so logs never print it.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Literal, Protocol, TypeVar

from pydantic import BaseModel, Field, field_validator

from printery import AppConfig, SettingsTable
from printery.deploy.delivery import parse_channel
from printery.deploy.events import DEPENDENCY_CHECKER, HEALTH_MONITOR

__all__ = [
    "CONFIG",
    "STREAM_PREFIX",
    "AggregatorSettings",
    "DependencyCheckerSettings",
    "DeploySettings",
    "HasTables",
    "HealthMonitorSettings",
    "NotifierSettings",
    "ValidatorSettings",
]

#: Key prefix of every stream of the deployment pipeline (docs/reference.md, Commands).
STREAM_PREFIX = "materi:events:deployment"

M = TypeVar("M", bound=BaseModel)
Environment = Literal["development", "staging", "production"]


class ValidatorSettings(SettingsTable):
    """``[validator]``."""

    approval_required: tuple[Environment, ...] = ("production",)


class DependencyCheckerSettings(SettingsTable):
    """``[dependency_checker]``."""

    probe_timeout: float = Field(default=5.0, gt=0)
    retries: int = Field(default=2, ge=0)


class HealthMonitorSettings(SettingsTable):
    """``[health_monitor]``."""

    interval: float = Field(default=1.0, gt=0)
    consecutive: int = Field(default=3, ge=1)
    deadline: float = Field(default=60.0, gt=0)
    probe_timeout: float = Field(default=5.0, gt=0)


class AggregatorSettings(SettingsTable):
    """``[aggregator]``."""

    branch_deadline: float = Field(default=120.0, gt=0)


class NotifierSettings(SettingsTable):
    """``[notifier]``."""

    default_channels: tuple[str, ...] = Field(default=("log",), min_length=1)
    retries: int = Field(default=3, ge=0)
    backoff_ms: int = Field(default=500, gt=0)
    #: Name of the env var holding the HMAC secret, never the secret itself.
    webhook_secret_env: str = Field(default="PRINTERY_WEBHOOK_SECRET", min_length=1)
    allow_hosts: tuple[str, ...] = ()
    timeout: float = Field(default=10.0, gt=0)
    max_response_bytes: int = Field(default=65_536, ge=1)

    @field_validator("default_channels")
    @classmethod
    def _channels(cls, channels: tuple[str, ...]) -> tuple[str, ...]:
        """Each channel as ``notify`` takes it: a bad one is a bad setting (exit 2), not
        a log line per deployment that then notifies nobody."""
        for channel in channels:
            parse_channel(channel)  # its ValueError says what is wrong and what is allowed
        return channels


class HasTables(Protocol):
    """What the application needs of printery's settings: its validated tables."""

    def table(self, name: str, model: type[M]) -> M: ...


class DeploySettings(SettingsTable):
    """Every table of the deployment application: what :func:`build_pipeline` takes.

    Each field is one top-level TOML table; tests and the demo build one directly.
    """

    validator: ValidatorSettings = ValidatorSettings()
    dependency_checker: DependencyCheckerSettings = DependencyCheckerSettings()
    health_monitor: HealthMonitorSettings = HealthMonitorSettings()
    aggregator: AggregatorSettings = AggregatorSettings()
    notifier: NotifierSettings = NotifierSettings()

    @classmethod
    def of(cls, settings: HasTables) -> DeploySettings:
        """The tables printery's loader validated, from its settings."""
        return cls.model_validate({name: settings.table(name, t) for name, t in TABLES.items()})


#: Table name -> model, as printery's loader takes them.
TABLES: Mapping[str, type[BaseModel]] = {
    name: info.annotation
    for name, info in DeploySettings.model_fields.items()
    if isinstance(info.annotation, type) and issubclass(info.annotation, BaseModel)
}


def _secret_envs(settings: HasTables) -> list[str]:
    return [settings.table("notifier", NotifierSettings).webhook_secret_env]


#: Attached to the ``--app`` factory (:func:`printery.deploy.app.pipeline`).
CONFIG = AppConfig(
    tables=TABLES,
    defaults={"stream_prefix": STREAM_PREFIX},
    worker_aliases={"dependency": DEPENDENCY_CHECKER, "health": HEALTH_MONITOR},
    secret_envs=_secret_envs,
)
