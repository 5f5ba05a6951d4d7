"""The SMDP tables the SLO optimiser tries with a timer: the w2 front of one server, and on c instances the
front of the c-server model beside the one-server front at λ/c shared by the c instances.

Every candidate is a table n ↦ b (queue lengths 0..s_max, its last entry served above); the optimiser
(:mod:`smdp_batch.analysis.slo`) simulates each on the problem's own law and instances, so a table from a
coarser model (fewer sizes, fewer Erlang phases for a fixed batch time) is still priced exactly as the server
would run it: the coarsening only limits how good the candidates can be, never how they are measured.

**On c > 1 instances** two kinds of table compete:

* *shared*: the one-instance table solved at λ/c (paper 004, eq. 14), run on all c behind the shared queue;
* *c-server*: the optimal table of the c-server SMDP (:func:`~smdp_batch.solvers.multi_pi.solve_instances`) at
  w2 = 4⁻³ … 4³ (extended upward while the table still changes), each distinct table once.  The model is the
  finest that solves within its limits: every allowed size with the law's own phases, then fewer Erlang
  phases for a fixed batch time (8, 4, 2, 1), then the sizes 1, 2, 4, … and Bmax, then Bmax/4, Bmax/2, Bmax.  A
  model whose states × configurations at the start exceed :data:`CANDIDATE_WORK` is skipped for the next: its
  sparse LU would take seconds to minutes per policy-iteration step.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import numpy as np

from ..errors import InputError, solver_checks_convergence
from ..model.problem import BatchingProblem

__all__ = ["Candidate", "one_server_tables", "instances_tables", "instances_model", "W2_GRID"]

#: The w2 values of the c-server front (then ×4 while the table still changes, up to W2_TOP).
W2_GRID = tuple(4.0 ** k for k in range(-3, 4))
W2_TOP = 4.0 ** 6
_PHASE_STEPS = (8, 4, 2, 1)
#: The most states × configurations a candidate model may start with (at N = 2·c·Bmax): the sparse LU's time grows
#: faster than both (measured at the start, exponential times: 2 instances, six sizes, 1.0·10⁵: 0.05 s a
#: factorisation; 4 instances, sizes 8,16,32, 3.1·10⁵: 0.08 s, a whole front 8–17 s as N grows; 3 instances, six
#: sizes, 1.4·10⁶: 5.5 s).  The candidates only propose tables, so a coarser model is taken instead.
CANDIDATE_WORK = 400_000


@dataclass(frozen=True)
class Candidate:
    """One table to try: the decisions n ↦ b, the name its settings are spelled with, its knobs."""

    policy: np.ndarray
    name: str
    knobs: dict


def one_server_tables(problem: BatchingProblem, solve_lam: float, sizes, label_lam: bool,
                      workers: int = 1) -> list[Candidate]:
    """The distinct tables of the one-server w2 front at ``solve_lam`` (per instance: λ/c on c instances), with
    the problem's ``sizes`` (a subset when the largest batch is capped).  ``workers`` > 1: each round of the
    sweep's solves runs on that many threads (the solver's kernels release the GIL; the front is the same)."""
    from .parallel import thread_mapper
    from .pareto import sweep_w2

    c = problem.instances
    one = problem.replace(instances=1, lam=solve_lam / c, batch_sizes=tuple(sizes))
    if workers > 1:
        with thread_mapper(workers) as mapper:
            front = sweep_w2(one, mapper=mapper)
    else:
        front = sweep_w2(one)
    capped = sizes[-1] < problem.bmax
    out = []
    for p in front.points:
        w2 = math.sqrt(p.w2_lo * p.w2_hi) if p.w2_lo > 0 and math.isfinite(p.w2_hi) else p.w2_lo  # as Front.solution
        name = f"smdp:w2={w2:.6g}" if math.isfinite(w2) else f"static:{int(max(p.policy))}"
        name += (f",bmax={sizes[-1]}" if capped else "") + (f",lam={one.lam:.6g}" if label_lam or c > 1 else "")
        knobs = {"w2": w2, "w2_lo": p.w2_lo, "w2_hi": p.w2_hi, "control_limit": p.control_limit, "solve_lam": one.lam,
                 **({"batch_sizes": list(sizes)} if capped else {}), **({"shared_by": c} if c > 1 else {})}
        out.append(Candidate(np.asarray(p.policy, dtype=np.int64), name, knobs))
    return out


def _size_steps(problem: BatchingProblem) -> list[tuple[int, ...]]:
    sizes, B = tuple(problem.batch_sizes), problem.bmax
    steps = [sizes]
    for sub in (tuple(b for b in sizes if b & (b - 1) == 0 or b == B), tuple(b for b in sizes if b in (B // 4, B // 2, B))):
        if sub and sub[-1] == B and sub != steps[-1]:
            steps.append(sub)
    return steps


def instances_model(problem: BatchingProblem) -> tuple[tuple[int, ...], int | None, str]:
    """(sizes, phases, why) of the finest c-server model that solves at the problem's load and w2 within the
    model's limits (module doc); sizes is empty, with the last refusal in ``why``, when none does."""
    from ..model.multi_server import count_configurations, phase_type
    from ..solvers.multi_pi import n_start, solve_instances

    own = phase_type(problem).phases
    fitted = "exact" not in phase_type(problem).how
    phases = [k for k in _PHASE_STEPS if k <= own] if fitted else [None]
    why = ""
    for sizes in _size_steps(problem):
        for k in phases:
            q = problem.replace(batch_sizes=sizes)
            confs = count_configurations(len(sizes) * phase_type(q, k).phases, problem.instances)
            work = confs * (n_start(q) + 1) * confs
            if work > CANDIDATE_WORK:
                why = (f"sizes {','.join(map(str, sizes))} with {phase_type(q, k).phases} phases: {work:.2g} states × "
                       f"configurations, over {CANDIDATE_WORK:.0e}")
                continue
            try:
                with solver_checks_convergence():
                    sol = solve_instances(problem.replace(batch_sizes=sizes), phases=k, throw=False)
            except InputError as e:
                why = str(e)
                continue
            if sol.converged:
                return sizes, k, ""
            why = f"sizes {','.join(map(str, sizes))} with {sol.phases} phases: the truncation did not converge"
    return (), None, why


def instances_tables(problem: BatchingProblem, solve_lam: float, label_lam: bool) -> tuple[list[Candidate], str]:
    """The distinct tables of the c-server front at ``solve_lam`` (module doc), and why there are none if so."""
    from ..solvers.multi_pi import solve_instances

    c = problem.instances
    p = problem.replace(lam=solve_lam)
    sizes, phases, why = instances_model(p)
    if not sizes:
        return [], why
    q = p.replace(batch_sizes=sizes)
    coarse = sizes != tuple(problem.batch_sizes)
    seen: dict[tuple, Candidate] = {}
    last = None
    w2s = list(W2_GRID)
    i = 0
    while i < len(w2s):
        w2 = w2s[i]
        with solver_checks_convergence():
            sol = solve_instances(q.replace(w2=w2), phases=phases, throw=False)
        i += 1
        if not sol.converged:
            continue
        t = sol.table
        changes = np.nonzero(t[1:] != t[:-1])[0]
        key = tuple(int(x) for x in t[: int(changes[-1]) + 2 if changes.size else 1])  # the decisions, not N
        if key not in seen:
            name = f"smdp-c{c}:w2={w2:.6g}" + (f",sizes={'/'.join(map(str, sizes))}" if coarse else "") \
                + (f",phases={sol.phases}" if phases is not None else "") + (f",lam={solve_lam:.6g}" if label_lam else "")
            seen[key] = Candidate(np.asarray(sol.table, dtype=np.int64), name,
                                  {"w2": w2, "solve_lam": solve_lam, "instances": c, "phases": phases,
                                   **({"contention": problem.contention.spec()} if problem.contention else {}),
                                   **({"batch_sizes": list(sizes)} if coarse else {}), "model": sol.phase_law})
        if i == len(w2s) and key != last and w2 * 4 <= W2_TOP:
            w2s.append(w2 * 4)  # the table still changes at the top: larger w2 may batch more
        last = key
    return list(seen.values()), ""
