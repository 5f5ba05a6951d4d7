"""The ``measure`` command: time your own batch function at each batch size and write the profile CSV."""

from __future__ import annotations

import math
import shlex
from typing import Any

import click

from ..errors import InputError
from ..measure import (CALLERS, CALLS_MAX, CONCURRENCY_MAX, DEFAULT_SIZES, POWER_MAX_W, REPEATS_MAX, WARMUP_MAX,
                       check_settings, measure, module_sources)
from .options import DEFAULTS, NOTICES, emit, json_option, prepare_outputs, sizes_text
from .types import Grid, Number, OneOf, OutputPath, Power, Rate, Seconds, option


@click.command("measure", short_help="Measure l(b) (and ζ(b)) of your batch function; write a profile CSV.")
@click.argument("function", metavar="MODULE:FUNCTION")
@option("--make-batch", metavar="MODULE:FUNCTION", show_default="a list of b zeros",
        help="Builds the batch of size b that FUNCTION takes (called once per size, not timed).")
@option("--sizes", type=Grid(integer=True, min=1), show_default=",".join(map(str, DEFAULT_SIZES)),
        help="Batch sizes to measure (each at most 4096).")
@option("--warmup", type=Number(integer=True, min=0), default=3, show_default=True,
        help=f"Untimed calls per size before the timed ones (0..{WARMUP_MAX}).")
@option("--repeats", type=Number(integer=True, min=1), default=10, show_default=True,
        help=f"Timed calls per size (1..{REPEATS_MAX}; at most {CALLS_MAX} in all).")
@option("--budget-s", type=Seconds(min=0, min_open=True), show_default="none",
        help="Time budget in seconds for the calls (a call that hangs is stopped); importing MODULE gets as long "
             "again. When it runs out, what was measured is written.")
@option("--energy", "energy_source", type=OneOf(("auto", "nvml", "zeus", "none"), "energy source"), default="auto",
        show_default=True, help="Energy counter: NVML total energy, zeus, or none (auto: the first available).")
@option("--power-w", type=Power(min=0, min_open=True),
        help=f"A constant power in W (at most {POWER_MAX_W:g}) instead of a counter: ζ(b) = P·l(b) per call.")
@option("--device-index", type=Number(integer=True, min=0, max=65535), default=0, show_default=True,
        help="GPU whose energy counter is read.")
@option("-o", "--output", type=OutputPath(".csv"), required=True,
        help="Profile CSV to write (batch_size,latency_ms[,energy_mj]); the sidecar is OUTPUT.json.")
@option("--concurrency", type=Number(integer=True, min=1, max=CONCURRENCY_MAX), default=1, show_default=True,
        help="Also time each size with 2..K callers at once (instances on one device): prints the slowdown per "
             "size and the --contention spec for solve, simulate, compare and export.")
@option("--callers", type=OneOf(CALLERS, "callers"), default="threads", show_default=True,
        help="Where --concurrency's callers run: threads of one process (instances in one server process: Triton's "
             "ONNX Runtime, TensorRT, PyTorch backends) or processes that each import FUNCTION (Triton's Python "
             "backend, Ray Serve replicas, code that holds the GIL).")
@option("--quiet", is_flag=True, help="No progress bar (there is none when stderr is not a terminal).")
@option("--lam", type=Rate("ms", min=0, min_open=True), default=None,
        help="Your load in requests/ms, for the next-step command (instead of --rps); 800req/s works too.")
@option("--rps", type=Rate("s", min=0, min_open=True), default=None,
        help="Your load in requests/s, for the next-step command; 2k = 2000.")
@json_option
def measure_cmd(function, make_batch, sizes, warmup, repeats, budget_s, energy_source, power_w, device_index, output,
                concurrency, callers, quiet, lam, rps, as_json):
    """Time FUNCTION(make_batch(b)) at each batch size and write the profile CSV the solver reads.

    FUNCTION is your code named as module:function (imported from the current folder or sys.path,
    as uvicorn names apps), e.g. examples.onnx_mlp:infer; it runs in a child process, stopped when
    --budget-s runs out.  Each size gets --warmup untimed calls, then --repeats timed ones (wall time,
    CUDA synchronised when your code uses torch).  Energy comes from NVML or zeus when there is a GPU;
    otherwise the profile has latency only unless --power-w is given.  If a size fails (an exception,
    out of memory, a call that does not return in the budget), the sizes before it are written and a
    warning names the failure.  Then: smdp-batch profile OUTPUT; smdp-batch solve --latency csv:OUTPUT.
    """
    if lam is not None and rps is not None:
        raise InputError("give either --rps or --lam, not both")
    sizes = check_settings(sizes or DEFAULT_SIZES, warmup, repeats, budget_s, power_w, flags=True)[0]
    inputs = [(f"source of {spec} ({path})", path) for spec in (function, make_batch) for path in module_sources(spec)]
    # -o and its sidecar checked before measuring: neither may be the measured code, the sidecar (a name
    # derived from -o) never a symlink written through
    prepare_outputs([("-o", output), ("-o's sidecar", f"{output}.json", False)], inputs)
    m = measure(function, make_batch, sizes=sizes, warmup=warmup, repeats=repeats, budget_s=budget_s,
                energy=energy_source, power_w=power_w, device_index=device_index, progress=False if quiet else None,
                warn=False, concurrency=int(concurrency), callers=callers)
    if not m.batch.size:
        raise InputError(f"nothing was measured: {m.note or 'no sizes'}; {output} not written")
    path, sidecar = m.write(output, "-o")
    if m.failure:
        NOTICES.append(f"{m.note}; {path} holds b = {sizes_text(m.meta['measured_sizes'])}")
    summary = m.summary()
    data = {"path": path, "sidecar": sidecar, "rows": int(m.batch.size), "complete": m.complete, "note": m.note,
            "stopped_at": m.meta["stopped_at"], "failure": m.failure,
            "energy_source": m.meta["energy_source"], "device": m.meta["device"], "sizes": summary,
            "idle_power_w": m.meta.get("idle_power_w")}
    lines = [f"{path}: {m.batch.size} measurements of {len(summary)} batch sizes "
             f"({sizes_text([r['batch_size'] for r in summary])}) on {m.meta['device']}, energy: "
             f"{m.meta['energy_method']}"]
    noisy = []
    for r in summary:
        e = f", ζ = {r['mean_energy_mj']:.5g} mJ" if "mean_energy_mj" in r else ""
        cv = r["std_latency_ms"] / r["mean_latency_ms"] if r["mean_latency_ms"] > 0 else math.nan
        r["cv"] = cv
        flag = ""
        if cv > NOISY_CV and r["std_latency_ms"] > NOISY_SD_MS:
            noisy.append(r["batch_size"])
            flag = f"  ← noisy: CV > {100 * NOISY_CV:g} %"
        lines.append(f"  b = {r['batch_size']:4d}  l = {r['mean_latency_ms']:.5g} ms (sd {r['std_latency_ms']:.2g} ms, CV "
                     f"{100 * cv:.2g} %, {r['samples']} calls){e}{flag}")
    if noisy:
        NOTICES.append(f"the batch times of b = {sizes_text(noisy)} vary by more than {100 * NOISY_CV:g} % (CV): another "
                       f"job shared the machine, or the model warms up late; measure again (more --repeats or "
                       f"--warmup, a quiet machine) before planning with {path}")
    data["noisy_sizes"] = noisy
    idle = m.meta.get("idle_power_w")
    if idle is not None:
        lines.append(f"  idle        {idle:.4g} W with no call running (windows before the first size and after the "
                     "last; compare plans with it)")
    cont = m.meta.get("concurrency")
    if cont is not None:
        data["concurrency"] = cont
        lines += _contention_lines(cont)
    if m.note:
        lines.append(f"  incomplete  {m.note}")
    lines.append(f"  sidecar     {sidecar}")
    nxt = next_command(path, m.meta["measured_sizes"], bool(summary) and "mean_energy_mj" in summary[0], lam, rps)
    if cont is not None and cont["spec"]:
        nxt += f" --instances {len(cont['latency'])} --contention {cont['spec']}"
        nxt += _phases_to_fit(m, m.meta["measured_sizes"], len(cont["latency"]), cont["spec"], lam, rps)
    data["next"] = nxt
    lines.append(f"  next        smdp-batch profile {shlex.quote(path)}; {nxt}")
    if lam is None and rps is None:
        lines.append(f"              (it plans at ρ = {DEFAULT_RHO:g}; for your load give --rps R, your requests per second)")
    if not ("mean_energy_mj" in summary[0] if summary else False):
        lines.append("              (no energy was measured: add --power const:WATTS, your device's power while a batch "
                     "runs; without it ζ(b) is the paper's GPU's)")
    emit(data, as_json, "\n".join(lines))


def _phases_to_fit(m, sizes, instances: int, contention: str, lam: float | None, rps: float | None) -> str:
    """`` --phases M`` when the c-server model the next solve builds from this measurement would pass the default
    limits only with fewer phase-type phases per batch time (a measured spread is fitted with up to 8), else
    nothing: the printed command must run as printed.  Nothing either when no phase count fits (the solve then
    says what would).  Built from the rows in memory (the CSV is written when the command ends)."""
    from ..model.curves import Table
    from ..model.multi_server import phase_type, phases_that_fit
    from ..model.problem import BatchingProblem
    from ..solvers.multi_pi import n_start
    from .options import profile_spread

    prof = m.profile()
    spread = profile_spread(prof)
    law = "det" if spread is None or spread[2] is None else f"gamma:{spread[2]:g}"
    sizes = tuple(int(b) for b in sizes)
    curve = Table(sizes, tuple(float(x) for x in prof.means("latency")))
    rate = lam if lam is not None else rps / 1e3 if rps is not None else None
    kw: dict[str, Any] = dict(batch_sizes=sizes, latency=curve, service=law, instances=instances, contention=contention)
    problem = BatchingProblem(rate, **kw) if rate is not None else BatchingProblem.from_rho(DEFAULT_RHO, **kw)
    ph = phase_type(problem)
    if "(exact)" in ph.how:  # an exact phase-type law: --phases would not change it
        return ""
    fit = phases_that_fit(problem, n_start(problem), start=ph.phases)  # with room for the truncation to grow
    return f" --phases {fit}" if fit is not None and fit < ph.phases else ""


def _contention_lines(cont: dict) -> list[str]:
    """The slowdown with k callers at once, per size, and the spec it gives."""
    lines = [f"  beside      k callers at once ({cont.get('in', 'threads')}), each its own batch: S_k = time for all k "
             "/ time for one alone"
             + (", E_k = energy per batch / alone" if cont["energy"] else "")]
    by_size: dict[int, list[str]] = {}
    for r in cont["sizes"]:
        e = f", E = {r['energy_factor']:.3g}" if "energy_factor" in r else ""
        by_size.setdefault(r["batch_size"], []).append(f"k={r['callers']}: S = {r['latency_factor']:.3g}{e}")
    lines += [f"  b = {b:4d}  " + "; ".join(parts) for b, parts in by_size.items()]
    if cont["spec"]:
        lines.append(f"  contention  --contention {cont['spec']} (over all sizes, weighted by their times)")
    if cont.get("spec_by_size"):
        lines.append(f"              --contention {cont['spec_by_size']} (per size; between sizes interpolated)")
    if cont["note"]:
        lines.append(f"  contention  {cont['note']}")
    return lines


#: A size whose batch times vary more than this (coefficient of variation), by more than NOISY_SD_MS, is flagged:
#: a re-run is suggested.  Below 0.05 ms of spread (calls of a few µs, where the clock's own jitter is the CV) no
#: plan at a millisecond SLO can tell the difference.
NOISY_CV, NOISY_SD_MS = 0.25, 0.05
#: The load the next-step command plans at when the user gave none (the solve default).
DEFAULT_RHO = float(DEFAULTS["rho"])  # type: ignore[arg-type]  # a number in DEFAULTS


def next_command(path: str, sizes, has_energy: bool, lam: float | None, rps: float | None) -> str:
    """The solve command that plans with the profile just written: its l(b), its ζ(b) when measured, the measured
    batch sizes and the user's load (``--rho 0.5`` when not given, so that it runs as printed)."""
    q = shlex.quote(f"csv:{path}")
    load = f"--lam {lam:g}" if lam is not None else f"--rps {rps:g}" if rps is not None else f"--rho {DEFAULT_RHO:g}"
    return (f"smdp-batch solve --latency {q}" + (f" --energy {q}" if has_energy else "")
            + f" --batch-sizes {','.join(str(int(b)) for b in sizes)} {load}")
