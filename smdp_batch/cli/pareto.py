"""The ``pareto`` command: the latency–power trade-off over w2 (paper 004 §VII-B), baselines placed
against it, the least-power policy meeting an SLO, and its CSV, figure and text report."""

from __future__ import annotations

import contextlib
import math
import sys

import click
import numpy as np

from ..errors import InputError
from ..export.hdf5 import write_policy
from .options import (
    NOTICES_INFO, emit, json_option, load_grids, note_deprecated, prepare_outputs, problems_over, progress_line,
    refuse_swept, scenario_files,
    scenario_line, scenario_options, write_text_atomically,
)
from ..limits import SEED_MAX, REQUESTS_LIMIT, GRID_LIMIT, SLO_MAX_MS
from .slo import answer_lines, current_line, current_option, current_rule, load_range_options, loads_for
from .types import Duration, FigurePath, Grid, Number, OneOf, OutputPath, SloWithin, option

PLOT_KINDS = ("tradeoff", "percentiles", "scenarios")
_DEFAULT_REQUESTS = 200_000


def _deprecated(new: str):
    def callback(ctx, param, value):
        if value is not None:
            note_deprecated(param.opts[0], new)
        return value
    return callback


@click.command("pareto", short_help="Trace the latency–power trade-off over w2 and pick the least power meeting an SLO.")
@scenario_options
@load_grids("one front each")
@option("--w2-min", type=Number(), default="0.01", show_default=True,
              help="Smallest positive w2 of the log grid (w2 = 0 is always swept).")
@option("--w2-max", type=Number(), default="10", show_default=True,
              help="Largest w2 of the log grid (then doubled until the least-power policy).")
@option("--points", type=Number(integer=True, min=2, max=GRID_LIMIT), default="5", show_default=True,
        help="Points of the log grid the refinement starts from.")
@option("--ftol", type=Number(min=0, max=0.0999), default="0.001", show_default=True,
        help="Front tolerance: stop splitting where no policy can lie more than this share of the objective "
             "below the drawn front (0: every policy).")
@option("--rtol", type=Number(min=1e-4), default="0.02", show_default=True,
        help="Do not split w2 intervals narrower than this relative width (≥ 1e-4).")
@option("--extend", type=Number(integer=True, min=0, max=64), default="6", show_default=True,
              help="Doublings of w2 beyond --w2-max to reach the least-power end.")
@option("--baselines/--no-baselines", default=True, show_default=True, help="Greedy and static b (exact).")
@option("--timeouts/--no-timeouts", default=True, show_default=True,
              help="Triton, TF-Serving, Ray, TorchServe over their delay (simulated).")
@option("--statics", type=Grid(integer=True, keep_order=True), default=None, show_default="powers of 2 and Bmax",
              help="Static batch sizes to show, e.g. 8,16,32.")
@option("--requests", type=Number(integer=True, min=1000, max=REQUESTS_LIMIT), default=str(_DEFAULT_REQUESTS), show_default=True,
              help="Requests simulated per policy: every timeout setting, and every front point when percentiles are simulated.")
@option("--percentiles", is_flag=True, default=False,
              help="Simulate p50/p95/p99 of every front point (on anyway when an SLO, --within-ms or the percentiles figure needs them).")
@option("--simulate", "sim_requests", type=Number(integer=True, min=1000, max=REQUESTS_LIMIT, zero_ok=True), default=None, hidden=True,
              callback=_deprecated("--requests N --percentiles"))
@option("--baseline-requests", "base_requests", type=Number(integer=True, min=1000, max=REQUESTS_LIMIT), default=None, hidden=True,
              callback=_deprecated("--requests"))
@option("--within-ms", type=Duration(min=0, min_open=True, max=SLO_MAX_MS), default=None,
              help="Latency bound (ms) whose satisfaction share is simulated (Fig. 6(c)).")
@option("--seed", type=Number(integer=True, min=0, max=SEED_MAX), default="0", show_default=True,
              help="Random seed (the same arrivals for every policy).")
@option("--slo-mean-ms", type=Duration(min=0, min_open=True, max=SLO_MAX_MS), default=None,
              help="Choose the least power with mean latency ≤ X ms (exact).")
@option("--slo-p95-ms", type=Duration(min=0, min_open=True, max=SLO_MAX_MS), default=None,
              help="Choose the least power with simulated p95 ≤ X ms.")
@option("--slo-p99-ms", type=Duration(min=0, min_open=True, max=SLO_MAX_MS), default=None,
              help="Choose the least power with simulated p99 ≤ X ms.")
@option("--slo-within", type=SloWithin(), default=None,
              help="Choose the least power with ≥ PERCENT of requests within BOUND_MS.")
@load_range_options
@option("-o", "--output", type=OutputPath(".h5", ".hdf5"), default=None, help="Write the chosen policy's table to FILE.h5 (one front).")
@option("--csv", "csv_path", type=OutputPath(".csv"), default=None, help="Write every front and baseline point to FILE.csv.")
@option("--plot", "plot_path", type=FigurePath(), default=None, help="Draw the figure to FILE.png|.svg|.pdf.")
@option("--plot-kind", type=OneOf(PLOT_KINDS, "--plot-kind"), default="tradeoff", show_default=True,
              help="tradeoff (Figs. 5, 7–9) | percentiles (Fig. 6) | scenarios (adds panel (a) of Figs. 7–9).")
@option("--dask", "dask_address", default=None, metavar="ADDRESS",
              help="Run the sweep on Dask: 'local' (a LocalCluster) or a scheduler address.")
@option("--workers", type=Number(integer=True), default=None, show_default="CPU count", help="LocalCluster workers.")
@option("--progress/--no-progress", default=None, show_default="on a terminal", help="Progress counter on stderr.")
@current_option
@json_option
def pareto_cmd(rho_grid, lam_grid, w2_min, w2_max, points, ftol, rtol, extend, baselines, timeouts, statics, requests,
               percentiles, sim_requests, base_requests, within_ms, seed, slo_mean_ms, slo_p95_ms, slo_p99_ms, slo_within,
               output, csv_path, plot_path, plot_kind, dask_address, workers, progress, as_json, load_range, rho_range,
               current, **opts):
    """Latency–power trade-off over w2, baselines on it, and the least-power policy meeting an SLO."""
    from ..analysis.parallel import dask_mapper
    from ..analysis.pareto import baseline_points, dominated_by_front, latency_cdfs, sweep_fronts

    refuse_swept(opts, ("w2",), "pareto sweeps w2 (set its range with --w2-min/--w2-max)")
    prepare_outputs([("-o", output), ("--csv", csv_path), ("--plot", plot_path)], scenario_files(opts))
    problems, labels = problems_over(opts, rho_grid, lam_grid)
    slos = {k: v for k, v in (("mean", slo_mean_ms), ("p95", slo_p95_ms), ("p99", slo_p99_ms), ("within", slo_within))
            if v is not None}
    if len(slos) > 1:
        raise InputError("give at most one SLO: --slo-mean-ms, --slo-p95-ms, --slo-p99-ms or --slo-within")
    slo = next(iter(slos.items()), None)
    slo_value = None if slo is None else slo[1]
    within = within_ms
    if slo is not None and slo[0] == "within":
        within = slo_value[0]
    needed = (slo is not None and slo[0] != "mean") or within is not None or plot_kind == "percentiles"
    if sim_requests is not None:  # the deprecated --simulate N: N requests per front point, 0 = only when needed
        n_sim = sim_requests or (_DEFAULT_REQUESTS if needed else 0)
    else:
        n_sim = requests if (percentiles or needed) else 0
    n_base = requests if base_requests is None else base_requests
    if (load_range is not None or rho_range is not None) and (slo is None or slo[0] == "within" or len(problems) != 1):
        raise InputError("--load-range/--rho-range go with one scenario and an SLO on mean, p95 or p99 latency")
    if output and (slo is None or len(problems) != 1):
        raise InputError("-o writes the SLO's chosen policy: give one SLO and one scenario/load")
    sd = seed
    static_sizes = statics
    mine = [current_rule(current, p) for p in problems]  # checked before any work
    show = sys.stderr.isatty() if progress is None else progress
    tick, finish = progress_line(show, "solves and simulations")
    runner = dask_mapper(dask_address, workers) if dask_address else contextlib.nullcontext(None)
    with runner as mapper:
        fronts = sweep_fronts(problems, w2_min, w2_max, points, rtol, n_sim,
                              () if within is None else (within,), sd, labels=labels,
                              extend=extend, progress=tick, mapper=mapper, ftol=ftol)
        base, skipped = {}, {}
        if baselines or timeouts:
            for i, f in enumerate(fronts):
                base[i], skipped[i] = baseline_points(
                    f.problem, static_sizes if baselines else [], timeouts, n_base, sd,
                    simulate_tables=bool(n_sim), within_ms=() if within is None else (within,), mapper=mapper)
                if not baselines:  # greedy is the tables' reference: kept out of the report with them
                    base[i] = [b for b in base[i] if b.family != "greedy"]
                    skipped[i] = [(s_, r) for s_, r in skipped[i] if s_ != "greedy"]
                if tick:
                    tick(len(base[i]))
    cur_pts = [_current_point(f.problem, r, n_base, sd, within) for f, r in zip(fronts, mine)]
    chosen = None
    if slo is not None:
        kw = {"mean": "slo_mean_ms", "p95": "slo_p95_ms", "p99": "slo_p99_ms", "within": "slo_within"}[slo[0]]
        chosen = [f.choose(**{kw: slo_value}) for f in fronts]
    answers = []
    try:
        if slo is not None and slo[0] != "within":  # the SLO answer with a timer: the optimiser compare and export run
            from ..analysis.slo import optimise

            single = opts.get("lam") is not None or opts.get("rho") is not None
            for f in fronts:
                prob, lams = loads_for(f.problem, load_range, rho_range, single)
                answers.append(optimise(prob, {slo[0]: slo_value}, lams, requests=n_base, seed=sd, progress=tick,
                                        current=current_rule(current, prob)))
    finally:
        finish()
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
            # the test first: it resolves the front where a baseline falls in a gap left within ftol
            dominated = dominated_by_front(f, b.mean_latency_ms, b.mean_power_w, b.latency_ci, b.power_ci)
            F = f.power_at(b.mean_latency_ms)
            bl.append({**b.as_dict(), "front_power_w": F, "margin_w": b.mean_power_w - F, "dominated": dominated})
        cp, cur_d = cur_pts[i], None
        if isinstance(cp, str):
            cur_d = {"setting": current, "reason": cp}
        elif cp is not None:
            F = f.power_at(cp.mean_latency_ms)
            cur_d = {**cp.as_dict(), "front_power_w": F, "margin_w": cp.mean_power_w - F,
                     "dominated": dominated_by_front(f, cp.mean_latency_ms, cp.mean_power_w, cp.latency_ci, cp.power_ci)}
        d_fronts.append({**f.problem.describe(), "label": f.label, "points": [p.as_dict() for p in f.points],
                         "baselines": bl, "skipped": [{"setting": s_, "reason": r} for s_, r in skipped.get(i, [])],
                         **({"chosen": chosen[i].as_dict() if chosen[i] else None} if chosen else {}),
                         **({"slo_answer": answers[i].as_dict()} if answers else {}),
                         **({"current": cur_d} if current is not None else {})})
        for p in f.points:
            rows.append(_csv_row(f, "smdp", "smdp", f"w2 in [{p.w2_lo:.6g}, {p.w2_hi:.6g}]", p, p.w2_lo, p.w2_hi,
                                 p.control_limit, within))
        for b, extra in zip(base.get(i, []), bl):
            rows.append({**_csv_row(f, "baseline", b.family, b.setting, b, None, None, None, within),
                         "mean_latency_ci_ms": b.latency_ci, "mean_power_ci_w": b.power_ci,
                         "dominated": extra["dominated"], "margin_w": extra["margin_w"]})
        if cur_d is not None and "reason" not in cur_d:
            rows.append({**_csv_row(f, "current", cp.family, cp.setting, cp, None, None, None, within),
                         "mean_latency_ci_ms": cp.latency_ci, "mean_power_ci_w": cp.power_ci,
                         "dominated": cur_d["dominated"], "margin_w": cur_d["margin_w"]})
    if csv_path:
        _write_csv(csv_path, rows)
    if plot_path:
        if slo is not None and slo[0] in ("p95", "p99") and plot_kind != "percentiles":
            NOTICES_INFO.append(f"the {plot_kind} figure's latency axis is W̄: the {slo[0]} bound is drawn by "
                                "--plot-kind percentiles (the pick is starred on both)")
        _pareto_figure(fronts, base, plot_kind, plot_path, chosen, within, n_sim, sd, latency_cdfs, slo, slo_value,
                       cur_pts)
    data = {"fronts": d_fronts, "slo": None if slo is None else {"kind": slo[0], "value": slo_value},
            "dominance_test": "F(W_b + h_W) <= P_b + h_P (+1e-6 relative); see smdp_batch.pareto",
            **({"output": output} if output and chosen[0] is not None else {}), **({"csv": csv_path} if csv_path else {}),
            **({"plot": plot_path} if plot_path else {})}
    emit(data, as_json, _pareto_text(fronts, d_fronts, slo, slo_value, chosen, output, csv_path, plot_path, answers))


def _current_point(problem, rule, requests: int, seed: int, within):
    """``--current`` simulated at ``problem``'s load on the baselines' arrivals (a BaselinePoint), None when not
    given, or the reason (text) when it cannot carry the load."""
    if rule is None:
        return None
    from ..analysis.pareto import BaselinePoint
    from ..analysis.simulate import simulate

    try:
        r = simulate(problem, rule, requests=requests, seed=seed, within_ms=() if within is None else (within,))
    except InputError as e:
        return str(e)
    pct = {k: v for k, v in r.percentiles.items() if k in ("p50_ms", "p95_ms", "p99_ms")}
    return BaselinePoint(rule.spec.partition(":")[0].partition("+")[0], rule.spec, r.mean_latency_ms, r.mean_power_w,
                         r.throughput, False, r.mean_latency_ci, r.mean_power_ci, pct, dict(r.within))


def _csv_row(front, kind, family, setting, p, w2_lo, w2_hi, control_limit, within) -> dict:
    row = {"scenario": front.label or front.problem.describe().get("service", ""), "rho": front.problem.rho,
           "lam": front.problem.lam, "kind": kind, "family": family, "setting": setting,
           "w2_lo": w2_lo, "w2_hi": w2_hi, "mean_latency_ms": p.mean_latency_ms, "mean_power_w": p.mean_power_w,
           "efficiency_req_per_j": p.efficiency, "control_limit": control_limit,
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
    write_text_atomically(path, buf.getvalue())


def _slo_text(slo, slo_value) -> str | None:
    if slo is None:
        return None
    if slo[0] == "within":
        return f"≥ {100 * slo_value[1]:g} % within {slo_value[0]:g} ms"
    return f"{'W̄' if slo[0] == 'mean' else slo[0]} ≤ {slo_value:g} ms"


def _pareto_figure(fronts, base, kind, path, chosen, within, n_sim, seed, latency_cdfs, slo=None, slo_value=None,
                   current=()) -> None:
    from ..baselines import parse_policy
    from ..analysis.plots import plot_percentiles, plot_tradeoff, save

    text = _slo_text(slo, slo_value)
    cur = current[0] if len(fronts) == 1 and current and not isinstance(current[0], str) else None
    if kind in ("tradeoff", "scenarios"):
        fig = plot_tradeoff(fronts, base, model_panel=kind == "scenarios", chosen=chosen, slo=text,
                            slo_mean_ms=slo_value if slo is not None and slo[0] == "mean" else None,
                            current=None if cur is None else (cur.mean_latency_ms, cur.mean_power_w,
                                                              f"your setting {cur.setting}"))
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
        pct = slo[0] if slo is not None and slo[0] in ("p95", "p99") else "p95"
        fig = plot_percentiles(f, base.get(0, []), cdfs, within, percentile=f"{pct}_ms",
                               chosen=chosen[0] if chosen else None, slo=text,
                               slo_ms=slo_value if slo is not None and slo[0] in ("p95", "p99") else None,
                               current=cur, within_target=slo_value[1] if slo is not None and slo[0] == "within" else None)
    save(fig, path)


def _pareto_text(fronts, d_fronts, slo, slo_value, chosen, output, csv_path, plot_path, answers=()) -> str:
    from ..analysis.plots import finite_w2

    lines = ["smdp-batch — latency–power trade-off over w2 (paper 004 §VII-B)"]
    for i, (f, d) in enumerate(zip(fronts, d_fronts)):
        lines += ["", scenario_line(f.problem, w2="swept"), f"  {f.label}" if f.label else ""]
        lines.append(f"  {'w2 range':>21s}  {'W̄ ms':>9s}  {'P̄ W':>9s}  {'req/J':>7s}  {'Q':>4s}" +
                     ("  p95 ms  p99 ms" if f.points and f.points[0].percentiles else ""))
        for p in f.points:
            q = "-" if p.control_limit is None else str(p.control_limit)
            pct = (f"  {p.percentiles['p95_ms']:6.4g}  {p.percentiles['p99_ms']:6.4g}" if p.percentiles else "")
            lines.append(f"  [{finite_w2(p.w2_lo):>8s}, {finite_w2(p.w2_hi):>8s}]  {p.mean_latency_ms:9.6g}  "
                         f"{p.mean_power_w:9.6g}  {p.efficiency:7.4g}  {q:>4s}{pct}")
        bl = d["baselines"]
        if bl:
            bad = [b for b in bl if not b["dominated"]]
            lines.append(f"  baselines   {len(bl)} points; the front dominates {len(bl) - len(bad)} "
                         f"(F(W_b + h_W) ≤ P_b + h_P)")
            lines.append(f"    {'setting':34s} {'W̄ ms':>9s}  {'P̄ W':>9s}  {'front P̄ W':>9s}  {'margin W':>9s}")
            for b in bl:
                lines.append(f"    {b['setting']:34s} {b['mean_latency_ms']:9.4g}  {b['mean_power_w']:9.4g}  "
                             f"{b['front_power_w']:9.4g}  {b['margin_w']:+9.3g}{'' if b['dominated'] else '  NOT dominated'}")
        for s_ in d["skipped"]:
            lines.append(f"    {s_['setting']:34s} skipped: {s_['reason']}")
        c = d.get("current")
        if c is not None and "reason" in c:
            lines.append(f"  your setting {c['setting']}: skipped: {c['reason']}")
        elif c is not None:
            lines.append(f"  your setting {c['setting']}: W̄ {c['mean_latency_ms']:.4g} ms, P̄ {c['mean_power_w']:.4g} W"
                         + "".join(f", {q} {c[q + '_ms']:.4g} ms" for q in ("p95", "p99") if c.get(q + "_ms") is not None)
                         + f"; the front draws {c['front_power_w']:.4g} W at that W̄ ({c['margin_w']:+.3g} W)"
                         + ("" if c["dominated"] else ", NOT dominated"))
        if chosen:
            c = chosen[i]
            what = _slo_text(slo, slo_value)
            if c is None:
                lines.append(f"  SLO         {what}: no swept policy meets it")
            else:
                lines.append(f"  SLO         {what}: least power {c.mean_power_w:.5g} W at W̄ = {c.mean_latency_ms:.5g} ms, "
                             f"w2 ∈ [{finite_w2(c.w2_lo)}, {finite_w2(c.w2_hi)}] (one policy; edges exact or to the sweep's rtol)")
        if answers:
            a = answers[i]
            loads = (f"{a.lams[0] * 1e3:.5g} req/s" if len(a.lams) == 1 else
                     f"{len(a.lams)} loads {a.lams[0] * 1e3:.5g}..{a.lams[-1] * 1e3:.5g} req/s")
            lines.append(f"  SLO answer  with a timer on the oldest request (as compare; {loads}, {a.requests} requests "
                         "per load):")
            lines += answer_lines(a, idle_hint="compare and export take --idle-power W")
            if a.current is not None:
                lines.append(current_line(a))  # type: ignore[arg-type]  # a str when a.current is set
    if output and chosen[0] is None:
        lines.append(f"  not written {output}: no swept policy meets the SLO")
        output = None
    for label, path in (("written", output), ("csv", csv_path), ("figure", plot_path)):
        if path:
            lines.append(f"  {label:11s} {path}")
    return "\n".join(x for x in lines if x != "")
