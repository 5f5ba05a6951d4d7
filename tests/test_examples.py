"""The example HTTP server (examples/): a short bounded run on 127.0.0.1 against the model."""

import os
import sys

import pytest

sys.path.insert(0, os.path.join(os.path.dirname(__file__), "..", "examples"))


@pytest.mark.slow
def test_example_server_follows_the_model():
    """300 Poisson requests at ρ = 0.5 through FastAPI + DynamicBatcher: no errors, and mean latency and
    power near the table's exact W̄ and P̄ (loose bounds for a short run on a shared machine; the README
    reports the 2000-request run)."""
    import run_demo

    (row,) = run_demo.run([0.5], requests=300, scale=20.0, seed=1, with_ray=False)
    assert row["errors"] == 0 and row["requests"] == 300
    assert 0.8 < row["latency_ratio"] < 1.25
    assert 0.8 < row["power_ratio"] < 1.2
