"""MMPP fitting (smdp_batch.model.fit, ``fit-arrivals``): recovery of a known MMPP, BIC on Poisson traffic,
the exact likelihood against brute force, the JSON file that ``--arrivals map:FILE`` reads, one-line errors."""

import json
import math
import os

import numpy as np
import pytest
from scipy.integrate import quad
from scipy.linalg import expm

from smdp_batch.cli import main
from smdp_batch.errors import InputError
from smdp_batch.model.arrivals import MAP, parse_arrivals, read_map_file
from smdp_batch.model.fit import _loglik, fit_mmpp, map_loglik, trace_idc

TRUE = MAP.mmpp([1.0, 4.0], [0.01, 0.02])  # 100 ms at 1 /ms, 50 ms at 4 /ms: λ̄ = 2 /ms


@pytest.fixture(scope="module")
def trace():
    return TRUE.sample(100_000, np.random.default_rng(0))[0]


@pytest.fixture(scope="module")
def fitted(trace):
    return fit_mmpp(trace, 2, seed=0)


def _poisson(n=3000, rate=2.0, seed=3):
    return np.cumsum(np.random.default_rng(seed).exponential(1 / rate, n))


def test_recovers_a_two_phase_mmpp(fitted, trace):
    assert fitted.phases == 2 and fitted.blocks == ((0, trace.size),)
    assert fitted.rates == pytest.approx([1.0, 4.0], rel=0.10)
    assert -np.diag(fitted.generator) == pytest.approx([0.01, 0.02], rel=0.25)
    assert fitted.model_rate == pytest.approx(fitted.trace_rate, rel=0.02)
    assert fitted.trace_rate == pytest.approx((trace.size - 1) / (trace[-1] - trace[0]))
    assert fitted.sojourn_ms == pytest.approx(1 / -np.diag(fitted.generator))
    # the model's IDC follows the trace's (within 10 % up to 10 windows; 1 % sampling noise at the first)
    assert len(fitted.idc) >= 2
    for row in fitted.idc[:2]:
        assert row["model"] == pytest.approx(row["trace"], rel=0.10)
        assert row["model"] == pytest.approx(TRUE.idc(row["window_ms"]), rel=0.10)
    # the exact optimum is at least as likely as the truth and reported by the uniformization path
    assert fitted.loglik >= map_loglik(TRUE, trace)
    assert fitted.loglik == pytest.approx(map_loglik(fitted.map, trace), abs=1e-6)
    assert fitted.bic == pytest.approx(4 * math.log(trace.size - 1) - 2 * fitted.loglik)


def test_long_trace_uses_spread_blocks(trace, monkeypatch):
    from smdp_batch.model import fit

    monkeypatch.setattr(fit, "REFINE_BLOCK", 20_000)  # as a trace of 10^6 arrivals, at a tenth of the cost
    f = fit_mmpp(trace, 2)
    assert len(f.blocks) == 10 and f.blocks[0] == (0, 2000) and f.blocks[-1] == (trace.size - 2000, 2000)
    assert "10 blocks of 2000" in f.notes[0]
    assert f.loglik == pytest.approx(sum(map_loglik(f.map, trace[a:a + c]) for a, c in f.blocks), abs=1e-6)
    assert f.bic == pytest.approx(4 * math.log(10 * 1999) - 2 * f.loglik)
    # the blocks' own rate is 4 % under the trace's here: the model keeps the whole trace's (step 4)
    blocks_rate = sum(c - 1 for _, c in f.blocks) / sum(trace[a + c - 1] - trace[a] for a, c in f.blocks)
    assert blocks_rate < 0.97 * f.trace_rate and f.estimate == "refined at the trace's mean rate"
    assert f.rates == pytest.approx([1.0, 4.0], rel=0.10) and f.model_rate == pytest.approx(f.trace_rate, rel=1e-9)


def test_fit_is_deterministic(trace):
    a, b = fit_mmpp(trace[:20_000], 2, seed=1), fit_mmpp(trace[:20_000], 2, seed=1)
    assert np.array_equal(a.map.D0, b.map.D0) and a.loglik == b.loglik


def test_poisson_trace_chooses_one_phase():
    t = _poisson()
    auto = fit_mmpp(t, "auto")
    assert auto.phases == 1 and auto.selection.startswith("auto")
    assert [c["phases"] for c in auto.candidates] == [1, 2, 3, 4]
    assert auto.rates[0] == pytest.approx((t.size - 1) / (t[-1] - t[0]))
    assert auto.loglik == pytest.approx((t.size - 1) * (math.log(auto.rates[0]) - 1))
    two = fit_mmpp(t, 2)
    assert two.rates[1] / two.rates[0] < 1.5  # two nearly equal rates


def _brute(mp, t):
    x = mp.after_arrival()
    for d in np.diff(t):
        x = x @ expm(mp.D0 * d) @ mp.D1
    return math.log(x.sum())


@pytest.mark.parametrize("mp", [
    TRUE,
    MAP.mmpp([0.2, 1.5, 6.0], [[0, 0.3, 0.1], [0.2, 0, 0.5], [0.05, 1.0, 0]]),
    MAP([[-3.0, 1.0], [0.5, -1.5]], [[1.5, 0.5], [0.2, 0.8]]),  # a MAP whose arrivals change the phase
])
def test_exact_loglik_matches_brute_force(mp):
    t = np.cumsum(np.random.default_rng(2).exponential(1.0, 40))
    t[10] = t[9]  # a zero gap
    t[20:] += 60.0  # a long gap (q·Δ beyond one uniformization piece)
    ref = _brute(mp, t)
    assert map_loglik(mp, t) == pytest.approx(ref, rel=1e-12)
    assert _loglik(mp.D0, mp.D1, mp.after_arrival(), [np.diff(t)], fast=True) == pytest.approx(ref, rel=1e-10)


def test_poisson_loglik_closed_form():
    t = _poisson(500)
    assert map_loglik(MAP.poisson(2.0), t) == pytest.approx(499 * math.log(2.0) - 2.0 * (t[-1] - t[0]), rel=1e-13)


def test_map_idc_matches_quadrature():
    assert MAP.poisson(2.0).idc(5.0) == pytest.approx(1.0)
    D, pi, d, lam = TRUE.D0 + TRUE.D1, TRUE.stationary, TRUE.phase_rates, TRUE.rate
    for t in (1.0, 50.0):
        cov = quad(lambda u: (t - u) * (pi @ TRUE.D1 @ expm(D * u) @ d - lam**2), 0, t, limit=200)[0]  # noqa: B023
        assert TRUE.idc(t) == pytest.approx(1 + 2 * cov / (lam * t), rel=1e-8)
    assert trace_idc(_poisson(20_000), 5.0) == pytest.approx(1.0, abs=0.1)


def test_json_round_trip(fitted, tmp_path):
    path = tmp_path / "fit.json"
    path.write_text(fitted.to_json())
    back = read_map_file(str(path))
    assert np.allclose(back.D0, fitted.map.D0, rtol=1e-14) and np.allclose(back.D1, fitted.map.D1, rtol=1e-14)
    assert parse_arrivals(f"map:{path}").rate == pytest.approx(fitted.model_rate)
    report = json.loads(path.read_text())["fit"]
    assert report["phases"] == 2 and report["idc"][0]["trace"] == fitted.idc[0]["trace"]


@pytest.mark.parametrize("times, kw, needle", [
    (np.arange(150.0), {}, "at least 200 arrivals"),
    (np.r_[np.arange(300.0), 5.0], {}, "must be sorted: #299 = 299 ms is followed by 5 ms"),
    (np.full(300, 7.0), {}, "spans 0 ms"),
    (np.r_[np.arange(300.0), np.nan], {}, "#300 is nan"),
    (np.arange(300.0), {"phases": 5}, "phases must be 1..4 or auto"),
    (np.arange(300.0), {"phases": "many"}, "phases must be 1..4 or auto"),
    (np.arange(300.0), {"window_ms": 100.0}, "window 100.0 ms is not valid"),
    (np.arange(300.0), {"seed": -1}, "seed must be an integer"),
    (["a", "b"], {}, "must be numbers"),
    (np.zeros((300, 2)), {}, "1-D sequence of ms, got shape (300, 2)"),
])
def test_bad_input(times, kw, needle):
    with pytest.raises(InputError) as e:
        fit_mmpp(times, **kw)
    assert needle in str(e.value) and "\n" not in str(e.value)


# ------------------------------------------------------------------------------------------------ CLI
def _write(path, times, header=True):
    path.write_text(("arrival_ms\n" if header else "") + "\n".join(f"{x:.6f}" for x in times) + "\n")
    return str(path)


def test_cli_writes_a_file_arrivals_can_read(tmp_path, trace, capsys):
    src = _write(tmp_path / "trace.csv", trace[:20_000])
    out = tmp_path / "fit.json"
    assert main(["fit-arrivals", src, "-o", str(out), "--json"]) == 0
    d = json.loads(capsys.readouterr().out)
    assert d["phases"] == 2 and d["output"] == str(out) and d["use"] == f"--arrivals map:{out}"
    assert read_map_file(str(out)).phase_rates == pytest.approx(d["rates"])
    assert main(["fit-arrivals", src, "--phases", "auto", "--window-ms", "20", "--seed", "3"]) == 0
    text = capsys.readouterr().out
    for needle in ("MMPP fit of", "least BIC of 1..4", "mean rate   trace", "IDC", "log L =", "BIC =", "candidates",
                   "--arrivals map:FIT.json"):
        assert needle in text, text


@pytest.mark.parametrize("args, needle", [
    (["missing.csv"], "does not exist"),
    (["few.csv"], "at least 200 arrivals"),
    (["unsorted.csv"], "timestamps must be sorted"),
    (["ok.csv", "--phases", "7"], "unknown number of phases '7'; valid: 1, 2, 3, 4, auto"),
    (["ok.csv", "--window-ms", "-1"], "--window-ms must be > 0"),
    (["ok.csv", "--window-ms", "1e9"], "is not valid for a trace"),
    (["ok.csv", "--seed", "-3"], "--seed must be ≥ 0"),
    (["ok.csv", "-o", "ok.csv"], "-o ok.csv: .csv is the extension of CSV files, but -o writes JSON"),
    (["trace", "-o", "trace"], "is also the input TRACE"),
    (["ok.csv", "-o", "."], "write to a regular file"),
])
def test_cli_bad_input_one_line_exit_2(tmp_path, args, needle, capsys, monkeypatch):
    monkeypatch.chdir(tmp_path)
    _write(tmp_path / "few.csv", np.arange(50.0))
    _write(tmp_path / "unsorted.csv", np.r_[np.arange(300.0), 1.0], header=False)
    _write(tmp_path / "ok.csv", _poisson(400))
    _write(tmp_path / "trace", _poisson(400))  # no extension: a name the JSON output may take
    before = set(os.listdir(tmp_path))
    assert main(["fit-arrivals", *args]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and err[0].startswith("smdp-batch: error: ") and needle in err[0], err
    assert set(os.listdir(tmp_path)) == before
