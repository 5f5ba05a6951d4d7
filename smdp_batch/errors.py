"""Exception and warning types (every user-facing input problem raises :class:`InputError`), and how a solver
warns that it did not converge: :func:`warn_not_converged`, silenced per thread where the caller checks
(:func:`solver_checks_convergence`)."""

from __future__ import annotations

import contextlib
import threading
import warnings
from typing import Iterator


class InputError(ValueError):
    """Invalid user input: the message names the bad value and what would be valid.

    The CLI prints the message on one line and exits with code 2.
    """


class PolicyFileError(InputError):
    """A file that is not a readable smdp-batch policy table (wrong format or version)."""


class NotConvergedWarning(RuntimeWarning):
    """A solver stopped at its iteration cap before meeting its tolerance."""


class DegenerateTruncationWarning(RuntimeWarning):
    """The truncated model's optimal policy never serves the overflow state (eq. 22 Δ large)."""


class TableNotConvergedWarning(RuntimeWarning):
    """The converged-table search hit its state or work limit: the table's decisions are not verified
    against a larger truncation (``Solution.converged_upto`` is None)."""


_QUIET = threading.local()  # per thread: how many solver_checks_convergence blocks are open


@contextlib.contextmanager
def solver_checks_convergence() -> Iterator[None]:
    """Within it, the solvers this thread calls do not warn :class:`NotConvergedWarning`: the caller reads
    ``converged`` itself.  Thread-safe, unlike ``warnings.catch_warnings``, which swaps the process-wide filter
    list: a thread leaving its block put the list back under another thread still inside its own, whose
    warning then reached the caller's filters (seen: the SLO search's parallel families, one PI at its cap)."""
    _QUIET.depth = getattr(_QUIET, "depth", 0) + 1
    try:
        yield
    finally:
        _QUIET.depth -= 1


def warn_not_converged(message: str, stacklevel: int = 2) -> None:
    """Warn :class:`NotConvergedWarning` from a solver (``stacklevel`` as ``warnings.warn``'s, counted from the
    solver), unless its caller checks convergence itself (:func:`solver_checks_convergence`)."""
    if not getattr(_QUIET, "depth", 0):
        warnings.warn(message, NotConvergedWarning, stacklevel=stacklevel + 1)
