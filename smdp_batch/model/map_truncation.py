"""The batching SMDP under MAP arrivals (issue 20): state (queue length n, phase i), truncated.

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
  With m = 1 (Poisson) P0 = 0, P1 = 1 and A_k = w_k exactly: the scalar table of eq. 4.
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
count support, O(|𝓑|·K·m²).
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np
from numba import njit

from ..errors import InputError
from ..limits import check_memory
from .arrivals import MAP
from .problem import BatchingProblem
from .truncation import check_truncation

__all__ = ["MapBlocks", "MapSMDP", "map_blocks", "truncate_map", "check_map_problem"]

#: Terms beyond the support carry less than this mass (as :data:`.truncation.SUPPORT_EPS`).
SUPPORT_EPS = 1e-18


def check_map_problem(problem: BatchingProblem, arrivals: MAP) -> None:
    """The problem's λ must be the MAP's mean rate (its W̄ and ρ are per mean arrival)."""
    if not isinstance(arrivals, MAP):
        raise InputError(f"arrivals must be a MAP, got {type(arrivals).__name__}")
    if abs(problem.lam - arrivals.rate) > 1e-9 * arrivals.rate:
        raise InputError(
            f"the problem's λ = {problem.lam:.10g} /ms must be the MAP's mean rate {arrivals.rate:.10g} /ms "
            "(build it with map_problem or BatchingProblem(lam=arrivals.rate, …))")


@njit(cache=True)
def _blocks(w, sf_last, P0, P1, kmax):
    """A_k = Σ_n w_n U_{n,k} (k ≤ kmax) and the mass of k > kmax, by the recursion of the module doc
    (explicit loops: m ≤ 8, no temporaries)."""
    m = P0.shape[0]
    N = w.shape[0] - 1
    K = min(kmax, N)
    U = np.zeros((K + 1, m, m))
    for i in range(m):
        U[0, i, i] = 1.0
    over = np.zeros((m, m))  # U_{n, >kmax}
    tmp = np.zeros((m, m))
    A = np.zeros((kmax + 1, m, m))
    A_over = np.zeros((m, m))
    P = P0 + P1
    top = 0  # highest k with U_{n,k} ≠ 0
    for n in range(N + 1):
        wn = w[n]
        for k in range(top + 1):
            for i in range(m):
                for j in range(m):
                    A[k, i, j] += wn * U[k, i, j]
        for i in range(m):
            for j in range(m):
                A_over[i, j] += wn * over[i, j]
        if n == N:
            break
        # advance n → n + 1: over ← over·P + U_K·P1 (when K = kmax), then U_k ← U_k·P0 + U_{k−1}·P1, descending k
        for i in range(m):
            for j in range(m):
                acc = 0.0
                for l in range(m):
                    acc += over[i, l] * P[l, j]
                if top == K and K == kmax:
                    for l in range(m):
                        acc += U[K, i, l] * P1[l, j]
                tmp[i, j] = acc
        over[:, :] = tmp
        newtop = min(top + 1, K)
        for k in range(newtop, -1, -1):
            for i in range(m):
                for j in range(m):
                    acc = 0.0
                    if k <= top:
                        for l in range(m):
                            acc += U[k, i, l] * P0[l, j]
                    if k >= 1:
                        for l in range(m):
                            acc += U[k - 1, i, l] * P1[l, j]
                    tmp[i, j] = acc
            U[k] = tmp
        top = newtop
    # the weight mass beyond N (below 1e-17): counted as many arrivals, end phase as the mixing law
    for i in range(m):
        for j in range(m):
            A_over[i, j] += sf_last * P[i, j]
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


#: Most uniformized events per batch (terms w_n) computed; a law needing more is refused.
EVENTS_LIMIT = 1 << 17


def _weights(law, x: float, b: int) -> tuple[np.ndarray, float]:
    """Mixed-Poisson weights w_n at mean count x up to where their tail is below 1e-17 (and that tail)."""
    n = max(64, int(x + 12.0 * np.sqrt(x + 1.0) + 32))
    while True:
        pmf, sf = law.arrival(x, n, b)
        if sf[-1] < 1e-17:
            return np.asarray(pmf, dtype=np.float64), float(max(sf[-1], 0.0))
        if n >= EVENTS_LIMIT:
            raise InputError(
                f"service law {law.spec()}: a batch of {b} sees more than {EVENTS_LIMIT} MAP events with probability "
                f"{sf[-1]:.2g}; its tail is too heavy for MAP arrivals (use a lighter-tailed law)")
        n = min(2 * n, EVENTS_LIMIT)


def map_blocks(problem: BatchingProblem, arrivals: MAP, kmax: int) -> MapBlocks:
    """The matrix arrival-count laws A_k^[b] (module doc) for k = 0..kmax."""
    check_map_problem(problem, arrivals)
    m = arrivals.phases
    B = len(problem.batch_sizes)
    check_memory(2.0 * B * (kmax + 1) * m * m * 8, f"the MAP arrival blocks for {B} batch sizes and k ≤ {kmax}",
                 "use fewer batch sizes or a smaller s_max")
    q = arrivals.uniformization()
    P0 = np.eye(m) + arrivals.D0 / q
    P1 = arrivals.D1 / q
    P0[P0 < 0] = 0.0  # round-off on the diagonal
    law = problem.service
    pmf = np.zeros((B, kmax + 1, m, m))
    sf = np.zeros_like(pmf)
    total = np.zeros((B, m, m))
    khi = np.zeros(B, dtype=np.int64)
    for bi, (b, l) in enumerate(zip(problem.batch_sizes, problem.latency_ms())):
        w, tail = _weights(law, q * float(l), int(b))
        A, A_over = _blocks(w, tail, P0, P1, int(kmax))
        pmf[bi] = A
        # sf_k = Σ_{k<k'≤kmax} A_k' + A_over, summed from the top (no cancellation)
        rev = np.cumsum(A[::-1], axis=0)[::-1]
        sf[bi, :-1] = rev[1:] + A_over
        sf[bi, -1] = A_over
        total[bi] = rev[0] + A_over
        mass = sf[bi].sum(axis=2).max(axis=1)
        above = np.nonzero(mass >= SUPPORT_EPS)[0]
        khi[bi] = min(int(above[-1]) + 1, kmax) if above.size else 0
    if not (np.all(np.isfinite(pmf)) and np.all(pmf >= 0)):
        raise InputError(f"service law {law.spec()} produced invalid MAP arrival probabilities")
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
                 blocks: MapBlocks | None = None) -> MapSMDP:
    """The truncated MAP SMDP with levels 0..s_max, S_o and abstract cost c_o (module doc)."""
    check_map_problem(problem, arrivals)
    s, c_o = check_truncation(problem, s_max, abstract_cost, (len(problem.batch_sizes) + 1) * arrivals.phases ** 2)
    if blocks is None or blocks.kmax < s:
        blocks = map_blocks(problem, arrivals, s)
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
