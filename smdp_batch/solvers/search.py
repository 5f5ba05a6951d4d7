"""Choosing the truncation s_max (paper 004 §V-A): the paper's minimal rule and the converged rule.

Both rules solve candidate truncations exactly (policy iteration, warm-started from the previous
candidate) through one :class:`Candidates` cache that shares the arrival table.

**Minimal** (``s_max="minimal"``, the paper's Table II rule): the smallest s_max whose solution has
Δ < δ (eq. 22) and a tail action that drains long queues, for the given c_o.  Steps of 1 up to 256,
then ×1.25 with bisection back to 1 % (see :func:`search_minimal`).

**Converged** (``s_max="auto"``, the default): a table whose every stored decision is that of the
infinite queue.  By default it is searched on the *tail boundary* (``Candidates(tail=B)``,
:mod:`~smdp_batch.model.truncation`): above s_max the queue serves B, the batch size of greatest
throughput, and each jump past s_max is charged its excursion's exact cost and time, so the truncation
error falls with the geometric terms of the bias, not with the queue tail.  Only stage 3 below is
needed there (:func:`_search_tail`), with S ≥ 4·Bmax, B required at R, and Δ reported as
|ĝ(S) − ĝ(S/2)| < δ: gamma:0.5 service at ρ = 0.9 converges at S = 1 024 instead of 8 134.  When several
sizes tie for the greatest throughput (l(b) ∝ b) the table may settle on any of them; B then moves to that
size (:func:`~.limit.retarget`).  A problem whose converged and probable-range tables (below) are both beyond
the state or work limit is refused before any truncation is solved (:func:`~.limit.check_reach`: the onset
of the limit action from the quadratic bias of eq. 20, e.g. n ≈ 1.5·10⁵ for exponential service at Bmax 1 024,
ρ = 0.9).  On eq. 19's
overflow boundary (RVI, JAX, ``boundary="overflow"``) the rule has three stages (:func:`search_converged`):

1. *Overflow cost.*  The abstract cost makes the overflow state S_o cost at least c_o per ms
   (ĉ(S_o, a) = c(s_max, a) + c_o·y(a), eq. 19).  When c_o is below the truncation's average cost
   ĝ, parking in S_o is *cheaper* than running the queue — S_o caps the holding cost at s_max and,
   waiting there, spends no energy — so small truncations are solved by policies that wait at the
   top (paper 004 Fig. 10, c_o = 10 and 0: "the computed policy is to always wait").  At w2 = 100
   (ĝ ≈ 5 500 against c_o = 100) this drove the paper's rule to s_max = 14 423.  The converged rule
   raises c_o to 1.5·ĝ until c_o ≥ ĝ (the paper's own choice c_o = 100 at ĝ = 66, Table II, is this
   ratio and is kept as is).  Time in S_o then costs at least the average, so no policy gains by
   reaching it; c_o only weights the rare overflow and cannot move the decisions the next stages
   verify against larger truncations.
2. *Tail.*  Under a policy serving b at long queues, the queue-length tail decays geometrically,
   P(N > n) ∝ z₀⁻ⁿ, with z₀ > 1 the root of zᵇ = K(z), K(z) = Σ p_k^[b] zᵏ = g̃_b(λ(1 − z)) (bulk
   service theory, e.g. Chaudhry & Templeton, *A First Course in Bulk Queues*); Δ(s_max) falls at that rate.  From one solved truncation with
   Δ₀ ≥ δ the rule jumps to s_max + ln(Δ₀/(δ/4))/ln z₀ (:func:`tail_rate`); after two points it uses
   their measured rate (heavy tails, where z₀ → 1, are caught this way).
3. *Convergence.*  Solve truncations S/2 and S (S ≥ 4·Bmax).  Let A be the last queue length up to
   which both choose the same action for every n, and R the start of the run of equal actions of
   the S-solution that ends at A.  The table is converged when that action is a limiting action —
   one of greatest throughput b/l(b) (:func:`limiting_actions`) — and the run is long: A ≥ 2R and
   A − R ≥ Bmax.  Otherwise S doubles.  The stored policy
   is the S-solution on 0..R and π(R) beyond (eq. 30), so "serve π(last)" is the limiting action;
   ``converged_upto`` = R is stored with the table.  Every stored decision is thus that of a
   truncation at least 2A ≥ 4R states long.

**Probable range** (large Bmax, tail boundary only; :func:`_search_probable`): when the first pair at
4·Bmax is beyond the work limit, truncations shorter than Bmax verify the table on the queue lengths
that occur (P(N > R) < :data:`PROBABLE_MASS`); π(R) is then as a rule not a limiting action, and
:func:`~.solution.solve` says so.  Stage 3's last pair gets the same acceptance when the state or work
limit stops its doubling.
"""

from __future__ import annotations

import math
import time
from dataclasses import dataclass, replace
from functools import cached_property
from typing import Callable

import numpy as np

from ..errors import InputError, solver_checks_convergence
from ..limits import SEARCH_STATE_LIMIT, WORK_LIMIT
from ..model.problem import BatchingProblem
from ..model.truncation import ArrivalTable, TruncatedSMDP, arrival_table, truncate
from ..baselines.simple import greedy_policy
from .evaluation import Evaluation, evaluate_deployed, evaluate_policy, resize_policy, tail_stable
from .limit import PROBABLE_MASS, check_reach, estimated_width, limiting_sizes, retarget
from .pi import policy_iteration
from .result import SolveResult

__all__ = ["Candidates", "Candidate", "Converged", "search_minimal", "search_converged", "search_near", "tail_rate",
           "converged_range", "limiting_actions", "limiting_sizes", "SMAX_LIMIT", "NEAR_OVERFLOW", "PROBABLE_MASS"]

#: Give up a search beyond this s_max (the search state limit of :mod:`smdp_batch.limits`).
SMAX_LIMIT = SEARCH_STATE_LIMIT
#: PI budget per candidate: warm starts settle in a few iterations; a candidate that needs more sits in
#: the degenerate zone and is passed over (an accepted candidate's PI always converged).
SCAN_PI_ITER = 50
#: c_o is raised to this multiple of ĝ when it is below ĝ (paper 004 Table II: c_o = 100 at ĝ = 66).
CO_RATIO = 1.5

Progress = Callable[[str, int, int], None]  # (stage, s_max, candidates solved)


@dataclass
class Candidate:
    model: TruncatedSMDP
    res: SolveResult | None  # None: PI did not settle (a degenerate truncation)
    stable: bool  # the tail action π(s_max) drains long queues

    @cached_property
    def ev(self) -> Evaluation:
        """Exact metrics of the solved policy (eqs. 21–22), computed when first asked for: the smaller
        truncation of a convergence pair only lends its policy."""
        # read only for a solved candidate (res not None); the None is never used
        return None if self.res is None else evaluate_policy(self.model, self.res.policy)  # type: ignore[return-value]

    def accepted(self, tol: float) -> bool:
        return self.res is not None and self.stable and self.ev.delta < tol


class Candidates:
    """Solved truncations of one problem, keyed by (s_max, c_o, tail action), sharing one arrival table."""

    def __init__(self, problem: BatchingProblem, tol: float, progress: Progress | None = None,
                 max_iter: int = SCAN_PI_ITER, tail: int | None = None):
        self.problem = problem
        self.tail = tail  # B of the tail boundary (truncate(tail=B)), or None for eq. 19's S_o
        self.tol = tol
        self.arrivals: ArrivalTable | None = None  # built at the first candidate (after the work checks)
        self.cache: dict[tuple[int, float, int | None], Candidate] = {}
        self.warm: np.ndarray | None = None
        self.progress = progress
        self.max_iter = max_iter
        self.stage = "truncation"
        self.tried: set[int] = set()  # tail actions left for a tied size the table settles on (:func:`.limit.retarget`)

    def tail_at(self, s: int) -> int:
        """The tail action of truncation s: B, or below B (s < B, the probable-range search) the batch size
        ≤ s of greatest throughput (:func:`tail_action_at`)."""
        return self.tail if self.tail <= s else tail_action_at(self.problem, s)  # type: ignore[operator, return-value]  # asked only on the tail boundary

    def check_work(self, s: int) -> None:
        """Refuse a candidate that would exceed the state or work limit, before building it."""
        if s > SMAX_LIMIT:
            raise InputError(
                f"the truncation search needs s_max > {SMAX_LIMIT} (the state limit) to reach Δ < {self.tol:g}; "
                f"the load ρ = {self.problem.rho:.6g} may be too close to 1, or the service law's tail too heavy "
                f"for this tolerance (use a larger --tol-delta)")
        usable = int(np.searchsorted(self.problem.batch_sizes, s, side="right"))  # batch sizes ≤ s
        if self.arrivals is None or self.arrivals.kmax < s:
            width = estimated_width(self.problem, s)
        else:
            width = float(np.mean(np.count_nonzero(self.arrivals.pmf[:usable, : s + 1] > 1e-18, axis=1))) + 1.0
        if (usable + 1) * (s + 2) * width > WORK_LIMIT:
            raise InputError(
                f"the truncation search reached s_max = {s} with arrival supports of {width:.0f} states: that "
                f"candidate would exceed the work limit; use a larger --tol-delta (now {self.tol:g}), a lower load "
                "or a lighter-tailed service law")

    def warm_start(self, s: int) -> np.ndarray | None:
        """The previous candidate's policy carried to s_max = s; a waiting tail becomes greedy service."""
        pol = self.warm
        if pol is None:
            return None
        out = resize_policy(pol, s)
        if self.tail:
            out[-2:] = self.tail_at(s)  # the tail boundary serves B at s_max and S_o
            return out
        if not tail_stable(self.problem, pol):
            top = min(pol.size - 2, s)
            serving = np.nonzero(out[: top + 1] > 0)[0]
            start = int(serving[-1]) + 1 if serving.size and serving[-1] < top else top
            start = start if serving.size else 0
            out[start:] = greedy_policy(self.problem.batch_sizes, s)[start:]
        return out

    def get(self, s: int, c_o: float) -> Candidate:
        key = (int(s), float(c_o), self.tail)
        if key in self.cache:
            return self.cache[key]
        self.check_work(s)
        if self.arrivals is None or self.arrivals.kmax < s:
            # one table for the search's first doublings (a table row per batch size: with thousands of
            # batch sizes the build, not PI, would dominate a short truncation)
            self.arrivals = arrival_table(self.problem, max(2 * s, 256, 16 * PROBABLE_START))
        model = truncate(self.problem, s, c_o, self.arrivals, tail=self.tail_at(s) if self.tail else None)
        res = None
        try:
            with solver_checks_convergence():  # checked below
                try:
                    res = policy_iteration(model, policy0=self.warm_start(s), max_iter=self.max_iter)
                except InputError:  # a warm start from a degenerate candidate can be multichain
                    res = policy_iteration(model, max_iter=self.max_iter)
            if not res.converged:
                res = None
        except InputError:
            # a numerically multichain policy: the top states wait and S_o's class is cut off from the
            # rest — a degenerate truncation, passed over like the others
            res = None
        if res is None:
            cand = Candidate(model, None, False)
        else:
            self.warm = res.policy
            cand = Candidate(model, res, tail_stable(self.problem, res.policy))
        self.cache[key] = cand
        if self.progress is not None:
            self.progress(self.stage, int(s), len(self.cache))
        return cand


def _next_smax(s: int) -> int:
    return s + 1 if s < 256 else int(s * 1.25)


def search_minimal(cands: Candidates, c_o: float) -> Candidate:
    """The paper's rule: the smallest s_max with Δ < δ and a stabilising tail action (to 1 % above 256).

    Steps are 1 up to s_max = 256 (so Table II's minimal s_max is found exactly); beyond, s_max grows
    by ×1.25 and the search bisects back between the last rejected and the first accepted candidate.
    Degenerate candidates (the top waits) make s_max grow geometrically.
    """
    tol = cands.tol
    cands.stage = "minimal s_max"
    s = cands.problem.bmax
    last_bad = s - 1
    while s <= SMAX_LIMIT:
        if cands.get(s, c_o).accepted(tol):
            lo, hi = last_bad, s
            while hi - lo > 1 and hi - lo > (0 if hi <= 256 else hi // 100):
                mid = (lo + hi) // 2
                if cands.get(mid, c_o).accepted(tol):
                    hi = mid
                else:
                    lo = mid
            return cands.get(hi, c_o)
        last_bad = s
        stable = cands.get(s, c_o).stable
        s = _next_smax(s) if stable else max(_next_smax(s), int(s * 1.25))
    raise InputError(f"no s_max ≤ {SMAX_LIMIT} reaches Δ < {tol:g}; the load ρ = {cands.problem.rho:.6g} may be too close to 1")


def tail_rate(problem: BatchingProblem, arrivals: ArrivalTable, b: int) -> float:
    """ln z₀, the geometric decay rate per state of the queue tail under "serve b" (0 if none).

    z₀ > 1 solves zᵇ = K(z) with K(z) = Σ_k p_k^[b] zᵏ (the arrival pgf during a batch of b, i.e.
    g̃_b(λ(1 − z))).  K is taken from the arrival table; a tail too heavy for any z > 1 (or a b that
    does not drain the queue, λ·l(b) ≥ b) gives 0.
    """
    i = list(problem.batch_sizes).index(int(b))
    p = arrivals.pmf[i]
    k = np.arange(p.size, dtype=np.float64)
    nz = p > 0
    lp, kk = np.log(p[nz]), k[nz]
    mean = float(p @ k)
    if not mean < b:
        return 0.0

    def f(t: float) -> float:  # b·ln z − ln K(z) with t = ln z
        x = lp + kk * t
        m = float(x.max())
        return b * t - (m + math.log(float(np.exp(x - m).sum())))

    # f(0) = 0, f'(0) = b − E[K] > 0 and f is concave: bracket the second zero
    hi = 1e-3
    while f(hi) > 0:
        hi *= 2
        if hi > 50:
            return 0.0
    lo = hi / 2 if hi > 1e-3 else 0.0
    if lo == 0.0:
        lo = 1e-9
        if f(lo) <= 0:
            return 0.0
    for _ in range(80):
        mid = 0.5 * (lo + hi)
        if f(mid) > 0:
            lo = mid
        else:
            hi = mid
    # beyond the table, K is unknown: a rate that puts the table's last term above the others is not real
    last = float(p[-1])
    return lo if last == 0.0 or math.log(last) + lo * (p.size - 1) < math.log(1e-3) else 0.0


def agreement(small: np.ndarray, big: np.ndarray, s_small: int) -> int:
    """A: the last queue length up to which two truncations' policies choose the same action at every n
    (−1 if they differ at 0), on the smaller one's states 0..s_small."""
    n = s_small + 1
    diff = np.nonzero(small[:n] != big[:n])[0]
    return int(diff[0]) - 1 if diff.size else s_small


def converged_range(small: np.ndarray, big: np.ndarray, s_small: int, problem: BatchingProblem) -> tuple[int | None, int]:
    """(R, A) of the module doc for the policies of two truncations; R is None when not converged."""
    A = agreement(small, big, s_small)
    if A < 0:
        return None, A
    a = int(big[A])
    R = A
    while R > 0 and int(big[R - 1]) == a:
        R -= 1
    ok = a > 0 and a in limiting_actions(problem) and A >= 2 * R and A - R >= problem.bmax
    return (R if ok else None), A


def tail_action_at(problem: BatchingProblem, s: int) -> int:
    """The batch size ≤ s of greatest throughput (the largest of any ties, as the tail boundary's B), 0 when
    none drains the queue (λ·l(b) < b): the tail action of a truncation shorter than Bmax."""
    sizes = np.asarray(problem.batch_sizes, dtype=np.int64)
    l = problem.latency_ms()
    keep = sizes <= s
    if not keep.any():
        return 0
    rate = sizes[keep] / l[keep]
    b = int(sizes[keep][rate >= rate.max() * (1 - 1e-9)].max())
    return b if problem.lam * float(l[list(sizes).index(b)]) < b else 0


def limiting_actions(problem: BatchingProblem) -> set[int]:
    """Batch sizes of greatest throughput b/l(b) (to 1e-9 relative): the action of the infinite queue at
    long queue lengths is one of them.  There the holding cost of draining n requests grows as n² against
    the rate b/l(b) − λ, the energy only as n, so every other action loses (a fluid argument, made exact by
    :func:`~.limit.limit_onset`; the search also checks it by comparing truncations).  Among tied sizes the
    constant terms decide, and the table may settle on any of them (:func:`~.limit.retarget`)."""
    return limiting_sizes(problem.batch_sizes, problem.latency_ms())


@dataclass
class Converged:
    """Outcome of :func:`search_converged`."""

    candidate: Candidate  # the larger truncation S (its PI result and model)
    abstract_cost: float  # c_o used (≥ the requested one)
    converged_upto: int | None  # R, or None when the search hit its limits
    policy: np.ndarray  # the stored policy: S-solution on 0..R, π(R) beyond (length S+2)
    evaluation: Evaluation  # of ``policy`` on the truncation S
    seconds: float
    probable: bool = False  # accepted on the queue's probable range (:func:`_search_probable`), not by stage 3
    mass: float = 0.0  # the probable-range table: P(N > R) at decision epochs under its policy


#: :func:`search_near` accepts a truncation whose overflow state has at most this probability (and a
#: cost share Δ below this times ĝ): its W̄, P̄ are then those of the infinite queue to ~1e-8 relative.
NEAR_OVERFLOW = 1e-8


def search_near(cands: Candidates, s: int, c_o: float, limit: int) -> Candidate | None:
    """The optimal policy of one fixed truncation near a neighbour's (a front's next w2), or None.

    Solves s_max = max(4·Bmax, s/2) first, then doubles up to ``limit``, warm-started from
    ``cands.warm``, with c_o raised as in stage 1 of the module doc, until the overflow state is
    negligible: probability < NEAR_OVERFLOW and Δ < NEAR_OVERFLOW·ĝ, :func:`~.evaluation.evaluate_deployed`'s own test (so the metrics are the infinite
    queue's, eq. 30 adding nothing measurable).  Unlike :func:`search_converged` the table is not
    verified against a larger truncation: a front needs the policy's W̄ and P̄, not every rare decision.
    None when PI does not settle, the tail does not drain, or ``limit`` is reached.
    """
    s = max(4 * cands.problem.bmax, int(s) // 2)
    while s <= limit:
        try:
            c_o, cand = _raise_c_o(cands, s, c_o)
        except InputError:
            return None
        if cand.res is None or not cand.stable:
            return None
        ev = cand.ev
        if ev.overflow_probability < NEAR_OVERFLOW and ev.delta < NEAR_OVERFLOW * max(1.0, ev.avg_cost):
            return cand
        s *= 2
    return None


def _raise_c_o(cands: Candidates, s: int, c_o: float) -> tuple[float, Candidate]:
    """Stage 1: the smallest c_o ≥ the requested one with c_o ≥ ĝ at truncation s (×1.5 steps)."""
    cands.stage = "overflow cost"
    for _ in range(60):
        cand = cands.get(s, c_o)
        if cand.res is None:  # PI did not settle: the top waits; c_o is far too small
            c_o = max(2.0 * c_o, 1.0)
            continue
        if c_o >= cand.ev.avg_cost:
            return c_o, cand
        c_o = CO_RATIO * cand.ev.avg_cost
    raise InputError(f"the overflow cost c_o did not settle at s_max = {s} (ĝ = {cand.ev.avg_cost if cand.res else float('nan'):.6g})")


def _delta_search(cands: Candidates, s: int, c_o: float) -> tuple[float, Candidate, int]:
    """Stage 2: a truncation ≥ s with Δ < δ and a stabilising tail, by the tail-rate prediction."""
    tol = cands.tol
    prev: tuple[int, float] | None = None
    cands.stage = "Δ < δ"
    while True:
        cand = cands.get(s, c_o)
        if cand.res is not None and cand.ev.avg_cost > c_o:  # ĝ grew past c_o: raise it and redo
            c_o, cand = _raise_c_o(cands, s, c_o)
            prev = None
            cands.stage = "Δ < δ"
        if cand.accepted(tol):
            return c_o, cand, s
        target = tol / 4
        step = 0
        if cand.res is not None and cand.stable and cand.ev.delta > 0:
            d = cand.ev.delta
            rate = 0.0
            if prev is not None and prev[1] > d:
                rate = math.log(prev[1] / d) / (s - prev[0])
            if rate <= 0:
                b = int(cand.res.policy[min(s, max(cands.problem.bmax, (3 * s) // 4))])
                b = b if b > 0 else cands.problem.bmax
                assert cands.arrivals is not None  # built by the first cands.get
                rate = tail_rate(cands.problem, cands.arrivals, b)
            if rate > 0:
                step = math.ceil(math.log(d / target) / rate)
            prev = (s, d)
        nxt = s + step if step > 0 else 2 * s
        nxt = int(min(max(nxt, math.ceil(1.25 * s)), 8 * s))
        if nxt > SMAX_LIMIT and s < SMAX_LIMIT:
            nxt = SMAX_LIMIT
        s = nxt


def search_converged(cands: Candidates, c_o: float, start: int | None = None, max_smax: int = SMAX_LIMIT) -> Converged:
    """The converged rule of the module doc; ``start`` (e.g. a neighbouring w2's s_max) is a first guess.

    With ``cands.tail`` set (the tail boundary, the default of :func:`~.solution.solve`) stages 1–2 fall
    away (:func:`_search_tail`)."""
    t0 = time.perf_counter()
    problem = cands.problem
    s0 = max(4 * problem.bmax, int(start or 0))
    if cands.tail:  # neither a converged nor a probable-range table within the limits: refused before any work
        check_reach(problem, max_smax, PROBABLE_START)
    try:
        cands.check_work(s0)
    except InputError:
        if cands.tail and start is None:
            return _search_probable(cands, t0)
        raise InputError(
            f"a converged table for Bmax = {problem.bmax} starts at s_max = {s0} (4·Bmax), beyond the work limit for "
            f"{len(problem.batch_sizes)} batch sizes; use --s-max minimal (paper 004's smallest truncation with "
            "Δ < δ, not verified as converged) or fewer batch sizes (--batch-sizes)") from None
    if cands.tail:
        return _search_tail(cands, s0, max_smax, t0)
    c_o, _ = _raise_c_o(cands, s0, float(c_o))
    c_o, big, S = _delta_search(cands, s0, c_o)
    S = max(S, 4 * problem.bmax)
    cands.stage = "convergence"
    while True:
        R = None  # set only for the current pair, and only when it is accepted
        big = cands.get(S, c_o)
        small = cands.get(S // 2, c_o)
        if big.res is not None and small.res is not None:
            if big.ev.avg_cost > c_o:  # rare: raise c_o and start the check again at this size
                c_o, big = _raise_c_o(cands, S, c_o)
                cands.stage = "convergence"
                continue
            # big.res is not None (checked above; mypy loses it over the reassignment before the continue)
            R, _ = converged_range(small.res.policy, big.res.policy, S // 2, problem)  # type: ignore[union-attr]
            if R is not None and big.accepted(cands.tol):
                break
            R = None
        if not _can_double(cands, S, max_smax):
            break
        S *= 2
    pol = _stored_policy(big, R, S)
    ev = evaluate_policy(big.model, pol) if R is not None else big.ev
    return Converged(big, c_o, R, pol, ev, time.perf_counter() - t0)


def _can_double(cands: Candidates, S: int, max_smax: int) -> bool:
    """Whether the convergence check may go on to 2S (within max_smax and the work limit); when it may not,
    the table so far is returned with converged_upto = None (and a warning by solve())."""
    if 2 * S > max_smax:
        return False
    try:
        cands.check_work(2 * S)
    except InputError:
        return False
    return True


def _stored_policy(big: Candidate, R: int | None, S: int) -> np.ndarray:
    """The stored table: the S-solution on 0..R and π(R) beyond (the whole S-solution when R is None)."""
    if big.res is None:
        raise InputError(f"no converged truncation up to s_max = {S}: policy iteration did not settle")
    pol = np.array(big.res.policy, dtype=np.int64)
    if R is not None:
        pol[R + 1:] = pol[R]
    return pol


def _search_tail(cands: Candidates, S: int, max_smax: int, t0: float) -> Converged:
    """Stage 3 on the tail boundary: S doubles until the pair (S/2, S) is converged and ĝ moved < δ.

    The tail boundary's truncation error falls with the geometric terms of the bias (module doc of
    :mod:`~smdp_batch.model.truncation`), not with the queue tail, so there is no Δ stage: Δ is reported
    as |ĝ(S) − ĝ(S/2)| (cost per ms, the role eq. 22's Δ plays for S_o).  The pair must settle on the tail
    action B; when it settles on another size of greatest throughput (a tie), B becomes that size.
    """
    problem = cands.problem
    cands.stage = "convergence"
    while True:
        R = None
        big = cands.get(S, 0.0)
        small = cands.get(S // 2, 0.0)
        if big.res is not None and small.res is not None:
            R, _ = converged_range(small.res.policy, big.res.policy, S // 2, problem)
            gap = abs(big.res.gain - small.res.gain)
            if R is not None and int(big.res.policy[R]) == cands.tail and gap < cands.tol:
                break
            if R is not None and retarget(cands, big.res.policy, R):  # settled on a tied size: the pair again,
                continue  # with that size above s_max (an exact model of "the table, then serve it")
            R = None
        if not _can_double(cands, S, max_smax):
            found = _probable_pair(cands, big, small, S, t0)  # the limit is out of reach: the probable range
            if found is not None:
                return found
            break
        S *= 2
    pol = _stored_policy(big, R, S)
    ev = evaluate_policy(big.model, pol)
    if small.res is not None:
        assert big.res is not None  # _stored_policy refuses an unsolved big
        ev = replace(ev, delta=abs(big.res.gain - small.res.gain))
    return Converged(big, 0.0, R, pol, ev, time.perf_counter() - t0)


#: The probable-range search's first truncation (then ×2): short enough to be cheap at any Bmax.
PROBABLE_START = 64


def _probable_pair(cands: Candidates, big: Candidate, small: Candidate, S: int, t0: float) -> Converged | None:
    """The probable-range acceptance of a pair (S/2, S) (:func:`_search_probable`), or None."""
    if big.res is None or small.res is None:
        return None
    A = agreement(small.res.policy, big.res.policy, S // 2)
    gap = abs(big.res.gain - small.res.gain)
    if A < 0 or not gap < cands.tol:
        return None
    mass = float(big.ev.stationary[A + 1:].sum())
    pol = _stored_policy(big, A, S)
    if not (mass < PROBABLE_MASS and tail_stable(cands.problem, pol)):  # π(R) must drain (eq. 30 deploys it)
        return None
    ev = replace(evaluate_deployed(cands.problem, pol), delta=gap)
    return Converged(big, 0.0, A, pol, ev, time.perf_counter() - t0, probable=True, mass=mass)


def _search_probable(cands: Candidates, t0: float) -> Converged:
    """The table on the queue lengths that carry probability, when the converged rule cannot start.

    With a large Bmax and many batch sizes (``--bmax 4096``: 4·Bmax states × 4 096 actions) the first
    truncation of :func:`_search_tail` is beyond the work limit.  There the optimal batch usually grows
    slowly with the queue and reaches Bmax only far beyond any queue that occurs: when b/l(b) hardly rises
    near Bmax (an affine l(b) with a small intercept), serving less than Bmax costs little throughput and
    saves latency.  (Measured, basic scenario ρ = 0.9, 𝓑 = 1..4096: π(n) ≈ 770 at n = 8 000, rising by one
    every ~22 states, while P(N > 512) < 1e-30.)  A table that reaches the limit action is then out of
    reach, and one that covers the queue's probable range is not.

    Truncations S = 64, 128, … shorter than Bmax use the tail boundary with the batch size ≤ S of
    greatest throughput (:meth:`Candidates.tail_at`), so each is an exact model of "the table, then serve
    that batch above S": its ĝ is the gain of a deployable policy.  A pair (S/2, S) is accepted when
    both choose the same action for every n ≤ A, |ĝ(S) − ĝ(S/2)| < δ, and under the S-solution the queue
    exceeds A with probability P(N > A) < :data:`PROBABLE_MASS`.  The table is the S-solution on 0..R = A
    and π(R) beyond; ``converged_upto`` = R, every stored decision equal to that of a truncation ≥ 2R,
    but π(R) is as a rule not a limiting action (it may be, without stage 3's long run of it; ``probable``
    is True either way, and :func:`~.solution.solve` warns).  If the
    work limit comes first, InputError (a queue whose probable range is too long for this many batch sizes).
    :func:`_search_tail` applies the same acceptance to its last pair when it cannot double any more.
    """
    problem = cands.problem
    cands.stage = "probable range"
    S = PROBABLE_START
    while not tail_action_at(problem, S // 2):
        S *= 2
    while 2 * S <= 4 * problem.bmax:
        try:
            cands.check_work(S)
        except InputError:
            break
        found = _probable_pair(cands, cands.get(S, 0.0), cands.get(S // 2, 0.0), S, t0)
        if found is not None:
            return found
        S *= 2
    raise InputError(
        f"a converged table for Bmax = {problem.bmax} with {len(problem.batch_sizes)} batch sizes starts at s_max = "
        f"{4 * problem.bmax} (4·Bmax), beyond the work limit, and the queue's probable range (P(N > n) ≥ "
        f"{PROBABLE_MASS:g}) reaches beyond s_max = {S // 2}, the longest truncation within it; use fewer batch "
        "sizes (--batch-sizes), a lower load or a lighter-tailed service law")
