"""Issue 19 items 1–3: ``smdp-batch measure`` / ``smdp_batch.measure``, the monotone profile fit, and the ONNX example
end to end (measured on this CPU, solved, exported, served by the runtime)."""

import asyncio
import json
import time
from pathlib import Path

import numpy as np
import pytest

from smdp_batch import BatchingProblem, solve
from smdp_batch.cli import main
from smdp_batch.errors import InputError
from smdp_batch.measure import measure
from smdp_batch.model.profile import ProfileCurve, read_profile
from smdp_batch.model.spec import parse_curve

ROOT = Path(__file__).resolve().parent.parent
SIZES = (1, 2, 4, 8, 16, 32)
pytest.importorskip("onnxruntime")
pytest.importorskip("onnx")


def _busy(ms: float) -> None:
    end = time.perf_counter() + ms / 1e3
    while time.perf_counter() < end:
        pass


# ------------------------------------------------------------------ the ONNX model measured on this CPU
@pytest.fixture(scope="module")
def mlp_runs(tmp_path_factory):
    from examples import onnx_mlp

    tmp = tmp_path_factory.mktemp("mlp")
    runs = []
    for k in range(2):
        m = measure(onnx_mlp.infer, onnx_mlp.make_batch, sizes=SIZES, warmup=3, repeats=12, progress=False)
        path, sidecar = m.write(tmp / f"mlp{k}.csv")
        runs.append((m, path, sidecar))
    return runs


def test_measured_profile_is_read_by_profile_and_solve(mlp_runs, capsys):
    m, path, sidecar = mlp_runs[0]
    meta = json.loads(Path(sidecar).read_text())
    assert meta["sizes"] == list(SIZES) and meta["repeats"] == 12 and meta["complete"] and meta["energy_source"] == "none"
    assert "onnxruntime" in meta["libraries"] and meta["host"] and meta["date"]
    assert read_profile(path).sizes.tolist() == list(SIZES)
    assert main(["profile", path, "--json"]) == 0
    rep = json.loads(capsys.readouterr().out)
    assert rep["rows"] == 72 and rep["latency"]["default_fit"] == "monotone"
    assert main(["solve", "--latency", f"csv:{path}", "--batch-sizes", "1,2,4,8,16,32", "--rho", "0.5", "--json"]) == 0
    assert json.loads(capsys.readouterr().out)["converged"]


def _disagreements(a, b) -> list:
    out = []
    for ra, rb in zip(a.summary(), b.summary()):
        se = np.hypot(ra["std_latency_ms"] / np.sqrt(ra["samples"]), rb["std_latency_ms"] / np.sqrt(rb["samples"]))
        slack = max(0.25, 0.3 * min(ra["mean_latency_ms"], rb["mean_latency_ms"]))  # a whole run slowed (CI: 9.6 vs 6.4 ms)
        if abs(ra["mean_latency_ms"] - rb["mean_latency_ms"]) > 5 * se + slack:
            out.append((ra, rb))
    return out


def test_two_runs_agree_within_their_spread(mlp_runs):
    """Per-size means within 5 standard errors of their difference, plus 0.25 ms or 30 % of the smaller mean
    (whichever is more) for a loaded 2-core machine.

    One retry with a fresh pair, measured size by size alternately: on this shared VM a whole run can be slowed
    by a quarter (seen: 2.28 against 2.88 ms at b = 16, 1 in 2 runs one evening), which no per-run spread shows."""
    from examples import onnx_mlp

    (a, *_), (b, *_) = mlp_runs
    bad = _disagreements(a, b)
    if bad:
        pairs = [[measure(onnx_mlp.infer, onnx_mlp.make_batch, sizes=(s,), warmup=3, repeats=12, progress=False)
                  for _ in range(2)] for s in SIZES]
        for x, y in pairs:
            assert not _disagreements(x, y), (bad, _disagreements(x, y))


def test_a_known_latency_is_recovered():
    """Busy-wait of (0.5 + 0.1·b) ms: an affine fit of the per-size minima recovers slope and intercept to 15 %.
    Minima, because a busy-wait can only overshoot its deadline, and on a loaded 2-core machine (load average
    4–5 while this was written) a call preempted near its end overshoots by a whole time slice: even the
    per-size medians gave a slope of 0.2 there.  The means and spreads are what the profile keeps."""
    sizes = (1, 4, 8, 16, 24)
    m = measure(lambda batch: _busy(0.5 + 0.1 * len(batch)), sizes=sizes, warmup=1, repeats=9, progress=False)
    minima = [m.latency_ms[m.batch == b].min() for b in sizes]
    slope, intercept = np.polyfit(sizes, minima, 1)
    assert slope == pytest.approx(0.1, rel=0.15) and intercept == pytest.approx(0.5, rel=0.15)
    lat = ProfileCurve("busy", "latency", profile=m.profile("busy"))  # the rows make a profile as they are
    assert lat.fit == "monotone" and float(lat(24)) >= float(lat(1))


def test_the_budget_stops_early_and_says_so():
    m = measure(lambda batch: _busy(20), sizes=(1, 2, 4), warmup=0, repeats=5, budget_s=0.15, progress=False)
    assert not m.complete and "budget of 0.15 s ran out at b = " in m.note and 1 <= m.batch.size < 15
    assert m.meta["measured_sizes"] == sorted(set(m.batch.tolist()))


# ------------------------------------------------------------------ the monotone fit
L_TRUE = lambda b: max(2.0, 2.0 + 0.25 * (b - 4))  # flat while the batch fills idle lanes, then rising (ms)
Z_TRUE = "affine:20,30"  # mJ


def _noisy(path, seed, reps=40, noise=0.05):
    rng = np.random.default_rng(seed)
    rows = ["batch_size,latency_ms"] + [f"{b},{L_TRUE(b) * (1 + noise * rng.standard_normal()):.6f}"
                                        for b in SIZES for _ in range(reps)]
    path.write_text("\n".join(rows) + "\n")
    return str(path)


@pytest.mark.parametrize("rho, w2", [(0.3, 2.0), (0.7, 4.0)])
def test_noisy_flat_then_rising_profiles_give_the_true_policy(tmp_path, rho, w2):
    """5 % noise per measurement, 40 per size, sizes 1,2,4,…,32 (the allowed set): the default fit accepts every
    seed and gives the true curve's policy for n = 0..64.  Checked offline with this generator for seeds 0–29: at
    40 and at 160 repeats 30 of 30 agree at both (ρ, w2) here (at 10 repeats 2 of 30 differ at ρ = 0.3), while
    csv:FILE:interp refuses 27 of the 30.  Elsewhere the optimum can be knife-edge: at ρ = 0.5, w2 = 1, 9 of 30
    seeds (40 repeats) and 1 of 30 (160) pick another table, so it is not asserted there."""
    true = BatchingProblem.from_rho(rho, latency="table:" + ",".join(f"{b}={L_TRUE(b)}" for b in SIZES),
                                    energy=Z_TRUE, batch_sizes=SIZES, w2=w2)
    ref = solve(true)
    refused = 0
    for seed in (0, 1, 2):
        path = _noisy(tmp_path / f"n{seed}.csv", seed)
        try:
            parse_curve(f"csv:{path}:interp", "latency model")
        except InputError as e:
            refused += "mean latency decreases" in str(e)
        p = BatchingProblem(lam=true.lam, latency=f"csv:{path}", energy=Z_TRUE, batch_sizes=SIZES, w2=w2)
        sol = solve(p)
        assert [sol.decide(n) for n in range(65)] == [ref.decide(n) for n in range(65)], seed
    assert refused >= 1  # the data that the strict interpolation refused


def test_profile_reports_the_decreasing_sizes(tmp_path, capsys):
    path = tmp_path / "dec.csv"
    path.write_text("batch_size,latency_ms\n1,2.0\n1,2.2\n2,1.9\n2,2.0\n4,2.5\n4,2.6\n")
    assert main(["profile", str(path), "--json"]) == 0
    lat = json.loads(capsys.readouterr().out)["latency"]
    (d,) = lat["non_monotone"]
    assert (d["from_batch_size"], d["to_batch_size"]) == (1, 2) and d["drop"] == pytest.approx(0.15)
    assert d["standard_errors"] == pytest.approx(0.15 / np.hypot(0.1, 0.05) * 1, rel=1e-6)
    assert lat["monotone"]["worst_at_batch_size"] in (1, 2) and "r2" in lat["monotone"]
    assert main(["profile", str(path)]) == 0
    out = capsys.readouterr().out
    assert "mean decreases from b = 1 to b = 2 by 0.15 ms" in out and "uses the monotone fit" in out


# ------------------------------------------------------------------ the command line
@pytest.mark.parametrize("args, msg", [
    (["nosuchmodule_xyz:f"], "no module named 'nosuchmodule_xyz'"),
    (["math:nosuch"], "module math has no attribute 'nosuch'"),
    (["math:pi"], "is a float, not callable"),
    (["math"], "must be written module:function"),
    (["math:fsum", "--sizes", "0,-1"], "--sizes values must be ≥ 1"),
    (["math:fsum", "--budget-s", "0"], "--budget-s must be > 0"),
    (["math:fsum", "--make-batch", "math:nosuch"], "--make-batch 'math:nosuch'"),
])
def test_bad_input_is_one_line_exit_2(tmp_path, capsys, args, msg):
    out = tmp_path / "p.csv"
    assert main(["measure", *args, "-o", str(out)]) == 2
    err = capsys.readouterr().err
    assert err.count("smdp-batch: error:") == 1 and msg in err and "Traceback" not in err
    assert not out.exists()
    assert main(["measure", "math:fsum", "-o", str(tmp_path / "no" / "p.csv")]) == 2
    assert "does not exist" in capsys.readouterr().err
    assert main(["measure", "math:fsum", "-o", str(tmp_path)]) == 2
    assert "is a directory" in capsys.readouterr().err


def test_no_energy_counter_gives_one_notice_and_latency_only(tmp_path, capsys):
    out = tmp_path / "p.csv"
    assert main(["measure", "math:fsum", "--sizes", "1,2", "--repeats", "3", "--warmup", "0", "-o", str(out)]) == 0
    err = capsys.readouterr().err
    notices = [line for line in err.splitlines() if line]
    assert len(notices) == 1 and notices[0].startswith("smdp-batch: note: no energy counter") and "--power-w" in notices[0]
    assert out.read_text().splitlines()[0] == "batch_size,latency_ms" and len(out.read_text().splitlines()) == 7
    assert json.loads(Path(f"{out}.json").read_text())["energy_source"] == "none"


def test_power_w_gives_an_energy_column(tmp_path, capsys):
    out = tmp_path / "p.csv"
    assert main(["measure", "math:fsum", "--sizes", "1,2", "--repeats", "3", "--power-w", "70", "-o", str(out),
                 "--json"]) == 0
    d = json.loads(capsys.readouterr().out)
    assert d["energy_source"] == "constant" and d["complete"] and d["rows"] == 6
    prof = read_profile(str(out))
    assert prof.energy == pytest.approx(70 * prof.latency, rel=1e-6)


# ------------------------------------------------------------------ the worked example, end to end
def test_onnx_example_end_to_end(tmp_path, monkeypatch, capsys):
    """measure (the CLI, from the repository root) → profile → solve → export to Triton → DynamicBatcher serving
    the real ONNX session under a short Poisson load: every caller gets its own logits."""
    from examples import onnx_mlp
    from smdp_batch.runtime import DynamicBatcher, PolicyTable

    monkeypatch.chdir(ROOT)
    prof, pol = tmp_path / "mlp.csv", tmp_path / "mlp.h5"
    assert main(["measure", "examples.onnx_mlp:infer", "--make-batch", "examples.onnx_mlp:make_batch",
                 "--sizes", "1,2,4,8,16,32", "--repeats", "8", "--power-w", "65", "-o", str(prof), "--quiet"]) == 0
    assert main(["profile", str(prof)]) == 0
    assert main(["solve", "--latency", f"csv:{prof}", "--energy", f"csv:{prof}",
                 "--rho", "0.3", "--w2", "0.05", "-o", str(pol)]) == 0
    assert main(["export", str(pol), "--to", "triton", "--requests", "2000", "-o", str(tmp_path / "config.pbtxt")]) == 0
    assert "dynamic_batching" in (tmp_path / "config.pbtxt").read_text()
    capsys.readouterr()

    table = PolicyTable.load(pol)
    rng = np.random.default_rng(5)
    items = [rng.standard_normal(onnx_mlp.DIM).astype(np.float32) for _ in range(150)]
    expected = onnx_mlp.infer(np.stack(items))

    async def run():
        batcher = DynamicBatcher(onnx_mlp.infer_async, table, max_wait_ms=50)
        tasks = []
        for x in items:
            tasks.append(asyncio.create_task(batcher.submit(x)))
            await asyncio.sleep(rng.exponential(1 / (table.lam * 1e3)))
        out = await asyncio.wait_for(asyncio.gather(*tasks), 30)
        await batcher.close()
        return out, batcher.metrics

    out, metrics = asyncio.run(run())
    assert np.allclose(np.stack(out), expected, rtol=1e-4, atol=1e-4)
    assert metrics.completed == len(items) and metrics.failed == 0


def test_the_onnx_example_builds_the_heavy_variant_as_one_model_of_summed_copies():
    """``build_model(copies=N)``: N MLPs with weights of their own (seeds 0…N−1) on one input, logits summed — what
    a server loads to run the benchmark's heavy variant (the MLP four times per batch); ``copies=1`` is the MLP."""
    import onnxruntime as ort

    from examples import onnx_mlp

    def run(model, x):
        opts = ort.SessionOptions()
        opts.intra_op_num_threads = opts.inter_op_num_threads = 1
        return ort.InferenceSession(model.SerializeToString(), opts, providers=["CPUExecutionProvider"]).run(
            ["logits"], {"x": x})[0]

    x = onnx_mlp.make_batch(3)
    two = run(onnx_mlp.build_model(copies=2), x)
    assert two.shape == (3, onnx_mlp.CLASSES)
    np.testing.assert_allclose(two, run(onnx_mlp.build_model(seed=0), x) + run(onnx_mlp.build_model(seed=1), x),
                               rtol=1e-4, atol=1e-5)
    np.testing.assert_array_equal(run(onnx_mlp.build_model(copies=1), x), onnx_mlp.infer(x))
    with pytest.raises(ValueError, match="copies"):
        onnx_mlp.build_model(copies=0)
