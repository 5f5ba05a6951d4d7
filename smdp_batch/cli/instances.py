"""``solve --instances c``: the optimal policy for c model instances sharing one queue, beside splitting the
traffic over c one-instance tables and today's one-instance table run on all c."""

from __future__ import annotations

import warnings

import click

from ..analysis.report import describe_policy
from ..errors import NotConvergedWarning
from ..model.problem import BatchingProblem
from ..solvers.multi_pi import MultiEvaluation, evaluate_instances_table, solve_instances
from .options import emit, scenario_line


def _row(name: str, e: MultiEvaluation) -> str:
    return (f"  {name:<26} ĝ = {e.avg_cost:<9.6g} W̄ = {e.mean_latency_ms:<8.4g} ms  P̄ = {e.mean_power_w:<8.5g} W  "
            f"mean batch {e.mean_batch:.3g}")


def solve_instances_cmd(problem: BatchingProblem, phases: int | None, idle_power_w: float, as_json: bool) -> None:
    """Solve, compare and print (see the module doc)."""
    c = problem.instances
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always", NotConvergedWarning)
        sol = solve_instances(problem, phases=phases, idle_power_w=idle_power_w, throw=False)
        one = solve_instances(problem.replace(instances=1, lam=problem.lam / c), phases=phases,
                              idle_power_w=idle_power_w, throw=False)
        # today's answer: the table solved for one instance at the whole load is not stable there, so the
        # one-instance table at its share of the load, run on all c behind the shared queue
        shared = evaluate_instances_table(problem, one.table, phases=phases, idle_power_w=idle_power_w,
                                          n_max=sol.n_max)
    for w in caught:
        click.echo(f"smdp-batch: warning: {w.message}", err=True)
    e1 = one.optimal
    split = MultiEvaluation(
        avg_cost=problem.w1 * e1.mean_latency_ms + problem.w2 * c * e1.mean_power_w,
        mean_latency_ms=e1.mean_latency_ms, mean_power_w=c * e1.mean_power_w, idle_power_w=c * e1.idle_power_w,
        mean_batch=e1.mean_batch, throughput=c * e1.throughput, busy_instances=c * e1.busy_instances,
        boundary_mass=e1.boundary_mass, model_cost=problem.w1 * e1.mean_latency_ms + problem.w2 * c * e1.mean_power_w)
    d = {**sol.to_dict(), "problem": problem.describe(), "idle_power_w": idle_power_w,
         "split_evenly": {k: float(getattr(split, k)) for k in MultiEvaluation.__dataclass_fields__},
         "one_instance_table_shared": {k: float(getattr(shared, k)) for k in MultiEvaluation.__dataclass_fields__}}
    conv = "converged" if sol.converged else "NOT CONVERGED"
    o, t = sol.optimal, sol.table_eval
    text = "\n".join([
        f"smdp-batch — optimal batching policy for {c} instances sharing one queue (c-server SMDP)",
        scenario_line(problem),
        f"  batch time  {sol.phase_law}{'' if not idle_power_w else f'; idle power {idle_power_w:g} W per instance'}",
        f"  model       {sol.states} states ({sol.configurations} configurations of the instances × queue 0..{sol.n_max}), "
        f"{sol.iterations} policy iterations, {conv}, {sol.solve_time_s:.2f} s",
        f"  table       {describe_policy(sol.table, problem.batch_sizes)} (while an instance is idle)",
        "  exact metrics, all on the phase-type model:",
        _row("optimal (n, running)", o),
        _row("its table n ↦ b", t) + f"   (+{100 * (t.avg_cost / o.avg_cost - 1):.2g} %)",
        _row(f"split over {c} queues", split),
        _row("1-instance table, shared", shared),
        f"  the table is what servers follow (runtime DynamicBatcher(instances={c}), simulate --instances {c}); the "
        "optimal policy also looks at what the running batches are doing",
    ])
    emit(d, as_json, text)
