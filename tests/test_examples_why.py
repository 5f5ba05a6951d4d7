"""The Autopilot examples say plainly why a phase missed its SLO, from the figures the run measured."""

from __future__ import annotations

import os
import sys

import pytest

pytest.importorskip("onnxruntime")  # the examples' MLP
sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
from examples.autopilot_common import why_missed  # noqa: E402


def test_each_measured_cause_is_named_with_its_figure():
    m = {"latency_hat_ms": [40.0, 50.0, 60.0, 70.0, 80.0, 90.0], "batches": [10, 10, 10, 10, 10, 2],
         "infeasible": 1, "observed_p99_ms": 700.0, "responses_from": "batcher"}
    why = why_missed(m, 0.1, 50.0, 10.0, 31.0)
    assert "× the profile its first table was planned on (benchmarks/data/onnx_mlp_cpu.csv" in why
    assert "1 solve(s) found no table" in why and "mean 31.0 of 32" in why
    assert "batcher alone took p99 700 ms, beyond the SLO less the 10 ms" in why
    # told the end-to-end times, its p99 is not the batcher's: that clause is left out
    assert "batcher alone" not in why_missed(dict(m, responses_from="served"), 0.1, 50.0, 10.0, 31.0)


def test_with_nothing_measured_against_it_the_budget_outside_is_named():
    m = {"latency_hat_ms": [], "batches": [], "infeasible": 0, "observed_p99_ms": 30.0}
    assert why_missed(m, 0.1, 50.0, 10.0, 3.0) == ("the time outside the server's batcher took more than the 10 ms "
                                                   "left to it (OVERHEAD_MS)")


def test_planned_on_this_hosts_own_profile_the_miss_names_the_shared_cores(tmp_path):
    from examples.autopilot_common import PROFILE, problem, served_speed

    here = tmp_path / "here.csv"
    here.write_text(open(PROFILE).read())
    m = {"latency_hat_ms": [1.5 * x for x in problem(0.1).latency_ms()], "batches": [10] * 6, "infeasible": 0,
         "observed_p99_ms": 30.0}
    assert served_speed(m, problem(0.1).latency_ms()) == pytest.approx((1.5, 1.5))
    why = why_missed(m, 0.1, 50.0, 10.0, float("nan"), profile=str(here))
    assert why.startswith("the model ran at 1.5–1.5 × the profile its first table was planned on (measured on this "
                          "host alone: the client, the server and the model share its cores)")
