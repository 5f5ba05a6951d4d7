"""Options and text shared by the commands that answer "least power at my SLO": ``compare``, ``pareto``'s
SLO pick and ``export --slo…`` (all through :func:`smdp_batch.analysis.slo.optimise`)."""

from __future__ import annotations

import math

from ..errors import InputError
from ..limits import REQUESTS_LIMIT, SEED_MAX, SLO_MAX_MS
from .types import Duration, Headroom, Number, Range, SloBound, option

__all__ = ["slo_options", "served_option", "served_from", "load_range_options", "search_options", "slo_from", "loads_for", "answer_lines", "plan_lines",
           "half_width",
           "worded_difference", "current_option", "current_rule", "current_line", "smdp_rule"]

#: A bare --load-range whose top load is below this share of the stable rate is likely req/ms typed as req/s.
RHO_UNIT_HINT = 0.01

_SLO_FLAGS = (("mean", "slo_mean_ms"), ("p50", "slo_p50_ms"), ("p90", "slo_p90_ms"), ("p95", "slo_p95_ms"),
              ("p99", "slo_p99_ms"))


def slo_options(f):
    """``--slo-mean-ms``, ``--slo-p50-ms`` … ``--slo-p99-ms`` and the repeatable ``--slo METRIC:MS``."""
    opts = [option(f"--slo-{m}-ms", key, type=Duration(min=0, min_open=True, max=SLO_MAX_MS), default=None,
                   help=f"SLO: {'mean' if m == 'mean' else m[1:] + 'th-percentile'} latency ≤ X ms (20, 20ms, 0.02s).")
            for m, key in _SLO_FLAGS]
    opts.append(option("--slo", "slo_list", type=SloBound(), multiple=True,
                       help="SLO as METRIC:MS (mean, p50, p90, p95, p99); repeat for several at once, e.g. "
                            "--slo p99:20 --slo mean:8."))
    opts.append(option("--headroom", type=Headroom(), default=None,
                       help="Slack kept below every SLO bound for what the plan does not model (the server's own "
                            "time: front end, dispatch, returning each response, the network): MS (3, 3ms) or a "
                            "share of each bound (10%). Default: none."))
    for o in reversed(opts):
        f = o(f)
    return f


def served_option(f):
    """``--served FILE``: the served-delay model ``smdp-batch calibrate`` measured on the server."""
    return option("--served", "served", metavar="FILE", default=None,
                  help="What the server adds beyond the model, measured by smdp-batch calibrate on the deployed "
                       "server (per-batch time, the return of each response, the outside delay at each load): every "
                       "setting's latency is then the served one, and loads the server's own path did not carry "
                       "are refused. Without it the plan holds the model's batching alone.")(f)


def served_from(path: str | None):
    """The :class:`~smdp_batch.model.served.ServedDelay` in ``path`` (None: none given)."""
    if path is None:
        return None
    from ..model.served import ServedDelay

    return ServedDelay.load(path)


def load_range_options(f):
    """``--load-range LO:HI`` (req/s) and ``--rho-range LO:HI`` (ρ)."""
    f = option("--rho-range", type=Range(), default=None,
               help="Check the setting over this range of loads ρ, e.g. 0.2:0.6 (≥ 5 loads, both ends).")(f)
    return option("--load-range", type=Range(per="s"), default=None,
                  help="Check the setting over this range of loads in requests/s, e.g. 500:1500, 0.5k:1.5k or "
                       "0.5/ms:1.5/ms (≥ 5 loads, both ends; the SMDP tables are solved at the top load).")(f)


def search_options(f):
    """``--requests`` per load and ``--seed`` of the SLO search."""
    f = option("--seed", type=Number(integer=True, min=0, max=SEED_MAX), default="0", show_default=True,
               help="Random seed (the same arrivals for every candidate).")(f)
    return option("--requests", type=Number(integer=True, min=1000, max=REQUESTS_LIMIT), default="200000",
                  show_default=True, help="Requests simulated per candidate and load.")(f)


def current_option(f):
    """``--current SPEC``: the user's own setting, priced and marked beside the answer."""
    return option("--current", "current", metavar="SPEC", default=None,
                  help="Your current setting, priced and marked: any rule simulate --policy accepts, e.g. "
                       "triton:max=32,delay_us=1000, ray:max=16,timeout_s=0.005, static:8.")(f)


def current_rule(spec: str | None, problem):
    """The ServerRule of ``--current`` for ``problem`` (None when not given); a size it executes must be allowed."""
    if spec is None:
        return None
    from ..baselines.servers import parse_rule

    if not spec.strip():
        raise InputError("--current needs a rule, e.g. triton:max=32,delay_us=1000 or static:8")
    if spec.strip().lower().startswith("smdp:"):
        return smdp_rule(spec, problem)
    rule = parse_rule(spec, problem)
    rule.check(problem.batch_sizes)
    return rule


def smdp_rule(spec: str, problem):
    """``smdp:w2=X[,bmax=C][,lam=L][+timer:MS[:pad]]`` — the SMDP table of weight X (compare's answers name
    tables so), solved now with the converged rule at λ = L (default: the scenario's) and the batch sizes ≤ C,
    optionally with a timer: the rule simulated as the table + timer runs it."""
    import numpy as np

    from ..baselines.servers import split_timer, table_rule, table_timer
    from ..solvers import solve

    head, tau, forced = split_timer(spec)
    keys = {}
    for part in filter(None, (x.strip() for x in head.partition(":")[2].split(","))):
        k, eq, v = part.partition("=")
        if not eq or k.strip().lower() not in ("w2", "bmax", "lam"):
            raise InputError(f"rule {spec!r}: unknown setting {part!r}; an SMDP table is smdp:w2=X[,bmax=C][,lam=L]")
        if k.strip().lower() in keys:
            raise InputError(f"rule {spec!r} gives {k.strip().lower()} twice; give each setting once")
        keys[k.strip().lower()] = Number(integer=k.strip().lower() == "bmax", min=0).parse_one(v.strip(), f"{spec}: {k}")
    if "w2" not in keys:
        raise InputError(f"rule {spec!r} needs w2=X (an SMDP table is smdp:w2=X[,bmax=C][,lam=L])")
    sizes = tuple(b for b in problem.batch_sizes if b <= keys.get("bmax", problem.bmax))
    if not sizes:
        raise InputError(f"rule {spec!r}: no allowed batch size is ≤ bmax = {keys['bmax']}")
    solved = problem.replace(w2=keys["w2"], batch_sizes=sizes, **({"lam": keys["lam"]} if "lam" in keys else {}))
    sol = solve(solved)
    policy = np.asarray(sol.policy)[: sol.s_max + 1]
    if tau is None:
        return table_rule(policy, sizes, spec=spec.strip())
    return table_timer(policy, sizes, tau, spec=spec.strip(), forced=forced)


def current_line(answer) -> str | None:
    """"your setting …: P̄, the SLO's metrics at each load; meets/breaks the SLO; what the recommendation saves"."""
    cur = answer.current
    if cur is None:
        return None
    metrics = [m for m, _ in answer.slo.bounds]
    at = []
    for x in cur.loads:
        if not math.isfinite(x.power_w):
            at.append(f"cannot carry {_rate(x.lam)}")
            continue
        vals = ", ".join(f"{'W̄' if m == 'mean' else m} {x.metrics[m]:.4g} ms" for m in metrics)
        at.append(f"P̄ {x.power_w:.4g} W, {vals} at {_rate(x.lam)}")
    verdict = "meets the SLO" if cur.meets else "breaks the SLO"
    rec = answer.recommended
    if rec is None:
        tail = "no recommendation to compare with"
    elif rec.spec == cur.spec:
        tail = "it is the recommendation"
    elif not all(math.isfinite(x.power_w) for x in cur.loads):
        tail = f"the recommendation, {rec.spec}, carries every load"
    else:
        v = answer.versus(cur)
        tail = worded_difference(rec.power_w, v["power_w"], v["ci_w"], "your setting", "the recommendation")
    return f"  your setting {cur.spec}: {'; '.join(at)}; {verdict}; {tail}"


def slo_from(kw: dict, required: bool = True):
    """The SLO of a command's options (popped from ``kw``), or None when none is given and not required."""
    from ..analysis.slo import SLO

    pairs = [(m, kw.pop(key)) for m, key in _SLO_FLAGS if kw.get(key) is not None]
    for _m, key in _SLO_FLAGS:
        kw.pop(key, None)
    pairs += list(kw.pop("slo_list", None) or ())
    headroom = kw.pop("headroom", None)
    if not pairs:
        if required or headroom is not None:
            raise InputError("give an SLO: --slo-p99-ms X (or --slo-mean-ms, --slo-p50-ms, --slo-p90-ms, "
                             "--slo-p95-ms, or --slo METRIC:MS, repeatable)"
                             + ("; --headroom is kept below its bounds" if headroom is not None else ""))
        return None
    return SLO.of(pairs, headroom)


def loads_for(problem, load_range, rho_range, single_given: bool = False):
    """(problem at the top load, loads in requests/ms) for ``--load-range`` / ``--rho-range`` or one load."""
    from ..analysis.slo import load_grid

    if load_range is not None and rho_range is not None:
        raise InputError("give either --load-range (req/s) or --rho-range (ρ), not both")
    if (load_range is not None or rho_range is not None) and single_given:
        raise InputError("give one load (--lam/--rho) or a load range (--load-range/--rho-range), not both")
    if load_range is None and rho_range is None:
        return problem, [problem.lam]
    if rho_range is not None:
        lo, hi = (x * problem.max_lam for x in rho_range)
        if rho_range[1] >= 1:
            raise InputError(f"--rho-range reaches ρ = {rho_range[1]:g} ≥ 1: no batching rule can serve it; use ρ < 1")
    else:
        lo, hi = (x / 1e3 for x in load_range)
        if not getattr(load_range, "explicit", True) and hi < RHO_UNIT_HINT * problem.max_lam:
            from .options import NOTICES

            NOTICES.append(f"--load-range {load_range[0]:g}:{load_range[1]:g} is in requests/s: ρ ≤ "
                           f"{hi / problem.max_lam:.2g} here; for requests/ms write {load_range[0]:g}/ms:"
                           f"{load_range[1]:g}/ms (a unit on the numbers silences this line)")
    lams = load_grid(problem, lo, hi)
    return problem.replace(lam=lams[-1]), lams


def _rate(lam: float) -> str:
    return f"{lam * 1e3:.5g} req/s"


def worded_difference(ours: float, theirs: float, ci: float, name: str, who: str = "it") -> str:
    """"it draws 0.61 W (2.0 %) less than NAME" (never a signed number), with the interval when it is a tie; a
    setting that cannot carry a load (no finite power) is said so, never priced as "inf W (nan %)"."""
    if not math.isfinite(theirs):
        return f"{name} cannot carry every load checked (its queue grows without bound there)"
    d = theirs - ours
    if d == 0:
        return f"{who} draws the same power as {name}"
    pct = 100.0 * abs(d) / theirs if theirs else math.nan
    tie = f" (within the simulation's ±{ci:.2g} W: a tie)" if abs(d) <= ci else ""
    return f"{who} draws {abs(d):.3g} W ({pct:.2g} %) {'less' if d > 0 else 'more'} than {name}{tie}"


def answer_lines(answer, instances: int = 1, idle_hint: str = "give --idle-power W") -> list[str]:
    """The per-family table and the savings, worded for a user (on ``instances`` sharing the queue)."""
    slo = answer.slo
    metrics = [m for m, _ in slo.bounds]
    lines = [f"  {'family':17s}{'setting':58s}{'P̄ [W] (95%)':>17s}   worst load: " + ", ".join(
        f"{'W̄' if m == 'mean' else m} [ms]" for m in metrics)]
    for fam, s in answer.best.items():
        if s is None:
            lines.append(f"  {fam:17s}no setting meets {slo.text()} at every load")
            continue
        w = s.worst(slo)
        vals = ", ".join(f"{w.metrics[m]:.4g} ± {half_width(w.ci[m])}" for m in metrics)
        lines.append(f"  {fam:17s}{_short(s.spec, 58):58s}{s.power_w:9.4g} ± {s.power_ci:<5.2g}   {_rate(w.lam)}: {vals}")
    rec = answer.recommended
    if rec is not None:
        lines.append("")
        lines.append(f"  answer      {rec.spec}: {rec.power_w:.4g} W, {slo.text()} at every load checked")
        lines += plan_lines(answer, rec, idle_hint)
        if rec.family == "table+timer":
            first, *more = _deploy(rec, instances, answer.problem)
            lines.append(f"  run it      {first}")
            lines += [f"              {x}" for x in more]
        else:
            lines.append(f"  note        here a server rule beats every table + timer setting: {rec.family}'s own rule, "
                         "tuned, is the answer")
        for row in answer.savings():
            text = worded_difference(rec.power_w, row["power_w"], row["ci_w"], row["setting"])
            text += "" if row["meets_slo"] else "; that setting breaks the SLO"
            label = {"best tuned rule": "vs best", "table+timer": "vs table"}.get(row["against"], "vs default")
            lines.append(f"  {label:11s} {text}")
    else:
        lines.append(f"  answer      no table+timer setting meets {slo.text()} at every load: relax the SLO or the range")
        lines += reach_lines(answer)
        lines.append(server_time_line(answer))
    return lines


def server_time_line(answer) -> str:
    """Whether the server's own time is in the answer (calibrated, with what it measured) or not (and the headroom
    kept for it): said with a setting and without one (a bound out of reach is so with that time in it)."""
    room = answer.slo.headroom_text()
    sd = answer.served
    if sd is not None:
        src = sd.source
        return (f"  in plan     the server's own time, calibrated on {src.get('server', 'the server')} "
                f"({src.get('model', 'its model')}) at {', '.join(f'{x:.4g}' for x in sd.loads_per_s)} req/s: "
                + sd.summary() + ("" if room == "none" else f"; --headroom keeps {room} more"))
    return ("  not in plan the server's own time (front end, dispatch, returning each response, the network): "
            + ("give --headroom MS|PCT to keep room for it, or measure it with smdp-batch calibrate"
               if room == "none" else f"--headroom keeps {room} for it"))


def reach_lines(answer) -> list[str]:
    """Where an SLO is not met: the least the hardest metric reached at the hardest load, by which setting, and what
    bound it would meet (a setting meets a bound when its metric plus the half-width is within it)."""
    from ..analysis.slo import REACH_MARGIN

    r = answer.reach
    if r is None:
        return []
    name = "W̄" if r["metric"] == "mean" else r["metric"]
    top = r["value_ms"] + r["ci_ms"]
    how = ("the best of the settings that wait least (serve at once, in batches up to Bmax, Bmax/2, …; the SMDP table "
           f"of least mean latency), over {100 * REACH_MARGIN:.0f} % above the bound, more than other settings gain on "
           "them, so nothing else was searched" if answer.out_of_reach else "the least of every setting simulated")
    return [f"  reach       at {_rate(r['lam'])} the least {name} is {r['value_ms']:.4g} ± {half_width(r['ci_ms'])} ms "
            f"({r['setting']}): {how}",
            f"              a bound of {top:.4g} ms or more can be met there; more --requests narrow the ± part"]


def half_width(x: float) -> str:
    """A half-width as people read it: two significant digits, and below 0.01 ms "< 0.01" (an interval of 1e-12 ms
    says only that every batch mean agreed)."""
    return "< 0.01" if x < 0.005 else f"{x:.2g}"


def plan_lines(answer, s, idle_hint: str = "give --idle-power W") -> list[str]:
    """What the plan rests on, for setting ``s`` of ``answer``: its margin at the worst load (ms and %) and how its
    metrics were obtained; that the server's own time is not in it (and the headroom kept for it); the idle power
    it assumes, the power floor and the share of the achievable saving it takes."""
    slo = answer.slo
    w = s.worst(slo)
    m, b = w.tightest(slo)
    name = "W̄" if m == "mean" else m
    lines = [f"  margin      {w.margin_ms(slo):.3g} ms ({100 * w.margin(slo):.2g} % of the bound) at the worst load, "
             f"{_rate(w.lam)}: {name} {w.metrics[m]:.4g} ms (± {half_width(w.ci[m])}) against {b:g} ms; "
             f"{answer.requests} simulated requests per load, 95 % batch-means half-widths"]
    lines += fresh_lines(answer, s)
    lines.append(server_time_line(answer))
    idle = (f"{answer.idle_power_w:g} W per idle instance" if answer.idle_power_given
            else f"0 W idle power assumed ({idle_hint})")
    floor = answer.floor_w()
    share, against = answer.captured(floor)
    text = f"  power       {idle}; floor {floor:.4g} W (no rule that meets the SLO draws less here)" \
        if math.isfinite(floor) else f"  power       {idle}; no floor: no batch size finishes within the bound"
    if share is not None:
        text += f"; takes {100 * share:.3g} % of the saving there is against {against}"
    lines.append(text)
    return lines


def fresh_lines(answer, s) -> list[str]:
    """The recommendation on a fresh stream (another seed, longer): where it holds, one line; where it breaks, the
    load, the figure and what to do."""
    f = answer.fresh
    if f is None or s is not answer.recommended:
        return []
    slo = answer.slo
    w = max(f.loads, key=lambda x: max(x.metrics[k] / slo.limit(k) for k, _ in slo.bounds))
    m = max((k for k, _ in slo.bounds), key=lambda k: w.metrics[k] / slo.limit(k))
    name = "W̄" if m == "mean" else m
    text = (f"  fresh seed  {name} {w.metrics[m]:.4g} ms (± {half_width(w.ci[m])}) at {_rate(w.lam)} on "
            f"{answer.fresh_requests} new requests a load (seed {answer.seed + 1})")
    if answer.fresh_holds:
        return [text + ": holds"]
    return [text + f": BREAKS {name} ≤ {slo.limit(m):g} ms — the interval it was chosen on was too narrow for this law's tail; "
            "ask again with more --requests (5–10× as many) and check that the answer holds here"]


#: The Python line of a run-it answer starts with this import, so that it runs as printed.
RUNTIME_IMPORT = "from smdp_batch.runtime import DynamicBatcher, PolicyTable; "


def _deploy(rec, instances: int = 1, problem=None) -> list[str]:
    """How to run a table + timer setting, as lines that work as printed: for an SMDP table the ``smdp-batch
    solve`` command that writes it (every scenario option spelled out), then the Python line that runs it with
    the runtime's timer (``infer``: your batch function); a table that is a control limit (Triton's preferred
    sizes, greedy, static) needs no solve."""
    from .options import scenario_args

    k = rec.knobs
    tau = k.get("tau_ms")
    wait = "None" if tau is None or not math.isfinite(tau) else f"{tau:g}"
    short = ', short_batch="pad-up", pad_item=0' if k.get("forced") == "pad" else ""
    short += f", instances={instances}" if instances > 1 else ""
    if "w2" in k and math.isfinite(k["w2"]) and problem is not None:
        solved = problem.replace(batch_sizes=tuple(k["batch_sizes"])) if k.get("batch_sizes") else problem
        opts = ""
        load = '"table.h5"'
        if k.get("instances"):  # the c-server table: solved for these instances (its λ is the total)
            opts = f" --instances {k['instances']}" + (f" --phases {k['phases']}" if k.get("phases") else "")
            opts += f" --contention {k['contention']}" if k.get("contention") else ""
            load += ", busy_aware=False"  # the table n ↦ b the search simulated, not rows the file may add
        return [f"smdp-batch solve {scenario_args(solved, lam=k['solve_lam'])} --w2 {k['w2']:.10g}{opts} -o table.h5",
                f"{RUNTIME_IMPORT}DynamicBatcher(infer, PolicyTable.load({load}), max_wait_ms={wait}{short})"]
    return [f"{RUNTIME_IMPORT}DynamicBatcher(infer, {_table_literal(rec, problem)}, max_wait_ms={wait}{short})"]


def _table_literal(rec, problem) -> str:
    """The setting's table as Python that builds it: ``PolicyTable.control(Q, sizes)`` for a control limit, else
    the list of sizes per queue length."""
    import numpy as np

    from ..baselines import parse_policy
    from ..runtime.table import control_limit

    if rec.policy is not None:
        policy = [int(x) for x in rec.policy]
    else:  # a setting that names its table only (control:Q, static:B, greedy)
        policy = [int(x) for x in parse_policy(rec.knobs.get("table") or rec.spec.partition("+")[0],
                                               problem.batch_sizes, problem.bmax)[:-1]]
    sizes = [int(b) for b in problem.batch_sizes] if problem is not None else sorted(set(policy) - {0})
    size_text = f"range({sizes[0]}, {sizes[-1] + 1})" if sizes == list(range(sizes[0], sizes[-1] + 1)) else str(sizes)
    q = control_limit(np.asarray(policy), sizes)
    if q is not None:
        return f"PolicyTable.control({q}, {size_text})"
    return f"PolicyTable({policy}, {size_text})"


def _short(text: str, width: int) -> str:
    return text if len(text) <= width else text[: width - 1] + "…"
