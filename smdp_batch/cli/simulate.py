"""Commands that simulate: ``simulate`` (one policy or server rule, with percentiles and 95 %
intervals) and ``compare`` (least power at a latency SLO, best-tuned servers against the SMDP)."""

from __future__ import annotations

import sys

import click

from ..errors import InputError
from ..runtime.schema import read_policy
from .options import (UNITS, build_problem, contention_option, emit, file_inputs, json_option, progress_line, refuse_swept, scenario_line,
                      scenario_options)
from .slo import (answer_lines, current_line, current_option, current_rule, load_range_options, loads_for, search_options,
                  served_from, served_option,
                  slo_from, slo_options, smdp_rule)
from .options import NOTICES_INFO, note_energy, time_unit_option
from ..limits import IDLE_POWER_MAX_W, SEED_MAX, REQUESTS_LIMIT
from .types import Duration, Grid, Instances, Number, OneOf, Power, option


_LOAD_KEYS = ("lam", "rho", "rps")


def _stream_rate(spec: str, arr) -> float:
    """Mean arrival rate (1/ms) of a ``--arrivals`` stream: a MAP's exact mean rate, else the trace's own."""
    from ..model.arrivals import parse_arrivals

    if not spec.strip().lower().startswith("trace:"):
        a = parse_arrivals(spec)
        if a is not None:
            return float(a.rate)
    return float((arr.size - 1) / (arr[-1] - arr[0]))


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
@time_unit_option
@option("--phase-rule", type=OneOf(("qmdp", "likely", "true"), "phase rule"), default="qmdp", show_default=True,
        help="A phase table (solve --arrivals … -o): act on the filter's belief (qmdp: belief-weighted action "
             "values; likely: the most likely phase) or on the true phase (a bound; MAP arrivals only).")
@option("--warmup", type=Number(), default="0.05", show_default=True, help="Share of the first requests left out.")
@option("--batches", type=Number(integer=True, min=2, max=10_000), default="20", show_default=True,
              help="Batch-means groups for the 95% intervals.")
@option("--within-ms", type=Grid(item=Duration()), default=None,
              help="Also report the share of requests served within these bounds (ms), e.g. 10 or 5,10.")
@option("--instances", type=Number(integer=True, min=1, max=64), default=None,
        show_default="1; a c-server table file: the count it was solved for",
        help="Model instances: sharing the one queue (Triton's instance_group count, TF-Serving's batch threads; the "
             "rule forms each batch when an instance is free), or ray: rules on that many replicas behind Ray's router. "
             "--rho is then per instance.")
@option("--idle-power", "idle_power", type=Power(min=0, max=IDLE_POWER_MAX_W), default=None,
        show_default="0; a c-server table file: the idle power it was solved with",
        help="Power of an instance while it runs no batch, W: added to P̄.")
@contention_option
@option("--progress/--no-progress", default=None, show_default="on a terminal", help="Progress bar on stderr.")
@json_option
def simulate_cmd(policy_spec, requests, seed, arrivals, time_unit, phase_rule, warmup, batches, within_ms, idle_power,
                 progress, as_json,
                 **opts):
    """Simulate a policy or a server's batching rule: latency percentiles, power, 95% intervals."""
    from ..analysis.simulate import simulate
    from ..baselines.servers import parse_rule
    from ..runtime.phase_file import policy_version
    from .bursty import phase_file_rule, stream

    refuse_swept(opts, ("w1", "w2"), "simulate reports W̄ and P̄, not a weighted cost (an SMDP table's weight goes "
                                     "in the rule: --policy smdp:w2=X)")
    n, sd = requests, seed
    table_path = policy_spec.rpartition("+timer:")[0] if "+timer:" in policy_spec.lower() else policy_spec
    is_file = table_path.lower().endswith((".h5", ".hdf5"))  # FILE.h5 or FILE.h5+timer:MS: the file's scenario
    idle_default = 0.0  # a c-server table file: the idle power it was solved with
    if is_file and table_path != policy_spec and policy_version(table_path) == 2:
        raise InputError(f"{table_path} is a phase table: it runs on its phase filter, without a timer; drop "
                         f"+timer:… (or use --phase-rule)")
    if is_file and policy_version(policy_spec) == 2:  # a phase table (MAP arrivals): its own MAP by default
        from ..runtime.phase_file import read_phase_policy
        from ..model.arrivals import MAP

        pf = read_phase_policy(policy_spec)
        if any(opts.get(k) is not None for k in _LOAD_KEYS):
            raise InputError(f"{policy_spec} is a phase table: the arrivals set the load (its own MAP's mean rate, or "
                             "the --arrivals stream's); drop --lam/--rho/--rps")
        problem = build_problem(opts, file_inputs(pf, opts))
        table_map = MAP(pf.D0, pf.D1)
        arr, path = stream(arrivals, n, sd, table_map, time_unit, pf.phases if phase_rule == "true" else None)
        rule = phase_file_rule(pf, table_map, phase_rule, path)
    else:
        arr, _ = stream(arrivals, n, sd, time_unit=time_unit)
        given = any(opts.get(k) is not None for k in _LOAD_KEYS)
        rate = None if arr is None else _stream_rate(arrivals, arr)
        if rate is not None and not given:  # the stream sets the load
            opts = {**opts, "lam": rate}
        table_file = read_policy(table_path) if is_file else None
        if table_file is not None:
            idle_default = float(table_file.inputs.get("idle_power_w", 0.0))
        problem = build_problem(opts, file_inputs(table_file, opts) if table_file is not None else None)
        if rate is not None and given:  # the load given: the stream's shape, scaled to it (as compare does)
            arr = arr * (rate / problem.lam)
            NOTICES_INFO.append(f"--arrivals {arrivals} (λ = {rate:.6g} /ms) scaled to the load given, "
                                f"λ = {problem.lam:.6g} /ms (times ×{rate / problem.lam:.6g})")
        rule = smdp_rule(policy_spec, problem) if policy_spec.strip().lower().startswith("smdp:") else \
            parse_rule(policy_spec, problem)
    if opts.get("contention") is not None and problem.instances == 1:
        raise InputError("--contention shapes several instances on one device: add --instances c > 1")
    kw = dict(requests=n, seed=sd, arrivals=arr, warmup=warmup, batches=batches,
              within_ms=() if within_ms is None else tuple(within_ms),
              idle_power_w=idle_default if idle_power is None else float(idle_power))
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


def measured_idle(opts: dict) -> float | None:
    """The idle power ``measure`` recorded beside the profile that --energy (else --latency) names, said on one
    line; None without one."""
    from ..model.profile import measured_idle_power
    from .options import profile_path

    for key in ("energy", "power", "latency"):
        path = profile_path(opts.get(key))
        idle = measured_idle_power(path) if path is not None else None
        if idle is not None:
            NOTICES_INFO.append(f"idle power {idle:.4g} W per instance, as measured beside {path} ({path}.json); "
                                "--idle-power W overrides it")
            return idle
    return None


@click.command("compare", short_help="Least power at a latency SLO over a load range: the SMDP table + timer "
                                     "against tuned and default server batchers.")
@scenario_options
@slo_options
@load_range_options
@search_options
@option("--arrivals", default="poisson", show_default=True, metavar="SPEC",
        help="poisson | trace:FILE.csv | mmpp:L1,L2,R12,R21 | map:FILE.json: the stream's burstiness, scaled to each "
             "load checked (a trace alone: its own mean rate).")
@time_unit_option
@current_option
@option("--instances", type=Instances(), default="1", show_default=True,
        help="Model instances sharing the one queue (Triton's instance_group count, TF-Serving's batch threads); "
             "--rho is then per instance. The tables tried are then the c-server SMDP's and the one-instance "
             "tables at λ/c, each run on all instances. auto (with the total load as --lam, --rps or "
             "--load-range): the count of least power among 1..8.")
@option("--idle-power", "idle_power", type=Power(min=0, max=IDLE_POWER_MAX_W), default=None,
        show_default="0, said as assumed", help="Power of an instance while it runs no batch, W: added to every "
        "setting's P̄ and to the power floor (the savings against a default rule shrink as it grows).")
@served_option
@contention_option
@json_option
def compare_cmd(requests, seed, as_json, load_range, rho_range, arrivals, time_unit, current, instances, idle_power,
                served, **opts):
    """Least power that meets a latency SLO at every load: the SMDP table + timer against Triton (with and
    without preferred sizes), TF-Serving, Ray Serve and TorchServe, each tuned, and their default settings."""
    from ..analysis.slo import not_simulated, optimise
    from .bursty import stream
    from .instances import auto_count, compare_counts, count_lines

    slo = slo_from(opts)
    refuse_swept(opts, ("w1", "w2"), "compare searches over the weights (the SMDP tables of the whole w2 front)")
    auto = instances == "auto"
    if auto and (opts.get("rho") is not None or rho_range is not None):
        raise InputError("--instances auto compares counts at the same total load: give it as --lam, --rps or "
                         "--load-range (req/s), not --rho or --rho-range, which are per instance")
    single = opts.get("lam") is not None or opts.get("rho") is not None
    if auto and not single and load_range is None:
        raise InputError("--instances auto compares counts at the same total load: give it as --lam (requests/ms), "
                         "--rps or --load-range (req/s)")
    if instances == 1 and opts.get("contention") is not None:
        raise InputError("--contention shapes several instances on one device: add --instances c > 1 (or auto)")
    problem = build_problem({**opts, "instances": auto_count(opts) if auto else instances})  # stable on the most tried
    note_energy(problem, opts)
    sd = served_from(served)
    if served is not None and auto:
        raise InputError("--served holds what one deployment added: give its --instances count, not auto")
    if idle_power is None:  # a measured profile may carry the device's idle power (measure's sidecar), or the calibration
        idle_power = measured_idle(opts)
    if idle_power is None and sd is not None:
        idle_power = sd.idle_power_w
    shape = None
    if arrivals.strip().lower() != "poisson" or time_unit is not None:
        shape, _ = stream(arrivals, requests, seed, time_unit=time_unit)
        if shape is None or shape.size < 1000:
            raise InputError(f"--arrivals {arrivals}: the SLO search needs a stream of ≥ 1000 arrivals")
        if arrivals.strip().lower().startswith("trace:") and not single and load_range is None and rho_range is None:
            problem = problem.replace(lam=_stream_rate(arrivals, shape))  # the trace's own rate
    problem, lams = loads_for(problem, load_range, rho_range, single)
    counts: list[dict] = []
    if auto:
        counts, problem = compare_counts(problem, slo, lams, requests, seed, shape, float(idle_power or 0.0))
    mine = current_rule(current, problem)
    tick, finish = progress_line(sys.stderr.isatty(), "simulated settings")
    try:
        ans = optimise(problem, slo, lams, requests=requests, seed=seed, arrivals=shape, progress=tick, current=mine,
                       idle_power_w=float(idle_power or 0.0), idle_power_given=idle_power is not None, served=sd)
    finally:
        finish()
    d = {**problem.describe(), **ans.as_dict(), "arrivals": arrivals, "units": dict(UNITS),
         **({"auto": counts} if auto else {})}
    where = (f"at {lams[0] * 1e3:.5g} req/s" if len(lams) == 1 else
             f"at {len(lams)} loads {lams[0] * 1e3:.5g}..{lams[-1] * 1e3:.5g} req/s")
    lines = [f"smdp-batch — least power with {slo.text()} {where} ({ans.requests} simulated requests per load, seed "
             f"{seed}, {arrivals} arrivals; {ans.evaluations} simulations, {ans.seconds:.1f} s)",
             scenario_line(problem, w2="searched")]
    lines += count_lines(counts, problem.instances) if auto else []
    lines += answer_lines(ans, problem.instances)
    if "torchserve" in not_simulated(problem):
        lines.append("  not tried   torchserve: its workers, each with its own queue, are not simulated on several "
                     "instances")
    if mine is not None:
        lines.append(current_line(ans))
    emit(d, as_json, "\n".join(lines))
