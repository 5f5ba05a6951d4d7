"""One policy's exact system under exponential batch times: the bias by forward solves, every metric by one
adjoint solve (paper 004 eqs. 20–21; the model and kernels are :mod:`.geometric`'s).

**Forward.**  The exact bias system A·x = f (x = h with x[ref] = ĝ, h(ref) = 0) is (T) plus a low-rank change at
the ~one row per batch size where the action changes.  GMRES (:mod:`.krylov`) solves it with (T) as right preconditioner
— (T) is B, its row and column ref the identity's, plus a rank-2 border (Woodbury), and B's LU without pivoting
is :func:`~.geometric._sweep` — and every evaluation is certified by the residual of the untransformed equations
(eq. 20).  The residual falls about a decade per 8 iterations at Bmax 1 024, ρ = 0.9.

**Adjoint.**  The gain of any cost is x[ref] = e_refᵀA⁻¹f = z·f with Aᵀz = e_ref: one solve gives the gains of every
cost vector (z is the policy's stationary law in the system's scaling).  GMRES solves it with the transposed
preconditioner: Bᵀ reversed, C = J·Bᵀ·J, has again one super-diagonal and lower entries only (one per row on
average; :func:`_transposed`), so it is a nonsingular M-matrix factored by the same sweep, and the border's
transpose is a Woodbury update again.  At Bmax 1 024, ρ = 0.9: about 95 iterations, against 85–108 for each of
the four forward solves it replaces.  Which metrics it serves is :func:`metrics`'s choice.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Callable

import numpy as np

from ..errors import InputError
from .geometric import (Costs, GeometricModel, _effective_up, _end_windows, _flush_small, _matvec, _pivots, _q_full,
                        _q_pass, _ranges, _rhs, _rmatvec, _rows, _sweep)
from .geometric_sums import window_scatter, window_sums
from .krylov import Basis, gmres_cycle

__all__ = ["Stationary", "evaluate", "metrics", "stationary"]

#: GMRES tolerances: rough while a tenth of the states still change, loose while the policy still moves
#: (inexact policy iteration), tight to finish.
ROUGH, LOOSE, TIGHT = 1e-5, 1e-7, 1e-12
#: GMRES's first restart length and its longest (Krylov vectors kept: MAX_RESTART × S floats at most; the
#: krylov module's figures).
RESTART, MAX_RESTART = 20, 60
#: An evaluation is accepted when eq. 20's residual, relative to 1 + max|h|, is below this.
RESIDUAL_TOL = 1e-9
#: An adjoint (stationary) solve is accepted when ‖e_ref − Aᵀz‖ is below this; GMRES aims at ADJOINT_RTOL (at
#: Bmax 1 024, ρ = 0.9: 90 iterations against 98 for 1e-12, the gains the same to 1e-13).
ADJOINT_TOL, ADJOINT_RTOL = 1e-10, 1e-11


def _lower(lc: np.ndarray, lv: np.ndarray, ref: int) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """B's lower entries as CSR (ptr, cols, vals): (T)'s one per serving row, none in row or column ``ref``."""
    S = lc.size
    keep = (lc >= 0) & (lc != ref)
    keep[ref] = False
    ptr = np.zeros(S + 1, dtype=np.int64)
    ptr[1:] = np.cumsum(keep)
    return ptr, np.ascontiguousarray(lc[keep]), np.ascontiguousarray(lv[keep])


def _transposed(lc, lv, ue, dg, ref):
    """Bᵀ reversed, C = J·Bᵀ·J (J the order reversal), in :func:`_sweep`'s form: (ptr, cols, vals, ue, dg, ref).
    B's entry (s, c) becomes C's (S−1−c, S−1−s), below the diagonal again, and B's super-diagonal C's, so C is
    a nonsingular M-matrix like B and Doolittle's LU without pivoting applies; Bᵀw = r is C·(Jw) = Jr."""
    S = lc.size
    rows = np.nonzero((lc >= 0) & (lc != ref) & (np.arange(S) != ref))[0]
    r = S - 1 - lc[rows]
    order = np.lexsort((S - 1 - rows, r))
    ptr = np.zeros(S + 1, dtype=np.int64)
    np.add.at(ptr, r + 1, 1)
    ptr = np.cumsum(ptr)
    uet = np.zeros(S)
    uet[:-1] = ue[:-1][::-1]
    return (ptr, np.ascontiguousarray((S - 1 - rows)[order]), np.ascontiguousarray(lv[rows][order]), uet,
            np.ascontiguousarray(dg[::-1]), S - 1 - ref)


def _reference(pol: np.ndarray, sizes: np.ndarray) -> int:
    """A recurrent state: L, the least state reachable from s_max.  Every state reaches s_max (arrivals are
    unbounded, waiting moves up) and [L, s_max] is closed and communicating, so the chain is unichain and L
    recurrent; L is the fixed point of L ← min{s − π(s) : s ≥ L, π(s) > 0} (a serving row reaches every state
    ≥ s − π(s))."""
    a = sizes[pol]
    j = np.where(a > 0, np.arange(pol.size) - a, pol.size)
    low = np.minimum.accumulate(j[::-1])[::-1]  # low[L] = min_{s ≥ L} j(s)
    L = pol.size - 1
    while low[L] < L:
        L = int(low[L])
    return L


def _flush(x: np.ndarray) -> np.ndarray:
    """x with the entries below 1e-200·max|x| set to 0, in place (:func:`~.geometric._flush_small`): GMRES
    normalises its vectors, and such an entry of a vector whose norm is large would become subnormal, which slows
    every later product on it ~100-fold."""
    return _flush_small(x, 0.0, x, 0.0, x)


class _System:
    """One policy's exact bias system, factored once: :meth:`solve` gives (g, h) for any cost vector."""

    def __init__(self, model: GeometricModel, pol: np.ndarray):
        S = model.s_max + 1
        self.model, self.S = model, S
        self.pol = pol = np.ascontiguousarray(pol, dtype=np.int64)
        if pol.shape != (S,) or pol.min() < 0 or pol.max() >= model.sizes.size:
            raise InputError(f"a policy here is {S} action indices in 0..{model.sizes.size - 1}")
        bad = np.nonzero(model.sizes[pol] > np.arange(S))[0]
        if bad.size or pol[-1] != model.tail:
            raise InputError(f"the policy serves more than the queue holds at n = {int(bad[0])}" if bad.size else
                             f"the policy must serve B = {model.tail_action} at s_max = {model.s_max}")
        lc, lv, up, dg, end = _rows(pol, model.sizes, model.q, S)
        self.ref = ref = _reference(pol, model.sizes)
        ue = _effective_up(up, ref)
        ptr, cols, vals = _lower(lc, lv, ref)
        self._work = np.empty((4, S))  # the sweeps' own arrays (:func:`~.geometric._sweep`)
        self._basis = Basis()  # GMRES's, kept between its cycles
        U = _sweep(ptr, cols, vals, ue, dg, ref, np.empty((2, 0)), np.empty(0), True, self._work)
        _check_pivots(U)
        self.end = end
        lam_inv = 1.0 / model.problem.lam
        # (T) in x (x[ref] = g) is B + u·e_refᵀ + e_ref·vᵀ, B with row and column ref the identity (Woodbury)
        G = np.where(model.sizes[pol] > 0, model.y[pol] * (1.0 - model.q[pol]), lam_inv)
        u = G.copy()
        u[ref] = 0.0
        v = np.zeros(S)
        if lc[ref] >= 0 and lc[ref] != ref:
            v[lc[ref]] += lv[ref]
        if ref + 1 < S:
            v[ref + 1] += up[ref]
        v[ref] = G[ref] - 1.0
        self._e = e = np.zeros(S)
        e[ref] = 1.0
        self._rows = (lc, lv, ue, dg)
        self._uv = (u, v)
        self._b = (ptr, cols, vals, ue, _pivots(U, ue), ref)
        Z0, Z1 = _flush(self._b_solve(u)), _flush(self._b_solve(e))
        self._w = (Z0, Z1, v, np.linalg.inv(np.array([[1.0 + Z0[ref], Z1[ref]], [v @ Z0, 1.0 + v @ Z1]])))
        self._win = _end_windows(pol, model.sizes, model.q, end, model.s_max)
        self._args = (self._win, pol, model.sizes, model.q, model.y, model.ct, lc, lv, up, dg, end, ref, lam_inv)
        self._wt: tuple | None = None  # the transposed preconditioner's, when an adjoint solve asks for it

    def _b_solve(self, r: np.ndarray) -> np.ndarray:
        ptr, cols, vals, ue, piv, ref = self._b
        return _sweep(ptr, cols, vals, ue, ue, ref, piv, np.ascontiguousarray(r), False, self._work)

    def _bt_solve(self, r: np.ndarray) -> np.ndarray:
        """Bᵀw = r by C = J·Bᵀ·J's LU (:func:`_transposed`)."""
        ptr, cols, vals, ue, piv, ref = self._bt
        return _sweep(ptr, cols, vals, ue, ue, ref, piv, np.ascontiguousarray(r[::-1]), False, self._work)[::-1].copy()

    def _factor_transposed(self) -> None:
        """Bᵀ's factors and the transposed Woodbury terms, on the first adjoint solve."""
        if self._wt is not None:
            return
        ptr, cols, vals, ue, dg, ref = _transposed(*self._rows, self.ref)
        U = _sweep(ptr, cols, vals, ue, dg, ref, np.empty((2, 0)), np.empty(0), True, self._work)
        _check_pivots(U)
        self._bt = (ptr, cols, vals, ue, _pivots(U, ue), ref)
        u, v = self._uv
        Z0, Z1 = _flush(self._bt_solve(self._e)), _flush(self._bt_solve(v))
        self._wt = (Z0, Z1, u, np.linalg.inv(np.array([[1.0 + u @ Z0, u @ Z1], [Z0[self.ref], 1.0 + Z1[self.ref]]])))

    def _precondition(self, r: np.ndarray) -> np.ndarray:
        Z0, Z1, v, Ci = self._w
        z = self._b_solve(r)
        w = Ci @ np.array([z[self.ref], v @ z])
        return _flush_small(z, w[0], Z0, w[1], Z1)

    def _precondition_t(self, r: np.ndarray) -> np.ndarray:
        """The transpose of :meth:`_precondition`: ((T)ᵀ)⁻¹ = (Bᵀ + e_ref·uᵀ + v·e_refᵀ)⁻¹ by Woodbury."""
        self._factor_transposed()
        assert self._wt is not None
        z = self._bt_solve(r)
        Z0, Z1, u, Ci = self._wt
        w = Ci @ np.array([u @ z, z[self.ref]])
        return _flush_small(z, w[0], Z0, w[1], Z1)

    def _krylov(self, op, prec, f: np.ndarray, x: np.ndarray, rtol: float, maxiter: int) -> tuple[np.ndarray, int]:
        """x with op(x) = f by GMRES with ``prec`` as right preconditioner, from x: op·prec y = f − op x, so GMRES's
        residual is the exact system's.  One restart cycle at a time (:func:`~.krylov.gmres_cycle`) of
        :data:`RESTART` steps, doubled up to :data:`MAX_RESTART` after a cycle that ran all its steps and gained
        less than a decade (short cycles are cheap where the preconditioner is good, and stall where it is not);
        it stops at rtol, after ``maxiter`` steps, or at the round-off floor: a cycle that gained less than 10 %
        though it met its own residual estimate, or was a longest one."""
        goal = rtol * (float(np.linalg.norm(f)) or 1.0)
        last = math.inf
        its, restart, full = 0, RESTART, False
        while its < maxiter:
            r = f - op(x)
            rn = float(np.linalg.norm(r))
            if rn <= goal or (rn > 0.9 * last and (not full or restart >= MAX_RESTART)):
                break  # at rtol, or at the round-off floor (a cycle that met its own estimate, or a longest one)
            if full and rn > 0.1 * last:
                restart = min(2 * restart, MAX_RESTART)
            last = rn
            m = min(restart, maxiter - its)
            y, k = gmres_cycle(lambda v: op(prec(v)), r, goal, m, self._basis)
            its += k
            full = k == m
            x = x + prec(y)
        return x, its

    def _a(self, x: np.ndarray) -> np.ndarray:
        x = np.ascontiguousarray(x)
        _, starts, counts, qs, _ = self._win
        return _flush(_matvec(x, window_sums(x, starts, counts, qs), *self._args))

    def _at(self, w: np.ndarray) -> np.ndarray:
        oh, coefs = _rmatvec(np.ascontiguousarray(w), *self._args)
        _, starts, counts, qs, _ = self._win
        og = oh[self.ref]
        window_scatter(oh, starts, counts, qs, coefs)
        oh[self.ref] = og
        return _flush(oh)

    def solve(self, cost: Costs, rtol: float, guess: tuple[float, np.ndarray] | None = None,
              maxiter: int = 2400) -> tuple[float, np.ndarray, int]:
        """(g, h, GMRES iterations) for ``cost``; ``guess`` a nearby (g, h) to start from."""
        f = self.rhs(cost)
        if guess is None:
            x = self._precondition(f)
        else:
            x = guess[1] - guess[1][self.ref]  # relative values: h(ref) = 0 here
            x[self.ref] = guess[0]
        x, its = self._krylov(self._a, self._precondition, f, x, rtol, maxiter)
        g = float(x[self.ref])
        h = x.copy()
        h[self.ref] = 0.0
        return g, h, its

    def rhs(self, cost: Costs) -> np.ndarray:
        """The exact system's right-hand side for ``cost``: the gain of ``cost`` is x[ref] of A·x = rhs."""
        m = self.model
        return _rhs(self.pol, m.sizes, m.q, cost.fixed, cost.slope, cost.cc, self.end, self.S)

    def adjoint(self, rtol: float = ADJOINT_RTOL, maxiter: int = 720) -> tuple[np.ndarray, float, int]:
        """(z, relative residual, GMRES iterations) with Aᵀz = e_ref: the gain of any cost is then z·rhs(cost),
        as x[ref] = e_refᵀA⁻¹f = (A⁻ᵀe_ref)ᵀf; z is the policy's stationary law in this system's scaling."""
        e = self._e
        z, its = self._krylov(self._at, self._precondition_t, e, self._precondition_t(e), rtol, maxiter)
        return z, float(np.linalg.norm(e - self._at(z))), its


def _check_pivots(U: np.ndarray) -> None:
    if not (np.all(np.isfinite(U)) and np.all(U > 0)):
        raise InputError("the policy's three-term system has a non-positive pivot (round-off); its chain is "
                         "unichain, so this is numerical, not the model's")


def _q(model: GeometricModel, cost: Costs, pol: np.ndarray, g: float, h: np.ndarray, width: int = -1):
    """(Q(s, π(s)), best Q(s, a), its action) by :func:`~.geometric._q_pass` over the actions whose index is within
    ``width`` of π(s)'s (0: π(s) alone, for a residual; −1: every action, a full improvement)."""
    args = (h, g, pol, model.sizes, model.q, model.y, cost.fixed, cost.slope, cost.cc, model.ct, model.s_max,
            model.tail)
    if width < 0:
        return _q_full(*args)
    return _q_pass(*args, *_ranges(pol, model.sizes.size, width, model.s_max))


def _residual(h: np.ndarray, qcur: np.ndarray) -> float:
    return float(np.max(np.abs(h - qcur)) / (1.0 + np.max(np.abs(h))))


def evaluate(model: GeometricModel, pol: np.ndarray, cost: Costs | None = None,
             rtol: float = TIGHT) -> tuple[float, np.ndarray]:
    """(g, h) of ``pol`` (action indices, length s_max + 1, B at s_max), certified: eq. 20's residual
    < :data:`RESIDUAL_TOL` (relative to 1 + max|h|) or InputError."""
    cost = model.cost if cost is None else cost
    g, h, _ = _System(model, pol).solve(cost, rtol)
    res = _residual(h, _q(model, cost, pol, g, h, 0)[0])
    if not res < RESIDUAL_TOL:
        raise InputError(f"the policy's evaluation did not converge (residual {res:.3g})")
    return g, h


def _certified(system: _System, name: str, cost: Costs) -> float:
    """The gain of ``cost`` by its own forward solve, certified by eq. 20's residual like :func:`evaluate`."""
    m = system.model
    g, h, _ = system.solve(cost, TIGHT, maxiter=480)  # GMRES may stall at round-off before 1e-12
    res = _residual(h, _q(m, cost, system.pol, g, h, 0)[0])
    if not res < RESIDUAL_TOL:
        raise InputError(f"the policy's {name} evaluation did not converge (residual {res:.3g})")
    return g


@dataclass(frozen=True)
class Stationary:
    """What :func:`metrics` reads off one policy's adjoint solve: the policy, its system, z (Aᵀz = e_ref) and the
    gains z·rhs of the objective ("cost") and of the bounded costs."""

    pol: np.ndarray
    system: _System
    z: np.ndarray
    gains: dict


def stationary(model: GeometricModel, pol: np.ndarray) -> Stationary:
    """The adjoint part of :func:`metrics` for ``pol``, which needs no ĝ: the exponential rule runs it on a
    second thread while the verifying truncation's policy iteration runs (it is that policy when they agree)."""
    return _stationary(_System(model, pol))


def _stationary(system: _System) -> Stationary:
    model = system.model
    z, res, _ = system.adjoint()
    if not res < ADJOINT_TOL:
        raise InputError(f"the policy's stationary (adjoint) solve did not converge (residual {res:.3g})")
    gains = {name: float(z @ system.rhs(cost)) for name, cost in
             (("cost", model.cost), ("energy", model.parts["energy"]), ("batches", model.parts["batches"]),
              ("epochs", model.parts["epochs"]))}
    return Stationary(system.pol, system, z, gains)


def metrics(model: GeometricModel, pol: np.ndarray, gain: float | None = None, delta: bool = True,
            known: Callable[[], Stationary] | None = None) -> dict:
    """W̄ (ms), P̄ (W), throughput (/ms), mean batch, Δ (the excursions' cost per ms) and the chance an epoch
    leaves the truncation, each the gain of its own cost vector (module doc); ``gain``: the policy's ĝ when
    known (else one certified solve); ``delta=False`` skips Δ; ``known``: returns :func:`stationary` of a policy
    computed elsewhere (a future's result; used when that policy is ``pol``, solved here when it is not or when
    it raised InputError), called once this function's own solves are done.

    One adjoint solve Aᵀz = e_ref gives the gain of every cost as z·rhs (:meth:`_System.adjoint`): P̄, the batch
    rate and the epoch rate, whose costs are bounded (to ~1e-12 against their own solves at Bmax 1 024).  W̄ is
    (ĝ − w2·P̄)/w1 where that loses under 3 digits, else its own solve: a cost growing with n weighs the
    adjoint's error at long queues, where z is tiny, by n (1e-8 there).  The overflow and Δ are tiny sums over
    the states next to s_max, so they keep their own solves.  The adjoint is checked against ĝ (to 1e-6; a
    wrong z is off by orders of magnitude)."""
    system = _System(model, pol)
    p = model.problem
    if gain is None:
        gain = _certified(system, "cost", model.cost)
    leave = _certified(system, "leave", model.parts["leave"])
    excursion = _certified(system, "excursion", model.parts["excursion"]) if delta else math.nan
    try:  # a speculation for another table may have failed where this one's solve will not
        st = known() if known is not None else None
    except InputError:
        st = None
    if st is None or not np.array_equal(st.pol, pol):
        st = _stationary(system)
    gains = st.gains
    if not abs(gains["cost"] - gain) <= 1e-6 * (1.0 + abs(gain)):
        raise InputError(f"the policy's stationary (adjoint) solve disagrees with its gain {gain:.9g}")
    hold = (gain - p.w2 * gains["energy"]) / p.w1 if p.w1 > 0 else math.nan
    if not p.w1 * hold >= 1e-3 * abs(gain):  # cancellation (or w1 = 0): W̄ by its own solve
        hold = _certified(system, "hold", model.parts["hold"])
    lam = p.lam
    return {"mean_latency_ms": hold, "mean_power_w": gains["energy"], "throughput": lam,
            "mean_batch_size": lam / gains["batches"], "delta": excursion,
            "overflow_probability": max(leave, 0.0) / gains["epochs"]}  # ≥ 0: round-off below 1e-30
