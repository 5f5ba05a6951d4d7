"""Per-bin SMDP batching against multi-bin batching with fixed B (issue 6, 'beyond the papers')."""

import json

import numpy as np
import pytest

from smdp_batch.cli import main
from smdp_batch.llm import binsim as bs
from smdp_batch.llm import multibin as mb
from smdp_batch.llm.perbin import solve_bins
from smdp_batch.llm.sweep import multibin_sweep

U = bs.parse_request_law("uniform:1,20")


def test_one_bin_simulation_reproduces_the_smdp_exact_latency():
    pol = solve_bins(1.0, [1.0, 20.0], U, 128)
    exact = pol.solutions[0].deployed.mean_latency_ms
    rng = np.random.default_rng(0)
    n = 200_000
    x = U.sample(rng, n)
    arr = bs.poisson_times(1.0, n, rng)
    r = bs.simulate_bins(arr, x, np.zeros(n, np.int64), 1, 128, tables=pol.tables, warmup=0.05)
    assert r.mean_latency == pytest.approx(exact, rel=0.01)
    assert pol.mean_latency == pytest.approx(exact)
    # the in-bin law is the max of b uniforms: l(b) = 1 + 19·b/(b+1)
    p = pol.solutions[0].problem
    np.testing.assert_allclose(p.latency_ms()[:4], 1 + 19 * np.arange(1, 5) / np.arange(2, 6))


def test_per_bin_smdp_beats_fixed_B_at_equal_throughput():
    """Documented scenario: paper 000's Fig. 3 law U[1, 20], B = 128, k = 2 equal-mass bins, one server."""
    rows = multibin_sweep([1.0, 4.0], k=2, B=128, n=60_000, max_waits=(10, 20, 40, 80), seed=1)
    by = {(r["lam"], r["scheme"]): r for r in rows}
    for lam in (1.0, 4.0):
        fixed, tuned, smdp = (by[(lam, s)] for s in ("fixed B", "fixed B, best max-wait", "per-bin SMDP"))
        for r in (fixed, tuned, smdp):
            assert r["throughput"] == pytest.approx(lam, rel=0.02)  # all stable: throughput = λ
        assert smdp["mean_latency"] < tuned["mean_latency"] < fixed["mean_latency"]
        assert smdp["p95_latency"] < fixed["p95_latency"]
    # the fixed rule's latency at low load is Lemma 5.1's (one server, low load)
    assert by[(1.0, "fixed B")]["mean_latency"] == pytest.approx(mb.uniform_latency(1.0, 2, 128, 1, 20), rel=0.02)


def test_cli_multibin_and_llm(capsys, tmp_path):
    assert main(["multibin", "--lam-grid", "2", "--requests", "5000", "--no-smdp", "--max-waits", "20", "--json"]) == 0
    out = json.loads(capsys.readouterr().out)
    assert {r["scheme"] for r in out["rows"]} == {"fixed B", "fixed B, best max-wait"}
    assert out["theory"]["c_max"] == pytest.approx(128 / 10.5)
    assert main(["llm", "--lam-grid", "1", "--requests", "60", "--schemes", "continuous,bucketserve,mem-aware",
                 "--json"]) == 0
    rows = json.loads(capsys.readouterr().out)["rows"]
    assert len(rows) == 3 and all(r["peak_memory_share"] <= 1.0 for r in rows)
    png = tmp_path / "f.png"
    assert main(["llm", "--lam-grid", "1", "--requests", "40", "--schemes", "static", "--plot", str(png)]) == 0
    assert png.stat().st_size > 1000
    capsys.readouterr()
    for argv in (["llm", "--schemes", "foo"], ["multibin", "--law", "uniform:3"], ["llm", "--mem-gib", "-1"],
                 ["multibin", "--bins", "0"], ["llm", "--plot", str(tmp_path / "x.gif")]):
        assert main(argv) == 2
        err = capsys.readouterr().err
        assert err.startswith("smdp-batch: error:") and err.count("\n") == 1


def test_per_bin_tables_on_the_llm_engine():
    from smdp_batch.llm.engine import LLMModel, run
    from smdp_batch.llm.perbin import engine_batch_times, solve_engine_bins
    from smdp_batch.llm.schedulers import PerBinTables, StaticBatching
    from smdp_batch.llm.sweep import llm_sweep
    from smdp_batch.llm.workload import Requests, synthetic

    m = LLMModel()
    # the batch-time formula is the engine's own run-to-completion time
    p, o = np.array([120, 80, 200]), np.array([40, 7, 90])
    r = run(Requests(np.zeros(3), p, o), StaticBatching(3), m)
    assert r.latency.max() == pytest.approx(engine_batch_times(m, p, o), rel=1e-12)
    req = synthetic(300, 0.5, seed=4)
    e = np.array([0.0, float(np.median(req.output)), np.inf])
    pol = solve_engine_bins(0.5, e, req.prompt, req.output, m, 8, samples=100)
    assert pol.tables.shape[0] == 2 and np.all(pol.tables[:, 1:].max(axis=1) > 0)
    assert pol.rates.sum() == pytest.approx(0.5)
    r = run(req, PerBinTables(e, pol.tables), m)
    assert np.all(np.isfinite(r.latency)) and r.peak_tokens <= m.cap_tokens
    # beyond a bin's capacity the SMDP is unstable: the sweep notes it instead of failing
    rows = llm_sweep([50.0], n=50, schemes=["perbin-smdp"], static_batch=4)
    assert "unstable" in rows[0]["note"]
