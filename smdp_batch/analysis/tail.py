"""The exact response-time distribution of a pure table under Poisson arrivals, by transform inversion.

An independent check of the simulator's percentiles (it shares no code with :mod:`.simulate` or the
solvers): deterministic or exponential batch times, a table π(n) (π(min(n, s_max)) beyond its top, as the
simulator and the runtime apply it), FIFO, one batch at a time.

**The tagged request.**  Follow one request from its arrival.  At each decision epoch it has j requests
ahead of it and m behind, so the queue holds n = j + 1 + m and the table serves b = π(n):

* b > j — its batch starts now: the rest of its time is one batch time G_b;
* 0 < b ≤ j — a batch of older requests: G_b passes, a ~ Poisson arrivals during it join behind
  (j → j − b, m → m + a);
* b = 0 — the server waits for the next arrival, Exp(λ) (m → m + 1).

So the Laplace–Stieltjes transform φ(j, m; s) = E[e^{−sT}] of the remaining time T obeys
φ(j, m) = L_b(s) (b > j);  φ(j, m) = λ/(λ+s)·φ(j, m+1) (b = 0);  φ(j, m) = Σ_a K_b(a; s)·φ(j − b, m + a),
with K_b(a; s) = E[e^{−sG_b}; a arrivals during G_b]: e^{−s·l_b}·Poisson(a; λl_b) for deterministic G_b,
μλ^a/(λ+s+μ)^{a+1} (μ = 1/l_b) for exponential G_b.  Rows j are solved in increasing order, and m from the
top down (eq. 30 makes the table serve at long queues, so every wait chain ends).

**Where the tag arrives** (PASTA: the time-stationary state).  The decision epochs form a Markov chain
(wait: n → n + 1; serve b: n → n − b + arrivals during G_b) with stationary law ν; a sojourn at n lasts
1/λ (waiting) or l_b (serving), so the time-stationary share of an epoch state is ∝ ν(n)·(its sojourn).  A
tag arriving while the server waits with k queued starts at (j, m) = (k, 0).  One arriving during a batch
of b begun at n sees the batch's age E and residual R: for deterministic G_b, E ~ U[0, l_b] and
R = l_b − E; for exponential G_b, E and R are independent Exp(μ).  It finds n − b + Poisson(λE) ahead,
and Poisson(λR) arrive behind it before the next epoch.

**Inversion.**  P(W ≤ t) is the inverse transform of φ_W(s)/s, computed with the Euler algorithm of Abate
& Whitt ("Numerical inversion of Laplace transforms of probability distributions", ORSA J. Computing 7,
1995): discretisation error ≈ e^{−A} = 1e-8 at the continuity points of the distribution (a deterministic
law puts atoms at l(b), below the tail; quantiles are taken in the continuous tail).
"""

from __future__ import annotations

import math

import numpy as np
from scipy import optimize, stats

from ..errors import InputError
from ..model.laws import Deterministic, Exponential
from ..model.problem import BatchingProblem

__all__ = ["SojournLaw", "sojourn_law"]

_A, _N, _M = 18.4, 15, 11  # Euler inversion: e^{-A} discretisation error, N terms + M Euler-averaged terms
_TAIL = 1e-15  # Poisson terms and stationary mass left out


class SojournLaw:
    """The response-time law of a table: :meth:`cdf` (vectorised over t, ms) and :meth:`quantile`."""

    def __init__(self, problem: BatchingProblem, policy):
        law = problem.single().service
        if isinstance(law, Deterministic):
            self.kind = "det"
        elif isinstance(law, Exponential):
            self.kind = "exp"
        else:
            raise InputError(f"the exact response-time law covers det and exp service, not {law.spec()}")
        pol = np.asarray(policy, dtype=np.int64)
        if pol.ndim != 1 or pol.size < 2 or pol[-1] <= 0:
            raise InputError("the policy must be a table π(0..s_max) that serves at its top")
        self.lam = float(problem.lam)
        change = np.nonzero(pol != pol[-1])[0]
        self.top = int(change[-1]) + 1 if change.size else 0  # π(n) = π(top) for every n ≥ top
        self.pol = pol[: self.top + 1]
        lat = dict(zip(problem.batch_sizes, problem.latency_ms()))
        self.l = {int(b): float(lat[int(b)]) for b in set(pol[pol > 0].tolist())}
        self._stationary()
        self._grid()

    # ------------------------------------------------------------------ the embedded chain
    def _act(self, n):
        return self.pol[np.minimum(n, self.top)]

    def _arrivals(self, b: int, cut: int) -> np.ndarray:
        """P(a arrivals during G_b), a = 0..cut−1."""
        x = self.lam * self.l[b]
        a = np.arange(cut)
        if self.kind == "det":
            return stats.poisson.pmf(a, x)
        r = x / (1.0 + x)  # geometric: μλ^a/(λ+μ)^{a+1}
        return (1.0 - r) * r ** a

    def _cut(self, b: int) -> int:
        x = self.lam * self.l[b]
        if self.kind == "det":
            return int(stats.poisson.isf(_TAIL, x)) + 2
        r = x / (1.0 + x)
        return int(math.log(_TAIL) / math.log(r)) + 2

    def _stationary(self) -> None:
        """ν over decision epochs, on 0..N with N doubled until the mass near N is below 1e-14."""
        N = max(4 * self.top, 256)  # (the dense solve's round-off floor is ~1e-17 per state)
        while True:
            P = np.zeros((N + 1, N + 1))
            for n in range(N + 1):
                b = int(self._act(n))
                if b == 0:
                    P[n, min(n + 1, N)] += 1.0
                    continue
                p = self._arrivals(b, self._cut(b))
                dest = np.minimum(n - b + np.arange(p.size), N)
                np.add.at(P[n], dest, p)
                P[n, N] += max(0.0, 1.0 - p.sum())
            A = P.T - np.eye(N + 1)
            A[-1] = 1.0
            rhs = np.zeros(N + 1)
            rhs[-1] = 1.0
            nu = np.linalg.solve(A, rhs)
            nu = np.clip(nu, 0.0, None)
            nu /= nu.sum()
            if nu[-max(8, N // 8):].sum() < 1e-14 or N >= 4096:
                break
            N *= 2
        if nu[-max(8, N // 8):].sum() >= 1e-10:
            raise InputError("the queue under this table is too long for the exact response-time law (ρ too close to 1?)")
        self.N, self.nu = N, nu

    def _grid(self) -> None:
        """The (j, m) ranges the transform needs: j up to the longest queue a tag can see, m up to the
        arrivals behind it before its batch starts (generous: the response-time tail times λ)."""
        longest = int(np.nonzero(self.nu > 1e-13)[0][-1])  # the mass beyond is < 1e-11: far below any quantile
        self.J = longest + max(self._cut(b) for b in self.l) + 1
        # φ(j, m) is constant in m once j + 1 + m is past top and every batch ahead of the tag is π(top)'s:
        # for m ≥ top + π(top) (by induction over j), so clamping m there is exact
        self.M = self.top + int(self.pol[-1]) + 1

    # ------------------------------------------------------------------ transforms
    def _kernel(self, b: int, s: np.ndarray) -> np.ndarray:
        """Deterministic G_b: K_b(a; s) for a = 0..cut−1 (rows) and each s (columns).  (Exponential G_b
        sums its geometric kernel by a recursion instead: :meth:`_geometric`.)"""
        return self._arrivals(b, self._cut(b))[:, None] * np.exp(-s * self.l[b])[None, :]

    def _geometric(self, b: int, s: np.ndarray):
        """Exponential G_b: K_b(a; s) = c·r^a with c = μ/(λ+s+μ), r = λ/(λ+s+μ) (|r| < 1 for Re s ≥ 0)."""
        mu = 1.0 / self.l[b]
        d = self.lam + s + mu
        return mu / d, self.lam / d

    def _lst(self, b: int, s: np.ndarray) -> np.ndarray:
        return np.exp(-s * self.l[b]) if self.kind == "det" else 1.0 / (1.0 + s * self.l[b])

    def transform(self, s) -> np.ndarray:
        """φ_W(s) = E[e^{−sW}] for each complex s (1-D array)."""
        s = np.atleast_1d(np.asarray(s, dtype=np.complex128))
        J, M, lam = self.J, self.M, self.lam
        phi = np.zeros((J + 1, M + 1, s.size), dtype=np.complex128)
        wait = lam / (lam + s)
        kern = {b: self._kernel(b, s) for b in self.l} if self.kind == "det" else {}
        geo = {b: self._geometric(b, s) for b in self.l} if self.kind == "exp" else {}
        lst = {b: self._lst(b, s) for b in self.l}
        m = np.arange(M + 1)
        for j in range(J + 1):
            acts = self._act(j + 1 + m)
            row = phi[j]
            for b in self.l:
                here = acts == b
                if not here.any():
                    continue
                if b > j:
                    row[here] = lst[b]
                    continue
                rows = np.nonzero(here)[0]
                prev = phi[j - b]
                if self.kind == "exp":  # Σ_a c·r^a·φ(m + a) = G(m), G(m) = c·φ(m) + r·G(m + 1), G(M) = cφ(M)/(1 − r)
                    c, r = geo[b]
                    G = np.empty_like(prev)
                    G[M] = c * prev[M] / (1.0 - r)
                    for mm in range(M - 1, -1, -1):
                        G[mm] = c * prev[mm] + r * G[mm + 1]
                    row[rows] = G[rows]
                    continue
                K = kern[b]
                # φ(j − b, m + a), clamped at M, past which it is constant (see _grid)
                idx = np.minimum(rows[:, None] + np.arange(K.shape[0])[None, :], M)
                row[rows] = np.einsum("mas,as->ms", prev[idx], K)
            # waits, from the top down: φ(j, m) = λ/(λ+s)·φ(j, m+1)
            for mm in np.nonzero(acts == 0)[0][::-1]:
                row[mm] = wait * row[min(mm + 1, M)]
        # the tag's arrival (PASTA)
        out = np.zeros(s.size, dtype=np.complex128)
        z = 0.0
        inside = {b: self._inside(b, s, phi) for b in self.l}
        for n in range(min(self.nu.size, J + 1)):
            w = self.nu[n]
            if w < 1e-18:
                continue
            b = int(self._act(n))
            if b == 0:
                share = w / lam
                out += share * phi[n, 0]
                z += share
                continue
            share = w * self.l[b]
            z += share
            ahead, V = inside[b]
            rows = np.minimum(n - b + np.arange(ahead.shape[-1]), J)
            out += share * np.einsum("gi,gis->s", ahead, V[:, rows])
        return out / z

    def _inside(self, b: int, s: np.ndarray, phi: np.ndarray):
        """For a tag arriving during a batch of b: (weights over the age nodes g of i arrivals ahead,
        V[g, row] = E[e^{−sR}·φ(row, a behind)]) — deterministic G_b: age ~ U[0, l_b] by Gauss–Legendre
        nodes, R = l_b − age; exponential G_b: age and R independent Exp(1/l_b), one node."""
        lam, l = self.lam, self.l[b]
        cut = self._cut(b)
        i = np.arange(cut)
        if self.kind == "det":
            x, wq = np.polynomial.legendre.leggauss(24)
            ages = 0.5 * l * (x + 1.0)
            res = l - ages
            ahead = 0.5 * wq[:, None] * stats.poisson.pmf(i[None, :], lam * ages[:, None])
            behind = stats.poisson.pmf(np.arange(cut)[None, :, None], lam * res[:, None, None]) * \
                np.exp(-s[None, None, :] * res[:, None, None])  # (g, a, s)
        else:
            mu = 1.0 / l
            r = lam / (lam + mu)
            ahead = ((1.0 - r) * r ** i)[None, :]
            c, rs = self._geometric(b, s)  # R ~ Exp(μ): E[e^{−sR}; a behind] = c·r^a
            behind = (c[None, :] * rs[None, :] ** np.arange(cut)[:, None])[None]
        V = np.einsum("gas,jas->gjs", behind, phi[:, np.minimum(np.arange(cut), self.M)])  # constant past M
        return ahead, V

    # ------------------------------------------------------------------ inversion
    def cdf(self, t) -> np.ndarray:
        """P(W ≤ t) for each t (ms), by Euler inversion of φ_W(s)/s."""
        t = np.atleast_1d(np.asarray(t, dtype=np.float64))
        if np.any(t <= 0):
            raise InputError("times must be > 0 ms")
        k = np.arange(_N + _M + 1)
        s = (_A + 2j * math.pi * k[None, :]) / (2.0 * t[:, None])  # (t, k)
        fs = (self.transform(s.ravel()) / s.ravel()).reshape(s.shape).real
        terms = fs * np.where(k % 2 == 0, 1.0, -1.0)[None, :]
        terms[:, 0] *= 0.5
        partial = np.cumsum(terms, axis=1)[:, _N:]  # s_N .. s_{N+M}
        weights = np.array([math.comb(_M, i) for i in range(_M + 1)]) / 2.0 ** _M
        return (math.exp(_A / 2.0) / t) * (partial @ weights)

    def quantile(self, q: float) -> float:
        """The q-quantile of W (ms), 0 < q < 1, by root finding on :meth:`cdf`."""
        if not 0 < q < 1:
            raise InputError(f"a quantile level must lie in (0, 1), got {q!r}")
        lo = min(self.l.values()) * (1 + 1e-9)
        hi = 2.0 * lo
        while self.cdf(hi)[0] < q:
            lo, hi = hi, 2.0 * hi
        return float(optimize.brentq(lambda t: self.cdf(t)[0] - q, lo, hi, xtol=1e-7, rtol=1e-9))

    def mean(self) -> float:
        """E[W] (ms) from the transform's slope at 0 (a check against the exact W̄)."""
        h = 1e-6
        return float(-(self.transform([h])[0].real - self.transform([-h])[0].real) / (2 * h))


def sojourn_law(problem: BatchingProblem, policy) -> SojournLaw:
    """The exact response-time law of ``policy`` (states 0..s_max, or a Solution) under ``problem``."""
    if hasattr(policy, "policy") and hasattr(policy, "s_max"):
        policy = np.asarray(policy.policy)[: policy.s_max + 1]
    return SojournLaw(problem, policy)
