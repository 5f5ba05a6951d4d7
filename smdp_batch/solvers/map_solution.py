"""Solving the MAP batching SMDP: the converged-table search and the result object (issue 20).

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

With m = 1 this is the Poisson search's criterion; its truncations need not be the same ones (the
Poisson search predicts its jumps from the tail root of z^b = K(z)), so only the converged tables
agree, not s_max.
"""

from __future__ import annotations

import time
import warnings
from dataclasses import dataclass
from functools import cached_property
from typing import Callable

import numpy as np

from ..errors import InputError, NotConvergedWarning, TableNotConvergedWarning
from ..limits import WORK_LIMIT, check_tail
from ..model.arrivals import MAP
from ..model.map_truncation import MapBlocks, MapSMDP, map_blocks, truncate_map
from ..model.problem import BatchingProblem
from .evaluation import resize_policy, tail_stable
from .map_pi import MapEvaluation, MapPIResult, evaluate_map_policy, map_policy_iteration
from .search import CO_RATIO, converged_range
from .solution import solve_settings

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
        return evaluate_map_deployed(self.problem, self.arrivals, self.table, self.model.blocks)

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
            "units": {"time": "ms", "energy": "mJ", "power": "W", "lam": "1/ms", "throughput": "1/ms"},
        }


#: Most states (levels × phases) of one truncation in the search: the sparse LU of the evaluation fills in
#: far beyond the band (measured: 3 GB and 60 s for a search reaching 16 384 states, m = 2; 8 200 keeps
#: a refused search under ~1 GB and ~15 s).
MAP_STATE_LIMIT = 8_200

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
    while True:
        if blocks is None or blocks.kmax < s:
            blocks = map_blocks(problem, arrivals, 2 * s)
        model = truncate_map(problem, arrivals, s, 0.0, blocks)
        ev = evaluate_map_policy(model, resize_policy(policy, s))
        if ev.delta < tol * max(1.0, ev.avg_cost) and ev.overflow_probability < tol:
            return ev
        if 2 * s > DEPLOYED_SMAX_LIMIT:
            raise InputError(f"the policy's queue tail is too heavy to evaluate with s_max ≤ {DEPLOYED_SMAX_LIMIT} "
                             f"(overflow probability {ev.overflow_probability:.3g})")
        s *= 2


class _Candidates:
    """Solved truncations keyed by (s_max, c_o), sharing one block table, warm-started."""

    def __init__(self, problem, arrivals, tol, progress, max_iter):
        self.problem, self.arrivals, self.tol, self.progress, self.max_iter = problem, arrivals, tol, progress, max_iter
        self.blocks: MapBlocks | None = None
        self.cache: dict = {}
        self.warm: np.ndarray | None = None
        self.stage = "truncation"

    def check_work(self, s: int) -> None:
        m = self.arrivals.phases
        A = len(self.problem.batch_sizes) + 1
        width = float(np.mean(self.blocks.khi)) + self.problem.bmax if self.blocks is not None else 4.0 * self.problem.bmax
        if (s + 2) * m > MAP_STATE_LIMIT or A * (s + 2) * m * m * min(width, s) > WORK_LIMIT:
            raise InputError(
                f"the MAP truncation search reached s_max = {s} ({m} phases, count supports ≈ {width:.0f}): beyond the "
                f"work limit; the bursts may overload the server for too long (queues of thousands), use a larger "
                f"--tol-delta (now {self.tol:g}), a lower load or shorter bursts")

    def get(self, s: int, c_o: float):
        key = (int(s), float(c_o))
        if key in self.cache:
            return self.cache[key]
        self.check_work(s)
        if self.blocks is None or self.blocks.kmax < s:
            self.blocks = map_blocks(self.problem, self.arrivals, max(2 * s, 256))
        model = truncate_map(self.problem, self.arrivals, s, c_o, self.blocks)
        res = None
        with warnings.catch_warnings():
            warnings.simplefilter("ignore", NotConvergedWarning)
            for start in ((resize_policy(self.warm, s),) if self.warm is not None else ()) + (None,):
                try:
                    res = map_policy_iteration(model, start, self.max_iter)
                    break
                except InputError:
                    res = None
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
    """Optimal (queue length, phase) batching table for ``problem`` under MAP ``arrivals`` (issue 20).

    ``s_max``: "auto" (the converged search of the module doc) or an integer ≥ Bmax (one truncation,
    c_o as given).  ``problem.lam`` must be the MAP's mean rate (:func:`map_problem`).  ``start``: a
    first s_max guess for "auto" (e.g. the Poisson table's).
    """
    t0 = time.perf_counter()
    s_max, tol, c_o = solve_settings(problem, s_max, tol_delta, abstract_cost, ("auto",))
    if not isinstance(s_max, str):
        model = truncate_map(problem, arrivals, s_max, c_o)
        res = map_policy_iteration(model, max_iter=max_iter)
        ev = evaluate_map_policy(model, res.policy, res.stationary)
        return MapSolution(problem, arrivals, model, res, ev, tol, "fixed", None, res.policy,
                           time.perf_counter() - t0)
    check_tail(problem, tol)  # a heavy-tailed law whose Poisson table would not fit is refused here too
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
        try:
            cands.check_work(2 * S)
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
