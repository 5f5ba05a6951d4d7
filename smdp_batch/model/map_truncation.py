"""The batching SMDP under MAP arrivals: state (queue length n, phase i), truncated.

Paper 004's model (§III–V) with Poisson arrivals replaced by a MAP (D0, D1) of m phases
(:mod:`.arrivals`).  Decision epochs are batch completions and arrivals to an idle server, as in
paper 004 §IV; the state adds the phase at the epoch.

* **Serving b** from (n, i): the batch takes X ~ G_b (mean l(b)); the next state is
  (n − b + k, j) with probability A_k^[b](i, j) = ∫ [z^k] e^{(D0 + z·D1)x} dG_b(x) — the matrix
  analogue of eqs. 4–6.  It is computed by uniformization: with q = max_i (−D0)_ii,
  P0 = I + D0/q, P1 = D1/q, A_k = Σ_n w_n U_{n,k}, where w_n = ∫ e^{−qx}(qx)ⁿ/n! dG_b(x) is the
  law's own mixed-Poisson count at rate q (eq. 4 with λ → q) and U_{n,k} = [z^k](P0 + z·P1)ⁿ
  (U_{n+1,k} = U_{n,k}P0 + U_{n,k−1}P1).  Every term is non-negative, so nothing cancels; the mass
  with k > kmax is carried in its own bucket, so tails P(K > k) are sums, not differences.
  With m = 1 (Poisson) P0 = 0, P1 = 1 and A_k = w_k exactly: the scalar table of eq. 4.  One recursion
  over n serves every batch size, on the band of k where U_n has mass (:func:`.map_work.band_edges`), so
  its work is known before it runs.  A batch time that is a mixture of Erlang laws (exp, hyperexp,
  erlang:k, integer gamma) is computed instead from E[e^{X·D(z)}] = Σ_c p_c (I − θ_c D(z))^{−k_c}: each
  factor solves (I − θD0)X_k = Y_k + θD1·X_{k−1}, all terms ≥ 0, in O(k·kmax·m³) whatever the rates.
* **Waiting** at (n, i): the next epoch is the next arrival, after a mean (−D0)⁻¹·1 from phase i,
  in phase j with probability ((−D0)⁻¹D1)_{ij}; the state becomes (n + 1, j).
* **Cost** (eqs. 9–13 with the matrix laws; W̄ = L̄/λ̄ by Little's law, λ̄ the MAP's mean rate):
  c((n, i), b) = w2·ζ(b) + (w1/λ̄)·(n·l(b) + H_b(i)), with H_b(i) = E_i[∫₀^X N(t) dt] the expected
  area of the arrivals during the batch, in closed form with Z = (1π − D)⁻¹, d = D1·1,
  M_b = E[e^{DX}] = Σ_k A_k^[b]:  H_b = λ̄·E[X²]/2·1 + l(b)·(Z·d − λ̄·1) − (I − M_b)·Z²·d
  (for Poisson, λE[X²]/2: eq. 11).  Waiting: c((n, i), 0) = (w1/λ̄)·n·((−D0)⁻¹1)_i.
* **Truncation** (eqs. 18–19): queue lengths 0..s_max and an overflow level S_o with m phases;
  mass beyond s_max lands on (S_o, j); at S_o the cost gains c_o·y.

States are numbered n·m + i (n = s_max + 1 is S_o).  Memory: the blocks A_k^[b] for k ≤ the
count support, O(|𝓑|·K·m²).  Work, memory and states are estimated and refused before they are spent
(:mod:`.map_work`).
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from ..kernel_cache import njit  # numba's njit, its cache keyed by every kernel file
from ..errors import InputError
from .arrivals import MAP
from .map_work import BlockPlan, check_truncation_work, plan_blocks
from .problem import BatchingProblem
from .truncation import check_truncation

__all__ = ["MapBlocks", "MapSMDP", "map_blocks", "truncate_map", "check_map_problem"]

#: Terms beyond the support carry less than this mass (as :data:`.truncation.SUPPORT_EPS`).
SUPPORT_EPS = 1e-18


def check_map_problem(problem: BatchingProblem, arrivals: MAP) -> None:
    """The problem's λ must be the MAP's mean rate (its W̄ and ρ are per mean arrival); one server."""
    problem.single()
    if not isinstance(arrivals, MAP):
        raise InputError(f"arrivals must be a MAP, got {type(arrivals).__name__}")
    if abs(problem.lam - arrivals.rate) > 1e-9 * arrivals.rate:
        raise InputError(
            f"the problem's λ = {problem.lam:.10g} /ms must be the MAP's mean rate {arrivals.rate:.10g} /ms "
            "(build it with map_problem or BatchingProblem(lam=arrivals.rate, …))")
    arrivals.check_conditioning()


@njit(cache=True)
def _blocks(weights, offsets, wlo, whi, tails, P0, P1, diag, kmax, band_lo, band_hi):
    """A_k^[b] = Σ_n w_n^[b] U_{n,k} (k ≤ kmax) for every batch size at once, and the mass of k > kmax, by one
    recursion over n shared by the batch sizes (module doc), on the band of k where U_n has mass
    (:func:`.map_work.band_edges`).  Flat rows of m·m, updated in place for descending k."""
    B = wlo.shape[0]
    m = P0.shape[0]
    mm = m * m
    N = 0
    for b in range(B):
        N = max(N, whi[b])
    A = np.zeros((B, kmax + 1, m, m))
    Af = A.reshape(B, (kmax + 1) * mm)
    A_over = np.zeros((B, m, m))
    U = np.zeros((kmax + 1) * mm)
    over = np.zeros((m, m))  # U_{n, >kmax}
    tmp = np.zeros((m, m))
    row = np.zeros(m)
    P = P0 + P1
    p1 = np.zeros(m)
    for j in range(m):
        p1[j] = P1[j, j]
    for i in range(m):
        U[i * m + i] = 1.0
    lo, hi, empty = 0, 0, False
    for n in range(N + 1):
        for b in range(B):
            if n < wlo[b] or n > whi[b]:
                continue
            wn = weights[offsets[b] + n - wlo[b]]
            if wn == 0.0:
                continue
            if not empty:
                for x in range(lo * mm, (hi + 1) * mm):
                    Af[b, x] += wn * U[x]
            for i in range(m):
                for j in range(m):
                    A_over[b, i, j] += wn * over[i, j]
        if n == N:
            break
        # over ← over·P + U_kmax·P1 (the mass crossing kmax), before U moves on
        for i in range(m):
            for j in range(m):
                acc = 0.0
                for l in range(m):
                    acc += over[i, l] * P[l, j]
                tmp[i, j] = acc
        if not empty and hi == kmax:
            top = kmax * mm
            for i in range(m):
                for j in range(m):
                    if diag:
                        tmp[i, j] += U[top + i * m + j] * p1[j]
                    else:
                        acc = 0.0
                        for l in range(m):
                            acc += U[top + i * m + l] * P1[l, j]
                        tmp[i, j] += acc
        for i in range(m):
            for j in range(m):
                over[i, j] = tmp[i, j]
        if empty:
            continue
        # the band of n + 1, then U_k ← U_k·P0 + U_{k−1}·P1 on it, descending k (row i needs only row i)
        nhi = min(band_hi[n + 1], n + 1, hi + 1, kmax)
        nlo = max(lo, band_lo[n + 1])
        if nlo > kmax:
            empty = True
            continue
        for k in range(nhi, nlo - 1, -1):
            base = k * mm
            has0 = lo <= k <= hi
            has1 = lo <= k - 1 <= hi
            for i in range(m):
                r = base + i * m
                for l in range(m):
                    row[l] = U[r + l] if has0 else 0.0
                for j in range(m):
                    acc = 0.0
                    if has0:
                        for l in range(m):
                            acc += row[l] * P0[l, j]
                    if has1:
                        if diag:
                            acc += U[r - mm + j] * p1[j]
                        else:
                            for l in range(m):
                                acc += U[r - mm + l] * P1[l, j]
                    U[r + j] = acc
        lo, hi = nlo, nhi
    # the weight mass outside [wlo, whi] (below 1e-20): counted as many arrivals, end phase as one more step
    for b in range(B):
        for i in range(m):
            for j in range(m):
                A_over[b, i, j] += tails[b] * P[i, j]
    return A, A_over


@njit(cache=True)
def _resolvent(Minv, Ninv, T1, stages, prob, kmax, A, A_over):
    """Adds prob·[(I − θD(z))⁻¹]^stages (counts 0..kmax, and the mass beyond) to A, A_over: each stage solves
    (I − θD0)X_k = Y_k + θD1·X_{k−1} for ascending k (in place: X_{k−1} is already the new one) and carries
    X_{>kmax} = (I − θD)⁻¹(Y_{>kmax} + θD1·X_kmax); Minv = (I − θD0)⁻¹, Ninv = (I − θD)⁻¹ and T1 = θD1 are ≥ 0."""
    m = Minv.shape[0]
    X = np.zeros((kmax + 1, m, m))
    Xo = np.zeros((m, m))
    R = np.zeros((m, m))
    for i in range(m):
        X[0, i, i] = 1.0
    for _ in range(stages):
        for k in range(kmax + 1):
            for i in range(m):
                for j in range(m):
                    acc = X[k, i, j]
                    if k > 0:
                        for l in range(m):
                            acc += T1[i, l] * X[k - 1, l, j]
                    R[i, j] = acc
            for i in range(m):
                for j in range(m):
                    acc = 0.0
                    for l in range(m):
                        acc += Minv[i, l] * R[l, j]
                    X[k, i, j] = acc
        for i in range(m):
            for j in range(m):
                acc = Xo[i, j]
                for l in range(m):
                    acc += T1[i, l] * X[kmax, l, j]
                R[i, j] = acc
        for i in range(m):
            for j in range(m):
                acc = 0.0
                for l in range(m):
                    acc += Ninv[i, l] * R[l, j]
                Xo[i, j] = acc
    for k in range(kmax + 1):
        for i in range(m):
            for j in range(m):
                A[k, i, j] += prob * X[k, i, j]
    for i in range(m):
        for j in range(m):
            A_over[i, j] += prob * Xo[i, j]


def _resolvent_blocks(plan: BlockPlan, arrivals: MAP, kmax: int) -> tuple[np.ndarray, np.ndarray]:
    """A_k^[b] for a batch time that is a mixture of Erlang laws (:func:`.map_work.erlang_mixture`):
    E[e^{X·D(z)}] = Σ_c p_c (I − θ_c D(z))^{−k_c}, exact, in O(k_c·kmax·m³) whatever the rates."""
    probs, theta, stages = plan.resolvent  # type: ignore[misc]  # called only on the resolvent route (set)
    m = arrivals.phases
    B = theta.shape[0]
    D0, D1 = arrivals.D0, arrivals.D1
    eye = np.eye(m)
    A = np.zeros((B, kmax + 1, m, m))
    A_over = np.zeros((B, m, m))
    for bi in range(B):
        for c in range(probs.size):
            t = float(theta[bi, c])
            Minv = np.maximum(np.linalg.inv(eye - t * D0), 0.0)  # M-matrix inverses: ≥ 0 up to round-off
            Ninv = np.maximum(np.linalg.inv(eye - t * (D0 + D1)), 0.0)
            _resolvent(Minv, Ninv, t * D1, int(stages[c]), float(probs[c]), kmax, A[bi], A_over[bi])
    return A, A_over


@dataclass(frozen=True)
class MapBlocks:
    """A_k^[b](i, j) for every allowed b and k = 0..kmax, the tails P(K > k, j | i) and M_b = E[e^{DX}]."""

    pmf: np.ndarray  # (B, kmax+1, m, m)
    sf: np.ndarray  # (B, kmax+1, m, m): Σ_{k' > k} A_{k'}
    total: np.ndarray  # (B, m, m): Σ_k A_k (rows sum to 1)
    khi: np.ndarray  # (B,) last k with mass ≥ SUPPORT_EPS (or kmax)

    @property
    def kmax(self) -> int:
        return self.pmf.shape[1] - 1

    @property
    def complete(self) -> bool:
        """Every block's mass beyond kmax is below SUPPORT_EPS: the table serves any truncation."""
        return bool(np.all(self.khi < self.kmax))

    def covers(self, s_max: int) -> bool:
        return self.kmax >= s_max or self.complete


def map_blocks(problem: BatchingProblem, arrivals: MAP, kmax: int, plan: BlockPlan | None = None) -> MapBlocks:
    """The matrix arrival-count laws A_k^[b] (module doc) for k = 0..kmax; their work and memory are estimated
    and refused before any of it is done (:class:`.map_work.BlockPlan`, reused when given)."""
    check_map_problem(problem, arrivals)
    kmax = int(kmax)
    if plan is None:
        plan = plan_blocks(problem, arrivals)
    plan.check(kmax)
    if plan.resolvent is not None:
        pmf, A_over = _resolvent_blocks(plan, arrivals, kmax)
    else:
        pmf, A_over = _blocks(plan.weights, plan.offsets, plan.wlo, plan.whi, plan.tails, plan.P0, plan.P1,
                              plan.diagonal, kmax, plan.lo, plan.hi)
    # sf_k = Σ_{k<k'≤kmax} A_k' + A_over, summed from the top (no cancellation)
    sf = np.empty_like(pmf)
    sf[:, -1] = 0.0
    if kmax > 0:
        np.cumsum(pmf[:, :0:-1], axis=1, out=sf[:, -2::-1])
    sf += A_over[:, None]
    total = sf[:, 0] + pmf[:, 0]
    mass = sf.sum(axis=3).max(axis=2)  # (B, kmax+1)
    khi = np.zeros(pmf.shape[0], dtype=np.int64)
    for bi in range(pmf.shape[0]):
        above = np.nonzero(mass[bi] >= SUPPORT_EPS)[0]
        khi[bi] = min(int(above[-1]) + 1, kmax) if above.size else 0
    if not (np.all(np.isfinite(pmf)) and np.all(pmf >= 0)):
        raise InputError(f"service law {problem.service.spec()} produced invalid MAP arrival probabilities")
    return MapBlocks(pmf, sf, total, khi)


@dataclass(frozen=True)
class MapSMDP:
    """The truncated MAP batching SMDP in compact per-action form (states n·m + i; n = s_max+1 is S_o)."""

    problem: BatchingProblem
    arrivals: MAP
    s_max: int
    abstract_cost: float
    actions: np.ndarray  # (A,) 0 then batch sizes
    blocks: MapBlocks  # rows follow problem.batch_sizes (action index − 1), kmax ≥ s_max
    y: np.ndarray  # (A, m) mean sojourn (ms)
    cost_fixed: np.ndarray  # (A, m)
    cost_slope: np.ndarray  # (A, m): c = fixed + slope·n
    hold_fixed: np.ndarray  # (A, m): H_a(i) (request·ms), 0 for waiting
    energy: np.ndarray  # (A,) mJ
    wait_next: np.ndarray  # (m, m) phase law at the next arrival

    @property
    def phases(self) -> int:
        return self.arrivals.phases

    @property
    def levels(self) -> int:
        """Queue levels 0..s_max and S_o."""
        return self.s_max + 2

    @property
    def n_states(self) -> int:
        return self.levels * self.phases

    def level(self) -> np.ndarray:
        """Queue length of each level (S_o counts as s_max), shape (levels,)."""
        lv = np.arange(self.levels, dtype=np.float64)
        lv[-1] = self.s_max
        return lv

    def costs(self) -> np.ndarray:
        """ĉ((n, i), a) as (levels, m, A); +inf where a > n."""
        lv = self.level()
        c = self.cost_fixed.T[None, :, :] + self.cost_slope.T[None, :, :] * lv[:, None, None]
        c[-1] += self.abstract_cost * self.y.T
        c[np.broadcast_to(self.actions[None, None, :] > lv[:, None, None], c.shape)] = np.inf
        return c

    def action_index(self, policy: np.ndarray) -> np.ndarray:
        """(levels, m) batch sizes → action indices; validates shape, allowed sizes and feasibility."""
        policy = np.asarray(policy)
        if policy.shape != (self.levels, self.phases):
            raise InputError(f"a phase policy must have shape (s_max+2, m) = {(self.levels, self.phases)}, got {policy.shape}")
        lookup = {int(a): i for i, a in enumerate(self.actions)}
        try:
            idx = np.vectorize(lambda a: lookup[int(a)], otypes=[np.int64])(policy)
        except KeyError as e:
            raise InputError(f"the policy uses batch size {e.args[0]}, which is not allowed") from None
        bad = np.argwhere(policy > self.level()[:, None])
        if bad.size:
            n, i = bad[0]
            raise InputError(f"the policy serves {int(policy[n, i])} requests at queue length {n} (phase {i})")
        return idx


def truncate_map(problem: BatchingProblem, arrivals: MAP, s_max: int, abstract_cost: float = 100.0,
                 blocks: MapBlocks | None = None, solvable: bool = True) -> MapSMDP:
    """The truncated MAP SMDP with levels 0..s_max, S_o and abstract cost c_o (module doc).  ``solvable``:
    refuse, before building it, a truncation whose states or evaluation LU are over the limits of
    :mod:`.map_work` (False: for the Q-values of known relative values only, no linear system)."""
    check_map_problem(problem, arrivals)
    s, c_o = check_truncation(problem, s_max, abstract_cost, (len(problem.batch_sizes) + 1) * arrivals.phases ** 2)
    fix = "use a smaller s_max, fewer phases or batch sizes, or a lower load"
    n_act = len(problem.batch_sizes) + 1
    if solvable:
        check_truncation_work(s, arrivals.phases, problem.bmax, n_act, 0, fix)  # before the blocks
    if blocks is None or not blocks.covers(s):
        blocks = map_blocks(problem, arrivals, s)
    if solvable:
        check_truncation_work(s, arrivals.phases, problem.bmax, n_act, int(blocks.khi.max()), fix)
    m = arrivals.phases
    lam = arrivals.rate
    w1, w2 = problem.w1, problem.w2
    l = problem.latency_ms()
    ex2 = problem.second_moments()
    y_wait, wait_next = arrivals.next_arrival()
    D = arrivals.D0 + arrivals.D1
    d = arrivals.phase_rates
    Z = np.linalg.inv(np.outer(np.ones(m), arrivals.stationary) - D)
    Zd, ZZd = Z @ d, Z @ (Z @ d)
    H = np.empty((len(l), m))
    for bi in range(len(l)):
        H[bi] = lam * ex2[bi] / 2.0 + l[bi] * (Zd - lam) - (np.eye(m) - blocks.total[bi]) @ ZZd
    A = len(l) + 1
    y = np.empty((A, m))
    y[0] = y_wait
    y[1:] = l[:, None]
    hold_fixed = np.zeros((A, m))
    hold_fixed[1:] = H
    energy = np.concatenate([[0.0], problem.energy_mj()])
    return MapSMDP(
        problem=problem, arrivals=arrivals, s_max=s, abstract_cost=c_o,
        actions=np.concatenate([[0], problem.batch_sizes]).astype(np.int64), blocks=blocks, y=y,
        cost_fixed=w2 * energy[:, None] + (w1 / lam) * hold_fixed, cost_slope=(w1 / lam) * y,
        hold_fixed=hold_fixed, energy=energy, wait_next=wait_next,
    )
