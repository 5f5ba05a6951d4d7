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
    run again, at most three times in all, and the first undisturbed run is judged.  Time scale 50 keeps one
    scheduler hiccup small in model time."""
    import run_demo

    runs = []
    for _ in range(3):
        (row,) = run_demo.run([0.5], requests=300, scale=50.0, seed=1, with_ray=False)
        assert row["errors"] == 0 and row["requests"] == 300
        runs.append(row)
        w = row["model_latency_ms"]
        if max(row["send_late_max_ms"], row["max_overrun_ms"]) <= 0.5 * w:
            break
    else:
        pytest.fail(f"every run was disturbed by the machine (a send or a batch more than W̄/2 late): {runs}")
    w, p = row["model_latency_ms"], row["model_power_w"]
    assert row["latency_se_ms"] < 0.1 * w and row["power_se_w"] < 0.15 * p
    assert abs(row["measured_latency_ms"] - w) <= 4 * row["latency_se_ms"] + 4 * max(row["overrun_ms"], 0.0), row
    assert abs(row["measured_power_w"] - p) <= 4 * row["power_se_w"], row
