"""What the (queue length, phase) SMDP under MAP arrivals costs, estimated and bounded before any work.

Each refusal is one :class:`~smdp_batch.errors.InputError` line naming the estimate, the limit and what to
change.  Numbers measured on the 2-core development machine.

* **The Poisson limit** (:func:`poisson_gap`).  The arrival intensity is d_J(t) (d = D1·1, J the phase);
  g = Z(d − λ̄·1), Z = (1π − D)⁻¹, is how many arrivals more (or fewer) than λ̄·t the phase at time 0
  brings over the whole future (E_i N(t) − λ̄t = ((I − e^{Dt})g)_i, so |E_i N(t) − λ̄t| ≤ 2‖g‖∞ at every
  horizon), and the counts' asymptotic dispersion IDC(∞) = 1 + 2πD1g/λ̄ is within 2‖g‖∞ of Poisson's.
  For a two-phase MMPP g_i = (λ_i − λ̄)/(R12 + R21): fast switching (R ≫ |λ_i − λ̄|) makes it small, and
  ‖g‖∞ = 0 exactly when every phase has the same rate (the process *is* Poisson).  When ‖g‖∞ ≤
  :data:`FAST_EPS` requests, :func:`~smdp_batch.solvers.map_solution.solve_map` solves the Poisson problem at
  λ̄ and says so (measured against the exact MAP solve, det and exp service, ‖g‖∞ from 5·10⁻⁵ to 0.6: the
  gain differs by at most 0.013·‖g‖∞ relative and the tables agree from ‖g‖∞ ≤ 5·10⁻³ on).
* **The blocks** A_k^[b] (:mod:`.map_truncation`).  A batch time that is a mixture of Erlang laws (exp,
  hyperexp, erlang:k, gamma with an integer shape ≤ :data:`RESOLVENT_STAGES`) takes the resolvent route,
  E[e^{X·D(z)}] = Σ_c p_c (I − θ_c D(z))^{−k_c}, O(k·kmax·m³) whatever the rates.  Any other law is
  uniformized at q = max_i(−D0)_ii: per batch size its mixed-Poisson weights w_n at rate q, n up to where
  their tail is below :data:`WEIGHT_TAIL` (at most :data:`EVENTS_LIMIT` events per batch,
  :data:`EVENTS_TOTAL_LIMIT` terms over the batch sizes, the longest batch computed first so the total is
  known before the others), and one recursion U_{n+1,k} = U_{n,k}P0 + U_{n,k−1}P1 shared by the batch
  sizes, on the band of k where U_n has mass (:func:`band_edges`: outside it, by the binomial Chernoff
  bounds — each event is an arrival with probability d_i/q — and the Perron bounds
  P(K_n ≷ k) ≤ (max v/min v)·ρ(P0 + e^{±θ}P1)ⁿ·e^{∓θk}, the mass is below e^{−LOG_TINY}).  The work
  (:meth:`BlockPlan.work`) is thus known before the loop and refused above :data:`BLOCK_WORK_LIMIT`, the
  arrays above :data:`MAP_MEMORY`.
* **The truncation** (:func:`check_truncation_work`): (s_max + 2)·m states at most :data:`MAP_STATE_LIMIT`;
  a policy evaluation's sparse LU costs about (s_max + 2)·m·(w·m)² with w the band of levels one batch
  spans (Bmax below, the count support above, both ≤ s_max), bounded by :data:`LU_WORK_LIMIT`; its memory
  per matrix entry (:func:`matrix_entries`) by :func:`lu_budget` (SuperLU's address-space reservation under
  an RLIMIT_AS, its real fill otherwise); all the evaluations of one solve by :data:`SEARCH_WORK_LIMIT` (PI's iterations are
  capped to fit).  Before a search, :func:`predicted_levels` (a phase above the capacity for long) and
  the heavy-tail estimate of :func:`~smdp_batch.limits.check_tail` refuse a tail beyond the state limit.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Any

import numpy as np

from ..errors import InputError
from ..limits import MEMORY_BUDGET, gib

__all__ = ["FAST_EPS", "LOG_TINY", "WEIGHT_TAIL", "RESOLVENT_STAGES", "EVENTS_LIMIT", "EVENTS_TOTAL_LIMIT",
           "BLOCK_WORK_LIMIT", "MAP_STATE_LIMIT", "LU_WORK_LIMIT", "SEARCH_WORK_LIMIT", "MAP_MEMORY", "LU_MEMORY",
           "lu_budget", "BlockPlan", "poisson_gap", "band_edges", "erlang_mixture", "plan_blocks", "matrix_entries",
           "check_truncation_work", "truncation_work", "predicted_levels"]

#: Largest ‖g‖∞ (requests) at which the MAP is solved as Poisson at its mean rate (module doc).
FAST_EPS = 1e-3
#: Band edges of the count recursion: binomial tails below e^{−LOG_TINY} are not computed.
LOG_TINY = 80.0
#: Weight mass left beyond the last uniformized event count kept (counted as overflow: below the blocks'
#: 1e-18 support cut, so a block table whose counts end inside it serves every truncation).
WEIGHT_TAIL = 1e-20
#: Most exponential stages of an Erlang mixture computed by the resolvent route (gamma:100 has 100).
RESOLVENT_STAGES = 256
#: Most uniformized events per batch (mixed-Poisson weights at rate q), and over all batch sizes (terms of a
#: quadrature law count :func:`law_cost` times).
EVENTS_LIMIT = 1 << 21
EVENTS_TOTAL_LIMIT = 1 << 23
#: Counts the dominating Poisson support is searched to (twice the most levels a truncation has).
SUPPORT_CAP = 1 << 15
#: Most multiply-adds of the block recursion (0.7–1.4·10⁹ per s measured on the 2-core development machine).
BLOCK_WORK_LIMIT = 6e9
#: Most states (levels × phases) of one truncation: the sparse LU of the evaluation fills in far beyond
#: the band (measured: 3 GB and 60 s for a search reaching 16 384 states, m = 2).
MAP_STATE_LIMIT = 8_200
#: Most multiply-adds of one policy evaluation (its LU, module doc; 1–2.6·10¹⁰ per s measured for the large
#: ones on the 2-core development machine, 3·10⁹ for narrow bands); PI runs 3–12 of them per truncation.
LU_WORK_LIMIT = 5e10
#: Most multiply-adds of all the policy evaluations of one solve (≈ 15–30 s; PI's iterations are capped to fit).
SEARCH_WORK_LIMIT = 3e11
#: Bytes the block arrays may take (the blocks, their tails, the weights, the recursion's rows).
MAP_MEMORY = min(MEMORY_BUDGET, 640 << 20)
#: A sparse LU's memory per entry of the matrix: SuperLU *reserves* ≈ 730 bytes of address space per entry
#: whatever the fill (measured: 2.9 GB for 4·10⁶ entries) and *uses* ≈ 40 (its L and U hold 1–3 entries
#: per matrix entry).  Under an address-space limit (RLIMIT_AS) the reservation counts against 3/4 of what
#: the limit leaves (at most 2 GiB; one LU is alive at a time); without one, the use against MEMORY_BUDGET.
LU_BYTES_RESERVED, LU_BYTES_USED = 760.0, 40.0
LU_MEMORY = min(MEMORY_BUDGET, 1 << 31)


def lu_budget() -> tuple[float, float]:
    """(bytes per matrix entry, bytes allowed) for one sparse LU in this process (see LU_BYTES_RESERVED)."""
    import resource

    try:
        limit = resource.getrlimit(resource.RLIMIT_AS)[0]
    except (OSError, ValueError):  # pragma: no cover - non-POSIX
        limit = resource.RLIM_INFINITY
    if limit == resource.RLIM_INFINITY or limit < 0:
        return LU_BYTES_USED, float(MEMORY_BUDGET)
    used = 1 << 30
    try:
        with open("/proc/self/status") as fh:
            used = next(int(x.split()[1]) * 1024 for x in fh if x.startswith("VmSize:"))
    except (OSError, StopIteration, ValueError, IndexError):  # pragma: no cover - not Linux
        pass
    return LU_BYTES_RESERVED, max(0.0, min(float(LU_MEMORY), 0.75 * (limit - used)))


def poisson_gap(arrivals) -> float:
    """‖Z(d − λ̄·1)‖∞: the most arrivals the phase adds to or removes from the mean forecast (module doc);
    0 for a Poisson process and for any MAP whose phases all have the same arrival rate."""
    m = arrivals.phases
    if m == 1:
        return 0.0
    D = arrivals.D0 + arrivals.D1
    d = arrivals.phase_rates
    A = np.outer(np.ones(m), arrivals.stationary) - D
    g = np.linalg.solve(A, d - arrivals.rate)
    return float(np.max(np.abs(g))) if np.all(np.isfinite(g)) else math.inf


#: Tilts θ of the Perron bound on the count's tails (a grid: any θ gives a valid bound; the band is the best).
_TILTS = np.geomspace(1e-4, 30.0, 48)


def _perron(M: np.ndarray) -> tuple[float, float]:
    """(log ρ, log(max v / min v)) of a non-negative irreducible M with Perron root ρ and vector v > 0."""
    w, V = np.linalg.eig(M)
    i = int(np.argmax(w.real))
    v = np.abs(V[:, i].real)
    if not (w[i].real > 0 and np.all(v > 0) and np.all(np.isfinite(v))):
        return math.inf, math.inf
    return math.log(float(w[i].real)), math.log(float(v.max() / v.min()))


def band_edges(N: int, P0: np.ndarray, P1: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """(lo, hi) for n = 0..N: the counts k after n uniformized events outside which U_{n,k} has mass below
    e^{−LOG_TINY} (module doc): the tighter of the binomial bounds and the Perron bounds
    P(K_n ≷ k) ≤ (max v/min v)·ρ(P0 + e^{±θ}P1)ⁿ·e^{∓θk} over a grid of θ > 0.  Both are non-decreasing in n."""
    L = LOG_TINY
    n = np.arange(N + 1, dtype=np.float64)
    d = P1.sum(axis=1)
    p_lo, p_hi = float(d.min()), float(min(d.max(), 1.0))
    mu = n * p_hi
    hi = np.minimum(np.ceil(mu + L / 3.0 + np.sqrt(L * L / 9.0 + 2.0 * L * mu)), n)
    mu = n * p_lo
    lo = np.maximum(np.floor(mu - np.sqrt(2.0 * L * mu)), 0.0)
    if P0.shape[0] > 1:
        for t in _TILTS:
            lr, lc = _perron(P0 + math.exp(t) * P1)
            if math.isfinite(lr + lc):
                np.minimum(hi, np.ceil((L + lc + n * lr) / t), out=hi)
            lr, lc = _perron(P0 + math.exp(-t) * P1)
            if math.isfinite(lr + lc):
                np.maximum(lo, np.floor((-L - lc - n * lr) / t), out=lo)
    return lo.astype(np.int64), np.maximum(hi, 0.0).astype(np.int64)


@dataclass(frozen=True)
class BlockPlan:
    """The uniformization of one (problem, MAP): weights w_n^[b] on n ∈ [wlo_b, whi_b] (flat, from offsets)."""

    q: float
    P0: np.ndarray
    P1: np.ndarray
    lo: np.ndarray  # band_edges for n = 0..events
    hi: np.ndarray
    weights: np.ndarray
    offsets: np.ndarray
    wlo: np.ndarray
    whi: np.ndarray
    tails: np.ndarray  # weight mass outside [wlo_b, whi_b] (< 2·WEIGHT_TAIL)
    what: str  # the inputs, for messages
    dominated: int  # counts beyond which Poisson(λ_max·X) — which dominates the MAP's count — has mass < 1e-30
    resolvent: tuple | None = None  # (probs (C,), means θ (B, C), stages (C,)): the Erlang-mixture route

    @property
    def diagonal(self) -> bool:
        return bool(np.all(self.P1 == np.diag(np.diag(self.P1))))

    @property
    def events(self) -> int:
        return int(self.whi.max()) if self.whi.size else 0

    @property
    def support(self) -> int:
        """Counts beyond which every block has mass below 1e-30 (the band's top after the most events, or the
        dominating Poisson count's)."""
        if self.resolvent is not None:
            return self.dominated
        return min(int(self.hi[-1]), self.dominated)

    def work(self, kmax: int) -> float:
        """Multiply-adds of the recursion and the accumulations for counts 0..kmax (module doc)."""
        m = self.P0.shape[0]
        if self.resolvent is not None:
            probs, theta, stages = self.resolvent
            return float(theta.shape[0]) * float(np.sum(stages)) * (kmax + 2) * 3.0 * m ** 3
        N = self.events
        band = np.maximum(np.minimum(self.hi, kmax) - self.lo + 1.0, 0.0)
        cum = np.concatenate([[0.0], np.cumsum(band)])
        rec = float(cum[-1]) * m * m * (m + (1 if self.diagonal else m)) + N * m ** 3
        acc = float(np.sum(cum[self.whi + 1] - cum[self.wlo])) * m * m
        return rec + acc + float(np.sum(self.whi - self.wlo + 1)) * m * m

    def nbytes(self, kmax: int) -> float:
        """The blocks (pmf, tails, the tails' running sum) and the recursion's rows, float64."""
        m = self.P0.shape[0]
        B = self.wlo.size
        return 8.0 * (3 * B + 1) * (kmax + 1) * m * m + 8.0 * (self.weights.size + 2 * self.lo.size)

    def check(self, kmax: int) -> None:
        """Refuse the blocks for counts 0..kmax before allocating them when over :data:`BLOCK_WORK_LIMIT` or
        :data:`MAP_MEMORY`."""
        nbytes = self.nbytes(kmax)
        if nbytes > MAP_MEMORY:
            raise InputError(
                f"{self.what}: the MAP arrival blocks for counts up to {kmax} would need about {gib(nbytes)}, over the "
                f"{gib(MAP_MEMORY)} limit; use fewer batch sizes or phases, or a lower load")
        work = self.work(kmax)
        if work > BLOCK_WORK_LIMIT:
            how = (f"{int(np.sum(self.resolvent[2]))} exponential stages per batch time" if self.resolvent is not None
                   else f"uniformization at q = {self.q:.4g} /ms: up to {self.events} events per batch")
            raise InputError(
                f"{self.what}: the MAP arrival blocks would take about {work:.2g} operations ({how}, counts up to "
                f"{min(kmax, self.support)}), "
                f"over the limit {BLOCK_WORK_LIMIT:.2g}; use slower phase switching, fewer phases or batch sizes, or a "
                f"lighter-tailed service law")


def law_cost(law) -> int:
    """Relative cost of one mixed-Poisson term of the law: 1 for the closed forms, 8 for quadrature laws."""
    from .laws import _LogPmfLaw

    return 1 if isinstance(law, _LogPmfLaw) else 8


def _weights(law, x: float, b: int, what: str, n: int, cap: int) -> tuple[np.ndarray, float]:
    """Mixed-Poisson weights w_n at mean count x, from n terms doubling up to ``cap``, until their tail is below
    WEIGHT_TAIL (and that tail)."""
    while True:
        n = min(max(n, 64), cap)
        pmf, sf = law.arrival(x, n, b)
        if sf[-1] < WEIGHT_TAIL:
            return np.asarray(pmf, dtype=np.float64), float(max(sf[-1], 0.0))
        if n >= cap:
            raise InputError(
                f"{what}: a batch of {b} sees more than {cap} uniformized MAP events with probability {sf[-1]:.2g} "
                f"({x:.4g} events on average; limit {cap}); use a lighter-tailed service law, slower phase switching "
                f"or lower rates")
        n *= 2


def erlang_mixture(law) -> tuple[np.ndarray, np.ndarray, np.ndarray] | None:
    """(probs, relative stage means, stages) when the batch time is a mixture of Erlang laws with at most
    :data:`RESOLVENT_STAGES` stages — exp, hyperexp, erlang:k, gamma with an integer shape — else None."""
    from .laws import Exponential, Gamma, HyperExponential

    if type(law) is Exponential:
        return np.ones(1), np.ones(1), np.ones(1, dtype=np.int64)
    if type(law) is HyperExponential:
        c = len(law.probs)
        return np.array(law.probs), np.array(law.scales), np.ones(c, dtype=np.int64)
    if isinstance(law, Gamma) and float(law.shape).is_integer() and 1 <= law.shape <= RESOLVENT_STAGES:
        k = int(law.shape)
        return np.ones(1), np.full(1, 1.0 / k), np.full(1, k, dtype=np.int64)
    return None


def _dominated(law, mean: float, b: int) -> int:
    """The count beyond which the law's mixed-Poisson count at ``mean`` has mass below 1e-30, or
    :data:`SUPPORT_CAP` (truncations never need counts beyond 2·MAP_STATE_LIMIT)."""
    n = max(64, int(mean + 16.0 * math.sqrt(mean + 1.0) + 64))
    while True:
        n = min(n, SUPPORT_CAP)
        pmf, sf = law.arrival(mean, n, b)
        hit = np.nonzero(sf < 1e-30)[0]
        if hit.size:
            return int(hit[0])
        if n >= SUPPORT_CAP:
            return SUPPORT_CAP
        n *= 2


def plan_blocks(problem, arrivals) -> BlockPlan:
    """How the blocks of every batch size are computed: the Erlang-mixture resolvent (:func:`erlang_mixture`)
    when the law is one, else the uniformization weights, refused before they are computed when the mean
    event counts q·l(b) exceed :data:`EVENTS_LIMIT` (per batch) or :data:`EVENTS_TOTAL_LIMIT` (in all)."""
    q = arrivals.uniformization()
    m = arrivals.phases
    what = f"arrivals {arrivals.spec()} with service {problem.service.spec()}"
    l = problem.latency_ms()
    law = problem.service
    b_long = int(np.argmax(l))
    dominated = _dominated(law, float(arrivals.phase_rates.max() * l[b_long]), int(problem.batch_sizes[b_long]))
    P0 = np.eye(m) + arrivals.D0 / q
    P1 = arrivals.D1 / q
    P0[P0 < 0] = 0.0  # round-off on the diagonal
    mix = erlang_mixture(law)
    if mix is not None:
        probs, rel, stages = mix
        empty = np.zeros(0, dtype=np.int64)
        return BlockPlan(q, P0, P1, empty, empty, np.zeros(0), empty, empty, empty, np.zeros(0), what, dominated,
                         (probs, l[:, None] * rel[None, :], stages))
    mean = q * l
    if not (mean.max() <= EVENTS_LIMIT and mean.sum() <= EVENTS_TOTAL_LIMIT):
        raise InputError(
            f"{what}: uniformization at q = {q:.4g} /ms (the fastest phase's event rate) gives {mean.max():.3g} events "
            f"per batch of {problem.bmax} ({mean.sum():.3g} over the batch sizes), over the limit {EVENTS_LIMIT} "
            f"({EVENTS_TOTAL_LIMIT}); use slower phase switching or lower rates (the Poisson limit is used when the "
            f"phase moves the arrival forecast by at most {FAST_EPS:g} requests; here {poisson_gap(arrivals):.3g})")
    # the longest batch first: its event count bounds the others' (∝ l(b)), so the total is known before them
    cost = law_cost(law)
    cap = EVENTS_LIMIT // cost
    order = np.argsort(-l, kind="stable")
    B = len(l)
    ws: list[Any]  # the weight arrays, filled below
    ws, lo, hi, tails = [None] * B, [0] * B, [0] * B, [0.0] * B
    n_long = 0
    for rank, bi in enumerate(order):
        x = q * float(l[bi])
        guess = int(x + 12.0 * math.sqrt(x + 1.0) + 32) if rank == 0 else int(n_long * l[bi] / l[order[0]] * 1.1) + 64
        w, tail = _weights(law, x, int(problem.batch_sizes[bi]), what, guess, cap)
        if rank == 0:
            n_long = w.size
            est = cost * sum(int(n_long * lb / l[bi] * 1.1) + 64 for lb in l)
            if est > EVENTS_TOTAL_LIMIT:
                raise InputError(
                    f"{what}: the uniformized event counts of the {B} batch sizes need about {est:.3g} terms "
                    f"(up to {n_long} per batch at q = {q:.4g} /ms), over the limit {EVENTS_TOTAL_LIMIT}; use slower "
                    f"phase switching, fewer batch sizes or a lighter-tailed service law")
        # keep n from where the mass below reaches 1e-30 to where the mass above falls below WEIGHT_TAIL
        below = np.cumsum(w)
        above = np.cumsum(w[::-1])[::-1]
        a = int(np.searchsorted(below, 1e-30))
        z = max(a, int(np.nonzero(above >= WEIGHT_TAIL)[0][-1]) if np.any(above >= WEIGHT_TAIL) else a)
        ws[bi] = w[a: z + 1]
        lo[bi], hi[bi] = a, z
        tails[bi] = tail + float(w[:a].sum()) + float(w[z + 1:].sum())
    sizes = np.array([w.size for w in ws], dtype=np.int64)
    lo_n, hi_n = band_edges(max(hi), P0, P1)
    return BlockPlan(q, P0, P1, lo_n, hi_n, np.concatenate(ws),
                     np.concatenate([[0], np.cumsum(sizes)[:-1]]).astype(np.int64), np.array(lo, dtype=np.int64),
                     np.array(hi, dtype=np.int64), np.array(tails), what, dominated)


def truncation_work(s_max: int, phases: int, bmax: int, actions: int, support: int) -> float:
    """Multiply-adds of one policy evaluation's sparse LU on levels 0..s_max, (s_max + 2)·m·(w·m)², plus one
    improvement step's window products, (s_max + 2)·w·A·m² (module doc; w = min(support, s_max) + Bmax + 1)."""
    w = min(int(support), s_max) + bmax + 1
    return float(s_max + 2) * phases * (w * phases) ** 2 + float(s_max + 2) * w * actions * phases ** 2


def matrix_entries(s_max: int, phases: int, bmax: int, support: int) -> float:
    """Entries of a policy's evaluation matrix at most: level n serving b reaches levels n − b .. n − b + support
    (≤ s_max) and S_o in every phase, most for b = Bmax; plus the column of h(0, 0)."""
    n = np.arange(s_max + 2, dtype=np.float64)
    top = np.minimum(float(support), s_max - np.maximum(n - bmax, 0.0))
    return float(np.sum(top + 2.0)) * phases * phases + (s_max + 2) * phases


def check_truncation_work(s_max: int, phases: int, bmax: int, actions: int, support: int, fix: str) -> None:
    """Refuse a truncation of (s_max + 2)·m states over :data:`MAP_STATE_LIMIT`, or whose LU is over
    :data:`LU_WORK_LIMIT` or :data:`MAP_MEMORY`, before building it."""
    states = (s_max + 2) * phases
    if states > MAP_STATE_LIMIT:
        raise InputError(f"a MAP truncation at s_max = {s_max} has {states} states ({phases} phases), over the limit "
                         f"{MAP_STATE_LIMIT}; {fix}")
    work = truncation_work(s_max, phases, bmax, actions, support)
    if work > LU_WORK_LIMIT:
        raise InputError(f"a MAP truncation at s_max = {s_max} ({phases} phases, arrival counts up to "
                         f"{min(support, s_max)} per batch) would take about {work:.2g} operations per policy evaluation, "
                         f"over the limit {LU_WORK_LIMIT:.2g}; {fix}")
    per_entry, allowed = lu_budget()
    nbytes = per_entry * matrix_entries(s_max, phases, bmax, support)
    if nbytes > allowed:
        raise InputError(f"a MAP truncation at s_max = {s_max} ({phases} phases, arrival counts up to "
                         f"{min(support, s_max)} per batch) would need about {gib(nbytes)} for its sparse LU, over the "
                         f"{gib(allowed)} limit; {fix}")


def predicted_levels(problem, arrivals, tol: float) -> tuple[float, str]:
    """A queue length the truncation must reach, and why: a phase i whose rate d_i exceeds the capacity
    c = max_b b/l(b) fills the queue at d_i − c for its sojourn (mean 1/ℓ_i, ℓ_i its leaving rate), so
    Δ < δ needs about (d_i − c)/ℓ_i·ln(1/δ) levels above Bmax."""
    l = problem.latency_ms()
    c = float(np.max(np.asarray(problem.batch_sizes, dtype=np.float64) / l))
    D = arrivals.D0 + arrivals.D1
    leave = (D - np.diag(np.diag(D))).sum(axis=1)
    d = arrivals.phase_rates
    over = np.maximum(d - c, 0.0) / np.where(leave > 0, leave, np.inf)
    i = int(np.argmax(over))
    need = problem.bmax + float(over[i]) * math.log(1.0 / max(tol, 1e-300))
    why = (f"phase {i} brings {d[i]:.4g} requests/ms for {1.0 / leave[i]:.4g} ms on average, above the capacity "
           f"{c:.4g}/ms" if over[i] > 0 else "")
    return need, why
