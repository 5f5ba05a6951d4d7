"""Command line: ``smdp-batch solve | evaluate | simulate | compare | pareto | tables | export | show | profile |
measure | calibrate | multibin | llm | fit-arrivals`` (DESIGN.md §4).

This module holds the click group and :func:`main`, the console entry point; each command lives in
its family's module (solve, simulate, pareto, export, profile, measure, llm, fit), options shared between them in
:mod:`.options` and parameter types in :mod:`.types`.

Every command takes ``--json`` (keys: docs/json.md).  Bad input prints one line
``smdp-batch: error: …`` on stderr and exits with code 2 — never a traceback, never a half-written
file: each command validates its outputs before any work and they are renamed into place together at
its end (:mod:`smdp_batch.files`).  SIGTERM removes the temporary files as Ctrl-C does and exits 143.
An old option spelling still works and prints one line ``smdp-batch: warning: … is deprecated``.
"""

from __future__ import annotations

import gc
import logging
import signal
import sys

import click

from .. import __version__
from ..errors import InputError
from ..files import Terminated, atomic_outputs, outcome, quiet_interrupts
from .calibrate import calibrate_cmd
from .export import export_cmd
from .fit import fit_arrivals_cmd
from .llm import llm_cmd, multibin_cmd
from .measure import measure_cmd
from .options import ARGV, DEFAULTS, NOTICES, NOTICES_INFO, build_problem, scenario_options
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
             profile_cmd, measure_cmd, calibrate_cmd, multibin_cmd, llm_cmd, fit_arrivals_cmd):
    cli.add_command(_cmd)


class _StderrNotice(logging.Handler):
    """The library's notices (e.g. numba compiling on a cold cache) as ``smdp-batch: …`` lines on stderr."""

    def emit(self, record: logging.LogRecord) -> None:
        kind = "note" if record.levelno <= logging.INFO else "warning"
        click.echo(f"smdp-batch: {kind}: {record.getMessage()}", err=True)


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


def _first_signal(signum, frame):
    """SIGINT raises KeyboardInterrupt, SIGTERM :class:`Terminated`; a repeat is ignored, so that it cannot
    interrupt the cleanup the first one started."""
    for s in _SIGNALS:
        signal.signal(s, signal.SIG_IGN)
    _RECEIVED[:] = [int(signum)]
    raise KeyboardInterrupt() if signum == signal.SIGINT else Terminated()


#: the signal :func:`_first_signal` raised for, this run: a C extension that turns the raised exception into
#: an error of its own, without a chain (numba's ``_devicearray`` import: ImportError), still ends as a signal
_RECEIVED: list[int] = []


_SIGNALS = (signal.SIGINT, signal.SIGTERM)


def _install_handlers() -> dict | None:
    """Install :func:`_first_signal` for SIGINT and SIGTERM; the old handlers, or None where no handler can
    be installed (not the main thread)."""
    try:
        return {s: signal.signal(s, _first_signal) for s in _SIGNALS}
    except ValueError:
        return None


def _signalled(exc: BaseException | None) -> int | None:
    """128 + the signal behind ``exc`` — an interrupt wrapped by a compiled call (numba's SystemError "returned
    a result with an exception set"), by click (Abort) or by a library's own error — else None."""
    if _RECEIVED:
        return 128 + _RECEIVED[0]
    seen: set[int] = set()
    while exc is not None and id(exc) not in seen:
        seen.add(id(exc))
        if isinstance(exc, KeyboardInterrupt):
            return 128 + int(signal.SIGINT)
        if isinstance(exc, Terminated):
            return 128 + int(signal.SIGTERM)
        exc = exc.__cause__ or exc.__context__
    return None


#: the exception of the last interrupted command, kept: freeing its traceback runs the finalizers of what the signal
#: left half built (an LLVM module in numba's compiler), which can crash the process (glibc: "double free") after
#: the command's last line
_HELD: list[BaseException] = []


def _hold(e: BaseException, code: int) -> None:
    """Keep ``e`` alive and record the outcome ``code`` for the console's supervisor before the last line is
    printed; in the console's command process, which leaves with ``os._exit`` (never freeing ``e``), the cyclic
    garbage collector stops too, so that nothing half built is finalized on the way out."""
    _HELD[:] = [e]
    if outcome(code):
        gc.disable()


def main(argv: list[str] | None = None) -> int:
    """Console entry point; returns the exit code (errors: one line on stderr, code 2)."""
    args = sys.argv[1:] if argv is None else list(argv)
    ARGV[:] = args
    NOTICES.clear()
    NOTICES_INFO.clear()
    _RECEIVED.clear()
    _notices_to_stderr()
    if not args:
        click.echo(cli.get_help(click.Context(cli, info_name="smdp-batch")))
        return 0
    previous = _install_handlers()
    hook = sys.excepthook
    if previous is not None:
        sys.excepthook = quiet_interrupts(hook)
    plan = None
    try:
        import numpy as np

        # outputs are renamed into place together, or none is; an overflow in a user's curve is
        # reported by validation, not as a numpy warning block
        with atomic_outputs() as plan, np.errstate(all="ignore"):
            rc = cli.main(args=args, prog_name="smdp-batch", standalone_mode=False)
    except BaseException as e:
        code = _signalled(e)
        if code is None:
            return _failed(e)
        if plan is None or not plan.committed:
            _hold(e, code)
            click.echo(f"smdp-batch: {'interrupted' if code == 128 + int(signal.SIGINT) else 'terminated'}", err=True)
            return code
        rc = 0  # the signal waited for the final renames: the command had finished, its outputs are complete
    finally:
        if previous is not None:
            sys.excepthook = hook
            for s, handler in previous.items():
                signal.signal(s, handler)
    for line in dict.fromkeys(NOTICES_INFO):
        click.echo(f"smdp-batch: note: {line}", err=True)
    for line in NOTICES:
        click.echo(f"smdp-batch: warning: {line}", err=True)
    return rc if isinstance(rc, int) else 0


def _failed(e: BaseException) -> int:
    """The exit code and one stderr line of a run that raised ``e`` (no signal behind it)."""
    try:
        raise e
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
    except MemoryError:
        return _error("out of memory: the input asks for more memory than this machine has; use smaller sizes")
    except Exception as e:  # last line of defence: a bug, reported on one line (exit 70, EX_SOFTWARE)
        text = " ".join(str(e).split())[:500]
        click.echo(f"smdp-batch: error: internal error: {type(e).__name__}: {text} (please report)", err=True)
        return 70
