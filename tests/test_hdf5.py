"""HDF5 policy tables: round trip, validation, atomic writes."""

import os

import h5py
import numpy as np
import pytest

from smdp_batch import BatchingProblem, PolicyFileError, solve
from smdp_batch.export import write_policy
from smdp_batch.runtime import SCHEMA_VERSION, read_policy


@pytest.fixture(scope="module")
def sol():
    return solve(BatchingProblem.basic(rho=0.5, w2=1.0))


def test_round_trip(tmp_path, sol):
    path = write_policy(sol, tmp_path / "p.h5")
    pf = read_policy(path)
    np.testing.assert_array_equal(pf.policy, sol.policy)
    assert pf.meta["format"] == "smdp-batch-policy" and pf.meta["schema_version"] == SCHEMA_VERSION
    assert pf.meta["units_time"] == "ms" and pf.meta["units_power"] == "W"
    assert pf.inputs["lam"] == sol.problem.lam and pf.inputs["service"] == "det"
    assert pf.inputs["latency"] == "affine:0.3051,1.0524"
    assert list(pf.inputs["batch_sizes"]) == list(range(1, 33))
    assert pf.truncation["s_max"] == sol.s_max and pf.truncation["abstract_cost"] == 0.0
    assert pf.truncation["boundary"] == "tail" and pf.truncation["delta"] < 1e-3
    assert pf.solution["avg_cost"] == pytest.approx(38.86, abs=5e-3)
    assert bool(pf.solution["converged"]) and pf.solution["solver"] == "pi"
    assert pf.decide(0) == int(sol.policy[0]) and pf.decide(10**6) == int(sol.policy[sol.s_max])
    assert [f for f in os.listdir(tmp_path) if f != "p.h5"] == []  # no temp files left


def test_rejects_other_files(tmp_path, sol):
    junk = tmp_path / "junk.h5"
    junk.write_text("not hdf5")
    with pytest.raises(PolicyFileError, match="not an HDF5 file"):
        read_policy(junk)
    other = tmp_path / "other.h5"
    with h5py.File(other, "w") as f:
        f.attrs["format"] = "something-else"
    with pytest.raises(PolicyFileError, match="not a smdp-batch policy table"):
        read_policy(other)
    newer = write_policy(sol, tmp_path / "newer.h5")
    with h5py.File(newer, "a") as f:
        f.attrs["schema_version"] = SCHEMA_VERSION + 1
    with pytest.raises(PolicyFileError, match="schema_version=2"):
        read_policy(newer)
    with pytest.raises(PolicyFileError, match="does not exist"):
        read_policy(tmp_path / "missing.h5")


def test_failed_write_leaves_nothing(tmp_path, sol, monkeypatch):
    target = tmp_path / "p.h5"
    import smdp_batch.export.hdf5 as mod

    monkeypatch.setattr(mod, "_creator", lambda: (_ for _ in ()).throw(RuntimeError("disk full")))
    with pytest.raises(RuntimeError):
        write_policy(sol, target)
    assert os.listdir(tmp_path) == []
