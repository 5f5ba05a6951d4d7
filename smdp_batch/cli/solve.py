"""Commands that solve and read policy tables: ``solve`` (one table or a λ-bank), ``evaluate``
(exact metrics of any policy), ``show`` (what a table file holds) and ``tables`` (a grid of tables
with an index and a Fig. 3-style chart)."""

from __future__ import annotations

import os
import sys
import time
import warnings

import click

from .. import __version__
from ..analysis.report import describe_policy
from ..baselines import parse_policy
from ..errors import DegenerateTruncationWarning, InputError, NotConvergedWarning, TableNotConvergedWarning
from ..export.hdf5 import write_policy
from ..runtime.schema import read_policy
from ..solvers import BACKENDS, SOLVERS, solve
from ..solvers.evaluation import control_limit_of, evaluate_deployed
from ..solvers.search import PROBABLE_MASS, limiting_actions, limiting_sizes
from ..solvers.solution import check_backend
from .options import (
    ARGV, UNITS, apply_renames, contention_option, cost_line, deprecated_option, emit, file_inputs, build_problem, json_option,
    load_grids, metrics_line, note_energy, prepare_outputs, problems_over, scenario_files, scenario_line, scenario_options, sizes_text,
    progress_line, refuse_swept, solve_progress, spec_files, integrity_text,
    write_text_atomically,
)
from ..limits import IDLE_POWER_MAX_W, ITER_LIMIT, STATE_LIMIT
from ..model.multi_server import MULTI_STATE_LIMIT, MULTI_STATE_MAX, PHASES_DEFAULT, PHASES_LIMIT
from ..specs.contention import parse_contention
from .types import FigurePath, Grid, InputFile, Instances, Number, OneOf, OutputDir, OutputPath, Power, SMax, option


@click.command("solve", short_help="Solve for the optimal batching policy of one scenario or a λ-bank.")
@scenario_options
@option("--s-max", "s_max", type=SMax(), default="auto", show_default=True,
              help="auto: a converged table (every stored decision verified against a truncation ≥ 2× longer, or, "
                   "for exponential batch times beyond that search, one past the bias's dying terms); "
                   "minimal: paper 004's smallest s_max with Δ < δ; or a truncation s_max ≥ Bmax.")
@deprecated_option("--smax", "--s-max", "s_max", type=SMax())
@option("--abstract-cost", type=Number(), default="100", show_default=True,
        help="Overflow cost c_o (eq. 19); with --s-max auto a floor, raised to 1.5·ĝ where ĝ exceeds it.")
@option("--tol-delta", type=Number(), default="1e-3", show_default=True, help="δ: accept a truncation when Δ < δ (eq. 22).")
@option("--solver", type=OneOf(SOLVERS, "solver"), default="pi", show_default=True,
              help="pi (exact policy iteration) or rvi (the paper's Alg. 1).")
@option("--eps", type=Number(), default="0.01", show_default=True, help="RVI span tolerance ε.")
@option("--max-iter", type=Number(integer=True, min=1, max=ITER_LIMIT), default=None, show_default="RVI 100000, PI 1000",
              help="Iteration cap.")
@option("--backend", type=OneOf(BACKENDS, "backend"), default="numba", show_default=True,
              help="numba (CPU) or jax (CPU/GPU; pip install 'smdp-batch[jax]'); an auto s_max scans on numba.")
@load_grids("a λ-bank; -o writes one bank file")
@option("--arrivals", default="poisson", show_default=True, metavar="SPEC",
        help="poisson | mmpp:L1,L2,R12,R21 | map:FILE.json (bursty arrivals: a table per queue length and phase; "
             "the load is the MAP's mean rate).")
@option("--instances", type=Instances(), default="1", show_default=True,
        help="Model instances sharing the one queue (Triton's instance_group count); ρ is per instance. Above 1 the "
             "c-server SMDP is solved with phase-type batch times; auto (with --lam, the total rate) picks the count "
             "of least objective among 1..8.")
@option("--phases", type=Number(integer=True, min=1, max=PHASES_LIMIT), default=None,
        show_default=f"{PHASES_DEFAULT} for a fixed batch time",
        help="With --instances > 1: Erlang phases standing for a fixed (det) batch time, or the most of a fitted law.")
@option("--idle-power", "idle_power", type=Power(min=0, max=IDLE_POWER_MAX_W), default="0", show_default=True,
        help="With --instances > 1: power of an idle instance, W.")
@option("--max-states", type=Number(integer=True, min=MULTI_STATE_LIMIT, max=MULTI_STATE_MAX), default=None,
        show_default=f"{MULTI_STATE_LIMIT}",
        help="With --instances > 1: raise the most states of the c-server model (time and memory grow with them: "
             "2 instances with every size 1..32 need 108 273 states at ρ 0.5, about 7 s and 0.4 GB on 2 cores).")
@option("--size-bound", "size_bound", default=None, metavar="SIZES|auto",
        help="With --instances > 1: bracket the optimum over every allowed size, where it is past the exact model "
             "(every size on 3 or more instances), between the exact optimum of SIZES (auto: the powers of two "
             "and Bmax) and a model that knows running batches by class of similar batch times.")
@option("--class-ratio", type=Number(min=1, max=100), default=None,
        show_default="the finest of 1.1, 1.25, 1.5, 2, 3, 4 whose class model is expected within 100 000 states",
        help="With --size-bound: the most a class's batch times differ, as a factor.")
@contention_option
@option("-o", "--output", type=OutputPath(".h5", ".hdf5"), default=None, help="Write the policy table (or bank) to FILE.h5.")
@json_option
@apply_renames
def solve_cmd(s_max, abstract_cost, tol_delta, solver, eps, max_iter, backend, lam_grid, rho_grid, arrivals, instances,
              phases, idle_power, max_states, size_bound, class_ratio, output, as_json, **opts):
    """Solve for the optimal policy (no options: paper 004's basic scenario at ρ = 0.5, w2 = 1)."""
    prepare_outputs([("-o", output)], scenario_files(opts) + spec_files(arrivals, "--arrivals"))
    check_backend(backend)
    kind, _, arg = arrivals.strip().partition(":")
    if kind.strip().lower() != "poisson" or arg.strip():  # "poisson" in any spelling parse_arrivals reads as Poisson
        from .bursty import solve_map_cmd

        bad = [f for f, v in (("--lam-grid", lam_grid), ("--rho-grid", rho_grid)) if v is not None]
        bad += ["--solver rvi"] if solver != "pi" else []
        bad += ["--backend jax"] if backend != "numba" else []
        bad += ["--s-max minimal"] if str(s_max).lower() == "minimal" else []
        bad += [f"--instances {instances}"] if instances != 1 else []
        bad += ["--phases"] if phases is not None else []
        bad += ["--idle-power"] if idle_power else []
        bad += ["--max-states"] if max_states is not None else []
        bad += [f for f, v in (("--size-bound", size_bound), ("--class-ratio", class_ratio)) if v is not None]
        bad += ["--contention"] if opts.get("contention") is not None else []
        if bad:
            raise InputError(f"--arrivals {arrivals} (a MAP table) cannot be combined with {', '.join(bad)}: it is solved "
                             "by exact policy iteration on numba with --s-max auto or an integer")
        return solve_map_cmd(arrivals, s_max, abstract_cost, tol_delta, max_iter, output, as_json, opts)
    if instances != 1 or phases is not None or idle_power or max_states is not None or opts.get("contention") is not None \
            or size_bound is not None or class_ratio is not None:
        return _solve_instances(opts, instances, phases, idle_power, output, as_json, lam_grid, rho_grid, s_max,
                                solver, backend, max_states, size_bound, class_ratio)
    settings = dict(s_max=s_max, abstract_cost=abstract_cost, tol_delta=tol_delta, solver=solver, eps=eps,
                    max_iter=max_iter, backend=backend)
    if lam_grid is not None or rho_grid is not None:
        return _solve_bank(opts, lam_grid, rho_grid, settings, output, as_json)
    problem = build_problem(opts)
    note_energy(problem, opts)
    report, finish = solve_progress(sys.stderr.isatty())
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always", NotConvergedWarning)
        warnings.simplefilter("always", DegenerateTruncationWarning)
        warnings.simplefilter("always", TableNotConvergedWarning)
        try:
            sol = solve(problem, progress=report, **settings)
        finally:
            finish()
    for w in caught:
        if issubclass(w.category, (NotConvergedWarning, DegenerateTruncationWarning, TableNotConvergedWarning)):
            click.echo(f"smdp-batch: warning: {w.message}", err=True)
    if sol.degenerate:
        raise InputError(
            f"the truncation s_max={sol.s_max} is degenerate (its policy waits on long queues, Δ = "
            f"{sol.evaluation.delta:.3g}); use --s-max auto, a larger --s-max or a larger --abstract-cost"
        )
    d = sol.to_dict()
    if output:
        write_policy(sol, output)
        d["output"] = output
    r = sol.result
    conv = "converged" if r.converged else "NOT CONVERGED (iteration cap)"
    text = "\n".join(
        [
            "smdp-batch — optimal batching policy (paper 004 SMDP)",
            scenario_line(problem),
            f"  truncation  s_max = {sol.s_max} ({sol.rule}), {boundary_text(sol.model.boundary, sol.model.abstract_cost, sol.model.tail_action)}, "
            f"Δ = {sol.evaluation.delta:.3g} (δ = {sol.tol_delta:g})",
            f"  table       {converged_text(sol.converged_upto, sol.policy, sol.rule, limiting_actions(sol.problem), sol.verified_against)}",
            f"  solver      {r.solver}: {r.iterations} iterations, {conv}, {d['solve_seconds'] * 1e3:.1f} ms",
            f"  policy      {describe_policy(sol.policy, problem.batch_sizes, more=_every_range(output))}",
            cost_line(d["avg_cost"], "truncated model, eq. 21"),
            metrics_line(d),
        ]
        + ([f"  written     {output}"] if output else [])
    )
    emit(d, as_json, text)


def _every_range(output) -> str:
    """Where every range of the policy is, said when its line counts some rather than spells them out."""
    return f" (every range: {output}, or --json)" if output else " (every range: --json, or -o FILE.h5)"


def _solve_instances(opts, instances, phases, idle_power, output, as_json, lam_grid, rho_grid, s_max, solver,
                     backend, max_states=None, size_bound=None, class_ratio=None) -> None:
    """solve --instances c (with --phases / --idle-power / --max-states): the c-server SMDP (cli/instances.py); with
    --size-bound, its optimum over every size bracketed."""
    from .instances import auto_count, bound_every_size_cmd, solve_instances_cmd

    bad = [f for f, v in (("--lam-grid", lam_grid), ("--rho-grid", rho_grid)) if v is not None]
    bad += ["-o"] if output is not None and instances == 1 else []
    bad += ["--solver rvi"] if solver != "pi" else []
    bad += ["--backend jax"] if backend != "numba" else []
    bad += [f"--s-max {s_max}"] if str(s_max).lower() != "auto" else []
    auto = instances == "auto"
    if instances == 1:
        bad.append("--phases" if phases is not None else "--idle-power" if idle_power else
                   "--max-states" if max_states is not None else "--size-bound" if size_bound is not None else
                   "--class-ratio" if class_ratio is not None else "--contention")
    elif class_ratio is not None and size_bound is None:
        raise InputError("--class-ratio shapes the classes of --size-bound: add --size-bound auto (or the sizes to "
                         "compare)")
    elif size_bound is not None and (output is not None or auto):
        raise InputError("--size-bound brackets one count's optimum and writes no table: " + (
            "drop -o (solve the coarse sizes with --batch-sizes SIZES -o FILE for their table)" if output is not None
            else "give the count, --instances C, not auto"))
    if bad:
        what = (f"--instances {instances}" if instances != 1 else
                "--phases, --idle-power, --max-states, --size-bound, --class-ratio and --contention (they shape the "
                "model of several instances: add --instances c > 1)")
        raise InputError(f"{what} cannot be combined with {', '.join(bad)}: the several-instance solve runs policy "
                         "iteration with its own truncation (one table per solve)" if instances != 1 else
                         f"{what}; got {', '.join(bad)} with one instance")
    if auto and opts.get("lam") is None:
        raise InputError("--instances auto compares counts at the same total load: give it as --lam (requests/ms, "
                         "e.g. --lam 3.5 for 3 500 req/s), not --rho, which is per instance")
    problem = build_problem({**opts, "instances": auto_count(opts) if auto else instances})  # stable on the most tried
    note_energy(problem, opts)
    if size_bound is not None:
        return bound_every_size_cmd(problem, size_bound, class_ratio, None if phases is None else int(phases),
                                    float(idle_power), as_json, None if max_states is None else int(max_states))
    solve_instances_cmd(problem, None if phases is None else int(phases), float(idle_power), as_json, auto=auto,
                        output=output, max_states=None if max_states is None else int(max_states))


def _solve_bank(opts: dict, lam_grid, rho_grid, settings: dict, output, as_json) -> None:
    """Solve one scenario over a grid of λ (or ρ) and write a policy bank (runtime.PolicyBank)."""
    from ..export.hdf5 import write_bank

    if opts.get("preset") and "," in opts["preset"]:
        raise InputError("a policy bank takes one --preset")
    problems, _ = problems_over(opts, rho_grid, lam_grid)
    sols = []
    tick, finish = progress_line(sys.stderr.isatty(), "rates solved", len(problems))
    try:  # the progress line is ended before any error or the results are printed
        for problem in problems:
            with warnings.catch_warnings(record=True) as caught:
                warnings.simplefilter("always", NotConvergedWarning)
                warnings.simplefilter("always", TableNotConvergedWarning)
                sol = solve(problem, **settings)
            if tick:
                tick(1)
            for w in caught:
                click.echo(f"smdp-batch: warning: λ = {problem.lam:.6g}: {w.message}", err=True)
            if sol.degenerate:
                raise InputError(f"λ = {problem.lam:.6g}: the truncation s_max={sol.s_max} is degenerate; use --s-max auto")
            sols.append(sol)
    finally:
        finish()
    if output:
        write_bank(sols, output)
    rows = [sol.to_dict() for sol in sols]
    lines = [f"smdp-batch — policy bank over {len(sols)} arrival rates (paper 004 SMDP per λ)",
             scenario_line(sols[0].problem, rate="λ on a grid (below)")]
    for sol, d in zip(sols, rows):
        lines.append(f"  λ = {d['lam']:<9.5g} ρ = {d['rho']:<6.3g} s_max = {d['s_max']:<5} "
                     f"{describe_policy(sol.policy, sol.problem.batch_sizes)[:60]:<60} W̄ = {d['mean_latency_ms']:.4g} ms, "
                     f"P̄ = {d['mean_power_w']:.4g} W")
    if output:
        lines.append(f"  written     {output}")
    emit({"bank": rows, **({"output": output} if output else {})}, as_json, "\n".join(lines))


def _policy_smax(spec: str, bmax: int) -> int:
    """States a simple policy needs: Bmax, or Q for control:Q above Bmax (wait below Q, paper 004 eq. 31)."""
    kind, _, arg = spec.strip().partition(":")
    if kind.lower() in ("control", "q"):
        try:
            q = int(arg)
        except ValueError:
            return bmax
        if q > STATE_LIMIT:
            raise InputError(f"control limit Q must be ≤ {STATE_LIMIT} (the state limit), got {q}")
        return max(bmax, q)
    return max(bmax, 1)


@click.command("evaluate", short_help="Exact long-run metrics of any policy on the infinite queue.")
@scenario_options
@option("--policy", "policy_spec", required=True, metavar="SPEC", help="static:B | greedy | control:Q | FILE.h5")
@json_option
def evaluate_cmd(policy_spec, as_json, **opts):
    """Exact long-run metrics of a policy on the infinite queue (eq. 30 extension, truncation error < 1e-10)."""
    t0 = time.perf_counter()
    if policy_spec.lower().endswith((".h5", ".hdf5")):
        pf = read_policy(policy_spec)
        problem = build_problem(opts, file_inputs(pf, opts))
        if tuple(problem.batch_sizes) != pf.batch_sizes:
            raise InputError(
                f"{policy_spec} was solved for batch sizes {list(pf.batch_sizes)}, not {list(problem.batch_sizes)}"
            )
        policy = pf.policy
        if problem.instances > 1:  # a c-server table: exact on the c-server model it was solved on
            from .instances import evaluate_instances_file

            return evaluate_instances_file(policy_spec, pf, problem, as_json)
    else:
        problem = build_problem(opts)
        policy = parse_policy(policy_spec, problem.batch_sizes, _policy_smax(policy_spec, problem.bmax))
    ev = evaluate_deployed(problem, policy)
    objective = problem.w1 * ev.mean_latency_ms + problem.w2 * ev.mean_power_w
    d = {
        **problem.describe(),
        "policy_spec": policy_spec,
        "s_max": ev.s_max,
        "abstract_cost": 0.0,
        "iterations": None,
        "converged": None,
        **ev.as_dict(),
        "avg_cost": objective,
        "objective": objective,
        "policy": [int(a) for a in policy],
        "control_limit": control_limit_of(policy, problem.batch_sizes),
        "solve_seconds": time.perf_counter() - t0,
        "units": dict(UNITS),
    }
    text = "\n".join(
        [
            f"smdp-batch — exact evaluation of {policy_spec}",
            scenario_line(problem),
            f"  policy      {describe_policy(policy, problem.batch_sizes)}",
            cost_line(d["avg_cost"], "exact, infinite queue"),
            metrics_line(d),
            f"  exactness   evaluated on s_max = {ev.s_max} with the tail boundary (ĝ moved {ev.delta:.2g} from s_max/2)",
        ]
    )
    emit(d, as_json, text)


@click.command("show", short_help="Print what a policy table (or a λ-bank, or a served-delay file) holds.")
@click.argument("path", type=InputFile())
@json_option
def show_cmd(path, as_json):
    """Print what a policy table (or a λ-bank, or the served-delay file calibrate wrote) holds."""
    from ..errors import PolicyFileError
    from ..runtime.schema import read_bank

    if path.lower().endswith(".json"):
        return _show_served(path, as_json)
    try:
        pf = read_policy(path)
    except PolicyFileError as e:
        if "is a phase table" in str(e):
            from .bursty import show_phase_table

            return show_phase_table(path, as_json)
        if "it is a policy bank" not in str(e):
            raise
        bank = read_bank(path)
        rows = [{"lam": t.inputs["lam"], "rho": t.inputs["rho"], "s_max": t.truncation["s_max"],
                 "control_limit": control_limit_of(t.policy, t.batch_sizes), "mean_latency_ms": t.solution["mean_latency_ms"],
                 "mean_power_w": t.solution["mean_power_w"], "policy": [int(a) for a in t.policy]} for t in bank]
        lines = [f"{path}: {bank[0].meta.get('format')} v{bank[0].meta.get('schema_version')}, {len(bank)} tables"]
        lines += [f"  λ = {r['lam']:<9.5g} ρ = {r['rho']:<6.3g} s_max = {r['s_max']:<5} control limit {r['control_limit']}, "
                  f"W̄ = {r['mean_latency_ms']:.4g} ms, P̄ = {r['mean_power_w']:.4g} W" for r in rows]
        integrity = bank[0].integrity if all(t.integrity == bank[0].integrity for t in bank) else "none"
        lines.append(f"  integrity   {integrity_text(integrity)}")
        emit({"path": path, **bank[0].meta, "integrity": integrity, "tables": rows}, as_json, "\n".join(lines), strict=True)
        return

    sizes = pf.batch_sizes
    solution = {k: v for k, v in pf.solution.items() if k not in ("relative_values", "summary_json")}
    if "throughput" in solution:  # the same throughput keys as solve and evaluate
        solution["throughput_per_s"] = solution["throughput"] * 1e3
    d = {
        "path": path,
        **pf.meta,
        "inputs": pf.inputs,
        "truncation": pf.truncation,
        "solution": solution,
        "policy": [int(a) for a in pf.policy],
        "control_limit": control_limit_of(pf.policy, sizes),
        "integrity": pf.integrity,
    }
    i, t, s = pf.inputs, pf.truncation, pf.solution
    c = int(i.get("instances", 1))
    many = [f"  instances   {c} sharing the queue (c-server SMDP, batch times as {i.get('batch_time_model', 'phase-type')}"
            f"{'; idle power ' + format(i['idle_power_w'], 'g') + ' W per instance' if i.get('idle_power_w') else ''}): "
            f"run it with DynamicBatcher(…, instances={c}) or simulate --policy FILE"] if c > 1 else []
    if c > 1 and i.get("contention"):
        many.append(f"  contention  {parse_contention(i['contention']).describe()} (solved with it: run it on such a "
                    "device)")
    busy = []
    if pf.policy_busy is not None:
        from .instances import busy_lines

        d["policy_busy"] = [[int(a) for a in row] for row in pf.policy_busy]
        busy = busy_lines(pf.policy_busy, sizes)
        if "busy_avg_cost" in s:
            busy.append(f"  {'':<10}  W̄ = {s['busy_mean_latency_ms']:.6g} ms, P̄ = {s['busy_mean_power_w']:.6g} W, ĝ = "
                        f"{s['busy_avg_cost']:.6g} per ms: what DynamicBatcher(…, instances={c}) runs (the metrics "
                        "below are the table n ↦ b's, which Triton and Ray exports follow)")
    text = "\n".join(
        [
            f"{path}: {pf.meta.get('format')} v{pf.meta.get('schema_version')} by {pf.meta.get('creator')}, {pf.meta.get('created')}",
            f"  scenario    λ = {i['lam']:.6g} /ms (ρ = {i['rho']:.4g}{' per instance' if c > 1 else ''}), batch sizes "
            f"{sizes[0]}..{sizes[-1]} ({len(sizes)}), "
            f"l = {i['latency']}, ζ = {i['energy']}, service {i['service']}, w1 = {i['w1']:g}, w2 = {i['w2']:g}",
            *many,
            f"  truncation  s_max = {t['s_max']}{' (' + t['s_max_rule'] + ')' if 's_max_rule' in t else ''}, "
            f"{boundary_text(t.get('boundary', 'overflow'), t['abstract_cost'])}, Δ = {t['delta']:.3g}",
            f"  table       {converged_text(pf.converged_upto, pf.policy, t.get('s_max_rule'), limiting_sizes(sizes, i['latency_ms']), t.get('verified_against'))}",
            f"  solver      {s['solver']}: {s['iterations']} iterations, converged = {bool(s['converged'])}",
            f"  policy      {describe_policy(pf.policy, sizes)}",
            *busy,
            f"  metrics     W̄ = {s['mean_latency_ms']:.6g} ms, P̄ = {s['mean_power_w']:.6g} W",
            cost_line(s["avg_cost"], "the table's, exact on the c-server model" if c > 1 else "truncated model, eq. 21"),
            f"  integrity   {integrity_text(pf.integrity)}",
        ]
    )
    emit(d, as_json, text, strict=True)


def converged_text(R: int | None, policy, rule: str | None, limiting: set[int] | None = None,
                   against: int | None = None) -> str:
    """One line on what the table's stored range means (the converged rule of solvers.search); ``limiting``:
    the batch sizes of greatest throughput, to tell a probable-range table (π(R) not among them); ``against``:
    the truncation R was verified against when it is not "≥ 2R" (the exponential rule, solvers.exponential)."""
    if R is not None and limiting and int(policy[R]) not in limiting:
        return (f"verified up to n = {R} (against a truncation ≥ {2 * R}; longer queues have probability < "
                f"{PROBABLE_MASS:g}), NOT converged to the limit: the optimal batch still grows beyond n = {R} "
                f"(to {max(limiting)}); serve {int(policy[R])} for every n > {R}")
    if R is not None:
        versus = f"≥ {2 * R}" if against is None else f"of {against} states (its tail terms < 1e-17)"
        return (f"converged up to n = {R}: decisions for n ≤ {R} verified against a truncation {versus}, "
                f"serve {int(policy[R])} for every n > {R}")
    if rule == "auto":
        return "NOT verified as converged (the search reached its state or work limit)"
    return f"not checked for convergence (s_max rule: {rule or 'unknown, written before 0.3'}; use --s-max auto)"




@click.command("tables", short_help="Solve a grid of loads × weights into policy tables with an index and a chart.")
@scenario_options
@load_grids("one table per load and weight")
@option("--w2-grid", type=Grid(min=0), required=True, help="Weights w2, e.g. 0,0.5,1,1.6,2.2,5.")
@option("-o", "--output", "outdir", type=OutputDir(), default=None,
              help="Write one FILE.h5 per (load, w2) and a README.md index into this folder.")
@option("--plot", "plot_path", type=FigurePath(), default=None, help="Draw the policies (Fig. 3 style) to this figure.")
@option("--max-queue", type=Number(integer=True, min=1, max=STATE_LIMIT), default=None,
        show_default="the converged ranges, up to 4·Bmax",
              help="Largest queue length drawn.")
@json_option
def tables_cmd(rho_grid, lam_grid, w2_grid, outdir, plot_path, max_queue, as_json, **opts):
    """Solve a grid of loads × weights: one policy table each, an index, and a Fig. 3-style chart."""
    from ..analysis.plots import plot_policies, save

    if opts.get("preset") and "," in opts["preset"]:
        raise InputError("tables takes one --preset")
    refuse_swept(opts, ("w2",), "tables solves one table per --w2-grid value")
    problems, _ = problems_over(opts, rho_grid, lam_grid)
    w2s = w2_grid
    cases = [p.replace(w2=w2) for p in problems for w2 in w2s]
    prefix = (opts.get("preset") or "custom").replace(",", "_")
    names = [f"{prefix}_rho{q.rho:.2f}_w2-{q.w2:g}.h5" if rho_grid is not None or lam_grid is None
             else f"{prefix}_lam{q.lam:.4g}_w2-{q.w2:g}.h5" for q in cases]
    # every file this run writes, checked (and its temporary file made) before the first solve
    prepare_outputs([("--plot", plot_path)], scenario_files(opts),
                    folder=("-o", outdir, [*names, "README.md"]) if outdir else None)
    sols = []
    tick, finish = progress_line(sys.stderr.isatty(), "tables solved", len(cases))
    try:
        for q in cases:  # no hints: each file equals a fresh `solve` of its scenario, truncation included
            sol = solve(q)
            if sol.degenerate:
                raise InputError(f"ρ = {q.rho:.4g}, w2 = {q.w2:g}: the truncation is degenerate")
            sols.append(sol)
            if tick:
                tick(1)
    finally:
        finish()
    if outdir:
        os.makedirs(outdir, exist_ok=True)  # made by prepare_outputs inside main; here for a direct call
        for s, name in zip(sols, names):
            write_policy(s, os.path.join(outdir, name))
        write_text_atomically(os.path.join(outdir, "README.md"), _tables_readme(sols, names))
    if plot_path:
        grid = {(round(s.problem.rho, 6), s.problem.w2): (s.policy[: s.s_max + 1], s.control_limit) for s in sols}
        if max_queue is None:  # every converged range in view (up to 4·Bmax), so every departure shows
            reach = [s.stored_range + 1 for s in sols] + [max(q for _, q in grid.values() if q) + 4 if any(
                q for _, q in grid.values()) else 0]
            max_queue = min(max(reach), 4 * problems[0].bmax)
        save(plot_policies(grid, problems[0].batch_sizes, max_queue), plot_path)
    rows = [{"file": n, **{k: v for k, v in s.to_dict().items() if k != "policy"}} for s, n in zip(sols, names)]
    lines = [f"smdp-batch — {len(sols)} policy tables ({len(problems)} loads × {len(w2s)} weights)",
             scenario_line(problems[0], rate="loads on a grid (below)", w2="on a grid (below)")]
    for s, n in zip(sols, names):
        lines.append(f"  {n:32s} ρ = {s.problem.rho:<5.3g} w2 = {s.problem.w2:<5g} "
                     f"{describe_policy(s.policy, s.problem.batch_sizes)[:44]:44s} W̄ {s.deployed.mean_latency_ms:7.4g} ms, "
                     f"P̄ {s.deployed.mean_power_w:7.4g} W")
    for label, path in (("written", outdir), ("figure", plot_path)):
        if path:
            lines.append(f"  {label:11s} {path}")
    emit({"tables": rows, **({"output": outdir} if outdir else {})}, as_json, "\n".join(lines))


def _tables_readme(sols, names) -> str:
    import shlex

    p = sols[0].problem
    cmd = "smdp-batch " + " ".join(shlex.quote(a) for a in ARGV)
    out = [
        "# Policy tables",
        "",
        f"Written by `{cmd}` (smdp-batch {__version__}); run it again to regenerate them.",
        "",
        f"Scenario: batch sizes {sizes_text(p.batch_sizes)}, l(b) = `{p.latency.spec()}` ms, "
        f"ζ(b) = `{p.energy.spec()}` mJ, service `{p.service.spec()}`, w1 = {p.w1:g}. Each file is an HDF5 policy "
        "table (DESIGN.md §4): load it with `smdp_batch.runtime.PolicyTable.load(path)` or inspect it with "
        "`smdp-batch show FILE`.",
        "",
        "Every table is converged (`--s-max auto`): its decision for each queue length up to *R* equals that of "
        "a truncation at least twice as long, and it serves π(*R*) beyond — the infinite queue's action.",
        "",
        "| file | ρ | λ (1/ms) | w2 | policy | W̄ (ms) | P̄ (W) | R (converged up to) | s_max |",
        "|---|---|---|---|---|---|---|---|---|",
    ]
    for s, n in zip(sols, names):
        ev = s.deployed
        out.append(f"| `{n}` | {s.problem.rho:.4g} | {s.problem.lam:.6g} | {s.problem.w2:g} | "
                   f"{describe_policy(s.policy, s.problem.batch_sizes)} | {ev.mean_latency_ms:.5g} | "
                   f"{ev.mean_power_w:.5g} | {'not verified' if s.converged_upto is None else s.converged_upto} | {s.s_max} |")
    return "\n".join(out) + "\n"


def boundary_text(boundary: str, c_o: float, tail: int | None = None) -> str:
    """How the truncation ends: the tail boundary (Δ = |ĝ(s_max) − ĝ(s_max/2)|) or eq. 19's S_o with c_o."""
    if boundary == "tail":
        return "tail boundary" + (f" (serve {tail} above s_max)" if tail else "")
    return f"c_o = {c_o:.6g}"


def _show_served(path: str, as_json: bool) -> None:
    """A served-delay file (``calibrate -o``): where it was measured, its parts, and each load's figures."""
    from ..model.served import VERSION, ServedDelay

    sd = ServedDelay.load(path)
    src = sd.source
    lines = [f"{path}: served-delay file v{VERSION}, measured on {src.get('server', '?')} ({src.get('model', '?')}) "
             f"with {src.get('setting', '?')}, {src.get('date', '?')}",
             f"  model       {sd.summary()}"]
    for st in sd.stats:
        share = st.get("new_run_share")
        runs = (f" ({st.get('runs', 1)} run{'s' if st.get('runs', 1) != 1 else ''}"
                + (f", a new run's ± {100 * share:.2g} %" if isinstance(share, (int, float)) else "") + ")")
        lines.append(f"  load        {st.get('load_per_s', float('nan')):.5g} req/s: p99 {st.get('p99_ms', float('nan')):.4g} ms{runs}, "
                     f"outside p50 {st.get('outside_p50_ms', float('nan')):.3g} / p99 {st.get('outside_p99_ms', float('nan')):.3g} ms, "
                     + ("carried" if st.get("carried") else f"not carried: {st.get('why', '')}"))
    if sd.served_latency_ms:
        lines.append("  l(b) served " + ", ".join(f"{b}: {v:.3g}" for b, v in sd.served_latency_ms.items()) + " ms")
    lines.append(f"  idle power  {sd.idle_power_w:.4g} W" if sd.idle_power_w is not None else
                 "  idle power  not read (no energy counter where it was measured)")
    emit({"path": path, **sd.as_dict()}, as_json, "\n".join(lines), strict=True)
