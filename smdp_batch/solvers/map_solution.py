"""Solving the MAP batching SMDP: the converged-table search and the result object.

The truncation rule of the Poisson solver (:mod:`.search`) carries over level by level:

1. **Overflow cost**: c_o is raised to 1.5·ĝ while c_o < ĝ (paper 004 Table II's ratio).
2. **Δ < δ**: s_max doubles from max(4·Bmax, hint) until the S_o level's share of the cost (eq. 22)
   is below δ (the action at s_max itself may be a boundary artifact in a phase whose rate exceeds the
   capacity; step 3 never stores it).
3. **Convergence**: truncations S/2 and S are solved; for each phase i, A_i is the last level up to
   which their actions agree and R_i the start of the run of equal actions that ends at A_i.  The
   table is converged when in every phase that action has the greatest throughput b/l(b),
   A_i ≥ 2·R_i and A_i − R_i ≥ Bmax; R = max_i R_i.  Otherwise S doubles.  The stored table is the
   S-solution on levels 0..R and π(R, i) beyond (eq. 30 per phase).

Before any of it, a MAP whose phase moves the arrival forecast by at most FAST_EPS requests (fast switching,
or equal phase rates) is solved as Poisson arrivals at its mean rate (:func:`~smdp_batch.model.map_work.poisson_gap`; the
solution says so in ``note``), and a queue tail predicted beyond the state limit is refused; each truncation's
blocks, states, LU work and memory are checked before it is built (:mod:`~smdp_batch.model.map_work`): the
search stops at the first one beyond a limit (refused in stage 2, a "not verified" warning in stage 3).

With m = 1 this is the Poisson search's criterion; its truncations need not be the same ones (the
Poisson search predicts its jumps from the tail root of z^b = K(z)), so only the converged tables
agree, not s_max.
"""

from __future__ import annotations

import time
import warnings
from dataclasses import dataclass
from functools import cached_property
from typing import Any, Callable

import numpy as np

from ..errors import InputError, TableNotConvergedWarning, solver_checks_convergence
from ..limits import HEAVY_TAIL_COV2, predicted_queue, tail_factor
from ..model.arrivals import MAP
from ..model.map_truncation import MapBlocks, MapSMDP, map_blocks, truncate_map
from ..model.map_work import (FAST_EPS, MAP_STATE_LIMIT, SEARCH_WORK_LIMIT, BlockPlan, check_truncation_work,
                              plan_blocks, poisson_gap, predicted_levels, truncation_work)
from ..model.problem import BatchingProblem
from .evaluation import resize_policy, tail_stable
from .map_pi import MapEvaluation, MapPIResult, evaluate_map_policy, map_policy_iteration, q_values
from .search import CO_RATIO, converged_range
from .solution import solve, solve_settings

__all__ = ["MapSolution", "solve_map", "map_problem"]

Progress = Callable[[str, int, int], None]


def map_problem(arrivals: MAP, **kwargs) -> BatchingProblem:
    """The batching problem at the MAP's mean rate (λ = λ̄; ρ = λ̄·l(Bmax)/Bmax), other fields from kwargs."""
    return BatchingProblem(lam=arrivals.rate, **kwargs)


@dataclass(frozen=True)
class MapSolution:
    """A solved MAP batching problem: the (queue length, phase) table, its values and exact metrics."""

    problem: BatchingProblem
    arrivals: MAP
    model: MapSMDP
    result: MapPIResult
    evaluation: MapEvaluation
    tol_delta: float
    rule: str  # "auto" (converged search) or "fixed"
    converged_upto: int | None
    table: np.ndarray  # (s_max+2, m) batch sizes stored (π(R) beyond R when converged)
    seconds: float
    candidates: int = 1
    note: str | None = None  # set when the MAP was solved in its Poisson limit (fast switching)

    @property
    def s_max(self) -> int:
        return self.model.s_max

    @property
    def phases(self) -> int:
        return self.arrivals.phases

    @property
    def policy(self) -> np.ndarray:
        return self.table

    @property
    def stored_range(self) -> int:
        return self.s_max if self.converged_upto is None else self.converged_upto

    @property
    def qvalues(self) -> np.ndarray:
        """Q((n, i), a) of the solved truncation, (s_max+2, m, A); the belief rule weighs them by phase."""
        return self.result.qvalues

    def decide(self, n: int, phase: int) -> int:
        """Batch size at queue length n ≥ 0 in a known phase (eq. 30 per phase beyond s_max)."""
        return int(self.table[min(int(n), self.s_max), int(phase)])

    @cached_property
    def deployed(self) -> MapEvaluation:
        """Metrics of the table extended by eq. 30 on the infinite queue (S_o's probability and cost share < 1e-10)."""
        m = self.model.phases  # 1 in the Poisson limit: the model is the Poisson one, every phase's column equal
        return evaluate_map_deployed(self.problem, self.model.arrivals, self.table[:, :m], self.model.blocks)

    def to_dict(self) -> dict:
        p, e, dep = self.problem, self.evaluation, self.deployed
        return {
            "lam": p.lam, "rho": p.rho, "w1": p.w1, "w2": p.w2, "batch_sizes": list(p.batch_sizes),
            "latency": p.latency.spec(), "energy": p.energy.spec(), "service": p.service.spec(),
            "arrivals": self.arrivals.describe(),
            "s_max": self.s_max, "s_max_rule": self.rule, "converged_upto": self.converged_upto,
            "s_max_candidates": self.candidates, "abstract_cost": self.model.abstract_cost, "tol_delta": self.tol_delta,
            "solver": "pi", "iterations": self.result.iterations, "converged": self.result.converged,
            "avg_cost": e.avg_cost, "delta": e.delta,
            **{k: v for k, v in dep.as_dict().items() if k not in ("avg_cost", "delta")},
            "objective": p.w1 * dep.mean_latency_ms + p.w2 * dep.mean_power_w,
            "truncated": e.as_dict(),
            "policy": [[int(a) for a in row] for row in self.table.T],
            "solve_seconds": self.seconds,
            **({"poisson_limit": self.note} if self.note else {}),
            "units": {"time": "ms", "energy": "mJ", "power": "W", "lam": "1/ms", "throughput": "1/ms"},
        }


#: Largest truncation :func:`evaluate_map_deployed` builds.
DEPLOYED_SMAX_LIMIT = 1 << 14


def evaluate_map_deployed(problem: BatchingProblem, arrivals: MAP, policy: np.ndarray,
                          blocks: MapBlocks | None = None, tol: float = 1e-10) -> MapEvaluation:
    """Metrics of an (n, phase) policy extended by eq. 30 per phase, on truncations of doubling size with
    c_o = 0 until the S_o level's probability and cost share fall below ``tol``."""
    policy = np.asarray(policy, dtype=np.int64)
    if not tail_stable(problem, policy):
        raise InputError("the policy's actions at its last queue length cannot drain a long queue in every phase")
    s = max(policy.shape[0] - 2, problem.bmax, 64)
    plan, ev, spent = None, None, 0.0
    while True:
        try:
            if s > DEPLOYED_SMAX_LIMIT and ev is not None:
                raise InputError(f"s_max = {s} is over {DEPLOYED_SMAX_LIMIT}")
            if blocks is None or not blocks.covers(s):
                plan = plan or plan_blocks(problem, arrivals)
                blocks = map_blocks(problem, arrivals, max(min(2 * s, plan.support + 1), s), plan)
            fix = "the table's queue tail is too heavy to evaluate exactly"
            check_truncation_work(s, arrivals.phases, problem.bmax, len(problem.batch_sizes) + 1,
                                  int(blocks.khi.max()), fix)
            spent += truncation_work(s, arrivals.phases, problem.bmax, len(problem.batch_sizes) + 1,
                                     int(blocks.khi.max()))
            if spent > SEARCH_WORK_LIMIT / 3:
                raise InputError(f"its evaluations would exceed {SEARCH_WORK_LIMIT / 3:.2g} operations; {fix}")
        except InputError as e:
            if ev is None:
                raise
            warnings.warn(f"the table's metrics are those of the truncation s_max = {ev.s_max} (overflow probability "
                          f"{ev.overflow_probability:.2g}, over {tol:g}): a longer one is beyond the limits ({e})",
                          TableNotConvergedWarning, stacklevel=2)
            return ev
        model = truncate_map(problem, arrivals, s, 0.0, blocks)
        ev = evaluate_map_policy(model, resize_policy(policy, s))
        if ev.delta < tol * max(1.0, ev.avg_cost) and ev.overflow_probability < tol:
            return ev
        s *= 2


class _Candidates:
    """Solved truncations keyed by (s_max, c_o), sharing one block table, warm-started."""

    def __init__(self, problem, arrivals, tol, progress, max_iter):
        self.problem, self.arrivals, self.tol, self.progress, self.max_iter = problem, arrivals, tol, progress, max_iter
        self.blocks: MapBlocks | None = None
        self.plan: BlockPlan | None = None
        self.budget = SEARCH_WORK_LIMIT  # multiply-adds left for the policy evaluations of the whole search
        self.cache: dict = {}
        self.warm: np.ndarray | None = None
        self.stage = "truncation"

    def fix(self, s: int | None = None) -> str:
        if s is not None and s <= 4 * self.problem.bmax:  # the first truncation itself
            return (f"the search starts at 4·Bmax = {4 * self.problem.bmax} levels: use a smaller Bmax, fewer batch "
                    f"sizes or phases, or a lighter-tailed service law")
        return (f"the bursts may overload the server for too long (long queues): use a larger --tol-delta (now "
                f"{self.tol:g}), a lower load, shorter bursts or fewer phases")

    def kmax_for(self, s: int) -> int:
        """Counts the block table is built for at truncation s: 2s (≥ 256), or the whole count support when shorter."""
        if self.plan is None:
            self.plan = plan_blocks(self.problem, self.arrivals)
        return max(min(max(2 * s, 256), self.plan.support + 1), 1)

    def check_work(self, s: int) -> None:
        """Refuse truncation s before building it (states, LU work and memory; the blocks' own check is
        :meth:`.map_work.BlockPlan.check`)."""
        b = self.blocks
        support = int(b.khi.max()) if b is not None and b.covers(s) else self.kmax_for(s)
        check_truncation_work(s, self.arrivals.phases, self.problem.bmax, len(self.problem.batch_sizes) + 1, support,
                              self.fix(s))

    def get(self, s: int, c_o: float):
        key = (int(s), float(c_o))
        if key in self.cache:
            return self.cache[key]
        if self.blocks is None or not self.blocks.covers(s):
            # states, and the LU at its least (no arrivals beyond Bmax), before the blocks are built
            check_truncation_work(s, self.arrivals.phases, self.problem.bmax, len(self.problem.batch_sizes) + 1, 0,
                                  self.fix(s))
            self.blocks = map_blocks(self.problem, self.arrivals, self.kmax_for(s), self.plan)
        self.check_work(s)
        model = truncate_map(self.problem, self.arrivals, s, c_o, self.blocks)
        max_iter = _iterations_within(self.budget, model, self.max_iter, self.fix(s))
        res = None
        with solver_checks_convergence():
            for start in ((resize_policy(self.warm, s),) if self.warm is not None else ()) + (None,):
                try:
                    res = map_policy_iteration(model, start, max_iter)
                    break
                except InputError:
                    res = None
        self.budget -= _evaluation_work(model) * ((res.iterations if res is not None else max_iter) + 2)
        if res is not None and not res.converged:
            res = None
        ev = None
        if res is not None:
            self.warm = res.policy
            ev = evaluate_map_policy(model, res.policy, res.stationary)
        cand = (model, res, ev)
        self.cache[key] = cand
        if self.progress is not None:
            self.progress(self.stage, int(s), len(self.cache))
        return cand

    def accepted(self, cand) -> bool:
        """Δ < δ.  Unlike the Poisson search, the action at s_max itself is not required to drain: in a phase
        whose rate exceeds the capacity the last few levels' decisions are truncation artifacts at every
        s_max (they reach S_o either way); the convergence pair below never stores them (R ≤ A/2)."""
        model, res, ev = cand
        return res is not None and ev.delta < self.tol


def _converged_range(small: np.ndarray, big: np.ndarray, s_small: int, problem: BatchingProblem) -> int | None:
    """R = the largest over phases of the Poisson criterion (:func:`.search.converged_range` on each phase's
    column); None when some phase has not converged."""
    R = 0
    for i in range(big.shape[1]):
        r, _ = converged_range(small[:, i], big[:, i], s_small, problem)
        if r is None:
            return None
        R = max(R, r)
    return R


def solve_map(problem: BatchingProblem, arrivals: MAP, s_max: int | str = "auto", abstract_cost: float = 100.0,
              tol_delta: float = 1e-3, max_iter: int = 200, progress: Progress | None = None,
              start: int | None = None) -> MapSolution:
    """Optimal (queue length, phase) batching table for ``problem`` under MAP ``arrivals``.

    ``s_max``: "auto" (the converged search of the module doc) or an integer ≥ Bmax (one truncation,
    c_o as given).  ``problem.lam`` must be the MAP's mean rate (:func:`map_problem`).  ``start``: a
    first s_max guess for "auto" (e.g. the Poisson table's).
    """
    t0 = time.perf_counter()
    s_max, tol, c_o = solve_settings(problem, s_max, tol_delta, abstract_cost, ("auto",))
    if arrivals.phases > 1 and (gap := poisson_gap(arrivals)) <= FAST_EPS:
        return _poisson_limit(problem, arrivals, gap, s_max, abstract_cost, tol, max_iter, progress, start, t0)
    if not isinstance(s_max, str):
        model = truncate_map(problem, arrivals, s_max, c_o)
        res = map_policy_iteration(model, max_iter=_iterations_within(SEARCH_WORK_LIMIT, model, max_iter,
                                                                    "use a smaller s_max"))
        ev = evaluate_map_policy(model, res.policy, res.stationary)
        return MapSolution(problem, arrivals, model, res, ev, tol, "fixed", None, res.policy,
                           time.perf_counter() - t0)
    _check_need(problem, arrivals, tol)
    cands = _Candidates(problem, arrivals, tol, progress, max_iter)
    S = max(4 * problem.bmax, int(start or 0))
    # stages 1–2: c_o ≥ ĝ, then Δ < δ with a draining tail
    cands.stage = "Δ < δ"
    for _ in range(200):
        model, res, ev = cands.get(S, c_o)
        if res is None:
            c_o = max(2.0 * c_o, 1.0)
            continue
        if ev.avg_cost > c_o:
            c_o = CO_RATIO * ev.avg_cost
            continue
        if cands.accepted((model, res, ev)):
            break
        S *= 2
    else:  # pragma: no cover - c_o at most doubles ~60 times and S is bounded by check_work
        raise InputError("the MAP truncation search did not settle")
    cands.stage = "convergence"
    R = None
    while True:
        big = cands.get(S, c_o)
        small = cands.get(S // 2, c_o)
        if big[1] is not None and big[2].avg_cost > c_o:
            c_o = CO_RATIO * big[2].avg_cost
            continue
        if big[1] is not None and small[1] is not None and cands.accepted(big):
            R = _converged_range(small[1].policy, big[1].policy, S // 2, problem)
            if R is not None:
                break
        try:  # the next pair's truncation, refused before any of its work when beyond the limits
            cands.get(2 * S, c_o)
        except InputError:
            break
        S *= 2
    model, res, ev = big
    if res is None:
        raise InputError(f"no converged MAP truncation up to s_max = {S}: policy iteration did not settle")
    table = np.array(res.policy, dtype=np.int64)
    if R is not None:
        table[R + 1:] = table[R]
        ev = evaluate_map_policy(model, table)
    else:
        warnings.warn(f"the MAP table could not be verified as converged within the work limit (s_max = {S}); "
                      "decisions near s_max may still depend on the truncation", TableNotConvergedWarning, stacklevel=2)
    return MapSolution(problem, arrivals, model, res, ev, tol, "auto", R, table, time.perf_counter() - t0,
                       len(cands.cache))


def _evaluation_work(model: MapSMDP) -> float:
    return truncation_work(model.s_max, model.phases, model.problem.bmax, model.actions.size, int(model.blocks.khi.max()))


def _iterations_within(budget: float, model: MapSMDP, max_iter: int, fix: str) -> int:
    """PI iterations that fit in ``budget`` multiply-adds of policy evaluations (two more for a start and the
    final table); refused when fewer than 3 do (a warm-started PI needs 2–5)."""
    work = _evaluation_work(model)
    n = int(budget // work) - 2
    if n < 3:
        raise InputError(f"the MAP truncation at s_max = {model.s_max} would exceed the solve's work limit "
                         f"{SEARCH_WORK_LIMIT:.2g} (about {work:.2g} operations per policy evaluation); {fix}")
    return max(1, min(int(max_iter), n))


def _check_need(problem: BatchingProblem, arrivals: MAP, tol: float) -> None:
    """Refuse, before any work, a search whose queue tail needs more than :data:`MAP_STATE_LIMIT` states: a
    heavy-tailed batch time (CoV² > HEAVY_TAIL_COV2: :func:`~smdp_batch.limits.check_tail`'s estimate) or a
    phase whose rate exceeds the capacity for long (:func:`~smdp_batch.model.map_work.predicted_levels`)."""
    m = arrivals.phases
    l = float(problem.latency_ms()[-1])
    cov2 = float(problem.second_moments()[-1]) / l ** 2 - 1.0
    need, why = predicted_levels(problem, arrivals, tol)
    if cov2 > HEAVY_TAIL_COV2:
        heavy = problem.bmax + tail_factor(cov2) * predicted_queue(problem)
        if heavy > need:
            need, why = heavy, f"service {problem.service.spec()} has a batch-time CoV² of {cov2:.3g}"
    if (need + 2) * m > MAP_STATE_LIMIT:
        raise InputError(
            f"the queue tail needs a truncation of about s_max = {need:.0f} ({why}): {(need + 2) * m:.0f} states with "
            f"{m} phases, over the limit {MAP_STATE_LIMIT}; use a lower load, shorter bursts, a lighter-tailed service "
            f"law or a larger --tol-delta (now {tol:g})")


def _poisson_limit(problem: BatchingProblem, arrivals: MAP, gap: float, s_max, abstract_cost: float, tol: float,
                   max_iter: int, progress: Progress | None, start: int | None, t0: float) -> MapSolution:
    """The MAP's Poisson limit (:func:`~smdp_batch.model.map_work.poisson_gap` ≤ FAST_EPS): the Poisson
    problem at λ̄ solved by :func:`~.solution.solve` (its converged search, tail boundary and banded LU), its
    table, values and metrics in every phase; Q-values on the one-phase MAP model from its relative values;
    the note says so."""
    extra: dict[str, Any] = {"max_iter": max_iter} if max_iter != 200 else {}
    pois = solve(problem, s_max=s_max, abstract_cost=abstract_cost, tol_delta=tol, progress=progress, **extra)
    one = MAP.poisson(arrivals.rate)
    s = pois.s_max
    model = truncate_map(problem, one, s, pois.model.abstract_cost, solvable=False)
    h = np.asarray(pois.result.relative_values, dtype=np.float64)[:, None]
    q = q_values(model, pois.result.gain, h)
    m = arrivals.phases
    rep = lambda x: np.repeat(x, m, axis=1)  # noqa: E731
    table = np.asarray(pois.policy, dtype=np.int64)[:, None]
    res = MapPIResult(rep(np.asarray(pois.result.policy, dtype=np.int64)[:, None]), pois.result.gain, rep(h),
                      rep(q), pois.result.iterations, pois.result.converged, pois.result.seconds, None)
    why = ("every phase has the same arrival rate, so the arrivals are Poisson" if gap == 0 else
           f"fast switching: the phase moves the expected arrival count by at most {gap:.2g} requests (limit {FAST_EPS:g})")
    note = (f"{why}; solved as Poisson arrivals at the mean rate {arrivals.rate:.6g}/ms, the same table in every phase")
    rule = "auto" if pois.rule == "auto" else "fixed"
    sol = MapSolution(problem, arrivals, model, res, _map_evaluation(pois.evaluation), pois.tol_delta, rule,
                      pois.converged_upto, rep(table), time.perf_counter() - t0, pois.candidates, note)
    sol.__dict__["deployed"] = _map_evaluation(pois.deployed)  # the Poisson solution's exact metrics (cached)
    return sol


def _map_evaluation(ev) -> MapEvaluation:
    """A Poisson :class:`~.evaluation.Evaluation` as the one-phase :class:`~.map_pi.MapEvaluation`."""
    return MapEvaluation(ev.avg_cost, ev.delta, ev.mean_latency_ms, ev.mean_power_w, ev.throughput, ev.mean_batch_size,
                         ev.overflow_probability, np.asarray(ev.stationary)[:, None], ev.s_max)
