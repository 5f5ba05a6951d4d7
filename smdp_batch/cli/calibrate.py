"""``smdp-batch calibrate``: run a setting on the real server at real speed and measure what the server adds."""

from __future__ import annotations

import json
import math
import shlex
import sys

import click

from ..errors import InputError
from ..limits import SLO_MAX_MS
from .options import build_problem, emit, json_option, prepare_outputs, scenario_args, scenario_options, \
    write_text_atomically
from .types import Duration, InputFile, Number, OneOf, OutputPath, Range, Seconds, option

__all__ = ["calibrate_cmd"]


@click.command("calibrate", short_help="Run a setting on the real server (Triton, Ray Serve) at real speed and "
                                       "measure what the server adds to the model: the served-delay file.")
@scenario_options
@option("--server", type=OneOf(("triton", "ray", "http"), "server"), required=True,
        help="triton or ray: start that server on 127.0.0.1 with the setting (Triton's dynamic batcher and Python "
             "backend; Ray Serve's @serve.batch through a handle) and the model below. http: your own deployed "
             "endpoint (--url), which batches as --setting says.")
@option("--setting", metavar="SPEC", required=True,
        help="The server's batching setting, as export prints it: triton:max=B,delay_us=D[,preferred=Q/…] or "
             "ray:max=B,timeout_s=T; with --server http, any rule simulate --policy takes.")
@option("--url", default=None, metavar="URL",
        help="With --server http: the endpoint to POST to, e.g. http://127.0.0.1:8000/v2/models/m/infer.")
@option("--body", "body_file", type=InputFile(), default=None, show_default="{}",
        help="With --server http: the JSON request body to POST (one request).")
@option("--load-range", type=Range(per="s"), required=True,
        help="The loads to run, req/s: its low end, its geometric middle and its high end (e.g. 150:450).")
@option("--slo-p99-ms", "slo_p99_ms", type=Duration(min=0, min_open=True, max=SLO_MAX_MS), required=True,
        help="The p99 bound the plans will meet: a load where the fastest response alone (the smallest batch at once, "
             "plus what the server adds) reaches it is not carried.")
@option("--model", "onnx", type=InputFile(), default=None, show_default="a stand-in sleeping l(b)",
        help="An ONNX model (input [N, D] float32) each batch runs on the CPU instead of the stand-in, which sleeps "
             "l(b) as a GPU would run it without taking the CPU.")
@option("--requests", type=Number(integer=True, min=200, max=200_000), default="2000", show_default=True,
        help="Poisson requests sent per load and run.")
@option("--repeats", type=Number(integer=True, min=1, max=10), default="1", show_default=True,
        help="Runs per load, the loads taken in turn, each round on a fresh deployment of the server: with 2 or more "
             "the plan's interval holds how far a run's p99 moves between runs and deployments on this host, not "
             "only within one run.")
@option("--max-seconds", type=Seconds(min=1, max=3600), default="120", show_default=True,
        help="No request is sent later than this after a load's start.")
@option("--seed", type=Number(integer=True, min=0, max=2**32 - 1), default="0", show_default=True,
        help="Seed of the arrival streams.")
@option("-o", "--output", type=OutputPath(".json"), required=True, help="The served-delay file (JSON) to write.")
@json_option
def calibrate_cmd(server, setting, url, body_file, load_range, slo_p99_ms, onnx, requests, repeats, seed, max_seconds,
                  output, as_json, **opts):
    """Run SETTING on the real SERVER at real speed (time scale 1) at three loads, and write what the server
    adds beyond the model: its time per batch (a + c·b), the return of each position in a batch, the outside
    delay at each load, the loads its own path carries and, where an energy counter is present, the idle power.
    compare and export take the file with --served."""
    from ..baselines.servers import parse_rule
    from ..integrations.calibrate import calibrate

    prepare_outputs([("-o", output)], [(flag, v) for flag, v in (("--model", onnx), ("--body", body_file)) if v])
    if server == "http":
        if url is None:
            raise InputError("--server http needs --url, the endpoint to POST to (http://HOST:PORT/PATH)")
        if onnx:
            raise InputError("--model runs in the server calibrate starts (triton, ray); your endpoint runs its own")
    elif url is not None or body_file is not None:
        raise InputError(f"--url and --body go with --server http; --server {server} starts its own server")
    body = b"{}"
    if body_file is not None:
        body = _body(body_file)
    if all(opts.get(k) is None for k in ("lam", "rps", "rho")):  # the loads are the range's: plan at its top
        opts["lam"] = float(load_range[1]) / 1000.0
    problem = build_problem(opts)
    rule = parse_rule(setting, problem)
    rule.check(problem.batch_sizes)
    lo, hi = float(load_range[0]), float(load_range[1])
    loads = sorted({lo, math.sqrt(lo * hi), hi})
    for x in loads:
        if not x / 1000.0 < problem.max_lam * problem.instances:
            raise InputError(f"--load-range reaches {x:g} req/s, beyond what the largest batch can serve "
                             f"({problem.max_lam * problem.instances * 1e3:.4g} req/s)")
    say = (lambda m: click.echo(f"smdp-batch: {m}", err=True)) if sys.stderr.isatty() else None
    sd = calibrate(problem, rule, loads, server=server, onnx_path=onnx or "", requests=requests, seed=seed,
                   slo_ms=slo_p99_ms, max_seconds=max_seconds, url=url or "", body=body, progress=say,
                   repeats=int(repeats))
    d = sd.as_dict()
    write_text_atomically(output, json.dumps(d, indent=1))
    src = sd.source
    runs = f"{requests} Poisson requests per load" + (f" and run, {repeats} runs per load" if repeats > 1 else "")
    lines = [f"smdp-batch — {server} with {rule.spec} at real speed ({src['model']}; {runs}, seed {seed}, "
             f"{src['seconds']:.0f} s)",
             f"  {'load [req/s]':>12s}  {'p99 ± 95 % [ms]':>15s}  {'batcher p99 measured / model [ms]':>34s}  "
             f"{'outside p50 / p99 [ms]':>22s}  {'client lag p99 [ms]':>19s}  carried"]
    for st in sd.stats:
        batcher = (f"{st['batcher_p99_ms']:16.4g} / {st['batcher_model_p99_ms']:<15.4g}"
                   if math.isfinite(st["model_p99_ms"]) else f"{'— (no batches reported)':>32s}")
        hw = st.get("new_run_halfwidth_ms", st.get("p99_halfwidth_ms", math.nan))
        lines.append(f"  {st['load_per_s']:12.4g}  {st['p99_ms']:7.4g} ± {hw:<5.2g}  {batcher}  {st['outside_p50_ms']:9.3g} / "
                     f"{st['outside_p99_ms']:<10.3g}  {st['client_lag_p99_ms']:19.3g}  "
                     + ("yes" if st["carried"] else "NO: " + st["why"]))
    deployments = src.get("deployments", 1)
    lines.append("  ± 95 %      how far another run's p99 may land" + (
        ": the spread between this calibration's runs at the load"
        + (f", on {deployments} deployments" if deployments > 1 else "") if repeats > 1 else
        ", from this run's own requests (--repeats 2 measures it between runs)"))
    lines.append(f"  model       {sd.summary()}")
    if sd.served_latency_ms:
        lines.append("  l(b) served " + ", ".join(f"{b}: {v:.3g}" for b, v in list(sd.served_latency_ms.items())[:8])
                     + (" …" if len(sd.served_latency_ms) > 8 else "") + " ms (plans use these)")
    else:
        lines.append("  l(b) served not reported by the server: plans keep the profile's l(b), and the outside delay "
                     "is what the replay of the same sends does not explain")
    idle = f"{sd.idle_power_w:.4g} W" if sd.idle_power_w is not None else "not read (no energy counter here)"
    lines.append(f"  idle power  {idle}")
    lines.append(f"  written     {output}")
    top = sd.carried_per_s or 0.0
    if top >= loads[0]:
        # the carried loads: a range up to the top one, or that one load alone (a range past it would be refused)
        rng = f"--load-range {loads[0]:g}:{top:g}" if top > loads[0] else f"--rps {top:g}"
        scenario = scenario_args(problem, load=False, weights=False)  # compare searches the weights
        lines.append(f"  next        smdp-batch compare {scenario} --slo-p99-ms {slo_p99_ms:g} {rng} "
                     f"--served {shlex.quote(output)}")
    else:
        lines.append(f"  next        the server's own path did not carry the lowest load, {loads[0]:g} req/s, on this "
                     "host (the plans rest on the carried loads from the lowest up); calibrate at lower loads")
    emit(d, as_json, "\n".join(lines))


def _body(path: str) -> bytes:
    """The request body: a JSON file of at most 1 MiB, checked to parse."""
    import os

    if os.path.getsize(path) > 1 << 20:
        raise InputError(f"--body {path} is over 1 MiB; one request's body is expected")
    with open(path, "rb") as f:
        data = f.read()
    try:
        json.loads(data.decode("utf-8"))
    except (UnicodeDecodeError, ValueError) as e:
        raise InputError(f"--body {path} is not JSON: {e}") from None
    return data
