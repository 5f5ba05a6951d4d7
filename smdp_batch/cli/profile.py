"""The ``profile`` command: what a measured profile CSV holds and how well l(b), ζ(b) models fit it."""

from __future__ import annotations

import click

from ..model.profile import FITS, measured_idle_power, read_profile
from .options import emit, json_option, sizes_text
from .types import InputFile


@click.command("profile", short_help="Report what a profile CSV measured and how well l(b), ζ(b) fit it.")
@click.argument("path", type=InputFile())
@json_option
def profile_cmd(path, as_json):
    """Report what a profile CSV measured and how well l(b), ζ(b) models fit it.

    Columns: batch_size, latency_ms and optionally energy_mj or power_w; one row per measurement.
    Use it as --latency csv:FILE[:monotone|interp|affine|power], --energy csv:FILE[:fit], --service empirical:FILE.
    It names every batch size whose mean latency or energy is below the previous size's, by how much
    and how many standard errors, and which fit csv:FILE uses (l(b): monotone; ζ(b): interp).
    """
    prof = read_profile(path)
    rep = prof.report()
    sizes = rep["batch_sizes"]
    lines = [
        f"{path}: {rep['rows']} measurements of {len(sizes)} batch sizes ({sizes_text(sizes)}), "
        f"{min(rep['samples_per_size'])}–{max(rep['samples_per_size'])} per size"
    ]
    for q, unit in (("latency", "ms"), ("energy", "mJ")):
        if q not in rep:
            lines.append(f"  {q:8s} not measured (add energy_mj or power_w)")
            continue
        for d in rep[q]["non_monotone"]:
            se = d["standard_errors"]
            spread = f"{se:.2g} standard errors of the difference" if se is not None else "one measurement each"
            lines.append(
                f"  {q:8s} mean decreases from b = {d['from_batch_size']} to b = {d['to_batch_size']} by "
                f"{d['drop']:.4g} {unit} ({100 * d['relative_drop']:.2g} %, {spread})"
            )
        for fit in (f for f in FITS if f in rep[q]):
            r = rep[q][fit]
            form = {"monotone": "isotonic+PCHIP", "interp": "PCHIP", "affine": "A·b + C", "power": "A·b^p"}[fit]
            params = f" = ({', '.join(f'{x:.6g}' for x in r['params'])})" if r["params"] else ""
            lines.append(
                f"  {q:8s} {fit:8s} {form}{params}: R² = {r['r2']:.5f}, worst mean residual "
                f"{r['worst_residual']:+.4g} {unit} at b = {r['worst_at_batch_size']}"
            )
        default = rep[q]["default_fit"]
        why = ("means non-decreasing: it interpolates them exactly" if not rep[q]["non_monotone"] else
               "pools the decreasing means into their weighted average")
        if q == "energy":
            why = "PCHIP through the means; ζ(b) need not be monotone"
        lines.append(f"  {q:8s} csv:{path} uses the {default} fit ({why})")
    idle = measured_idle_power(path)
    rep["idle_power_w"] = idle
    lines.append(f"  idle     {idle:.4g} W with no call running (measured: {path}.json); compare plans with it"
                 if idle is not None else "  idle     not measured (measure reads it with an energy counter; else "
                                          "give --idle-power W to compare and export)")
    emit(rep, as_json, "\n".join(lines))
