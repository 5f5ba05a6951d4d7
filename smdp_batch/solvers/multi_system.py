"""One policy's linear system on the c-server SMDP (:mod:`smdp_batch.model.multi_server`) and its exact metrics.

One policy's average cost g and bias h solve, with h(s₀) = 0 at s₀ = (n = 0, every instance idle),

* a state where it waits:      q(s)·h(s) − Σ_{s'} r(s, s')·h(s') + g = cost rate(s)        (rates in 1/ms)
* a state where it starts b:   h(s) − Σ_j α_b[j]·h(s after b starts in phase j) = w2·ζ(b)

(the semi-Markov equation h = c − g·τ + P·h of paper 004 eq. 20, multiplied by q(s) where the sojourn is
exponential, and with τ = 0 for the instantaneous start of a batch).  One sparse LU factorises it; the
transposed solve with the unit vector at s₀ gives ∂g/∂(cost of s): the share of time in each waiting state and
the rate of each start, hence W̄, P̄ and the mean batch (:meth:`MultiSystem.evaluate`).

**The tail boundary** (default).  Above the truncation N every instance serves Bmax, so the queue is a random
walk: up by arrivals, down by Bmax at each completion.  Its bias is quadratic in n up to terms that die out
geometrically (as for one server, paper 004 eq. 20 with the tail boundary of
:mod:`smdp_batch.model.truncation`), its slope shifted by each batch running (one with less time left than an
equilibrium Bmax batch frees its instance sooner), so an arrival at N steps to h(N) plus that increment for the
batches running there (:meth:`MultiSystem._tail_terms`), and the metrics add the tail's share in closed form
(throughput = λ exactly).

**Factorisations reused.**  A policy close to the last one factorised (policy iteration's late steps, the tables
priced beside the optimum) is solved by GMRES preconditioned with those factors, each answer certified by its
residual (:meth:`MultiSystem._solve`); a factorisation is the cost of a large model (1–17 s at 10⁵ states).
From :data:`ILU_FROM` states each policy gets incomplete factors (SuperLU's ILUTP, drop tolerance 1e-2): at
162 129 states (c = 2, every size to 32, N = 288) 1.1–1.5 s and 3·10⁶ non-zeros against 15 s and 5·10⁷ for the
complete ones, and GMRES on them settles in 0.15–0.5 s, certified the same way; where it does not, or the factors
hit a zero pivot, the next of :data:`ILU_TRIES`, and after them the complete factors.  A complete factorisation
that fills densely moves the solve's later policies to incomplete factors from :data:`DENSE_FROM` states.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np
import scipy.sparse as sp
from scipy.sparse.linalg import spilu, splu

from ..errors import InputError
from ..model.multi_server import MultiServerSMDP, PhaseType
from ..model.problem import BatchingProblem
from ..specs.rows import as_rows
from .krylov import Basis, gmres_cycle

__all__ = ["MultiEvaluation", "MultiSystem", "table_policy", "table_rows"]

#: From this many states the LU factorisation orders columns by COLAMD (see :class:`MultiSystem`).
COLAMD_FROM = 21_000
#: A policy that differs from the last one factorised in at most this share of its states is solved by GMRES
#: preconditioned with that factorisation (:meth:`MultiSystem._solve`), where the factors hold at least
#: :data:`REUSE_MIN_NNZ` non-zeros: smaller ones are remade faster than GMRES settles (c = 8, sizes 16, 32: 0.9–1.5·10⁶
#: non-zeros, 0.05 s a factorisation against 0.2 s of GMRES; c = 2, every size: 0.8–5·10⁷, 1–17 s).
REUSE_SHARE = 0.03
REUSE_MIN_NNZ = 4_000_000
#: GMRES's iterations there before the policy is factorised afresh: half the factors' non-zeros per row (a
#: factorisation costs more, against two triangular solves an iteration, the more each row fills: 1–3 s against
#: 20 ms at 7–17·10⁶ non-zeros over 72 369 rows, 36 s against 0.14 s at 7.6·10⁷ over 242 913), at least
#: :data:`REUSE_FLOOR` and at most this; restarted every :data:`REUSE_RESTART` (its basis: that many vectors).
REUSE_ITERATIONS = 200
REUSE_FLOOR = 20
REUSE_RESTART = 60
#: The largest residual (max norm, relative to the right-hand side's) a GMRES answer may keep.
REUSE_RESIDUAL = 1e-13
#: From ILU_FROM states a policy's system is solved by GMRES preconditioned with incomplete LU factors (SuperLU's
#: ILUTP: entries below ILU_DROP dropped, at most ILU_FILL × the matrix's non-zeros), within ILU_ITERATIONS and
#: REUSE_RESIDUAL, else factorised completely.  From ILU_REUSE_FROM states a policy within REUSE_SHARE of the last
#: one factorised first tries that one's, for at most ILU_REUSE_ITERATIONS (below, new ones are made faster than
#: GMRES settles on old ones; above, a reuse that needs more iterations than that costs more than new factors).
ILU_FROM, ILU_REUSE_FROM = 50_000, 100_000
ILU_DROP, ILU_FILL, ILU_ITERATIONS, ILU_REUSE_ITERATIONS = 1e-2, 10.0, 150, 40
#: A complete factorisation that fills past DENSE_FILL entries per row moves the solve's later policies of
#: DENSE_FROM states or more to incomplete factors (:attr:`MultiSystem.incomplete_from`).  Measured fill per row:
#: three instances with six sizes 300–620 (1.3–2.9 s a factorisation at 16 212 states; the whole solve 18.5 s, 1.6 s
#: on incomplete factors, the same ĝ to 1e-15 and the same table); two instances with six sizes, Erlang-2 or not,
#: three with four sizes, four with three and eight with two: 23–135, where complete factors stay faster (eight
#: instances with sizes 16, 32 on incomplete factors from 15 000 states: 1.0 → 3.1 s).
DENSE_FILL, DENSE_FROM = 200, 10_000


@dataclass(frozen=True)
class MultiEvaluation:
    """Exact long-run metrics of one policy on c instances (truncated at N)."""

    avg_cost: float  # w1·W̄ + w2·P̄ (per ms)
    mean_latency_ms: float  # W̄
    mean_power_w: float  # P̄, batches plus idle instances
    idle_power_w: float  # the idle instances' share of P̄
    mean_batch: float
    throughput: float  # requests/ms served
    busy_instances: float  # mean instances serving
    boundary_mass: float  # share of time at n = N (with the plain truncation, the share of arrivals lost there)
    model_cost: float  # the truncated model's average cost: avg_cost, plus the charge for arrivals lost at N with
    # the plain truncation

    def to_dict(self) -> dict:
        return {k: float(getattr(self, k)) for k in MultiEvaluation.__dataclass_fields__}


class MultiSystem:
    """The model's fixed pieces over all states, and one policy's linear system."""

    def __init__(self, model: MultiServerSMDP, tail: bool = True, starts: tuple | None = None,
                 incomplete_from: int | None = None):
        """``starts``: (sizes, zeta, alpha, kind) of :meth:`_set_starts` where a caller keeps fewer kinds than sizes,
        else the model's own sizes; ``incomplete_from``: the previous truncation's :attr:`incomplete_from`, which a
        solve carries on (None: :data:`ILU_FROM`)."""
        p, N = model.problem, model.N
        self.model, self.N = model, N
        S = model.n_states
        self.n = np.tile(np.arange(N + 1), model.n_conf)
        self.conf = np.repeat(np.arange(model.n_conf), N + 1)
        self.idle = model.idle[self.conf]
        self.lam = p.lam
        self.sizes = np.asarray(p.batch_sizes, dtype=np.int64)
        self.zeta = p.energy_mj()
        self.hold = (self.n + model.in_service[self.conf]) / p.lam  # W̄ rate per ms, before w1
        self.idle_w = model.idle_power_w * self.idle
        self.run_w = model.energy_rate[self.conf]  # the contention's power beyond ζ(b) at each start (W)
        cont = p.contention
        self.s_c = float(cont.slow(p.instances, p.bmax)) if cont is not None else 1.0  # all busy with Bmax
        self.e_c = float(cont.energy_factor(p.instances, p.bmax)) if cont is not None else 1.0
        # an arrival lost at n = N costs the latency it would have had, over-estimated as twice the time to drain
        # N + c·Bmax requests at the full rate: losing requests must never pay (it would at no cost)
        c, bmax, self.l_bmax = p.instances, p.bmax, float(p.latency_ms()[-1]) * self.s_c  # l(Bmax) at c busy
        self.loss_ms = 2.0 * (N + c * bmax) * self.l_bmax / (c * bmax)
        self.tail = tail
        # SuperLU's column ordering: minimum degree on A + Aᵀ keeps the fill least when each batch is one phase
        # or parallel branches, but it takes 10–40× longer than COLAMD (similar fill) once Erlang phases chain
        # (measured: c = 2, six sizes, Erlang-2, 26 299 states: 47 s against 1.1 s), and past about 21 000 states
        # with one phase too (whole solves, exponential times: c = 3, six sizes, ρ 0.8, 36 372 states: 34.5 s
        # against 7.9 s; c = 8, sizes 16, 32, from 23 085 states: 2.3–2.6 s against 1.1–1.5 s; c = 2, sizes 1..32,
        # ρ 0.5, 162 129 states: 128 s against 53 s; up to 20 195 states it was as fast or faster: c = 4, sizes 8,
        # 16, 32: 0.6–0.8 s against 1.4–2.1 s).  A time-based choice would make the digits depend on the machine.
        self.permc = "COLAMD" if np.any(model.ph.moves) or S >= COLAMD_FROM else "MMD_AT_PLUS_A"
        self._lu, self._lu_act = None, None  # the last policy factorised (see _solve)
        #: from how many states a policy's system gets incomplete factors: :data:`ILU_FROM`, or :data:`DENSE_FROM`
        #: once a complete factorisation filled densely (a solve carries it on to its next truncation)
        self.incomplete_from = ILU_FROM if incomplete_from is None else incomplete_from
        #: the last policy evaluated: the time share of each waiting state × its event rate, and each start's rate
        self.visits = np.zeros(S)
        self.cost_rate = p.w1 * self.hold + p.w2 * (self.idle_w + self.run_w)
        if not tail:
            self.cost_rate = self.cost_rate + np.where(self.n == N, p.w1 * self.loss_ms, 0.0)
        self.arr = self.n < N
        self.q = self.lam * (self.arr | tail) + model.out_rate[self.conf]
        self.top = np.nonzero(self.n == N)[0]
        self._tail_terms(p, model.ph)
        src, dst, rate = model.events
        levels = np.arange(N + 1)[None, :]
        rows = model.state(levels, src[:, None]).ravel()
        cols = model.state(levels, dst[:, None]).ravel()
        vals = np.repeat(rate, N + 1)
        self.E = sp.csr_matrix((vals, (rows, cols)), shape=(S, S))
        self._set_starts(*(starts or (self.sizes, self.zeta, model.ph.alpha, np.arange(self.sizes.size))))

    def _set_starts(self, sizes: np.ndarray, zeta: np.ndarray, alpha: np.ndarray, kind: np.ndarray) -> None:
        """The policy's starts: action i + 1 takes ``sizes[i]`` requests off the queue, costs w2·``zeta[i]`` (mJ)
        and puts a batch on an idle instance as the model's size ``kind[i]`` in phase j with probability
        ``alpha[i, j]``.  The model's own sizes (kind = 0..A − 1) unless a caller keeps fewer kinds than sizes
        (:mod:`.multi_bound`, through the constructor's ``starts``)."""
        model = self.model
        S, m = model.n_states, model.ph.phases
        self.sizes, self.zeta, self.alpha = np.asarray(sizes, dtype=np.int64), np.asarray(zeta), np.asarray(alpha)
        self.cost_lump = model.problem.w2 * self.zeta
        # next state of each start: start[conf, kind, j] configuration at n − b (−1 where infeasible)
        nxt = np.full((S, self.sizes.size, m), -1, dtype=np.int64)
        for i, (b, k) in enumerate(zip(self.sizes, kind)):
            ok = (self.idle > 0) & (self.n >= b)
            st = model.start[self.conf[ok], k, :]
            nxt[ok, i, :] = np.where((st >= 0) & (self.alpha[i] > 0), model.state((self.n[ok] - b)[:, None], st),
                                     -1)
        self.next = nxt
        self.feasible = np.concatenate([(~((self.n == self.N) & (self.idle > 0)) & (self.q > 0))[:, None],
                                        (nxt >= 0).any(axis=2)], axis=1)

    def _tail_terms(self, p: BatchingProblem, ph: PhaseType) -> None:
        """The tail boundary: above N every instance serves Bmax, so the queue moves up by arrivals (rate λ) and
        down by Bmax at each completion (c renewal processes of mean l(Bmax) and squared CV cv²).  Its bias is

            h(n, running batches σ₁..σ_c) = a·n² + (b(g) + Σ_i φ(σ_i))·n + (terms constant in n) + …

        where the terms dropped die out geometrically in n.  With drift d = c·Bmax/l(Bmax) − λ and variance rate
        σ² = λ + Bmax²·c·cv²/l(Bmax), a = κ₁/(2d) and b = (κ₀ + a·σ² − g)/d for a cost rate κ₁·n + κ₀.  φ(σ) =
        −2a·Bmax·D(σ) is what the batch running on an instance (size and phase σ) adds to the slope: the
        instance's expected completions by time t are t/l(Bmax) + D(σ) + o(1), D(σ) = 1 − m(σ)/l(Bmax) + (cv² −
        1)/2 with m(σ) the batch's mean time left (renewal theory: 0 on average over an equilibrium renewal
        process), and each completion ahead leaves the queue Bmax shorter for the rest of the excursion, which
        the quadratic prices at 2a per request and per level.  An arrival at n = N (every instance busy there)
        goes to h(N) + a(2N + 1) + b + Σ_i φ(σ_i): ``delta_w_at`` (per state, read at n = N; ``delta_w_base``
        without φ), ``delta_p`` and ``delta_t`` are that step for W̄ (κ₁ = 1/λ, κ₀ = c·Bmax/λ), for P̄ (κ₀ =
        c·ζ(Bmax)/l(Bmax)) and for time (κ₀ = 1), without g.

        Without φ the step took no account of which batches run at N, an error that shrinks only as the mass at
        N does: with two instances at ρ 0.9 (sizes 1, 2, 4, 8, 16, 32, exponential) ĝ at N = 128 was 2.3·10⁻⁴
        from its limit, 2·10⁻⁷ with φ; with hyperexponential times, 4.5·10⁻⁴ at N = 256 against 4·10⁻¹¹.  Both
        converge to the same limit (tested).  With contention every instance above N runs at level c: l(Bmax)
        and ζ(Bmax) become s_c·l(Bmax), e_c·ζ(Bmax), and each size's phases run at 1/s_c(b)."""
        c, B = p.instances, p.bmax
        lB, zB = self.l_bmax, float(self.zeta[-1]) * self.e_c  # at c busy: s_c·l(Bmax), e_c·ζ(Bmax)
        m1, m2 = ph.moments()
        self.cv2 = float(m2[-1]) / float(m1[-1]) ** 2 - 1.0
        self.d = c * B / lB - self.lam
        sigma2 = self.lam + B * B * c * self.cv2 / lB
        self.a_w = a_w = 1.0 / (2.0 * self.lam * self.d)
        phi = np.concatenate([[0.0], self.slope_shift(ph, self.sizes).ravel()])  # by symbol: 0 idle, 1 + i·m + j
        self.delta_w_base = a_w * (2 * self.N + 1) + (c * B / self.lam + a_w * sigma2) / self.d  # without φ
        self.delta_w_at = self.delta_w_base + phi[self.model.configs].sum(axis=1)[self.conf]
        self.delta_p = c * zB / lB / self.d
        self.delta_t = 1.0 / self.d
        self.tail_rates = (c, c * B / lB, c / lB)  # busy instances, requests and batches per ms above N
        self.delta_at = p.w1 * self.delta_w_at + p.w2 * self.delta_p

    def slope_shift(self, ph: PhaseType, sizes: np.ndarray) -> np.ndarray:
        """φ(σ) of :meth:`_tail_terms` for W̄ (before w1), (A, m): a batch of each of ``sizes`` (whose batch times
        ``ph`` gives, row by row) running in each phase, with every instance busy."""
        p = self.model.problem
        speed = (1.0 / p.contention.slow(p.instances, np.asarray(sizes)) if p.contention is not None
                 else np.ones(len(sizes)))
        D = 1.0 - ph.time_left(speed) / self.l_bmax + 0.5 * (self.cv2 - 1.0)
        return -2.0 * self.a_w * p.bmax * D

    def matrix(self, act: np.ndarray) -> tuple[sp.csc_matrix, np.ndarray]:
        """The policy's system (column s₀ carries g) and its right-hand side."""
        S = self.model.n_states
        wait = act == 0
        ws = np.nonzero(wait)[0]
        parts = [(ws, ws, self.q[ws])]
        a_ok = ws[self.arr[ws]]
        parts.append((a_ok, a_ok + 1, np.full(a_ok.size, -self.lam)))
        coo = self.E[ws].tocoo()
        parts.append((ws[coo.row], coo.col, -coo.data))
        ds = np.nonzero(~wait)[0]
        parts.append((ds, ds, np.ones(ds.size)))
        i = act[ds] - 1
        for j in range(self.alpha.shape[1]):
            pj = self.alpha[i, j]
            use = pj > 0
            parts.append((ds[use], self.next[ds, i, j][use], -pj[use]))
        gcoef = np.ones(ws.size)
        rhs = np.where(wait, self.cost_rate, 0.0)
        if self.tail:  # an arrival at N steps to h(N) + Δ − g/d (the tail boundary)
            top = ws[self.n[ws] == self.N]
            parts.append((top, top, np.full(top.size, -self.lam)))
            gcoef = np.where(self.n[ws] == self.N, 1.0 + self.lam / self.d, 1.0)
            rhs[top] += self.lam * self.delta_at[top]
        r, c, v = (np.concatenate(x) for x in zip(*parts))
        v = np.where(c == 0, 0.0, v)  # h(s₀) = 0: its column carries g instead
        r = np.concatenate([r, ws])
        c = np.concatenate([c, np.zeros(ws.size, dtype=np.int64)])
        v = np.concatenate([v, gcoef])
        M = sp.csc_matrix((v, (r, c)), shape=(S, S))
        rhs[ds] = self.cost_lump[act[ds] - 1]
        return M, rhs

    def action_values(self, h: np.ndarray, g: float) -> np.ndarray:
        """(S, A + 1): each state's value of waiting (column 0) and of starting each size, +∞ where infeasible."""
        S = self.model.n_states
        A = self.sizes.size
        vals = np.full((S, A + 1), np.inf)
        up = np.where(self.arr, np.roll(h, -1), 0.0) * self.lam
        if self.tail:
            up[self.top] = self.lam * (h[self.top] + self.delta_at[self.top] - g / self.d)
        with np.errstate(divide="ignore", invalid="ignore"):
            w = (self.cost_rate - g + up + self.E @ h) / self.q
        vals[:, 0] = np.where(self.feasible[:, 0], w, np.inf)
        for i in range(A):
            tgt = self.next[:, i, :]
            ok = self.feasible[:, i + 1]
            ev = (self.alpha[i][None, :] * np.where(tgt >= 0, h[np.maximum(tgt, 0)], 0.0)).sum(axis=1)
            vals[:, i + 1] = np.where(ok, self.cost_lump[i] + ev, np.inf)
        return vals

    def improve(self, act: np.ndarray, h: np.ndarray, g: float) -> np.ndarray:
        """One Bellman step: every state's best action, keeping the current one unless another beats it."""
        S = self.model.n_states
        vals = self.action_values(h, g)
        best = np.argmin(vals, axis=1)
        cur = vals[np.arange(S), act]
        keep = cur <= vals[np.arange(S), best] + 1e-12 * (1.0 + abs(g))
        return np.where(keep, act, best)

    def _solve(self, act: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
        """(x, y): the policy's system M x = rhs (x₀ = g, the rest h) and Mᵀ y = e₀ (y: the time share of each
        waiting state and the rate of each start).  Where ``act`` differs from the last policy factorised in at
        most :data:`REUSE_SHARE` of the states (and its factors are large), M is that policy's matrix plus a change
        of low rank, so GMRES preconditioned by its LU factors converges in a few iterations (measured: 6–24 at
        2–2 271 changed states of 162 129); each answer is kept only if its residual is below
        :data:`REUSE_RESIDUAL` of its right-hand side (max norm), else the policy is factorised afresh.  A
        factorisation costs 1–17 s at 10⁵ states, a GMRES iteration two triangular solves (20–60 ms)."""
        M, rhs = self.matrix(act)
        S = M.shape[0]
        e0 = np.zeros(S)
        e0[0] = 1.0
        incomplete = S >= self.incomplete_from
        if self._lu is not None and (S >= ILU_REUSE_FROM if incomplete else self._lu.nnz >= REUSE_MIN_NNZ) and \
                np.count_nonzero(act != self._lu_act) <= REUSE_SHARE * S:
            lu = self._lu
            budget = ILU_REUSE_ITERATIONS if incomplete else min(REUSE_ITERATIONS, max(REUSE_FLOOR,
                                                                                       int(lu.nnz / S / 2)))
            xy = _preconditioned_pair(M, rhs, e0, lu, budget)
            if xy is not None:
                return xy
        self._lu = self._lu_act = lu = None  # the old factors (also held here, by lu) go before new ones are made
        if incomplete:
            Mc = M.tocsc()
            for extra in ILU_TRIES:
                try:
                    lu = spilu(Mc, **{"drop_tol": ILU_DROP, "fill_factor": ILU_FILL, "permc_spec": "COLAMD", **extra})
                except RuntimeError:  # a zero pivot in the incomplete factors: the next try
                    continue
                xy = _preconditioned_pair(M, rhs, e0, lu, ILU_ITERATIONS)
                if xy is not None:
                    self._lu, self._lu_act = lu, act.copy()
                    return xy
            lu = None
        lu = splu(M, permc_spec=self.permc)
        if lu.nnz > DENSE_FILL * S:
            self.incomplete_from = min(self.incomplete_from, DENSE_FROM)
        self._lu, self._lu_act = lu, act.copy()
        return lu.solve(rhs), lu.solve(e0, trans="T")

    def evaluate(self, act: np.ndarray) -> tuple[float, np.ndarray, MultiEvaluation]:
        x, y = self._solve(act)
        g = float(x[0])
        h = x.copy()
        h[0] = 0.0
        wait = act == 0
        t = np.where(wait, y, 0.0)
        starts = np.where(wait, 0.0, y)
        i = np.maximum(act - 1, 0)
        bound = float(t[self.n == self.N].sum())
        at_top = self.lam * bound if self.tail else 0.0  # rate of steps into the tail, per ms
        lam_in = self.lam * (1.0 - (0.0 if self.tail else bound))
        tail_w = self.lam * float(t[self.top] @ self.delta_w_at[self.top]) if self.tail else 0.0
        W = (float(t @ self.hold) + tail_w) * self.lam / lam_in
        idle_p = float(t @ self.idle_w)
        P = float(starts @ self.zeta[i]) + idle_p + float(t @ self.run_w) + at_top * self.delta_p
        tb, tr, tn = (x * at_top * self.delta_t for x in self.tail_rates)
        rate = float(starts.sum()) + tn
        thr = float(starts @ self.sizes[i]) + tr
        busy = float(t @ (self.model.problem.instances - self.idle)) + tb
        p = self.model.problem
        ev = MultiEvaluation(p.w1 * W + p.w2 * P, W, P, idle_p, thr / rate if rate > 0 else 0.0, thr, busy, bound, g)
        self.visits = np.where(wait, y * self.q, y)
        return g, h, ev

    def metrics(self, act: np.ndarray) -> MultiEvaluation:
        """The policy's exact metrics (:meth:`evaluate`'s), leaving :attr:`visits` those of the policy evaluated
        before: a table priced beside the optimum does not replace the optimum's visit rates."""
        saved = self.visits
        try:
            return self.evaluate(act)[2]
        finally:
            self.visits = saved


#: The incomplete factorisations tried in turn (SuperLU's ILUTP options), each until one factorises and GMRES
#: settles on it, before the complete one: the default drop rules, then the basic rule alone, then a finer drop
#: tolerance.  Measured: three instances, six sizes, ρ 0.8, 16 212 states: 6 of 13 policies' systems hit a zero
#: pivot with the first and none with the second (the same cost, 0.08 s against 2–3 s for the complete factors);
#: four instances, six sizes, ρ 0.7, 53 970 states: GMRES did not settle on one policy's first factors, whose
#: complete factors then took 22.6 s and 1.3 GB (1 293 entries a row).
ILU_TRIES: tuple[dict, ...] = ({}, {"drop_rule": "basic"}, {"drop_tol": ILU_DROP / 100})


def _preconditioned_pair(M: sp.spmatrix, rhs: np.ndarray, e0: np.ndarray, lu,
                         budget: int) -> tuple[np.ndarray, np.ndarray] | None:
    """(x, y) with M x = rhs and Mᵀ y = e0 by :func:`_preconditioned` on the factors ``lu`` (another policy's, or
    incomplete), each within ``budget`` iterations; None when either does not settle."""
    x = _preconditioned(M, rhs, lambda v: lu.solve(v), budget)
    y = None if x is None else _preconditioned(M.T.tocsr(), e0, lambda v: lu.solve(v, trans="T"), budget)
    return None if x is None or y is None else (x, y)


def _preconditioned(M: sp.spmatrix, b: np.ndarray, solve, budget: int) -> np.ndarray | None:
    """M x = b by GMRES with ``solve`` (another policy's LU factors, or incomplete ones) as right preconditioner
    (:func:`~.krylov.gmres_cycle`: its residual is the true one), restarted every :data:`REUSE_RESTART` and checked
    on the true residual after each cycle; None when ``budget`` iterations in all leave it above
    :data:`REUSE_RESIDUAL` of ‖b‖∞."""
    goal = REUSE_RESIDUAL * float(np.max(np.abs(b)))
    x, r, used, basis = np.zeros(M.shape[0]), b, 0, Basis()
    while used < budget:
        y, k = gmres_cycle(lambda v: M @ solve(v), r, 0.5 * goal, min(REUSE_RESTART, budget - used), basis)
        dx = solve(y)
        if not np.all(np.isfinite(dx)):
            return None
        x = x + dx
        r = b - M @ x
        if float(np.max(np.abs(r))) <= goal:
            return x
        used += max(k, 1)
    return None


def table_policy(sysm: MultiSystem, table: np.ndarray) -> np.ndarray:
    """The state policy of a table n ↦ b (b = 0 waits) run on c instances: start table[n] while an instance is
    idle; at the truncation an idle instance serves the largest size.  A busy-aware table (2-D, row k for k
    instances busy, k = 0..c−1) starts table[k, n]."""
    sizes = list(sysm.sizes)
    t = np.asarray(table, dtype=np.int64)
    if t.ndim == 2:
        c = sysm.model.problem.instances
        if t.shape[0] != c:
            raise InputError(f"a busy-aware table has one row per busy count 0..{c - 1}: {c} rows, got {t.shape[0]}")
        b = t[np.minimum(c - sysm.idle, c - 1), np.minimum(sysm.n, t.shape[1] - 1)]
    else:
        b = t[np.minimum(sysm.n, t.size - 1)]
    bad = [x for x in np.unique(b) if x != 0 and x not in sizes]
    if bad:
        raise InputError(f"the table starts a batch of {bad[0]}, not an allowed size {sizes[0]}..{sizes[-1]}")
    if np.any((b > sysm.n)):
        raise InputError("the table starts a batch larger than the queue at some n")
    idx = np.searchsorted(sysm.sizes, b) + 1
    act = np.where((b > 0) & (sysm.idle > 0), idx, 0)
    forced = (sysm.n == sysm.N) & (sysm.idle > 0) & (act == 0)
    return np.where(forced, sysm.sizes.size, act)


def table_rows(problem: BatchingProblem, table, boundary: str) -> np.ndarray:
    """``table`` as an integer array, 1-D (n ↦ b) or 2-D ((busy count, n) ↦ b), checked: the tail boundary serves
    Bmax above the truncation, so there the table must end in Bmax."""
    t, got = as_rows(table)
    if t.ndim not in (1, 2) or t.size == 0:
        raise InputError(f"a table is 1-D (n ↦ b) or 2-D (busy count, n) ↦ b, got {got}")
    ends = np.unique(t[..., -1])
    if boundary == "tail" and not np.array_equal(ends, [problem.bmax]):
        raise InputError(f"the tail boundary serves Bmax = {problem.bmax} above the truncation, but this table ends in "
                         f"{int(ends[ends != problem.bmax][0])}: evaluate it with boundary='loss' and a long n_max")
    return t
