"""The ``export`` command: a policy table as a serving system's batching settings (Triton,
TF-Serving, Ray Serve, TorchServe), with what the settings cannot express and its simulated cost."""

from __future__ import annotations

import click

from ..export.configs import TARGETS
from ..runtime.schema import read_policy
from ..limits import REQUESTS_LIMIT, SEED_MAX
from .options import (
    build_problem, emit, file_inputs, json_option, prepare_outputs, scenario_line, write_text_atomically,
)
from .types import InputFile, Number, OneOf, OutputPath, option


@click.command("export", short_help="Export a policy table as a serving system's batching settings.")
@click.argument("path", type=InputFile())
@option("--to", "target", type=OneOf(TARGETS, "export target"), required=True, help="The serving system.")
@option("--requests", type=Number(integer=True, min=1000, max=REQUESTS_LIMIT), default="200000", show_default=True,
              help="Requests simulated per candidate setting.")
@option("--seed", type=Number(integer=True, min=0, max=SEED_MAX), default="0", show_default=True,
              help="Random seed (the same arrivals for table and export).")
@option("-o", "--output", type=OutputPath(), default=None, help="Write the config text to this file.")
@json_option
def export_cmd(path, target, requests, seed, output, as_json):
    """Export a policy table as a server's batching settings, with what they cannot express and its cost."""
    from ..export.configs import export_policy
    prepare_outputs([("-o", output)], [("FILE (the policy table)", path)])
    pf = read_policy(path)
    # the scenario comes from the values stored in the file: no path recorded in it is read
    problem = build_problem({}, file_inputs(pf, how="export cannot rebuild it (evaluate or simulate the file with --service LAW)"))
    ex = export_policy(problem, pf.policy[:-1], target, requests=requests, seed=seed)
    if output:
        write_text_atomically(output, ex.text)
    g = ex.gap
    lines = [f"smdp-batch — {target} settings for {path}", scenario_line(problem), "", ex.text.rstrip(), ""]
    lines += [f"  fidelity    {x}" for x in ex.limitations]
    lines.append(
        f"  simulated gap ({g['requests']} requests, same arrivals): table W̄ {g['table']['mean_latency_ms']:.4g} ms, "
        f"P̄ {g['table']['mean_power_w']:.4g} W; export W̄ {g['export']['mean_latency_ms']:.4g} ms, "
        f"P̄ {g['export']['mean_power_w']:.4g} W; objective +{g['objective_increase_pct']:.3g} %"
    )
    if output:
        lines.append(f"  written     {output}")
    emit({**ex.as_dict(), "policy_file": path, **({"output": output} if output else {})}, as_json, "\n".join(lines))
