"""The smdp-batch command line (DESIGN.md §4): output, JSON keys, one-line errors with exit code 2."""

import json
import os
import subprocess
import sys

import pytest

from smdp_batch.cli import main

KEYS = {"lam", "rho", "s_max", "abstract_cost", "iterations", "converged", "avg_cost", "delta", "mean_latency_ms",
        "mean_power_w", "throughput", "policy", "control_limit", "solve_seconds"}


def run(args, capsys):
    rc = main(args)
    out = capsys.readouterr()
    return rc, out.out, out.err


def test_default_solve_is_paper_basic_scenario(capsys):
    rc, out, err = run(["solve"], capsys)
    assert rc == 0, err
    assert "ρ = 0.5" in out and "batch sizes 1..32" in out and "n=0–6: wait" in out
    assert "ĝ = 38.8599" in out


def test_solve_json_keys_and_file(tmp_path, capsys):
    out_file = tmp_path / "t.h5"
    rc, out, err = run(["solve", "--rho", "0.7", "--w2", "1.6", "--json", "-o", str(out_file)], capsys)
    assert rc == 0, err
    d = json.loads(out)
    assert KEYS <= d.keys()
    assert d["converged"] is True and len(d["policy"]) == d["s_max"] + 2
    assert d["mean_latency_ms"] == pytest.approx(6.90, rel=5e-3)
    rc, out, err = run(["evaluate", "--policy", str(out_file), "--json"], capsys)
    assert rc == 0, err
    e = json.loads(out)
    assert KEYS <= e.keys() and e["mean_latency_ms"] == pytest.approx(d["mean_latency_ms"], rel=1e-6)
    rc, out, err = run(["show", str(out_file)], capsys)
    assert rc == 0 and "smdp-batch-policy v1" in out


def test_evaluate_baselines(capsys):
    rc, out, _ = run(["evaluate", "--policy", "static:8", "--rho", "0.7", "--json"], capsys)
    d = json.loads(out)
    assert rc == 0 and d["mean_power_w"] == pytest.approx(46.27, rel=5e-3) and d["control_limit"] is None
    rc, out, _ = run(["evaluate", "--policy", "control:5", "--json"], capsys)
    assert rc == 0 and json.loads(out)["control_limit"] == 5
    rc, out, _ = run(["solve", "--solver", "rvi", "--smax", "70", "--rho", "0.9", "--json"], capsys)
    d = json.loads(out)
    assert rc == 0 and d["iterations"] == 1482 and d["avg_cost"] == pytest.approx(66.1377, rel=2e-4)


BAD = [
    (["solve", "--rho", "1.2"], "ρ must lie in (0, 1)"),
    (["solve", "--lam", "5"], "maximum stable λ"),
    (["solve", "--lam", "-1"], "λ"),
    (["solve", "--lam", "1", "--rho", "0.5"], "either --lam or --rho"),
    (["solve", "--bmin", "5", "--bmax", "3"], "Bmin (5) must be ≤ Bmax (3)"),
    (["solve", "--smax", "10"], "s_max must be an integer ≥ Bmax = 32"),
    (["solve", "--w2", "-1"], "w2 must be ≥ 0"),
    (["solve", "--w1", "nan"], "--w1 must be finite"),
    (["solve", "--latency", "affine:-0.1,10"], "non-decreasing"),
    (["solve", "--energy", "affine:inf,1"], "finite"),
    (["solve", "--service", "weibull"], "unknown service law"),
    (["solve", "--solver", "magic"], "unknown solver"),
    (["solve", "--bogus"], "No such option"),
    (["evaluate", "--policy", "static:8", "--rho", "0.9"], "does not stabilise"),
    (["evaluate", "--policy", "lifo"], "unknown policy"),
]


@pytest.mark.parametrize("args, message", BAD, ids=lambda x: " ".join(x) if isinstance(x, list) else "")
def test_bad_input_one_line_exit_2(args, message, capsys):
    rc, out, err = run(args, capsys)
    assert rc == 2
    lines = err.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith("smdp-batch: error: ") and message in lines[0]
    assert "Traceback" not in err


def test_bad_policy_files(tmp_path, capsys):
    junk = tmp_path / "junk.h5"
    junk.write_text("x")
    for args in (["show", str(junk)], ["evaluate", "--policy", str(junk)], ["show", str(tmp_path / "none.h5")]):
        rc, _, err = run(args, capsys)
        assert rc == 2 and len(err.strip().splitlines()) == 1


def test_newer_schema_refused(tmp_path, capsys):
    import h5py

    path = tmp_path / "t.h5"
    assert run(["solve", "-o", str(path)], capsys)[0] == 0
    with h5py.File(path, "a") as f:
        f.attrs["schema_version"] = 99
    rc, _, err = run(["show", str(path)], capsys)
    assert rc == 2 and "schema_version=99" in err and len(err.strip().splitlines()) == 1


def test_no_output_file_on_error(tmp_path, capsys):
    target = tmp_path / "x.h5"
    rc, _, _ = run(["solve", "--rho", "1.5", "-o", str(target)], capsys)
    assert rc == 2 and not target.exists() and os.listdir(tmp_path) == []


def test_console_script_exit_code():
    """The installed entry point (as a subprocess) exits 2 on bad input."""
    r = subprocess.run([sys.executable, "-m", "smdp_batch", "solve", "--rho", "2"], capture_output=True, text=True)
    assert r.returncode == 2 and r.stderr.count("\n") == 1 and "Traceback" not in r.stderr


def test_unknown_backend_is_one_line_exit_2(capsys):
    rc, out, err = run(["solve", "--backend", "cuda"], capsys)
    assert rc == 2 and "unknown backend 'cuda'" in err and "valid: numba, jax" in err
    assert "Traceback" not in err and len(err.strip().splitlines()) == 1
