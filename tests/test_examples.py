"""The example HTTP server (examples/): a short bounded run on 127.0.0.1 against the model."""

import os
import sys

import pytest

sys.path.insert(0, os.path.join(os.path.dirname(__file__), "..", "examples"))


@pytest.mark.slow
@pytest.mark.servers
def test_example_server_follows_the_model():
    """300 Poisson requests at ρ = 0.5 through FastAPI + DynamicBatcher: no errors, and mean latency and power
    within the run's own noise of the table's exact W̄ and P̄.

    The bounds come from the run, not a fixed factor: 4 standard errors (batch means over arrival order for
    W̄; energy shares and the Poisson span for P̄), plus, for W̄, four times the event loop's mean lateness per
    batch (a late batch delays its own requests and the queue behind it; the server measures it).  The noise
    itself must be small, so a run too short to say anything fails.

    The claim holds for the model's input: Poisson arrivals and timers that fire on time.  A run in which the
    load generator left a request, or the server woke from a batch, more than W̄/2 late did not get that
    input (a starved 2-core CI machine: one client stall of 7 model ms took W̄ from 6.0 to 7.9 ms); it is
    run again, at most four times in all, and the first undisturbed run is judged.  Time scale 50 keeps one
    scheduler hiccup small in model time.  The standard errors come from batch means over 300 requests, a crude
    estimate: one full-suite run measured W̄ 4.5 % *below* the model, 4.07 of its standard errors.  So a run
    outside its bounds is judged again on a fresh stream (another seed), and the test fails when two undisturbed
    runs miss: a real bias misses in both."""
    import run_demo

    def misses(row) -> list:
        w, p = row["model_latency_ms"], row["model_power_w"]
        bad = []
        if not (row["latency_se_ms"] < 0.1 * w and row["power_se_w"] < 0.15 * p):
            bad.append("too noisy to say anything")
        if abs(row["measured_latency_ms"] - w) > 4 * row["latency_se_ms"] + 4 * max(row["overrun_ms"], 0.0):
            bad.append("W̄ off the model")
        if abs(row["measured_power_w"] - p) > 4 * row["power_se_w"]:
            bad.append("P̄ off the model")
        return bad

    runs, judged = [], []
    for seed in (1, 2, 3, 4):
        (row,) = run_demo.run([0.5], requests=300, scale=50.0, seed=seed, with_ray=False)
        assert row["errors"] == 0 and row["requests"] == 300
        runs.append(row)
        if max(row["send_late_max_ms"], row["max_overrun_ms"]) > 0.5 * row["model_latency_ms"]:
            continue  # disturbed by the machine: not the model's input
        judged.append((misses(row), row))
        if not judged[-1][0] or len(judged) == 2:
            break
    if not judged:
        pytest.fail(f"every run was disturbed by the machine (a send or a batch more than W̄/2 late): {runs}")
    assert any(not bad for bad, _ in judged), judged  # one undisturbed run within its bounds
