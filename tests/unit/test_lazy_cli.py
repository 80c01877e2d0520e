"""``printery`` imports a subcommand only when it runs (docs/reference.md, Commands): its
command list comes from a table, which must say what the commands themselves say."""

from __future__ import annotations

import subprocess
import sys

import click

from printery.cli import operator


def test_the_table_summarises_each_command_as_its_own_help_does() -> None:
    ctx = click.Context(operator.printery)
    for name, (_, _, summary) in operator.COMMANDS.items():
        command = operator.load_command(name)
        assert command.name in (name, "pipeline_group"), name
        first = " ".join((command.help or "").split("\n\n")[0].split())
        assert (summary, command.short_help, command.hidden) == (first, None, False), name
    lazy = click.HelpFormatter(width=80)
    operator.printery.format_commands(ctx, lazy)
    loaded = click.HelpFormatter(width=80)
    click.Group(commands=[operator.load_command(n) for n in operator.COMMANDS]).format_commands(
        ctx, loaded)
    assert lazy.getvalue().replace("pipeline_group", "pipeline") == loaded.getvalue().replace(
        "pipeline_group", "pipeline")


def test_help_imports_no_subcommand() -> None:
    code = ("import sys\n"
            "sys.argv = ['printery', '--help']\n"
            "from printery.cli.operator import main\n"
            "try:\n    main()\nexcept SystemExit:\n    pass\n"
            "print(sorted(m for m in sys.modules if m.startswith('printery') or m == 'redis'),"
            " file=sys.stderr)\n")
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True,
                          timeout=60, check=True)
    assert "Commands:" in done.stdout and "watch" in done.stdout
    assert done.stderr.split() == ["['printery',", "'printery.cli',", "'printery.cli.common',",
                                   "'printery.cli.operator']"]
