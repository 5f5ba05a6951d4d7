"""Options and helpers shared by the commands: the scenario options and ``build_problem``,
``--json`` and the text/JSON emitter, deprecated old spellings, and small text formatters.

Imports only :mod:`.types` from this package; the command modules import from here.
"""

from __future__ import annotations

import functools
import json
import math
import re
import time
from typing import Any

import click
import numpy as np

from ..errors import InputError
from ..model.presets import PRESETS, preset
from ..model.curves import Table
from ..model.spec import parse_curve
from ..model.problem import BatchingProblem, batch_size_set
from ..limits import BMAX_LIMIT
from .types import Grid, Number, OneOf, Rate, option

ARGV: list[str] = []  # this invocation's arguments (recorded in generated READMEs)
NOTICES: list[str] = []  # warning lines of this invocation (deprecations, planning caveats; printed by main)
NOTICES_INFO: list[str] = []  # information lines of this invocation (printed by main, "smdp-batch: note: …")

DEFAULTS = {
    "rho": 0.5, "bmin": 1, "bmax": 32, "latency": None,  # None: the law's own l(b), else the paper's
    "energy": "affine:19.899,19.603", "service": "det", "w1": 1.0, "w2": 1.0,
}

UNITS = {"time": "ms", "energy": "mJ", "power": "W", "lam": "1/ms", "throughput": "1/ms"}

json_option = option("--json", "as_json", is_flag=True, help="Print machine-readable JSON (keys: docs/json.md).")

time_unit_option = option(
    "--time-unit", type=OneOf(("s", "ms", "us", "µs", "ns"), "time unit"), default=None, show_default="ms",
    help="Unit of the trace's arrival times (a header arrival_s, arrival_ms, arrival_us or arrival_ns names it too). "
         "Without it, a trace read as ms whose median gap is below 1 µs (seconds?) or above 100 s (µs?) is refused.")


def scenario_args(problem: BatchingProblem, lam: float | None = None, *, load: bool = True,
                  weights: bool = True) -> str:
    """The scenario options that rebuild ``problem`` (at ``lam`` requests/ms) on a command line, shell-quoted:
    what a printed next step needs so that it runs as printed.  ``load`` False: without ``--lam`` (the command
    takes its loads from a range); ``weights`` False: without ``--w1`` (the command searches the weights)."""
    import shlex

    d = problem.describe()
    sizes = [int(b) for b in problem.batch_sizes]
    args = ["--lam", f"{problem.lam if lam is None else lam:.10g}"] if load else []
    args += (["--bmin", str(sizes[0]), "--bmax", str(sizes[-1])] if sizes == list(range(sizes[0], sizes[-1] + 1))
             else ["--batch-sizes", ",".join(map(str, sizes))])
    args += ["--latency", d["latency"], "--energy", d["energy"], "--service", d["service"]]
    args += ["--w1", f"{problem.w1:.10g}"] if weights else []
    return " ".join(shlex.quote(str(a)) for a in args)


def note_energy(problem: BatchingProblem, opts: dict) -> None:
    """When --energy or --power was given: one note saying how ζ(b) reads (mJ per batch, W while a batch runs)."""
    from ..model.units import energy_text

    if opts.get("energy") is not None or opts.get("power") is not None:
        bare = opts.get("energy") is not None and not re.search(r"\d\s*(?![eE][+-]?\d)[A-Za-zµμ]", str(opts["energy"]))
        NOTICES_INFO.append(energy_text(problem.energy, problem.latency, problem.batch_sizes, hint=bare))


def scenario_options(f):
    """Options describing the batching problem (shared by solve, evaluate, simulate, compare, pareto, tables).

    Their defaults are shown in --help but are not click defaults: an option left out takes its value
    from --preset or a policy file first, then from :data:`DEFAULTS`.
    """
    opts = [
        option("--lam", type=Rate("ms"), help="Arrival rate λ in requests/ms (exclusive with --rho); a unit may follow "
                                              "the number: 800req/s, 1.5k/s, 0.8/ms."),
        option("--rps", type=Rate("s", min=0, min_open=True),
               help="Arrival rate in requests/s, = 1000·λ (instead of --lam or --rho); 2k = 2000."),
        option("--rho", type=Number(), show_default="0.5", help="Load ρ = λ·l(Bmax)/Bmax in (0, 1)."),
        option("--bmin", type=Number(integer=True, min=1, max=BMAX_LIMIT), show_default="1", help="Smallest batch size."),
        option("--bmax", type=Number(integer=True, min=1, max=BMAX_LIMIT), show_default="32", help="Largest batch size."),
        option("--batch-sizes", metavar="B,B,…", help="Explicit allowed batch sizes, e.g. 1,2,4,8,16,32."),
        option("--preset", metavar="NAME", help=f"A paper 004 scenario: {', '.join(PRESETS)} (other options override it)."),
        option("--latency", metavar="SPEC", show_default="the law's own l(b), else the paper's GoogLeNet/P4",
                     help="l(b): affine:A,C | const:C | log:A,C | table:1=V,… | csv:FILE[:monotone|interp|affine|power]; "
                          "numbers in ms, or with a unit: 1.2ms, 800us, 0.0012s."),
        option("--energy", metavar="SPEC", show_default=DEFAULTS["energy"],
                     help="ζ(b), energy per batch: affine:A,C | const:C | log:A,C | table:… | csv:FILE[:fit] (energy_mj "
                          "or power_w); numbers in mJ, or with a unit: 60mJ, 0.06J, 60000uJ."),
        option("--power", metavar="SPEC",
                     help="Instead of --energy: power P(b) while a batch runs, ζ(b) = P(b)·l(b): const:P | affine:A,C | "
                          "log:A,C | table:… | csv:FILE[:fit] (power_w); numbers in W, or 60W, 0.06kW, 500mW."),
        option("--service", metavar="LAW", show_default="det; with --latency csv:PROFILE, gamma of its measured CV",
                     help="Batch-time law: det | exp | erlang:K | gamma:A | hyperexp:P/C,… | uniform:A,B | shiftexp:F | "
                          "lognormal:S | mix:W*LAW@C;… | max:LAW[@MEAN] | empirical:FILE."),
        option("--w1", type=Number(), show_default="1", help="Weight of mean latency (per ms)."),
        option("--w2", type=Number(), show_default="1", help="Weight of mean power (per W)."),
    ]
    f = _rps_as_lam(f)
    for o in reversed(opts):
        f = o(f)
    return f


def _rps_as_lam(f):
    """The command sees ``--rps R`` as ``lam = R/1000`` (requests/ms); given with --lam or --rho it is refused."""

    @functools.wraps(f)
    def wrapper(**kwargs):
        rps = kwargs.pop("rps", None)
        if rps is not None:
            for other in ("lam", "rho"):
                if kwargs.get(other) is not None:
                    raise InputError(f"give either --rps or --{other}, not both")
            kwargs["lam"] = rps / 1e3
        return f(**kwargs)

    return wrapper


SCENARIO_KEYS = ("lam", "rho", "bmin", "bmax", "batch_sizes", "latency", "energy", "service", "w1", "w2")


def build_problem(opts: dict, base: dict | None = None) -> BatchingProblem:
    """BatchingProblem from CLI options; ``base`` supplies values not given (a policy file's inputs)."""
    v: dict[str, Any] = dict(DEFAULTS)
    if base:
        v.update(base)
    if opts.get("preset") is not None:
        v.update(preset(opts["preset"]))
    given = {k: opts.get(k) for k in SCENARIO_KEYS}
    if given["lam"] is not None and given["rho"] is not None:
        raise InputError("give either --lam or --rho, not both")
    if given["lam"] is not None or given["rho"] is not None:
        v.pop("lam", None)
        v.pop("rho", None)
    v.update({k: x for k, x in given.items() if x is not None})
    if (given["bmin"] is not None or given["bmax"] is not None) and given["batch_sizes"] is None:
        v.pop("batch_sizes", None)  # --bmin/--bmax override a stored batch-size set
    if v.get("batch_sizes") is not None:
        sizes = batch_size_set(sizes=v["batch_sizes"])
        _check_size_bounds(given, sizes)
    else:
        integer = Number(integer=True)
        sizes = batch_size_set(*(integer.parse_one(str(v[k]), f"--{k}") for k in ("bmin", "bmax")))
    if opts.get("power") is not None:
        if opts.get("energy") is not None:
            raise InputError("give either --energy (mJ per batch) or --power (W while a batch runs), not both")
        v["energy"] = f"power:{opts['power']}"
    v["service"] = _service_for_profile(v, opts, base)
    _note_profile_mix(v, opts, base, sizes)
    number = Number()
    kw = dict(batch_sizes=sizes, latency=v["latency"], energy=v["energy"], service=v["service"],
              w1=number.parse_one(str(v["w1"]), "--w1"), w2=number.parse_one(str(v["w2"]), "--w2"),
              instances=int(opts.get("instances") or v.get("instances") or 1),
              contention=opts.get("contention") if opts.get("contention") is not None else v.get("contention"))
    if v.get("lam") is not None:
        return BatchingProblem(lam=number.parse_one(str(v["lam"]), "--lam"), **kw)
    return BatchingProblem.from_rho(number.parse_one(str(v["rho"]), "--rho"), **kw)


def _check_size_bounds(given: dict, sizes: tuple[int, ...]) -> None:
    """``--bmin``/``--bmax`` beside ``--batch-sizes`` must name its smallest/largest size (else one is ignored)."""
    if given["batch_sizes"] is None:
        return
    for key, end, word in (("bmax", max(sizes), "largest"), ("bmin", min(sizes), "smallest")):
        if given[key] is not None and int(given[key]) != end:
            raise InputError(f"--{key} {given[key]} disagrees with --batch-sizes {given['batch_sizes']} (its {word} "
                             f"size is {end}); give --batch-sizes alone, or --{key} {end}")


def refuse_swept(opts: dict, keys: tuple[str, ...], why: str) -> None:
    """Refuse scenario options a command sets itself (``pareto`` sweeps w2): given, they would be ignored."""
    for key in keys:
        if opts.get(key) is not None:
            v = opts[key]
            raise InputError(f"--{key.replace('_', '-')} {v:g} would be ignored: {why}" if isinstance(v, float) else
                             f"--{key.replace('_', '-')} {v} would be ignored: {why}")


#: A measured profile whose batch times vary more than this (coefficient of variation at some size) has a
#: tail that a deterministic law hides: planning with --service det then draws a warning.
JITTER_CV = 0.05


def profile_path(spec) -> str | None:
    """FILE of an l(b) spelled ``csv:FILE[:fit]``, else None."""
    if not isinstance(spec, str) or not spec.strip().lower().startswith("csv:"):
        return None
    files = spec_files(spec, "--latency")
    return files[0][1] if files else None


def profile_spread(prof) -> tuple[float, float, float | None] | None:
    """(pooled CV, the largest CV of one size, the gamma shape 1/CV² that plans with it, None below 1 % CV) of a
    measured profile's batch times (pooled over the sizes with repeated calls), or None without repeats."""
    cvs, weights = [], []
    for b, c in zip(prof.sizes, prof.counts()):
        if c > 1:
            x = prof.samples(b)
            cvs.append(float(np.std(x, ddof=1) / np.mean(x)))
            weights.append(int(c))
    if not cvs:
        return None
    pooled = math.sqrt(float(np.average(np.square(cvs), weights=weights)))
    return pooled, max(cvs), None if pooled < 0.01 else float(f"{1.0 / pooled ** 2:.4g}")


def _service_for_profile(v: dict, opts: dict, base: dict | None) -> str:
    """The batch-time law to plan with.  When l(b) is a measured profile with repeated calls and no law
    was given (option, preset or policy file), a gamma law with the profile's measured coefficient of
    variation (pooled over the sizes: shape 1/CV²), so compare, export and solve plan with the measured
    tail; a policy file records it as ``gamma:A`` (no path: files never name one to open).  Below 1 % CV
    the batch time stays deterministic.  ``--service empirical:FILE`` uses each size's measured times
    exactly.  ``--service det`` with a profile whose CV exceeds :data:`JITTER_CV` is planned as asked,
    with a warning."""
    from ..model.profile import read_profile

    path = profile_path(v.get("latency"))
    if path is None:
        return v["service"]
    given = opts.get("service") is not None or (base or {}).get("service") is not None or opts.get("preset") is not None
    spread = profile_spread(read_profile(path))
    if spread is None:
        return v["service"]
    pooled, worst, shape = spread
    if not given:
        if shape is None:
            return v["service"]
        NOTICES_INFO.append(f"planning with the spread of {path}'s measured batch times: service gamma:{shape:g} (CV "
                            f"{100 * pooled:.3g} %, pooled over the sizes; up to {100 * worst:.3g} % at one size); "
                            f"--service empirical:{path} uses each size's times, --service det none")
        return f"gamma:{shape:g}"
    if str(v["service"]).strip().lower() in ("det", "deterministic") and worst > JITTER_CV:
        note = (f"--service det plans without the spread of {path}'s measured times (CV up to {100 * worst:.3g} % > "
                f"{100 * JITTER_CV:g} %): tail latencies will be higher than planned; drop --service to plan with them")
        if note not in NOTICES:
            NOTICES.append(note)
    return v["service"]


def _note_profile_mix(v: dict, opts: dict, base: dict | None, sizes: tuple[int, ...]) -> None:
    """A measured l(b) never mixes silently: priced with the paper's default ζ(b) (a GoogLeNet on a Tesla P4, not
    the device measured), or asked at batch sizes the profile did not measure (their l(b) is its fit's), each
    is named on one line."""
    from ..model.profile import read_profile

    path = profile_path(v.get("latency"))
    if path is None:
        return
    prof = read_profile(path)
    chosen = (opts.get("energy") is not None or opts.get("power") is not None or opts.get("preset") is not None
              or (base or {}).get("energy") is not None)
    if not chosen and v.get("energy") == DEFAULTS["energy"]:
        own = (f"; {path} has its own {'energy_mj' if prof.energy is not None else 'power_w'} column: "
               f"--{'energy' if prof.energy is not None else 'power'} csv:{path}"
               if prof.energy is not None or prof.power is not None else "")
        line = (f"l(b) is measured ({path}) but ζ(b) is the paper's default, a GoogLeNet on a Tesla P4 "
                f"({DEFAULTS['energy']} mJ): give your device's --energy or --power{own}")
        if line not in NOTICES:
            NOTICES.append(line)
    measured = {int(b) for b in prof.sizes}
    unmeasured = [b for b in sizes if b not in measured]
    if unmeasured:
        shown = ", ".join(map(str, unmeasured[:8])) + (f" … ({len(unmeasured)} sizes)" if len(unmeasured) > 8 else "")
        fit = str(v["latency"]).strip().rpartition(":")[2] if str(v["latency"]).count(":") >= 2 else "monotone"
        line = (f"{path} did not measure batch size {shown}: l(b) there is its {fit} fit between the measured sizes "
                f"{sorted(measured)[0]}..{sorted(measured)[-1]}, not a measurement (measure them, or --batch-sizes "
                f"{','.join(str(b) for b in sorted(measured) if b <= max(sizes))})")
        if line not in NOTICES:
            NOTICES.append(line)


_NAMES_A_FILE = re.compile(r"(?i)(csv|empirical)\s*:")
_CLOSED_CURVES = ("affine", "const", "constant", "log", "logarithmic", "table")


def _stored_curve(pf, what: str, values_name: str):
    """A file's l(b) or ζ(b): its closed-form spec if that gives the values stored per batch size,
    else a table of those values (a spec naming a file is provenance text only)."""
    spec, sizes, values = pf.inputs[what], pf.inputs["batch_sizes"], np.asarray(pf.inputs[values_name])
    power = what == "energy" and spec.strip().lower().startswith("power:")  # ζ(b) = P(b)·l(b): P(b) in W
    inner = spec.strip()[6:] if power else spec
    if inner.strip().partition(":")[0].lower() in _CLOSED_CURVES and not _NAMES_A_FILE.search(inner):
        curve = parse_curve(inner, "power" if power else what)
        factor = np.asarray(pf.inputs["latency_ms"], dtype=np.float64) if power else 1.0
        if not np.allclose(np.asarray(curve(np.asarray(sizes)), dtype=np.float64) * factor, values, rtol=1e-9, atol=0):
            raise InputError(f"{pf.path}: /inputs@{what} = {spec[:80]!r} disagrees with the values stored in "
                             f"/inputs/{values_name}: a damaged policy file")
        return spec
    return Table(tuple(int(b) for b in sizes), tuple(float(v) for v in values))


def file_inputs(pf, opts: dict | None = None, how: str = "give it again with --service LAW") -> dict:
    """The scenario a policy file was solved for, as build_problem's base values.

    Never opens a path named inside the file: the model specs it records (``csv:PATH``,
    ``empirical:PATH``) are provenance text only.  l(b) and ζ(b) come from the values stored per
    batch size (a ``table:`` curve) unless the spec is a closed form; a service law measured from a
    file (``empirical:PATH``) cannot be rebuilt from the file, so it must be given again (``how``)."""
    i = pf.inputs
    sizes = [int(b) for b in i["batch_sizes"]]
    base = {k: i[k] for k in ("lam", "w1", "w2", "service")}
    base["batch_sizes"] = sizes
    base["latency"] = _stored_curve(pf, "latency", "latency_ms")
    base["energy"] = _stored_curve(pf, "energy", "energy_mj")
    base["instances"] = int(i.get("instances", 1))  # a c-server table: run on the count it was solved for
    base["contention"] = i.get("contention") or None  # and with the contention it was solved with
    if _NAMES_A_FILE.search(i["service"]):
        if (opts or {}).get("service") is None:
            raise InputError(
                f"{pf.path}: its service law {i['service'][:80]!r} was measured from a file on the machine that "
                f"solved it, and smdp-batch never opens a path named inside a policy file; {how}"
            )
        base["service"] = "det"  # replaced by the law given on the command line
    return base


def problems_over(opts: dict, rho_grid, lam_grid) -> tuple[list[BatchingProblem], list[str]]:
    """Problems for every preset (``--preset a,b``) × load (``--rho``/``--lam`` or a grid), with labels."""
    if rho_grid is not None and lam_grid is not None:
        raise InputError("give either --rho-grid or --lam-grid, not both")
    grid_name, grid = ("rho", rho_grid) if rho_grid is not None else ("lam", lam_grid)
    if grid is not None and (opts.get("lam") is not None or opts.get("rho") is not None):
        raise InputError("--lam/--rho and a grid exclude each other")
    loads = [None] if grid is None else grid
    presets = [None] if opts.get("preset") is None else [x.strip() for x in opts["preset"].split(",") if x.strip()]
    problems, labels = [], []
    for name in presets:
        for v in loads:
            problems.append(build_problem({**opts, "preset": name, **({grid_name: v} if v is not None else {})}))
            labels.append(str(name) if len(presets) > 1 else "")
    return problems, labels


def load_grids(what: str = "one front each"):
    """``--rho-grid`` and ``--lam-grid`` (comma lists)."""
    def deco(f):
        f = option("--lam-grid", type=Grid(), help="Several arrival rates λ (1/ms), comma-separated.")(f)
        return option("--rho-grid", type=Grid(), help=f"Several loads ρ, e.g. 0.3,0.7 ({what}).")(f)
    return deco


# ------------------------------------------------------------------------------- deprecated spellings
def note_deprecated(old: str, new: str) -> None:
    """Record the one stderr line for an old spelling (printed once by main)."""
    line = f"{old} is deprecated; use {new}"
    if line not in NOTICES:
        NOTICES.append(line)


_RENAMED = "smdp_batch.renamed"


def deprecated_option(old: str, new: str, dest: str, **kw):
    """A hidden option spelled the old way; its value fills ``dest`` (the new option's parameter)
    unless the new spelling was given too.  Use with :func:`apply_renames` on the command."""

    def callback(ctx, param, value):
        if value is not None:
            note_deprecated(old, new)
            ctx.meta.setdefault(_RENAMED, {})[dest] = value
        return value

    return option(old, f"deprecated_{dest}_{old.strip('-').replace('-', '_')}", hidden=True, expose_value=False,
                        callback=callback, default=None, **kw)


def apply_renames(f):
    """Let a command's deprecated spellings (see :func:`deprecated_option`) fill its parameters."""

    @functools.wraps(f)
    def wrapper(**kwargs):
        ctx = click.get_current_context()
        for dest, value in ctx.meta.pop(_RENAMED, {}).items():
            if ctx.get_parameter_source(dest) in (None, click.core.ParameterSource.DEFAULT):
                kwargs[dest] = value
        return f(**kwargs)

    return wrapper


# ------------------------------------------------------------------------------------------ output
def emit(data: dict, as_json: bool, text: str, strict: bool = False) -> None:
    """Print ``text``, or ``data`` as JSON (docs/json.md).

    NaN never reaches the JSON: it becomes null everywhere (no command reports a NaN figure as a
    result).  ``strict``: ±inf become null too (RFC 8259 JSON, ``show``); otherwise ±Infinity is
    kept where docs/json.md documents it (a front's w2 range ends at the least-power policy).
    """
    if as_json:
        click.echo(json.dumps(json_safe(data, strict), indent=2, allow_nan=not strict))
    else:
        click.echo(text)


def json_safe(o, strict: bool = True):
    """``o`` with numpy values as Python ones, NaN as None, and (``strict``) ±inf as None."""
    if isinstance(o, dict):
        return {k: json_safe(v, strict) for k, v in o.items()}
    if isinstance(o, (list, tuple)):
        return [json_safe(v, strict) for v in o]
    if isinstance(o, np.ndarray):
        return json_safe(o.tolist(), strict)
    if isinstance(o, np.generic):
        o = o.item()
    if isinstance(o, float) and (o != o or (strict and not math.isfinite(o))):
        return None
    return o


def integrity_text(integrity: str) -> str:
    """What ``show`` says of a file's checksums."""
    if integrity == "none":
        return "none (written before checksums: damage cannot be detected)"
    return f"{integrity} checksums verified"


def sizes_text(sizes) -> str:
    sizes = list(sizes)
    if len(sizes) > 3 and sizes == list(range(sizes[0], sizes[-1] + 1)):
        return f"{sizes[0]}..{sizes[-1]}"
    return ",".join(map(str, sizes))


def contention_option(f):
    """``--contention K:S[:E],…``: instances on one device slowing each other (specs.contention)."""
    return option("--contention", default=None, metavar="K:S[:E],…",
                  help="With --instances > 1: instances on one device slow each other down. While K are busy each batch "
                       "takes S× as long and E× the energy (default 1), for K = 2, 3, …: e.g. 2:1.4,3:1.9:0.95; per "
                       "batch size B=K:S[:E],…/B=…, e.g. 1=2:1.8/32=2:1.05 (sizes between interpolated). "
                       "`measure FN --concurrency K` prints both.")(f)


def scenario_line(p: BatchingProblem, rate: str | None = None, w2: str | None = None) -> str:
    """Two lines describing the scenario; ``w2`` replaces the weight's value (e.g. "swept")."""
    per = f" per instance, {p.instances} instances sharing the queue" if p.instances > 1 else ""
    if p.instances > 1 and p.contention is not None:
        per += f"; contention {p.contention.describe()}"
    rate = rate or f"λ = {p.lam:.6g} /ms ({p.lam * 1e3:.6g} req/s, ρ = {p.rho:.4g}{per})"
    power = getattr(p.energy, "power", None)  # ζ(b) = P(b)·l(b) (--power)
    energy = f"ζ(b) = P(b)·l(b), P(b) = {power.spec()} W" if power is not None else f"ζ(b) = {p.energy.spec()} mJ"
    return (
        f"  scenario    {rate}, batch sizes {sizes_text(p.batch_sizes)}\n"
        f"              l(b) = {p.latency.spec()} ms, {energy}, service {p.service.spec()}, "
        f"w1 = {p.w1:g}, w2 = {w2 or format(p.w2, 'g')}"
    )


def metrics_line(d: dict) -> str:
    return (
        f"  metrics     W̄ = {d['mean_latency_ms']:.6g} ms, P̄ = {d['mean_power_w']:.6g} W, "
        f"throughput = {d['throughput'] * 1e3:.6g} req/s, mean batch = {d['mean_batch_size']:.4g}"
    )


def cost_line(value: float, where: str) -> str:
    """The objective, named and worded the same by solve, evaluate and show."""
    return f"  cost        ĝ = {value:.6g} per ms (w1·W̄ + w2·P̄, {where})"


#: Work shorter than this shows no progress line (seconds).
PROGRESS_AFTER_S = 2.0


class _StatusLine:
    """One line on stderr, rewritten in place, that appears only once the work has run ~2 s."""

    def __init__(self):
        self.t0 = time.perf_counter()
        self.shown = False

    def show(self, text: str) -> None:
        if self.shown or self.elapsed() >= PROGRESS_AFTER_S:
            self.shown = True
            click.echo(f"\r  {text}", nl=False, err=True)

    def elapsed(self) -> float:
        return time.perf_counter() - self.t0

    def finish(self) -> None:
        if self.shown:
            click.echo("", err=True)


def progress_line(enabled: bool, what: str, total: int | None = None):
    """A counter on stderr, shown once the work has run ~2 s (``total`` when it is known in advance)."""
    line, done = _StatusLine(), [0]

    def tick(n: int) -> None:
        done[0] += n
        line.show(f"{what}: {done[0]}{f'/{total}' if total else ''} done")

    return tick if enabled else None, line.finish


def solve_progress(enabled: bool, what: str = "solving"):
    """A solve's progress on stderr after ~2 s: stage, s_max of the candidate, candidates solved.

    Returns (callback for ``solve(progress=…)``, finish); the callback is None when disabled."""
    line = _StatusLine()

    def report(stage: str, s_max: int, done: int) -> None:
        line.show(f"{what}: {stage}, s_max = {s_max}, {done} truncations solved, {line.elapsed():.0f} s   ")

    return report if enabled else None, line.finish


def write_text_atomically(path: str, text: str) -> None:
    """Write text through :func:`smdp_batch.files.atomic_output` (committed with the command's other outputs)."""
    from ..files import atomic_output

    with atomic_output(path) as tmp, open(tmp, "w", encoding="utf-8") as fh:
        fh.write(text)


# ------------------------------------------------------------------------------ files read and written
def spec_files(spec, role: str) -> list[tuple[str, str]]:
    """The files a law or curve spelling reads, as ``(role, path)``: ``csv:FILE[:fit]``, ``empirical:FILE``,
    ``trace:FILE[:COLUMN]`` (also inside ``mix:…`` and ``max:…``)."""
    from ..model.profile import FITS

    if not isinstance(spec, str) or ":" not in spec:
        return []
    kind, _, arg = spec.strip().partition(":")
    kind, label = kind.lower(), f"{role} {spec}"
    if kind == "csv":
        path, sep, fit = arg.rpartition(":")
        return [(label, path if sep and fit in FITS else arg)]
    if kind in ("empirical", "map"):  # map:FILE.json — MAP arrivals (solve/simulate --arrivals)
        return [(label, arg)]
    if kind == "trace":  # simulate reads trace:FILE, multibin trace:FILE[:COLUMN]
        return [(label, arg)] + ([(label, arg.partition(":")[0])] if ":" in arg else [])
    if kind == "power":  # power:SPEC (an energy given as P(b)·l(b))
        return [(label, p) for _, p in spec_files(arg, role)]
    if kind in ("mix", "mixture"):
        found = []
        for part in arg.split(";"):
            law = part.partition("*")[2]
            found += spec_files(law.rpartition("@")[0] if "@" in law else law, role)
        return [(label, p) for _, p in found]
    if kind == "max":
        return [(label, p) for _, p in spec_files(arg.rpartition("@")[0] if "@" in arg else arg, role)]
    return []


def scenario_files(opts: dict) -> list[tuple[str, str]]:
    """Files the scenario options read (a policy file's recorded specs are never read: :func:`file_inputs`)."""
    return [f for key in ("latency", "energy", "power", "service") for f in spec_files(opts.get(key), f"--{key}")]


def prepare_outputs(outputs, inputs=(), folder=None) -> None:
    """Validate a command's outputs before any work (see :mod:`smdp_batch.files`): each one a regular file
    or a new path in a writable folder, none an input, no two the same; their temporary files are made
    now and renamed when the command succeeds (``main`` runs each command inside ``atomic_outputs``)."""
    from ..files import current_plan, validate_outputs

    plan = current_plan()
    if plan is None:  # a command called outside main: validate only, each writer renames on its own
        validate_outputs(outputs, inputs, folder)
    else:
        plan.prepare(outputs, inputs, folder)
