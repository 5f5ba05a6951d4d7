"""Policy iteration for c instances sharing one queue (:mod:`smdp_batch.model.multi_server`), and the tables
servers follow.

Each policy's g and h and exact metrics come from its linear system (:mod:`.multi_system`, with the tail
boundary: above the truncation N every instance serves Bmax, its bias in closed form).  Policy iteration
improves every state's action by one Bellman step and stops when no action improves by more than
1e-12·(1 + |g|).  N grows by half from 2·c·Bmax until two truncations' costs agree within ``tol``; at ρ 0.9 a few
hundred levels suffice where arrivals lost at N need thousands.  ``boundary="loss"`` keeps the plain truncation
instead.

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

from ..errors import InputError, NotConvergedWarning, warn_not_converged
from ..model.multi_server import MultiServerSMDP, PhaseType, check_max_states, check_multi_size, phase_type
from ..model.problem import BatchingProblem
from .multi_system import MultiEvaluation, MultiSystem, table_policy, table_rows

__all__ = ["MultiSolution", "MultiEvaluation", "solve_instances", "evaluate_instances_table"]

PI_ITER_LIMIT = 200
#: From this many states policy iteration starts from the one-instance table (:func:`first_policy`), else greedy.
TABLE_START_FROM = 50_000


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
    system: MultiSystem | None = field(repr=False, compare=False, default=None)

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
        return sysm.metrics(table_policy(sysm, table_rows(self.problem, table, "tail")))

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


def greedy_policy(sysm: MultiSystem) -> np.ndarray:
    """Start each idle instance on the largest size that fits the queue (greedy)."""
    act = np.zeros(sysm.model.n_states, dtype=np.int64)
    for i in range(sysm.sizes.size):
        act = np.where(sysm.feasible[:, i + 1], i + 1, act)
    return act


def first_policy(sysm: MultiSystem, phases: int | None, idle_power_w: float) -> np.ndarray:
    """Policy iteration's first policy: on a model of :data:`TABLE_START_FROM` states or more, where each step
    costs seconds, the one-instance optimal table at the load's c-th share run on every idle instance
    (:func:`~.multi_system.table_policy`); two steps fewer than greedy's start at c = 2, every size, ρ 0.5 and
    0.7 (9 → 7 and 8 → 6 at N = 128: 12.8 → 9.2 s, 19.6 → 13.9 s), the same optimum.  Greedy otherwise, or where
    that one-instance problem cannot be solved."""
    p = sysm.model.problem
    if p.instances == 1 or sysm.model.n_states < TABLE_START_FROM:
        return greedy_policy(sysm)
    try:
        one = solve_instances(p.replace(instances=1, lam=p.lam / p.instances), phases=phases,
                              idle_power_w=idle_power_w, throw=True)
        return table_policy(sysm, np.minimum(one.table, np.arange(one.table.size)))
    except (InputError, NotConvergedWarning):
        return greedy_policy(sysm)


def iterate(sysm: MultiSystem, act: np.ndarray) -> tuple[np.ndarray, float, np.ndarray, MultiEvaluation, int, bool]:
    """Policy iteration from ``act``: (policy, g, h, its metrics, iterations, settled within
    :data:`PI_ITER_LIMIT`)."""
    for it in range(1, PI_ITER_LIMIT + 1):
        g, h, ev = sysm.evaluate(act)
        new = sysm.improve(act, h, g)
        if np.array_equal(new, act):
            return act, g, h, ev, it, True
        act = new
    return act, g, h, ev, PI_ITER_LIMIT, False


def extend_policy(old: np.ndarray, n_old: int, sysm: MultiSystem) -> np.ndarray:
    """A policy of truncation n_old carried to the longer one (levels past n_old take level n_old's action)."""
    old = old.reshape(-1, n_old + 1)
    N = sysm.N
    act = old[:, np.minimum(np.arange(N + 1), n_old)].ravel()
    return np.where(sysm.feasible[np.arange(act.size), act], act, greedy_policy(sysm))


def _most_started(sysm: MultiSystem, act: np.ndarray, visits: np.ndarray, group: np.ndarray,
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


def _project(sysm: MultiSystem, act: np.ndarray) -> np.ndarray:
    """At each n, the size the optimal policy starts most often (visits weighted) among states with an idle
    instance; levels it (almost) never visits take the all-idle state's action."""
    sizes, seen = _most_started(sysm, act, sysm.visits, sysm.n, sysm.N + 1)
    return np.where(seen, sizes, _idle_table(sysm, act))


#: Most evaluations :func:`_refine_table` spends improving the projected table.
TABLE_ROUNDS = 8
#: A projected table within this share of the optimum's cost is kept as it is (no search: one evaluation).
TABLE_CLOSE = 1e-3


def _table_choice(sysm: MultiSystem, act_t: np.ndarray, h: np.ndarray, g: float) -> np.ndarray:
    """The table's improvement step: at each n the action of least visit-weighted value Σ_s v(s)·Q(s, a) over the
    states at n with an idle instance, v the visit rates under the current table (a table sees n only)."""
    N, A = sysm.N, sysm.sizes.size
    vals = sysm.action_values(h, g)
    v = np.maximum(sysm.visits, 0.0)
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


def _idle_table(sysm: MultiSystem, act: np.ndarray) -> np.ndarray:
    """The optimal policy's start at each n with every instance idle (configuration 0)."""
    a = act[: sysm.N + 1]
    return np.where(a > 0, sysm.sizes[np.maximum(a - 1, 0)], 0)


def _refine_table(sysm: MultiSystem, table: np.ndarray, act: np.ndarray,
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
    best = (table, g, h, ev, sysm.visits)
    idle = _idle_table(sysm, act)
    if ev.model_cost > close and not np.array_equal(idle, table):
        g, h, ev = sysm.evaluate(table_policy(sysm, idle))
        if ev.model_cost < best[3].model_cost:
            best = (idle, g, h, ev, sysm.visits)
    for _ in range(TABLE_ROUNDS if best[3].model_cost > close else 0):
        new = _table_choice(sysm, best[0], best[2], best[1])
        if np.array_equal(new, best[0]):
            break
        g, h, ev = sysm.evaluate(table_policy(sysm, new))
        if not ev.model_cost < best[3].model_cost * (1 - 1e-12):
            break
        best = (new, g, h, ev, sysm.visits)
    sysm.visits = best[4]
    return best[0], best[1], best[2], best[3]


#: A busy-aware table is kept only when its exact cost is this share below the table n ↦ b's.
BUSY_GAIN = 1e-3


def _busy_table(sysm: MultiSystem, act: np.ndarray, visits: np.ndarray, table: np.ndarray,
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
    ev = sysm.metrics(table_policy(sysm, busy))
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
    last: tuple[MultiSystem, np.ndarray, float] | None = None  # the previous truncation: system, optimum, its cost
    incomplete_from = None  # carried from one truncation to the next (MultiSystem.incomplete_from)
    while True:
        sysm = MultiSystem(MultiServerSMDP(problem, ph, N, idle_power_w, max_states), tail=boundary == "tail",
                           incomplete_from=incomplete_from)
        act = first_policy(sysm, phases, idle_power_w) if act is None else extend_policy(act, n_old, sysm)
        act, _, _, ev, its, ok = iterate(sysm, act)
        total += its
        incomplete_from = sysm.incomplete_from
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
    visits = sysm.visits
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
    t = table_rows(problem, table, boundary)
    ph = phase_type(problem, phases)
    N = max(n_start(problem), t.shape[-1]) if n_max is None else int(n_max)
    sysm = MultiSystem(MultiServerSMDP(problem, ph, N, idle_power_w, max_states), tail=boundary == "tail")
    return sysm.evaluate(table_policy(sysm, t))[2]

