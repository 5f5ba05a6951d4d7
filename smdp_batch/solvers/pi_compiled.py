"""Policy iteration as one compiled loop: the fast path for many small solves (paper 004 eq. 20).

:func:`.pi.pi_loop` is a short Python loop around two numba kernels, so that a first run after an
install compiles only those kernels (about 4 s).  Each of its steps then pays Python's and numba's
call overhead, and each evaluation factors the whole band again.  :func:`pi_loop_compiled` is the same
loop — the same starts, evaluations, window filters and improvement rule (:func:`.kernels.improve_step`),
in the same order — compiled as one function, and it factors less: an improved policy that agrees with
the current one below a state keeps the band's factored rows there (:func:`.banded.evaluate_factored`).
The kept rows are the same to the bit as factoring them again, and the evaluation is inlined as it is
in the Python loop's kernel, so the two loops answer the same status, policy, gain, relative values and
iteration count to the bit on every case the tests run.  Only the improvement's product goes
through numba's BLAS binding instead of NumPy's; that could decide a tie within round-off differently, as
any other BLAS build could (the improvement rule keeps the current action unless another is better by
1e-11 relative).  Measured with ``benchmarks/bench_solvers.py``: 0.43 → 0.22 ms per solve at Bmax 32,
s_max 70.  It pays on small models only (:data:`.pi.COMPILED_MAX_WORK`); on large ones the per-call
overhead it saves is nothing and its product through numba is slower, so those keep the Python loop.

Compiling it takes about 9 s more, which a first solve must not pay.  So :mod:`.pi` uses it only
once it is in numba's on-disk cache (loading it then takes ~20 ms), and when it is not, a
background interpreter at the lowest CPU priority compiles it into the cache
(:func:`start_background_compile`) while the solves go on with the Python loop; a long-running
process switches to it when that is done.
"""

from __future__ import annotations

import os
import subprocess
import sys
import tempfile
from collections.abc import Callable

import numpy as np

from ..kernel_cache import kernel_digest
from ..kernel_cache import njit  # numba's njit, its cache keyed by every kernel file
from .banded import evaluate_factored
from .kernels import BLOCK, improve_step  # BLOCK: rows of the window matrix one product takes (as kernels.improve)

__all__ = ["pi_loop_compiled", "start_background_compile"]


@njit(cache=True)
def _filters(P, SF, klo, khi, actions, s_max):
    """:func:`.kernels.window_filters` in numba: (F, tail, jmin), F (W × Au) in the frame j = next − level."""
    A = actions.shape[0]
    Au = 1
    while Au < A and actions[Au] <= s_max:
        Au += 1
    jmin, jmax = 1, 1
    for ai in range(1, Au):
        lo = klo[ai] - actions[ai]
        hi = khi[ai] - actions[ai]
        if lo < jmin:
            jmin = lo
        if hi > jmax:
            jmax = hi
    F = np.zeros((jmax - jmin + 1, Au))
    tail = np.zeros(A)
    F[1 - jmin, 0] = 1.0
    for ai in range(1, Au):
        a = actions[ai]
        for k in range(klo[ai], khi[ai] + 1):
            F[k - a - jmin, ai] = P[ai, k]
        tail[ai] = SF[ai, khi[ai]]
    return F, tail, jmin


@njit(cache=True)
def _improve(pol, g, h, costs, F, tail, jmin, Y, s_max):
    """:func:`.kernels.improve` in numba: the expectations of all (s, a) as blocks of one product, then the rule."""
    S = s_max + 2
    n = s_max + 1
    Wd, Au = F.shape
    A = costs.shape[1]
    hbar = np.empty(n + Wd)  # hbar[i] = h̄(i + jmin): 0 left of state 0, h(S_o) past s_max
    for i in range(n + Wd):
        j = i + jmin
        hbar[i] = 0.0 if j < 0 else (h[j] if j <= s_max else h[S - 1])
    EH = np.zeros((n, A))  # the columns past Au stay 0: those actions are infeasible everywhere (cost +inf)
    rows = n if n < BLOCK else BLOCK
    Hw = np.empty((rows, Wd))
    prod = np.empty((rows, Au))  # BLAS writes here (out=): a slice assignment of a product costs as much again
    hso = h[S - 1]
    for s0 in range(0, n, BLOCK):
        m = min(n, s0 + BLOCK) - s0
        for r in range(m):
            for t in range(Wd):
                Hw[r, t] = hbar[s0 + r + t]
        np.dot(Hw[:m], F, prod[:m])
        for r in range(m):
            for ai in range(Au):
                EH[s0 + r, ai] = prod[r, ai] + tail[ai] * hso
    return improve_step(pol, g, EH, costs, Y, s_max)


@njit(cache=True)
def _per_state(pol, table, per_state):
    """table[s, pol[s]] for each state; a (1, A) table (shared by every state) when not ``per_state``."""
    out = np.empty(pol.shape[0])
    for s in range(pol.shape[0]):
        out[s] = table[s if per_state else 0, pol[s]]
    return out


@njit(cache=True)
def _first_change(new, pol):
    """The first state where two policies differ (their length when they agree)."""
    for s in range(new.shape[0]):
        if new[s] != pol[s]:
            return s
    return new.shape[0]


@njit(cache=True, nogil=True)
def pi_loop_compiled(starts, costs, Y, P, SF, klo, khi, actions, s_max, max_iter):
    """:func:`.pi.pi_loop` as one compiled function: same arguments, same (status, pol, g, h, iterations, factors).

    An improved policy that agrees with the current one below some state keeps the factored rows of the
    band there (:func:`.banded.evaluate_factored`): late iterations that change only the top states or S_o
    (whose row is the border, outside the band) then factor little or nothing again.
    """
    per = Y.shape[0] > 1
    F, tail, jmin = _filters(P, SF, klo, khi, actions, s_max)
    pol = starts[0].copy()
    g = np.inf
    h = np.zeros(s_max + 2)
    st = starts[0]
    ok, g0, h0, factors = evaluate_factored(st, _per_state(st, costs, True), _per_state(st, Y, per),
                                            P, SF, klo, khi, actions, s_max, None)
    if ok:
        pol, g, h = st.copy(), g0, h0
    for c in range(1, starts.shape[0]):
        st = starts[c]
        ok, gc, hc, fc = evaluate_factored(st, _per_state(st, costs, True), _per_state(st, Y, per),
                                           P, SF, klo, khi, actions, s_max, None)
        if ok and gc < g:
            pol, g, h, factors = st.copy(), gc, hc, fc
    if not g < np.inf:  # EVAL_FAILED, no factors
        return 2, starts[0].copy(), np.nan, h, 0, (np.empty((0, 0)), np.empty(0, dtype=np.int64), np.int64(-1))
    for it in range(1, max_iter + 1):
        new = _improve(pol, g, h, costs, F, tail, jmin, Y, s_max)
        first = _first_change(new, pol)
        if first == new.shape[0]:
            return 0, pol, g, h, it, (factors[0], factors[3], factors[4])  # CONVERGED
        ok, g2, h2, f2 = evaluate_factored(new, _per_state(new, costs, True), _per_state(new, Y, per),
                                           P, SF, klo, khi, actions, s_max, (factors, first))
        if not ok:  # numerically multichain: the lower half of the switches, repeatedly (as .pi.pi_loop)
            changed = np.nonzero(new != pol)[0]
            trial = new
            k = changed.size // 2
            while not ok and k > 0:
                trial = pol.copy()
                for j in range(k):
                    trial[changed[j]] = new[changed[j]]
                ok, g2, h2, f2 = evaluate_factored(trial, _per_state(trial, costs, True), _per_state(trial, Y, per),
                                                   P, SF, klo, khi, actions, s_max, (factors, first))
                k //= 2
            if not ok:
                return 2, pol, g, h, it - 1, (factors[0], factors[3], factors[4])
            new = trial
        pol, g, h, factors = new, g2, h2, f2
    return 1, pol, g, h, max_iter, (factors[0], factors[3], factors[4])  # MAX_ITER


# ------------------------------------------------------------------------------------ background compile
def _lock_path() -> str:
    """One lock per kernel source (the digest :mod:`smdp_batch.kernel_cache` keys the cache by) and user."""
    uid = os.getuid() if hasattr(os, "getuid") else 0
    return os.path.join(tempfile.gettempdir(), f"smdp-batch-pi-compile-{uid}-{kernel_digest()[:16]}.lock")


def compile_into_cache(run: Callable[[], object]) -> None:
    """Compile :func:`pi_loop_compiled` into numba's on-disk cache by ``run()`` (in the background interpreter).

    ``run`` calls the loop with the argument types of every real call (:func:`.pi.run_tiny_compiled`).  One
    interpreter at a time per kernel source (a lock file); any other returns at once.
    """
    try:
        import fcntl
    except ImportError:  # pragma: no cover - not POSIX: compile without the lock
        fcntl = None  # type: ignore[assignment]
    with open(_lock_path(), "w") as lock:
        if fcntl is not None:
            try:
                fcntl.flock(lock, fcntl.LOCK_EX | fcntl.LOCK_NB)
            except OSError:
                return
        run()


def _lowest_priority() -> None:  # pragma: no cover - runs in the child between fork and exec
    try:
        os.sched_setscheduler(0, os.SCHED_IDLE, os.sched_param(0))
    except (AttributeError, OSError):
        try:
            os.nice(19)
        except OSError:
            pass


#: The environment variable that turns the background compile off (any non-empty value).
OFF_VARIABLE = "SMDP_BATCH_NO_BACKGROUND_COMPILE"


def start_background_compile() -> bool:
    """Start a detached interpreter that compiles the loop into the cache; False when it is off or cannot start.

    It runs under SCHED_IDLE (nice 19 where that is refused), with no terminal and its own session, so it
    takes only idle CPU and lives as long as its compile (~9 s of CPU), whether or not its parent still runs.
    """
    if os.environ.get(OFF_VARIABLE):
        return False
    package_parent = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
    env = dict(os.environ)
    env["PYTHONPATH"] = os.pathsep.join(p for p in (package_parent, env.get("PYTHONPATH", "")) if p)
    code = ("from smdp_batch.solvers.pi_compiled import compile_into_cache; "
            "from smdp_batch.solvers.pi import run_tiny_compiled; compile_into_cache(run_tiny_compiled)")
    try:
        subprocess.Popen([sys.executable, "-c", code], env=env, stdin=subprocess.DEVNULL, stdout=subprocess.DEVNULL,
                         stderr=subprocess.DEVNULL, start_new_session=True, preexec_fn=_lowest_priority)
    except OSError:
        return False
    return True
