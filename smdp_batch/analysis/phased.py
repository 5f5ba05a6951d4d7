"""Rules that look at more than the queue length, for the simulator.

* :func:`phase_rule` — a (queue length, phase) table of :func:`smdp_batch.solvers.map_solution.solve_map`
  acting on the **true** phase (a bound: no server sees it) or on the **filter**'s belief
  (:mod:`smdp_batch.runtime.phase`; ``source="qmdp"`` or ``"likely"``), exactly as
  :class:`~smdp_batch.runtime.phase.PhasePolicy` acts in a server.
* :func:`bank_rule` — the λ-bank's :class:`~smdp_batch.runtime.bank.AdaptivePolicy`: its table index
  after each arrival is computed by the runtime object itself over the arrival stream (the estimate
  depends on arrivals only), then the simulator applies the indexed table.

Both are :class:`ContextRule`\\ s: a stack of tables and, per run, the context that picks one at each
decision epoch (:func:`smdp_batch.analysis.sim_kernels._context_kernel`).  The compiled kernel indexes the
tables by that context, so :func:`phase_rule` refuses, before any run, a table whose phase count is not the
MAP's or a phase path that visits a phase the table lacks (the kernel also checks each index).
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Callable

import numpy as np

from ..baselines.servers import ServerRule
from ..errors import InputError
from ..runtime.bank import AdaptivePolicy, PolicyBank, RateEstimator
from .sim_kernels import CTX_ARRIVAL, CTX_LIKELY, CTX_PATH, CTX_QMDP, phase_beliefs

__all__ = ["ContextRule", "phase_rule", "solution_rule", "bank_rule", "SOURCES"]

SOURCES = ("true", "qmdp", "likely")


@dataclass(frozen=True)
class ContextRule(ServerRule):
    """Tables (contexts × queue lengths 0..top) and a per-run context maker ``make(arr)``."""

    # always given: the defaults are there because ServerRule's fields have them
    tables: np.ndarray = field(default=None, repr=False)  # type: ignore[arg-type]
    make: Callable | None = field(default=None, repr=False)

    def executed_sizes(self) -> list[int]:
        return sorted({int(a) for a in np.unique(self.tables) if a > 0})

    def context(self, arr: np.ndarray) -> tuple:
        return self.make(arr)  # type: ignore[misc]  # always given


def _rule(spec: str, tables: np.ndarray, make) -> ContextRule:
    tables = np.ascontiguousarray(tables, dtype=np.int64)
    return ContextRule(mode="context", spec=spec, table=np.unique(tables), top=tables.shape[1] - 1,
                       maxb=int(tables.max()), pref=np.zeros(0, dtype=np.int64), delay=0.0, tables=tables, make=make)


_NO_F = np.zeros(1)
_NO_I = np.zeros(1, dtype=np.int64)


def phase_rule(table: np.ndarray, arrivals, source: str = "qmdp", qvalues: np.ndarray | None = None,
               actions: np.ndarray | None = None, path: tuple[np.ndarray, np.ndarray] | None = None,
               spec: str = "map-table") -> ContextRule:
    """A (queue length, phase) table (R+1, m) — eq. 30 per phase beyond R — acting on the true phase
    (``source="true"``, with the stream's phase ``path`` = (switch times, phases) of :meth:`MAP.sample`) or on
    the filter of ``arrivals`` (``"qmdp"`` with the action values (R+1, m, A) over ``actions``, or ``"likely"``)."""
    if source not in SOURCES:
        raise InputError(f"phase source must be one of {', '.join(SOURCES)}, got {source!r}")
    tables = np.ascontiguousarray(np.asarray(table, dtype=np.int64).T)  # (m, R + 1)
    m = tables.shape[0] if tables.ndim == 2 else -1
    D0, D1, pi = arrivals.D0, arrivals.D1, arrivals.stationary
    if m < 1 or tables.shape[1] < 1 or D0.shape[0] != m:  # refused here, before the compiled kernel would stop on it
        raise InputError(f"{spec}: a table of shape {tuple(np.shape(table))} does not fit a MAP of {D0.shape[0]} phases "
                         "(one column per phase)")
    if source == "qmdp":
        if qvalues is None or actions is None:
            raise InputError("the qmdp rule needs the table's action values and actions")
        qv = np.ascontiguousarray(qvalues, dtype=np.float64)[: tables.shape[1]]
        actions = np.asarray(actions, dtype=np.int64)
        if qv.ndim != 3 or qv.shape[1] != m or qv.shape[2] != actions.size or actions.ndim != 1:
            raise InputError(f"{spec}: action values of shape {qv.shape} do not fit {m} phases and "
                             f"{actions.size} actions")
    else:
        qv, actions = np.zeros((0, m, 1)), _NO_I
    if source == "true":
        if path is None or path[0] is None:
            raise InputError("the true-phase rule needs the arrival stream's phase path (MAP.sample's switch "
                             "times and phases); a trace has none: use the filter (qmdp or likely)")
        sw_t = np.asarray(path[0], dtype=np.float64)
        sw_p = np.asarray(path[1], dtype=np.int64)
        if sw_t.ndim != 1 or sw_t.shape != sw_p.shape or sw_p.size < 1:
            raise InputError(f"{spec}: a phase path needs as many switch times as phases, at least one; got "
                             f"{sw_t.shape} and {sw_p.shape}")
        if sw_p.min() < 0 or sw_p.max() >= m:  # the compiled kernel indexes the table by this phase
            raise InputError(f"{spec}: the arrival stream visits phase {int(sw_p.max() if sw_p.max() >= m else sw_p.min())} "
                             f"but the table has {m} phase(s); --phase-rule true needs arrivals with {m} phases "
                             "(the filter, qmdp or likely, runs on any arrivals)")

        def make(arr):
            return (CTX_PATH, tables, tables.shape[1] - 1, _NO_I, 0, sw_t, sw_p, np.zeros((1, m)), D0, qv, actions)
    else:
        mode = CTX_QMDP if source == "qmdp" else CTX_LIKELY

        def make(arr):
            alpha = phase_beliefs(arr, D0, D1, pi)
            return (mode, tables, tables.shape[1] - 1, _NO_I, 0, _NO_F, _NO_I, alpha, D0, qv, actions)
    return _rule(f"{spec}[{source}]", tables, make)


def solution_rule(solution, source: str = "qmdp", path=None) -> ContextRule:
    """:func:`phase_rule` of a :class:`~smdp_batch.solvers.map_solution.MapSolution` (its stored range)."""
    R = solution.stored_range
    return phase_rule(solution.table[: R + 1], solution.arrivals, source, solution.qvalues[: R + 1],
                      solution.model.actions, path)


def bank_rule(bank: PolicyBank, estimator: dict | None = None, hysteresis: float = 0.1,
              initial_lam: float | None = None) -> ContextRule:
    """The λ-bank's AdaptivePolicy with a :class:`RateEstimator` of ``estimator`` keywords (fresh per run)."""
    top = max(t.s_max for t in bank.tables)
    tables = np.stack([np.concatenate([t.policy, np.full(top - t.s_max, t.policy[-1])]) for t in bank.tables])
    est = dict(estimator or {})
    init = AdaptivePolicy(bank, RateEstimator(**est), hysteresis, initial_lam).index

    def make(arr):
        pol = AdaptivePolicy(bank, RateEstimator(**est), hysteresis, initial_lam)
        idx = np.empty(arr.size, dtype=np.int64)
        for k, t in enumerate(arr.tolist()):
            pol.observe_arrival(t)
            idx[k] = pol.index
        return (CTX_ARRIVAL, tables, top, idx, init, _NO_F, _NO_I, np.zeros((1, 1)), np.zeros((1, 1)), np.zeros((0, 1, 1)),
                _NO_I)
    return _rule(f"lambda-bank[{len(bank)} tables]", tables, make)
