"""``printery-workers``: the service command (docs/reference.md, Commands).

Options are generated from :data:`printery.settings.config.SETTINGS_DOC`, so ``--help`` and the
loader can never disagree on a flag, its env var or its default. Click's own ``envvar``
is deliberately not used: the loader reads the environment itself, which is what makes
the precedence flag > env > file > default hold in one place. A flag counts as given
only when it was on the command line (click's parameter source), so a switch left off
does not hide ``SUPERVISED_MODE=true``.

Settings are validated before anything connects, in the order of
:mod:`printery.runs.apps`: the framework's (to find ``--app``), then with the app's
:class:`~printery.AppConfig` (its tables, defaults and worker aliases), then once more
with the pipeline's worker names and review kinds, so ``--worker``, ``[workers.<name>]``
and ``[review.<kind>]`` are checked against the pipeline actually run. Any
:class:`ConfigError` becomes exit 2 with exactly one line on stderr.
"""

from __future__ import annotations

import os
from collections.abc import Callable
from typing import Any

import click
from click.core import ParameterSource

from printery.base.errors import ConfigError
from printery.cli.common import apps_from_cwd, version_option
from printery.pipeline.dag import Pipeline
from printery.runs.apps import command_defaults, default_app_config, load_app_settings
from printery.settings.config import SETTINGS_DOC, SettingDoc, Settings
from printery.settings.config_load import load_settings

__all__ = ["EXIT_CONFIG", "main", "resolve"]

EXIT_CONFIG = 2


def _param_name(flag: str) -> str:
    return flag.lstrip("-").replace("-", "_")


def _help(doc: SettingDoc, app_defaults: dict[str, object]) -> str:
    """The option's help; a default the default app changes is named as the app's."""
    if doc.name == "app":
        return doc.help_with_default("the deployment pipeline")
    if doc.name in app_defaults:
        return doc.help_with_default(
            f"{app_defaults[doc.name]}, unless the app declares its own"
        )
    return doc.help_text


def _options(func: Callable[..., Any]) -> Callable[..., Any]:
    """Attach one click option per setting, in ``SETTINGS_DOC`` order."""
    app_defaults = dict(command_defaults(default_app_config()).defaults)
    for doc in reversed(list(SETTINGS_DOC.values())):
        if doc.name == "config":
            # SETTINGS_DOC's config entry keeps its metavar in the `help` slot.
            option = click.option(
                "--config", "config", metavar="FILE", default=None,
                help="TOML config file (docs/reference.md, Configuration) "
                     "[env: PRINTERY_CONFIG; default: none]",
            )
        elif doc.metavar is None:
            option = click.option(
                doc.flag, _param_name(doc.flag), is_flag=True, default=False,
                help=_help(doc, app_defaults),
            )
        else:
            option = click.option(
                doc.flag, _param_name(doc.flag), metavar=doc.metavar, default=None,
                help=_help(doc, app_defaults),
            )
        func = option(func)
    return func


def resolve(
    flags: dict[str, object | None], env: dict[str, str]
) -> tuple[Settings, Pipeline]:
    """Validated settings and the loaded pipeline, or :class:`ConfigError`."""
    loaded = load_app_settings(flags, env)
    pipeline = loaded.pipeline()
    names = list(pipeline.steps)
    settings = load_settings(flags, env, app=loaded.settings.app_config, worker_names=names,
                             review_kinds=review_kinds(pipeline))
    settings.selected_workers(names)
    return settings, pipeline


def review_kinds(pipeline: Pipeline) -> list[str]:
    """The review kinds ``pipeline`` declares: registered (``Pipeline.review_kind``, the
    budget's), and each validation loop's."""
    kinds = set(pipeline.review_kinds)
    kinds.update(step.loop.review_kind for step in pipeline.steps.values()
                 if step.loop is not None and step.loop.review_kind)
    return sorted(kinds)


def _child_args(flags: dict[str, object | None]) -> list[str]:
    """The command line given, rebuilt from the parsed flags, for ``--processes`` children
    (env vars and the config file reach them through inheritance)."""
    args: list[str] = []
    for name, value in flags.items():
        if value is None or value is False:
            continue
        flag = "--config" if name == "config" else next(
            doc.flag for doc in SETTINGS_DOC.values() if _param_name(doc.flag) == name
        )
        args += [flag] if value is True else [flag, str(value)]
    return args


@click.command(
    "printery-workers",
    context_settings={"help_option_names": ["-h", "--help"], "max_content_width": 100},
)
@_options
@version_option
@click.pass_context
def cli(ctx: click.Context, /, **params: Any) -> None:
    """Run printery's workers until SIGTERM or SIGINT.

    Exit status: 0 after a graceful shutdown, 1 when a worker fails (standalone mode,
    or --exit-on-failure), 2 for a bad setting.
    """
    flags: dict[str, object | None] = {}
    for name, value in params.items():
        given = ctx.get_parameter_source(name) == ParameterSource.COMMANDLINE
        flags[name] = value if given else None
    env = dict(os.environ)
    apps_from_cwd()
    try:
        settings, pipeline = resolve(flags, env)
    except ConfigError as exc:
        click.echo(" ".join(str(exc).split()), err=True)
        ctx.exit(EXIT_CONFIG)
    if settings.processes > 1:
        from printery.cli.multiprocess import Parent

        ctx.exit(Parent(settings, pipeline, _child_args(flags)).run())
    from printery.service.service import Service

    ctx.exit(Service(settings, pipeline).run())


def main(argv: list[str] | None = None) -> None:
    """Console-script entry point (``printery.cli.workers:main``)."""
    cli.main(args=argv, prog_name="printery-workers")


if __name__ == "__main__":
    main()
