"""Many problems at once: a grid of w2 × λ (or any list) at one truncation, on numba or JAX.

* :func:`truncate_many` builds the truncated models, computing each distinct arrival-count law
  (eqs. 4–6) once — problems that differ only in w1, w2 or c_o share it.
* :func:`solve_batch` solves them.  ``backend="jax"`` stacks the models and solves the whole
  batch in one ``vmap``-ped, jit-compiled call (:mod:`smdp_batch.solvers.jax_backend`); PI
  problems it cannot certify (a numerically singular policy on the way) are re-solved on numba;
  ``backend="numba"`` runs the compiled loop problem by problem, warm-starting each PI from the
  previous problem's policy (neighbours on a grid have nearly the same policy; the answer does
  not depend on the start, only the iteration count does), on one thread per CPU for a long list
  (contiguous runs of it, each such a chain; the solves release the GIL).
"""

from __future__ import annotations

import time
from concurrent.futures import ThreadPoolExecutor
from dataclasses import replace

import numpy as np

from ..errors import InputError, solver_checks_convergence
from ..limits import usable_cpus
from .evaluation import evaluate_indices, evaluate_policy
from ..model.problem import BatchingProblem
from ..model.truncation import ArrivalTable, TruncatedSMDP, truncate
from .pi import check_pi_work, solve_indices, warm_up_pi
from .rvi import ETA_FRACTION, warm_up_rvi
from .result import SolveResult
from .solution import SOLVERS, Solution, _renamed_s_max, check_backend, solve_truncated
from .threads import single_blas

__all__ = ["solve_batch", "solve_models", "truncate_many"]


def _law_key(p: BatchingProblem) -> tuple:
    return (p.lam, p.service.spec(), p.latency.spec(), p.batch_sizes)


def truncate_many(problems: list[BatchingProblem], s_max: int, abstract_cost: float = 100.0) -> list[TruncatedSMDP]:
    """Truncated models of ``problems`` at one s_max.  Problems with equal laws (λ, service, l(b), ζ(b), sizes) share
    one model's arrays: only the costs, which depend on w1 and w2 (eq. 19), are built for each."""
    tables: dict[tuple, ArrivalTable] = {}
    models: dict[tuple, TruncatedSMDP] = {}
    out = []
    for p in problems:
        key = _law_key(p)
        full = key + (p.energy_mj().tobytes(),)
        m = models.get(full)
        if m is not None:  # the same arrays; w1 and w2 enter the costs only
            p.single()
            out.append(replace(m, problem=p, cost_fixed=p.w2 * m.energy + p.w1 * m.hold_fixed,
                               cost_slope=p.w1 * m.y / p.lam))
            continue
        m = models[full] = truncate(p, s_max, abstract_cost, tables.get(key))  # validates s_max and c_o
        if key not in tables:  # the model's P/SF may stop early (compact): its columns past them are 0 up to s_max;
            # its supports are the table's, clipped to s_max, which every model of this batch clips them to
            tables[key] = ArrivalTable(m.P[1:], m.SF[1:], m.klo[1:], m.khi[1:],
                                       span=m.s_max if m.P.shape[1] <= m.s_max else None)
        out.append(m)
    return out


def solve_models(models: list[TruncatedSMDP], solver: str = "pi", eps: float = 0.01, max_iter: int | None = None,
                 eta_fraction: float = ETA_FRACTION, policy0: np.ndarray | None = None,
                 workers: int | None = None) -> list[SolveResult]:
    """Solve built models on numba (the solver's result each, no evaluation): :func:`solve_batch`'s numba path, and
    what ``benchmarks/bench_solvers.py`` times against peers that are handed built arrays.

    PI warm-starts from ``policy0[i]`` when given, else from the previous model's policy (when it serves B
    on long queues and the truncation and sizes are the same: then it fits this model as it stands); the answer
    does not depend on the start, only the iterations do.  ``workers``: threads (:func:`solve_batch`).
    """
    return [r for r, _ in _solve_models(models, solver, eps, max_iter, eta_fraction, policy0, workers)]


#: Problems per thread below which the default ``workers`` starts no more threads: a pool's start and hand-offs cost
#: about as much as a few small solves (0.1–0.3 ms each at Bmax 32).
MIN_PER_WORKER = 16


def _worker_count(workers: int | None, n: int) -> int:
    """Threads for ``n`` problems: ``workers`` (at most n), or by default the usable CPUs, one per
    :data:`MIN_PER_WORKER` problems."""
    if workers is None:
        return max(1, min(usable_cpus(), n // MIN_PER_WORKER))
    if isinstance(workers, bool) or not isinstance(workers, (int, np.integer)) or workers < 1:
        raise InputError(f"workers must be a whole number ≥ 1 (threads), got {workers!r}")
    return max(1, min(int(workers), n))


def _solve_models(models, solver, eps, max_iter, eta_fraction, policy0, workers) -> list[tuple]:
    """:func:`solve_models`: each result with (its policy as action indices, that policy's band factors) (PI; None
    for RVI).  PI's models are split into contiguous runs solved on ``workers`` threads (the kernels release the
    GIL), one BLAS thread held for all of them from the calling thread; each run is a chain of warm starts
    (:func:`_solve_chain`).  RVI runs here, one by one."""
    n = len(models)
    if solver != "pi":
        rs = [solve_truncated(m, solver, eps, max_iter, eta_fraction, policy0=None if policy0 is None else policy0[i])
              for i, m in enumerate(models)]
        return [(r, None) for r in rs]
    warm_up_pi()
    k = _worker_count(workers, n)

    def run(lo: int, hi: int) -> list[tuple]:
        return _solve_chain(models[lo:hi], None if policy0 is None else policy0[lo:hi], max_iter)

    with single_blas():
        if k == 1:
            return run(0, n)
        # runs of about n/(2k), at least MIN_PER_WORKER: long enough to chain warm starts, short enough that an
        # interrupt or an error waits only for the runs already started (the rest are cancelled)
        size = max(MIN_PER_WORKER, -(-n // (2 * k)))
        pool = ThreadPoolExecutor(k, thread_name_prefix="solve-batch")
        try:
            parts = [f.result() for f in [pool.submit(run, lo, min(n, lo + size)) for lo in range(0, n, size)]]
        finally:
            pool.shutdown(wait=True, cancel_futures=True)
    return [x for part in parts for x in part]


def _solve_chain(models, policy0, max_iter) -> list[tuple[SolveResult, tuple]]:
    """PI on ``models`` in order, each with (its policy's action indices, their band factors): each model checked
    and costed here, its start handed on as the previous model's action indices; a truncation and size set's
    infeasible (state, action) pairs are found once."""
    out: list[tuple[SolveResult, tuple]] = []
    prev, prev_key, infeasible = None, None, None
    for i, m in enumerate(models):
        check_pi_work(m)
        key = (m.s_max, m.tail_action, m.actions.tobytes())
        if key != prev_key:
            infeasible = ~m.feasible()
        start = None
        if policy0 is not None:
            try:
                start = m.action_index(policy0[i])  # a given start that does not fit this model's sizes is not used
            except InputError:
                start = None
        elif key == prev_key:
            start = prev
        r, pol, factors = solve_indices(m, None if start is None else start[None, :], m.costs(infeasible),
                                        max_iter or 1000)
        out.append((r, (pol, factors)))
        a = int(m.actions[pol[-2]])  # eq. 30's tail action drains long queues: the start fits the next model
        prev, prev_key = (pol if a > 0 and m.problem.lam * float(m.y[pol[-2]]) < a else None), key
    return out


def solve_batch(
    problems: list[BatchingProblem],
    s_max: int | None = None,
    abstract_cost: float = 100.0,
    solver: str = "pi",
    backend: str = "numba",
    eps: float = 0.01,
    max_iter: int | None = None,
    eta_fraction: float = ETA_FRACTION,
    policy0: np.ndarray | None = None,
    workers: int | None = None,
    **deprecated,
) -> list[Solution]:
    """Solve every problem at the fixed truncation ``s_max``; one :class:`Solution` each, in order.

    s_max : one integer ≥ Bmax for the whole batch (the old keyword ``smax=`` still works and warns).
    policy0 : optional (len(problems), s_max+2) batch sizes to warm-start PI (e.g. the previous
        sweep's policies); by default numba chains warm starts along the list and JAX starts greedy.
    workers : threads for PI on the numba backend (its kernels release the GIL; RVI and JAX run on the calling
        thread): by default the CPUs this process may use, one per 16 problems.  The problems are split into
        contiguous runs (two per thread, at least 16 problems each), each a chain of warm starts, and the answers
        are the same on any number of threads (the iterations may differ).  An interrupt or an error waits only
        for the runs already started.
    A batch solved with JAX needs one set of batch sizes (one shape).  Solutions whose policy
    waits on long queues (a degenerate truncation) are returned as they are; check
    ``Solution.degenerate`` or use :func:`smdp_batch.solve` with s_max="auto" for those.
    """
    smax = _renamed_s_max(s_max, deprecated, "solve_batch")
    if solver not in SOLVERS:
        raise InputError(f"unknown solver {solver!r}; valid: {', '.join(SOLVERS)}")
    check_backend(backend)
    try:
        whole = not isinstance(smax, str) and int(smax) == smax
    except (TypeError, ValueError):
        whole = False
    if not whole:
        raise InputError(f"solve_batch needs one integer s_max ≥ Bmax for the whole batch, got {smax!r}")
    problems = list(problems)
    if not problems:
        return []
    if policy0 is not None:
        policy0 = np.asarray(policy0)
        if policy0.shape != (len(problems), int(smax) + 2):
            raise InputError(f"policy0 must have shape ({len(problems)}, {int(smax) + 2}), got {policy0.shape}")
    _worker_count(workers, len(problems))  # a bad count is refused before any work
    if backend != "jax":  # numba's load-or-compile stays out of Solution.seconds
        (warm_up_rvi if solver == "rvi" else warm_up_pi)()
    t0 = time.perf_counter()
    models = truncate_many(problems, int(smax), abstract_cost)
    if backend == "jax":
        from .jax_backend import pi_batch, rvi_batch

        if solver == "pi":
            with solver_checks_convergence():
                results = pi_batch(models, policy0=policy0, max_iter=max_iter or 1000)
            # problems JAX could not certify (a numerically singular policy): the numba path recovers
            results = [r if r.converged else solve_truncated(m, "pi", max_iter=max_iter) for m, r in zip(models, results)]
        else:
            results = rvi_batch(models, eps=eps, max_iter=max_iter or 100_000, eta_fraction=eta_fraction)
        evaluations = [evaluate_policy(m, r.policy) for m, r in zip(models, results)]
    else:
        # the metrics here, on this thread: on the solving threads their Python would contend for the GIL
        solved = _solve_models(models, solver, eps, max_iter, eta_fraction, policy0, workers)
        results = [r for r, _ in solved]
        evaluations = [evaluate_policy(m, r.policy) if pf is None else evaluate_indices(m, *pf)
                       for m, (r, pf) in zip(models, solved)]
    secs = (time.perf_counter() - t0) / len(models)
    return [Solution(m.problem, m, r, ev, 1e-3, False, secs) for m, r, ev in zip(models, results, evaluations)]
