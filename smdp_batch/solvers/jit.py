"""Numba's compile step, kept out of every reported solve time.

The kernels are compiled with ``cache=True``: the first process after an install (or after a
change to their source) compiles them — seconds — and writes them to numba's on-disk cache;
later processes load them from there (tenths of a second); :mod:`smdp_batch.kernel_cache` keys that cache
by every kernel file, so an edit of one recompiles all.  Each solver module calls
:func:`warm_up` with its kernels and a run on a tiny model whose array types are those of every
real call (:func:`smdp_batch.solvers.pi.warm_up_pi`, :func:`smdp_batch.solvers.rvi.warm_up_rvi`):
once per process, *before* the solver starts its clock, so ``Solution.seconds`` and
``SolveResult.seconds`` time the solve alone.  When the on-disk cache is cold it first logs one
line on the ``smdp_batch`` logger, "compiling kernels (first run only, ~N s)", which the CLI
prints on stderr.

A cold compile is also made shorter: numba's compiler holds the GIL, so a warm-up may name a *side*
part with kernels of its own (PI's stationary law beside its evaluation and improvement) that a second
interpreter compiles into the on-disk cache while this process compiles the rest; this process then
loads the side kernels from the cache.  Any failure of the second interpreter only means this process
compiles them itself.
"""

from __future__ import annotations

import importlib
import logging
import os
import subprocess
import sys
import time
from collections.abc import Callable, Sequence

__all__ = ["cache_is_warm", "warm_up"]

log = logging.getLogger("smdp_batch")

_done: set[str] = set()


def cache_is_warm(kernels: Sequence) -> bool:
    """Whether every numba dispatcher in ``kernels`` has a current entry for this machine in the on-disk cache.

    An entry holds the target it was compiled for (numba's "magic tuple": OS, architecture, CPU and its
    features): a cache shared by machines of other CPUs (a package on a shared file system) is not warm here.
    A kernel inlined at numba's IR level (``inline="always"``) has no entry of its own (its callers' hold its
    code), so it is not asked about."""
    try:
        return all(any(key[1] == k.targetctx.codegen().magic_tuple() for key in k._cache._cache_file._load_index())
                   for k in kernels if getattr(k, "targetoptions", {}).get("inline") != "always")
    except (AttributeError, IndexError, TypeError):  # numba's cache internals changed: say nothing rather than guess
        return True


def warm_up(name: str, kernels: Sequence, run: Callable[[], object], cold_seconds: float,
            side: tuple[str, str] | None = None) -> float:
    """Load or compile ``kernels`` by calling ``run()`` once per process under ``name``; the seconds it took.

    ``cold_seconds`` is the measured cold compile, quoted in the notice.  ``side`` = (module, function):
    a second part of the warm-up, run after ``run``; on a cold cache a second interpreter runs it at the
    same time as ``run`` (two cores compile at once) and this process waits for it, then loads.
    """
    if name in _done:
        return 0.0
    _done.add(name)
    t0 = time.perf_counter()
    helper = None
    if not cache_is_warm(kernels):
        log.info("compiling kernels (first run only, ~%d s)", round(cold_seconds))
        if side is not None:
            helper = _start_side(side)
    try:
        run()
    except BaseException:
        if helper is not None:
            helper.kill()
            helper.wait()
        raise
    if helper is not None:
        try:
            helper.wait(timeout=4 * cold_seconds + 30)
        except subprocess.TimeoutExpired:  # whatever it left undone, this process compiles below
            helper.kill()
            helper.wait()
    if side is not None:
        getattr(importlib.import_module(side[0]), side[1])()
    return time.perf_counter() - t0


def _start_side(side: tuple[str, str]) -> subprocess.Popen | None:
    """A second interpreter running ``side`` on this very package (its folder first on the path), quiet."""
    package_parent = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
    env = dict(os.environ)
    env["PYTHONPATH"] = os.pathsep.join(p for p in (package_parent, env.get("PYTHONPATH", "")) if p)
    code = "import importlib, sys; getattr(importlib.import_module(sys.argv[1]), sys.argv[2])()"
    try:
        return subprocess.Popen([sys.executable, "-c", code, *side], env=env, stdin=subprocess.DEVNULL,
                                stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    except OSError:
        return None
