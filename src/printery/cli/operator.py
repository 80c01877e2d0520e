"""``printery``: the operator's tool (docs/reference.md, Commands).

A click group whose global options (before the subcommand) are the connection settings
shared with ``printery-workers``; each subcommand lives in a small ``ops_*`` module.
Exit status: 0 success, 1 failure or negative outcome, 2 usage (click's own usage errors
already exit 2), 3 for ``emit --wait`` timing out.
"""

from __future__ import annotations

import importlib

import click

from printery.cli.common import apps_from_cwd, version_option

#: Every subcommand: its module, its name there, and the first paragraph of its help, which
#: ``printery --help`` shortens as click does. A subcommand's module (and the runtime it
#: imports) is loaded only when that subcommand runs or shows its own help, so neither
#: ``printery --help`` nor one command pays for all the others (tests/unit/test_lazy_cli.py
#: checks that the summaries are the commands' own).
COMMANDS: dict[str, tuple[str, str, str]] = {
    "backfill": ("printery.cli.ops_backfill", "backfill",
                 "Hand STEP the retained entries of its streams it was never given (a step "
                 "added, or renamed without renamed_from, after the pipeline first ran); "
                 "prints the count."),
    "bench": ("printery.cli.ops_bench", "bench",
              "Throughput benchmark: hand-written relay ceilings vs printery's pipeline (with "
              "the library's default settings unless --prefetch is given); with --submit, the "
              "client; with --console, the web console (--events: GETs per page, default 200)."),
    "cancel": ("printery.cli.ops_runs", "cancel",
               "Cancel a run: exit 0 when this cancelled it, 1 when it had ended already (its "
               "status printed) or is unknown."),
    "cost": ("printery.cli.ops_trace", "cost",
             "Handler time and reported cost, summed per step and unit."),
    "demo": ("printery.cli.demo", "demo",
             "The five-minute tour: server, demo services, workers, one deployment per outcome."),
    "dlq": ("printery.cli.ops_dlq", "dlq", "Dead-lettered entries: list, show, replay, purge."),
    "emit": ("printery.cli.ops_emit", "emit",
             "Submit a run: a deployment request (deployment:started), or with --app and "
             "--type any pipeline's ingress entry; print its run id. The data is checked "
             "against the ingress step first (refused: the reasons, exit 1, nothing written)."),
    "pending": ("printery.cli.ops_pending", "pending",
                "Entries delivered to a worker and not acknowledged (in flight, or held by a "
                "consumer that died and not claimed yet), oldest first: with --json a list of "
                "objects with id, stream, worker, consumer, deliveries, idle_ms, run_id."),
    "pipeline": ("printery.cli.ops_inspect", "pipeline_group", "The pipeline's DAG."),
    "replay": ("printery.cli.ops_trace", "replay",
               "Run a deployment again from a step under a new id (replay_of = the original)."),
    "review": ("printery.cli.ops_review", "review",
               "Escalations waiting for a human: list, show, approve, reject."),
    "runs": ("printery.cli.ops_runs", "runs",
             "Runs newest first: id, status, start, end and cost."),
    "status": ("printery.cli.ops_inspect", "status",
               "Every running printery-workers process (any host) with its workers."),
    "streams": ("printery.cli.ops_inspect", "streams",
                "Each stream of the pipeline plus dlq and review: its length, and per consumer "
                "group its consumers, pending (delivered, not acknowledged), undelivered (not "
                "given to any consumer yet) and lag_s (seconds the oldest entry it owes has "
                "waited); with several partitions, each partition's stream."),
    "trace": ("printery.cli.ops_trace", "trace",
              "Every entry of one deployment across all streams, in time order, with durations."),
    "watch": ("printery.cli.ops_watch", "watch",
              "Follow one run live (a deployment id, or any pipeline's correlation id)."),
}


def load_command(name: str) -> click.Command:
    """The subcommand ``name``, its module imported now."""
    module, attribute, _ = COMMANDS[name]
    command = getattr(importlib.import_module(module), attribute)
    if not isinstance(command, click.Command):
        raise TypeError(f"{module}.{attribute} is not a click command")
    return command


class _OperatorGroup(click.Group):
    """A click group whose subcommands are imported when asked for (click's lazy group),
    and whose command list is written from :data:`COMMANDS` without importing any."""

    def list_commands(self, ctx: click.Context) -> list[str]:
        return sorted({*COMMANDS, *super().list_commands(ctx)})

    def get_command(self, ctx: click.Context, cmd_name: str) -> click.Command | None:
        if cmd_name in COMMANDS:
            return load_command(cmd_name)
        return super().get_command(ctx, cmd_name)  # one added with add_command, if any

    def format_commands(self, ctx: click.Context, formatter: click.HelpFormatter) -> None:
        listing = click.Group(commands=[click.Command(name, help=summary)
                                        for name, (_, _, summary) in COMMANDS.items()])
        for name, command in self.commands.items():
            listing.add_command(command, name)
        listing.format_commands(ctx, formatter)


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
    from printery.cli.ops_common import OpsContext

    apps_from_cwd()  # as for `printery-workers`
    ctx.obj = OpsContext(flags={
        "redis_url": redis_url or None, "stream_prefix": stream_prefix,
        "data_dir": data_dir, "config": config, "app": app,
        "partitions": partitions,
    })


def main() -> None:
    """Console-script entry point."""
    printery(prog_name="printery")


if __name__ == "__main__":
    main()
