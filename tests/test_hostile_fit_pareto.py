"""Hostile inputs to ``fit-arrivals`` and ``pareto``.

fit-arrivals: tied and quantised timestamps (1 ms, 10 ms, 1 µs grids; Poisson and MMPP traces; a few exact
duplicates; an all-tied trace) are spread within their quantum and the fitted mean rate matches the trace's;
a solve with the fitted model runs.  pareto: extreme loads (ρ next to 1, tiny λ), one-point fronts, no
baselines: exit 0, or 2 with exactly one ``smdp-batch: error:`` line — never 70, never a traceback.
"""

import json
import math
import os

import numpy as np
import pytest

from smdp_batch import BatchingProblem
from smdp_batch.cli import main
from smdp_batch.errors import InputError
from smdp_batch.model.arrivals import MAP
from smdp_batch.model.fit import fit_mmpp
from smdp_batch.model.trace_clean import RATE_TOL, check_rate, clean_trace, grid_step

MMPP = MAP.mmpp([1.0, 4.0], [0.01, 0.02])  # λ̄ = 2 /ms, bursty


def _poisson(n: int, rate: float, seed: int = 3) -> np.ndarray:
    return np.cumsum(np.random.default_rng(seed).exponential(1 / rate, n))


def _mmpp(n: int, seed: int = 0) -> np.ndarray:
    return MMPP.sample(n, np.random.default_rng(seed))[0]


def _grid(t: np.ndarray, step: float) -> np.ndarray:
    """Times as a log writes them: floored to the grid (whole multiples of step, as decimals read back)."""
    return np.floor(t / step) * step


def _rate(t) -> float:
    return (t.size - 1) / (t[-1] - t[0])


# ------------------------------------------------------------------------------------------- grids
@pytest.mark.parametrize("times, step", [
    (_grid(_poisson(2000, 2.0), 1.0), 1.0),
    (_grid(_poisson(2000, 2.0), 10.0), 10.0),
    (np.round(_grid(_poisson(2000, 2.0), 1e-3), 3), 1e-3),
    (1.7e12 + _grid(_poisson(2000, 2.0), 1.0), 1.0),  # epoch milliseconds
    (np.round(_poisson(2000, 2.0), 6), 1e-6),  # written with 6 decimals: on a grid, no ties
    (_grid(_poisson(2000, 0.2), 15.625), 15.625),  # a 1/64 s timer tick
    (_poisson(2000, 2.0), None),  # full float64 resolution: no grid
])
def test_grid_step(times, step):
    got = grid_step(times)
    assert got == (None if step is None else pytest.approx(step, rel=1e-9))


def test_clean_trace_spreads_within_each_quantum_and_is_seeded():
    raw = _grid(_poisson(3000, 2.0), 1.0)
    c = clean_trace(raw, seed=4)
    assert c.spread == "quantum" and c.quantum_ms == 1.0 and c.tied == int(np.sum(np.diff(raw) == 0))
    assert np.all(np.diff(c.times) > 0)
    # each arrival stays in its millisecond (times counted from the first arrival)
    assert np.array_equal(np.floor(c.times), np.sort(raw - raw[0]))
    assert "timestamps quantised to 1 ms" in c.note and "tied gaps" in c.note and "millisecond" in c.note
    assert np.array_equal(clean_trace(raw, seed=4).times, c.times)
    assert not np.array_equal(clean_trace(raw, seed=5).times, c.times)
    untouched = clean_trace(np.round(_poisson(3000, 2.0), 6))  # a fine grid and no ties: fitted as given
    assert untouched.spread == "none" and untouched.note is None


# --------------------------------------------------------------------------------- quantised fits
@pytest.mark.parametrize("kind, rate, step, phases", [
    ("poisson", 2.0, 1.0, 2),
    ("poisson", 10.0, 1.0, 2),  # 90 % tied gaps: the unspread fit's mean rate was 108 % above the trace's
    ("poisson", 2.0, 10.0, "auto"),  # 95 % tied: the unspread auto fit was 64 % below
    ("poisson", 2.0, 1e-3, 2),
    ("mmpp", 2.0, 1.0, 2),
    ("mmpp", 2.0, 10.0, "auto"),
    ("mmpp", 2.0, 1e-3, 2),
])
def test_quantised_fit_keeps_the_trace_rate(kind, rate, step, phases):
    n = 5000 if phases == "auto" else 20_000
    t = _poisson(n, rate) if kind == "poisson" else _mmpp(n)
    raw = np.round(_grid(t, step), 9)
    f = fit_mmpp(raw, phases, seed=1)
    assert f.trace_rate == pytest.approx(_rate(raw), rel=1e-12)
    assert abs(f.model_rate / f.trace_rate - 1) <= RATE_TOL
    assert f.timestamps["quantum_ms"] == pytest.approx(step) and f.timestamps["spread"] == "quantum"
    assert f.notes[0].startswith(f"timestamps quantised to {step:g} ms: ")
    if kind == "mmpp":  # the burstiness survives: two phases near 1 and 4 /ms
        assert f.phases == 2 and f.rates == pytest.approx([1.0, 4.0], rel=0.15)
    elif phases == "auto":
        assert f.phases == 1
    else:
        assert f.rates == pytest.approx([rate, rate], rel=0.15)


def test_quantised_fit_is_deterministic():
    raw = _grid(_mmpp(5000), 1.0)
    a, b = fit_mmpp(raw, 2, seed=2), fit_mmpp(raw, 2, seed=2)
    assert np.array_equal(a.map.D0, b.map.D0) and a.loglik == b.loglik and a.notes == b.notes


def test_a_few_exact_duplicates_are_spread():
    t = _poisson(3000, 2.0)
    t = np.sort(np.r_[t, t[[10, 500, 2000, 2500, 2501]]])
    f = fit_mmpp(t, "auto")
    assert f.timestamps == {"tied_gaps": 5, "tied_share": pytest.approx(5 / (t.size - 1)), "quantum_ms": None,
                            "spread": "ties"}
    assert f.notes[0].startswith("5 tied timestamps") and f.phases == 1
    assert f.model_rate == pytest.approx(_rate(t), rel=RATE_TOL)


@pytest.mark.parametrize("times, needle", [
    (np.full(300, 7.0), "all 300 arrivals are tied at 7 ms"),
    (np.r_[np.zeros(150), np.ones(150)], "span only 1 quantum (2 distinct times)"),
    (_grid(_poisson(400, 10.0), 1.0), "at least 100 are needed"),  # 40 ms of whole-ms stamps
    (np.repeat(_poisson(300, 0.2), 5), "up to 5 arrivals at one time"),  # batches on no grid
])
def test_hopelessly_tied_traces_are_refused(times, needle):
    with pytest.raises(InputError) as e:
        fit_mmpp(times)
    assert needle in str(e.value) and "\n" not in str(e.value)


def test_short_trace_mean_rate_is_held_at_the_trace_rate():
    """A short bursty trace leaves the MLE's mean rate loose; the kept model matches the trace's."""
    for seed in range(4):
        t = _mmpp(300, seed)
        f = fit_mmpp(t, 2)
        assert abs(f.model_rate / _rate(t) - 1) <= RATE_TOL, seed
        if f.estimate == "refined at the trace's mean rate":
            assert f.model_rate == pytest.approx(_rate(t), rel=1e-9) and "refitted" in " ".join(f.notes)


def test_rate_guard():
    check_rate(2.03, 2.0, "2-phase MMPP fit")
    with pytest.raises(InputError, match=r"mean rate 0\.42 /ms is 79 % below the trace's 2 /ms"):
        check_rate(0.42, 2.0, "2-phase MMPP fit")


def test_cli_quantised_trace_fits_and_solves(tmp_path, capsys):
    src = tmp_path / "trace.csv"
    src.write_text("arrival_ms\n" + "\n".join(str(int(x)) for x in _grid(_mmpp(20_000), 1.0)) + "\n")
    out = tmp_path / "fit.json"
    assert main(["fit-arrivals", str(src), "-o", str(out)]) == 0
    text = capsys.readouterr().out
    assert "note        timestamps quantised to 1 ms: " in text and "spread uniformly within its millisecond" in text
    report = json.loads(out.read_text())["fit"]
    assert report["timestamps"]["spread"] == "quantum" and report["rate_tolerance"] == RATE_TOL
    assert abs(report["model_rate"] / report["trace_rate"] - 1) <= RATE_TOL
    assert main(["solve", "--arrivals", f"map:{out}", "--json"]) == 0
    assert json.loads(capsys.readouterr().out)


@pytest.mark.parametrize("times, needle", [
    (np.full(300, 7.0), "every gap is 0"),
    (np.r_[np.zeros(150), np.ones(150)], "quantised to 1 ms"),
])
def test_cli_tied_trace_one_line_exit_2(tmp_path, capsys, times, needle):
    src = tmp_path / "tied.csv"
    src.write_text("\n".join(f"{x:g}" for x in times) + "\n")
    assert main(["fit-arrivals", str(src), "-o", str(tmp_path / "fit.json")]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and err[0].startswith("smdp-batch: error: ") and needle in err[0], err
    assert os.listdir(tmp_path) == ["tied.csv"]


# ------------------------------------------------------------------------------------------ pareto
_QUIET = ["--no-baselines", "--no-timeouts"]


@pytest.mark.parametrize("args, rc, needle", [
    (["--rho", "0.9999", *_QUIET], 0, None),  # was an internal IndexError
    (["--rho", "0.99999", *_QUIET, "--plot", "{tmp}/a.png"], 0, None),
    (["--rho-grid", "0.5,0.9999", *_QUIET], 0, None),
    (["--rho", "1e-6", *_QUIET, "--plot", "{tmp}/b.png", "--plot-kind", "scenarios"], 0, None),
    (["--rho", "1e-9", "--requests", "1000", "--plot", "{tmp}/c.png", "--plot-kind", "percentiles"], 0, None),
    (["--lam", "1e-12", "--no-timeouts", "--csv", "{tmp}/d.csv"], 0, None),
    (["--rho-grid", "1e-9,0.9999", "--no-timeouts", "--plot", "{tmp}/e.png"], 0, None),
    (["--batch-sizes", "1", "--rho", "0.5", *_QUIET, "--plot", "{tmp}/f.png"], 0, None),  # a one-point front
    (["--batch-sizes", "1", "--rho", "0.5", "--no-timeouts", "--slo-mean-ms", "3", "-o", "{tmp}/g.h5",
      "--plot", "{tmp}/g.png", "--plot-kind", "percentiles", "--requests", "1000"], 0, None),
    (["--rho", "0.99", "--statics", "8,32", "--no-timeouts", "--plot", "{tmp}/h.png"], 0, None),
    (["--rho", "0.99", *_QUIET, "--requests", "1000", "--plot", "{tmp}/i.png", "--plot-kind", "percentiles"],
     2, "with 1000 requests failed"),  # was an internal KeyError
    (["--rho", "0.999", "--requests", "1000", "--percentiles"], 2, "simulate more requests (--requests"),
    (["--rho", "0.99", "--requests", "1000", "--slo-p99-ms", "100"], 2, "ρ = 0.99"),
    (["--service", "lognormal:2", "--rho", "0.99", *_QUIET], 2, "no policy of the front at ρ = 0.99"),
    (["--rho", "0.5", *_QUIET, "--w2-min", "1e-300", "--w2-max", "1e300"], 2, "w2_max must be ≤ 1e+12, got 1e+300"),
    (["--rho", "1e-300", *_QUIET], 2, "must lie in [1e-12"),
    (["--rho", "1", *_QUIET], 2, "ρ must lie in (0, 1)"),
    (["--rho", "0.9999", "--no-timeouts", "--slo-mean-ms", "1705", "-o", "{tmp}/j.h5"], 2, "w2 = ∞ end"),
])
def test_pareto_extreme_loads_exit_0_or_one_line(tmp_path, capsys, args, rc, needle):
    args = [a.replace("{tmp}", str(tmp_path)) for a in args]
    assert main(["pareto", *args]) == rc
    out, err = capsys.readouterr()
    lines = err.strip().splitlines()
    if rc == 2:
        assert len(lines) == 1 and lines[0].startswith("smdp-batch: error: ") and needle in lines[0], lines
        assert not os.listdir(tmp_path)
    else:
        assert "Traceback" not in err and "internal error" not in err and "latency–power trade-off" in out
        for a in args:
            if a.startswith(str(tmp_path)):
                assert os.path.getsize(a) > 0, a


def test_pareto_next_to_saturation_matches_solve(capsys):
    assert main(["pareto", "--rho", "0.9999", *_QUIET, "--json"]) == 0
    (front,) = json.loads(capsys.readouterr().out)["fronts"]
    first = front["points"][0]
    assert first["w2_lo"] == 0 and len(front["points"]) >= 2
    ref = solve_deployed(0.9999)
    assert (first["mean_latency_ms"], first["mean_power_w"]) == pytest.approx(ref, rel=1e-6)
    lat = [p["mean_latency_ms"] for p in front["points"]]
    assert lat == sorted(lat) and all(math.isfinite(x) for x in lat)


def solve_deployed(rho: float) -> tuple[float, float]:
    from smdp_batch.solvers import solve

    d = solve(BatchingProblem.basic(rho=rho, w2=0.0)).deployed
    return d.mean_latency_ms, d.mean_power_w


def test_baseline_tables_that_do_not_settle_are_skipped():
    from smdp_batch.analysis.pareto import baseline_points

    pts, skipped = baseline_points(BatchingProblem.basic(rho=0.99), [8, 32], timeouts=False, requests=1000,
                                   simulate_tables=True)
    assert [p.setting for p in pts] == ["static:32"] and pts[0].percentiles
    assert dict(skipped)["greedy"].startswith("unstable")


def test_front_labels_tell_loads_next_to_1_apart():
    from smdp_batch.analysis.plots import _rho_text

    assert [_rho_text(r) for r in (0.3, 0.9999, 0.99999, 1e-12, 1 - 1e-13)] == [
        "0.3", "0.9999", "0.99999", "1e-12", "1 − 1e-13"]
