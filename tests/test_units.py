"""Units people use: suffixes on --latency/--energy numbers, --power instead of --energy, the one line that says
how ζ(b) reads, and --time-unit of arrival traces (smdp_batch/model/units.py)."""

import json

import numpy as np
import pytest

from smdp_batch import BatchingProblem
from smdp_batch.analysis.simulate import read_trace
from smdp_batch.cli import main
from smdp_batch.errors import InputError
from smdp_batch.model.curves import PowerEnergy
from smdp_batch.model.spec import parse_curve
from smdp_batch.model.units import energy_text, quantity

FAST = ["--rho", "0.5", "--bmax", "8"]


def run(args, capsys):
    rc = main(args)
    out = capsys.readouterr()
    return rc, out.out, out.err


def solved(args, capsys) -> dict:
    rc, out, err = run(["solve", *FAST, *args, "--json"], capsys)
    assert rc == 0, err
    d = json.loads(out)
    for key in ("solve_seconds", "seconds"):
        d.pop(key, None)
    return d


# ------------------------------------------------------------------------------------------- suffixes
@pytest.mark.parametrize("text", ["const:60mJ", "const:0.06J", "const:60000uJ", "const:60000µJ", "const:60000μJ",
                                  "const:60 mJ", "const:6e4uJ", "const:0.00006kJ", "const:60MJ".replace("M", "m")])
def test_energy_suffixes_equal_bare_mj(text):
    assert parse_curve(text, "energy model") == parse_curve("const:60", "energy model")


@pytest.mark.parametrize("text", ["const:1.2ms", "const:1200us", "const:1200µs", "const:0.0012s", "const:1200000ns"])
def test_latency_suffixes_equal_bare_ms(text):
    assert parse_curve(text, "latency model") == parse_curve("const:1.2", "latency model")


def test_every_curve_kind_takes_units():
    assert parse_curve("affine:19.9mJ,19.6mJ", "energy model") == parse_curve("affine:19.9,19.6", "energy model")
    assert parse_curve("affine:0.3ms,1.05ms", "latency model") == parse_curve("affine:0.3,1.05", "latency model")
    assert parse_curve("affine:300us,0.00105s", "latency model") == parse_curve("affine:0.3,1.05", "latency model")
    assert parse_curve("log:0.105J,60mJ", "energy model") == parse_curve("log:105,60", "energy model")
    assert parse_curve("table:1=1.3ms,2=1600us", "latency model") == parse_curve("table:1=1.3,2=1.6", "latency model")
    assert parse_curve("const:0.06kW", "power model") == parse_curve("const:60", "power model")
    assert parse_curve("const:500mW", "power model") == parse_curve("const:0.5W", "power model")


def test_max_law_mean_takes_a_time_unit():
    a = BatchingProblem(lam=0.1, batch_sizes=(1, 2, 4), service="max:exp@5ms", latency=None)
    b = BatchingProblem(lam=0.1, batch_sizes=(1, 2, 4), service="max:exp@5000us", latency=None)
    assert np.array_equal(a.latency_ms(), b.latency_ms())


@pytest.mark.parametrize("args, needle", [
    (["--energy", "const:60ms"], "energy 'const:60ms': '60ms' is a time, not an energy; valid units: mJ"),
    (["--energy", "affine:19.9mJ,5s"], "'5s' is a time, not an energy"),
    (["--energy", "const:60W"], "'60W' is a power, not an energy; valid units: mJ (bare numbers), J, uJ/µJ"),
    (["--latency", "const:5W"], "latency 'const:5W': '5W' is a power, not a time; valid units: ms (bare numbers), s, us/µs"),
    (["--latency", "const:1mJ"], "'1mJ' is an energy, not a time"),
    (["--latency", "table:1=1ms,2=2J"], "'2J' is an energy, not a time"),
    (["--power", "const:60mJ"], "'60mJ' is an energy, not a power; valid units: W (bare numbers), kW, mW"),
    (["--power", "const:60ms"], "'60ms' is a time, not a power"),
    (["--energy", "const:60xx"], "'60xx' has an unknown unit 'xx'; an energy takes mJ"),
    (["--energy", "const:60MJ"], "unknown unit 'MJ'"),  # mega is never read as milli
    (["--power", "const:60MW"], "unknown unit 'MW'"),
    (["--energy", "const:J"], "'J' must be a number, optionally with a unit: mJ"),
    (["--power", "const:60W", "--energy", "const:60"], "give either --energy (mJ per batch) or --power"),
    (["--power", "max:exp"], "unknown power model 'max:exp'; valid forms: const:P"),
])
def test_wrong_units_are_one_line(args, needle, capsys):
    rc, _, err = run(["solve", *FAST, *args], capsys)
    assert rc == 2 and err.count("\n") == 1 and err.startswith("smdp-batch: error: ") and needle in err, err


def test_quantity_is_exact():
    assert quantity("0.0012s", "time", "x") == 1.2 and quantity("800us", "time", "x") == 0.8
    assert quantity("0.06J", "energy", "x") == 60.0 and quantity("19.9mJ", "energy", "x") == 19.9
    assert quantity("inf", "energy", "x") == float("inf")  # bare numbers as before; the curve refuses inf
    with pytest.raises(InputError, match="takes a bare number"):
        quantity("5ms", None, "x")


# ----------------------------------------------------------------------------------- equal solves
def test_units_give_exactly_the_same_solve(capsys):
    base = solved(["--energy", "const:60", "--latency", "affine:0.3,1.05"], capsys)
    for e, lat in (("const:0.06J", "affine:0.3ms,1.05ms"), ("const:60000uJ", "affine:300us,1050us"),
                   ("const:60mJ", "affine:0.0003s,0.00105s")):
        assert solved(["--energy", e, "--latency", lat], capsys) == base


def test_power_equals_energy_of_power_times_latency(capsys):
    d = solved(["--power", "const:60W", "--latency", "affine:0.3,1.05"], capsys)
    assert d["energy"] == "power:const:60"
    sizes = range(1, 9)
    table = "table:" + ",".join(f"{b}={60 * (0.3 * b + 1.05)!r}" for b in sizes)
    e = solved(["--energy", table, "--latency", "affine:0.3,1.05"], capsys)
    assert d["policy"] == e["policy"] and d["avg_cost"] == pytest.approx(e["avg_cost"], rel=1e-12)
    assert d["mean_power_w"] == pytest.approx(e["mean_power_w"], rel=1e-12)
    for spelling in ("const:60", "const:0.06kW", "const:60000mW"):
        assert solved(["--power", spelling, "--latency", "affine:0.3,1.05"], capsys) == d


def test_power_from_a_profile_column(tmp_path, capsys):
    prof = tmp_path / "p.csv"
    prof.write_text("batch_size,latency_ms,power_w\n1,1.3,40\n2,1.6,45\n4,2.2,52\n8,3.5,60\n")
    lat = ["--latency", f"csv:{prof}", "--batch-sizes", "1,2,4,8", "--rho", "0.5"]
    rc, out, err = run(["solve", *lat, "--power", f"csv:{prof}", "--json"], capsys)
    assert rc == 0, err
    p = json.loads(out)
    rc, out, err = run(["solve", *lat, "--energy", f"csv:{prof}", "--json"], capsys)  # ζ = power_w · latency_ms per row
    e = json.loads(out)
    assert p["energy"] == f"power:csv:{prof}" and p["policy"] == e["policy"]
    assert p["avg_cost"] == pytest.approx(e["avg_cost"], rel=1e-12)
    no_power = tmp_path / "e.csv"
    no_power.write_text("batch_size,latency_ms,energy_mj\n1,1.3,40\n2,1.6,45\n")
    rc, _, err = run(["solve", "--bmax", "2", "--power", f"csv:{no_power}"], capsys)
    assert rc == 2 and err.count("\n") == 1 and "no power_w column" in err


def test_power_follows_the_problems_latency():
    p = BatchingProblem.from_rho(0.5, batch_sizes=(1, 2, 4), latency="const:2", energy="power:const:60W")
    assert isinstance(p.energy, PowerEnergy) and np.array_equal(p.energy_mj(), [120.0, 120.0, 120.0])
    q = p.replace(latency="const:3")
    assert np.array_equal(q.energy_mj(), [180.0, 180.0, 180.0])
    assert p.describe()["energy"] == "power:const:60"


def test_a_policy_file_keeps_its_power_curve(tmp_path, capsys):
    f = tmp_path / "t.h5"
    assert main(["solve", *FAST, "--power", "affine:0.5W,40W", "--latency", "const:800us", "-o", str(f)]) == 0
    rc, out, err = run(["evaluate", "--policy", str(f)], capsys)
    assert rc == 0 and "P(b) = affine:0.5,40 W" in out, out + err


# ------------------------------------------------------------------------------------ the note
def test_solve_says_how_energy_reads(capsys):
    rc, out, err = run(["solve", *FAST, "--energy", "const:60", "--latency", "affine:0.3,1.05", "--json"], capsys)
    json.loads(out)  # the note is never in the JSON
    assert rc == 0 and err.splitlines() == [
        "smdp-batch: note: ζ(b) = 60 mJ per batch ≈ 44.4 W at b = 1 (l(1) = 1.35 ms), ≈ 17.4 W at b = 8 "
        "(l(8) = 3.45 ms); for 60 W while a batch runs use --power const:60W"]
    rc, _, err = run(["solve", *FAST, "--energy", "const:60mJ"], capsys)  # a unit typed: no --power hint
    assert rc == 0 and "60 mJ per batch" in err and "--power" not in err
    rc, _, err = run(["solve", *FAST, "--power", "const:60W", "--latency", "const:1"], capsys)
    assert rc == 0 and err.splitlines() == [
        "smdp-batch: note: ζ(b) = P(b)·l(b) with P(b) = const:60 W: 60 mJ per batch at b = 1 (l(1) = 1 ms), "
        "60 mJ per batch at b = 8 (l(8) = 1 ms)"]
    rc, _, err = run(["solve", *FAST], capsys)  # the default model: no note
    assert rc == 0 and err == ""


def test_energy_text_of_a_curve():
    p = BatchingProblem.from_rho(0.5, batch_sizes=(1, 2))
    assert energy_text(p.energy, p.latency, p.batch_sizes).startswith(
        "ζ(b) = affine:19.899,19.603 mJ per batch: 39.5 mJ ≈ 29.1 W at b = 1 (l(1) = 1.36 ms)")


def test_compare_says_how_energy_reads(capsys):
    rc, out, err = run(["compare", *FAST, "--slo-p99-ms", "20", "--requests", "5000", "--energy", "const:0.06J",
                        "--json"], capsys)
    assert rc == 0 and "smdp_batch" not in err
    json.loads(out)
    assert err.splitlines() == ["smdp-batch: note: ζ(b) = 60 mJ per batch ≈ 44.2 W at b = 1 (l(1) = 1.36 ms), "
                                "≈ 17.2 W at b = 8 (l(8) = 3.49 ms)"]


# ---------------------------------------------------------------------------------------- traces
@pytest.fixture
def traces(tmp_path):
    rng = np.random.default_rng(3)
    t = np.round(np.cumsum(rng.exponential(1 / 1.2, 3000)), 4)  # ms, 1.2 /ms
    paths = {}
    for name, scale, fmt in (("ms", 1.0, "{:.4f}"), ("s", 1e-3, "{:.7f}"), ("us", 1e3, "{:.1f}"), ("ns", 1e6, "{:.0f}")):
        paths[name] = tmp_path / f"trace_{name}.csv"
        paths[name].write_text("\n".join(fmt.format(x * scale) for x in t) + "\n")
    paths["header_s"] = tmp_path / "trace_header_s.csv"
    paths["header_s"].write_text("arrival_s\n" + paths["s"].read_text())
    return paths


def test_time_unit_reads_exactly(traces):
    ms = read_trace(str(traces["ms"]))
    assert np.array_equal(read_trace(str(traces["s"]), "s"), ms)
    assert np.array_equal(read_trace(str(traces["us"]), "us"), ms)
    assert np.array_equal(read_trace(str(traces["ns"]), "ns"), ms)
    assert np.array_equal(read_trace(str(traces["header_s"])), ms)  # the header names the unit
    with pytest.raises(InputError, match="says s, but --time-unit ms"):
        read_trace(str(traces["header_s"]), "ms")


def test_simulate_trace_in_seconds_equals_the_trace_in_ms(traces, capsys):
    args = ["simulate", "--policy", "greedy", *FAST, "--json", "--arrivals"]
    rc, out, err = run([*args, f"trace:{traces['ms']}"], capsys)
    assert rc == 0, err
    ms = json.loads(out)
    rc, out, err = run([*args, f"trace:{traces['s']}", "--time-unit", "s"], capsys)
    assert rc == 0, err
    s = json.loads(out)
    for d in (ms, s):
        d.pop("arrivals"), d.pop("simulate_seconds")
    assert s == ms


def test_fit_arrivals_takes_a_time_unit(traces, capsys):
    rc, out, err = run(["fit-arrivals", str(traces["ms"]), "--phases", "1", "--json"], capsys)
    assert rc == 0, err
    ms = json.loads(out)
    rc, out, err = run(["fit-arrivals", str(traces["s"]), "--phases", "1", "--time-unit", "s", "--json"], capsys)
    assert rc == 0, err
    s = json.loads(out)
    assert s["rates"] == ms["rates"]


@pytest.mark.parametrize("which, hint", [("s", "the times look like seconds: give --time-unit s"),
                                         ("ns", "look like microseconds or nanoseconds: give --time-unit us or ns")])
def test_a_trace_in_the_wrong_unit_is_refused(traces, which, hint, capsys):
    for args in (["simulate", "--policy", "greedy", *FAST, "--arrivals", f"trace:{traces[which]}"],
                 ["compare", *FAST, "--slo-p99-ms", "20", "--arrivals", f"trace:{traces[which]}"],
                 ["fit-arrivals", str(traces[which]), "--phases", "1"]):
        rc, _, err = run(args, capsys)
        assert rc == 2 and err.count("\n") == 1 and hint in err and "median gap" in err, (args, err)
    # explicitly ms: read as asked (the user said so)
    assert main(["fit-arrivals", str(traces[which]), "--phases", "1", "--time-unit", "ms", "--json"]) == 0


def test_time_unit_needs_a_trace(capsys):
    rc, _, err = run(["simulate", "--policy", "greedy", *FAST, "--time-unit", "s"], capsys)
    assert rc == 2 and "--arrivals poisson is not a trace:FILE" in err
    rc, _, err = run(["simulate", "--policy", "greedy", *FAST, "--time-unit", "h"], capsys)
    assert rc == 2 and err.count("\n") == 1 and "valid: s, ms, us, µs, ns" in err
