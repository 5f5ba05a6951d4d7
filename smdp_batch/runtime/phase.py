"""Acting on a (queue length, phase) table without seeing the phase: the MAP forward filter (issue 20).

A server observes arrival times, not the phase of the MAP (D0, D1).  The filter keeps the law of the
phase given the arrivals so far (the forward recursion of the MAP likelihood; Rydén 1996):

* just after an arrival at t_k, Δ after the previous one:  α_k ∝ α_{k−1}·e^{D0·Δ}·D1;
* at a decision epoch t ≥ t_k with no arrival since:       β(t) ∝ α_k·e^{D0·(t − t_k)}
  (the silence since t_k is evidence too: it favours the slow phases).

Each step is O(m²) plus one m × m exponential of a sub-generator, computed by uniformization
(e^{D0·t} = e^{−qt}·Σ (qt)ⁿ/n!·(I + D0/q)ⁿ, all terms ≥ 0) on t/2^s with q·t/2^s ≤ ½, then squared
s times; only the direction matters, so every step is rescaled and no time underflows.

Two rules turn the belief into a batch size (:class:`PhasePolicy`):

* ``"likely"``: the table's action in the most likely phase;
* ``"qmdp"``: argmin_a Σ_i β_i·Q((n, i), a) with the solved truncation's action values Q (the
  belief-weighted relative values; Littman, Cassandra & Kaelbling 1995's Q_MDP).

numpy only; the functions on arrays are written so that the simulator can compile them with numba.
"""

from __future__ import annotations

import math
import time

import numpy as np

from ..errors import InputError
from .mapcheck import PHASE_LIMIT, check_map

__all__ = ["PHASE_LIMIT", "PhaseFilter", "PhasePolicy", "check_map", "decide_phase", "expm_direction", "filter_step",
           "RULES"]

RULES = ("qmdp", "likely")
def expm_direction(D0: np.ndarray, t: float) -> np.ndarray:
    """e^{D0·t} up to a positive factor (largest entry 1), for a sub-generator D0 and t ≥ 0."""
    m = D0.shape[0]
    q = 0.0
    for i in range(m):
        if -D0[i, i] > q:
            q = -D0[i, i]
    if q <= 0.0 or t <= 0.0:
        return np.eye(m)
    s = 0
    x = q * t
    while x > 0.5:
        x *= 0.5
        s += 1
    P = np.eye(m) + D0 / q
    for i in range(m):
        for j in range(m):
            if P[i, j] < 0.0:
                P[i, j] = 0.0
    # Σ xⁿ/n! Pⁿ (the e^{−x} factor is dropped: only the direction is kept)
    E = np.eye(m)
    term = np.eye(m)
    for n in range(1, 30):
        term = term @ P * (x / n)
        E = E + term
        if term.max() < 1e-17 * E.max():
            break
    for _ in range(s):
        E = E @ E
        E = E / E.max()
    return E / E.max()


def filter_step(alpha: np.ndarray, D0: np.ndarray, D1: np.ndarray, dt: float) -> np.ndarray:
    """α·e^{D0·dt}·D1, normalised to sum 1 (the belief just after an arrival dt after the last)."""
    v = alpha @ expm_direction(D0, dt) @ D1
    s = v.sum()
    if not s > 0.0:  # an arrival impossible under the model from this belief: restart from D1's rows
        v = np.ones(alpha.shape[0]) @ D1
        s = v.sum()
    return v / s


def _propagate(alpha: np.ndarray, D0: np.ndarray, dt: float) -> np.ndarray:
    v = alpha @ expm_direction(D0, dt)
    s = v.sum()
    return v / s if s > 0.0 else alpha


class PhaseFilter:
    """Online phase belief of a MAP from arrival times in ms (see the module doc); O(m²) per arrival."""

    def __init__(self, D0, D1, initial=None):
        self.D0, self.D1, pi, self.rate = check_map(D0, D1)
        m = self.D0.shape[0]
        if initial is None:
            initial = pi
        a = np.asarray(initial, dtype=np.float64)
        if a.shape != (m,) or np.any(a < 0) or not a.sum() > 0:
            raise InputError(f"the initial phase law must be {m} non-negative numbers with a positive sum")
        self.alpha = a / a.sum()
        self.last: float | None = None
        self.count = 0

    @property
    def phases(self) -> int:
        return self.D0.shape[0]

    def observe(self, t_ms: float) -> None:
        """One arrival at time t (ms, non-decreasing)."""
        t = float(t_ms)
        if not math.isfinite(t):
            raise InputError(f"arrival time must be finite, got {t_ms!r}")
        if self.last is not None and t < self.last:
            raise InputError(f"arrival times must not decrease: {t} after {self.last}")
        dt = 0.0 if self.last is None else t - self.last
        if self.last is None:  # the first arrival: the phase law given an arrival from the stationary start
            v = self.alpha @ self.D1
            self.alpha = v / v.sum() if v.sum() > 0 else self.alpha
        else:
            self.alpha = filter_step(self.alpha, self.D0, self.D1, dt)
        self.last = t
        self.count += 1

    def belief(self, t_ms: float | None = None) -> np.ndarray:
        """Phase law at time t ≥ the last arrival (default: just after it)."""
        if t_ms is None or self.last is None:
            return self.alpha.copy()
        return _propagate(self.alpha, self.D0, max(float(t_ms) - self.last, 0.0))


class PhasePolicy:
    """A (queue length, phase) table acting on the filter's belief; use it wherever a table goes.

    ``table``: (levels, m) batch sizes (eq. 30 per phase beyond the last level); ``qvalues``:
    (levels_q, m, A) action values for ``rule="qmdp"`` with ``actions`` (0 then the batch sizes).
    :class:`~smdp_batch.runtime.DynamicBatcher` calls ``observe_arrival(t_ms)`` for every request and
    ``decide(n)``; without a time, ``decide`` reads the same monotonic clock (ms).
    """

    def __init__(self, table, D0, D1, qvalues=None, actions=None, rule: str = "qmdp", batch_sizes=None,
                 meta: dict | None = None):
        tab = np.asarray(table)
        if tab.ndim != 2 or tab.shape[0] < 1 or not np.issubdtype(tab.dtype, np.integer) or np.any(tab < 0):
            raise InputError("a phase table must be a 2-D array of batch sizes ≥ 0, shape (queue lengths, phases)")
        self.phase_table = tab.astype(np.int64)
        self.filter = PhaseFilter(D0, D1)
        if self.phase_table.shape[1] != self.filter.phases:
            raise InputError(f"the table has {self.phase_table.shape[1]} phase columns, the MAP {self.filter.phases} phases")
        if rule not in RULES:
            raise InputError(f"phase rule must be one of {', '.join(RULES)}, got {rule!r}")
        if rule == "qmdp":
            if qvalues is None or actions is None:
                raise InputError("rule 'qmdp' needs the table's action values (qvalues) and actions")
            qv = np.asarray(qvalues, dtype=np.float64)
            acts = np.asarray(actions, dtype=np.int64)
            if qv.ndim != 3 or qv.shape[1] != self.filter.phases or qv.shape[2] != acts.size:
                raise InputError(f"qvalues must have shape (levels, {self.filter.phases}, {acts.size}), got {qv.shape}")
            self.qvalues, self.actions = qv, acts
        self.rule = rule
        sizes = sorted({int(a) for a in self.phase_table.ravel() if a > 0})
        self.batch_sizes = tuple(batch_sizes) if batch_sizes is not None else tuple(sizes)
        self.meta = dict(meta or {})

    @classmethod
    def load(cls, path, rule: str = "qmdp") -> "PhasePolicy":
        """A phase table written by ``smdp-batch solve --arrivals … -o FILE.h5`` (schema_version 2)."""
        from .phase_file import read_phase_policy

        pf = read_phase_policy(path)
        meta = {**pf.meta, "integrity": pf.integrity, "inputs": pf.inputs, "truncation": pf.truncation}
        R = pf.converged_upto if pf.converged_upto is not None else pf.s_max
        return cls(pf.policy[: R + 1], pf.D0, pf.D1, pf.qvalues, pf.actions, rule, pf.batch_sizes, meta)

    @property
    def phases(self) -> int:
        return self.filter.phases

    @property
    def lam(self) -> float:
        """Mean arrival rate of the MAP (1/ms)."""
        return self.filter.rate

    def default_max_wait_ms(self, lam: float | None = None) -> float:
        """The batcher's safety bound for this table: as for a one-phase table (Erlang(k) quantile × 2,
        :func:`~smdp_batch.runtime.batcher.default_max_wait_ms`) with k the last queue length at which any
        phase waits and the slowest phase's arrival rate (or ``lam``)."""
        from .batcher import BOUND_EPS, BOUND_SAFETY, FALLBACK_MAX_WAIT_MS, erlang_quantile_ms

        rates = self.filter.D1.sum(axis=1)
        rate = float(lam) if lam is not None else float(rates[rates > 0].min())
        waits = np.nonzero((self.phase_table == 0).any(axis=1))[0]
        k = int(waits[-1]) if waits.size else 0
        if k == 0:
            return 0.0
        return BOUND_SAFETY * erlang_quantile_ms(k, rate, 1.0 - BOUND_EPS) if rate > 0 else FALLBACK_MAX_WAIT_MS

    @property
    def max_batch(self) -> int:
        return int(self.phase_table.max())

    def observe_arrival(self, t_ms: float) -> None:
        self.filter.observe(t_ms)

    def decide(self, n: int, t_ms: float | None = None) -> int:
        """Batch size for n queued requests at time t (ms; default now on the monotonic clock)."""
        if t_ms is None:
            t_ms = time.monotonic() * 1e3
        beta = self.filter.belief(t_ms)
        return decide_phase(int(n), beta, self.phase_table, self.qvalues if self.rule == "qmdp" else None,
                            self.actions if self.rule == "qmdp" else None)

    def __repr__(self) -> str:
        return f"<PhasePolicy {self.phase_table.shape[0]} levels × {self.phases} phases, rule {self.rule}>"


def decide_phase(n: int, beta: np.ndarray, table: np.ndarray, qvalues, actions) -> int:
    """The rule of :class:`PhasePolicy` for belief β (qvalues None: the most likely phase's action)."""
    if qvalues is None or n >= qvalues.shape[0]:  # beyond the action values: eq. 30 of the likely phase
        return int(table[min(n, table.shape[0] - 1), int(np.argmax(beta))])
    k = int(np.searchsorted(actions, n, side="right"))  # actions ascending: the feasible ones (a ≤ n) lead
    q = beta @ qvalues[n][:, :k]
    return int(actions[int(np.argmin(q))])
