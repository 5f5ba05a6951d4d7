"""Command line: ``smdp-batch solve | evaluate | simulate | compare | pareto | tables | export | show | profile |
measure | multibin | llm`` (DESIGN.md §4).

This module holds the click group and :func:`main`, the console entry point; each command lives in
its family's module (solve, simulate, pareto, export, profile, measure, llm), options shared between them in
:mod:`.options` and parameter types in :mod:`.types`.

Every command takes ``--json`` (keys: docs/json.md).  Bad input prints one line
``smdp-batch: error: …`` on stderr and exits with code 2 — never a traceback, never a half-written
file.  An old option spelling still works and prints one line ``smdp-batch: warning: … is deprecated``.
"""

from __future__ import annotations

import logging
import sys

import click

from .. import __version__
from ..errors import InputError
from .export import export_cmd
from .llm import llm_cmd, multibin_cmd
from .measure import measure_cmd
from .options import ARGV, DEFAULTS, NOTICES, build_problem, scenario_options
from .pareto import pareto_cmd
from .profile import profile_cmd
from .simulate import compare_cmd, simulate_cmd
from .solve import evaluate_cmd, show_cmd, solve_cmd, tables_cmd

__all__ = ["cli", "main", "build_problem", "scenario_options", "DEFAULTS"]


@click.group(context_settings={"help_option_names": ["-h", "--help"], "max_content_width": 110})
@click.version_option(__version__, prog_name="smdp-batch")
def cli():
    """Optimal dynamic-batching policies for batch-serving systems (SMDP, paper 004).

    Times in ms, energy in mJ, power in W, λ in requests/ms.
    """


for _cmd in (solve_cmd, evaluate_cmd, simulate_cmd, compare_cmd, pareto_cmd, tables_cmd, export_cmd, show_cmd,
             profile_cmd, measure_cmd, multibin_cmd, llm_cmd):
    cli.add_command(_cmd)


class _StderrNotice(logging.Handler):
    """The library's notices (e.g. numba compiling on a cold cache) as ``smdp-batch: …`` lines on stderr."""

    def emit(self, record: logging.LogRecord) -> None:
        click.echo(f"smdp-batch: {record.getMessage()}", err=True)


def _notices_to_stderr() -> None:
    log = logging.getLogger("smdp_batch")
    if not any(isinstance(h, _StderrNotice) for h in log.handlers):
        log.addHandler(_StderrNotice())
    log.setLevel(logging.INFO)


def _error(message: str) -> int:
    """The one stderr line of a failed run (deprecated spellings named at its end); exit code 2."""
    message = " ".join(str(message).split())
    if NOTICES:
        message += f" ({'; '.join(NOTICES)})"
    click.echo(f"smdp-batch: error: {message}", err=True)
    return 2


def main(argv: list[str] | None = None) -> int:
    """Console entry point; returns the exit code (errors: one line on stderr, code 2)."""
    args = sys.argv[1:] if argv is None else list(argv)
    ARGV[:] = args
    NOTICES.clear()
    _notices_to_stderr()
    if not args:
        click.echo(cli.get_help(click.Context(cli, info_name="smdp-batch")))
        return 0
    try:
        rc = cli.main(args=args, prog_name="smdp-batch", standalone_mode=False)
    except InputError as e:
        return _error(str(e))
    except click.ClickException as e:  # BadParameter, UsageError, NoSuchOption…: one line, not click's block
        return _error(e.format_message())
    except click.exceptions.Abort:
        click.echo("smdp-batch: aborted", err=True)
        return 1
    except OSError as e:
        where = f" ({e.filename})" if getattr(e, "filename", None) else ""
        return _error(f"{e.strerror or e}{where}")
    for line in NOTICES:
        click.echo(f"smdp-batch: warning: {line}", err=True)
    return rc if isinstance(rc, int) else 0
