"""Policy iteration and exact metrics for c instances sharing one queue (:mod:`smdp_batch.model.multi_server`).

One policy's average cost g and bias h solve, with h(s₀) = 0 at s₀ = (n = 0, every instance idle),

* a state where it waits:      q(s)·h(s) − Σ_{s'} r(s, s')·h(s') + g = cost rate(s)        (rates in 1/ms)
* a state where it starts b:   h(s) − Σ_j α_b[j]·h(s after b starts in phase j) = w2·ζ(b)

(the semi-Markov equation h = c − g·τ + P·h of paper 004 eq. 20, multiplied by q(s) where the sojourn is
exponential, and with τ = 0 for the instantaneous start of a batch).  One sparse LU factorises it; the
transposed solve with the unit vector at s₀ gives ∂g/∂(cost of s): the share of time in each waiting state and
the rate of each start, hence W̄, P̄ and the mean batch.  Policy iteration improves every state's action by one
Bellman step and stops when no action improves by more than 1e-12·(1 + |g|).

**The tail boundary** (default).  Above the truncation N every instance serves Bmax, so the queue is a random
walk: up by arrivals, down by Bmax at each completion.  Its bias is quadratic in n up to terms that die out
geometrically (as for one server, paper 004 eq. 20 with the tail boundary of
:mod:`smdp_batch.model.truncation`), so an arrival at N steps to h(N) plus that quadratic's increment
(:meth:`_System._tail_terms`), and the metrics add the tail's share in closed form (throughput = λ exactly).
N grows by half from 2·c·Bmax until two truncations' costs agree within ``tol``; at ρ 0.9 a few hundred levels
suffice where arrivals lost at N need thousands.  ``boundary="loss"`` keeps the plain truncation instead.

:func:`solve_instances` returns a :class:`MultiSolution`: the optimal policy on (n, running batches), its exact
metrics, and the table n ↦ b that the runtime batcher, the simulator and the servers can follow (at each n
the start the optimal policy makes most often among states with an idle instance, searched further where that
is more than 0.1 % above the optimum: :func:`_refine_table`), evaluated exactly too; and, where it is more than
0.1 % below that table, the busy-aware table (k busy, n) ↦ b that smdp-batch's runtime follows
(:func:`_busy_table`; under contention, where starting beside running batches slows them all).

**Contention** (``problem.contention``): the model's rates and power (:mod:`smdp_batch.model.multi_server`); above
N every instance is busy, so the tail runs at s_c·l(Bmax) and e_c·ζ(Bmax).
"""

from __future__ import annotations

import math
import time
from dataclasses import dataclass, field

import numpy as np
import scipy.sparse as sp
from scipy.sparse.linalg import LinearOperator, gmres, splu

from ..errors import InputError, NotConvergedWarning, warn_not_converged
from ..model.multi_server import MultiServerSMDP, PhaseType, check_max_states, check_multi_size, phase_type
from ..model.problem import BatchingProblem
from ..specs.rows import as_rows

__all__ = ["MultiSolution", "MultiEvaluation", "solve_instances", "evaluate_instances_table"]

PI_ITER_LIMIT = 200
#: From this many states the LU factorisation orders columns by COLAMD (see :class:`_System`).
COLAMD_FROM = 21_000
#: A policy that differs from the last one factorised in at most this share of its states is solved by GMRES
#: preconditioned with that factorisation (:meth:`_System._solve`), where the factors hold at least
#: :data:`REUSE_MIN_NNZ` non-zeros: smaller ones are remade faster than GMRES settles (c = 8, sizes 16, 32: 0.9–1.5·10⁶
#: non-zeros, 0.05 s a factorisation against 0.2 s of GMRES; c = 2, every size: 0.8–5·10⁷, 1–17 s).
REUSE_SHARE = 0.03
REUSE_MIN_NNZ = 4_000_000
#: GMRES's iterations there (one restart cycle) before the policy is factorised afresh.
REUSE_ITERATIONS = 60
#: The largest residual (max norm, relative to the right-hand side's) a GMRES answer may keep.
REUSE_RESIDUAL = 1e-13


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


@dataclass(frozen=True)
class MultiSolution:
    """The optimal policy for c instances sharing one queue, and the table n ↦ b that servers can follow.

    ``policy[conf, n]`` is 0 (wait) or the index + 1 of the size started in state (n, configuration ``conf`` of
    ``model.configs``); ``table[n]`` the size the runtime starts at queue length n while an instance is idle (0:
    wait; past its end the last entry).  ``optimal`` and ``table_eval`` are their exact metrics.
    """

    problem: BatchingProblem
    phase_law: str
    phases: int
    n_max: int
    configurations: int
    states: int
    iterations: int
    converged: bool
    optimal: MultiEvaluation
    table: np.ndarray
    table_eval: MultiEvaluation
    solve_time_s: float
    policy: np.ndarray = field(repr=False)
    model: MultiServerSMDP = field(repr=False)
    #: |ĝ(N) − ĝ(previous N)| / |ĝ(N)| of the last two truncations (NaN with a fixed ``n_max``)
    delta: float = math.nan
    #: R: the table serves table[R] at every n ≥ R, equals the previous truncation's table at 0..R, and N ≥ 2R
    #: (−1: not verified)
    agrees_upto: int = -1
    #: the table's relative values h(n) with every instance idle, n = 0..N (h(0) = 0)
    table_values: np.ndarray = field(repr=False, default_factory=lambda: np.zeros(0))
    #: the busy-aware table busy_table[k, n] (k = 0..c−1 instances busy, n = 0..N), which a runtime that counts
    #: its running batches can follow; None where it is not :data:`BUSY_GAIN` below ``table`` (see
    #: :func:`_busy_table`)
    busy_table: np.ndarray | None = field(repr=False, default=None)
    busy_eval: MultiEvaluation | None = None  # its exact metrics
    #: the last truncation's system, whose factorisation :meth:`price` reuses
    system: "_System | None" = field(repr=False, compare=False, default=None)

    def __getstate__(self) -> dict:
        """Pickled without its system (LU factors do not pickle, and a copy need not carry their memory)."""
        return {**self.__dict__, "system": None}

    def price(self, table) -> MultiEvaluation:
        """Exact metrics of a table n ↦ b (or busy-aware, (k, n) ↦ b) that ends in Bmax, on this solution's
        instances, batch-time law, idle power and truncation with the tail boundary: what
        :func:`evaluate_instances_table` gives with ``n_max=self.n_max`` (to round-off), the solve's last
        factorisation preconditioning it where the table's policy is close to the one it factorised."""
        sysm = self.system
        if sysm is None or not sysm.tail:
            raise InputError("this solution keeps no tail-boundary system to price tables on")
        t = _table_rows(self.problem, table, "tail")
        saved = sysm._visits
        try:
            return sysm.evaluate(table_policy(sysm, t))[2]
        finally:
            sysm._visits = saved

    def decide(self, n: int, busy: int | None = None) -> int:
        """The batch size at queue length n with an instance idle (0: wait): the busy-aware table's with ``busy``
        instances serving, where there is one and ``busy`` is given, else the table n ↦ b's."""
        if busy is not None and self.busy_table is not None:
            row = self.busy_table[min(max(int(busy), 0), self.busy_table.shape[0] - 1)]
            return int(row[min(int(n), row.size - 1)])
        return int(self.table[min(int(n), self.table.size - 1)])

    def to_dict(self) -> dict:
        return {
            "instances": self.problem.instances, "phase_law": self.phase_law, "phases": self.phases,
            "n_max": self.n_max, "configurations": self.configurations, "states": self.states,
            "iterations": self.iterations, "converged": self.converged, "optimal": self.optimal.to_dict(),
            "table": [int(x) for x in self.table], "table_eval": self.table_eval.to_dict(),
            "solve_time_s": self.solve_time_s, "delta": None if math.isnan(self.delta) else self.delta,
            "agrees_upto": self.agrees_upto,
            "busy_table": None if self.busy_table is None else [[int(x) for x in row] for row in self.busy_table],
            "busy_table_eval": None if self.busy_eval is None else self.busy_eval.to_dict(),
        }


class _System:
    """The model's fixed pieces over all states, and one policy's linear system."""

    def __init__(self, model: MultiServerSMDP, tail: bool = True):
        p, N = model.problem, model.N
        self.model, self.N = model, N
        S = model.n_states
        self.n = np.tile(np.arange(N + 1), model.n_conf)
        self.conf = np.repeat(np.arange(model.n_conf), N + 1)
        self.idle = model.idle[self.conf]
        self.lam = p.lam
        self.sizes = np.asarray(p.batch_sizes, dtype=np.int64)
        self.zeta = p.energy_mj()
        self.cost_lump = p.w2 * self.zeta
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
        A = self.sizes.size
        m = model.ph.phases
        # next state of each start: start[conf, i, j] configuration at n − b_i (−1 where infeasible)
        nxt = np.full((S, A, m), -1, dtype=np.int64)
        for i, b in enumerate(self.sizes):
            ok = (self.idle > 0) & (self.n >= b)
            st = model.start[self.conf[ok], i, :]
            nxt[ok, i, :] = np.where(st >= 0, model.state((self.n[ok] - b)[:, None], st), -1)
        self.next = nxt
        self.alpha = model.ph.alpha
        self.feasible = np.concatenate([(~((self.n == N) & (self.idle > 0)) & (self.q > 0))[:, None],
                                        (nxt >= 0).any(axis=2)], axis=1)

    def _tail_terms(self, p: BatchingProblem, ph: PhaseType) -> None:
        """The tail boundary: above N every instance serves Bmax, so the queue moves up by arrivals (rate λ) and
        down by Bmax at each completion (c renewal processes of mean l(Bmax) and squared CV cv²).  Its bias is
        h(n) = a·n² + b(g)·n + … (the terms dropped die out geometrically in n): with drift d = c·Bmax/l(Bmax) − λ
        and variance rate σ² = λ + Bmax²·c·cv²/l(Bmax), a = κ₁/(2d) and b = (κ₀ + a·σ² − g)/d for a cost rate
        κ₁·n + κ₀.  An arrival at n = N goes to h(N) + a(2N + 1) + b: ``delta_w``, ``delta_p``, ``delta_t`` are that
        step for W̄ (κ₁ = 1/λ, κ₀ = c·Bmax/λ), for P̄ (κ₀ = c·ζ(Bmax)/l(Bmax)) and for time (κ₀ = 1), without g.
        With contention every instance above N runs at level c: l(Bmax) and ζ(Bmax) become s_c·l(Bmax), e_c·ζ(Bmax)."""
        c, B = p.instances, p.bmax
        lB, zB = self.l_bmax, float(self.zeta[-1]) * self.e_c  # at c busy: s_c·l(Bmax), e_c·ζ(Bmax)
        m1, m2 = ph.moments()
        cv2 = float(m2[-1]) / float(m1[-1]) ** 2 - 1.0
        self.d = c * B / lB - self.lam
        sigma2 = self.lam + B * B * c * cv2 / lB
        a_w = 1.0 / (2.0 * self.lam * self.d)
        self.delta_w = a_w * (2 * self.N + 1) + (c * B / self.lam + a_w * sigma2) / self.d
        self.delta_p = c * zB / lB / self.d
        self.delta_t = 1.0 / self.d
        self.tail_rates = (c, c * B / lB, c / lB)  # busy instances, requests and batches per ms above N
        self.delta = p.w1 * self.delta_w + p.w2 * self.delta_p

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
            rhs[top] += self.lam * self.delta
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
            up[self.top] = self.lam * (h[self.top] + self.delta - g / self.d)
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
        if self._lu is not None and self._lu.nnz >= REUSE_MIN_NNZ and \
                np.count_nonzero(act != self._lu_act) <= REUSE_SHARE * S:
            lu = self._lu
            x = _preconditioned(M, rhs, lambda v: lu.solve(v))
            y = None if x is None else _preconditioned(M.T.tocsr(), e0, lambda v: lu.solve(v, trans="T"))
            if x is not None and y is not None:
                return x, y
        self._lu = self._lu_act = lu = None  # the old factors go before the new ones are made (memory)
        lu = splu(M, permc_spec=self.permc)
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
        W = (float(t @ self.hold) + at_top * self.delta_w) * self.lam / lam_in
        idle_p = float(t @ self.idle_w)
        P = float(starts @ self.zeta[i]) + idle_p + float(t @ self.run_w) + at_top * self.delta_p
        tb, tr, tn = (x * at_top * self.delta_t for x in self.tail_rates)
        rate = float(starts.sum()) + tn
        thr = float(starts @ self.sizes[i]) + tr
        busy = float(t @ (self.model.problem.instances - self.idle)) + tb
        p = self.model.problem
        ev = MultiEvaluation(p.w1 * W + p.w2 * P, W, P, idle_p, thr / rate if rate > 0 else 0.0, thr, busy, bound, g)
        self._visits = np.where(wait, y * self.q, y)
        return g, h, ev


def _preconditioned(M: sp.spmatrix, b: np.ndarray, solve) -> np.ndarray | None:
    """M x = b by GMRES preconditioned with ``solve`` (another policy's LU factors) and refined on the true
    residual, or None when :data:`REUSE_ITERATIONS` iterations in all leave it above :data:`REUSE_RESIDUAL` of
    ‖b‖∞."""
    S = M.shape[0]
    P = LinearOperator((S, S), matvec=solve, dtype=np.float64)
    goal = REUSE_RESIDUAL * float(np.max(np.abs(b)))
    x, r, used = np.zeros(S), b, [0]

    def count(_) -> None:
        used[0] += 1

    while used[0] < REUSE_ITERATIONS:  # GMRES stops on its preconditioned residual: refine on the true one
        before = used[0]
        dx, _ = gmres(M, r, M=P, rtol=0.01 * REUSE_RESIDUAL, atol=0.0, restart=REUSE_ITERATIONS - before,
                      maxiter=1, callback=count, callback_type="pr_norm")
        if not np.all(np.isfinite(dx)):
            return None
        x = x + dx
        r = b - M @ x
        if float(np.max(np.abs(r))) <= goal:
            return x
        used[0] = max(used[0], before + 1)
    return None


def _initial(sysm: _System) -> np.ndarray:
    """Start each idle instance on the largest size that fits the queue (greedy)."""
    act = np.zeros(sysm.model.n_states, dtype=np.int64)
    for i in range(sysm.sizes.size):
        act = np.where(sysm.feasible[:, i + 1], i + 1, act)
    return act


def _iterate(sysm: _System, act: np.ndarray) -> tuple[np.ndarray, MultiEvaluation, int, bool]:
    for it in range(1, PI_ITER_LIMIT + 1):
        g, h, ev = sysm.evaluate(act)
        new = sysm.improve(act, h, g)
        if np.array_equal(new, act):
            return act, ev, it, True
        act = new
    return act, ev, PI_ITER_LIMIT, False


def _extend(old: np.ndarray, n_old: int, sysm: _System) -> np.ndarray:
    """A policy of truncation n_old carried to the longer one (levels past n_old take level n_old's action)."""
    old = old.reshape(-1, n_old + 1)
    N = sysm.N
    act = old[:, np.minimum(np.arange(N + 1), n_old)].ravel()
    return np.where(sysm.feasible[np.arange(act.size), act], act, _initial(sysm))


def table_policy(sysm: _System, table: np.ndarray) -> np.ndarray:
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


def _most_started(sysm: _System, act: np.ndarray, visits: np.ndarray, group: np.ndarray,
                  groups: int) -> tuple[np.ndarray, np.ndarray]:
    """At each group of states (``group[s]`` in 0..groups − 1), the size ``act`` starts most often (weighted by
    the visit rates ``visits``, 0: wait) among its states with an idle instance, and whether the group is
    visited at all (more than 10⁻¹² of the visits)."""
    v = np.maximum(visits, 0.0)
    ok = sysm.idle > 0
    w = np.zeros((groups, sysm.sizes.size + 1))
    np.add.at(w, (group[ok], act[ok]), v[ok])
    choice = np.argmax(w, axis=1)
    return np.where(choice > 0, sysm.sizes[np.maximum(choice - 1, 0)], 0), w.sum(axis=1) > 1e-12 * v.sum()


def _project(sysm: _System, act: np.ndarray) -> np.ndarray:
    """At each n, the size the optimal policy starts most often (visits weighted) among states with an idle
    instance; levels it (almost) never visits take the all-idle state's action."""
    sizes, seen = _most_started(sysm, act, sysm._visits, sysm.n, sysm.N + 1)
    return np.where(seen, sizes, _idle_table(sysm, act))


#: Most evaluations :func:`_refine_table` spends improving the projected table.
TABLE_ROUNDS = 8
#: A projected table within this share of the optimum's cost is kept as it is (no search: one evaluation).
TABLE_CLOSE = 1e-3


def _table_choice(sysm: _System, act_t: np.ndarray, h: np.ndarray, g: float) -> np.ndarray:
    """The table's improvement step: at each n the action of least visit-weighted value Σ_s v(s)·Q(s, a) over the
    states at n with an idle instance, v the visit rates under the current table (a table sees n only)."""
    N, A = sysm.N, sysm.sizes.size
    vals = sysm.action_values(h, g)
    v = np.maximum(sysm._visits, 0.0)
    ok = sysm.idle > 0
    w = np.zeros((N + 1, A + 1))
    bad = np.zeros((N + 1, A + 1), dtype=bool)
    fin = np.isfinite(vals)
    np.add.at(w, sysm.n[ok], np.where(fin[ok], vals[ok], 0.0) * v[ok][:, None])
    np.logical_or.at(bad, sysm.n[ok], ~fin[ok])  # infeasible in some state at n: not a table's choice at n
    w[bad] = np.inf
    cur = np.where(act_t > 0, np.searchsorted(sysm.sizes, act_t) + 1, 0)
    best = np.argmin(w, axis=1)
    rows = np.arange(N + 1)
    seen = np.zeros(N + 1)
    np.add.at(seen, sysm.n[ok], v[ok])
    keep = (w[rows, cur] <= w[rows, best] + 1e-12 * (1.0 + abs(g)) * np.maximum(seen, 1e-300)) | (seen <= 0)
    keep[N] = True  # the truncation's row stays: the tail boundary serves Bmax above it
    choice = np.where(keep, cur, best)
    return np.where(choice > 0, sysm.sizes[np.maximum(choice - 1, 0)], 0)


def _idle_table(sysm: _System, act: np.ndarray) -> np.ndarray:
    """The optimal policy's start at each n with every instance idle (configuration 0)."""
    a = act[: sysm.N + 1]
    return np.where(a > 0, sysm.sizes[np.maximum(a - 1, 0)], 0)


def _refine_table(sysm: _System, table: np.ndarray, act: np.ndarray,
                  optimum: float) -> tuple[np.ndarray, float, np.ndarray, MultiEvaluation]:
    """The table n ↦ b servers follow, from the optimal policy ``act`` of cost ``optimum`` and its projection
    ``table`` (:func:`_project`, taken while the visit rates were the optimal policy's).

    A table sees n only, while the optimal policy also sees what the running batches are doing: where that
    matters (contention: starting beside running batches slows them all) no projection of it need be good.  The
    visit-weighted projection (:func:`_project`) is priced exactly and kept when within :data:`TABLE_CLOSE` of
    the optimum (without contention it is within 2·10⁻⁴ on the tests and benchmarks).  Else the optimal start
    with every instance idle is priced too, and the better one is improved by up to :data:`TABLE_ROUNDS`
    visit-weighted steps (:func:`_table_choice`), each kept only if its exact cost is lower.  Returns (table, g,
    h, evaluation)."""
    close = optimum + TABLE_CLOSE * abs(optimum)
    g, h, ev = sysm.evaluate(table_policy(sysm, table))
    best = (table, g, h, ev, sysm._visits)
    idle = _idle_table(sysm, act)
    if ev.model_cost > close and not np.array_equal(idle, table):
        g, h, ev = sysm.evaluate(table_policy(sysm, idle))
        if ev.model_cost < best[3].model_cost:
            best = (idle, g, h, ev, sysm._visits)
    for _ in range(TABLE_ROUNDS if best[3].model_cost > close else 0):
        new = _table_choice(sysm, best[0], best[2], best[1])
        if np.array_equal(new, best[0]):
            break
        g, h, ev = sysm.evaluate(table_policy(sysm, new))
        if not ev.model_cost < best[3].model_cost * (1 - 1e-12):
            break
        best = (new, g, h, ev, sysm._visits)
    sysm._visits = best[4]
    return best[0], best[1], best[2], best[3]


#: A busy-aware table is kept only when its exact cost is this share below the table n ↦ b's.
BUSY_GAIN = 1e-3


def _busy_table(sysm: _System, act: np.ndarray, visits: np.ndarray, table: np.ndarray,
                table_cost: float) -> tuple[np.ndarray | None, MultiEvaluation | None]:
    """The busy-aware table (k, n) ↦ b, k = 0..c−1 instances busy: at each (k, n) the start the optimal policy
    ``act`` makes most often (``visits``: its visit rates) among its states with k busy; cells it never visits
    take ``table[n]``.  Priced exactly and returned only when :data:`BUSY_GAIN` below ``table_cost`` (the table
    n ↦ b), else (None, None): without contention a table that sees n alone is within 10⁻⁴ of the optimum, and
    under it starting beside running batches slows them all, which only a rule that sees k can weigh."""
    c, N = sysm.model.problem.instances, sysm.N
    if c < 2:
        return None, None
    sizes, seen = _most_started(sysm, act, visits, (c - sysm.idle) * (N + 1) + sysm.n, c * (N + 1))
    busy = np.where(seen, sizes, np.tile(np.asarray(table, dtype=np.int64), c)).reshape(c, N + 1)
    busy[:, N] = np.asarray(table)[N]  # the truncation's column: the tail boundary serves Bmax above it
    if np.all(busy == busy[0]):
        return None, None
    saved = sysm._visits
    ev = sysm.evaluate(table_policy(sysm, busy))[2]
    sysm._visits = saved
    if not ev.model_cost < table_cost - BUSY_GAIN * abs(table_cost):
        return None, None
    return busy, ev


def n_start(problem: BatchingProblem) -> int:
    """The first queue truncation N of a solve: 2·c·Bmax (at least 16·c)."""
    return int(max(2 * problem.bmax, 16) * max(1, problem.instances))


def solve_instances(problem: BatchingProblem, *, phases: int | None = None, idle_power_w: float = 0.0,
                    n_max: int | None = None, tol: float = 1e-7, boundary: str = "tail",
                    throw: bool = True, max_states: int | None = None) -> MultiSolution:
    """The optimal batching policy for ``problem.instances`` = c instances sharing one queue.

    ``phases``: Erlang order for a deterministic law (see :func:`~smdp_batch.model.multi_server.phase_type`);
    ``idle_power_w``: power of an idle instance (W); ``n_max``: a fixed queue truncation, else it grows from
    2·c·Bmax by half until two truncations' average costs agree within ``tol`` (relative).  ``boundary``:
    ``"tail"`` (the queue above N served by Bmax on every instance, its bias in closed form) or ``"loss"``
    (arrivals at N lost and charged; the plain truncation the tests check against independent solves).
    ``throw``: raise :class:`NotConvergedWarning` as an error when policy iteration or the truncation did not
    converge (else warn and return it with ``converged`` False).  ``max_states``: the most states a truncation may
    have, raised past :data:`~smdp_batch.model.multi_server.MULTI_STATE_LIMIT` on purpose (None: that limit and
    the work limit).
    """
    max_states = check_max_states(max_states)
    if not (isinstance(tol, float) and 0 < tol < 1):
        raise InputError(f"tol must be a number in (0, 1), got {tol!r}")
    if boundary not in ("tail", "loss"):
        raise InputError(f"boundary must be 'tail' or 'loss', got {boundary!r}")
    t0 = time.perf_counter()
    ph: PhaseType = phase_type(problem, phases)
    fixed = n_max is not None
    N = n_start(problem) if n_max is None else int(n_max)
    act, n_old, total, why, prev, table, before = None, N, 0, "", None, None, None
    last: tuple[_System, np.ndarray, float] | None = None  # the previous truncation: system, optimum, its cost
    while True:
        sysm = _System(MultiServerSMDP(problem, ph, N, idle_power_w, max_states), tail=boundary == "tail")
        act = _initial(sysm) if act is None else _extend(act, n_old, sysm)
        act, ev, its, ok = _iterate(sysm, act)
        total += its
        if not ok:
            why = f"policy iteration did not settle in {PI_ITER_LIMIT} iterations"
            break
        before, table = table, _project(sysm, act)
        if fixed or (prev is not None and abs(ev.model_cost - prev) <= tol * abs(ev.model_cost)):
            break
        moved = math.inf if prev is None else abs(ev.model_cost - prev) / abs(ev.model_cost)
        last = (sysm, act, ev.model_cost)
        prev, n_old, N = ev.model_cost, N, N + max(N // 2, problem.bmax)
        try:
            check_multi_size(problem, ph, N, max_states)
        except InputError as e:
            why = (f"the average cost still moves by {moved:.2g} at N = {n_old} (tolerance {tol:.2g}), and a longer "
                   f"truncation is refused ({e})")
            N = n_old
            break
    converged = not why
    if not converged:
        msg = f"the {problem.instances}-instance solve did not converge: {why}"
        if throw:
            raise NotConvergedWarning(msg)
        warn_not_converged(msg)
        before = None
    projected = _project(sysm, act)
    visits = sysm._visits
    table, _, h, tev = _refine_table(sysm, projected, act, ev.model_cost)
    busy, bev = _busy_table(sysm, act, visits, table, tev.model_cost)
    if before is not None and last is not None and not np.array_equal(table, projected):
        s, a, o = last  # the tables compared across truncations are the ones servers follow
        before = _refine_table(s, _project(s, a), a, o)[0]
    delta, upto = math.nan, -1
    if prev is not None and before is not None:
        delta = abs(ev.model_cost - prev) / abs(ev.model_cost)
        changes = np.nonzero(table[1:] != table[:-1])[0]
        onset = int(changes[-1]) + 1 if changes.size else 0  # the table is constant from here on
        if onset <= min(N // 2, before.size - 1) and np.array_equal(before[: onset + 1], table[: onset + 1]):
            upto = onset
    return MultiSolution(problem, ph.how, ph.phases, N, sysm.model.n_conf, sysm.model.n_states, total, converged, ev,
                         table, tev, time.perf_counter() - t0, act.reshape(-1, N + 1), sysm.model, delta, upto,
                         h[: N + 1].copy(), busy, bev, sysm)


def evaluate_instances_table(problem: BatchingProblem, table, *, phases: int | None = None,
                             idle_power_w: float = 0.0, n_max: int | None = None,
                             boundary: str = "tail", max_states: int | None = None) -> MultiEvaluation:
    """Exact metrics of a table n ↦ b run on ``problem.instances`` instances sharing the queue (the runtime's and
    the simulator's rule: start table[n] whenever an instance is idle; a busy-aware table, 2-D with row k for k
    instances busy: table[k, n]); ``boundary`` and ``max_states`` as in :func:`solve_instances`, whose tail
    boundary serves Bmax above N (the table's own long-queue action when it ends in Bmax)."""
    max_states = check_max_states(max_states)
    if boundary not in ("tail", "loss"):
        raise InputError(f"boundary must be 'tail' or 'loss', got {boundary!r}")
    t = _table_rows(problem, table, boundary)
    ph = phase_type(problem, phases)
    N = max(n_start(problem), t.shape[-1]) if n_max is None else int(n_max)
    sysm = _System(MultiServerSMDP(problem, ph, N, idle_power_w, max_states), tail=boundary == "tail")
    return sysm.evaluate(table_policy(sysm, t))[2]


def _table_rows(problem: BatchingProblem, table, boundary: str) -> np.ndarray:
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
