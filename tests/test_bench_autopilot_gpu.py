"""``benchmarks/bench_autopilot_gpu.py`` without a GPU (``--backend numpy``): the run a GPU machine makes, on a short
trace, so that it cannot break where no GPU is there to show it."""

import json
import math
import subprocess
import sys
from pathlib import Path

import pytest


@pytest.mark.slow
@pytest.mark.cpu_heavy  # a real-time load on the CPU: it would disturb a timed server test beside it
def test_the_gpu_benchmark_answers_every_request_and_says_where_each_p99_went(tmp_path):
    """Every request of every phase is answered (a static table whose plan had no timer, followed exactly, once left
    the trace's last requests waiting for ever for an arrival), and each phase splits its p99 into the client's lag,
    the wait, the model and the return, with the served batch time over the profile's."""
    script = Path(__file__).resolve().parents[1] / "benchmarks" / "bench_autopilot_gpu.py"
    out = tmp_path / "gpu.json"
    run = subprocess.run([sys.executable, str(script), "--backend", "numpy", "--sizes", "8", "--repeats", "5",
                          "--phase-seconds", "1", "--only", "static table,tuned triton", "--json", str(out)],
                         capture_output=True, text=True, timeout=400)
    assert run.returncode == 0, run.stderr[-2000:]
    res = json.loads(out.read_text())
    assert set(res["settings"]) == {"static table", "tuned triton"}
    assert res["measure"]["energy_source"] == "constant" and res["measure"]["idle_power_w"] is None
    for name, s in res["settings"].items():
        assert s["errors"] == 0, name
        assert len(s["rows"]) == 5
        for r in s["rows"]:
            assert r["requests"] > 0 and r["answered"] == r["requests"], (name, r)
            for k in ("p99_ms", "client_lag_p99_ms", "wait_p99_ms", "model_p99_ms", "return_p99_ms",
                      "served_over_profile"):
                assert math.isfinite(r[k]) and r[k] >= 0, (name, k, r)
    assert "p99 ms of:   lag  wait model return  served/profile  | full GCs, longest ms  | board: SM MHz" in run.stdout
    assert res["gc"] == "freeze"  # the default: the collector frozen before each setting, its full collections counted
    for r in res["settings"]["static table"]["rows"]:  # no NVML here: the board columns say so, not 0
        assert r["gc_full"] >= 0 and r["gc_max_ms"] >= 0
        assert all(math.isnan(r[k]) for k in ("sm_clock_mhz", "power_capped", "thermal_slowdown")), r
