"""How much every allowed size could save over a coarse size set on c instances: the c-server optimum over every
size, bracketed where it cannot be solved.

The exact model (:mod:`smdp_batch.model.multi_server`) keeps, for each running batch, its size and phase: C(A·m +
c, c) configurations of the instances, 58 905 for four instances and the 32 sizes of paper 004's scenario (Xu,
Zhou & Niu, *SMDP-Based Dynamic Batching for Improving Responsiveness and Energy Efficiency of Batch Services*,
arXiv:2501.02181), about 1.5·10⁷ states — beyond a solve.  Its optimum ĝ* is bracketed instead:

* **above** by the exact optimum of a coarse size set (:func:`~.multi_pi.solve_instances`): a policy that starts
  only those sizes is one of the full model's;
* **below** by a smaller model that keeps, of each running batch, only its *class* — a run of consecutive sizes
  whose batch times lie within ``ratio`` of one another, Bmax alone — and its phase.  A start still takes its own
  b requests off the queue and costs its own ζ(b), and is charged at once the requests it will hold in service,
  w1·b·l(b)/λ, less the idle power its instance is spared, w2·P_idle·l(b); the queue costs w1·n/λ and every
  instance P_idle meanwhile (by renewal–reward, the same average cost for every policy).  The running batch is
  then taken as its class's least member, the fastest.

**Why the second is a lower bound** (the linear program of average-cost SMDPs: any g with a function H such that
H(s) ≤ c(s, a) − g·τ(s, a) + Σ_s' p(s' | s, a)·H(s') for every state and action is at most the optimum, since
summed over any policy's stationary law the inequalities give g ≤ that policy's average cost).  The class model
is solved by policy iteration (its g and bias h); H̃ is h closed under starts (H̃(s) = min(h(s), min_b of the
start's charge + Σ_j α_b[j]·H̃(after b starts)), levels in increasing order), and a state of the full model takes
H = H̃(its classes) + Σ_running (w1·b/λ − w2·P_idle)·m(σ), m(σ) the batch's mean time left: this potential turns
the full model's cost rates of requests in service and of idle instances into the charges at starts, exactly.
The inequalities of starts then hold by construction, being the class model's own.  Those of waiting, multiplied
by the total event rate, read

    w1·n/λ + w2·P_idle·c − κ·g + λ·(H̃(n + 1) − H̃(n)) + Σ_running Σ_events rate_b·(H̃(after) − H̃) ≥ 0

(κ = 1, or 1 + λ/d where an arrival at N steps into the tail, whose step then adds λ·w1·φ_b of
:meth:`~.multi_system.MultiSystem._tail_terms` per running batch).  Each running batch's term is bounded below
by its minimum over the members of its class; where the least member attains that minimum everywhere (a batch
that ends sooner never hurts), the class model's own equations make the left side ≥ 0 and ĝ of the class model
is the bound.  Elsewhere the bound is lowered by the largest shortfall over κ (``slack``), so that it holds
either way.  Both brackets are the truncated models' at their converged truncations (``tol``).

**How tight.**  The classes move only when instances free up; sizes, energy and the requests held are each
batch's own.  On paper 004's sizes 1..32 with exponential times the bracket is 0.1–0.8 % wide at ρ 0.5 and 0.7
on two to four instances (four at ρ 0.5: ĝ* in [132.19, 132.33]); at ρ 0.9 it is 3.5–13 % wide, since a class's
least member drains a long queue faster than Bmax can (the docs' "Several instances" page has the table).  Where
the full model solves (two instances), its optimum lies inside, as the tests check.
"""

from __future__ import annotations

import math
import time
from dataclasses import dataclass, field

import numpy as np

from ..errors import InputError, NotConvergedWarning
from ..model.multi_server import MultiServerSMDP, PhaseType, check_max_states, count_configurations, phase_type
from ..model.problem import BatchingProblem
from .multi_pi import MultiSolution, extend_policy, first_policy, iterate, n_start, solve_instances
from .multi_system import MultiSystem

__all__ = ["SizeBound", "bound_every_size", "size_classes", "coarse_sizes", "class_ratio", "CLASS_RATIOS"]

#: The class ratios :func:`class_ratio` tries, finest first.
CLASS_RATIOS = (1.1, 1.25, 1.5, 2.0, 3.0, 4.0)
#: The most states the class model is expected to reach by default: its configurations × the truncation it is
#: expected to converge at (:func:`class_ratio`).  On paper 004's sizes 1..32 at ρ 0.5: c = 2, ratio 1.1; c = 3,
#: 1.25; c = 4, 1.5 (210 configurations), seconds to a minute on 2 cores.
CLASS_STATES = 100_000
#: The most states either solve of the bound may reach unless the caller says (the memory budget still holds).
BOUND_MAX_STATES = 400_000


@dataclass(frozen=True)
class SizeBound:
    """ĝ* of every allowed size on c instances, bracketed: ``lower`` ≤ ĝ* ≤ ``upper`` (per ms, w1·W̄ + w2·P̄)."""

    problem: BatchingProblem
    classes: tuple[tuple[int, ...], ...]
    ratio: float  # the class ratio (batch times within a class lie within it of one another)
    coarse_sizes: tuple[int, ...]
    lower: float  # the class model's ĝ less ``slack``
    upper: float  # the exact optimum of ``coarse_sizes``
    slack: float  # the certificate's shortfall (0 where each class's least member is the relaxation's choice)
    n_max: int  # the class model's converged truncation
    configurations: int
    states: int
    iterations: int
    solve_time_s: float
    coarse: MultiSolution = field(repr=False, compare=False)
    #: the certificate: H on the class model's states (configurations × queue levels 0..n_max; the
    #: configurations are ``class_configs``' rows, symbol 0 idle, 1 + k·m + j class k in phase j)
    values: np.ndarray = field(repr=False, compare=False, default_factory=lambda: np.zeros((0, 0)))
    class_configs: np.ndarray = field(repr=False, compare=False, default_factory=lambda: np.zeros((0, 0), int))

    @property
    def gap(self) -> float:
        """(upper − lower)/lower: the most that every size can lower the objective below the coarse set's
        optimum, as a share."""
        return (self.upper - self.lower) / self.lower

    def to_dict(self) -> dict:
        return {"lower": self.lower, "upper": self.upper, "gap": self.gap, "slack": self.slack,
                "classes": [list(c) for c in self.classes], "class_ratio": self.ratio,
                "coarse_sizes": list(self.coarse_sizes),
                "n_max": self.n_max, "configurations": self.configurations, "states": self.states,
                "iterations": self.iterations, "solve_time_s": self.solve_time_s,
                "coarse": {"n_max": self.coarse.n_max, "states": self.coarse.states,
                           "converged": self.coarse.converged, "table": [int(x) for x in self.coarse.table],
                           "optimal": self.coarse.optimal.to_dict()}}


def size_classes(problem: BatchingProblem, ratio: float) -> tuple[tuple[int, ...], ...]:
    """The allowed sizes in runs of consecutive ones whose mean batch times lie within ``ratio`` of the run's
    first (ms), Bmax alone (the tail above the truncation runs Bmax batches exactly).

    >>> p = BatchingProblem.from_rho(0.5, batch_sizes="1,2,3,4,8")  # l(b) = 0.3051·b + 1.0524 ms
    >>> size_classes(p, 1.5)
    ((1, 2, 3), (4,), (8,))
    >>> size_classes(p, 1.2)
    ((1,), (2, 3), (4,), (8,))
    """
    if isinstance(ratio, bool) or not isinstance(ratio, (int, float)) or not (math.isfinite(ratio) and ratio >= 1):
        raise InputError(f"the class ratio must be a number ≥ 1, got {ratio!r}")
    sizes, lat = problem.batch_sizes, problem.latency_ms()
    out: list[list[int]] = []
    first = math.inf
    for b, lb in zip(sizes[:-1], lat[:-1]):
        if out and lb <= ratio * first:
            out[-1].append(b)
        else:
            out.append([b])
            first = lb
    return tuple(tuple(c) for c in out) + ((sizes[-1],),)


def class_ratio(problem: BatchingProblem, phases: int | None = None) -> float:
    """The finest of :data:`CLASS_RATIOS` whose class model is expected to stay within :data:`CLASS_STATES`
    states (the coarsest where none does).  The truncation it converges at grows with the load: 1.5× the first
    (2·c·Bmax) up to ρ 0.75 per instance, measured 3.4–11× at ρ 0.9, where its classes' least members serve long
    queues faster than Bmax does and the tail (Bmax on every instance) is then far from its own long-queue rule;
    5× is assumed there."""
    m = phase_type(problem, phases).phases
    levels = n_start(problem) * (1.5 if problem.rho <= 0.75 else 5.0) + 1
    for r in CLASS_RATIOS:
        if count_configurations(len(size_classes(problem, r)) * m, problem.instances) * levels <= CLASS_STATES:
            return r
    return CLASS_RATIOS[-1]


def coarse_sizes(problem: BatchingProblem) -> tuple[int, ...]:
    """The powers of two among the allowed sizes, and Bmax (the coarse set compared by default)."""
    return tuple(sorted({b for b in problem.batch_sizes if b & (b - 1) == 0} | {problem.bmax}))


def _class_system(problem: BatchingProblem, ph: PhaseType, kind: np.ndarray, reps: np.ndarray, N: int,
                  idle_power_w: float, max_states: int | None, incomplete_from: int | None = None) -> MultiSystem:
    """The class model truncated at N: configurations over the classes' least members (``reps``, indices into
    the sizes), starts of every size (``kind``: each size's class); ``incomplete_from`` as
    :class:`~.multi_system.MultiSystem`'s."""
    rep_ph = PhaseType(ph.alpha[reps], ph.moves[reps], ph.exits[reps], ph.how)
    sizes = np.asarray(problem.batch_sizes)
    model = MultiServerSMDP(problem.replace(batch_sizes=tuple(int(b) for b in sizes[reps])), rep_ph, N,
                            idle_power_w, max_states)
    sysm = MultiSystem(model, tail=True, starts=(sizes, problem.energy_mj(), ph.alpha, kind),
                       incomplete_from=incomplete_from)
    # a batch's requests are held in service, and its instance kept from idling, for the batch's whole time: both
    # charged at its start (w1·b·l(b)/λ and −w2·P_idle·l(b)), every instance charged P_idle meanwhile
    p, lat = problem, problem.latency_ms()
    sysm.cost_lump = sysm.cost_lump + p.w1 * sizes * lat / p.lam - p.w2 * idle_power_w * lat
    sysm.hold = sysm.n / p.lam
    sysm.cost_rate = p.w1 * sysm.hold + p.w2 * idle_power_w * p.instances
    return sysm


def _closed(sysm: MultiSystem, h: np.ndarray) -> np.ndarray:
    """h closed under starts: H(s) = min(h(s), min over starts b of the start's charge + Σ_j α_b[j]·H(after)),
    level by level (a start lowers the queue), as a (configurations, N + 1) array."""
    N = sysm.N
    H = h.copy()
    for n in range(1, N + 1):
        at = np.nonzero((sysm.n == n) & (sysm.idle > 0))[0]
        for i in range(sysm.sizes.size):
            ok = at[sysm.feasible[at, i + 1]]
            if ok.size:
                nxt = sysm.next[ok, i, :]
                after = (sysm.alpha[i][None, :] * np.where(nxt >= 0, H[np.maximum(nxt, 0)], 0.0)).sum(axis=1)
                H[ok] = np.minimum(H[ok], sysm.cost_lump[i] + after)
    return H.reshape(sysm.model.n_conf, N + 1)


def _moved(cf: list[int], pos: int, to: int) -> tuple[int, ...]:
    """The configuration ``cf`` with the instance at ``pos`` moved to symbol ``to`` (0: idle), sorted."""
    return tuple(sorted(cf[:pos] + [to] + cf[pos + 1:]))


def _slack(sysm: MultiSystem, g: float, H: np.ndarray, problem: BatchingProblem, ph: PhaseType,
           kind: np.ndarray) -> float:
    """The least x ≥ 0 with every waiting inequality of the full model holding at g − x for H (:func:`_closed`) of
    the classes (see the module doc): the largest shortfall over κ."""
    model, N, p = sysm.model, sysm.N, problem
    m, lam, w1 = ph.phases, p.lam, p.w1
    n = np.arange(N + 1)
    up = np.empty_like(H)
    up[:, :N] = H[:, 1:] - H[:, :N]
    up[:, N] = p.w1 * sysm.delta_w_base + p.w2 * sysm.delta_p  # the tail step without the running batches' φ
    kappa = np.where(n == N, 1.0 + lam / sysm.d, 1.0)
    F = w1 * n[None, :] / lam + p.w2 * model.idle_power_w * p.instances - kappa[None, :] * g + lam * up
    phi = sysm.slope_shift(ph, np.asarray(p.batch_sizes))  # (A, m), every size as itself
    index = {tuple(cf): k for k, cf in enumerate(model.configs.tolist())}
    for k, cf in enumerate(model.configs.tolist()):
        for sym in sorted(set(cf) - {0}):
            cnt, pos = cf.count(sym), cf.index(sym)
            cls, j = divmod(sym - 1, m)
            done = H[index[_moved(cf, pos, 0)]] - H[k]
            steps = {j2: H[index[_moved(cf, pos, 1 + cls * m + j2)]] - H[k] for j2 in range(m)
                     if np.any(ph.moves[kind == cls, j, j2] > 0)}
            best = np.full(N + 1, np.inf)
            for i in np.nonzero(kind == cls)[0]:
                term = ph.exits[i, j] * done + np.where(n == N, lam * w1 * phi[i, j], 0.0)
                for j2, d in steps.items():
                    term = term + ph.moves[i, j, j2] * d
                best = np.minimum(best, term)
            F[k] += cnt * best
    wait = sysm.feasible[:, 0].reshape(model.n_conf, N + 1)
    short = np.where(wait, -F / kappa[None, :], -np.inf)
    return max(0.0, float(short.max()))


def bound_every_size(problem: BatchingProblem, *, coarse: tuple[int, ...] | None = None,
                     ratio: float | None = None, phases: int | None = None, idle_power_w: float = 0.0,
                     tol: float = 1e-7, max_states: int | None = None) -> SizeBound:
    """Bracket the optimum of ``problem`` (c = ``problem.instances`` instances, every size of
    ``problem.batch_sizes``) between a class model (classes of :func:`size_classes` at ``ratio``, default
    :func:`class_ratio`) and the exact optimum of the sizes ``coarse`` (default :func:`coarse_sizes`); see the
    module doc.

    ``phases``, ``idle_power_w`` as in :func:`~.multi_pi.solve_instances`; ``max_states`` the most states either
    solve may reach (default :data:`BOUND_MAX_STATES`); ``tol`` the relative agreement of two truncations of
    each.  Contention is refused (the classes' members would slow one another differently).
    """
    t0 = time.perf_counter()
    max_states = check_max_states(BOUND_MAX_STATES if max_states is None else max_states)
    if problem.contention is not None:
        raise InputError("the every-size bound does not take --contention yet; solve the coarse sizes exactly instead")
    if problem.instances < 2:
        raise InputError("the every-size bound is for several instances (--instances 2 or more); one instance "
                         "solves every size exactly")
    if not (isinstance(tol, float) and 0 < tol < 1):
        raise InputError(f"tol must be a number in (0, 1), got {tol!r}")
    sizes = problem.batch_sizes
    coarse = coarse_sizes(problem) if coarse is None else tuple(sorted(set(int(b) for b in coarse)))
    if not set(coarse) <= set(sizes) or problem.bmax not in coarse:
        raise InputError(f"the coarse sizes {','.join(map(str, coarse))} must be allowed sizes and include Bmax = "
                         f"{problem.bmax}")
    ph = phase_type(problem, phases)
    coarse_problem = problem.replace(batch_sizes=coarse)
    idx = np.searchsorted(sizes, coarse)
    cph = phase_type(coarse_problem, phases)
    if cph.phases != ph.phases or not (np.allclose(cph.alpha, ph.alpha[idx]) and np.allclose(cph.exits, ph.exits[idx])):
        raise InputError(f"the batch-time law is fitted differently on the coarse sizes ({cph.how}) than on every "
                         f"size ({ph.how}); give --phases to fix the Erlang order")
    ratio = class_ratio(problem, phases) if ratio is None else ratio
    classes = size_classes(problem, ratio)
    kind = np.concatenate([np.full(len(c), k) for k, c in enumerate(classes)])
    reps = np.searchsorted(sizes, [c[0] for c in classes])
    if np.any((ph.alpha > 0) & (ph.alpha[reps][kind] == 0)):
        raise InputError("the batch-time law starts sizes of one class in different phases; the class model "
                         "cannot hold them")
    fewer_phases = " or fewer phases (--phases)" if ph.phases > 1 and "(exact)" not in ph.how else ""
    try:
        upper = solve_instances(coarse_problem, phases=phases, idle_power_w=idle_power_w, tol=tol, throw=True,
                                max_states=max_states)
    except (InputError, NotConvergedWarning) as e:
        raise InputError(f"the exact solve of the coarse sizes {','.join(map(str, coarse))} failed ({e}); bound "
                         f"against fewer sizes (--size-bound SIZES){fewer_phases}, or raise --max-states") from None
    N, act, prev, total, n_old, moved = n_start(problem), None, None, 0, 0, math.inf
    incomplete_from = None  # carried from one truncation to the next (MultiSystem.incomplete_from)
    while True:
        try:
            sysm = _class_system(problem, ph, kind, reps, N, idle_power_w, max_states, incomplete_from)
        except InputError as e:
            why = ("is too large" if prev is None else
                   f"did not converge: its average cost still moves by {moved:.2g} at N = {n_old}, and a longer "
                   "truncation")
            raise InputError(f"the class model of {len(classes)} classes (ratio {ratio:g}) {why}: {e}; use a "
                             f"larger class ratio (--class-ratio){fewer_phases}, or raise --max-states") from None
        # the one-instance table's start where the model is large (:func:`~.multi_pi.first_policy`): greedy's early
        # policies can be nearly singular, past what incomplete factors solve (four instances, ρ 0.7: 46 → 20 s)
        act = first_policy(sysm, phases, idle_power_w) if act is None else extend_policy(act, n_old, sysm)
        act, g, h, _, its, ok = iterate(sysm, act)
        total += its
        incomplete_from = sysm.incomplete_from
        if not ok:
            raise InputError(f"the class model's policy iteration did not settle in {its} iterations at N = {N}; use "
                             "another class ratio (--class-ratio)")
        if prev is not None:
            moved = abs(g - prev) / abs(g)
            if moved <= tol:
                break
        prev, n_old, N = g, N, N + max(N // 2, problem.bmax)
    H = _closed(sysm, h)
    slack = _slack(sysm, g, H, problem, ph, kind)
    return SizeBound(problem, classes, ratio, coarse, g - slack, upper.optimal.model_cost, slack, N, sysm.model.n_conf,
                     sysm.model.n_states, total, time.perf_counter() - t0, upper, H, sysm.model.configs)
