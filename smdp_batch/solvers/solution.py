"""One entry point: truncate, solve, evaluate — with an automatic choice of s_max (paper 004 §V-A).

``s_max`` is one of three rules (:mod:`.search` has the details):

* ``"auto"`` (default) — a **converged** table: every stored decision equals that of a truncation at
  least twice as long as the verified range, and the stored range reaches the queue length R where
  the action stops changing, so eq. 30's "serve π(R) beyond" is the infinite queue's action.  Solved
  on the tail boundary (exact excursion costs above s_max) with PI on numba; on eq. 19's boundary
  for RVI and JAX, with c_o raised to 1.5·ĝ where it is below ĝ and s_max found from the queue tail's
  geometric rate.
* ``"minimal"`` — paper 004's rule (Table II): the smallest s_max with Δ < δ (eq. 22; δ = 1e-3,
  c_o = 100 by default) and a tail action that drains long queues, c_o exactly as given.
* an integer — that truncation; a degenerate one (the policy waits at s_max) raises a
  :class:`DegenerateTruncationWarning`.
"""

from __future__ import annotations

import time
import warnings
from dataclasses import dataclass, replace
from functools import cached_property

import numpy as np

from ..errors import DegenerateTruncationWarning, InputError, TableNotConvergedWarning, solver_checks_convergence
from ..limits import check_tail
from ..runtime.schema import eq30
from .evaluation import Evaluation, control_limit_of, evaluate_deployed, evaluate_policy, tail_stable
from ..model.problem import BatchingProblem
from ..model.truncation import TruncatedSMDP, truncate
from .pi import policy_iteration, warm_up_pi
from .result import SolveResult
from .threads import single_blas
from .rvi import ETA_FRACTION, relative_value_iteration, warm_up_rvi
from .search import PROBABLE_START, SMAX_LIMIT, Candidates, Progress, limiting_actions, search_converged, search_minimal
from .exponential import applies, solve_exponential
from .geometric import GeometricModel
from .geometric_pi import warm_up_geometric
from .limit import reach

__all__ = ["BACKENDS", "BOUNDARIES", "SOLVERS", "SMAX_RULES", "Solution", "TableNotConvergedWarning", "check_backend", "solve",
           "solve_truncated"]

SOLVERS = ("pi", "rvi")
BACKENDS = ("numba", "jax")
SMAX_RULES = ("auto", "minimal")
BOUNDARIES = ("tail", "overflow")


@dataclass(frozen=True)
class Solution:
    """A solved batching problem: inputs, truncation, solver result and exact evaluation."""

    problem: BatchingProblem
    model: TruncatedSMDP | GeometricModel  # GeometricModel: the exponential rule (solvers.exponential)
    result: SolveResult
    evaluation: Evaluation
    tol_delta: float
    s_max_auto: bool
    seconds: float
    candidates: int = 1  # truncations solved by the automatic search
    rule: str = "fixed"  # how s_max was chosen: "auto" (converged), "minimal" (paper 004) or "fixed"
    converged_upto: int | None = None  # R: decisions for n ≤ R verified against a truncation ≥ 2R, π(R) beyond
    table: np.ndarray | None = None  # the stored policy when it differs from result.policy (auto: π(R) above R)
    verified_against: int | None = None  # the truncation R was verified against when not 2R (exponential rule)

    @cached_property
    def deployed(self) -> Evaluation:
        """Metrics of the policy extended by eq. 30 on the infinite queue (truncation error < 1e-10).

        When this truncation already meets :func:`evaluate_deployed`'s test (S_o's probability and its
        share of the cost below 1e-10, and the policy already constant from s_max on), its evaluation is
        reused with c_o's part taken out of ĝ — the same numbers evaluate_deployed computes."""
        ev, m, pol = self.evaluation, self.model, self.policy
        if isinstance(m, GeometricModel):  # the exponential rule's table: its metrics are already the deployed ones
            return ev
        if m.extra is None and ev.overflow_probability < 1e-10 and ev.delta < 1e-10 * max(1.0, ev.avg_cost) and pol[-1] == pol[-2]:
            idx = m.action_index(pol)
            T = float(ev.stationary @ m.y[idx])
            c_o_part = m.abstract_cost * m.y[idx[-1]] * float(ev.stationary[-1]) / T
            return replace(ev, avg_cost=ev.avg_cost - c_o_part, delta=max(ev.delta - c_o_part, 0.0))
        return evaluate_deployed(self.problem, self.policy)

    @property
    def policy(self) -> np.ndarray:
        """The table: batch size for queue lengths 0..s_max, then S_o (``result.policy`` above R set to π(R))."""
        return self.result.policy if self.table is None else self.table

    @property
    def stored_range(self) -> int:
        """Queue lengths the table answers individually: R when converged, else s_max (eq. 30 beyond)."""
        return self.s_max if self.converged_upto is None else self.converged_upto

    @property
    def converged_to_limit(self) -> bool | None:
        """Whether the verified table ends in the infinite queue's long-queue action (π(R) a limiting batch
        size): True for the converged rule, False for a probable-range table (large Bmax, :mod:`.search`),
        None when no range was verified."""
        if self.converged_upto is None:
            return None
        return int(self.policy[self.converged_upto]) in limiting_actions(self.problem)

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
        return control_limit_of(self.policy, self.problem.batch_sizes)

    @property
    def degenerate(self) -> bool:
        """True when eq. 30's tail action (π(s_max)) cannot drain a long queue: a truncation artifact."""
        return not tail_stable(self.problem, self.policy)

    def decide(self, n: int) -> int:
        """Batch size for queue length n ≥ 0 (eq. 30: n > s_max uses the s_max action)."""
        return eq30(self.policy, self.s_max, n)

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
            "s_max_rule": self.rule,
            "converged_upto": self.converged_upto,
            "verified_against": self.verified_against,
            "converged_to_limit": self.converged_to_limit,
            "s_max_candidates": self.candidates,
            "abstract_cost": self.model.abstract_cost,
            "boundary": self.model.boundary,
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
            "policy": [int(a) for a in self.policy],
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
        with solver_checks_convergence():
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


def _renamed_s_max(s_max, deprecated: dict, func: str):
    """``s_max``, or the value of the deprecated keyword ``smax=`` (with a DeprecationWarning)."""
    if not deprecated:
        return s_max
    unknown = set(deprecated) - {"smax"}
    if unknown:
        raise TypeError(f"{func}() got an unexpected keyword argument {sorted(unknown)[0]!r}")
    warnings.warn(f"{func}(smax=...) is deprecated; use s_max=...", DeprecationWarning, stacklevel=3)
    return deprecated["smax"]


def solve_settings(problem: BatchingProblem, s_max, tol_delta, abstract_cost, rules=SMAX_RULES):
    """(s_max, δ, c_o) checked before work: s_max one of ``rules`` (lower-cased) or an integer (its bounds are
    :func:`~smdp_batch.model.truncation.check_truncation`'s), δ ≥ 1e-12, c_o finite ≥ 0.  Shared by
    :func:`solve` and :func:`~.map_solution.solve_map`."""
    problem.single()
    tol = float(tol_delta)
    if not (np.isfinite(tol) and tol >= 1e-12):
        raise InputError(f"tol_delta (δ) must be ≥ 1e-12 (Δ is computed in float64), got {tol_delta!r}")
    c_o = float(abstract_cost)
    if not (np.isfinite(c_o) and c_o >= 0):
        raise InputError(f"abstract cost c_o must be finite and ≥ 0, got {abstract_cost!r}")
    if isinstance(s_max, str):
        key = s_max.strip().lower()
        if key in rules:
            return key, tol, c_o
        try:
            return int(s_max), tol, c_o
        except ValueError:
            names = " or ".join(f"'{r}'" for r in rules)
            raise InputError(f"s_max must be an integer ≥ Bmax = {problem.bmax}, {names}, got {s_max!r}") from None
    return s_max, tol, c_o


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
    progress: Progress | None = None,
    hint: Solution | dict | None = None,
    boundary: str | None = None,
    **deprecated,
) -> Solution:
    """Optimal batching policy for ``problem`` (paper 004 §V).

    s_max : "auto" (a converged table, see the module doc), "minimal" (paper 004's smallest s_max with
        Δ < tol_delta) or an integer ≥ Bmax.  The old keyword ``smax=`` still works and warns.
    abstract_cost : c_o of eq. 19 (≥ 0); with "auto" a floor (raised to 1.5·ĝ where below ĝ).
    solver : "pi" (exact policy iteration, default) or "rvi" (Algorithm 1 with span tolerance eps).
    backend : "numba" (CPU, default) or "jax" (CPU/GPU, optional extra).  With "auto"/"minimal" the
        search runs on numba (every candidate has a new shape, which JAX would recompile) and the
        chosen truncation is solved by ``backend``.
    progress : called as progress(stage, s_max, candidates solved) after each candidate truncation.
    hint : a solution of a neighbouring problem (e.g. the next w2 of a front), or its
        {"s_max", "abstract_cost", "policy"}: "auto" starts its search there (c_o at least the hint's,
        PI warm-started from its policy).  The table is verified as without a hint.
    boundary : the truncation boundary of "auto": "tail" (default with PI on numba: the exact excursion
        costs above s_max, :mod:`~smdp_batch.model.truncation`) or "overflow" (eq. 19's S_o with c_o
        raised to 1.5·ĝ; the default for RVI and JAX, which implement only eq. 19).  "minimal" and a
        fixed s_max always use eq. 19.
    """
    smax = _renamed_s_max(s_max, deprecated, "solve")
    if solver not in SOLVERS:
        raise InputError(f"unknown solver {solver!r}; valid: {', '.join(SOLVERS)}")
    check_backend(backend)
    smax, tol, c_o = solve_settings(problem, smax, tol_delta, abstract_cost, SMAX_RULES)
    exact_pi = solver == "pi" and backend == "numba"
    if boundary is None:
        boundary = "tail" if exact_pi else "overflow"
    if boundary not in BOUNDARIES:
        raise InputError(f"unknown boundary {boundary!r}; valid: {', '.join(BOUNDARIES)}")
    if boundary == "tail" and not exact_pi:
        raise InputError("the tail boundary is solved by policy iteration on numba only (solver='pi', backend='numba')")
    exponential = smax == "auto" and boundary == "tail" and exponential_route(problem)
    if exponential:
        warm_up_geometric()  # numba's load-or-compile stays out of Solution.seconds
    else:
        warm_up_pi()  # (the search always runs PI)
    if solver == "rvi":
        warm_up_rvi()
    t0 = time.perf_counter()
    if not isinstance(smax, str):
        model = truncate(problem, smax, c_o)
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

    if exponential:
        return _solve_exponential(problem, tol, t0, progress)
    check_tail(problem, tol)  # a law whose tail needs s_max beyond the state limit is refused before searching
    with single_blas():
        return _solve_auto(problem, smax, c_o, tol, solver, eps, max_iter, eta_fraction, backend, progress, hint, t0,
                           boundary)


def exponential_route(problem: BatchingProblem) -> bool:
    """Whether "auto" takes :mod:`.exponential`'s rule: exponential batch times whose converged table the general
    search cannot reach (:func:`~.limit.reach`); every other problem keeps the general rule."""
    return applies(problem) and not reach(problem, SMAX_LIMIT, PROBABLE_START).converged_ok


def _solve_exponential(problem: BatchingProblem, tol: float, t0: float, progress: Progress | None) -> Solution:
    ans = solve_exponential(problem, tol, progress=progress)
    return Solution(problem, ans.model, ans.result, ans.evaluation, tol, True, time.perf_counter() - t0,
                    ans.candidates, rule="auto", converged_upto=ans.converged_upto, table=ans.table,
                    verified_against=ans.agreed_with)


def _solve_auto(problem, smax, c_o, tol, solver, eps, max_iter, eta_fraction, backend, progress, hint, t0,
                boundary) -> Solution:
    """The "auto" and "minimal" rules of :func:`solve` (arguments checked there)."""
    tail = max(limiting_actions(problem)) if smax == "auto" and boundary == "tail" else None
    cands = Candidates(problem, tol, progress, tail=tail)
    table = converged_upto = None
    if smax == "minimal":
        cand = search_minimal(cands, c_o)
        model, res, ev = cand.model, cand.res, cand.ev
    else:
        start = None
        if isinstance(hint, Solution):
            hint = {"s_max": hint.s_max, "abstract_cost": hint.model.abstract_cost, "policy": hint.policy}
        if hint is not None:
            c_o = max(c_o, float(hint["abstract_cost"]))
            start = int(hint["s_max"])
            cands.warm = np.asarray(hint["policy"], dtype=np.int64)
        found = search_converged(cands, c_o, start=start)
        model, res = found.candidate.model, found.candidate.res
        table, ev, converged_upto = found.policy, found.evaluation, found.converged_upto
        if found.probable:
            R, b = converged_upto, int(table[converged_upto])
            limits = f"the search's state or work limit for {len(problem.batch_sizes)} batch sizes"
            why = (f"it serves the limiting batch size {b} there, but a run of it long enough to verify as the limit "
                   f"is beyond {limits}" if b in limiting_actions(problem) else
                   f"not to the infinite queue's limit: the optimal batch is still growing there (π({R}) = {b}; the "
                   f"limiting batch size, {max(limiting_actions(problem))}, takes over only at longer queues, beyond "
                   f"{limits})")
            warnings.warn(
                f"the table is verified for queue lengths n ≤ {R} (against s_max = {model.s_max}), where the queue "
                f"exceeds n with probability {found.mass:.1g}; {why}; beyond n = {R} the table serves {b}",
                TableNotConvergedWarning, stacklevel=2)
        elif converged_upto is None:
            warnings.warn(
                f"the table is not verified against a larger truncation (the search stopped at s_max = {model.s_max}, "
                "its state or work limit); its decisions near s_max may be shaped by the truncation",
                TableNotConvergedWarning, stacklevel=2)
    if solver != "pi" or backend != "numba":
        res2 = solve_truncated(model, solver, eps, max_iter, eta_fraction, backend=backend)
        ev2 = evaluate_policy(model, res2.policy)
        if not (ev2.delta < tol and tail_stable(problem, res2.policy)):
            raise InputError(
                f"{solver} with eps = {eps:g} returns a policy that overflows the truncation s_max = {model.s_max} "
                f"(Δ = {ev2.delta:.3g} ≥ δ = {tol:g}); use a smaller --eps (e.g. 0.01) or --solver pi")
        if table is not None:
            R = converged_upto if converged_upto is not None else model.s_max
            same = np.array_equal(res2.policy[: R + 1], table[: R + 1])
            if not same:  # an ε-optimal policy: its table is its own, verified nowhere
                warnings.warn(
                    f"{solver} (eps = {eps:g}) chose a different action than exact policy iteration at queue length "
                    f"{int(np.nonzero(res2.policy[: R + 1] != table[: R + 1])[0][0])}; the table is {solver}'s, not "
                    "verified as converged (use --solver pi for a converged table)", TableNotConvergedWarning, stacklevel=2)
                table, converged_upto = None, None
        res, ev = res2, (ev if table is not None else ev2)
    assert res is not None  # the searches return solved candidates
    return Solution(problem, model, res, ev, tol, True, time.perf_counter() - t0, len(cands.cache),
                    rule=smax, converged_upto=converged_upto, table=table)
