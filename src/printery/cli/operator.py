"""``printery``: the operator's tool (docs/reference.md, Commands).

A click group whose global options (before the subcommand) are the connection settings
shared with ``printery-workers``; each subcommand lives in a small ``ops_*`` module.
Exit status: 0 success, 1 failure or negative outcome, 2 usage (click's own usage errors
already exit 2), 3 for ``emit --wait`` timing out.
"""

from __future__ import annotations

import click

from printery.cli.common import apps_from_cwd, version_option
from printery.cli.ops_backfill import backfill
from printery.cli.ops_bench import bench
from printery.cli.ops_common import OpsContext
from printery.cli.ops_dlq import dlq
from printery.cli.ops_emit import emit
from printery.cli.ops_inspect import pipeline_group, status, streams
from printery.cli.ops_pending import pending
from printery.cli.ops_review import review
from printery.cli.ops_runs import runs
from printery.cli.ops_trace import cost, replay, trace
from printery.cli.ops_watch import watch


def _demo_command() -> click.Command:
    """``printery demo``, imported only when asked for: it pulls in the demo's web
    services, which every other subcommand would otherwise pay for at start-up."""
    from printery.cli.demo import demo

    return demo


class _OperatorGroup(click.Group):
    """A click group that adds the ``demo`` command lazily."""

    def list_commands(self, ctx: click.Context) -> list[str]:
        return sorted([*super().list_commands(ctx), "demo"])

    def get_command(self, ctx: click.Context, cmd_name: str) -> click.Command | None:
        command = super().get_command(ctx, cmd_name)
        if command is None and cmd_name == "demo":
            return _demo_command()
        return command


@click.group(cls=_OperatorGroup, context_settings={"help_option_names": ["-h", "--help"]})
@click.option("--redis-url", metavar="URL", default=None,
              help="redis://, rediss:// or unix:// URL [env: REDIS_URL; default: the "
                   "embedded server of the data dir]")
@click.option("--stream-prefix", metavar="PREFIX", default=None,
              help="key prefix of every stream [env: STREAM_PREFIX; default: "
                   "materi:events:deployment, unless the app declares its own]")
@click.option("--data-dir", metavar="DIR", default=None,
              help="the embedded server's data dir [env: PRINTERY_DATA_DIR; default: ./.printery]")
@click.option("--config", metavar="FILE", default=None,
              help="TOML config file [env: PRINTERY_CONFIG]")
@click.option("--app", metavar="MODULE:ATTR", default=None,
              help="the pipeline [env: PRINTERY_APP; default: the deployment pipeline]")
@click.option("--partitions", metavar="N", default=None,
              help="partitions of every stream, as the workers use [env: "
                   "PRINTERY_PARTITIONS; default: the count recorded in <prefix>:layout]")
@version_option
@click.pass_context
def printery(
    ctx: click.Context,
    redis_url: str | None,
    stream_prefix: str | None,
    data_dir: str | None,
    config: str | None,
    app: str | None,
    partitions: str | None,
) -> None:
    """Operate printery: publish, inspect streams, dead letters and reviews, trace, replay.

    Environment variables are read by the shared settings loader (not by click), so
    precedence is the same as the service's: flag > env var > config file > default.
    """
    apps_from_cwd()  # as for `printery-workers`
    ctx.obj = OpsContext(flags={
        "redis_url": redis_url or None, "stream_prefix": stream_prefix,
        "data_dir": data_dir, "config": config, "app": app,
        "partitions": partitions,
    })


for _command in (emit, status, streams, pending, dlq, review, trace, watch, pipeline_group, replay,
                 cost, bench, runs, backfill):
    printery.add_command(_command)


def main() -> None:
    """Console-script entry point."""
    printery(prog_name="printery")


if __name__ == "__main__":
    main()
