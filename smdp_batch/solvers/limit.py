"""The infinite queue's long-queue action: which batch size a converged table ends in, where that run starts,
and whether a verified table is within reach before any truncation is solved (paper 004 eqs. 4–6, 11, 20).

**The bias at long queues.**  Under "serve B at every long queue" (λ·l(B) < B) the relative values of eq. 20
are h(n) = αn² + βn + γ plus terms in the roots of zᴮ = K_B(z) inside the unit circle, which die out
geometrically in n (:mod:`~smdp_batch.model.truncation`, the tail boundary).  With eq. 11's cost
c(n, b) = c0_b + c1_b·n (c0_b = w2·ζ(b) + w1·E G_b²/2, c1_b = w1·l(b)/λ), the drain d_b = b − λl(b) and
M2_b = E(K_b − b)² = Var K_b + d_b² (Var K_b = λl(b) + λ²Var G_b, eqs. 4–6), matching powers of n gives

    α = c1_B/(2d_B),    β = (c0_B + α·M2_B − g·l(B))/d_B,

and eq. 20's bracket for b against B at queue length n is, up to the geometric terms,

    Q(n, b) − Q(n, B) = n·L_b + C_b,
    L_b = c1_b − c1_B − 2α(d_b − d_B) = w1·l(b)·l(B)/(λ·d_B) · (B/l(B) − b/l(b))  ≥ 0,
    C_b = c0_b − c0_B − g·(l(b) − l(B)) + α(M2_b − M2_B) − β(d_b − d_B).

So B beats b for every n > −C_b/L_b, and the run of B starts just past the **onset**
n* = max_b −C_b/L_b (:func:`limit_onset`).  Checked (``tests/test_limit_action.py``) against the converged
tables of det, exp, Erlang-4, hyperexp and gamma:0.5 service at ρ 0.5 and 0.9, Bmax 32–128: R = ⌊n*⌋ + 1
(or Bmax) to within one state (the geometric terms, excited where the action last changes), with the table's ĝ.  The g-term of C_b is g·l(b)·l(B)·(b/l(b) − B/l(B))/d_B ≤ 0, so n* grows with g
and n*(g = 0) is a lower bound on R known before any solve (:func:`check_reach`).  It grows like
cv²·(λl(B))²: exponential service at ρ = 0.9 gives R = 112, 474, 2 017 for Bmax = 32, 64, 128 and
n*(0) ≈ 1.5·10⁵ for Bmax = 1 024.

**Ties** (L_b = 0: b/l(b) = B/l(B), e.g. l(b) ∝ b).  Every tied size drains the queue at the same rate, so
the constants C_b decide and the table settles on one of them — any of the tied set, not necessarily the
largest.  :func:`retarget` moves the tail boundary to the size the table settles on, which makes each
truncation an exact model of "the table, then serve that size" (sizes within 1e-9 relative throughput
count as tied, as in :func:`limiting_sizes`).

**Reach.**  A converged table needs a truncation S ≥ 4R (the pair S/2, S with A ≥ 2R; R ≥ n*(0)), and the
probable-range table needs S ≥ 2n_p, where the queue exceeds n_p with probability :data:`PROBABLE_MASS`.
:func:`probable_range` estimates n_p from the same bias: the policy n ↦ argmin_b n·L_b + C_b and, for each size,
the diffusion decay rate 2d_b/Var K_b of the queue tail.  :func:`check_reach` refuses, before any work, a
problem for which both truncations exceed the state or work limit (n_p > :data:`PROBABLE_SLACK` × the longest
truncation within them).
"""

from __future__ import annotations

import math

import numpy as np

from ..errors import InputError
from ..limits import WORK_LIMIT, predicted_queue
from ..model.problem import BatchingProblem

__all__ = ["PROBABLE_MASS", "Reach", "check_reach", "estimated_width", "limit_onset", "limiting_sizes", "quadratic_choice",
           "onset_terms", "probable_range", "quadratic_bias", "reach", "retarget", "truncation_work"]

#: The probable-range table is accepted when the queue exceeds its verified range with probability below this
#: (at decision epochs, under the table's policy); :mod:`.search` uses it.
PROBABLE_MASS = 1e-12
#: :func:`check_reach` lets the probable-range search run while its range estimate n_p ≤ this × the longest
#: truncation within the limits (it needs S ≥ 2n_p; the estimate was 0.5–1.1× the verified ranges).
PROBABLE_SLACK = 0.6
#: Relative throughput gap below which two batch sizes count as tied (greatest-throughput set).
TIE_RTOL = 1e-9


def limiting_sizes(batch_sizes, latency_ms) -> set[int]:
    """Batch sizes of greatest throughput b/l(b) (to :data:`TIE_RTOL` relative), from the sizes and their l(b)
    in ms (as a table file stores them): the candidates for the infinite queue's long-queue action."""
    sizes = np.asarray(batch_sizes, dtype=np.int64)
    rate = sizes / np.asarray(latency_ms, dtype=np.float64)
    return {int(b) for b in sizes[rate >= rate.max() * (1 - TIE_RTOL)]}


class _Stats:
    """Per batch size of one problem (computed once): l, d = b − λl, Var K (eqs. 4–6), c0 and c1 of eq. 11."""

    def __init__(self, problem: BatchingProblem):
        lam, w1, w2 = problem.single().lam, problem.w1, problem.w2
        self.sizes = np.asarray(problem.batch_sizes, dtype=np.int64)
        self.l = l = problem.latency_ms()
        m2 = problem.second_moments()
        var_g = np.maximum(m2 - l * l, 0.0)
        self.var = lam * l + lam * lam * var_g
        self.d = self.sizes - lam * l
        self.c0 = w2 * problem.energy_mj() + 0.5 * w1 * m2
        self.c1 = w1 * l / lam
        # support of p^[b] above 1e-18: 18 σ_K + 20 for Poisson-like counts; a batch time with an exponential tail of
        # mean ~Var G/l (exp, gamma, hyperexp) gives a geometric tail of ratio ≈ 1 − l/(λ·Var G): ln(1e18) ≈ 41.4 means
        self.light = 18.0 * np.sqrt(self.var) + 20.0
        self.rows = np.maximum(self.light, 41.4 * lam * var_g / l)

    def width(self, s: int, rows: np.ndarray | None = None) -> float:
        """:func:`estimated_width` at s_max = s (``rows``: per-size widths, default the light-tail estimate)."""
        usable = max(1, int(np.searchsorted(self.sizes, s, side="right")))
        w = self.light if rows is None else rows
        return float(np.mean(np.minimum(w[:usable], s + 1.0))) + 1.0

    def work(self, s: int, rows: np.ndarray | None = None) -> float:
        """:func:`truncation_work` at s_max = s."""
        return (int(np.searchsorted(self.sizes, s, side="right")) + 1) * (s + 2) * self.width(s, rows)


def quadratic_bias(problem: BatchingProblem, B: int, g: float, stats: _Stats | None = None) -> tuple[float, float]:
    """(α, β) of the bias h(n) = αn² + βn + γ + (geometric terms) under "serve B" at long queues (module doc;
    costs of eq. 11, ``g`` the average cost per ms)."""
    st = stats or _Stats(problem)
    i = list(problem.batch_sizes).index(int(B))
    d = float(st.d[i])
    if not d > 0:
        raise InputError(f"the batch size B = {B} does not drain the queue (λ·l(B) ≥ B)")
    alpha = float(st.c1[i]) / (2.0 * d)
    return alpha, (float(st.c0[i]) + alpha * float(st.var[i] + d * d) - g * float(st.l[i])) / d


def onset_terms(problem: BatchingProblem, B: int, g: float, stats: _Stats | None = None) -> tuple[np.ndarray, np.ndarray]:
    """(L, C) per batch size of ``problem``: Q(n, b) − Q(n, B) = n·L_b + C_b from the quadratic bias of eq. 20
    under "serve B" (module doc; costs of eq. 11, ``g`` the average cost per ms)."""
    st = stats or _Stats(problem)
    l, d, var, c0, c1 = st.l, st.d, st.var, st.c0, st.c1
    i = list(problem.batch_sizes).index(int(B))
    alpha, beta = quadratic_bias(problem, B, g, st)
    M2 = var + d * d
    L = c1 - c1[i] - 2.0 * alpha * (d - d[i])
    C = c0 - c0[i] - g * (l - l[i]) + alpha * (M2 - M2[i]) - beta * (d - d[i])
    return L, C


def limit_onset(problem: BatchingProblem, B: int, g: float = 0.0, stats: _Stats | None = None) -> float:
    """n*: the longest queue at which some batch size still beats B by the quadratic bias (module doc); the
    run of B starts at ⌊n*⌋ + 1 (or at B).  Sizes tied with B are left out (0 when none beats B).  With
    g = 0 a lower bound on the onset under the optimal ĝ > 0."""
    st = stats or _Stats(problem)
    L, C = onset_terms(problem, B, g, st)
    ties = limiting_sizes(st.sizes, st.l)
    free = np.array([int(b) not in ties for b in st.sizes]) & (L > 0) & (C < 0)
    return float((-C[free] / L[free]).max()) if free.any() else 0.0


def quadratic_choice(n: np.ndarray, L: np.ndarray, C: np.ndarray, sizes) -> np.ndarray:
    """Per queue length in ``n``, the index of the size b ≤ n of least n·L_b + C_b (the quadratic bias's choice,
    :func:`onset_terms`), or −1 where no size is feasible."""
    v = n[:, None] * L[None, :] + C[None, :]
    v[np.asarray(sizes)[None, :] > n[:, None]] = np.inf
    return np.where(np.isfinite(v).any(axis=1), np.argmin(v, axis=1), -1)


def probable_range(problem: BatchingProblem, cap: float = math.inf, stats: _Stats | None = None) -> float:
    """An estimate of the queue length n_p the queue exceeds with probability PROBABLE_MASS (at decision epochs),
    before any solve: P(N > n) ≈ exp(−Σ_{m ≤ n} θ(π(m))), with π(m) the size that minimises m·L_b + C_b (the
    quadratic bias of eq. 20 with g = 0, feasible sizes b ≤ n) and θ_b = 2d_b/Var K_b its diffusion decay rate
    (module doc); summed on a grid of step ⌈Bmax/32⌉, inf beyond ``cap``.  Against the verified ranges R of the
    probable-range tables of deterministic service (Bmax/ρ 1024/0.5, 1024/0.9, 2048/0.95, 4096/0.9; R is where a
    pair agreed, an upper bound on the range): 33/225/449/257 against 63/218/449/232."""
    st = stats or _Stats(problem)
    L, C = onset_terms(problem, max(limiting_sizes(st.sizes, st.l)), 0.0, st)
    theta = np.where(st.d > 0, 2.0 * st.d / st.var, 0.0)
    target, total = math.log(1.0 / PROBABLE_MASS), 0.0
    h = max(1, -(-problem.bmax // 32))
    n0 = 1
    while n0 <= cap:
        n = np.arange(n0, n0 + 256 * h, h, dtype=np.float64)
        b = quadratic_choice(n, L, C, st.sizes)
        step = np.where(b >= 0, theta[b] * h, 0.0)
        run = total + np.cumsum(step)
        hit = np.nonzero(run >= target)[0]
        if hit.size:
            return float(n[hit[0]])
        total = float(run[-1])
        n0 += 256 * h
    return math.inf


def estimated_width(problem: BatchingProblem, s: int) -> float:
    """Mean support width of the arrival-count laws of the batch sizes ≤ s before any is built: 18
    standard deviations of K (Var K = λl + λ²Var G, eqs. 4–6) + 20, at most s + 1 — an upper estimate
    for light tails."""
    return _Stats(problem).width(s)


def truncation_work(problem: BatchingProblem, s: int) -> float:
    """Operations of one improvement sweep at s_max = s (actions × states × support), as the search's
    work check counts them before the arrival table exists."""
    return _Stats(problem).work(s)


class Reach:
    """What a verified table of ``problem`` needs (:func:`reach`), in states: ``onset`` (n*(g), with g = 0 a lower
    bound on where the limit action's run starts), ``need`` (the pair size S of a converged table) with its work
    ``need_work`` and row width ``width``, ``floor`` (the probable range's estimate, computed only when the
    converged table is out of reach; else nan) and ``fit`` (the longest truncation either search may solve within
    the limits).  Row widths count the geometric tails of exp/gamma/hyperexp batch times (``_Stats.rows``)."""

    def __init__(self, problem: BatchingProblem, max_smax: int, start_probable: int, g: float = 0.0):
        st = _Stats(problem)
        tied = limiting_sizes(st.sizes, st.l)
        self.B = B = max(tied)
        self.onset = 0.0 if len(tied) > 1 else limit_onset(problem, B, g, st)  # ties: found by the search
        s0 = 4 * problem.bmax
        self.need = s0
        while self.need < 4 * self.onset or self.need < 2 * (self.onset + problem.bmax):
            self.need *= 2
        self.need_work = st.work(self.need, st.rows)
        self.width = st.width(self.need, st.rows)
        sizes = [s0 << k for k in range(40) if s0 << k <= max_smax]
        sizes += [start_probable << k for k in range(40) if start_probable << k <= min(2 * problem.bmax, max_smax)]
        self.fit = max([s for s in sizes if st.work(s, st.rows) <= WORK_LIMIT], default=0)
        self.converged_ok = self.need <= max_smax and self.need_work <= WORK_LIMIT
        self.floor = math.nan if self.converged_ok else probable_range(problem, 4.0 * max_smax, st)
        self.probable_ok = self.converged_ok or self.floor <= PROBABLE_SLACK * self.fit


def reach(problem: BatchingProblem, max_smax: int, start_probable: int = 64, g: float = 0.0) -> Reach:
    """:class:`Reach` of ``problem`` for truncations up to ``max_smax`` (formulas only, no solve); ``g`` the
    average cost per ms the onset is computed with (0: its lower bound)."""
    return Reach(problem, max_smax, start_probable, g)


def cost_guess(problem: BatchingProblem) -> float:
    """A rough average cost per ms, w1·(l(Bmax) + E N/λ) + w2·max ζ(b)/l(b) with E N the full-batch queue of
    :func:`~smdp_batch.limits.predicted_queue`: the g of :func:`_suggestion` (the onset grows with g, module doc;
    with g = 0 it suggested sizes that do not converge, e.g. hyperexp Bmax 128 at ρ = 0.974)."""
    l = problem.latency_ms()
    w = float(l[-1]) + predicted_queue(problem) / problem.lam
    return problem.w1 * w + problem.w2 * float(np.max(problem.energy_mj() / l))


def check_reach(problem: BatchingProblem, max_smax: int, start_probable: int = 64) -> Reach:
    """Refuse before any work a problem whose converged table and probable-range table are both out of reach
    (module doc); otherwise its :class:`Reach`."""
    r = reach(problem, max_smax, start_probable)
    if r.converged_ok or r.probable_ok:
        return r
    states = max(4 * r.onset, 2 * (r.onset + problem.bmax))
    over = (f"≥ {states:.0f} states × {len(problem.batch_sizes)} batch sizes with arrival rows ~{r.width:.0f} states "
            f"wide ({r.need_work:.2g} operations per sweep, work limit {WORK_LIMIT:.2g})" if r.need <= max_smax else
            f"≥ {states:.0f} states (state limit {max_smax})" if states > max_smax else
            f"{r.need} states × {len(problem.batch_sizes)} batch sizes (work limit {WORK_LIMIT:.2g})")
    raise InputError(
        f"no verified table is within reach for Bmax = {problem.bmax} with {len(problem.batch_sizes)} batch sizes, "
        f"service {problem.service.spec()} at ρ = {problem.rho:.3g}: the optimal batch reaches its limit {r.B} only "
        f"near queue length n ≈ {r.onset:.0f} (the quadratic bias of eq. 20), so a converged table needs a truncation "
        f"of {over}, and the queue's probable range (P(N > n) ≥ {PROBABLE_MASS:g}) reaches "
        f"{'past n ≈ %.0f' % r.floor if math.isfinite(r.floor) else 'beyond n = %d' % (4 * max_smax)}, "
        f"beyond the longest truncation within the limits (s_max = {r.fit}); use "
        f"{_suggestion(problem, max_smax, start_probable)}")


def _suggestion(problem: BatchingProblem, max_smax: int, start_probable: int) -> str:
    """What would fit: the largest power-of-two Bmax below the current one at this λ (sizes ≤ it), if any."""
    sizes = list(problem.batch_sizes)
    b = 1 << (problem.bmax.bit_length() - 1)
    if b == problem.bmax:
        b //= 2
    while b >= max(sizes[0], 2):
        sub = [s for s in sizes if s <= b]
        try:
            p = problem.replace(batch_sizes=sub)
        except InputError:  # unstable at this λ: smaller Bmax is too
            break
        r = reach(p, max_smax, start_probable, cost_guess(p))
        if r.converged_ok or r.floor <= 0.5 * r.fit:  # no slack: a suggestion must fit
            return (f"e.g. Bmax = {b} at this λ (ρ = {p.rho:.3g}: batch sizes ≤ {b}), a lower load, or a lighter-tailed "
                    "service law (smaller CoV of the batch time)")
        b //= 2
    return "a lower load or a lighter-tailed service law (smaller CoV of the batch time)"


def retarget(cands, policy: np.ndarray, R: int) -> bool:
    """Move the tail boundary of ``cands`` (a :class:`~.search.Candidates`) to π(R) when the table settles on a
    tied greatest-throughput size other than its B (module doc, ties); False when there is nothing to move to
    (π(R) is B, is not tied with it, or was tried before)."""
    b = int(policy[R])
    if b == cands.tail or b in cands.tried or b not in limiting_sizes(cands.problem.batch_sizes,
                                                                      cands.problem.latency_ms()):
        return False
    cands.tried.add(int(cands.tail))
    cands.tail = b
    return True
