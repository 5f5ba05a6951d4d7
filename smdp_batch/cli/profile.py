"""The ``profile`` command: what a measured profile CSV holds and how well l(b), ζ(b) models fit it."""

from __future__ import annotations

import click

from ..model.profile import read_profile
from .options import emit, json_option, sizes_text
from .types import InputFile


@click.command("profile", short_help="Report what a profile CSV measured and how well l(b), ζ(b) fit it.")
@click.argument("path", type=InputFile())
@json_option
def profile_cmd(path, as_json):
    """Report what a profile CSV measured and how well l(b), ζ(b) models fit it.

    Columns: batch_size, latency_ms and optionally energy_mj or power_w; one row per measurement.
    Use it as --latency csv:FILE[:interp|affine|power], --energy csv:FILE[:fit], --service empirical:FILE.
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
        for fit in ("affine", "power"):
            r = rep[q][fit]
            form = "A·b + C" if fit == "affine" else "A·b^p"
            params = ", ".join(f"{x:.6g}" for x in r["params"])
            lines.append(
                f"  {q:8s} {fit:6s} {form:7s} = ({params}): R² = {r['r2']:.5f}, worst mean residual "
                f"{r['worst_residual']:+.4g} {unit} at b = {r['worst_at_batch_size']}"
            )
    emit(rep, as_json, "\n".join(lines))
