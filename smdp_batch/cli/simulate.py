"""Commands that simulate: ``simulate`` (one policy or server rule, with percentiles and 95 %
intervals) and ``compare`` (least power at a latency SLO, best-tuned servers against the SMDP)."""

from __future__ import annotations

import sys

import click

from ..errors import InputError
from ..runtime.schema import read_policy
from .options import UNITS, build_problem, emit, file_inputs, json_option, scenario_line, scenario_options
from ..limits import SEED_MAX, REQUESTS_LIMIT
from .types import Grid, Number, OneOf, option


@click.command("simulate", short_help="Simulate a policy or a server's batching rule, with 95% intervals.")
@scenario_options
@option("--policy", "policy_spec", required=True, metavar="SPEC",
              help="static:B | greedy | control:Q | FILE.h5 | triton:… | tfserving:… | ray:… | torchserve:…")
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
        rule = parse_rule(policy_spec, problem)
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


@click.command("compare", short_help="Least power at a latency SLO: tuned server batchers against the SMDP table.")
@scenario_options
@option("--slo-mean-ms", type=Number(min=0, min_open=True), default=None, help="SLO: mean latency ≤ X ms.")
@option("--slo-p95-ms", type=Number(min=0, min_open=True), default=None, help="SLO: 95th-percentile latency ≤ X ms.")
@option("--slo-p99-ms", type=Number(min=0, min_open=True), default=None, help="SLO: 99th-percentile latency ≤ X ms.")
@option("--requests", type=Number(integer=True, min=1000, max=REQUESTS_LIMIT), default="200000", show_default=True,
              help="Requests simulated per candidate.")
@option("--seed", type=Number(integer=True, min=0, max=SEED_MAX), default="0", show_default=True,
              help="Random seed (the same arrivals for every candidate).")
@json_option
def compare_cmd(slo_mean_ms, slo_p95_ms, slo_p99_ms, requests, seed, as_json, **opts):
    """Least power at a latency SLO: best-tuned Triton, TF-Serving, Ray Serve, TorchServe vs the SMDP table."""
    from ..analysis.compare import best_at_slo

    given = [(m, v) for m, v in (("mean", slo_mean_ms), ("p95", slo_p95_ms), ("p99", slo_p99_ms)) if v is not None]
    if len(given) != 1:
        raise InputError("give exactly one SLO: --slo-mean-ms, --slo-p95-ms or --slo-p99-ms")
    metric, bound = given[0]
    problem = build_problem(opts)
    n = requests
    best, every = best_at_slo(problem, bound, metric, requests=n, seed=seed)
    rows = []
    for fam, c in best.items():
        rows.append({"family": fam, **({"setting": c.setting, "slo_metric_ms": c.latency_ms, "mean_latency_ms": c.mean_latency_ms,
                                        "mean_power_w": c.mean_power_w} if c else {"setting": None})})
    d = {**problem.describe(), "slo": {"metric": metric, "bound_ms": bound}, "best": rows,
         "candidates": [c.__dict__ for c in every]}
    ref = best["smdp"].mean_power_w if best["smdp"] else None
    lines = [f"smdp-batch — least power with {metric} latency ≤ {bound:g} ms ({n} simulated requests per candidate)",
             scenario_line(problem)]
    for fam, c in best.items():
        if c is None:
            lines.append(f"  {fam:10s} no setting meets the SLO")
            continue
        extra = f"  (+{c.mean_power_w - ref:.3g} W vs SMDP)" if ref is not None and fam != "smdp" else ""
        lines.append(f"  {fam:10s} {c.setting:42s} {metric} {c.latency_ms:7.4g} ms, W̄ {c.mean_latency_ms:7.4g} ms, "
                     f"P̄ {c.mean_power_w:7.4g} W{extra}")
    emit(d, as_json, "\n".join(lines))
