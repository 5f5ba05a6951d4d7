"""Command line: ``smdp-batch solve | evaluate | simulate | compare | pareto | tables | export | show | profile |
multibin | llm`` (DESIGN.md §4).

Every command takes ``--json``.  Bad input prints one line ``smdp-batch: error: …`` on stderr
and exits with code 2 — never a traceback, never a half-written file.
"""

from __future__ import annotations

import json
import logging
import math
import sys
import time
import warnings

import click
import numpy as np

from . import __version__
from .baselines import parse_policy
from .errors import DegenerateTruncationWarning, InputError, NotConvergedWarning
from .solvers.evaluation import control_limit_of, evaluate_deployed
from .export.hdf5 import write_policy
from .runtime.schema import read_policy
from .model.presets import PRESETS, preset
from .model.problem import BatchingProblem, batch_size_set
from .model.profile import read_profile
from .analysis.report import describe_policy
from .solvers import SOLVERS, solve
from .solvers.solution import check_backend

_ARGV: list[str] = []  # this invocation's arguments (recorded in generated READMEs)

DEFAULTS = {
    "rho": 0.5, "bmin": 1, "bmax": 32, "latency": None,  # None: the law's own l(b), else the paper's
    "energy": "affine:19.899,19.603", "service": "det", "w1": 1.0, "w2": 1.0,
}


def _number(name: str, text, *, integer: bool = False):
    try:
        v = int(text) if integer else float(text)
    except (TypeError, ValueError):
        kind = "an integer" if integer else "a number"
        raise InputError(f"--{name} must be {kind}, got {text!r}") from None
    if not integer and not math.isfinite(v):
        raise InputError(f"--{name} must be finite, got {text!r}")
    return v


def scenario_options(f):
    """Options describing the batching problem (shared by solve and evaluate)."""
    opts = [
        click.option("--lam", help="arrival rate λ in requests/ms (exclusive with --rho)"),
        click.option("--rho", help="load ρ = λ·l(Bmax)/Bmax in (0, 1) [default 0.5]"),
        click.option("--bmin", help="smallest batch size [default 1]"),
        click.option("--bmax", help="largest batch size [default 32]"),
        click.option("--batch-sizes", help="explicit allowed batch sizes, e.g. 1,2,4,8,16,32"),
        click.option("--preset", help=f"a paper 004 scenario: {', '.join(PRESETS)} (other options override it)"),
        click.option("--latency", help="l(b) in ms: affine:A,C | const:C | log:A,C | table:1=V,… | csv:FILE[:interp|affine|power] [paper's GoogLeNet/P4]"),
        click.option("--energy", help="ζ(b) in mJ: affine:A,C | const:C | log:A,C | table:… | csv:FILE[:fit] (energy_mj or power_w) [paper's]"),
        click.option("--service", help="batch-time law: det | exp | erlang:K | gamma:A | hyperexp:P/C,… | uniform:A,B | shiftexp:F | lognormal:S | mix:W*LAW@C;… | max:LAW[@MEAN] | empirical:FILE [det]"),
        click.option("--w1", help="weight of mean latency (per ms) [1]"),
        click.option("--w2", help="weight of mean power (per W) [1]"),
    ]
    for o in reversed(opts):
        f = o(f)
    return f


def build_problem(opts: dict, base: dict | None = None) -> BatchingProblem:
    """BatchingProblem from CLI options; ``base`` supplies values not given (a policy file's inputs)."""
    v = dict(DEFAULTS)
    if base:
        v.update(base)
    if opts.get("preset") is not None:
        v.update(preset(opts["preset"]))
    given = {k: opts.get(k) for k in ("lam", "rho", "bmin", "bmax", "batch_sizes", "latency", "energy", "service", "w1", "w2")}
    if given["lam"] is not None and given["rho"] is not None:
        raise InputError("give either --lam or --rho, not both")
    if given["lam"] is not None or given["rho"] is not None:
        v.pop("lam", None)
        v.pop("rho", None)
    v.update({k: x for k, x in given.items() if x is not None})
    if (given["bmin"] is not None or given["bmax"] is not None) and given["batch_sizes"] is None:
        v.pop("batch_sizes", None)  # --bmin/--bmax override a stored batch-size set
    if v.get("batch_sizes") is not None:
        sizes = batch_size_set(sizes=v["batch_sizes"])
    else:
        sizes = batch_size_set(_number("bmin", v["bmin"], integer=True), _number("bmax", v["bmax"], integer=True))
    kw = dict(
        batch_sizes=sizes, latency=v["latency"], energy=v["energy"], service=v["service"],
        w1=_number("w1", v["w1"]), w2=_number("w2", v["w2"]),
    )
    if v.get("lam") is not None:
        return BatchingProblem(lam=_number("lam", v["lam"]), **kw)
    return BatchingProblem.from_rho(_number("rho", v["rho"]), **kw)


def _emit(data: dict, as_json: bool, text: str) -> None:
    if as_json:
        click.echo(json.dumps(data, indent=2, default=_json_default))
    else:
        click.echo(text)


def _json_default(o):
    if isinstance(o, np.generic):
        return o.item()
    if isinstance(o, np.ndarray):
        return o.tolist()
    raise TypeError(type(o).__name__)


def _scenario_line(p: BatchingProblem, rate: str | None = None, w2: str | None = None) -> str:
    """Two lines describing the scenario; ``w2`` replaces the weight's value (e.g. "swept")."""
    rate = rate or f"λ = {p.lam:.6g} /ms ({p.lam * 1e3:.6g} req/s, ρ = {p.rho:.4g})"
    return (
        f"  scenario    {rate}, batch sizes {_sizes_text(p.batch_sizes)}\n"
        f"              l(b) = {p.latency.spec()} ms, ζ(b) = {p.energy.spec()} mJ, service {p.service.spec()}, "
        f"w1 = {p.w1:g}, w2 = {w2 or format(p.w2, 'g')}"
    )


def _metrics_line(d: dict) -> str:
    return (
        f"  metrics     W̄ = {d['mean_latency_ms']:.6g} ms, P̄ = {d['mean_power_w']:.6g} W, "
        f"throughput = {d['throughput'] * 1e3:.6g} req/s, mean batch = {d['mean_batch_size']:.4g}"
    )


@click.group(context_settings={"help_option_names": ["-h", "--help"]})
@click.version_option(__version__, prog_name="smdp-batch")
def cli():
    """Optimal dynamic-batching policies for batch-serving systems (SMDP, paper 004).

    Times in ms, energy in mJ, power in W, λ in requests/ms.
    """


@cli.command("solve")
@scenario_options
@click.option("--smax", default="auto", show_default=True, help="truncation s_max ≥ Bmax, or auto (smallest with Δ < δ)")
@click.option("--abstract-cost", default="100", show_default=True, help="overflow cost c_o (eq. 19)")
@click.option("--tol-delta", default="1e-3", show_default=True, help="δ: accept a truncation when Δ < δ (eq. 22)")
@click.option("--solver", default="pi", show_default=True, help=f"one of {', '.join(SOLVERS)} (pi exact; rvi = paper's Alg. 1)")
@click.option("--eps", default="0.01", show_default=True, help="RVI span tolerance ε")
@click.option("--max-iter", default=None, help="iteration cap (RVI default 100000, PI 1000)")
@click.option("--backend", default="numba", show_default=True,
              help="numba (CPU) or jax (CPU/GPU; pip install 'smdp-batch[jax]'); auto s_max scans on numba")
@click.option("--lam-grid", default=None, help="solve a λ-bank: comma-separated λ values (1/ms); -o writes one bank file")
@click.option("--rho-grid", default=None, help="solve a λ-bank over loads ρ, e.g. 0.1,0.2,…,0.9")
@click.option("-o", "--output", default=None, help="write the policy table (or bank) to FILE.h5")
@click.option("--json", "as_json", is_flag=True, help="print machine-readable JSON")
def solve_cmd(smax, abstract_cost, tol_delta, solver, eps, max_iter, backend, lam_grid, rho_grid, output, as_json, **opts):
    """Solve for the optimal policy (no options: paper 004's basic scenario at ρ = 0.5, w2 = 1)."""
    check_backend(backend)
    if solver not in SOLVERS:
        raise InputError(f"unknown solver {solver!r}; valid: {', '.join(SOLVERS)}")
    smax_v = smax if str(smax).strip().lower() == "auto" else _number("smax", smax, integer=True)
    settings = dict(smax=smax_v, abstract_cost=_number("abstract-cost", abstract_cost),
                    tol_delta=_number("tol-delta", tol_delta), solver=solver, eps=_number("eps", eps),
                    max_iter=None if max_iter is None else _number("max-iter", max_iter, integer=True),
                    backend=backend)
    if lam_grid is not None or rho_grid is not None:
        return _solve_bank(opts, lam_grid, rho_grid, settings, output, as_json)
    problem = build_problem(opts)
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always", NotConvergedWarning)
        warnings.simplefilter("always", DegenerateTruncationWarning)
        sol = solve(problem, **settings)
    for w in caught:
        if issubclass(w.category, (NotConvergedWarning, DegenerateTruncationWarning)):
            click.echo(f"smdp-batch: WARNING: {w.message}", err=True)
    if sol.degenerate:
        raise InputError(
            f"the truncation s_max={sol.s_max} is degenerate (its policy waits on long queues, Δ = "
            f"{sol.evaluation.delta:.3g}); use --smax auto, a larger --smax or a larger --abstract-cost"
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
            _scenario_line(problem),
            f"  truncation  s_max = {sol.s_max}{' (auto)' if sol.smax_auto else ''}, c_o = {sol.model.abstract_cost:g}, "
            f"Δ = {sol.evaluation.delta:.3g} (δ = {sol.tol_delta:g})",
            f"  solver      {r.solver}: {r.iterations} iterations, {conv}, {d['solve_seconds'] * 1e3:.1f} ms",
            f"  policy      {describe_policy(sol.policy, problem.batch_sizes)}",
            f"  cost        ĝ = {d['avg_cost']:.6g} per ms (truncated model, eq. 21)",
            _metrics_line(d),
        ]
        + ([f"  written     {output}"] if output else [])
    )
    _emit(d, as_json, text)


def _solve_bank(opts: dict, lam_grid, rho_grid, settings: dict, output, as_json) -> None:
    """Solve one scenario over a grid of λ (or ρ) and write a policy bank (runtime.PolicyBank)."""
    from .export.hdf5 import write_bank

    if opts.get("preset") and "," in opts["preset"]:
        raise InputError("a policy bank takes one --preset")
    problems, _ = _problems(opts, rho_grid, lam_grid)
    if output:
        _output_folder(output)
    sols = []
    for problem in problems:
        with warnings.catch_warnings(record=True) as caught:
            warnings.simplefilter("always", NotConvergedWarning)
            sol = solve(problem, **settings)
        for w in caught:
            click.echo(f"smdp-batch: WARNING: λ = {problem.lam:.6g}: {w.message}", err=True)
        if sol.degenerate:
            raise InputError(f"λ = {problem.lam:.6g}: the truncation s_max={sol.s_max} is degenerate; use --smax auto")
        sols.append(sol)
    if output:
        write_bank(sols, output)
    rows = [sol.to_dict() for sol in sols]
    lines = [f"smdp-batch — policy bank over {len(sols)} arrival rates (paper 004 SMDP per λ)",
             _scenario_line(sols[0].problem, rate="λ on a grid (below)")]
    for sol, d in zip(sols, rows):
        lines.append(f"  λ = {d['lam']:<9.5g} ρ = {d['rho']:<6.3g} s_max = {d['smax']:<5} "
                     f"{describe_policy(sol.policy, sol.problem.batch_sizes)[:60]:<60} W̄ = {d['mean_latency_ms']:.4g} ms, "
                     f"P̄ = {d['mean_power_w']:.4g} W")
    if output:
        lines.append(f"  written     {output}")
    _emit({"bank": rows, **({"output": output} if output else {})}, as_json, "\n".join(lines))


@cli.command("evaluate")
@scenario_options
@click.option("--policy", "policy_spec", required=True, help="static:B | greedy | control:Q | FILE.h5")
@click.option("--json", "as_json", is_flag=True, help="print machine-readable JSON")
def evaluate_cmd(policy_spec, as_json, **opts):
    """Exact long-run metrics of a policy on the infinite queue (eq. 30 extension, truncation error < 1e-10)."""
    t0 = time.perf_counter()
    if policy_spec.lower().endswith((".h5", ".hdf5")):
        pf = read_policy(policy_spec)
        problem = build_problem(opts, _file_inputs(pf))
        if tuple(problem.batch_sizes) != pf.batch_sizes:
            raise InputError(
                f"{policy_spec} was solved for batch sizes {list(pf.batch_sizes)}, not {list(problem.batch_sizes)}"
            )
        policy = pf.policy
    else:
        problem = build_problem(opts)
        policy = parse_policy(policy_spec, problem.batch_sizes, max(problem.bmax, 1))
    ev = evaluate_deployed(problem, policy)
    d = {
        **problem.describe(),
        "policy_spec": policy_spec,
        "smax": ev.s_max,
        "abstract_cost": 0.0,
        "iterations": None,
        "converged": None,
        **ev.as_dict(),
        "avg_cost": problem.w1 * ev.mean_latency_ms + problem.w2 * ev.mean_power_w,
        "policy": [int(a) for a in policy],
        "control_limit": control_limit_of(policy, problem.batch_sizes),
        "solve_seconds": time.perf_counter() - t0,
        "units": {"time": "ms", "energy": "mJ", "power": "W", "lam": "1/ms", "throughput": "1/ms"},
    }
    text = "\n".join(
        [
            f"smdp-batch — exact evaluation of {policy_spec}",
            _scenario_line(problem),
            f"  policy      {describe_policy(policy, problem.batch_sizes)}",
            f"  cost        w1·W̄ + w2·P̄ = {d['avg_cost']:.6g}",
            _metrics_line(d),
            f"  exactness   evaluated on s_max = {ev.s_max} (tail share Δ = {ev.delta:.2g})",
        ]
    )
    _emit(d, as_json, text)


def _file_inputs(pf) -> dict:
    """The scenario a policy file was solved for, as build_problem's base values."""
    base = {k: pf.inputs[k] for k in ("lam", "latency", "energy", "service", "w1", "w2")}
    base["batch_sizes"] = [int(b) for b in pf.inputs["batch_sizes"]]
    return base


def _arrivals(spec: str, requests: int, seed: int):
    """None (Poisson at λ), or an array from trace:FILE / mmpp:L1,L2,R12,R21."""
    from .analysis.simulate import mmpp_arrivals, read_trace

    kind, _, arg = spec.partition(":")
    kind = kind.strip().lower()
    if kind == "poisson" and not arg:
        return None
    if kind == "trace" and arg:
        return read_trace(arg)
    if kind == "mmpp":
        vals = [_number("arrivals mmpp", x) for x in arg.split(",")] if arg else []
        if len(vals) != 4:
            raise InputError(f"--arrivals {spec!r}: mmpp needs L1,L2,R12,R21 (rates /ms, switching rates /ms)")
        return mmpp_arrivals(vals[:2], vals[2:], requests, np.random.default_rng([seed, 1]))
    raise InputError(f"--arrivals {spec!r} is not valid; use poisson, trace:FILE.csv or mmpp:L1,L2,R12,R21")


@cli.command("simulate")
@scenario_options
@click.option("--policy", "policy_spec", required=True, help="static:B | greedy | control:Q | FILE.h5 | triton:… | tfserving:… | ray:… | torchserve:…")
@click.option("--requests", default="1000000", show_default=True, help="number of requests to simulate")
@click.option("--seed", default="0", show_default=True, help="random seed (runs are reproducible)")
@click.option("--arrivals", default="poisson", show_default=True, help="poisson | trace:FILE.csv | mmpp:L1,L2,R12,R21")
@click.option("--warmup", default="0.05", show_default=True, help="share of the first requests left out")
@click.option("--batches", default="20", show_default=True, help="batch-means groups for the 95% intervals")
@click.option("--within-ms", default=None, help="also report the share of requests served within these bounds, e.g. 10 or 5,10")
@click.option("--progress/--no-progress", default=None, help="progress bar on stderr [on a terminal]")
@click.option("--json", "as_json", is_flag=True, help="print machine-readable JSON")
def simulate_cmd(policy_spec, requests, seed, arrivals, warmup, batches, within_ms, progress, as_json, **opts):
    """Simulate a policy or a server's batching rule: latency percentiles, power, 95% intervals."""
    from .baselines.servers import parse_rule
    from .analysis.simulate import simulate

    n = _number("requests", requests, integer=True)
    sd = _number("seed", seed, integer=True)
    if n < 100:
        raise InputError(f"--requests must be ≥ 100, got {requests!r}")
    if sd < 0:
        raise InputError(f"--seed must be ≥ 0, got {seed!r}")
    is_file = policy_spec.lower().endswith((".h5", ".hdf5"))
    problem = build_problem(opts, _file_inputs(read_policy(policy_spec)) if is_file else None)
    rule = parse_rule(policy_spec, problem)
    arr = _arrivals(arrivals, n, sd)
    kw = dict(requests=n, seed=sd, arrivals=arr, warmup=_number("warmup", warmup),
              batches=_number("batches", batches, integer=True),
              within_ms=() if within_ms is None else tuple(_grid("within-ms", within_ms)))
    if sys.stderr.isatty() if progress is None else progress:
        with click.progressbar(length=n if arr is None else arr.size, label="simulating", file=sys.stderr) as bar:
            res = simulate(problem, rule, progress=bar.update, **kw)
    else:
        res = simulate(problem, rule, **kw)
    d = {**problem.describe(), "policy_spec": rule.spec, "arrivals": arrivals, **res.as_dict(),
         "units": {"time": "ms", "energy": "mJ", "power": "W", "lam": "1/ms", "throughput": "1/ms"}}
    pct = ", ".join(f"{k[:-3]} {v:.4g}" for k, v in res.percentiles.items())
    text = "\n".join([
        f"smdp-batch — simulation of {rule.spec} ({res.requests} requests, seed {sd}, {res.seconds:.2f} s)",
        _scenario_line(problem),
        f"  latency     W̄ = {res.mean_latency_ms:.5g} ± {res.mean_latency_ci:.2g} ms (95%); {pct} ms",
        f"  power       P̄ = {res.mean_power_w:.5g} ± {res.mean_power_ci:.2g} W; throughput = {res.throughput * 1e3:.6g} req/s, "
        f"mean batch = {res.mean_batch_size:.4g}",
    ] + [f"  within      {100 * v:.4g} ± {100 * res.within_ci[b]:.2g} % of requests within {b:g} ms"
         for b, v in res.within.items()])
    _emit(d, as_json, text)


@cli.command("compare")
@scenario_options
@click.option("--slo-mean-ms", default=None, help="SLO: mean latency ≤ X ms")
@click.option("--slo-p95-ms", default=None, help="SLO: 95th-percentile latency ≤ X ms")
@click.option("--slo-p99-ms", default=None, help="SLO: 99th-percentile latency ≤ X ms")
@click.option("--requests", default="200000", show_default=True, help="requests simulated per candidate")
@click.option("--seed", default="0", show_default=True, help="random seed (the same arrivals for every candidate)")
@click.option("--json", "as_json", is_flag=True, help="print machine-readable JSON")
def compare_cmd(slo_mean_ms, slo_p95_ms, slo_p99_ms, requests, seed, as_json, **opts):
    """Least power at a latency SLO: best-tuned Triton, TF-Serving, Ray Serve, TorchServe vs the SMDP table."""
    from .analysis.compare import best_at_slo

    given = [(m, v) for m, v in (("mean", slo_mean_ms), ("p95", slo_p95_ms), ("p99", slo_p99_ms)) if v is not None]
    if len(given) != 1:
        raise InputError("give exactly one SLO: --slo-mean-ms, --slo-p95-ms or --slo-p99-ms")
    metric, bound = given[0][0], _number(f"slo-{given[0][0]}-ms", given[0][1])
    problem = build_problem(opts)
    n = _number("requests", requests, integer=True)
    if n < 1000:
        raise InputError(f"--requests must be ≥ 1000, got {requests!r}")
    best, every = best_at_slo(problem, bound, metric, requests=n, seed=_number("seed", seed, integer=True))
    rows = []
    for fam, c in best.items():
        rows.append({"family": fam, **({"setting": c.setting, "slo_metric_ms": c.latency_ms, "mean_latency_ms": c.mean_latency_ms,
                                        "mean_power_w": c.mean_power_w} if c else {"setting": None})})
    d = {**problem.describe(), "slo": {"metric": metric, "bound_ms": bound}, "best": rows,
         "candidates": [c.__dict__ for c in every]}
    ref = best["smdp"].mean_power_w if best["smdp"] else None
    lines = [f"smdp-batch — least power with {metric} latency ≤ {bound:g} ms ({n} simulated requests per candidate)",
             _scenario_line(problem)]
    for fam, c in best.items():
        if c is None:
            lines.append(f"  {fam:10s} no setting meets the SLO")
            continue
        extra = f"  (+{c.mean_power_w - ref:.3g} W vs SMDP)" if ref is not None and fam != "smdp" else ""
        lines.append(f"  {fam:10s} {c.setting:42s} {metric} {c.latency_ms:7.4g} ms, W̄ {c.mean_latency_ms:7.4g} ms, "
                     f"P̄ {c.mean_power_w:7.4g} W{extra}")
    _emit(d, as_json, "\n".join(lines))


def _grid(name: str, text: str) -> list[float]:
    values = sorted({_number(name, x) for x in text.split(",") if x.strip()})
    if not values:
        raise InputError(f"--{name} needs comma-separated numbers, e.g. 0.3,0.7")
    return values


def _problems(opts: dict, rho_grid, lam_grid) -> tuple[list[BatchingProblem], list[str]]:
    """Problems for every preset (``--preset a,b``) × load (``--rho``/``--lam`` or a grid), with labels."""
    if rho_grid is not None and lam_grid is not None:
        raise InputError("give either --rho-grid or --lam-grid, not both")
    grid_name, grid = ("rho", rho_grid) if rho_grid is not None else ("lam", lam_grid)
    if grid is not None and (opts.get("lam") is not None or opts.get("rho") is not None):
        raise InputError("--lam/--rho and a grid exclude each other")
    loads = [None] if grid is None else _grid(f"{grid_name}-grid", grid)
    presets = [None] if opts.get("preset") is None else [x.strip() for x in opts["preset"].split(",") if x.strip()]
    problems, labels = [], []
    for name in presets:
        for v in loads:
            problems.append(build_problem({**opts, "preset": name, **({grid_name: v} if v is not None else {})}))
            labels.append(name if len(presets) > 1 else "")
    return problems, labels


def _progress_line(enabled: bool, what: str):
    """A counter on stderr (the number of jobs of an adaptive sweep is not known in advance)."""
    done = [0]

    def tick(n: int) -> None:
        done[0] += n
        click.echo(f"\r  {what}: {done[0]} done", nl=False, err=True)

    return tick if enabled else None, (lambda: click.echo("", err=True) if enabled and done[0] else None)


def _slo_within(text: str) -> tuple[float, float]:
    bound, sep, pct = str(text).partition(":")
    if not sep:
        raise InputError(f"--slo-within must be BOUND_MS:PERCENT, e.g. 10:95, got {text!r}")
    b, p = _number("slo-within bound", bound), _number("slo-within percent", pct)
    if b <= 0 or not (0 < p <= 100):
        raise InputError(f"--slo-within needs a bound > 0 ms and a percentage in (0, 100], got {text!r}")
    return b, p / 100.0


@cli.command("pareto")
@scenario_options
@click.option("--rho-grid", default=None, help="several loads ρ, e.g. 0.3,0.7 (one front each)")
@click.option("--lam-grid", default=None, help="several arrival rates λ (1/ms)")
@click.option("--w2-min", default="0.01", show_default=True, help="smallest positive w2 of the log grid (w2 = 0 is always swept)")
@click.option("--w2-max", default="10", show_default=True, help="largest w2 of the log grid (then doubled until the least-power policy)")
@click.option("--points", default="25", show_default=True, help="points of the log grid before refinement")
@click.option("--rtol", default="0.02", show_default=True, help="w2 ranges resolved to this relative precision")
@click.option("--extend", default="6", show_default=True, help="doublings of w2 beyond --w2-max to reach the least-power end")
@click.option("--baselines/--no-baselines", default=True, show_default=True, help="greedy and static b (exact)")
@click.option("--timeouts/--no-timeouts", default=True, show_default=True, help="Triton, TF-Serving, Ray, TorchServe over their delay (simulated)")
@click.option("--statics", default=None, help="static batch sizes to show, e.g. 8,16,32 [powers of 2 and Bmax]")
@click.option("--simulate", "sim_requests", default=None, help="requests simulated per policy for p50/p95/p99 [0; 200000 if an SLO needs it]")
@click.option("--within-ms", default=None, help="latency bound whose satisfaction share is simulated (Fig. 6(c))")
@click.option("--baseline-requests", default="200000", show_default=True, help="requests simulated per timeout setting")
@click.option("--seed", default="0", show_default=True, help="random seed (the same arrivals for every policy)")
@click.option("--slo-mean-ms", default=None, help="choose: least power with mean latency ≤ X ms (exact)")
@click.option("--slo-p95-ms", default=None, help="choose: least power with simulated p95 ≤ X ms")
@click.option("--slo-p99-ms", default=None, help="choose: least power with simulated p99 ≤ X ms")
@click.option("--slo-within", default=None, help="choose: least power with ≥ PERCENT of requests within BOUND_MS, as BOUND_MS:PERCENT")
@click.option("-o", "--output", default=None, help="write the chosen policy's table to FILE.h5 (one front)")
@click.option("--csv", "csv_path", default=None, help="write every front and baseline point to FILE.csv")
@click.option("--plot", "plot_path", default=None, help="draw the figure to FILE.png|.svg|.pdf")
@click.option("--plot-kind", default="tradeoff", show_default=True, help="tradeoff (Figs. 5, 7–9) | percentiles (Fig. 6) | scenarios (adds panel (a) of Figs. 7–9)")
@click.option("--dask", "dask_address", default=None, help="run the sweep on Dask: 'local' (a LocalCluster) or a scheduler address")
@click.option("--workers", default=None, help="LocalCluster workers [CPU count]")
@click.option("--progress/--no-progress", default=None, help="progress counter on stderr [on a terminal]")
@click.option("--json", "as_json", is_flag=True, help="print machine-readable JSON")
def pareto_cmd(rho_grid, lam_grid, w2_min, w2_max, points, rtol, extend, baselines, timeouts, statics, sim_requests,
               within_ms, baseline_requests, seed, slo_mean_ms, slo_p95_ms, slo_p99_ms, slo_within, output, csv_path,
               plot_path, plot_kind, dask_address, workers, progress, as_json, **opts):
    """Latency–power trade-off over w2, baselines on it, and the least-power policy meeting an SLO."""
    import contextlib

    from .analysis.parallel import dask_mapper
    from .analysis.pareto import baseline_points, dominated_by_front, latency_cdfs, sweep_fronts
    from .analysis.plots import check_path

    problems, labels = _problems(opts, rho_grid, lam_grid)
    slos = {k: v for k, v in (("mean", slo_mean_ms), ("p95", slo_p95_ms), ("p99", slo_p99_ms), ("within", slo_within))
            if v is not None}
    if len(slos) > 1:
        raise InputError("give at most one SLO: --slo-mean-ms, --slo-p95-ms, --slo-p99-ms or --slo-within")
    slo = next(iter(slos.items()), None)
    slo_value = None if slo is None else (_slo_within(slo[1]) if slo[0] == "within" else _number(f"slo-{slo[0]}-ms", slo[1]))
    if slo is not None and slo[0] != "within" and slo_value <= 0:
        raise InputError(f"--slo-{slo[0]}-ms must be a positive number of ms, got {slo[1]!r}")
    within = _number("within-ms", within_ms) if within_ms is not None else None
    if within is not None and within <= 0:
        raise InputError(f"--within-ms must be a positive number of ms, got {within_ms!r}")
    if slo is not None and slo[0] == "within":
        within = slo_value[0]
    n_sim = 0 if sim_requests is None else _number("simulate", sim_requests, integer=True)
    if n_sim == 0 and ((slo is not None and slo[0] != "mean") or within is not None or plot_kind == "percentiles"):
        n_sim = 200_000
    if n_sim and n_sim < 1000:
        raise InputError(f"--simulate must be 0 or ≥ 1000 requests, got {sim_requests!r}")
    n_base = _number("baseline-requests", baseline_requests, integer=True)
    if n_base < 1000:
        raise InputError(f"--baseline-requests must be ≥ 1000, got {baseline_requests!r}")
    if plot_kind not in ("tradeoff", "percentiles", "scenarios"):
        raise InputError(f"unknown --plot-kind {plot_kind!r}; valid: tradeoff, percentiles, scenarios")
    if output and (slo is None or len(problems) != 1):
        raise InputError("-o writes the SLO's chosen policy: give one SLO and one scenario/load")
    for path in (output, csv_path):
        if path:
            _output_folder(path)
    if plot_path:
        check_path(plot_path)
    sd = _number("seed", seed, integer=True)
    static_sizes = None if statics is None else [int(_number("statics", x, integer=True)) for x in statics.split(",") if x.strip()]
    show = sys.stderr.isatty() if progress is None else progress
    tick, finish = _progress_line(show, "solves and simulations")
    n_workers = None if workers is None else _number("workers", workers, integer=True)
    runner = dask_mapper(dask_address, n_workers) if dask_address else contextlib.nullcontext(None)
    with runner as mapper:
        fronts = sweep_fronts(problems, _number("w2-min", w2_min), _number("w2-max", w2_max),
                              _number("points", points, integer=True), _number("rtol", rtol), n_sim,
                              () if within is None else (within,), sd, labels=labels,
                              extend=_number("extend", extend, integer=True), progress=tick, mapper=mapper)
        base, skipped = {}, {}
        if baselines or timeouts:
            for i, f in enumerate(fronts):
                base[i], skipped[i] = baseline_points(
                    f.problem, static_sizes if baselines else [], timeouts, n_base, sd,
                    simulate_tables=bool(n_sim), within_ms=() if within is None else (within,), mapper=mapper)
                if not baselines:
                    base[i] = [b for b in base[i] if b.family != "greedy"]
                if tick:
                    tick(len(base[i]))
    finish()
    chosen = None
    if slo is not None:
        kw = {"mean": "slo_mean_ms", "p95": "slo_p95_ms", "p99": "slo_p99_ms", "within": "slo_within"}[slo[0]]
        chosen = [f.choose(**{kw: slo_value}) for f in fronts]
    if output and chosen[0] is not None:
        pt = chosen[0]
        if math.isfinite(pt.w2_lo):
            write_policy(fronts[0].solution(pt), output)
        else:
            raise InputError("the chosen policy is the front's w2 = ∞ end (static batching); use --policy static:B instead of a table")
    rows = []
    d_fronts = []
    for i, f in enumerate(fronts):
        bl = []
        for b in base.get(i, []):
            F = f.power_at(b.mean_latency_ms)
            bl.append({**b.as_dict(), "front_power_w": F, "margin_w": b.mean_power_w - F,
                       "dominated": dominated_by_front(f, b.mean_latency_ms, b.mean_power_w, b.latency_ci, b.power_ci)})
        d_fronts.append({**f.problem.describe(), "label": f.label, "points": [p.as_dict() for p in f.points],
                         "baselines": bl, "skipped": [{"setting": s_, "reason": r} for s_, r in skipped.get(i, [])],
                         **({"chosen": chosen[i].as_dict() if chosen[i] else None} if chosen else {})})
        for p in f.points:
            rows.append(_csv_row(f, "smdp", "smdp", f"w2 in [{p.w2_lo:.6g}, {p.w2_hi:.6g}]", p, p.w2_lo, p.w2_hi,
                                 p.control_limit, within))
        for b, extra in zip(base.get(i, []), bl):
            rows.append({**_csv_row(f, "baseline", b.family, b.setting, b, None, None, None, within),
                         "mean_latency_ci_ms": b.latency_ci, "mean_power_ci_w": b.power_ci,
                         "dominated": extra["dominated"], "margin_w": extra["margin_w"]})
    if csv_path:
        _write_csv(csv_path, rows)
    if plot_path:
        _pareto_figure(fronts, base, plot_kind, plot_path, chosen, within, n_sim, sd, latency_cdfs)
    data = {"fronts": d_fronts, "slo": None if slo is None else {"kind": slo[0], "value": slo_value},
            "dominance_test": "F(W_b + h_W) <= P_b + h_P (+1e-6 relative); see smdp_batch.pareto",
            **({"output": output} if output and chosen[0] is not None else {}), **({"csv": csv_path} if csv_path else {}),
            **({"plot": plot_path} if plot_path else {})}
    _emit(data, as_json, _pareto_text(fronts, d_fronts, slo, slo_value, chosen, output, csv_path, plot_path))


def _csv_row(front, kind, family, setting, p, w2_lo, w2_hi, control_limit, within) -> dict:
    row = {"scenario": front.label or front.problem.describe().get("service", ""), "rho": front.problem.rho,
           "lam": front.problem.lam, "kind": kind, "family": family, "setting": setting,
           "w2_lo": w2_lo, "w2_hi": w2_hi, "mean_latency_ms": p.mean_latency_ms, "mean_power_w": p.mean_power_w,
           "efficiency_req_per_j": 1e3 * p.efficiency, "control_limit": control_limit,
           "mean_latency_ci_ms": 0.0, "mean_power_ci_w": 0.0,
           "p50_ms": p.percentiles.get("p50_ms"), "p95_ms": p.percentiles.get("p95_ms"), "p99_ms": p.percentiles.get("p99_ms"),
           "dominated": None, "margin_w": None}
    if within is not None:
        row[f"within_{within:g}ms"] = p.within.get(within)
    return row


def _write_csv(path: str, rows: list[dict]) -> None:
    import csv
    import io

    buf = io.StringIO()
    w = csv.DictWriter(buf, fieldnames=list(rows[0]), lineterminator="\n")
    w.writeheader()
    for r in rows:
        w.writerow({k: ("" if v is None else v) for k, v in r.items()})
    _write_text_atomically(path, buf.getvalue())


def _pareto_figure(fronts, base, kind, path, chosen, within, n_sim, seed, latency_cdfs) -> None:
    from .baselines import parse_policy
    from .analysis.plots import plot_percentiles, plot_tradeoff, save

    if kind in ("tradeoff", "scenarios"):
        fig = plot_tradeoff(fronts, base, model_panel=kind == "scenarios")
    else:
        f = fronts[0]
        pick = chosen[0] if chosen and chosen[0] is not None else f.points[len(f.points) // 2]
        k = f.points.index(pick)
        rules = {"greedy": parse_policy("greedy", f.problem.batch_sizes, f.problem.bmax)}
        for b in base.get(0, []):
            if b.family == "static":
                rules[b.setting] = parse_policy(b.setting, f.problem.batch_sizes, f.problem.bmax)
        for p in f.points[max(k - 1, 0): k + 2]:
            tag = " (chosen)" if p is pick and chosen else ""
            rules[f"SMDP w2 ∈ [{p.w2_lo:.3g}, {p.w2_hi:.3g}]{tag}"] = np.asarray(p.policy, dtype=np.int64)
        cdfs = latency_cdfs(f.problem, rules, requests=n_sim, seed=seed)
        fig = plot_percentiles(f, base.get(0, []), cdfs, within)
    save(fig, path)


def _pareto_text(fronts, d_fronts, slo, slo_value, chosen, output, csv_path, plot_path) -> str:
    from .analysis.plots import finite_w2

    lines = ["smdp-batch — latency–power trade-off over w2 (paper 004 §VII-B)"]
    for i, (f, d) in enumerate(zip(fronts, d_fronts)):
        lines += ["", _scenario_line(f.problem, w2="swept"), f"  {f.label}" if f.label else ""]
        lines.append(f"  {'w2 range':>21s}  {'W̄ ms':>9s}  {'P̄ W':>9s}  {'req/J':>7s}  {'Q':>4s}" +
                     ("  p95 ms  p99 ms" if f.points and f.points[0].percentiles else ""))
        for p in f.points:
            q = "-" if p.control_limit is None else str(p.control_limit)
            pct = (f"  {p.percentiles['p95_ms']:6.4g}  {p.percentiles['p99_ms']:6.4g}" if p.percentiles else "")
            lines.append(f"  [{finite_w2(p.w2_lo):>8s}, {finite_w2(p.w2_hi):>8s}]  {p.mean_latency_ms:9.6g}  "
                         f"{p.mean_power_w:9.6g}  {1e3 * p.efficiency:7.4g}  {q:>4s}{pct}")
        bl = d["baselines"]
        if bl:
            bad = [b for b in bl if not b["dominated"]]
            lines.append(f"  baselines   {len(bl)} points; the front dominates {len(bl) - len(bad)} "
                         f"(F(W_b + h_W) ≤ P_b + h_P)")
            for b in bl:
                if b["family"] in ("greedy", "static") or not b["dominated"]:
                    lines.append(f"    {b['setting']:34s} W̄ {b['mean_latency_ms']:8.4g} ms, P̄ {b['mean_power_w']:8.4g} W, "
                                 f"front {b['front_power_w']:8.4g} W ({b['margin_w']:+.3g} W)"
                                 f"{'' if b['dominated'] else '  NOT dominated'}")
        for s_ in d["skipped"]:
            lines.append(f"    {s_['setting']:34s} skipped: {s_['reason']}")
        if chosen:
            c = chosen[i]
            if slo[0] == "within":
                what = f"≥ {100 * slo_value[1]:g} % within {slo_value[0]:g} ms"
            else:
                what = f"{'W̄' if slo[0] == 'mean' else slo[0]} ≤ {slo_value:g} ms"
            if c is None:
                lines.append(f"  SLO         {what}: no swept policy meets it")
            else:
                lines.append(f"  SLO         {what}: least power {c.mean_power_w:.5g} W at W̄ = {c.mean_latency_ms:.5g} ms, "
                             f"w2 ∈ [{finite_w2(c.w2_lo)}, {finite_w2(c.w2_hi)}] (one policy; edges to the sweep's rtol)")
    if output and chosen[0] is None:
        lines.append(f"  not written {output}: no swept policy meets the SLO")
        output = None
    for label, path in (("written", output), ("csv", csv_path), ("figure", plot_path)):
        if path:
            lines.append(f"  {label:11s} {path}")
    return "\n".join(x for x in lines if x != "")


@cli.command("tables")
@scenario_options
@click.option("--rho-grid", default=None, help="loads ρ, e.g. 0.1,0.2,…,0.9")
@click.option("--lam-grid", default=None, help="arrival rates λ (1/ms)")
@click.option("--w2-grid", required=True, help="weights w2, e.g. 0,0.5,1,1.6,2.2,5")
@click.option("-o", "--output", "outdir", default=None, help="write one FILE.h5 per (load, w2) and a README.md index here")
@click.option("--plot", "plot_path", default=None, help="draw the policies (Fig. 3 style) to FILE.png|.svg|.pdf")
@click.option("--max-queue", default=None, help="largest queue length drawn [control limits + 4]")
@click.option("--json", "as_json", is_flag=True, help="print machine-readable JSON")
def tables_cmd(rho_grid, lam_grid, w2_grid, outdir, plot_path, max_queue, as_json, **opts):
    """Solve a grid of loads × weights: one policy table each, an index, and a Fig. 3-style chart."""
    import os

    from .analysis.plots import check_path, plot_policies, save

    if opts.get("preset") and "," in opts["preset"]:
        raise InputError("tables takes one --preset")
    problems, _ = _problems(opts, rho_grid, lam_grid)
    w2s = _grid("w2-grid", w2_grid)
    if any(w < 0 for w in w2s):
        raise InputError(f"--w2-grid values must be ≥ 0, got {w2_grid!r}")
    if outdir:
        parent = os.path.dirname(os.path.abspath(outdir))
        if not os.path.isdir(parent):
            raise InputError(f"output folder {parent!r} does not exist")
    if plot_path:
        check_path(plot_path)
    mq = None if max_queue is None else _number("max-queue", max_queue, integer=True)
    sols = []
    for p in problems:
        for w2 in w2s:
            sol = solve(p.replace(w2=w2))
            if sol.degenerate:
                raise InputError(f"ρ = {p.rho:.4g}, w2 = {w2:g}: the truncation is degenerate")
            sols.append(sol)
    prefix = (opts.get("preset") or "custom").replace(",", "_")
    names = [f"{prefix}_rho{s.problem.rho:.2f}_w2-{s.problem.w2:g}.h5" if rho_grid is not None or lam_grid is None
             else f"{prefix}_lam{s.problem.lam:.4g}_w2-{s.problem.w2:g}.h5" for s in sols]
    if outdir:
        os.makedirs(outdir, exist_ok=True)
        for s, name in zip(sols, names):
            write_policy(s, os.path.join(outdir, name))
        _write_text_atomically(os.path.join(outdir, "README.md"), _tables_readme(sols, names))
    if plot_path:
        grid = {(round(s.problem.rho, 6), s.problem.w2): (s.policy[: s.s_max + 1], s.control_limit) for s in sols}
        save(plot_policies(grid, problems[0].batch_sizes, mq), plot_path)
    rows = [{"file": n, **{k: v for k, v in s.to_dict().items() if k != "policy"}} for s, n in zip(sols, names)]
    lines = [f"smdp-batch — {len(sols)} policy tables ({len(problems)} loads × {len(w2s)} weights)",
             _scenario_line(problems[0], rate="loads on a grid (below)", w2="on a grid (below)")]
    for s, n in zip(sols, names):
        lines.append(f"  {n:32s} ρ = {s.problem.rho:<5.3g} w2 = {s.problem.w2:<5g} "
                     f"{describe_policy(s.policy, s.problem.batch_sizes)[:44]:44s} W̄ {s.deployed.mean_latency_ms:7.4g} ms, "
                     f"P̄ {s.deployed.mean_power_w:7.4g} W")
    for label, path in (("written", outdir), ("figure", plot_path)):
        if path:
            lines.append(f"  {label:11s} {path}")
    _emit({"tables": rows, **({"output": outdir} if outdir else {})}, as_json, "\n".join(lines))


def _tables_readme(sols, names) -> str:
    import shlex

    p = sols[0].problem
    cmd = "smdp-batch " + " ".join(shlex.quote(a) for a in _ARGV)
    out = [
        "# Policy tables",
        "",
        f"Written by `{cmd}` (smdp-batch {__version__}); run it again to regenerate them.",
        "",
        f"Scenario: batch sizes {_sizes_text(p.batch_sizes)}, l(b) = `{p.latency.spec()}` ms, "
        f"ζ(b) = `{p.energy.spec()}` mJ, service `{p.service.spec()}`, w1 = {p.w1:g}. Each file is an HDF5 policy "
        "table (DESIGN.md §4): load it with `smdp_batch.runtime.PolicyTable.load(path)` or inspect it with "
        "`smdp-batch show FILE`.",
        "",
        "| file | ρ | λ (1/ms) | w2 | policy | W̄ (ms) | P̄ (W) | s_max |",
        "|---|---|---|---|---|---|---|---|",
    ]
    for s, n in zip(sols, names):
        ev = s.deployed
        out.append(f"| `{n}` | {s.problem.rho:.4g} | {s.problem.lam:.6g} | {s.problem.w2:g} | "
                   f"{describe_policy(s.policy, s.problem.batch_sizes)} | {ev.mean_latency_ms:.5g} | "
                   f"{ev.mean_power_w:.5g} | {s.s_max} |")
    return "\n".join(out) + "\n"


@cli.command("export")
@click.argument("path")
@click.option("--to", "target", required=True, help="triton | tfserving | ray | torchserve")
@click.option("--requests", default="200000", show_default=True, help="requests simulated per candidate setting")
@click.option("--seed", default="0", show_default=True, help="random seed (the same arrivals for table and export)")
@click.option("-o", "--output", default=None, help="write the config text to this file")
@click.option("--json", "as_json", is_flag=True, help="print machine-readable JSON")
def export_cmd(path, target, requests, seed, output, as_json):
    """Export a policy table as a server's batching settings, with what they cannot express and its cost."""
    from .export.configs import TARGETS, export_policy

    if target not in TARGETS:
        raise InputError(f"unknown export target {target!r}; valid: {', '.join(TARGETS)}")
    pf = read_policy(path)
    problem = build_problem({}, _file_inputs(pf))
    n = _number("requests", requests, integer=True)
    if n < 1000:
        raise InputError(f"--requests must be ≥ 1000, got {requests!r}")
    if output:
        _output_folder(output)
    ex = export_policy(problem, pf.policy[:-1], target, requests=n, seed=_number("seed", seed, integer=True))
    if output:
        _write_text_atomically(output, ex.text)
    g = ex.gap
    lines = [f"smdp-batch — {target} settings for {path}", _scenario_line(problem), "", ex.text.rstrip(), ""]
    lines += [f"  fidelity    {x}" for x in ex.limitations]
    lines.append(
        f"  simulated gap ({g['requests']} requests, same arrivals): table W̄ {g['table']['mean_latency_ms']:.4g} ms, "
        f"P̄ {g['table']['mean_power_w']:.4g} W; export W̄ {g['export']['mean_latency_ms']:.4g} ms, "
        f"P̄ {g['export']['mean_power_w']:.4g} W; objective +{g['objective_increase_pct']:.3g} %"
    )
    if output:
        lines.append(f"  written     {output}")
    _emit({**ex.as_dict(), "policy_file": path, **({"output": output} if output else {})}, as_json, "\n".join(lines))


def _output_folder(path: str) -> str:
    import os

    folder = os.path.dirname(os.path.abspath(path))
    if not os.path.isdir(folder):
        raise InputError(f"output folder {folder!r} does not exist")
    return folder


def _write_text_atomically(path: str, text: str) -> None:
    from .files import atomic_output

    with atomic_output(path) as tmp, open(tmp, "w", encoding="utf-8") as fh:
        fh.write(text)


@cli.command("show")
@click.argument("path")
@click.option("--json", "as_json", is_flag=True, help="print machine-readable JSON")
def show_cmd(path, as_json):
    """Print what a policy table (or a λ-bank) holds."""
    from .errors import PolicyFileError
    from .runtime.schema import read_bank

    try:
        pf = read_policy(path)
    except PolicyFileError as e:
        if "it is a policy bank" not in str(e):
            raise
        bank = read_bank(path)
        rows = [{"lam": t.inputs["lam"], "rho": t.inputs["rho"], "smax": t.truncation["smax"],
                 "control_limit": control_limit_of(t.policy, t.batch_sizes), "mean_latency_ms": t.solution["mean_latency_ms"],
                 "mean_power_w": t.solution["mean_power_w"], "policy": [int(a) for a in t.policy]} for t in bank]
        lines = [f"{path}: {bank[0].meta.get('format')} v{bank[0].meta.get('schema_version')}, {len(bank)} tables"]
        lines += [f"  λ = {r['lam']:<9.5g} ρ = {r['rho']:<6.3g} s_max = {r['smax']:<5} control limit {r['control_limit']}, "
                  f"W̄ = {r['mean_latency_ms']:.4g} ms, P̄ = {r['mean_power_w']:.4g} W" for r in rows]
        _emit({"path": path, **bank[0].meta, "tables": rows}, as_json, "\n".join(lines))
        return

    sizes = pf.batch_sizes
    d = {
        "path": path,
        **pf.meta,
        "inputs": pf.inputs,
        "truncation": pf.truncation,
        "solution": {k: v for k, v in pf.solution.items() if k not in ("relative_values", "summary_json")},
        "policy": [int(a) for a in pf.policy],
        "control_limit": control_limit_of(pf.policy, sizes),
    }
    i, t, s = pf.inputs, pf.truncation, pf.solution
    text = "\n".join(
        [
            f"{path}: {pf.meta.get('format')} v{pf.meta.get('schema_version')} by {pf.meta.get('creator')}, {pf.meta.get('created')}",
            f"  scenario    λ = {i['lam']:.6g} /ms (ρ = {i['rho']:.4g}), batch sizes {sizes[0]}..{sizes[-1]} ({len(sizes)}), "
            f"l = {i['latency']}, ζ = {i['energy']}, service {i['service']}, w1 = {i['w1']:g}, w2 = {i['w2']:g}",
            f"  truncation  s_max = {t['smax']}, c_o = {t['abstract_cost']:g}, Δ = {t['delta']:.3g}",
            f"  solver      {s['solver']}: {s['iterations']} iterations, converged = {bool(s['converged'])}",
            f"  policy      {describe_policy(pf.policy, sizes)}",
            f"  metrics     W̄ = {s['mean_latency_ms']:.6g} ms, P̄ = {s['mean_power_w']:.6g} W, ĝ = {s['avg_cost']:.6g}",
        ]
    )
    _emit(d, as_json, text)


@cli.command("profile")
@click.argument("path")
@click.option("--json", "as_json", is_flag=True, help="print machine-readable JSON")
def profile_cmd(path, as_json):
    """Report what a profile CSV measured and how well l(b), ζ(b) models fit it.

    Columns: batch_size, latency_ms and optionally energy_mj or power_w; one row per measurement.
    Use it as --latency csv:FILE[:interp|affine|power], --energy csv:FILE[:fit], --service empirical:FILE.
    """
    prof = read_profile(path)
    rep = prof.report()
    sizes = rep["batch_sizes"]
    lines = [
        f"{path}: {rep['rows']} measurements of {len(sizes)} batch sizes ({_sizes_text(sizes)}), "
        f"{min(rep['samples_per_size'])}–{max(rep['samples_per_size'])} per size"
    ]
    for q, unit in (("latency", "ms"), ("energy", "mJ")):
        if q not in rep:
            lines.append(f"  {q:8s} not measured (add energy_mj or power_w)")
            continue
        for fit in ("affine", "power"):
            r = rep[q][fit]
            form = "A·b + C" if fit == "affine" else "A·b^p"
            params = ", ".join(f"{x:.6g}" for x in r["params"])
            lines.append(
                f"  {q:8s} {fit:6s} {form:7s} = ({params}): R² = {r['r2']:.5f}, worst mean residual "
                f"{r['worst_residual']:+.4g} {unit} at b = {r['worst_at_batch_size']}"
            )
    _emit(rep, as_json, "\n".join(lines))


# ----------------------------------------------------------------------------------------- LLM schemes
_MB_COLS = [("scheme", "scheme", ""), ("lam", "λ", "g"), ("throughput", "throughput", ".4g"),
            ("mean_latency", "mean latency", ".4g"), ("p95_latency", "p95 latency", ".4g"),
            ("slo_attainment", "SLO share", ".3f"), ("mean_batch", "mean batch", ".1f"), ("max_wait", "max wait", "")]
_LLM_COLS = [("scheme", "scheme", ""), ("lam", "λ req/s", "g"), ("throughput_tok_s", "tokens/s", ".1f"),
             ("mean_latency_s", "mean s", ".3g"), ("p95_latency_s", "p95 s", ".3g"), ("mean_ttft_s", "TTFT s", ".3g"),
             ("slo_attainment", "SLO share", ".3f"), ("waste_ratio", "waste", ".3f"),
             ("peak_memory_share", "peak mem", ".3f"), ("preemptions", "preempted", "d")]


@cli.command("multibin")
@click.option("--lam-grid", default="1,2,4,6,8", show_default=True, help="arrival rates λ (requests per time unit)")
@click.option("--law", default="uniform:1,20", show_default=True, help="request time law: uniform:LO,HI | exp:MU | trace:FILE[:COLUMN]")
@click.option("--bins", "k", default="2", show_default=True, help="number of bins k (equal-mass edges, Lemma 4.1)")
@click.option("--batch", "B", default="128", show_default=True, help="batch size B")
@click.option("--servers", default="1", show_default=True, help="servers (0: infinitely many; no per-bin SMDP then)")
@click.option("--requests", default="100000", show_default=True, help="requests simulated per load")
@click.option("--max-waits", default="5,10,20,40,80,160", show_default=True, help="max-wait grid for the tuned fixed-B rule ('' for none)")
@click.option("--smdp/--no-smdp", default=True, show_default=True, help="solve and simulate the per-bin SMDP tables")
@click.option("--slo", default=None, help="latency bound for the SLO share column")
@click.option("--seed", default="0", show_default=True, help="random seed (the same stream for every scheme)")
@click.option("--plot", "plot_path", default=None, help="draw throughput and latency to FILE.png|.svg|.pdf")
@click.option("--json", "as_json", is_flag=True, help="print machine-readable JSON")
def multibin_cmd(lam_grid, law, k, B, servers, requests, max_waits, smdp, slo, seed, plot_path, as_json):
    """Multi-bin batching (papers 000/003) vs per-bin SMDP tables over a load sweep.

    Prints the closed forms (Thm 4.2 throughput, c_max, Lemma 5.1 latency for uniform laws), then one
    row per load and scheme on the same simulated stream.
    """
    from .llm import binsim, multibin
    from .llm.sweep import format_rows, multibin_sweep, plot_rows
    from .analysis.plots import check_path, save

    if plot_path:
        check_path(plot_path)
    lams = _grid("lam-grid", lam_grid)
    k, B = _number("bins", k, integer=True), _number("batch", B, integer=True)
    servers, n = _number("servers", servers, integer=True), _number("requests", requests, integer=True)
    if k < 1 or B < 1 or n < 1 or servers < 0:
        raise InputError("--bins, --batch and --requests must be ≥ 1 and --servers ≥ 0")
    if servers == 0 and smdp:
        raise InputError("--servers 0 (infinitely many) has no per-bin SMDP: add --no-smdp, or give --servers ≥ 1")
    waits = _grid("max-waits", max_waits) if max_waits.strip() else []
    slo_v = _number("slo", slo) if slo is not None else None
    rl = binsim.parse_request_law(law)
    rows = multibin_sweep(lams, law=rl, B=B, k=k, n=n, servers=servers, seed=_number("seed", seed, integer=True),
                          max_waits=waits, smdp=smdp, slo=slo_v)
    theory = {}
    if rl.kind == "uniform":
        lo, hi = rl.params
        theory = {"throughput_thm_4_2": multibin.uniform_throughput(k, B, lo, hi), "c_max": multibin.capacity(B, lo, hi),
                  "lemma_5_1_latency": {str(l): multibin.uniform_latency(l, k, B, lo, hi) for l in lams}}
    if plot_path:
        save(plot_rows(rows, [("throughput", "throughput"), ("mean_latency", "mean latency")],
                       f"{rl.spec()}, k = {k}, B = {B}, servers = {servers or '∞'}"), plot_path)
    head = f"multi-bin batching: {rl.spec()}, k = {k}, B = {B}, servers = {servers or '∞'}, {n} requests per load"
    if theory:
        head += (f"\n  Thm 4.2 saturation throughput {theory['throughput_thm_4_2']:.4g}, c_max {theory['c_max']:.4g}; "
                 "Lemma 5.1 latency " + ", ".join(f"λ={l}: {v:.4g}" for l, v in theory["lemma_5_1_latency"].items()))
    _emit({"theory": theory, "rows": rows}, as_json, head + "\n" + format_rows(rows, _MB_COLS))


@cli.command("llm")
@click.option("--lam-grid", default="0.5,1,2,3", show_default=True, help="arrival rates (requests/s)")
@click.option("--requests", default="2000", show_default=True, help="requests per load")
@click.option("--prompt", default="lognormal:200,0.8", show_default=True, help="prompt tokens: const:N | uniform:A,B | exp:MEAN | lognormal:MEDIAN,SIGMA")
@click.option("--output-tokens", default="lognormal:150,0.7", show_default=True, help="output tokens (same laws)")
@click.option("--schemes", default=",".join(("static", "continuous", "multibin", "perbin-smdp", "bucketserve", "bucketserve-sjf", "mem-aware", "sla")), show_default=True, help="schemes to run")
@click.option("--mem-gib", default="10", show_default=True, help="KV-cache memory cap (GiB)")
@click.option("--slo", default="20", show_default=True, help="end-to-end latency SLO (s) for the SLO share")
@click.option("--d-sla", default="0.024", show_default=True, help="paper 002 Alg. 2's decode-step SLA D_SLA (s)")
@click.option("--static-batch", default="16", show_default=True, help="batch size of static and multi-bin batching")
@click.option("--max-batch", default="64", show_default=True, help="continuous batching's and BucketServe's largest batch")
@click.option("--bins", "k", default="4", show_default=True, help="multi-bin: bins by output length (equal mass)")
@click.option("--seed", default="0", show_default=True, help="random seed (the same stream for every scheme)")
@click.option("--plot", "plot_path", default=None, help="draw the sweep to FILE.png|.svg|.pdf")
@click.option("--json", "as_json", is_flag=True, help="print machine-readable JSON")
def llm_cmd(lam_grid, requests, prompt, output_tokens, schemes, mem_gib, slo, d_sla, static_batch, max_batch, k, seed,
            plot_path, as_json):
    """LLM serving schemes (papers 000, 001, 002) on one engine and one request stream per load."""
    from .llm.engine import LLMModel
    from .llm.sweep import format_rows, llm_sweep, plot_rows
    from .analysis.plots import check_path, save

    if plot_path:
        check_path(plot_path)
    mem = _number("mem-gib", mem_gib)
    if not mem > 0:
        raise InputError(f"--mem-gib must be > 0, got {mem_gib!r}")
    model = LLMModel(mem_cap=mem * 2**30)
    names = [s.strip() for s in schemes.split(",") if s.strip()]
    ints = {o: _number(o, v, integer=True) for o, v in (("requests", requests), ("static-batch", static_batch),
                                                        ("max-batch", max_batch), ("bins", k), ("seed", seed))}
    if min(ints["requests"], ints["static-batch"], ints["max-batch"], ints["bins"]) < 1:
        raise InputError("--requests, --static-batch, --max-batch and --bins must be ≥ 1")
    rows = llm_sweep(_grid("lam-grid", lam_grid), n=ints["requests"], prompt=prompt, output=output_tokens, model=model,
                     slo=_number("slo", slo), schemes=names, static_batch=ints["static-batch"],
                     max_batch=ints["max-batch"], k=ints["bins"], d_sla=_number("d-sla", d_sla), seed=ints["seed"])
    if plot_path:
        save(plot_rows(rows, [("throughput_tok_s", "tokens/s"), ("mean_latency_s", "mean latency (s)"),
                              ("slo_attainment", "SLO share")], f"KV cap {mem:g} GiB"), plot_path)
    head = (f"LLM serving: {ints['requests']} requests per load, prompts {prompt}, outputs {output_tokens}, "
            f"KV cap {mem:g} GiB = {model.cap_tokens} tokens, SLO {_number('slo', slo):g} s")
    notes = [f"  {r['scheme']} at λ = {r['lam']:g}: {r['note']}" for r in rows if "note" in r]
    table = format_rows([r for r in rows if "note" not in r], _LLM_COLS)
    _emit({"rows": rows}, as_json, "\n".join([head, table] + notes))


def _sizes_text(sizes) -> str:
    sizes = list(sizes)
    if len(sizes) > 3 and sizes == list(range(sizes[0], sizes[-1] + 1)):
        return f"{sizes[0]}..{sizes[-1]}"
    return ",".join(map(str, sizes))


class _StderrNotice(logging.Handler):
    """The library's notices (e.g. numba compiling on a cold cache) as ``smdp-batch: …`` lines on stderr."""

    def emit(self, record: logging.LogRecord) -> None:
        click.echo(f"smdp-batch: {record.getMessage()}", err=True)


def _notices_to_stderr() -> None:
    log = logging.getLogger("smdp_batch")
    if not any(isinstance(h, _StderrNotice) for h in log.handlers):
        log.addHandler(_StderrNotice())
    log.setLevel(logging.INFO)


def main(argv: list[str] | None = None) -> int:
    """Console entry point; returns the exit code (errors: one line on stderr, code 2)."""
    args = sys.argv[1:] if argv is None else list(argv)
    _ARGV[:] = args
    _notices_to_stderr()
    if not args:
        click.echo(cli.get_help(click.Context(cli, info_name="smdp-batch")))
        return 0
    try:
        rc = cli.main(args=args, prog_name="smdp-batch", standalone_mode=False)
    except InputError as e:
        click.echo(f"smdp-batch: error: {e}", err=True)
        return 2
    except click.ClickException as e:
        click.echo(f"smdp-batch: error: {e.format_message()}", err=True)
        return 2
    except click.exceptions.Abort:
        click.echo("smdp-batch: aborted", err=True)
        return 1
    except OSError as e:
        where = f" ({e.filename})" if getattr(e, "filename", None) else ""
        click.echo(f"smdp-batch: error: {e.strerror or e}{where}", err=True)
        return 2
    return rc if isinstance(rc, int) else 0
