"""A c-server table written by ``solve --instances c -o FILE``: it reads back as the solve's table with its count, the
runtime, simulate, evaluate and export run it on that many instances, and a file whose count was changed is refused."""

from __future__ import annotations

import json

import h5py
import numpy as np
import pytest

from smdp_batch.analysis.simulate import simulate
from smdp_batch.cli import main
from smdp_batch.errors import PolicyFileError
from smdp_batch.model.problem import BatchingProblem
from smdp_batch.runtime import DynamicBatcher, PolicyTable
from smdp_batch.runtime.schema import read_policy
from smdp_batch.solvers.multi_pi import solve_instances

ARGS = ["--instances", "2", "--batch-sizes", "1,2,4,8", "--service", "exp", "--rho", "0.6"]


@pytest.fixture(scope="module")
def written(tmp_path_factory):
    path = str(tmp_path_factory.mktemp("c2") / "c2.h5")
    assert main(["solve", *ARGS, "--idle-power", "3", "-o", path, "--json"]) == 0
    return path


def _problem():
    return BatchingProblem.from_rho(0.6, instances=2, service="exp", batch_sizes="1,2,4,8")


def test_the_file_holds_the_solves_table_its_count_and_its_exact_metrics(written):
    sol = solve_instances(_problem(), idle_power_w=3.0)
    pf = read_policy(written)
    np.testing.assert_array_equal(pf.policy[:-1], sol.table)
    assert pf.inputs["instances"] == 2 and pf.inputs["idle_power_w"] == 3.0 and pf.inputs["phases"] == 1
    assert pf.integrity == "fletcher32+sha256" and pf.truncation["boundary"] == "tail"
    assert pf.solution["avg_cost"] == pytest.approx(sol.table_eval.avg_cost, rel=1e-12)
    R = pf.converged_upto
    assert R is not None and np.all(pf.policy[R:] == pf.policy[R]) and 2 * R <= pf.s_max
    table = PolicyTable.load(written)
    assert table.instances == 2 and "2 instances" in repr(table)


def test_the_runtime_runs_it_on_its_own_count_only(written):
    with pytest.raises(ValueError, match="solved for 2 instances sharing the queue; pass instances=2"):
        DynamicBatcher(lambda xs: xs, written)
    DynamicBatcher(lambda xs: xs, written, instances=2)


def test_evaluate_and_simulate_run_it_on_its_instances(written, capsys):
    sol = solve_instances(_problem(), idle_power_w=3.0)
    assert main(["evaluate", "--policy", written, "--json"]) == 0
    d = json.loads(capsys.readouterr().out)
    assert d["instances"] == 2 and d["avg_cost"] == pytest.approx(sol.table_eval.avg_cost, rel=1e-9)
    assert main(["simulate", "--policy", written, "--requests", "200000", "--json"]) == 0
    s = json.loads(capsys.readouterr().out)
    direct = simulate(_problem(), np.asarray(sol.table), requests=200_000, seed=0, idle_power_w=3.0)
    assert s["instances"] == 2 and s["mean_latency_ms"] == pytest.approx(direct.mean_latency_ms, rel=1e-12)
    assert s["mean_power_w"] == pytest.approx(direct.mean_power_w, rel=1e-12)  # the file's idle power, 3 W
    for k, exact in (("mean_latency_ms", sol.table_eval.mean_latency_ms), ("mean_power_w", sol.table_eval.mean_power_w)):
        assert abs(s[k] - exact) <= 3 * s[k.replace("_ms", "_ci_ms") if k.endswith("_ms") else "mean_power_ci_w"], k
    assert main(["show", written]) == 0
    out = capsys.readouterr().out
    assert "instances   2 sharing the queue" in out and "ρ = 0.6 per instance" in out


def test_export_tunes_the_server_rule_on_its_instances_and_needs_an_slo(written, capsys):
    assert main(["export", written, "--to", "triton"]) == 2
    err = capsys.readouterr().err
    assert "a table for 2 instances" in err and err.count("\n") == 1
    assert main(["export", written, "--to", "triton", "--slo-p99-ms", "40", "--requests", "20000"]) == 0
    assert "count: 2" in capsys.readouterr().out


def test_a_file_whose_instance_count_was_changed_is_refused(written, tmp_path):
    bad = tmp_path / "bad.h5"
    bad.write_bytes(open(written, "rb").read())
    with h5py.File(bad, "r+") as f:
        f["inputs"].attrs["instances"] = 3
    with pytest.raises(PolicyFileError, match="rho"):  # ρ per instance no longer matches λ
        read_policy(bad)
    with h5py.File(bad, "r+") as f:
        f["inputs"].attrs["instances"] = 2
        f["inputs"].attrs["idle_power_w"] = 0.0
    with pytest.raises(PolicyFileError, match="checksum"):
        read_policy(bad)
    with h5py.File(bad, "r+") as f:
        f["inputs"].attrs["idle_power_w"] = 3.0
        f["inputs"].attrs["phases"] = 2
    with pytest.raises(PolicyFileError, match="checksum"):
        read_policy(bad)
    with h5py.File(bad, "r+") as f:
        f["inputs"].attrs["instances"] = 99
    with pytest.raises(PolicyFileError, match="instances"):
        read_policy(bad)
