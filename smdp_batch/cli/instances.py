"""``solve --instances c``: the optimal policy for c model instances sharing one queue, beside splitting the
traffic over c one-instance tables and today's one-instance table run on all c; with ``--size-bound``, the optimum
over every size bracketed where it is past the exact model (:mod:`smdp_batch.solvers.multi_bound`)."""

from __future__ import annotations

import math
import warnings

import click
import numpy as np

from ..analysis.report import describe_busy, describe_policy
from ..errors import InputError, NotConvergedWarning, solver_checks_convergence
from ..specs.contention import parse_contention
from ..model import multi_server
from ..model.problem import BatchingProblem, batch_size_set
from ..solvers.multi_bound import bound_every_size
from ..solvers.multi_pi import MultiEvaluation, MultiSolution, evaluate_instances_table, n_start, solve_instances
from .options import emit, scenario_args, scenario_line, sizes_text
from .slo import _short


def _row(name: str, e: MultiEvaluation) -> str:
    return (f"  {name:<26} ĝ = {e.avg_cost:<9.6g} W̄ = {e.mean_latency_ms:<8.4g} ms  P̄ = {e.mean_power_w:<8.5g} W  "
            f"mean batch {e.mean_batch:.3g}")


AUTO_MAX = 8  #: solve --instances auto tries 1..AUTO_MAX instances


def auto_count(opts: dict) -> int:
    """The most instances ``--instances auto`` tries: AUTO_MAX, or fewer where ``--contention`` covers fewer."""
    cont = parse_contention(opts.get("contention"))
    return AUTO_MAX if cont is None else min(AUTO_MAX, cont.levels)


def _price_table(problem: BatchingProblem, table, phases: int | None, idle_power_w: float, n: int,
                 max_states: int | None = None, sol: MultiSolution | None = None) -> MultiEvaluation:
    """Exact metrics of a table n ↦ b (or busy-aware, (k, n) ↦ b) on the problem's instances, truncated at ``n``:
    with the tail boundary when the table ends in Bmax (the tail serves Bmax; on ``sol``'s own system where it is
    that truncation, :meth:`MultiSolution.price`), else on a plain truncation 4× longer (its own long-queue
    size)."""
    tail = bool(np.all(np.asarray(table)[..., -1] == problem.bmax))
    if tail and sol is not None and sol.n_max == n and sol.system is not None and sol.system.tail:
        return sol.price(table)
    return evaluate_instances_table(problem, table, phases=phases, idle_power_w=idle_power_w,
                                    n_max=n if tail else 4 * n, boundary="tail" if tail else "loss",
                                    max_states=max_states)


def choose_instances(problem: BatchingProblem, phases: int | None, idle_power_w: float,
                     max_states: int | None = None) -> tuple[list[dict], MultiSolution]:
    """--instances auto at the problem's total λ: the c-server optimum for c = 1..AUTO_MAX (or why a count cannot
    be solved: the load is unstable on it, or its model is past the limits), and the solution of least
    objective (the fewest instances on a tie within 1e-9).  It stops two counts past the best, or at the first count
    past the limits (larger ones are larger models)."""
    rows: list[dict] = []
    best: MultiSolution | None = None
    worse = 0
    for c in range(1, problem.instances + 1):
        try:
            pc = problem.replace(instances=c)
        except InputError as e:  # the load is beyond c instances
            rows.append({"instances": c, "why": str(e)})
            continue
        try:
            with solver_checks_convergence():
                sol = solve_instances(pc, phases=phases, idle_power_w=idle_power_w, throw=False,
                                      max_states=max_states)
        except InputError as e:  # past the model's limits: so are all larger counts
            rows.append({"instances": c, "why": str(e)})
            break
        rows.append({"instances": c, "converged": sol.converged, "optimal": sol.optimal.to_dict()})
        if sol.converged and (best is None or sol.optimal.avg_cost < best.optimal.avg_cost * (1 - 1e-9)):
            best, worse = sol, 0
        elif best is not None:
            worse += 1
            if worse == 2:  # two counts past the best that cost more: more instances only add idle power and time
                break
    if best is None:
        why = "; ".join(f"{r['instances']}: {r.get('why', 'not converged')}" for r in rows)
        raise InputError(f"no instance count 1..{problem.instances} could be solved at λ = {problem.lam:.6g} /ms: {why}")
    return rows, best


def solve_instances_cmd(problem: BatchingProblem, phases: int | None, idle_power_w: float, as_json: bool,
                        auto: bool = False, output: str | None = None, max_states: int | None = None) -> None:
    """Solve, compare and print (see the module doc); ``auto``: choose the count first (:func:`choose_instances`);
    ``max_states``: the state limit raised on purpose (``--max-states``)."""
    rows: list[dict] = []
    sol: MultiSolution | None = None
    if auto:
        rows, sol = choose_instances(problem, phases, idle_power_w, max_states)
        problem = sol.problem
    c = problem.instances
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always", NotConvergedWarning)
        if sol is None:
            sol = solve_instances(problem, phases=phases, idle_power_w=idle_power_w, throw=False,
                                  max_states=max_states)
        one = solve_instances(problem.replace(instances=1, lam=problem.lam / c), phases=phases,
                              idle_power_w=idle_power_w, throw=False)
        # today's answer: the table solved for one instance at the whole load is not stable there, so the
        # one-instance table at its share of the load, run on all c behind the shared queue
        shared = _price_table(problem, one.table, phases, idle_power_w, sol.n_max, max_states, sol)
    for w in caught:
        click.echo(f"smdp-batch: warning: {w.message}", err=True)
    e1 = one.optimal
    cost = problem.w1 * e1.mean_latency_ms + problem.w2 * c * e1.mean_power_w  # c copies of one queue at λ/c
    split = MultiEvaluation(
        avg_cost=cost, mean_latency_ms=e1.mean_latency_ms, mean_power_w=c * e1.mean_power_w,
        idle_power_w=c * e1.idle_power_w, mean_batch=e1.mean_batch, throughput=c * e1.throughput,
        busy_instances=c * e1.busy_instances, boundary_mass=e1.boundary_mass, model_cost=cost)
    if output:
        from ..export.hdf5 import write_instances_policy

        write_instances_policy(sol, output, idle_power_w)
    # c queues on one device still contend, which the one-instance model cannot price: no split row then
    split_ok = problem.contention is None
    d = {**sol.to_dict(), "problem": problem.describe(), "idle_power_w": idle_power_w,
         "split_evenly": split.to_dict() if split_ok else None, "one_instance_table_shared": shared.to_dict(),
         **({"output": output} if output else {})}
    lines = []
    if auto:
        d["auto"] = rows
        lines.append(f"  instances   auto at λ = {problem.lam:.6g} /ms: the count of least w1·W̄ + w2·P̄ (each exact, "
                     f"c-server model{f', idle {idle_power_w:g} W per instance' if idle_power_w else ''})")
        for r in rows:
            if "why" in r:
                lines.append(f"    {r['instances']:>2}  {_short(r['why'], 150)}")
            else:
                o = r["optimal"]
                lines.append(f"    {r['instances']:>2}  ĝ = {o['avg_cost']:<9.6g} W̄ = {o['mean_latency_ms']:<8.4g} ms  "
                             f"P̄ = {o['mean_power_w']:<8.5g} W{'' if r['converged'] else '  (not converged)'}"
                             + ("   ← chosen" if r["instances"] == c else ""))
    conv = "converged" if sol.converged else "NOT CONVERGED"
    o, t = sol.optimal, sol.table_eval
    text = "\n".join([
        f"smdp-batch — optimal batching policy for {c} instance{'s sharing one queue' if c > 1 else ''} (c-server SMDP)",
        scenario_line(problem), *lines,
        f"  batch time  {sol.phase_law}{'' if not idle_power_w else f'; idle power {idle_power_w:g} W per instance'}",
        f"  model       {sol.states} states ({sol.configurations} configurations of the instances × queue 0..{sol.n_max}), "
        f"{sol.iterations} policy iterations, {conv}, {sol.solve_time_s:.2f} s",
        f"  table       {describe_policy(sol.table, problem.batch_sizes)} (while an instance is idle)",
        "  exact metrics, all on the phase-type model:",
        _row("optimal (n, running)", o),
        _row("its table n ↦ b", t) + f"   ({_gap(t.avg_cost, o.avg_cost)})",
        *([_row("busy-aware table (k, n)", sol.busy_eval) + f"   ({_gap(sol.busy_eval.avg_cost, o.avg_cost)})"]
          if sol.busy_eval is not None else []),
        *([_row(f"split over {c} queues", split)] if c > 1 and split_ok else []),
        *([_row("1-instance table, shared", shared)] if c > 1 else []),
        *([f"  not priced  split over {c} queues: queues on one device still slow each other down, which the "
           "one-instance model leaves out"] if c > 1 and not split_ok else []),
        *([f"  the table is what servers follow (runtime DynamicBatcher(instances={c}), simulate --instances {c}); the "
           "optimal policy also looks at what the running batches are doing"] if sol.busy_table is None else
          [*busy_lines(sol.busy_table, problem.batch_sizes),
           f"  smdp-batch's runtime follows the busy-aware table (DynamicBatcher(instances={c}) counts its running "
           f"batches; simulate --policy FILE --instances {c}); Triton and Ray follow n ↦ b alone (export)"]),
        *([f"  written     {output} (its table{'s' if sol.busy_table is not None else ''} for {c} instances: "
           "PolicyTable.load, simulate --policy FILE)"] if output else []),
    ])
    emit(d, as_json, text)


#: Every size's exact model is said to be within reach up to this many states (c = 2 with the 32 sizes at ρ 0.5 and
#: 0.7: 108 273 states, 5–6 s).
EXACT_REACH = 250_000


def _room(states: int) -> int:
    """A state limit that lets a solve of this many states grow its truncation once more (by half), rounded up."""
    return min(multi_server.MULTI_STATE_MAX, max(multi_server.MULTI_STATE_LIMIT, -(-2 * states // 10_000) * 10_000))


def bound_every_size_cmd(problem: BatchingProblem, coarse: str, ratio, phases: int | None, idle_power_w: float,
                         as_json: bool, max_states: int | None = None) -> None:
    """solve --instances C --size-bound SIZES|auto: every size's optimum between SIZES' exact optimum and the
    class model's certified bound (:func:`~smdp_batch.solvers.multi_bound.bound_every_size`)."""
    sizes = None if coarse.strip().lower() == "auto" else batch_size_set(sizes=coarse)
    b = bound_every_size(problem, coarse=sizes, ratio=None if ratio is None else float(ratio), phases=phases,
                         idle_power_w=idle_power_w, max_states=max_states)
    c, cs = problem.instances, b.coarse
    every = sizes_text(problem.batch_sizes)
    full = multi_server.count_configurations(len(problem.batch_sizes) * cs.phases, c)
    full_states = full * (cs.n_max + 1)  # at the coarse solve's truncation, where the exact one is likely to stop
    extra = (f" --w2 {problem.w2:.10g}" + (f" --phases {phases}" if phases is not None else "")
             + (f" --idle-power {idle_power_w:.10g}" if idle_power_w else ""))
    limit = (f" --max-states {_room(cs.states)}" if cs.states > multi_server.MULTI_STATE_LIMIT
             or cs.states * cs.configurations > multi_server.MULTI_WORK_LIMIT else "")
    classes = " | ".join(f"{cl[0]}" if len(cl) == 1 else f"{cl[0]}–{cl[-1]}" for cl in b.classes)
    coarse_txt = ",".join(map(str, b.coarse_sizes))
    d = {**b.to_dict(), "problem": problem.describe(), "idle_power_w": idle_power_w, "full_configurations": full}
    text = "\n".join([
        f"smdp-batch — every size on {c} instances, its optimum bracketed (c-server SMDP)",
        scenario_line(problem),
        f"  batch time  {cs.phase_law}{'' if not idle_power_w else f'; idle power {idle_power_w:g} W per instance'}",
        f"  every size  {every}: {full} configurations of the instances, {full_states} states at queue 0..{cs.n_max} "
        + (f"(within reach of the exact solve: drop --size-bound, with --max-states {_room(full_states)})"
           if full_states <= EXACT_REACH else "(past the exact model)"),
        f"  upper       ĝ* ≤ {b.upper:.6g}   the optimum of the sizes {coarse_txt}, exact ({cs.states} states, "
        f"queue 0..{cs.n_max}, {'converged' if cs.converged else 'NOT CONVERGED'})",
        f"  lower       ĝ* ≥ {b.lower:.6g}   running batches known by class ({classes}; times within "
        f"{b.ratio:g}×): {b.states} states, queue 0..{b.n_max}, {b.iterations} policy iterations, "
        + ("exact (each class is one size)" if all(len(cl) == 1 for cl in b.classes) else "certified"
           + (f" less {b.slack:.3g}" if b.slack > 1e-9 * abs(b.lower) else "")),
        "  so          " + (f"every size can lower w1·W̄ + w2·P̄ by at most {100 * b.gap:.3g} % below the sizes "
                            f"{coarse_txt}" if b.gap > 1e-9 else f"the sizes {coarse_txt} are optimal among every size")
        + f" ({b.solve_time_s:.1f} s)",
        f"  their table smdp-batch solve --instances {c} {scenario_args(cs.problem)}{extra}{limit} -o table.h5",
    ])
    emit(d, as_json, text)


def _gap(cost: float, optimum: float) -> str:
    """A table's cost above the optimum, in %, or "= the optimum" within 10⁻⁹."""
    gap = cost / optimum - 1
    return "= the optimum" if abs(gap) < 1e-9 else f"+{100 * gap:.2g} %"


def busy_lines(busy, sizes) -> list[str]:
    """The busy-aware rows as text lines, the first one labelled."""
    return [f"  {'busy-aware' if i == 0 else '':<10}  {line}" for i, line in enumerate(describe_busy(busy, sizes))]


def evaluate_instances_file(path: str, pf, problem: BatchingProblem, as_json: bool) -> None:
    """evaluate --policy FILE for a c-server table: its exact metrics on the c-server model (the phases and idle
    power it was solved with, on the scenario given or stored)."""
    phases = pf.inputs.get("phases")
    idle = float(pf.inputs.get("idle_power_w", 0.0))
    table = pf.policy[:-1]
    n = max(n_start(problem), len(table))
    # a table solved past the default state limit (solve --max-states) is priced on its own truncation
    _, states = multi_server.model_size(problem, multi_server.phase_type(problem, phases), n)
    # the limits are read now, not at import (a caller or a test may set them)
    most = min(states, multi_server.MULTI_STATE_MAX) if states > multi_server.MULTI_STATE_LIMIT else None
    ev = _price_table(problem, table, phases, idle, n, most)
    c = problem.instances
    rows = [_row("the table n ↦ b", ev)]
    d = {**problem.describe(), "policy_spec": path, **ev.to_dict(), "objective": ev.avg_cost,
         "policy": [int(a) for a in pf.policy], "phases": phases, "idle_power_w": idle}
    if pf.policy_busy is not None:  # what the runtime and simulate --policy FILE run: the top-level metrics
        bev = _price_table(problem, pf.policy_busy[:, :-1], phases, idle, n, most)
        d.update({**bev.to_dict(), "objective": bev.avg_cost, "policy_busy": pf.policy_busy.tolist(),
                  "table_eval": ev.to_dict()})
        rows = [_row("busy-aware table", bev) + "   (DynamicBatcher, simulate)", rows[0] + "   (Triton, Ray exports)"]
    text = "\n".join([
        f"smdp-batch — exact evaluation of {path} on {c} instances sharing the queue (c-server model)",
        scenario_line(problem),
        f"  policy      {describe_policy(pf.policy, problem.batch_sizes)}",
        *(busy_lines(pf.policy_busy, problem.batch_sizes) if pf.policy_busy is not None else []),
        *rows,
    ])
    emit(d, as_json, text)


def compare_counts(problem: BatchingProblem, slo, lams: list[float], requests: int, seed: int, shape,
                   idle_power_w: float) -> tuple[list[dict], BatchingProblem]:
    """compare --instances auto: at the same total loads, the table + timer family's least power (idle power
    included) meeting ``slo`` on c = 1, 2, … AUTO_MAX instances; it stops two counts past the best.  Returns one
    row per count tried and the problem on the count of least power (the fewest on a tie within the intervals)."""
    from ..analysis.slo import optimise

    rows: list[dict] = []
    best: dict | None = None
    worse = 0
    for c in range(1, problem.instances + 1):
        try:
            pc = problem.replace(instances=c)
            ans = optimise(pc, slo, lams, families=("table+timer",), requests=requests, seed=seed, arrivals=shape,
                           defaults=False, idle_power_w=idle_power_w)
        except InputError as e:  # the load is beyond c instances
            rows.append({"instances": c, "why": str(e)})
            continue
        s = ans.best["table+timer"]
        if s is None:
            rows.append({"instances": c, "why": f"no table + timer setting meets {slo.text()} at every load"})
        else:
            rows.append({"instances": c, "setting": s.spec, "mean_power_w": s.power_w, "mean_power_ci_w": s.power_ci,
                         "problem": pc})
        if s is not None and (best is None or s.power_w + math.hypot(s.power_ci, best["mean_power_ci_w"])
                              < best["mean_power_w"]):
            best, worse = rows[-1], 0
        elif best is not None:
            worse += 1
            if worse == 2:  # two counts past the best that draw no less: more only add idle instances
                break
    if best is None:
        why = "; ".join(f"{r['instances']}: {r['why']}" for r in rows)
        raise InputError(f"no instance count 1..{problem.instances} meets {slo.text()} at every load: {why}")
    chosen = best["problem"]
    for r in rows:
        r.pop("problem", None)
        r["chosen"] = r["instances"] == chosen.instances
    return rows, chosen


def count_lines(rows: list[dict], chosen: int) -> list[str]:
    """The per-count table of ``compare --instances auto``."""
    out = ["  instances   auto: the table + timer family's least power meeting the SLO on each count (same total load)"]
    for r in rows:
        if "why" in r:
            out.append(f"    {r['instances']:>2}  {_short(r['why'], 150)}")
        else:
            out.append(f"    {r['instances']:>2}  {r['mean_power_w']:9.4g} ± {r['mean_power_ci_w']:<5.2g} W  {r['setting']}"
                       + ("   ← chosen" if r["instances"] == chosen else ""))
    out.append(f"  chosen      {chosen} instance{'s' if chosen > 1 else ''}: the least power (a count only replaces a "
               "smaller one when it saves more than their intervals); its full comparison follows")
    return out
