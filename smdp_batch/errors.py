"""Exception types. Every user-facing input problem raises :class:`InputError`."""

from __future__ import annotations


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
