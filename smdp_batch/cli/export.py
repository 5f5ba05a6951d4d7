"""The ``export`` command: a policy table as a serving system's batching settings (Triton,
TF-Serving, Ray Serve, TorchServe).

Without an SLO, the closest setting of the target's own rule to the table, with what it cannot express, its
simulated cost, and its p99 off-peak (at half and a tenth of the table's load: a setting tuned at one load
can break a latency target when traffic falls).  With an SLO (``--slo-p99-ms X`` …, optionally
``--load-range``), the least-power setting of the target's rule that meets it at every load
(:func:`smdp_batch.analysis.slo.optimise`, the search ``compare`` runs), or a one-line refusal saying why."""

from __future__ import annotations

import math

import click

from ..errors import InputError
from ..export.configs import SLO_FAMILY, TARGETS
from ..runtime.schema import read_policy
from .options import (
    build_problem, contention_option, emit, file_inputs, json_option, prepare_outputs, scenario_args, scenario_line,
    write_text_atomically,
)
from .slo import (half_width, load_range_options, loads_for, plan_lines, search_options, served_from, served_option, slo_from,
                  slo_options)
from ..limits import IDLE_POWER_MAX_W
from .types import InputFile, Instances, OneOf, OutputPath, Power, check_extension, option

#: The file extensions of each target's config text (-o).
CONFIG_EXTS = {"triton": (".pbtxt", ".txt"), "tfserving": (".pbtxt", ".txt"), "ray": (".py", ".txt"),
               "torchserve": (".json", ".txt")}

#: Off-peak loads checked after an export without an SLO (shares of the table's λ), and the growth of the
#: tail that draws a warning.
OFF_PEAK = (0.5, 0.1)
TAIL_GROWTH = 2.0
INSTANCES_AUTO_MAX = 8  # --instances auto tries 1..this many
INSTANCES_AUTO_SAVING = 0.01  # an instance more must save this share of the power to be worth it


def _where(lams: list[float]) -> str:
    return (f"{lams[0] * 1e3:.5g} req/s" if len(lams) == 1 else
            f"every load of {lams[0] * 1e3:.5g}..{lams[-1] * 1e3:.5g} req/s")


@click.command("export", short_help="Export a policy table as a serving system's batching settings (optionally "
                                    "tuned to an SLO over a load range).")
@click.argument("path", type=InputFile())
@option("--to", "target", type=OneOf(TARGETS, "export target"), required=True, help="The serving system.")
@slo_options
@load_range_options
@search_options
@option("--instances", type=Instances(), default=None, show_default="1; a c-server table: the count it was solved for",
        help="Model instances (triton: instance_group count; tfserving: num_batch_threads; ray: num_replicas behind its "
             "router). With an SLO: the setting is tuned on that many, the load (the table's, or --load-range) their "
             "total. auto (with an SLO): the fewest of 1..8 whose least power is within 1 % of the least seen.")
@option("-o", "--output", type=OutputPath(), default=None,
        help="Write the config text to this file (triton, tfserving: .pbtxt or .txt; ray: .py or .txt; torchserve: "
             ".json or .txt).")
@option("--idle-power", "idle_power", type=Power(min=0, max=IDLE_POWER_MAX_W), default=None,
        show_default="0, said as assumed", help="With an SLO: power of an instance while it runs no batch, W, in every "
        "P̄ and in the power floor.")
@served_option
@contention_option
@json_option
def export_cmd(path, target, instances, requests, seed, output, as_json, load_range, rho_range, idle_power, served,
               **kw):
    """Export a policy table as a server's batching settings, with what they cannot express and its cost;
    with --slo-…, the least-power setting of the server's rule that meets the SLO at every load."""
    if output:  # the config's format is the target's
        check_extension(output, "-o", CONFIG_EXTS[target])
    prepare_outputs([("-o", output)], [("FILE (the policy table)", path)])
    slo = slo_from(kw, required=False)
    if slo is None and (load_range is not None or rho_range is not None):
        raise InputError("--load-range/--rho-range go with an SLO (--slo-p99-ms X …): give the SLO to meet over the range")
    if slo is None and idle_power is not None:
        raise InputError("--idle-power goes with an SLO (--slo-p99-ms X …): it prices the settings the SLO search tries")
    if slo is None and served is not None:
        raise InputError("--served goes with an SLO (--slo-p99-ms X …): it is what the server adds to each setting tried")
    if served is not None and instances == "auto":
        raise InputError("--served holds what one deployment added: give its --instances count, not auto")
    sd = served_from(served)
    if idle_power is None and sd is not None:
        idle_power = sd.idle_power_w
    given = f"--instances {instances}"
    if instances is None:  # a c-server table names its own count
        instances = _table_instances(path)
        given = f"{path} is a table for {instances} instances: it"
        if instances > 1 and slo is None:
            raise InputError(f"{path} is a table for {instances} instances sharing the queue: its export is the server "
                             f"rule tuned on them, so give the SLO to meet (--slo-p99-ms X …)")
    auto = instances == "auto"
    contention = kw.get("contention")
    if contention is not None and not auto and instances <= 1:
        raise InputError("--contention shapes several instances on one device: add --instances c > 1 (or auto)")
    if auto and rho_range is not None:
        raise InputError("--instances auto takes the load in req/s (--load-range, or the table's λ): ρ per instance "
                         "changes with the count")
    if auto or instances > 1:
        if target == "torchserve":
            raise InputError(f"{given} exports to triton (instance_group), tfserving "
                             "(num_batch_threads) or ray (num_replicas); torchserve's workers are not simulated yet")
        if slo is None:
            many = "the number of instances it picks" if auto else f"{instances} instances"
            raise InputError(f"--instances {instances} goes with an SLO (--slo-p99-ms X …): the export is then the "
                             f"least-power setting on {many}; the table itself is for one server")
    how = "export cannot rebuild it (evaluate or simulate the file with --service LAW)"
    phases = _phase_table(path, how)
    if phases is None:
        pf = read_policy(path)
        # the scenario comes from the values stored in the file: no path recorded in it is read
        problem = build_problem({"instances": 1 if auto else instances, "contention": contention},
                                file_inputs(pf, how=how))
    else:
        if auto or instances > 1:
            raise InputError(f"{path} is a phase table: its export is not simulated on several instances; use "
                             "--instances 1")
        pf, problem, arrival_map = phases
    if slo is not None:
        _export_at_slo(path, problem, target, slo, load_range, rho_range, requests, seed, output, as_json,
                       None if phases is None else arrival_map, auto, idle_power, sd)
        return
    from ..export.configs import export_policy

    if phases is None:
        ex = export_policy(problem, pf.policy[:-1], target, requests=requests, seed=seed)
        runtime = None
    else:
        from .bursty import phase_file_rule, sample_map

        # the stream `simulate --policy FILE` runs the table on (never a file named by the table's MAP spelling)
        arr, _ = sample_map(arrival_map, requests, seed)
        ex = export_policy(problem, None, target, requests=requests, seed=seed, arrivals=arr,
                           reference=phase_file_rule(pf, arrival_map, "qmdp", None))
        runtime = _phase_runtime(path, target)
    off = _off_peak(problem, ex.rule, ex.gap["export"]["p99_ms"], requests, seed,
                    None if phases is None else arrival_map)
    if output:
        write_text_atomically(output, ex.text)
    g = ex.gap
    lines = [f"smdp-batch — {target} settings for {path}", scenario_line(problem)]
    if phases is not None:
        lines.append(f"  arrivals    {arrival_map.spec()} (the phase table's MAP), mean λ̄ = {arrival_map.rate:.6g} /ms")
    lines += ["", ex.text.rstrip(), ""]
    lines += [f"  fidelity    {x}" for x in ex.limitations]
    if runtime is not None:
        lines.append(f"  runs as is  {runtime}")
    lines.append(
        f"  simulated gap ({g['requests']} requests, same arrivals): table W̄ {g['table']['mean_latency_ms']:.4g} ms, "
        f"P̄ {g['table']['mean_power_w']:.4g} W; export W̄ {g['export']['mean_latency_ms']:.4g} ms, "
        f"P̄ {g['export']['mean_power_w']:.4g} W; {_objective_words(g['objective_increase_pct'])}"
    )
    for row in off["loads"]:
        lines.append(f"  off-peak    at {row['share']:g}× the table's load ({row['lam'] * 1e3:.5g} req/s): p99 "
                     f"{row['p99_ms']:.4g} ms, P̄ {row['mean_power_w']:.4g} W")
    if off["warning"]:
        click.echo(f"smdp-batch: warning: {off['warning']}", err=True)
    if output:
        lines.append(f"  written     {output}")
    emit({**ex.as_dict(), "policy_file": path, "off_peak": off, **({"output": output} if output else {}),
          **({} if phases is None else {"arrivals": arrival_map.spec(), "runtime": runtime})}, as_json,
         "\n".join(lines))


def _phase_table(path: str, how: str):
    """(file, problem at the MAP's mean rate, MAP) for a phase table (schema 2), else None."""
    from ..model.arrivals import MAP
    from ..runtime.phase_file import policy_version, read_phase_policy

    if policy_version(path) != 2:
        return None
    pf = read_phase_policy(path)
    arrival_map = MAP(pf.D0, pf.D1)
    return pf, build_problem({}, file_inputs(pf, how=how)), arrival_map


def _phase_runtime(path: str, target: str) -> str:
    """How the phase table itself runs in ``target``'s world: the runtime batcher with the phase filter."""
    if target == "ray":
        return (f"the table itself runs in Ray Serve with its phase filter: "
                f"@table_batch({path!r}) from smdp_batch.integrations.ray_serve (replaces "
                "@serve.batch) — the setting above is for a plain @serve.batch")
    return (f"the table itself runs in a Python server (PyTriton, FastAPI) with its phase filter: "
            f"DynamicBatcher(infer, PhasePolicy.load({path!r})) from smdp_batch.runtime")


def _objective_words(pct: float) -> str:
    """The export's objective against the table's, in words (never a signed number)."""
    if pct != pct:
        return "objective not comparable"
    if abs(pct) < 5e-4:
        return "the same objective (within 0.0005 %)"
    return f"objective {abs(pct):.3g} % {'higher' if pct > 0 else 'lower'} than the table's"


def _off_peak(problem, rule, planned: float, requests: int, seed: int, arrival_map=None) -> dict:
    """p99 of the exported rule at :data:`OFF_PEAK` shares of the table's load, beside ``planned`` (its p99 at
    the table's load, from the export's own simulation), with a warning when the tail grows past
    :data:`TAIL_GROWTH`× the planned value.  ``arrival_map``: a MAP whose rates are scaled (else Poisson)."""
    from ..analysis.simulate import simulate

    rows = []
    for share in OFF_PEAK:
        arr = None
        if arrival_map is not None:
            from .bursty import sample_map

            arr, _ = sample_map(arrival_map.scaled(share), requests, seed)
        res = simulate(problem.replace(lam=problem.lam * share), rule, requests=requests, seed=seed, arrivals=arr)
        rows.append({"share": share, "lam": problem.lam * share, "p99_ms": res.percentiles["p99_ms"],
                     "mean_power_w": res.mean_power_w})
    worst = max(rows, key=lambda r: r["p99_ms"])
    warning = None
    if worst["p99_ms"] > TAIL_GROWTH * planned:
        warning = (f"this setting's p99 grows from {planned:.4g} ms at the table's load to {worst['p99_ms']:.4g} ms at "
                   f"{worst['share']:g}× it ({worst['p99_ms'] / planned:.2g}×); give the SLO and the loads the server "
                   f"sees (--slo-p99-ms X --load-range LO:HI) to export a setting that holds across them")
    return {"planned_p99_ms": planned, "loads": rows, "warning": warning}


def _table_instances(path: str) -> int:
    """The instance count a version-1 table was solved for (1 for any other file: its own reader says what it is)."""
    from ..runtime.phase_file import policy_version

    if policy_version(path) != 1:
        return 1
    return int(read_policy(path).inputs.get("instances", 1))


def _choose_instances(problem, family: str, slo, load_range, requests, seed,
                      idle_power: float | None = None) -> tuple[list[dict], int | None]:
    """--instances auto: for c = 1, 2, … 8 instances sharing the same total load, the family's least-power
    setting meeting the SLO at every load; then the fewest c whose power is within 1 % of the least seen.  It
    stops after the first count that saves under 1 % over the best so far (without idle power per instance
    more instances never cost power in the model: the answer is where adding one stops paying)."""
    from ..analysis.slo import optimise

    rows: list[dict] = []
    best = math.inf
    top = INSTANCES_AUTO_MAX if problem.contention is None else min(INSTANCES_AUTO_MAX, problem.contention.levels)
    for c in range(1, top + 1):
        try:
            pc, lams = loads_for(problem.replace(instances=c), load_range, None)
            ans = optimise(pc, slo, lams, families=(family,), requests=requests, seed=seed,
                           idle_power_w=float(idle_power or 0.0), idle_power_given=idle_power is not None)
        except InputError as e:  # the load is beyond what c instances can serve (ρ ≥ 1)
            rows.append({"instances": c, "setting": None, "why": str(e)})
            continue
        s = ans.best[family]
        rows.append({"instances": c, "setting": s, "answer": ans, "problem": pc, "lams": lams,
                     "why": "" if s is not None else "no setting meets the SLO"})
        if s is not None:
            if s.power_w > (1.0 - INSTANCES_AUTO_SAVING) * best:
                break
            best = s.power_w
    feasible = [r for r in rows if r["setting"] is not None]
    if not feasible:
        return rows, None
    least = min(r["setting"].power_w for r in feasible)
    return rows, min(r["instances"] for r in feasible if r["setting"].power_w <= (1 + INSTANCES_AUTO_SAVING) * least)


def calibrate_line(problem, target: str, rule, slo, lams) -> str | None:
    """The ``smdp-batch calibrate`` command that runs ``rule`` on the real ``target`` at real speed over the
    loads checked (one instance; Triton and Ray Serve only), as printed: measure what the server adds, then
    export again with ``--served``; after that, the same line checks the calibrated setting live.  Two repeats,
    each on a fresh deployment: one run cannot show how far the next one lands (a Ray Serve deployment measured
    40 % slower at p99 than the one before it, with the same setting)."""
    import shlex

    if target not in ("triton", "ray") or problem.instances != 1:
        return None
    bound = min(b for _, b in slo.bounds)
    lo, hi = lams[0] * 1e3, lams[-1] * 1e3
    rng = f"{lo:.6g}:{hi:.6g}" if hi > lo * 1.0001 else f"{lo:.6g}:{lo * 1.0001:.6g}"
    return (f"smdp-batch calibrate {scenario_args(problem, load=False)} --server {target} --setting "
            f"{shlex.quote(rule.spec)} --load-range {rng} --slo-p99-ms {bound:g} --repeats 2 -o served.json")


def _export_at_slo(path, problem, target, slo, load_range, rho_range, requests, seed, output, as_json,
                   arrival_map=None, auto: bool = False, idle_power: float | None = None, served=None) -> None:
    from ..analysis.slo import optimise
    from ..export.configs import rule_config

    family = SLO_FAMILY[target]
    counts: list[dict] = []
    if auto:
        counts, chosen = _choose_instances(problem, family, slo, load_range, requests, seed, idle_power)
        row = next((r for r in counts if r["instances"] == chosen), None)
        if row is None:  # (the range as given: one instance may not even carry it)
            where = _where([x / 1e3 for x in load_range] if load_range is not None else [problem.lam])
            groups: list[list] = []  # runs of counts refused for the same reason
            for r in counts:
                if groups and groups[-1][1] == r["why"]:
                    groups[-1][0].append(r["instances"])
                else:
                    groups.append([[r["instances"]], r["why"]])
            why = "; ".join(f"{c[0]}{'' if len(c) == 1 else f'..{c[-1]}'}: {w}" for c, w in groups)
            raise InputError(f"no {target} setting on 1..{counts[-1]['instances']} instances meets {slo.text()} at "
                             f"{where}: {why}")
        problem, lams, ans = row["problem"], row["lams"], row["answer"]
    else:
        problem, lams = loads_for(problem, load_range, rho_range)
        shape = None  # a phase table's bursty traffic, scaled to each load
        if arrival_map is not None:
            from .bursty import sample_map

            shape, _ = sample_map(arrival_map, requests, seed)
        ans = optimise(problem, slo, lams, families=(family,), requests=requests, seed=seed, arrivals=shape,
                       idle_power_w=float(idle_power or 0.0), idle_power_given=idle_power is not None, served=served)
    s = ans.best[family]
    where = _where(lams)
    if s is None:
        top = problem.replace(lam=lams[-1])
        why = (f"at the top load (ρ = {top.rho:.3g}) even the fastest setting's queue is too long" if top.rho > 0.85
               else "waiting less gives small batches and waiting more breaks the bound")
        raise InputError(f"no {target} setting meets {slo.text()} at {where}: {why}; relax the SLO or narrow the range")
    settings, text = rule_config(target, s.rule, problem.instances)
    if output:
        write_text_atomically(output, text)
    metrics = [m for m, _ in slo.bounds]
    lines = [f"smdp-batch — {target} settings meeting {slo.text()} at {where} (the scenario of {path}; "
             f"{ans.requests} simulated requests per load, seed {seed})", scenario_line(problem)]
    if arrival_map is not None:
        lines.append(f"  arrivals    {arrival_map.spec()} (the phase table's MAP), its rates scaled to each load")
    lines += ["", text.rstrip(), ""]
    for r in counts:
        st = r["setting"]
        what = (f"P̄ {st.power_w:.4g} ± {st.power_ci:.2g} W (mean over the loads), {st.rule.spec}" if st is not None
                else r["why"])
        lines.append(f"  instances {r['instances']:2d} {what}" + ("   ← chosen" if r["instances"] == problem.instances else ""))
    if counts:
        idle = (f"each idle instance draws {idle_power:g} W" if idle_power else
                "no idle power per instance: give --idle-power W")
        lines += [f"  chosen      {problem.instances} instance(s): the fewest within {100 * INSTANCES_AUTO_SAVING:g} % of "
                  f"the least power ({idle})", ""]
    for x in s.loads:
        vals = ", ".join(f"{'W̄' if m == 'mean' else m} {x.metrics[m]:.4g} ± {half_width(x.ci[m])} ms" for m in metrics)
        lines.append(f"  load        {x.lam * 1e3:9.5g} req/s: {vals}; P̄ {x.power_w:.4g} ± {x.power_ci:.2g} W, "
                     f"mean batch {x.mean_batch:.3g}")
    lines += plan_lines(ans, s)
    if output:
        lines.append(f"  written     {output}")
    check = None if arrival_map is not None else calibrate_line(problem, target, s.rule, slo, lams)
    if check:
        lines.append(("  check it    " if served is not None else "  calibrate   ") + check)
    auto_json = {"instances": {"chosen": problem.instances, "counts": [
        {"instances": r["instances"], "meets_slo": r["setting"] is not None, "why": r["why"],
         **({"mean_power_w": r["setting"].power_w, "mean_power_ci_w": r["setting"].power_ci,
             "rule": r["setting"].rule.spec} if r["setting"] is not None else {})} for r in counts]}} if counts else {}
    emit({"target": target, "settings": settings, "config": text, "rule": s.rule.spec, "policy_file": path, **auto_json,
          "slo_search": ans.as_dict(), **({"output": output} if output else {}), "calibrate": check,
          **({} if arrival_map is None else {"arrivals": arrival_map.spec()})}, as_json, "\n".join(lines))
