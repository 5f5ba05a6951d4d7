"""Exact average-cost policy iteration for the truncated SMDP (paper 004 eq. 20; Puterman §11.4).

Evaluation solves h(s) = ĉ(s,π) − g·y(s,π) + Σ_j m̂(j|s,π)h(j) with h(s*) = 0, s* = 0, as one
linear system in (g, h) (the column of h(s*) is replaced by y).  The truncated model is unichain
under every policy (paper 004 Lemma 2), so the system is non-singular.  Improvement picks
argmin_a ĉ(s,a) − g·y(a) + Σ_j m̂(j|s,a)h(j), keeping the current action unless another is better
by more than a round-off tolerance; the loop ends when the policy repeats, which certifies
optimality of the truncated SMDP (no ε).

The loop (:func:`pi_loop`, a handful of iterations) calls two kernels: evaluation by the numba
banded LU without pivoting of :mod:`.banded`, certified by the residual of eq. 20; improvement by
the BLAS product of :func:`.kernels.improve`.  A degenerate truncation's policy that waits in S_o (absorbing
there) evaluates there too, and an improved policy that does not evaluate (numerically multichain: typically
the top states or S_o switching to "wait" once tail masses underflow) is replaced by the lower half of its
switches, repeatedly — any subset of improving switches improves.  If none evaluates, one improvement is made
here from the last evaluated policy with the pivoting LAPACK solve (:func:`.banded.gain_bias`), the sliding
expectations of :func:`.kernels.expected_next_table` and the same improvement rule
(:func:`.kernels.improve_step`), and the fast loop goes on from the policy it lands on.  On the 256-problem sweep
of ``benchmarks/bench_solvers.py`` (case E) 10 problems instead of 21 need the pivoting solve, for 1–2 steps
each instead of 4–5, with the same policies and gains to 1e-15.
"""

from __future__ import annotations

import time

import numpy as np

from ..errors import InputError, warn_not_converged
from ..model.problem import BatchingProblem
from ..model.truncation import TruncatedSMDP, truncate
from .banded import (NO_FACTORS, assemble, band_widths, evaluate_policy_banded, gain_bias, stationary,
                     stationary_banded)
from .kernels import (expected_next_table, improve, improve_step, usable_actions, window_filters,
                      window_span)
from .jit import cache_is_warm, warm_up
from .pi_compiled import pi_loop_compiled, start_background_compile
from .result import SolveResult
from .threads import single_blas

#: pi_loop status codes
CONVERGED, MAX_ITER, EVAL_FAILED = 0, 1, 2


def _initial_policy(model: TruncatedSMDP) -> np.ndarray:
    """Greedy (serve the largest feasible batch, eq. 16): stabilising, so a good start.

    The actions ascend, so the largest one ≤ a state's level is where the level sorts in; the tail boundary's
    last two states allow only its B (:meth:`~.TruncatedSMDP.feasible`)."""
    idx = np.searchsorted(model.actions, model.state_level(), side="right").astype(np.int64) - 1
    if model.tail_action:
        idx[-2:] = int(np.searchsorted(model.actions, model.tail_action))
    return idx


def _starts(model: TruncatedSMDP) -> np.ndarray:
    """Default starts: greedy and the control-limit rule "wait below ⌈Bmax/4⌉, then greedy".

    PI begins from whichever has the lower gain.  At light load the optimum waits for a batch,
    and greedy is then a poor start (paper 004 Fig. 3): on Table III's case the control-limit
    start halves the iterations (7 → 4); where greedy is better (w2 = 0, say) it is kept.
    """
    greedy = _initial_policy(model)
    limit = greedy.copy()
    limit[: max(1, -(-model.problem.bmax // 4))] = 0
    return np.stack([greedy, limit])


def evaluate_gain_bias(model: TruncatedSMDP, pol_idx: np.ndarray, costs: np.ndarray | None = None):
    """(g, h) of a policy given as action indices: exact (sparse) solve of eq. 20 restricted to π."""
    if costs is None:
        costs = model.costs()
    return gain_bias(model, pol_idx, costs[np.arange(model.n_states), pol_idx])


def _improve(model: TruncatedSMDP, pol: np.ndarray, new: np.ndarray, costs: np.ndarray):
    """Adopt the improving switches ``new`` and evaluate; (policy, g, h).

    Any subset of improving switches is itself an improvement (policy improvement theorem), so
    when the full switch gives a numerically multichain policy — typically the top states and
    S_o switching to "wait" once tail masses underflow — keep only the lower half of the
    switched states, repeatedly.  If no subset evaluates, the truncation's optimum waits at the
    top (a degenerate truncation) and InputError is raised.
    """
    changed = np.nonzero(new != pol)[0]
    while changed.size:
        trial = pol.copy()
        trial[changed] = new[changed]
        try:
            g, h = evaluate_gain_bias(model, trial, costs)
            return trial, g, h
        except InputError:
            changed = changed[: changed.size // 2]
    raise InputError(
        "policy iteration reached a numerically multichain policy: the truncation's optimum waits at the top "
        "(degenerate); use a larger s_max or s_max='auto'"
    )


def _pi_pivoting(model: TruncatedSMDP, pol: np.ndarray, costs: np.ndarray, max_iter: int,
                 gh: tuple[float, np.ndarray] | None = None):
    """The PI loop with LAPACK (pivoting) evaluations; (policy, g, h, iterations, converged).  ``gh``: ``pol``'s
    (g, h) where the fast loop evaluated it (certified there), else it is evaluated here first."""
    Y = model.sojourn_rows()
    g, h = evaluate_gain_bias(model, pol, costs) if gh is None or not np.isfinite(gh[0]) else gh
    it = 0
    for it in range(1, max_iter + 1):
        EH = expected_next_table(h, model.P, model.SF, model.klo, model.khi, model.actions, model.s_max)
        new = improve_step(pol, g, EH, costs, Y, model.s_max)
        if np.array_equal(new, pol):
            return pol, g, h, it, True
        pol, g, h = _improve(model, pol, new, costs)
    return pol, g, h, it, False


def pi_loop(starts, costs, Y, P, SF, klo, khi, actions, s_max, max_iter):
    """Policy iteration from the best of ``starts`` (C × S action indices; the lowest gain).

    ``Y``: the sojourns, (S, A) or the (1, A) row every state shares (:meth:`~.TruncatedSMDP.sojourn_rows`).

    Returns (status, pol, g, h, iterations, factors).  status: CONVERGED (the policy repeated), MAX_ITER,
    or EVAL_FAILED — a policy did not evaluate here; ``pol`` is then the last one that did
    (``starts[0]`` if none did, with g = NaN) and the caller finishes with the pivoting solver,
    which also handles numerically multichain switches.  ``factors``: :data:`.banded.NO_FACTORS` (the compiled loop
    returns ``pol``'s band factors for its stationary law; this loop runs on large models, where holding a second
    band beside the one being factored would double the peak memory).

    The loop itself is Python (a handful of iterations); its two steps are numba kernels, so a first
    run compiles only them and never a third copy of their bodies inside a compiled loop.
    """
    rows = np.arange(costs.shape[0])
    yrows = rows if Y.shape[0] > 1 else np.zeros_like(rows)  # Y[yrows, pol]: each state's sojourn under pol
    F, tail, jmin = window_filters(P, SF, klo, khi, actions, s_max)
    pol = starts[0].copy()
    g = np.inf
    h = np.zeros(s_max + 2)
    for c in range(starts.shape[0]):
        ok, gc, hc = evaluate_policy_banded(starts[c], costs[rows, starts[c]], Y[yrows, starts[c]],
                                            P, SF, klo, khi, actions, s_max)
        if ok and gc < g:
            pol, g, h = starts[c].copy(), gc, hc
    if not g < np.inf:
        return EVAL_FAILED, starts[0].copy(), np.nan, h, 0, NO_FACTORS
    for it in range(1, max_iter + 1):
        new = improve(pol, g, h, costs, F, tail, jmin, Y, s_max)
        if np.array_equal(new, pol):
            return CONVERGED, pol, g, h, it, NO_FACTORS
        ok, g2, h2 = evaluate_policy_banded(new, costs[rows, new], Y[yrows, new], P, SF, klo, khi, actions, s_max)
        changed = np.nonzero(new != pol)[0]
        k = changed.size // 2
        while not ok and k > 0:  # numerically multichain: the lower half of the switches, repeatedly (as _improve)
            trial = pol.copy()
            trial[changed[:k]] = new[changed[:k]]
            ok, g2, h2 = evaluate_policy_banded(trial, costs[rows, trial], Y[yrows, trial], P, SF, klo, khi, actions,
                                                s_max)
            new = trial
            k //= 2
        if not ok:
            return EVAL_FAILED, pol, g, h, it - 1, NO_FACTORS
        pol, g, h = new, g2, h2
    return MAX_ITER, pol, g, h, max_iter, NO_FACTORS


#: Operations of one improvement sweep (states × actions × window) PI accepts for a fixed truncation:
#: ~10 s per sweep on the 2-core machine; s_max = 10⁶ with deterministic service (Bmax 32) needs 3.3e9.
PI_WORK_LIMIT = 2e10


def check_pi_work(model: TruncatedSMDP) -> None:
    """Refuse, before any work, a truncation whose improvement sweeps would take minutes each."""
    # a bound first: the window is at most the arrival columns plus Bmax + 1 wide (most calls stop here)
    if float(model.n_states) * len(model.actions) * (model.P.shape[1] + int(model.actions[-1]) + 2) <= PI_WORK_LIMIT:
        return
    jmin, jmax = window_span(model.klo, model.khi, model.actions, model.s_max)
    width = float(jmax - jmin + 1)  # the window W of :func:`.kernels.improve`
    work = float(model.n_states) * usable_actions(model.actions, model.s_max) * width
    if work > PI_WORK_LIMIT:
        raise InputError(
            f"policy iteration at s_max = {model.s_max} with {len(model.actions) - 1} batch sizes and arrival rows "
            f"{width:.0f} states wide needs ~{work:.2g} operations per improvement sweep (limit {PI_WORK_LIMIT:.2g}); "
            "use a smaller s_max, s_max='auto' or fewer batch sizes")


def policy_iteration(
    model: TruncatedSMDP,
    policy0: np.ndarray | None = None,
    max_iter: int = 1000,
) -> SolveResult:
    """Solve the truncated SMDP exactly by policy iteration.

    ``policy0`` (batch sizes, length s_max+2) warm-starts the iteration; by default it starts
    from the better of greedy and a control-limit rule (:func:`_starts`).
    """
    check_pi_work(model)
    warm_up_pi()
    starts = None if policy0 is None else model.action_index(policy0)[None, :]
    return solve_indices(model, starts, model.costs(), max_iter)[0]


def solve_indices(model: TruncatedSMDP, starts: np.ndarray | None, costs: np.ndarray,
                  max_iter: int = 1000) -> tuple[SolveResult, np.ndarray, tuple]:
    """:func:`policy_iteration` on checked inputs: ``starts`` (C × S feasible action indices; None: :func:`_starts`),
    ``costs`` the model's (:meth:`~.TruncatedSMDP.costs`); the result, its policy as action indices and that policy's
    band factors (for :func:`.evaluation.evaluate_indices`).  For callers that solve many models
    (:func:`.batch.solve_models`), which check the work and hold one BLAS thread for all.  The paths that call BLAS
    (the Python loop, the pivoting step) hold one BLAS thread themselves (:func:`~.threads.single_blas`); the
    compiled loop calls none, and the context's switch of BLAS's thread count and back cost more than its solve
    (Bmax 32, s_max 70)."""
    t0 = time.perf_counter()
    if starts is None:
        starts = _starts(model)
    Y = model.sojourn_rows()
    status, pol, g, h, it, factors = _run_loop(starts, costs, Y, model.P, model.SF, model.klo, model.khi,
                                               model.actions, model.s_max, int(max_iter))
    converged = status == CONVERGED
    while status == EVAL_FAILED and it < max_iter:
        # one improvement with the pivoting solve past the policy the fast loop could not evaluate, then the
        # fast loop again from where it lands (a degenerate truncation's later policies evaluate there)
        with single_blas():
            pol, g, h, it2, converged = _pi_pivoting(model, pol, costs, 1, (g, h))
        it += it2
        factors = NO_FACTORS
        if converged:
            break
        status, pol, g, h, it2, factors = _run_loop(pol[None, :], costs, Y, model.P, model.SF, model.klo, model.khi,
                                                    model.actions, model.s_max, int(max_iter) - it)
        converged = status == CONVERGED
        it += it2
    secs = time.perf_counter() - t0
    if not converged:
        warn_not_converged(f"policy iteration did not repeat a policy within max_iter={max_iter}: result NOT certified")
    result = SolveResult(policy=model.actions[pol], gain=g, gain_bracket=(g, g), relative_values=h, iterations=it,
                         span=0.0, converged=converged, solver="pi", seconds=secs)
    return result, pol, factors


#: Cold compile of the kernels below (s): the first `smdp-batch solve` after a fresh core install takes 4–5 s on
#: the 2-core development machine (benchmarks/bench_install.py), against 0.9 s with the cache warm.
COLD_SECONDS = 4.0


def _tiny_model() -> TruncatedSMDP:
    return truncate(BatchingProblem(lam=0.5, batch_sizes=(1, 2), latency="affine:1,1"), 4)


def _tiny_run() -> None:
    policy_iteration(_tiny_model())


def _tiny_stationary() -> None:
    """The stationary law's kernels (the warm-up's side part, :func:`.jit.warm_up`)."""
    model = _tiny_model()
    stationary(model, _initial_policy(model))


def warm_up_pi() -> float:
    """Load or compile PI's and evaluation's kernels once per process (:mod:`.jit`); the seconds it took.

    Then the compiled loop: loaded when numba's cache has it, else compiled there in the background."""
    kernels = (evaluate_policy_banded, assemble, band_widths, improve_step, stationary_banded)  # compiled on their own
    seconds = warm_up("pi", kernels, _tiny_run, COLD_SECONDS, side=(__name__, "_tiny_stationary"))
    if seconds:  # the first call in this process
        t0 = time.perf_counter()
        _prepare_compiled()
        seconds += time.perf_counter() - t0
    return seconds


# ------------------------------------------------------------------------------------ the compiled loop
#: State of the compiled loop in this process: loaded (``fn``), or the time of the next cache check (0: none).
_compiled: dict = {"fn": None, "check_at": 0.0}
#: Seconds between looks at the cache while the background compile runs (one look reads a small index file).
CHECK_EVERY = 1.0
#: The compiled loop runs where states × actions × arrival columns is at most this.  Measured side by side
#: (basic scenario, ρ 0.9): 2.0× faster at Bmax 32, s_max 70 (1.7e5), 1.3× at s_max 160, even at 3e6, and
#: 0.7× from 1e7 up (Bmax 256, s_max 4 096: 249 against 183 ms), where the per-call overhead it saves is
#: nothing and its improvement product, through numba, is slower than NumPy's.
COMPILED_MAX_WORK = 2e6


def run_tiny_compiled() -> None:
    """The compiled loop on the tiny model, with the argument types of every real call (loads or compiles it)."""
    model = _tiny_model()
    pi_loop_compiled(_starts(model), model.costs(), model.sojourn_rows(), model.P, model.SF, model.klo, model.khi,
                     model.actions, model.s_max, 1000)


def _load_compiled() -> None:
    """Load the compiled loop from the cache and forbid any further compile of it in this process.

    A call with other argument types (an array not C-contiguous, say) then raises TypeError and the
    Python loop answers instead: a foreground compile (~9 s) never happens in the middle of a solve."""
    _compiled["check_at"] = 0.0
    try:
        run_tiny_compiled()
    except Exception:  # pragma: no cover - a cache that does not load: the Python loop stays
        return
    pi_loop_compiled.disable_compile()
    _compiled["fn"] = pi_loop_compiled


def _prepare_compiled() -> None:
    if cache_is_warm([pi_loop_compiled]):
        _load_compiled()
    elif start_background_compile():
        _compiled["check_at"] = time.monotonic() + CHECK_EVERY


def compiled_loop_loaded(wait: float = 0.0) -> bool:
    """Whether this process runs PI's compiled loop; waits up to ``wait`` s for a background compile to finish.

    For benchmarks, which time the loop a long-running process settles on (call :func:`warm_up_pi` first)."""
    deadline = time.monotonic() + wait
    while _compiled["fn"] is None and _compiled["check_at"]:
        if cache_is_warm([pi_loop_compiled]):
            _load_compiled()
        elif time.monotonic() >= deadline:
            break
        else:
            time.sleep(0.25)
    return _compiled["fn"] is not None


def _run_loop(*args):
    """:func:`pi_loop` on its arguments, by the compiled loop when this process has it (:mod:`.pi_compiled`) and the
    model is small enough for it to pay (:data:`COMPILED_MAX_WORK`)."""
    check_at = _compiled["check_at"]
    if check_at and time.monotonic() >= check_at:
        _compiled["check_at"] = time.monotonic() + CHECK_EVERY
        if cache_is_warm([pi_loop_compiled]):
            _load_compiled()
    fn = _compiled["fn"]
    costs, P = args[1], args[3]
    if fn is not None and costs.shape[0] * costs.shape[1] * P.shape[1] <= COMPILED_MAX_WORK:
        try:
            return fn(*args)
        except TypeError:  # argument types it was not compiled for (compiles are off): the Python loop
            pass
    with single_blas():
        return pi_loop(*args)
