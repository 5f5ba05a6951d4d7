"""Policy iteration for exponential batch times in O(S) memory (paper 004 eqs. 18–22; Puterman §11.4, Howard).

The model and the improvement step's Q-values are :mod:`.geometric`'s, its O(S) evaluation
:mod:`.geometric_system`'s; this is the loop around them. It improves with V_a(·) by its recursion for every
allowed a: O(S·A) time, O(S) memory, no arrival table.  Once the policy moves only locally (from a given start,
or after an improvement that moved no action index by more than WINDOW/4) the improvements weigh only the
actions within :data:`WINDOW` of each state's — still policy improvement, as the current action is among them —
and the loop ends only on a tight evaluation whose improvement over *every* action returns the same policy (at
Bmax 1 024: 40 ms a windowed pass, 0.3 s a full one). A state's action changes only when another is better by
more than :data:`IMPROVE_RTOL` relative to |Q|, 1e-13 rather than the general solvers' 1e-11: here |Q| reaches
~10¹⁰ at n ~ 10⁵, where 1e-11 would leave a tie band of ±33 states around each switch (the Q differences are
accurate to ~1e-14 relative, the GMRES residual's). Early evaluations are loose (GMRES to 1e-5, then 1e-7;
inexact policy iteration), the last ones tight (1e-12), and the loop ends only when a tight evaluation's
improvement returns the same policy.
"""

from __future__ import annotations

import time
from dataclasses import dataclass
from typing import Callable

import numpy as np

from ..errors import InputError, warn_not_converged
from ..model.problem import BatchingProblem
from .geometric import (GeometricModel, _effective_up, _end_windows, _flush_small, _matvec, _pivots, _q_full,
                        _q_pass, _ranges, _rhs, _rmatvec, _rows, _sweep, _v_at, _v_terms, geometric_model)
from .geometric_sums import window_scatter, window_sums
from .geometric_system import LOOSE, RESIDUAL_TOL, ROUGH, TIGHT, _q, _residual, _System, metrics
from .jit import warm_up

__all__ = ["GeometricPI", "greedy", "policy_iteration", "warm_up_geometric"]


#: A state's action changes only when another is better by more than this, relative to |Q|.
IMPROVE_RTOL = 1e-13
#: Once an improvement moves no state's action index by more than WINDOW/4, the next ones weigh only the actions
#: within WINDOW of each state's (a pass over ~2·WINDOW actions per state instead of all of them); a policy
#: is only declared optimal after an improvement over every action returns it.
WINDOW = 32


@dataclass(frozen=True)
class GeometricPI:
    """Policy iteration's answer on one truncation: π (action indices), ĝ, h, iterations, GMRES iterations."""

    policy: np.ndarray
    gain: float
    values: np.ndarray
    iterations: int
    krylov: int
    seconds: float
    converged: bool


def greedy(model: GeometricModel) -> np.ndarray:
    """Serve the largest feasible batch (eq. 16), B at s_max."""
    pol = np.searchsorted(model.sizes, np.minimum(np.arange(model.s_max + 1), model.sizes[-1]), side="right") - 1
    pol[-1] = model.tail
    return pol.astype(np.int64)


def policy_iteration(model: GeometricModel, pol0: np.ndarray | None = None, max_iter: int = 200,
                     log=None, near: bool | None = None,
                     guess: tuple[float, np.ndarray] | None = None, settle: bool = False,
                     likely: Callable[[np.ndarray], None] | None = None) -> GeometricPI:
    """Exact PI (module doc) from ``pol0`` (default greedy), ended by a tight evaluation that improves to itself;
    ``near`` (default: whether pol0 is given): start with tight evaluations, pol0 being nearly optimal;
    ``guess``: (ĝ, h) near pol0's, where the first evaluation's GMRES starts (default: the preconditioned cost);
    ``settle``: a start for a finer problem, so stop (converged False, no warning) once the loose evaluations'
    policy has settled, returning the last improvement with the (ĝ, h) it was made from; ``likely``: called with
    each policy about to be evaluated tightly after an improvement that moved at most 16 states (a likely answer),
    so that the caller can start work that depends on the answer."""
    t0 = time.perf_counter()
    pol = greedy(model) if pol0 is None else np.asarray(pol0, dtype=np.int64).copy()
    pol[-1] = model.tail
    near = pol0 is not None if near is None else near
    rtol, krylov = TIGHT if near else ROUGH, 0
    # the improvement's actions: from a given start (a coarser size set's policy, a shorter truncation's) those near
    # each state's, else every one until the policy moves only locally (WINDOW)
    width = WINDOW if pol0 is not None else -1
    g, h = 0.0, np.zeros(pol.size)
    changed = pol.size
    for it in range(max_iter):
        if likely is not None and rtol == TIGHT and changed <= 16:
            likely(pol)
        system = _System(model, pol)
        g, h, k = system.solve(model.cost, rtol, guess, maxiter=3600 if rtol == TIGHT else 2400)
        krylov += k
        if k == 0 and it > 0 and rtol != TIGHT:
            # (ĝ, h) is the one pol was improved from, already within rtol for it: improving again returns pol
            if log is not None:
                log(f"PI {it}: the last (ĝ, h) holds for this policy at rtol {rtol:.0e}; evaluating tightly")
            rtol = TIGHT
            continue
        guess = (g, h)
        while True:
            qcur, qbest, best = _q(model, model.cost, pol, g, h, width)
            new = np.where(qcur - qbest > IMPROVE_RTOL * (1.0 + np.abs(qcur)), best, pol)
            changed = int(np.count_nonzero(new != pol))
            if changed or width < 0 or rtol != TIGHT:
                break
            width = -1  # nothing within the window: only every action can certify the policy
        res = _residual(h, qcur)
        if log is not None:
            log(f"PI {it}: ĝ = {g:.12g}, {k} GMRES iterations (rtol {rtol:.0e}), residual {res:.1e}, "
                f"{changed} states change" + (f" (actions within {width} of π(s))" if width >= 0 else ""))
        moved = int(np.max(np.abs(new - pol))) if changed else 0
        width = WINDOW if 0 < moved <= WINDOW // 4 else -1
        if rtol == TIGHT and not res < RESIDUAL_TOL:
            raise InputError(f"policy iteration's evaluation did not converge (residual {res:.3g} at ĝ = {g:.6g})")
        if changed == 0:
            if rtol == TIGHT:
                return GeometricPI(pol, g, h, it + 1, krylov, time.perf_counter() - t0, True)
            rtol = TIGHT
            continue
        if changed <= max(16, pol.size // 1000):
            if settle:
                return GeometricPI(new, g, h, it + 1, krylov, time.perf_counter() - t0, False)
            rtol = TIGHT
        elif changed <= pol.size // 10 and rtol == ROUGH:
            rtol = LOOSE
        pol = new
    warn_not_converged(f"policy iteration stopped after {max_iter} iterations")
    return GeometricPI(pol, g, h, max_iter, krylov, time.perf_counter() - t0, False)


#: The kernels :func:`warm_up_geometric` loads or compiles (the inlined ones ride in their callers).
KERNELS = (_rows, _effective_up, _flush_small, _pivots, _sweep, _v_terms, _v_at, _end_windows, _matvec, _rmatvec,
           _rhs, _q_pass, _q_full, _ranges, window_sums, window_scatter)
#: Cold compile of these kernels on the 2-core dev machine, seconds (the notice :func:`~.jit.warm_up` prints).
COLD_SECONDS = 10


def _tiny_run() -> None:
    p = BatchingProblem.from_rho(0.8, batch_sizes=(1, 2, 3), service="exp")
    m = geometric_model(p, 12)
    r = policy_iteration(m)
    metrics(m, r.policy, r.gain)


def warm_up_geometric() -> float:
    """Load or compile this module's kernels once per process (:mod:`.jit`); the seconds it took."""
    return warm_up("geometric", KERNELS, _tiny_run,
                   COLD_SECONDS)
