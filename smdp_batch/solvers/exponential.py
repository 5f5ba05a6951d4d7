"""The converged table for exponential batch times where the general search cannot reach it (paper 004 §V-A).

At high load and large Bmax the optimal batch keeps growing until long queues — exponential service at
Bmax 1 024, ρ = 0.9 serves Bmax only from n ≈ 1.5·10⁵ on — and the general converged rule
(:mod:`.search`: truncations S/2 and S with S ≥ 4R, an arrival table K ≈ 40·λl(Bmax) wide) is refused
before any work.  :mod:`.geometric` solves such truncations in O(S) memory; this module chooses them.

**Why a short margin suffices.**  On the tail boundary the truncation changes the bias only through the
terms of eq. 20's homogeneous solutions inside the unit circle, which fall like rⁿ past the last change of
action; for serve-B with geometric arrivals r is the largest modulus of the roots of zᴮ(1 − q_B·z) = 1 − q_B
other than 1 (:func:`transient_length` finds it by Newton's method on the branch k = 1 of
B·ln z + ln(1 − q_B z) = ln(1 − q_B) + 2πik; 0.99807 at Bmax 1 024, ρ = 0.9, against numpy's roots of the
degree-1 025 polynomial).  A truncation with S − R ≥ 40·ℓ, ℓ = 1/|ln r|, leaves them below e⁻⁴⁰ ≈ 4·10⁻¹⁸.

**The rule.**  Start at S = max(4·Bmax, n* + 2·(40ℓ + 4·Bmax)), n* the onset of B by the quadratic bias
(:func:`~.limit.limit_onset`).  Solve S by policy iteration; R is where its final run of equal actions starts,
and that action must be a limiting one (greatest throughput b/l(b)).  While S − R < 40ℓ, grow S to
R + 40ℓ + 4·Bmax.  Then solve S' = S + 40ℓ + 4·Bmax (warm-started) and accept when both truncations choose
the same actions for every n ≤ R, the same R and ĝ to δ; else S := S' and repeat.  The stored table is the
S'-solution on 0..R and π(R) beyond (eq. 30), with ``converged_upto`` = R verified against S'.
"""

from __future__ import annotations

import cmath
import math
import time
from concurrent.futures import Future, ThreadPoolExecutor
from dataclasses import dataclass

import numpy as np

from ..errors import InputError
from ..model.laws import Exponential
from ..model.problem import BatchingProblem
from .evaluation import Evaluation
from .geometric import GeometricModel, geometric_model
from .geometric_system import metrics, stationary
from .geometric_pi import GeometricPI, policy_iteration
from .limit import limit_onset, onset_terms, quadratic_bias, quadratic_choice
from .result import SolveResult
from .search import limiting_actions
from .threads import single_blas

__all__ = ["EXP_STATE_LIMIT", "EXP_WORK_LIMIT", "ExponentialAnswer", "applies", "solve_exponential",
           "transient_length"]

#: Largest truncation the exponential rule solves (O(S) memory: GMRES's basis is at most 61 × S floats, ~0.26 GB at
#: this size, once more while the metrics' adjoint runs beside the last solve; Bmax 1 024, 221 000 states: 0.40 GB
#: peak for the whole command).
EXP_STATE_LIMIT = 1 << 19
#: Largest states × actions of one improvement sweep (each V_a by its recursion).
EXP_WORK_LIMIT = 1e9
#: The margin past R in transient lengths ℓ (e⁻⁴⁰ ≈ 4·10⁻¹⁸).
MARGIN_LENGTHS = 40
#: :func:`coarse_start` keeps the first COARSE_DENSE batch sizes and about COARSE_SIZES more.
COARSE_DENSE, COARSE_SIZES = 64, 120


def applies(problem: BatchingProblem) -> bool:
    """Whether ``problem`` is one the exponential rule solves: one server, exponential batch times."""
    return problem.instances == 1 and isinstance(problem.service, Exponential)


def transient_length(problem: BatchingProblem, B: int) -> float:
    """ℓ = 1/|ln r| in states, r the largest modulus < 1 of the roots of zᴮ(1 − qz) = 1 − q other than 1
    (module doc), q = λl(B)/(1 + λl(B)); the branches k = 1..4 of Newton's method, the largest kept."""
    l = float(problem.latency(np.float64(B)))
    m = problem.lam * l
    q = m / (1.0 + m)
    best = 0.0
    for k in range(1, 5):
        t = complex(0.0, 2.0 * math.pi * k / max(B - m, 1e-9))
        for _ in range(200):
            z = cmath.exp(t)
            step = (B * t + cmath.log(1.0 - q * z) - math.log(1.0 - q) - 2j * math.pi * k) / (B - q * z / (1.0 - q * z))
            t -= step
            if abs(step) < 1e-15:
                break
        r = abs(cmath.exp(t))
        if r < 1.0 - 1e-12:
            best = max(best, r)
    return 1.0 / -math.log(best) if best > 0 else 1.0


@dataclass(frozen=True)
class ExponentialAnswer:
    """What :func:`solve_exponential` found: the model and PI answer of the verifying truncation S', the stored
    table (batch sizes, length S' + 2), R, the smaller truncation S it agreed with, and the table's metrics (Δ is
    |ĝ(S') − ĝ(S)|, as for the general rule on the tail boundary; no stationary law is formed, its field is empty)."""

    model: GeometricModel
    result: SolveResult
    evaluation: Evaluation
    table: np.ndarray
    converged_upto: int
    agreed_with: int
    candidates: int


def quadratic_start(problem: BatchingProblem, model: GeometricModel) -> np.ndarray:
    """PI's first policy: at each n the size b ≤ n of least n·L_b + C_b, the quadratic bias of eq. 20 under
    "serve B" with ĝ = 0 (:func:`~.limit.quadratic_choice`); waiting where no size fits.  At Bmax 1 024, ρ = 0.9 it halves the
    GMRES iterations of greedy's start (the same ten policies)."""
    L, C = onset_terms(problem, model.tail_action, 0.0)
    pol = np.zeros(model.s_max + 1, dtype=np.int64)
    for a in range(0, model.s_max + 1, 4096):
        n = np.arange(a, min(model.s_max + 1, a + 4096))
        pol[n] = quadratic_choice(n, L, C, problem.batch_sizes) + 1  # −1 (no size fits) → 0, waiting
    pol[-1] = model.tail
    return pol


def coarse_start(problem: BatchingProblem, model: GeometricModel, keep: set[int],
                 log=None) -> tuple[np.ndarray, tuple[float, np.ndarray] | None]:
    """PI's first policy and (ĝ, h) on ``model``, from the same truncation with fewer batch sizes: the first
    :data:`COARSE_DENSE` sizes, then about :data:`COARSE_SIZES` more evenly spaced, and ``keep`` (the tail action,
    the limiting sizes).  Its policy iteration stops once its loose evaluations have settled, and the full set's
    starts from that policy and values, so that the costly early steps, which move most states, run where each
    improvement and each operator product is several times cheaper.  At Bmax 1 024, ρ = 0.9 (185 sizes): 6 s
    for the first truncation instead of 14 s, the same table.  Small size sets (≤ 2·COARSE_SIZES) start from
    :func:`quadratic_start`."""
    sizes = list(problem.batch_sizes)
    if len(sizes) <= 2 * COARSE_SIZES:
        return quadratic_start(problem, model), None
    step = math.ceil((len(sizes) - COARSE_DENSE) / COARSE_SIZES)
    chosen = set(sizes[:COARSE_DENSE]) | set(sizes[COARSE_DENSE::step]) | (keep & set(sizes))
    coarse = problem.replace(batch_sizes=tuple(sorted(chosen)))
    cm = geometric_model(coarse, model.s_max, model.tail_action)

    def note(line: str) -> None:
        if log is not None:
            log(f"coarse ({len(chosen)} sizes) {line}")

    r = policy_iteration(cm, quadratic_start(coarse, cm), log=note, near=False, settle=True)
    return np.searchsorted(model.sizes, cm.sizes[r.policy]).astype(np.int64), (r.gain, r.values)


def _final_run(pol: np.ndarray) -> int:
    """R: where the final run of equal actions starts."""
    change = np.nonzero(pol[1:] != pol[:-1])[0]
    return int(change[-1]) + 1 if change.size else 0


def _extend(pol: np.ndarray, S: int, tail: int) -> np.ndarray:
    out = np.full(S + 1, tail, dtype=np.int64)
    n = min(pol.size, S + 1)
    out[:n] = pol[:n]
    out[-1] = tail
    return out


def _extend_values(problem: BatchingProblem, B: int, res: GeometricPI, S: int) -> tuple[float, np.ndarray]:
    """(ĝ, h) of ``res`` carried to the truncation S as the next solve's start: h on its states (the tail boundary
    prices each excursion, so h is nearly the longer truncation's there), then its quadratic growth under serve B
    (:func:`~.limit.quadratic_bias`; the geometric terms have died out).  At Bmax 1 024, ρ = 0.9: 3–6 GMRES
    iterations for the verifying solve instead of 85."""
    h = res.values[: S + 1]
    if S + 1 > h.size:
        S0 = h.size - 1
        alpha, beta = quadratic_bias(problem, B, res.gain)
        n = np.arange(S0 + 1, S + 1, dtype=np.float64)
        h = np.concatenate([h, h[-1] + alpha * (n * n - S0 * S0) + beta * (n - S0)])
    return res.gain, h


def _check(problem: BatchingProblem, S: int, why: str) -> None:
    A = len(problem.batch_sizes) + 1
    if S > EXP_STATE_LIMIT or S * A > EXP_WORK_LIMIT:
        raise InputError(
            f"no verified table is within reach for Bmax = {problem.bmax} with {A - 1} batch sizes, service "
            f"{problem.service.spec()} at ρ = {problem.rho:.3g}: {why} needs a truncation of {S} states × {A - 1} "
            f"batch sizes (limits {EXP_STATE_LIMIT} states, {EXP_WORK_LIMIT:.0e} states × sizes); use a smaller "
            "Bmax, fewer batch sizes (--batch-sizes) or a lower load")


def solve_exponential(problem: BatchingProblem, tol: float = 1e-3, log=None, progress=None) -> ExponentialAnswer:
    """The converged table of the module doc for an exponential-service problem (:func:`applies`); the pair must
    also agree on ĝ to ``tol`` (δ, cost per ms), as the general rule's.  ``log`` gets a line per policy iteration,
    ``progress`` (as :func:`~.solution.solve`'s) is called after each with the truncation and those solved."""
    if not applies(problem):
        raise InputError("the exponential rule solves one server with exponential batch times")
    t0 = time.perf_counter()
    limiting = limiting_actions(problem)
    B = max(limiting)
    margin = MARGIN_LENGTHS * math.ceil(transient_length(problem, B)) + 4 * problem.bmax
    onset = 0.0 if len(limiting) > 1 else limit_onset(problem, B)
    S = max(4 * problem.bmax, int(math.ceil(onset)) + 2 * margin)  # the onset is a lower bound on R (g = 0)
    _check(problem, S, f"the optimal batch reaches its limit {B} only near n ≈ {onset:.0f}, and a converged table")
    # one BLAS thread (GMRES's products with its basis: a second one only spins on 2 cores), set here, on the calling
    # thread, for the pool's thread too (threads.py); a stale speculation is left to finish, not waited for
    pool = ThreadPoolExecutor(max_workers=1, thread_name_prefix="smdp-stationary")
    try:
        with single_blas():
            return _solve(problem, tol, log, progress, t0, limiting, B, margin, S, pool)
    finally:
        pool.shutdown(wait=False, cancel_futures=True)


def _solve(problem: BatchingProblem, tol: float, log, progress, t0: float, limiting: set, B: int, margin: int, S: int,
           pool: ThreadPoolExecutor) -> ExponentialAnswer:
    """:func:`solve_exponential`'s loop over truncations.  While a verifying truncation's policy iteration runs,
    ``pool`` computes the adjoint part of the metrics (:func:`~.geometric_system.stationary`) of the table it
    will confirm — the shorter truncation's policy on 0..R, B beyond — on the second core.  When the two
    truncations agree (the usual end; where they do not, the loop and the speculation go on), the metrics need no
    adjoint solve of their own."""
    last: GeometricPI | None = None  # the previous truncation's answer: its policy and (ĝ, h) start the next solve
    tried = {B}
    small: tuple[int, GeometricPI] | None = None
    ahead: tuple[int, np.ndarray, Future] | None = None  # (S', the table S' would confirm, its stationary part)
    candidates = 0
    policies = 0  # policy iterations over every truncation (the coarse start's not counted: another problem)

    def speculate(S2: int, pol: np.ndarray, S1: int) -> None:
        """Start the stationary part of the table that S2 would confirm if ``pol`` (on truncation S1) is the
        answer there: its final run B and a margin past it, as the loop below requires."""
        nonlocal ahead
        R = _final_run(pol)
        if int(sizes[pol[R]]) != B or S1 - R < margin:
            return
        table = _extend(pol[: R + 1], S2, int(np.searchsorted(sizes, B)))
        if ahead is None or ahead[0] != S2 or not np.array_equal(ahead[1], table):
            if ahead is not None:
                ahead[2].cancel()  # a stale one not yet started (one that runs cannot be stopped, and is left)
            ahead = (S2, table, pool.submit(stationary, geometric_model(problem, S2, B), table))

    while True:
        model = geometric_model(problem, S, B)
        sizes = model.sizes
        if small is not None:  # S verifies small's table: its metrics' adjoint can start now (if not yet begun)
            speculate(S, small[1].policy, small[0])

        def note(line: str, S: int = S, done: int = candidates) -> None:
            if log is not None:
                log(line)
            if progress is not None:
                progress("exponential rule", S, done)

        # a solve that may be verified next: its likely answers' metrics can start on the second core
        likely = None if small is not None else (lambda pol, S=S: speculate(S + margin, pol, S))
        if last is None:
            start, guess = coarse_start(problem, model, limiting | {B}, note)
            res = policy_iteration(model, start, log=note, near=False, guess=guess, likely=likely)
        else:
            res = policy_iteration(model, _extend(last.policy, S, model.tail), log=note,
                                   guess=_extend_values(problem, B, last, S), likely=likely)
        last = res
        candidates += 1
        policies += res.iterations
        if not res.converged:
            raise InputError(f"policy iteration did not converge on the truncation s_max = {S}")
        R = _final_run(res.policy)
        b = int(model.sizes[res.policy[R]])
        if b not in limiting:
            small = None
            S = R + margin + S // 2
            _check(problem, S, f"the table still grows at n = {R} (it serves {b} there) and its limit")
            continue
        if b != B and b not in tried:  # tied limiting sizes: the table settled on another, now the boundary's B
            B, small = b, None
            tried.add(b)
            continue
        if b != B:  # it settled back on a size already tried: a longer truncation decides
            small = None
            S += margin
            _check(problem, S, "the tied limiting sizes' table")
            continue
        if S - R < margin:
            small = None
            S = R + 2 * margin
            _check(problem, S, f"the final run starts at n = {R}, and its margin")
            continue
        if small is not None:
            S0, r0 = small
            R0 = _final_run(r0.policy)
            if R0 == R and np.array_equal(r0.policy[: R + 1], res.policy[: R + 1]) and abs(res.gain - r0.gain) < tol:
                agreed, moved = S0, abs(res.gain - r0.gain)
                break
        small = (S, res)
        S = S + margin
        _check(problem, S, "the verifying truncation")
    table_idx = _extend(res.policy[: R + 1], S, model.tail)
    known = ahead[2].result if ahead is not None and ahead[0] == S else None  # metrics check it is this table
    ev = metrics(model, table_idx, res.gain, delta=False, known=known)  # Δ is the pair's
    sizes = model.sizes
    policy = np.append(sizes[res.policy], B)  # S_o repeats s_max (the tail boundary's copy)
    table = np.append(sizes[table_idx], B)
    values = np.append(res.values, res.values[-1])
    result = SolveResult(policy, res.gain, (res.gain, res.gain), values, policies, 0.0, True, "pi",
                         time.perf_counter() - t0)
    g = res.gain  # the table equals π on 0..R and serves B = π(R) beyond: the same policy, the same ĝ
    evaluation = Evaluation(avg_cost=g, delta=moved, mean_latency_ms=ev["mean_latency_ms"],
                            mean_power_w=ev["mean_power_w"], throughput=ev["throughput"],
                            mean_batch_size=ev["mean_batch_size"], overflow_probability=ev["overflow_probability"],
                            stationary=np.empty(0), s_max=S)
    return ExponentialAnswer(model, result, evaluation, table, R, agreed, candidates)
