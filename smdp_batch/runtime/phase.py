"""Acting on a (queue length, phase) table without seeing the phase: the MAP forward filter.

A server observes arrival times, not the phase of the MAP (D0, D1).  The filter keeps the law of the
phase given the arrivals so far (the forward recursion of the MAP likelihood; Rydén 1996):

* just after an arrival at t_k, Δ after the previous one:  α_k ∝ α_{k−1}·e^{D0·Δ}·D1;
* at a decision epoch t ≥ t_k with no arrival since:       β(t) ∝ α_k·e^{D0·(t − t_k)}
  (the silence since t_k is evidence too: it favours the slow phases).

Each step is O(m²) plus one m × m exponential of a sub-generator, computed by uniformization
(e^{D0·t} = e^{−qt}·Σ (qt)ⁿ/n!·(I + D0/q)ⁿ, all terms ≥ 0) on t/2^s with q·t/2^s ≤ ½, then squared
s times; only the direction matters, so every step is rescaled and no time underflows.  Beyond
q·t = ``QT_HORIZON`` (2⁶⁰) the direction has converged to double precision (to the dominant left eigenvector
of D0, for MAPs whose rates span less than ~10¹⁶), so a longer time — up to 1.8e308 ms, or one whose q·t
overflows — counts as that horizon: at most 61 squarings, whatever the time.

Two rules turn the belief into a batch size (:class:`PhasePolicy`):

* ``"likely"``: the table's action in the most likely phase;
* ``"qmdp"``: argmin_a Σ_i β_i·Q((n, i), a) with the solved truncation's action values Q (the
  belief-weighted relative values; Littman, Cassandra & Kaelbling 1995's Q_MDP).

numpy only; the functions on arrays are written so that the simulator can compile them with numba.
"""

from __future__ import annotations

import sys
import threading
import time

import numpy as np

from ..errors import InputError
from .bound import erlang_bound_ms
from .guard import check_queue_length, check_rate, check_time_ms
from ..specs.mapcheck import PHASE_LIMIT, check_map

__all__ = ["PHASE_LIMIT", "QT_HORIZON", "PhaseFilter", "PhasePolicy", "check_map", "decide_phase", "expm_direction",
           "filter_step", "RULES"]

RULES = ("qmdp", "likely")
#: q·t (q the fastest total rate of D0) beyond which e^{D0·t}'s direction is taken as converged.
QT_HORIZON = 2.0 ** 60


def expm_direction(D0: np.ndarray, t: float) -> np.ndarray:
    """e^{D0·t} up to a positive factor (largest entry 1), for a sub-generator D0 and t ≥ 0 (ms; a time with
    q·t > ``QT_HORIZON``, inf included, counts as the horizon: the loops below are bounded)."""
    m = D0.shape[0]
    q = 0.0
    for i in range(m):
        if -D0[i, i] > q:
            q = -D0[i, i]
    if q <= 0.0 or t <= 0.0:
        return np.eye(m)
    s = 0
    # past the horizon (q·t would even overflow for a huge t): the direction has converged
    x = q * t if t < QT_HORIZON / q else QT_HORIZON
    while x > 0.5 and s < 64:  # s ≤ 61
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
    """Online phase belief of a MAP from arrival times in ms (see the module doc); O(m²) per arrival.

    Thread-safe (one lock).  A time earlier than the last arrival (a clock stepped back, or two threads
    sharing one filter) counts as zero elapsed time; NaN, ±inf and negative times raise ``InputError`` and
    leave the belief unchanged."""

    def __init__(self, D0, D1, initial=None):
        self.D0, self.D1, pi, self.rate = check_map(D0, D1)
        m = self.D0.shape[0]
        if initial is None:
            initial = pi
        try:
            a = np.asarray(initial, dtype=np.float64)
        except (TypeError, ValueError, OverflowError):
            a = np.full(1, np.nan)
        if a.shape != (m,) or not np.all(np.isfinite(a)) or np.any(a < 0) or not a.sum() > 0:
            raise InputError(f"the initial phase law must be {m} finite numbers ≥ 0 with a positive sum")
        self.alpha = a / a.sum()
        self.last: float | None = None
        self.count = 0
        self._lock = threading.Lock()

    @property
    def phases(self) -> int:
        return self.D0.shape[0]

    def observe(self, t_ms: float) -> None:
        """One arrival at time t (ms ≥ 0; an earlier time than the last counts as the last)."""
        t = check_time_ms(t_ms)
        with self._lock:
            if self.last is None:  # the first arrival: the phase law given an arrival from the stationary start
                v = self.alpha @ self.D1
                self.alpha = v / v.sum() if v.sum() > 0 else self.alpha
            else:
                t = max(t, self.last)
                self.alpha = filter_step(self.alpha, self.D0, self.D1, t - self.last)
            self.last = t
            self.count += 1

    def state(self) -> tuple[np.ndarray, float | None, int]:
        """(belief just after the last arrival, its time in ms or None, arrivals seen), read together."""
        with self._lock:
            return self.alpha.copy(), self.last, self.count

    def belief(self, t_ms: float | None = None) -> np.ndarray:
        """Phase law at time t ≥ the last arrival (default: just after it; an earlier t counts as it)."""
        t = None if t_ms is None else check_time_ms(t_ms, "decision time")
        alpha, last, _ = self.state()
        if t is None or last is None:
            return alpha
        return _propagate(alpha, self.D0, max(t - last, 0.0))


class PhasePolicy:
    """A (queue length, phase) table acting on the filter's belief; use it wherever a table goes.

    ``table``: (levels, m) batch sizes (eq. 30 per phase beyond the last level); ``qvalues``:
    (levels_q, m, A) action values for ``rule="qmdp"`` with ``actions`` (0 then the batch sizes).
    :class:`~smdp_batch.runtime.DynamicBatcher` calls ``observe_arrival(t_ms)`` for every request and
    ``decide(n)``; without a time, ``decide`` reads the same monotonic clock (ms).  While requests wait,
    the batcher asks :meth:`next_decision_ms` when to decide again.  Thread-safe: several batchers (threads)
    may share one policy.
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
            try:
                qv = np.asarray(qvalues, dtype=np.float64)
                acts = np.asarray(actions, dtype=np.int64)
            except (TypeError, ValueError, OverflowError):
                raise InputError("qvalues and actions must be arrays of numbers (action values, batch sizes)") from None
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
        """The batcher's safety bound for this table (ms): for each phase i, 2 × the (1 − 10⁻⁶) quantile of
        Erlang(k_i, λ_i), k_i the last queue length at which phase i waits and λ_i its arrival rate (``lam`` if
        given; a phase without arrivals: the slowest positive rate); the largest of these.  A phase that
        serves at every queue length adds nothing, so a slow phase that serves does not stretch the bound
        (as one phase: :func:`~smdp_batch.runtime.bound.default_max_wait_ms`).  While requests wait the batcher
        also decides again as silence moves the belief (:meth:`next_decision_ms`)."""
        if lam is not None:
            lam = check_rate(lam)
        rates = self.filter.D1.sum(axis=1)
        slowest = float(rates[rates > 0].min())  # check_map: the mean rate is > 0, so some phase sees arrivals
        bound = 0.0
        for i in range(self.phases):
            waits = np.nonzero(self.phase_table[:, i] == 0)[0]
            k = int(waits[-1]) if waits.size else 0
            if k > 0:
                rate = lam if lam is not None else (float(rates[i]) if rates[i] > 0 else slowest)
                bound = max(bound, erlang_bound_ms(k, rate))
        return bound

    @property
    def max_batch(self) -> int:
        return int(self.phase_table.max())

    def observe_arrival(self, t_ms: float) -> None:
        """One arrival at t (ms ≥ 0; thread-safe; a time earlier than the last counts as the last)."""
        self.filter.observe(t_ms)

    def decide(self, n: int, t_ms: float | None = None) -> int:
        """Batch size for n queued requests (an integer ≥ 0) at time t (ms; default now on the monotonic clock)."""
        n = check_queue_length(n)
        t = time.monotonic() * 1e3 if t_ms is None else check_time_ms(t_ms, "decision time")
        alpha, last, _ = self.filter.state()
        return self._decide_at(n, alpha, last, t)

    def _decide_at(self, n: int, alpha: np.ndarray, last: float | None, t: float) -> int:
        beta = alpha if last is None else _propagate(alpha, self.filter.D0, max(t - last, 0.0))
        return decide_phase(n, beta, self.phase_table, self.qvalues if self.rule == "qmdp" else None,
                            self.actions if self.rule == "qmdp" else None)

    def next_decision_ms(self, n: int, t_ms: float) -> float | None:
        """When to decide again (ms, after ``t_ms``) if n requests wait and nothing arrives.

        Silence is evidence (it moves the belief towards the slow phases), so the decision can change with
        time alone.  Within one step 1/q of the last arrival (q the MAP's fastest total rate) the answer is
        that step's end; later the look-ahead spans half the silence so far, and if the decision changes in
        it the answer is the first time it does (bisection to 1/1000 of the window).  None when the belief
        has settled (the decision no longer changes without an arrival).  Cost: one or two belief
        propagations, plus ten when the decision changes."""
        n = check_queue_length(n)
        t = check_time_ms(t_ms, "decision time")
        alpha, last, _ = self.filter.state()
        if last is None or self.phases == 1:
            return None
        t = max(t, last)
        step = 1.0 / float(np.max(-np.diag(self.filter.D0)))
        if t - last < step:
            return last + step
        lo, hi = t, min(t + 0.5 * (t - last), sys.float_info.max)  # a finite time, even near 1.8e308 ms
        now = self._decide_at(n, alpha, last, lo)
        if self._decide_at(n, alpha, last, hi) == now:
            moved = _propagate(alpha, self.filter.D0, hi - last) - _propagate(alpha, self.filter.D0, lo - last)
            return None if np.max(np.abs(moved)) < 1e-12 else hi
        for _ in range(10):
            mid = 0.5 * (lo + hi)
            lo, hi = (mid, hi) if self._decide_at(n, alpha, last, mid) == now else (lo, mid)
        return hi

    def __repr__(self) -> str:
        return f"<PhasePolicy {self.phase_table.shape[0]} levels × {self.phases} phases, rule {self.rule}>"


def decide_phase(n: int, beta: np.ndarray, table: np.ndarray, qvalues, actions) -> int:
    """The rule of :class:`PhasePolicy` for belief β (qvalues None: the most likely phase's action)."""
    if qvalues is None or n >= qvalues.shape[0]:  # beyond the action values: eq. 30 of the likely phase
        return int(table[min(n, table.shape[0] - 1), int(np.argmax(beta))])
    k = int(np.searchsorted(actions, n, side="right"))  # actions ascending: the feasible ones (a ≤ n) lead
    q = beta @ qvalues[n][:, :k]
    return int(actions[int(np.argmin(q))])
