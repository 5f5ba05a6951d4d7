"""The ``fit-arrivals`` command: a 1–4 phase MMPP fitted to an arrival trace, its report, and the JSON file that
``--arrivals map:FIT.json`` reads (:mod:`smdp_batch.model.fit`)."""

from __future__ import annotations

import sys

import click

from ..extras import require
from .options import emit, json_option, prepare_outputs, progress_line, time_unit_option, write_text_atomically
from .types import Duration, InputFile, Number, OneOf, OutputPath, option

PHASE_CHOICES = ("1", "2", "3", "4", "auto")


@click.command("fit-arrivals", short_help="Fit a 1–4 phase MMPP to an arrival trace (for --arrivals map:FIT.json).")
@click.argument("trace", type=InputFile())
@option("--phases", type=OneOf(PHASE_CHOICES, "number of phases"), default="2", show_default=True,
        help="Phases of the MMPP, or auto: the least BIC of 1..4.")
@option("--window-ms", type=Duration(min=0, min_open=True), default=None, show_default="~10 arrivals per window",
        help="Count window of the HMM start (ms); the exact refinement does not use it.")
@option("--seed", type=Number(integer=True, min=0, max=2**32 - 5), default="0", show_default=True,
        help="Seed of the HMM's random restarts (fits are reproducible).")
@option("-o", "--output", type=OutputPath(".json"), default=None,
        help="Write the fit to FIT.json ({rates, generator, fit}); use it as --arrivals map:FIT.json.")
@time_unit_option
@json_option
def fit_arrivals_cmd(trace, phases, window_ms, seed, output, time_unit, as_json):
    """Fit a Markov-modulated Poisson process to the arrival times of TRACE.

    TRACE is a CSV of arrival times (one column, or a column named arrival_ms, arrival_s, arrival_us or
    arrival_ns), sorted, at least 200 arrivals; unnamed times are ms unless --time-unit says otherwise.  The fit starts from a Poisson HMM on counts per window and maximises the exact
    likelihood of the inter-arrival times; the report compares the trace's mean rate and index of
    dispersion of counts (IDC) with the model's.  Tied or quantised timestamps (whole ms, 10 ms, 1 us)
    are spread uniformly within their quantum first (seeded; a note says so), and the model's mean rate
    is held within 2 % of the trace's.
    """
    from ..analysis.simulate import read_trace
    from ..model.fit import fit_mmpp

    if phases != "1":  # the HMM start of a 2–4 phase fit; a Poisson fit is closed-form
        require("hmmlearn", "fit-arrivals")
    prepare_outputs([("-o", output)], [("TRACE", trace)])
    times = read_trace(trace, time_unit)
    tick, finish = progress_line(sys.stderr.isatty(), "phase counts fitted", 4 if phases == "auto" else 1)
    try:
        fit = fit_mmpp(times, phases if phases == "auto" else int(phases), window_ms, seed, progress=tick)
    finally:
        finish()
    if output:
        write_text_atomically(output, fit.to_json() + "\n")
    use = f"--arrivals map:{output}" if output else None
    d = {"trace": trace, **fit.to_dict(), "output": output, "use": use}
    emit(d, as_json, _text(trace, fit, output, use))


def _text(trace, fit, output, use) -> str:
    Q, pi, soj = fit.generator, fit.map.stationary, fit.sojourn_ms
    how = "least BIC of 1..4" if fit.selection.startswith("auto") else "as asked"
    if fit.phases == 1:
        est = "Poisson at the MLE rate" if fit.estimate.startswith("closed") else "Poisson at the trace's mean rate"
    elif fit.estimate.startswith("refined at"):
        est = f"exact-likelihood optimum at the trace's mean rate, from the {fit.optimizer['start']} start"
    elif fit.estimate == "refined":
        est = f"exact-likelihood optimum from the {fit.optimizer['start']} start"
    else:
        est = f"the {fit.estimate} start (the exact refinement did not improve it)"
    lines = [f"smdp-batch — MMPP fit of {trace} ({fit.arrivals} arrivals over {fit.span_ms:.6g} ms, {fit.seconds:.2f} s)",
             f"  model       {fit.phases} phase{'s' if fit.phases > 1 else ''} ({how}); {est}"]
    for i in range(fit.phases):
        jumps = ", ".join(f"→{j + 1} {Q[i, j]:.4g}" for j in range(fit.phases) if j != i and fit.phases > 2)
        leave = (f", mean sojourn {soj[i]:.5g} ms (leaves at {-Q[i, i]:.4g} /ms{'; ' + jumps if jumps else ''})"
                 if fit.phases > 1 else "")
        lines.append(f"  phase {i + 1:<5d} λ = {fit.rates[i]:.6g} /ms{leave}, time share {100 * pi[i]:.3g} %")
    rel = 100 * (fit.model_rate / fit.trace_rate - 1)
    lines.append(f"  mean rate   trace {fit.trace_rate:.6g} /ms, model {fit.model_rate:.6g} /ms ({rel:+.2g} %)")
    lines.append("  IDC         window (ms)      trace      model      (Var N / E N over a window; 1 = Poisson)")
    for r in fit.idc:
        lines.append(f"              {r['window_ms']:<12.5g} {r['trace']:>9.4g}  {r['model']:>9.4g}")
    (first, count), pieces = fit.blocks[0], len(fit.blocks)
    where = (f"arrivals {first}..{first + count - 1}" if pieces == 1 else
             f"{pieces} blocks of {count} arrivals, {pieces * count} of {fit.arrivals}")
    lines.append(f"  likelihood  log L = {fit.loglik:.8g} (exact, {where}), k = {fit.n_params} parameter{'s' if fit.n_params > 1 else ''}, "
                 f"BIC = {fit.bic:.8g}, AIC = {fit.aic:.8g}")
    if len(fit.candidates) > 1:
        lines.append("  candidates  " + "; ".join(
            f"m={c['phases']}: log L {c['loglik']:.7g}, BIC {c['bic']:.7g}{' ←' if c['phases'] == fit.phases else ''}"
            for c in fit.candidates))
    opt = fit.optimizer
    if opt:
        lines.append(f"  optimizer   {opt['evaluations']} likelihood evaluations, "
                     f"{'converged' if opt['converged'] else opt['message']}")
    if fit.phases > 1:
        lines.append(f"  start       Poisson HMM on counts in {fit.window_ms:.5g} ms windows, seed {fit.seed}")
    lines += [f"  note        {n}" for n in fit.notes]
    lines.append(f"  written     {output}; use it: {use}" if output else
                 "  use it      -o FIT.json writes the fit; then --arrivals map:FIT.json")
    return "\n".join(lines)
