"""The MAP (bursty arrivals) side of ``solve`` and ``simulate``: ``solve --arrivals mmpp:…|map:FILE``
solves the (queue length, phase) table; ``simulate --policy PHASE.h5`` runs it with the phase filter (or the
true phase, a bound)."""

from __future__ import annotations

import sys
import warnings

import click
import numpy as np

from ..analysis.report import describe_policy
from ..errors import InputError, NotConvergedWarning, TableNotConvergedWarning
from ..limits import check_requests
from ..model.arrivals import MAP, parse_arrivals
from .options import build_problem, cost_line, emit, integrity_text, metrics_line, scenario_line, solve_progress


def arrivals_line(a: MAP) -> str:
    r = a.phase_rates
    return (f"  arrivals    {a.spec()}: {a.phases} phases, rates {', '.join(f'{x:.4g}' for x in r)} /ms "
            f"(stationary {', '.join(f'{x:.3g}' for x in a.stationary)}), mean λ̄ = {a.rate:.6g} /ms")


def map_scenario(spec: str, opts: dict):
    """(MAP, problem at its mean rate) from ``--arrivals`` and the scenario options (no --lam/--rho)."""
    if opts.get("lam") is not None or opts.get("rho") is not None:
        raise InputError(f"--arrivals {spec} sets the load (λ = the MAP's mean rate); drop --lam/--rho")
    arrivals = parse_arrivals(spec)
    if arrivals is None:  # a Poisson spelling other than "poisson" (e.g. "poisson:"), which solve did not route
        raise InputError(f"--arrivals {spec!r}: write the Poisson process as 'poisson'")
    problem = build_problem({**opts, "lam": arrivals.rate})
    return arrivals, problem


def solve_map_cmd(spec, s_max, abstract_cost, tol_delta, max_iter, output, as_json, opts) -> None:
    from ..export.hdf5 import write_phase_policy
    from ..solvers.map_solution import solve_map

    arrivals, problem = map_scenario(spec, opts)
    report, finish = solve_progress(sys.stderr.isatty(), "solving the MAP table")
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always", NotConvergedWarning)
        warnings.simplefilter("always", TableNotConvergedWarning)
        try:
            sol = solve_map(problem, arrivals, s_max=s_max, abstract_cost=abstract_cost, tol_delta=tol_delta,
                            max_iter=int(max_iter) if max_iter is not None else 200, progress=report)
            sol.deployed  # noqa: B018 - its warnings (a truncated evaluation) are reported with the solve's
        finally:
            finish()
    for w in caught:
        click.echo(f"smdp-batch: warning: {w.message}", err=True)
    d = sol.to_dict()
    if output:
        write_phase_policy(sol, output)
        d["output"] = output
    r = sol.result
    R = sol.converged_upto
    table = (f"converged up to n = {R} in every phase (verified against s_max = {sol.s_max // 2}); π(R, i) beyond"
             if R is not None else f"not verified as converged; eq. 30 per phase beyond s_max = {sol.s_max}")
    lines = ["smdp-batch — optimal batching policy under MAP arrivals (queue length × phase)",
             scenario_line(problem), arrivals_line(arrivals),
             *([f"  note        {sol.note}"] if sol.note else []),
             f"  truncation  s_max = {sol.s_max} ({sol.rule}), c_o = {sol.model.abstract_cost:.6g}, "
             f"Δ = {sol.evaluation.delta:.3g} (δ = {sol.tol_delta:g}), {sol.candidates} truncations",
             f"  table       {table}",
             f"  solver      pi: {r.iterations} iterations, {'converged' if r.converged else 'NOT CONVERGED'}, "
             f"{sol.seconds * 1e3:.1f} ms"]
    for i in range(arrivals.phases):
        col = np.concatenate([sol.table[: sol.stored_range + 1, i], sol.table[sol.stored_range: sol.stored_range + 1, i]])
        lines.append(f"  phase {i}     (λ = {arrivals.phase_rates[i]:.4g}/ms) "
                     f"{describe_policy(col, problem.batch_sizes)}")
    lines += [cost_line(d["avg_cost"], "truncated model, eq. 21"), metrics_line(d) + " (true phase)",
              "  serving     a server sees arrivals, not phases: `simulate --policy FILE` or runtime.PhasePolicy "
              "use the phase filter"]
    if output:
        lines.append(f"  written     {output}")
    emit(d, as_json, "\n".join(lines))


def stream(spec: str, requests: int, seed: int, table_map: MAP | None = None, time_unit: str | None = None,
           phases: int | None = None):
    """(times, phase path or None) for ``simulate --arrivals``: poisson → None (or the phase table's own MAP),
    trace:FILE → the trace in ms (no phase path; ``time_unit``: its times' unit, --time-unit),
    mmpp:…/map:FILE → a sampled stream with its path.  ``phases``: the phase count the true-phase rule of a
    table needs (a MAP with another count is refused before any draw)."""
    from ..analysis.simulate import read_trace

    kind, _, arg = spec.partition(":")
    kind = kind.strip().lower()
    if kind == "trace" and arg:
        return read_trace(arg, time_unit), None
    if time_unit is not None:
        raise InputError(f"--time-unit {time_unit} is the unit of a trace's times; --arrivals {spec} is not a trace:FILE")
    arrivals = parse_arrivals(spec)
    if arrivals is None:
        if table_map is None:
            return None, None
        arrivals = table_map
    if phases is not None and arrivals.phases != phases:
        raise InputError(f"--phase-rule true acts on the stream's own phase, but --arrivals {spec} has {arrivals.phases} "
                         f"phase(s) and the phase table {phases}; use --phase-rule qmdp or likely (the table's filter "
                         f"runs on any arrivals), or arrivals with {phases} phases")
    return sample_map(arrivals, requests, seed, need_path=phases is not None)


def sample_map(arrivals: MAP, requests: int, seed: int, need_path: bool = False):
    """(times in ms, phase path or None) of ``requests`` arrivals of ``arrivals``, seeded as every command
    samples a MAP (``default_rng([seed, 1])``).  Unless the path is needed, a MAP within FAST_EPS requests of
    Poisson is sampled as its Poisson limit (what solve uses): switching that fast would take millions of phase
    changes to sample; the true phase needs the path, sampled within MAP.check_sampling's bound."""
    from ..model.map_work import FAST_EPS, poisson_gap

    rng = np.random.default_rng([seed, 1])
    if arrivals.phases > 1 and not need_path and poisson_gap(arrivals) <= FAST_EPS:
        return np.cumsum(rng.exponential(1.0 / arrivals.rate, check_requests(requests, "requests"))), None
    t, sw_t, sw_p = arrivals.sample(requests, rng)
    return t, (sw_t, sw_p)


def phase_file_rule(pf, arrivals: MAP, source: str, phase_path):
    """The simulator rule of a loaded phase table: the filter (qmdp | likely) or the true phase (needs a MAP stream)."""
    from ..analysis.phased import phase_rule

    R = pf.converged_upto if pf.converged_upto is not None else pf.s_max
    return phase_rule(pf.policy[: R + 1], arrivals, source, pf.qvalues, pf.actions, phase_path,
                      spec=f"phase table {pf.path}")


def show_phase_table(path: str, as_json: bool) -> None:
    """``show`` for a phase table (schema_version 2)."""
    from ..runtime.phase_file import read_phase_policy

    pf = read_phase_policy(path)
    a = MAP(pf.D0, pf.D1)
    i, t, s = pf.inputs, pf.truncation, pf.solution
    sizes = pf.batch_sizes
    R = pf.converged_upto
    d = {"path": path, **pf.meta, "inputs": i, "truncation": t, "arrivals": a.describe(),
         "solution": {k: v for k, v in s.items() if k != "relative_values"},
         "policy": [[int(x) for x in col] for col in pf.policy.T], "integrity": pf.integrity}
    top = R if R is not None else pf.s_max
    lines = [f"{path}: {pf.meta.get('format')} v{pf.meta.get('schema_version')} (phase table) by "
             f"{pf.meta.get('creator')}, {pf.meta.get('created')}",
             f"  scenario    λ̄ = {i['lam']:.6g} /ms (ρ = {i['rho']:.4g}), batch sizes {sizes[0]}..{sizes[-1]} "
             f"({len(sizes)}), l = {i['latency']}, ζ = {i['energy']}, service {i['service']}, w1 = {i['w1']:g}, "
             f"w2 = {i['w2']:g}",
             arrivals_line(a),
             f"  truncation  s_max = {t['s_max']} ({t.get('s_max_rule', '?')}), c_o = {t['abstract_cost']:.6g}, "
             f"Δ = {t['delta']:.3g}; " + (f"converged up to n = {R} in every phase" if R is not None else "not verified")]
    for k in range(pf.phases):
        col = np.concatenate([pf.policy[: top + 1, k], pf.policy[top: top + 1, k]])
        lines.append(f"  phase {k}     {describe_policy(col, sizes)}")
    lines += [f"  metrics     W̄ = {s['mean_latency_ms']:.6g} ms, P̄ = {s['mean_power_w']:.6g} W (true phase)",
              cost_line(s["avg_cost"], "truncated model, eq. 21"),
              f"  integrity   {integrity_text(pf.integrity)}"]
    emit(d, as_json, "\n".join(lines), strict=True)
