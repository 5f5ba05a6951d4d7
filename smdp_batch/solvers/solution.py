"""One entry point: truncate, solve, evaluate — with automatic choice of s_max (paper 004 §V-A).

``s_max="auto"`` scans s_max upward from Bmax and returns the first truncation whose solution has
Δ < δ (eq. 22; defaults δ = 1e-3, c_o = 100 as in paper 004 Table II) and whose policy is usable
on the infinite queue (eq. 30's tail action π(s_max) serves faster than λ).  Each candidate is
solved exactly by policy iteration warm-started from the previous one.  Steps are 1 up to
s_max = 256 (so the paper's minimal s_max of Table II is found exactly); beyond, s_max grows by
×1.25 and the scan bisects back between the last rejected and the first accepted candidate to
1 % of s_max — O(log s_max) candidates instead of one per percent.

*Degenerate* truncations are those whose optimal policy waits at the top (the c_o ≈ 0 regime of
Fig. 10 where all mass ends in S_o, or a large w2 that makes "wait and let S_o absorb the queue"
look cheap): the scan grows s_max geometrically (×1.25) across them and then bisects back to the
smallest accepted s_max (to within the step size).  A fixed s_max that is degenerate raises a
:class:`DegenerateTruncationWarning`.
"""

from __future__ import annotations

import time
import warnings
from dataclasses import dataclass
from functools import cached_property

import numpy as np

from ..errors import DegenerateTruncationWarning, InputError, NotConvergedWarning
from ..limits import STATE_LIMIT, WORK_LIMIT, check_tail
from ..runtime.schema import eq30
from .evaluation import Evaluation, control_limit_of, evaluate_deployed, evaluate_policy, resize_policy, tail_stable
from ..baselines.simple import greedy_policy
from ..model.problem import BatchingProblem
from ..model.truncation import ArrivalTable, TruncatedSMDP, arrival_table, truncate
from .pi import policy_iteration, warm_up_pi
from .result import SolveResult
from .rvi import ETA_FRACTION, relative_value_iteration, warm_up_rvi

__all__ = ["BACKENDS", "SOLVERS", "Solution", "check_backend", "solve", "solve_truncated"]

SOLVERS = ("pi", "rvi")
BACKENDS = ("numba", "jax")
#: Give up the automatic scan beyond this s_max.
SMAX_LIMIT = STATE_LIMIT  # the auto scan stops at the state limit (smdp_batch.limits)
#: PI budget per scan candidate: warm starts settle in a few iterations; a candidate that needs
#: more sits in the degenerate zone and is passed over (the result is still certified: the
#: accepted candidate's PI converged).
SCAN_PI_ITER = 50


@dataclass(frozen=True)
class Solution:
    """A solved batching problem: inputs, truncation, solver result and exact evaluation."""

    problem: BatchingProblem
    model: TruncatedSMDP
    result: SolveResult
    evaluation: Evaluation
    tol_delta: float
    s_max_auto: bool
    seconds: float
    candidates: int = 1  # truncations solved by the automatic scan

    @cached_property
    def deployed(self) -> Evaluation:
        """Metrics of the policy extended by eq. 30 on the infinite queue (truncation error < 1e-10)."""
        return evaluate_deployed(self.problem, self.result.policy)

    @property
    def policy(self) -> np.ndarray:
        return self.result.policy

    @property
    def s_max(self) -> int:
        return self.model.s_max

    @property
    def smax_auto(self) -> bool:
        """Deprecated spelling of :attr:`s_max_auto`."""
        warnings.warn("Solution.smax_auto is deprecated; use s_max_auto", DeprecationWarning, stacklevel=2)
        return self.s_max_auto

    @property
    def control_limit(self) -> int | None:
        return control_limit_of(self.result.policy, self.problem.batch_sizes)

    @property
    def degenerate(self) -> bool:
        """True when eq. 30's tail action (π(s_max)) cannot drain a long queue: a truncation artifact."""
        return not tail_stable(self.problem, self.result.policy)

    def decide(self, n: int) -> int:
        """Batch size for queue length n ≥ 0 (eq. 30: n > s_max uses the s_max action)."""
        return eq30(self.result.policy, self.s_max, n)

    def to_dict(self) -> dict:
        """The JSON contract of DESIGN.md §4.

        ``avg_cost`` and ``delta`` are ĝ and Δ of the truncated model (eqs. 21–22, as in paper
        004 Table II); latency, power and throughput are those of the deployed policy (eq. 30 on
        the infinite queue, :attr:`deployed`); ``truncated`` repeats all metrics on the truncation.
        """
        r, e, p, dep = self.result, self.evaluation, self.problem, self.deployed
        d = {
            "lam": p.lam,
            "rho": p.rho,
            "w1": p.w1,
            "w2": p.w2,
            "batch_sizes": list(p.batch_sizes),
            "latency": p.latency.spec(),
            "energy": p.energy.spec(),
            "service": p.service.spec(),
            "s_max": self.s_max,
            "s_max_auto": self.s_max_auto,
            "s_max_candidates": self.candidates,
            "abstract_cost": self.model.abstract_cost,
            "tol_delta": self.tol_delta,
            "solver": r.solver,
            "backend": r.backend,
            "eps": r.eps,
            "eta": r.eta,
            "iterations": r.iterations,
            "converged": r.converged,
            "gain_bracket": list(r.gain_bracket),
            "span": r.span,
            "avg_cost": e.avg_cost,
            "delta": e.delta,
            **{k: v for k, v in dep.as_dict().items() if k not in ("avg_cost", "delta")},
            "objective": p.w1 * dep.mean_latency_ms + p.w2 * dep.mean_power_w,
            "truncated": e.as_dict(),
            "policy": [int(a) for a in r.policy],
            "control_limit": self.control_limit,
            "degenerate": self.degenerate,
            "solve_seconds": self.seconds,
            "units": {"time": "ms", "energy": "mJ", "power": "W", "lam": "1/ms", "throughput": "1/ms"},
        }
        return d


def solve_truncated(
    model: TruncatedSMDP,
    solver: str = "pi",
    eps: float = 0.01,
    max_iter: int | None = None,
    eta_fraction: float = ETA_FRACTION,
    policy0: np.ndarray | None = None,
    backend: str = "numba",
) -> SolveResult:
    """Solve one truncated model with the named solver ('pi' exact, 'rvi' ε-optimal) and backend."""
    check_backend(backend)
    if solver not in SOLVERS:
        raise InputError(f"unknown solver {solver!r}; valid: {', '.join(SOLVERS)}")
    if backend == "jax":
        from .jax_backend import pi_batch, rvi_batch

        if solver == "rvi":
            return rvi_batch([model], eps=eps, max_iter=max_iter or 100_000, eta_fraction=eta_fraction)[0]
        p0 = None if policy0 is None else np.asarray(policy0)[None, :]
        with warnings.catch_warnings():
            warnings.simplefilter("ignore", NotConvergedWarning)
            res = pi_batch([model], policy0=p0, max_iter=max_iter or 1000)[0]
        if res.converged:
            return res
        # a numerically singular policy on the way (see jax_backend): the numba path recovers
    if solver == "pi":
        return policy_iteration(model, policy0=policy0, max_iter=max_iter or 1000)
    return relative_value_iteration(model, eps=eps, max_iter=max_iter or 100_000, eta_fraction=eta_fraction)


def check_backend(backend: str) -> None:
    """Raise InputError unless ``backend`` is known and usable here."""
    if backend not in BACKENDS:
        raise InputError(f"unknown backend {backend!r}; valid: {', '.join(BACKENDS)}")
    if backend == "jax":
        from .jax_backend import _require

        _require()


def _warm_start(problem: BatchingProblem, policy: np.ndarray | None, s_max: int) -> np.ndarray | None:
    """Previous candidate's policy resized to s_max; a waiting tail is replaced by greedy service."""
    if policy is None:
        return None
    out = resize_policy(policy, s_max)
    if not tail_stable(problem, policy):
        # drop the trailing block of waiting states (the truncation artifact): serve greedily there
        top = min(policy.size - 2, s_max)
        serving = np.nonzero(out[: top + 1] > 0)[0]
        start = int(serving[-1]) + 1 if serving.size and serving[-1] < top else top
        start = start if serving.size else 0
        out[start:] = greedy_policy(problem.batch_sizes, s_max)[start:]
    return out


def _renamed_s_max(s_max, deprecated: dict, func: str):
    """``s_max``, or the value of the deprecated keyword ``smax=`` (with a DeprecationWarning)."""
    if not deprecated:
        return s_max
    unknown = set(deprecated) - {"smax"}
    if unknown:
        raise TypeError(f"{func}() got an unexpected keyword argument {sorted(unknown)[0]!r}")
    warnings.warn(f"{func}(smax=...) is deprecated; use s_max=...", DeprecationWarning, stacklevel=3)
    return deprecated["smax"]


def _next_smax(s: int) -> int:
    return s + 1 if s < 256 else int(s * 1.25)


def solve(
    problem: BatchingProblem,
    s_max: int | str = "auto",
    abstract_cost: float = 100.0,
    tol_delta: float = 1e-3,
    solver: str = "pi",
    eps: float = 0.01,
    max_iter: int | None = None,
    eta_fraction: float = ETA_FRACTION,
    backend: str = "numba",
    **deprecated,
) -> Solution:
    """Optimal batching policy for ``problem`` (paper 004 §V).

    s_max : an integer ≥ Bmax, or "auto" (smallest s_max, scanned upward, with Δ < tol_delta).
        The old keyword ``smax=`` still works and warns (DeprecationWarning).
    abstract_cost : c_o of eq. 19 (≥ 0).
    solver : "pi" (exact policy iteration, default) or "rvi" (Algorithm 1 with span tolerance eps).
    backend : "numba" (CPU, default) or "jax" (CPU/GPU, optional extra).  With s_max="auto" the
        scan runs on numba (every candidate has a new shape, which JAX would recompile) and the
        chosen truncation is solved by ``backend``.
    """
    smax = _renamed_s_max(s_max, deprecated, "solve")
    if solver not in SOLVERS:
        raise InputError(f"unknown solver {solver!r}; valid: {', '.join(SOLVERS)}")
    check_backend(backend)
    tol = float(tol_delta)
    if not (np.isfinite(tol) and tol >= 1e-12):
        raise InputError(f"tol_delta (δ) must be ≥ 1e-12 (Δ is computed in float64), got {tol_delta!r}")
    warm_up_pi()  # numba's load-or-compile stays out of Solution.seconds (the scan always runs PI)
    if solver == "rvi":
        warm_up_rvi()
    t0 = time.perf_counter()
    if isinstance(smax, str):
        if smax.strip().lower() != "auto":
            try:
                smax = int(smax)
            except ValueError:
                raise InputError(f"s_max must be an integer ≥ Bmax = {problem.bmax} or 'auto', got {smax!r}") from None
    if not isinstance(smax, str):
        model = truncate(problem, smax, abstract_cost)
        res = solve_truncated(model, solver, eps, max_iter, eta_fraction, backend=backend)
        ev = evaluate_policy(model, res.policy)
        sol = Solution(problem, model, res, ev, tol, False, time.perf_counter() - t0)
        if sol.degenerate:
            warnings.warn(
                f"s_max={model.s_max} with c_o={model.abstract_cost:g} is degenerate: the policy's action at s_max "
                f"({int(res.policy[model.s_max])}) cannot drain a long queue (Δ = {ev.delta:.3g}); raise s_max or c_o, "
                "or use s_max='auto'",
                DegenerateTruncationWarning,
                stacklevel=2,
            )
        return sol

    # ---- automatic truncation: smallest s_max with Δ < δ and a stabilising tail action
    check_tail(problem, tol)  # a law whose tail needs s_max beyond the state limit is refused before scanning
    arrivals: ArrivalTable = arrival_table(problem, max(4 * problem.bmax, 256))
    cache: dict[int, tuple] = {}
    warm = [None]

    def candidate(s: int):
        nonlocal arrivals
        if s not in cache:
            if arrivals.kmax < s:
                arrivals = arrival_table(problem, 2 * s)
            model = truncate(problem, s, abstract_cost, arrivals)
            width = float(np.mean(model.khi[1:] - model.klo[1:] + 1))
            if len(model.actions) * (s + 2) * width > WORK_LIMIT:
                raise InputError(
                    f"the auto s_max scan reached s_max = {s} with arrival supports of {width:.0f} states: one more "
                    f"candidate would exceed the work limit; use a larger --tol-delta (now {tol:g}), a lower load "
                    "or a lighter-tailed service law"
                )
            try:
                with warnings.catch_warnings():
                    warnings.simplefilter("ignore", NotConvergedWarning)  # checked below
                    try:
                        res = policy_iteration(model, policy0=_warm_start(problem, warm[0], s), max_iter=SCAN_PI_ITER)
                    except InputError:  # a warm start from a degenerate candidate can be multichain
                        res = policy_iteration(model, max_iter=SCAN_PI_ITER)
                if not res.converged:
                    raise InputError("policy iteration did not settle on this truncation")
            except InputError:
                # PI reached a numerically multichain policy: the top states wait and S_o's class
                # is cut off from the rest — a degenerate truncation, skipped like the others
                cache[s] = (model, None, None, False)
                return cache[s]
            ev = evaluate_policy(model, res.policy)
            warm[0] = res.policy
            cache[s] = (model, res, ev, tail_stable(problem, res.policy))
        return cache[s]

    def accepted(s: int) -> bool:
        _, _, ev, stable = candidate(s)
        return stable and ev.delta < tol

    s = problem.bmax
    last_bad = s - 1
    rejected = 0
    while s <= SMAX_LIMIT:
        if accepted(s):
            # after a geometric jump, bisect back to the smallest accepted s_max above last_bad
            lo, hi = last_bad, s
            while hi - lo > 1 and hi - lo > (0 if hi <= 256 else hi // 100):
                mid = (lo + hi) // 2
                if accepted(mid):
                    hi = mid
                else:
                    lo = mid
            model, res, ev, _ = candidate(hi)
            if solver != "pi" or backend != "numba":
                res2 = solve_truncated(model, solver, eps, max_iter, eta_fraction, backend=backend)
                ev2 = evaluate_policy(model, res2.policy)
                if not (ev2.delta < tol and tail_stable(problem, res2.policy)):
                    rejected += 1
                    if rejected >= 4:  # a coarse ε gives a policy that overflows at every s_max
                        raise InputError(
                            f"{solver} with eps = {eps:g} returns a policy that overflows the truncation (Δ = "
                            f"{ev2.delta:.3g} ≥ δ = {tol:g}) at every s_max tried; use a smaller --eps (e.g. 0.01) "
                            "or --solver pi"
                        )
                    last_bad, s = hi, _next_smax(hi)
                    continue  # the ε-optimal policy overflows more: keep scanning
                res, ev = res2, ev2
            return Solution(problem, model, res, ev, tol, True, time.perf_counter() - t0, len(cache))
        last_bad = s
        stable = candidate(s)[3]
        # a truncation whose top state waits (degenerate, Fig. 10's c_o ≈ 0 regime or large w2)
        # needs a much larger s_max: grow geometrically, then bisect back
        s = _next_smax(s) if stable else max(_next_smax(s), int(s * 1.25))
    raise InputError(
        f"no s_max ≤ {SMAX_LIMIT} reaches Δ < {tol:g}; the load ρ = {problem.rho:.6g} may be too close to 1"
    )
