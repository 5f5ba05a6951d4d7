"""What an SLO answer rests on, said and usable as printed: headroom and margins, the server's own time named as
not in the plan, idle power and the power floor, profiles that never mix silently, noisy measurements flagged,
rates and times with their units, run-it lines and next steps that run as printed, a Ray export that imports."""

from __future__ import annotations

import ast
import json
import math
import shlex
import textwrap

import numpy as np
import pytest

from smdp_batch.analysis.power_floor import captured_share, power_floor
from smdp_batch.analysis.simulate import simulate
from smdp_batch.analysis.slo import SLO, optimise
from smdp_batch.baselines import parse_policy
from smdp_batch.cli import main
from smdp_batch.errors import InputError
from smdp_batch.model.problem import BatchingProblem

FAST = ["--bmax", "8", "--requests", "3000"]


def run(args, capsys):
    rc = main([str(a) for a in args])
    out = capsys.readouterr()
    return rc, out.out, out.err


def _json(args, capsys) -> dict:
    rc, out, err = run([*args, "--json"], capsys)
    assert rc == 0, err
    return json.loads(out)


# ------------------------------------------------------------------------------- headroom and margins
def test_headroom_is_kept_below_every_bound_and_zero_headroom_changes_nothing(capsys):
    base = _json(["compare", *FAST, "--slo-p99-ms", "12"], capsys)
    zero = _json(["compare", *FAST, "--slo-p99-ms", "12", "--headroom", "0"], capsys)
    assert zero["recommended"]["setting"] == base["recommended"]["setting"]
    assert zero["recommended"]["mean_power_w"] == base["recommended"]["mean_power_w"]
    kept = _json(["compare", *FAST, "--slo-p99-ms", "12", "--headroom", "2ms"], capsys)
    assert kept["headroom"] == {"kind": "ms", "value": 2.0, "limits_ms": {"p99": 10.0}}
    for x in kept["recommended"]["loads"]:
        assert x["metrics_ms"]["p99"] + x["ci_ms"]["p99"] <= 10.0
    assert kept["recommended"]["worst_load"]["margin_ms"] >= 2.0
    assert kept["recommended"]["mean_power_w"] >= base["recommended"]["mean_power_w"] - 1e-9  # slack costs power
    pct = _json(["compare", *FAST, "--slo-p99-ms", "12", "--headroom", "10%"], capsys)
    assert pct["headroom"]["limits_ms"]["p99"] == pytest.approx(10.8)


def test_an_answer_without_a_calibration_names_what_is_not_in_its_plan_and_its_margin(capsys):
    rc, out, err = run(["compare", *FAST, "--slo-p99-ms", "12"], capsys)
    assert rc == 0, err
    lines = out.splitlines()
    missing = [x for x in lines if x.strip().startswith("not in plan")]
    assert len(missing) == 1 and "server's own time" in missing[0] and "--headroom MS|PCT" in missing[0]
    margin = next(x for x in lines if x.strip().startswith("margin"))
    assert " ms (" in margin and "% of the bound" in margin and "3000 simulated requests per load" in margin
    d = _json(["compare", *FAST, "--slo-p99-ms", "12"], capsys)
    assert d["server_time_in_plan"] is False and d["metric_method"].startswith("simulated: 3000 requests")
    rc, out, _ = run(["compare", *FAST, "--slo-p99-ms", "12", "--headroom", "1.5"], capsys)
    assert "--headroom keeps 1.5 ms below each bound for it" in out


@pytest.mark.parametrize("value, msg", [("95%", "≤ 90"), ("-1", "≥ 0"), ("12", "leaves nothing of the p99 bound"),
                                        ("3 parsecs", "unknown unit")])
def test_a_bad_headroom_is_one_line(capsys, value, msg):
    rc, out, err = run(["compare", *FAST, "--slo-p99-ms", "12", "--headroom", value], capsys)
    lines = err.strip().splitlines()
    assert rc == 2 and len(lines) == 1 and lines[0].startswith("smdp-batch: error:") and msg in lines[0], err


def test_a_tiny_interval_is_not_printed_as_an_interval(capsys):
    from smdp_batch.cli.slo import half_width

    assert half_width(1.7e-12) == "< 0.01" and half_width(0.036) == "0.036"


# ------------------------------------------------------------------------------------------ honest power
def test_the_power_identity_behind_the_floor_holds_in_the_simulator():
    """P̄ = P_idle + λ·(ζ(b) − P_idle·l(b))/b for a rule that always serves b (the floor's accounting)."""
    p = BatchingProblem.basic(rho=0.5, batch_sizes=tuple(range(1, 9)))
    rule = parse_policy("static:4", p.batch_sizes, 64)
    for idle in (0.0, 12.0):
        r = simulate(p, rule, requests=200_000, seed=3, idle_power_w=idle)
        l4, z4 = float(p.latency_ms()[3]), float(p.energy_mj()[3])
        assert r.mean_power_w == pytest.approx(idle + p.lam * (z4 - idle * l4) / 4, rel=5e-3)


def _floor_by_hand(p, lam, t_unit, bound, share, idle, priced=None, at_idle=False):
    """The floor as its module doc defines it, request by request in plain loops (O(n²)): for each request, each
    size's window and the most arrivals any [a, a + w] holds, a an arrival in [t_r − w, t_r]; ``priced``: the first
    requests priced (their windows reach the whole stream)."""
    if idle > 0 and not at_idle:  # idle priced at P_idle and at 0 W, each a bound (the module doc's busy-time argument)
        return max(_floor_by_hand(p, lam, t_unit, bound, share, idle, priced, at_idle=True),
                   _floor_by_hand(p, lam, t_unit, bound, share, 0.0, priced))
    t = [(u - t_unit[0]) / lam for u in t_unit]
    priced = len(t) if priced is None else priced
    lat, zeta, sizes = p.latency_ms(), p.energy_mj(), list(p.batch_sizes)
    x = [float(zeta[i] - idle * lat[i]) for i in range(len(sizes))]
    free = min(min(xi / b, xi) for xi, b in zip(x, sizes))
    costs = []
    for tr in t[:priced]:
        best = math.inf
        for i, b in enumerate(sizes):
            w = bound - float(lat[i])  # deterministic batch times
            if w < 0:
                continue
            m = max(sum(1 for ti in t if ta <= ti <= ta + w) for ta in t if tr - w <= ta <= tr)
            best = min(best, x[i] / min(b, m) if x[i] >= 0 else x[i])
        costs.append(best)
    costs.sort()
    drop = math.floor(share * len(costs))
    mean = (sum(costs[: len(costs) - drop]) + drop * free) / len(costs)
    return p.instances * idle + (priced - 1) / t[priced - 1] * mean


def test_the_floor_is_the_per_request_bound_computed_by_hand(monkeypatch):
    p = BatchingProblem.basic(rho=0.5, batch_sizes=tuple(range(1, 13)))
    unit = np.cumsum(np.random.default_rng(4).exponential(1.0, 300))
    for lam, bound, idle in ((p.lam, 6.0, 0.0), (p.lam, 9.0, 10.0), (0.2, 8.0, 0.0)):
        got, _ = power_floor(p, lam, [("p95", bound)], idle, unit)
        assert got == pytest.approx(_floor_by_hand(p, lam, unit, bound, 0.05, idle), rel=1e-12)
    assert math.isnan(power_floor(p, p.lam, [("p99", 1.0)], 0.0, unit)[0])  # l(1) = 1.36 ms: nothing finishes
    # a long stream: its first FLOOR_REQUESTS requests are priced, their windows reaching past them
    import smdp_batch.analysis.power_floor as pf

    monkeypatch.setattr(pf, "FLOOR_REQUESTS", 150)
    got, _ = power_floor(p, p.lam, [("p95", 6.0)], 0.0, unit)
    assert got == pytest.approx(_floor_by_hand(p, p.lam, unit, 6.0, 0.05, 0.0, priced=150), rel=1e-12)


@pytest.mark.parametrize("idle", [0.0, 10.0, 30.0])
def test_no_setting_that_meets_the_slo_draws_less_than_the_floor_at_a_light_load_or_a_busy_one(idle):
    """At 3..9 req/s and p99 ≤ 20 ms a batch of two forms by chance now and then: a floor over the sizes that fill
    on average (one, there) lay 5 % above the answer, which took '4 900 %' of the saving.  At 30 W idle a batch of
    one costs less than idling, and the floor priced at the idle power alone would let every request ride alone."""
    p = BatchingProblem.basic(rho=0.5)
    for lams, bound in (([0.003, 0.006, 0.009], 20.0), ([p.lam], 12.6)):
        ans = optimise(p, SLO.of({"p99": bound}), lams, requests=20_000, idle_power_w=idle)
        floor = ans.floor_w()
        for s in [*ans.best.values(), *ans.defaults]:
            if s is not None and s.meets:
                assert s.power_w + s.power_ci >= floor, s.spec
        share, against = ans.captured()
        assert against == "triton:max=32,delay_us=0"
        if idle < 30:
            assert 0 < share <= 1.0
        else:  # waiting saves nothing at 30 W (the answer is the default's greedy table): no share, or none taken
            assert share is None or abs(share) < 0.01
            zero = power_floor(p, lams[-1], [("p99", bound)], 0.0, ans.unit_arrivals)[0]
            assert ans.floors()[-1][1] >= zero - 1e-9  # idle priced at 0 W bounds it too, and tighter here
    assert captured_share(40.0, 40.0, 40.0) is None and captured_share(40.0, 35.0, 30.0) == pytest.approx(0.5)


def test_a_bound_on_the_mean_and_a_trace_give_a_floor_below_the_answer():
    p = BatchingProblem.basic(rho=0.5)
    bursty = np.cumsum(np.random.default_rng(2).exponential(1.0, 20_000) * np.repeat([0.2, 1.8], 10_000)[
        np.random.default_rng(3).permutation(20_000)])
    for arrivals in (None, bursty):
        ans = optimise(p, SLO.of({"mean": 6.0}), requests=20_000, arrivals=arrivals)
        rec = ans.recommended
        assert 0 < ans.floor_w() <= rec.power_w + rec.power_ci
        assert ans.floor_w() > p.lam * float(p.energy_mj()[-1]) / 32  # the bound keeps batches below 32


def test_compare_and_export_state_the_idle_power_the_floor_and_the_share(tmp_path, capsys):
    rc, out, err = run(["compare", *FAST, "--slo-p99-ms", "12"], capsys)
    power = next(x for x in out.splitlines() if x.strip().startswith("power"))
    assert "0 W idle power assumed (give --idle-power W)" in power and "floor" in power and "% of the saving" in power
    d = _json(["compare", *FAST, "--slo-p99-ms", "12", "--idle-power", "10"], capsys)
    assert d["idle_power_w"] == 10.0 and d["idle_power_assumed"] is False
    rec = d["recommended"]
    assert d["power_floor_w"] <= rec["mean_power_w"] + rec["mean_power_ci_w"] and 0 < d["captured_share"] <= 1.05
    table = tmp_path / "t.h5"
    assert main(["solve", "--bmax", "8", "-o", str(table)]) == 0
    capsys.readouterr()
    d = _json(["export", table, "--to", "triton", "--slo-p99-ms", "12", "--requests", "3000"], capsys)
    s = d["slo_search"]
    assert s["idle_power_assumed"] is True and math.isfinite(s["power_floor_w"]) and s["captured_share"] is not None
    rc, out, err = run(["export", table, "--to", "triton", "--slo-p99-ms", "12", "--requests", "3000",
                        "--idle-power", "5"], capsys)
    assert rc == 0 and "5 W per idle instance" in out and "margin" in out and "not in plan" in out


def test_an_absurd_idle_power_is_refused_in_one_line(capsys):
    rc, _, err = run(["compare", *FAST, "--slo-p99-ms", "12", "--idle-power", "1e300"], capsys)
    assert rc == 2 and err.count("smdp-batch: error:") == 1 and "--idle-power must be ≤" in err


# ------------------------------------------------------------------------------ profiles never mix silently
@pytest.fixture
def profile(tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    (tmp_path / "ref.csv").write_text("batch_size,latency_ms\n1,1.0\n1,1.1\n2,1.5\n2,1.6\n4,2.5\n4,2.4\n")
    (tmp_path / "withe.csv").write_text("batch_size,latency_ms,energy_mj\n1,1.0,30\n2,1.5,40\n4,2.5,60\n")
    return tmp_path


def test_a_measured_latency_with_the_paper_energy_or_an_unmeasured_size_is_named(profile, capsys):
    rc, _, err = run(["solve", "--latency", "csv:ref.csv", "--batch-sizes", "1,2,3"], capsys)
    assert rc == 0, err
    warn = [x for x in err.splitlines() if x.startswith("smdp-batch: warning:")]
    assert len(warn) == 2
    assert "ζ(b) is the paper's default" in warn[0] and "give your device's --energy or --power" in warn[0]
    assert "did not measure batch size 3" in warn[1] and "--batch-sizes 1,2" in warn[1]
    rc, _, err = run(["solve", "--latency", "csv:ref.csv", "--batch-sizes", "1,2,4", "--power", "const:60"], capsys)
    assert rc == 0 and "warning" not in err, err
    rc, _, err = run(["solve", "--latency", "csv:withe.csv", "--batch-sizes", "1,2,4"], capsys)
    assert "has its own energy_mj column: --energy csv:withe.csv" in err
    rc, _, err = run(["solve", "--latency", "csv:withe.csv", "--energy", "csv:withe.csv", "--batch-sizes", "1,2,4"],
                     capsys)
    assert rc == 0 and "warning" not in err, err


def test_measure_flags_a_noisy_size_and_labels_its_spread(tmp_path, monkeypatch, capsys):
    monkeypatch.chdir(tmp_path)
    (tmp_path / "noisy.py").write_text(textwrap.dedent("""
        import itertools, time
        _k = itertools.count()
        def f(batch):
            time.sleep(0.001 if next(_k) % 2 else 0.012)  # 1 or 12 ms: CV far above 25 %
    """))
    rc, out, err = run(["measure", "noisy:f", "--sizes", "1", "--repeats", "6", "--warmup", "0", "-o", "p.csv"], capsys)
    assert rc == 0, err
    row = next(x for x in out.splitlines() if x.strip().startswith("b ="))
    assert "(sd " in row and "CV " in row and "← noisy" in row
    assert "vary by more than 25 %" in err and "measure again" in err


# ------------------------------------------------------------------------------------ units on the numbers
def test_times_and_rates_take_their_units(capsys):
    plain = _json(["compare", *FAST, "--slo-p99-ms", "12", "--load-range", "600:900"], capsys)
    for slo in (["--slo-p99-ms", "12ms"], ["--slo-p99-ms", "0.012s"], ["--slo", "p99:12ms"]):
        for rng in (["--load-range", "0.6k:0.9k"], ["--load-range", "0.6/ms:0.9/ms"], ["--load-range", "600req/s:900rps"]):
            d = _json(["compare", *FAST, *slo, *rng], capsys)
            assert d["slo"] == {"p99": 12.0} and d["loads_per_ms"] == pytest.approx(plain["loads_per_ms"], rel=1e-12)
    a = _json(["solve", "--bmax", "8", "--lam", "800req/s"], capsys)
    b = _json(["solve", "--bmax", "8", "--rps", "0.8k"], capsys)
    assert a["lam"] == pytest.approx(0.8) and b["lam"] == pytest.approx(0.8)


def _options_by_unit():
    """Every option of every command whose name says its unit: (command path, option, unit)."""
    import click

    from smdp_batch.cli import cli

    def walk(cmd, path):
        if isinstance(cmd, click.Group):
            for name, sub in cmd.commands.items():
                yield from walk(sub, [*path, name])
            return
        for p in cmd.params:
            name = max(p.opts, key=len) if isinstance(p, click.Option) else ""
            word = name[2:]  # "--power" is a curve (const:60), "--idle-power" a power
            unit = ("ms" if word.endswith("-ms") else "s" if word.endswith(("-s", "-seconds")) else
                    "W" if word.endswith(("-w", "-power")) else None)
            if unit and not p.hidden:
                yield " ".join(path), name, p, unit

    return list(walk(cli, []))


def test_every_option_named_for_its_unit_takes_that_unit_on_the_number(capsys):
    """--slo-p99-ms took 20ms on compare but not on pareto, --idle-power took 8 but not 8W: the class, by name."""
    found = _options_by_unit()
    assert {(c, n) for c, n, _, _ in found} >= {("pareto", "--slo-p99-ms"), ("simulate", "--within-ms"),
                                               ("compare", "--idle-power"), ("measure", "--budget-s")}
    spelled = {"ms": ("20ms", "0.02s", 20.0), "s": ("30s", "30000ms", 30.0), "W": ("8W", "8000mW", 8.0)}
    for command, name, param, unit in found:
        a, b, want = spelled[unit]
        for text in (a, b):
            got = param.type.convert(text, param, None)
            got = got[0] if isinstance(got, list) else got[1] if isinstance(got, tuple) else got
            assert got == pytest.approx(want, rel=1e-12), (command, name, text, got)
    rc, _, err = run(["solve", "--bmax", "8", "--idle-power", "8ms"], capsys)
    assert rc == 2 and "--idle-power" in err and "not a power" in err and err.count("error") == 1
    rc, _, err = run(["measure", "noisy:f", "--sizes", "1", "--budget-s", "2min", "-o", "x.csv"], capsys)
    assert rc == 2 and "'2min'" in err and "s (bare numbers), ms" in err  # its bare numbers are seconds


def test_a_rate_in_the_other_unit_is_named(capsys):
    rc, _, err = run(["compare", *FAST, "--slo-p99-ms", "12", "--load-range", "2:8"], capsys)
    assert rc == 0 and "--load-range 2:8 is in requests/s" in err and "2/ms:8/ms" in err
    rc, _, err = run(["compare", *FAST, "--slo-p99-ms", "12", "--load-range", "2req/s:8req/s"], capsys)
    assert "is in requests/s" not in err
    rc, _, err = run(["solve", "--lam", "800"], capsys)
    assert rc == 2 and "for 800 requests/s write 800req/s" in err
    rc, _, err = run(["solve", "--lam", "8 parsecs"], capsys)
    assert rc == 2 and err.count("error") == 1 and "unknown unit" in err


# ----------------------------------------------------------------------------- lines that run as printed
def _run_it(out: str) -> list[str]:
    lines = out.splitlines()
    i = next(k for k, x in enumerate(lines) if x.strip().startswith("run it"))
    first = lines[i].strip()[len("run it"):].strip()
    more = []
    for x in lines[i + 1:]:
        if not x.startswith(" " * 14):
            break
        more.append(x.strip())
    return [first, *more]


def _python_runs(line: str) -> object:
    """The printed Python line, run with a batch function ``infer`` defined: the batcher it builds."""
    assert line.startswith("from smdp_batch.runtime import")
    imports, _, expr = line.partition("; ")
    ns: dict = {"infer": lambda items: list(items)}
    exec(imports, ns)  # noqa: S102 - our own printed line, in a test
    return eval(expr, ns)  # noqa: S307


def test_the_run_it_line_of_a_control_limit_answer_runs_as_printed(capsys):
    args = ["compare", "--slo-p99-ms", "15", "--requests", "20000"]
    rc, out, err = run(args, capsys)
    assert rc == 0, err
    [line] = _run_it(out)
    assert "PolicyTable.control(" in line and "parse_policy" not in out
    batcher = _python_runs(line)
    rec = _json(args, capsys)["recommended"]
    assert batcher.max_wait_ms == pytest.approx(rec["knobs"]["tau_ms"])
    assert batcher.table.policy.tolist() == rec_policy(rec)


def rec_policy(rec: dict) -> list[int]:
    """The control-limit table a compare answer names (``control:Q+timer:…``), over 0..32."""
    q = int(rec["setting"].partition("+")[0].partition(":")[2])
    return [0] * q + list(range(q, 33))


def test_the_run_it_lines_of_an_smdp_answer_solve_the_same_table(tmp_path, monkeypatch, capsys):
    """The SMDP family's answer: the printed solve command writes the table the search simulated, and the Python
    line runs it (the lines ``compare`` prints when such an answer wins, as with ``--slo-mean-ms 8`` on some seeds)."""
    from smdp_batch.cli.slo import _deploy

    monkeypatch.chdir(tmp_path)
    ans = optimise(BatchingProblem.basic(rho=0.5, service="exp"), SLO.of({"p99": 40.0}), families=("smdp",),
                   requests=5000)
    rec = ans.best["smdp"]
    solve_line, py_line = _deploy(rec, 1, ans.problem)
    assert solve_line.startswith("smdp-batch solve ") and solve_line.endswith("-o table.h5")
    assert "--service exp" in solve_line and "(and these scenario options)" not in solve_line
    rc, _, err = run(shlex.split(solve_line)[1:], capsys)
    assert rc == 0, err
    table = _python_runs(py_line).table.policy
    n = min(len(table), len(rec.policy))
    assert list(table[:n]) == list(rec.policy[:n])


def test_the_ray_export_is_a_module_that_imports(tmp_path, capsys):
    table = tmp_path / "t.h5"
    assert main(["solve", "--bmax", "8", "-o", str(table)]) == 0
    out = tmp_path / "ray_batch.py"
    for extra in ([], ["--slo-p99-ms", "12", "--requests", "3000", "--instances", "2"]):
        rc, _, err = run(["export", table, "--to", "ray", "-o", out, *extra], capsys)
        assert rc == 0, err
        text = out.read_text()
        tree = ast.parse(text)
        assert any(isinstance(n, ast.ClassDef) and n.name == "BatchedModel" for n in tree.body)
    pytest.importorskip("ray.serve")
    import importlib.util

    spec = importlib.util.spec_from_file_location("ray_batch_export", out)
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    assert mod.BatchedModel is not None  # a Ray Serve deployment, built on import


def test_the_slo_object_refuses_a_headroom_that_leaves_nothing():
    with pytest.raises(InputError, match="leaves nothing"):
        SLO.of({"p99": 10}, ("ms", 10))
    assert SLO.of({"p99": 10}, ("pct", 10)).limit("p99") == pytest.approx(9.0)
