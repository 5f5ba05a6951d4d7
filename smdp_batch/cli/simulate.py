"""Commands that simulate: ``simulate`` (one policy or server rule, with percentiles and 95 %
intervals) and ``compare`` (least power at a latency SLO, best-tuned servers against the SMDP)."""

from __future__ import annotations

import sys

import click
import numpy as np

from ..errors import InputError
from ..runtime.schema import read_policy
from .options import UNITS, build_problem, emit, file_inputs, json_option, progress_line, scenario_line, scenario_options
from .slo import answer_lines, load_range_options, loads_for, search_options, slo_from, slo_options
from ..limits import SEED_MAX, REQUESTS_LIMIT
from .types import Grid, Number, OneOf, option


@click.command("simulate", short_help="Simulate a policy or a server's batching rule, with 95% intervals.")
@scenario_options
@option("--policy", "policy_spec", required=True, metavar="SPEC",
              help="static:B | greedy | control:Q | FILE.h5 | smdp:w2=X[,bmax=C][,lam=L] (each table optionally "
                   "+timer:MS[:pad]) | triton:… | tfserving:… | ray:… | torchserve:…")
@option("--requests", type=Number(integer=True, min=100, max=REQUESTS_LIMIT), default="1000000", show_default=True,
              help="Number of requests to simulate.")
@option("--seed", type=Number(integer=True, min=0, max=SEED_MAX), default="0", show_default=True,
              help="Random seed (runs are reproducible).")
@option("--arrivals", default="poisson", show_default=True, metavar="SPEC",
              help="poisson (a phase table: its own MAP) | trace:FILE.csv | mmpp:L1,L2,R12,R21 | map:FILE.json")
@option("--phase-rule", type=OneOf(("qmdp", "likely", "true"), "phase rule"), default="qmdp", show_default=True,
        help="A phase table (solve --arrivals … -o): act on the filter's belief (qmdp: belief-weighted action "
             "values; likely: the most likely phase) or on the true phase (a bound; MAP arrivals only).")
@option("--warmup", type=Number(), default="0.05", show_default=True, help="Share of the first requests left out.")
@option("--batches", type=Number(integer=True, min=2, max=10_000), default="20", show_default=True,
              help="Batch-means groups for the 95% intervals.")
@option("--within-ms", type=Grid(), default=None,
              help="Also report the share of requests served within these bounds (ms), e.g. 10 or 5,10.")
@option("--progress/--no-progress", default=None, show_default="on a terminal", help="Progress bar on stderr.")
@json_option
def simulate_cmd(policy_spec, requests, seed, arrivals, phase_rule, warmup, batches, within_ms, progress, as_json,
                 **opts):
    """Simulate a policy or a server's batching rule: latency percentiles, power, 95% intervals."""
    from ..analysis.simulate import simulate
    from ..baselines.servers import parse_rule
    from ..runtime.phase_file import policy_version
    from .bursty import phase_file_rule, stream

    n, sd = requests, seed
    is_file = policy_spec.lower().endswith((".h5", ".hdf5"))
    if is_file and policy_version(policy_spec) == 2:  # a phase table (MAP arrivals): its own MAP by default
        from ..runtime.phase_file import read_phase_policy
        from ..model.arrivals import MAP

        pf = read_phase_policy(policy_spec)
        problem = build_problem(opts, file_inputs(pf, opts))
        table_map = MAP(pf.D0, pf.D1)
        arr, path = stream(arrivals, n, sd, table_map)
        rule = phase_file_rule(pf, table_map, phase_rule, path)
    else:
        problem = build_problem(opts, file_inputs(read_policy(policy_spec), opts) if is_file else None)
        rule = smdp_rule(policy_spec, problem) if policy_spec.strip().lower().startswith("smdp:") else \
            parse_rule(policy_spec, problem)
        arr, _ = stream(arrivals, n, sd)
    kw = dict(requests=n, seed=sd, arrivals=arr, warmup=warmup, batches=batches,
              within_ms=() if within_ms is None else tuple(within_ms))
    if sys.stderr.isatty() if progress is None else progress:
        with click.progressbar(length=n if arr is None else arr.size, label="simulating", file=sys.stderr) as bar:
            res = simulate(problem, rule, progress=bar.update, **kw)
    else:
        res = simulate(problem, rule, **kw)
    d = {**problem.describe(), "policy_spec": rule.spec, "arrivals": arrivals, **res.as_dict(),
         "units": dict(UNITS)}
    pct = ", ".join(f"{k[:-3]} {v:.4g}" for k, v in res.percentiles.items())
    text = "\n".join([
        f"smdp-batch — simulation of {rule.spec} ({res.requests} requests, seed {sd}, {res.seconds:.2f} s)",
        scenario_line(problem),
        f"  latency     W̄ = {res.mean_latency_ms:.5g} ± {res.mean_latency_ci:.2g} ms (95%); {pct} ms",
        f"  power       P̄ = {res.mean_power_w:.5g} ± {res.mean_power_ci:.2g} W; throughput = {res.throughput * 1e3:.6g} req/s, "
        f"mean batch = {res.mean_batch_size:.4g}",
    ] + [f"  within      {100 * v:.4g} ± {100 * res.within_ci[b]:.2g} % of requests within {b:g} ms"
         for b, v in res.within.items()])
    emit(d, as_json, text)


def smdp_rule(spec: str, problem):
    """``smdp:w2=X[,bmax=C][,lam=L][+timer:MS[:pad]]`` — the SMDP table of weight X (compare's answers name
    tables so), solved now with the converged rule at λ = L (default: the scenario's) and the batch sizes ≤ C,
    optionally with a timer: the rule simulated as the table + timer runs it."""
    from ..baselines.servers import split_timer, table_rule, table_timer
    from ..solvers import solve

    head, tau, forced = split_timer(spec)
    keys = {}
    for part in filter(None, (x.strip() for x in head.partition(":")[2].split(","))):
        k, eq, v = part.partition("=")
        if not eq or k.strip().lower() not in ("w2", "bmax", "lam"):
            raise InputError(f"rule {spec!r}: unknown setting {part!r}; an SMDP table is smdp:w2=X[,bmax=C][,lam=L]")
        keys[k.strip().lower()] = Number(integer=k.strip().lower() == "bmax", min=0).parse_one(v.strip(), f"{spec}: {k}")
    if "w2" not in keys:
        raise InputError(f"rule {spec!r} needs w2=X (an SMDP table is smdp:w2=X[,bmax=C][,lam=L])")
    sizes = tuple(b for b in problem.batch_sizes if b <= keys.get("bmax", problem.bmax))
    if not sizes:
        raise InputError(f"rule {spec!r}: no allowed batch size is ≤ bmax = {keys['bmax']}")
    solved = problem.replace(w2=keys["w2"], batch_sizes=sizes, **({"lam": keys["lam"]} if "lam" in keys else {}))
    sol = solve(solved)
    policy = np.asarray(sol.policy)[: sol.s_max + 1]
    if tau is None:
        return table_rule(policy, sizes, spec=spec.strip())
    return table_timer(policy, sizes, tau, spec=spec.strip(), forced=forced)


@click.command("compare", short_help="Least power at a latency SLO over a load range: the SMDP table + timer "
                                     "against tuned and default server batchers.")
@scenario_options
@slo_options
@load_range_options
@search_options
@option("--arrivals", default="poisson", show_default=True, metavar="SPEC",
        help="poisson | trace:FILE.csv | mmpp:L1,L2,R12,R21 | map:FILE.json: the stream's burstiness, scaled to each "
             "load checked (a trace alone: its own mean rate).")
@json_option
def compare_cmd(requests, seed, as_json, load_range, rho_range, arrivals, **opts):
    """Least power that meets a latency SLO at every load: the SMDP table + timer against Triton (with and
    without preferred sizes), TF-Serving, Ray Serve and TorchServe, each tuned, and their default settings."""
    from ..analysis.slo import optimise
    from .bursty import stream

    slo = slo_from(opts)
    problem = build_problem(opts)
    single = opts.get("lam") is not None or opts.get("rho") is not None
    shape = None
    if arrivals.strip().lower() != "poisson":
        shape, _ = stream(arrivals, requests, seed)
        if shape is None or shape.size < 1000:
            raise InputError(f"--arrivals {arrivals}: the SLO search needs a stream of ≥ 1000 arrivals")
        if arrivals.strip().lower().startswith("trace:") and not single and load_range is None and rho_range is None:
            problem = problem.replace(lam=(shape.size - 1) / float(shape[-1] - shape[0]))  # the trace's own rate
    problem, lams = loads_for(problem, load_range, rho_range, single)
    tick, finish = progress_line(sys.stderr.isatty(), "simulated settings")
    try:
        ans = optimise(problem, slo, lams, requests=requests, seed=seed, arrivals=shape, progress=tick)
    finally:
        finish()
    d = {**problem.describe(), **ans.as_dict(), "arrivals": arrivals, "units": dict(UNITS)}
    where = (f"at {lams[0] * 1e3:.5g} req/s" if len(lams) == 1 else
             f"at {len(lams)} loads {lams[0] * 1e3:.5g}..{lams[-1] * 1e3:.5g} req/s")
    lines = [f"smdp-batch — least power with {slo.text()} {where} ({ans.requests} simulated requests per load, seed "
             f"{seed}, {arrivals} arrivals; {ans.evaluations} simulations, {ans.seconds:.1f} s)",
             scenario_line(problem, w2="searched")]
    lines += answer_lines(ans)
    emit(d, as_json, "\n".join(lines))
