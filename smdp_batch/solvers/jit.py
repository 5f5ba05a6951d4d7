"""Numba's compile step, kept out of every reported solve time.

The kernels are compiled with ``cache=True``: the first process after an install (or after a
change to their source) compiles them — seconds — and writes them to numba's on-disk cache;
later processes load them from there (tenths of a second).  Each solver module calls
:func:`warm_up` with its kernels and a run on a tiny model whose array types are those of every
real call (:func:`smdp_batch.solvers.pi.warm_up_pi`, :func:`smdp_batch.solvers.rvi.warm_up_rvi`):
once per process, *before* the solver starts its clock, so ``Solution.seconds`` and
``SolveResult.seconds`` time the solve alone.  When the on-disk cache is cold it first logs one
line on the ``smdp_batch`` logger, "compiling kernels (first run only, ~N s)", which the CLI
prints on stderr.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Callable, Sequence

__all__ = ["cache_is_warm", "warm_up"]

log = logging.getLogger("smdp_batch")

_done: set[str] = set()


def cache_is_warm(kernels: Sequence) -> bool:
    """Whether every numba dispatcher in ``kernels`` has a current entry in the on-disk cache."""
    try:
        return all(len(k._cache._cache_file._load_index()) > 0 for k in kernels)
    except AttributeError:  # numba's cache internals changed: say nothing rather than guess
        return True


def warm_up(name: str, kernels: Sequence, run: Callable[[], object], cold_seconds: float) -> float:
    """Load or compile ``kernels`` by calling ``run()`` once per process under ``name``; the seconds it took.

    ``cold_seconds`` is the measured cold compile, quoted in the notice.
    """
    if name in _done:
        return 0.0
    _done.add(name)
    if not cache_is_warm(kernels):
        log.info("compiling kernels (first run only, ~%d s)", round(cold_seconds))
    t0 = time.perf_counter()
    run()
    return time.perf_counter() - t0
