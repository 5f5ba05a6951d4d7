"""`smdp-batch pareto` and `smdp-batch tables`: outputs, figures, SLO pick written as a table, errors."""

import csv
import json
import math

import numpy as np
import pytest

from smdp_batch import BatchingProblem
from smdp_batch.cli import main
from smdp_batch.runtime import read_policy
from smdp_batch.solvers import solve

pytest.importorskip("matplotlib")

_SMALL = ["--w2-max", "3", "--points", "6", "--rtol", "0.1", "--extend", "0"]


def _png(path) -> bool:
    with open(path, "rb") as fh:
        return fh.read(8) == b"\x89PNG\r\n\x1a\n"


def test_pareto_writes_choice_csv_and_figure(tmp_path, capsys):
    out, table, fig = tmp_path / "front.csv", tmp_path / "pick.h5", tmp_path / "fig5.png"
    rc = main(["pareto", "--rho", "0.3", *_SMALL, "--no-timeouts", "--statics", "4,8,32", "--slo-mean-ms", "5", "-o", str(table),
               "--csv", str(out), "--plot", str(fig), "--json"])
    assert rc == 0
    d = json.loads(capsys.readouterr().out)
    (front,) = d["fronts"]
    chosen = front["chosen"]
    assert chosen["mean_latency_ms"] <= 5 and chosen["w2_lo"] <= chosen["w2_hi"]
    assert all(p["mean_latency_ms"] > 5 for p in front["points"] if p["mean_power_w"] < chosen["mean_power_w"])
    assert {b["setting"] for b in front["baselines"]} == {"greedy", "static:4", "static:8", "static:32"}
    assert all(b["dominated"] for b in front["baselines"])
    assert front["points"][-1]["w2_lo"] == float("inf")  # not reached by w2 ≤ 3: the least-power end, static 32
    assert front["points"][-1]["mean_power_w"] == pytest.approx(
        next(b["mean_power_w"] for b in front["baselines"] if b["setting"] == "static:32"))
    pf = read_policy(table)  # the chosen policy, as a loadable table equal to a solve at its w2
    # solved inside the chosen range: its ends may be tie weights, where the neighbouring policy is optimal too
    ref = solve(BatchingProblem.basic(rho=0.3, w2=math.sqrt(chosen["w2_lo"] * chosen["w2_hi"])))
    assert np.array_equal(pf.policy, ref.policy)
    assert (ref.deployed.mean_latency_ms, ref.deployed.mean_power_w) == pytest.approx(
        (chosen["mean_latency_ms"], chosen["mean_power_w"]), rel=1e-6)
    rows = list(csv.DictReader(open(out)))
    assert len(rows) == len(front["points"]) + len(front["baselines"])
    assert {r["kind"] for r in rows} == {"smdp", "baseline"}
    assert float(rows[0]["mean_latency_ms"]) == pytest.approx(front["points"][0]["mean_latency_ms"])
    assert _png(fig)


def test_pareto_text_reports_the_range_and_dominance(capsys):
    assert main(["pareto", "--rho", "0.3", *_SMALL, "--no-timeouts", "--slo-mean-ms", "5"]) == 0
    text = capsys.readouterr().out
    # static:16 lies under the chord from w2 = 3 to the least-power end: a short sweep says so
    assert "the front dominates 5" in text and "static:16" in text and "NOT dominated" in text and "SLO         W̄ ≤ 5 ms: least power" in text and "w2 ∈ [" in text


def test_pareto_percentile_figure_and_satisfaction_slo(tmp_path, capsys):
    fig = tmp_path / "fig6.svg"
    rc = main(["pareto", "--rho", "0.7", *_SMALL, "--timeouts", "--baseline-requests", "5000", "--simulate", "20000",
               "--slo-within", "10:95", "--plot", str(fig), "--plot-kind", "percentiles", "--json"])
    assert rc == 0
    d = json.loads(capsys.readouterr().out)
    f = d["fronts"][0]
    assert f["chosen"]["within_10ms"] >= 0.95
    assert all("p95_ms" in p and "within_10ms" in p for p in f["points"])
    assert {b["family"] for b in f["baselines"]} >= {"triton", "ray"}
    assert fig.read_text().lstrip().startswith("<?xml")


def test_pareto_several_scenarios_and_loads(tmp_path, capsys):
    fig = tmp_path / "fig8.png"
    rc = main(["pareto", "--preset", "basic,fig8-log-energy", "--rho-grid", "0.3,0.6", *_SMALL, "--no-timeouts",
               "--plot", str(fig), "--plot-kind", "scenarios", "--json"])
    assert rc == 0
    d = json.loads(capsys.readouterr().out)
    assert [(f["label"], round(f["rho"], 3)) for f in d["fronts"]] == [
        ("basic", 0.3), ("basic", 0.6), ("fig8-log-energy", 0.3), ("fig8-log-energy", 0.6)]
    assert _png(fig)


@pytest.mark.parametrize(
    "args, message",
    [
        (["--plot", "f.txt"], "must end in one of .png, .svg, .pdf"),
        (["-o", "x.h5"], "-o writes the SLO's chosen policy"),
        (["--slo-mean-ms", "5", "--slo-p95-ms", "9"], "at most one SLO"),
        (["--slo-within", "10"], "BOUND_MS:PERCENT"),
        (["--slo-within", "10:150"], "percentage in (0, 100]"),
        (["--plot-kind", "pie"], "unknown --plot-kind 'pie'"),
        (["--w2-min", "0"], "0 < w2_min < w2_max"),
        (["--rho-grid", "0.3", "--rho", "0.5"], "exclude each other"),
        (["--preset", "basic,nope"], "unknown preset 'nope'"),
        (["--simulate", "10"], "--simulate must be 0 or ≥ 1000"),
        (["--dask", "local", "--workers", "0"], "at least 1 worker"),
    ],
)
def test_pareto_bad_input_exit_2(tmp_path, monkeypatch, capsys, args, message):
    monkeypatch.chdir(tmp_path)
    assert main(["pareto", "--rho", "0.3", *args]) == 2
    err = capsys.readouterr().err
    assert err.startswith("smdp-batch: error: ") and message in err and err.count("\n") == 1
    assert list(tmp_path.iterdir()) == []  # nothing half-written


def test_tables_grid_index_and_policy_chart(tmp_path, capsys):
    out, fig = tmp_path / "tables", tmp_path / "fig3.png"
    rc = main(["tables", "--bmax", "8", "--rho-grid", "0.3,0.7", "--w2-grid", "0,1", "-o", str(out),
               "--plot", str(fig), "--json"])
    assert rc == 0
    d = json.loads(capsys.readouterr().out)
    names = sorted(r["file"] for r in d["tables"])
    assert names == ["custom_rho0.30_w2-0.h5", "custom_rho0.30_w2-1.h5", "custom_rho0.70_w2-0.h5", "custom_rho0.70_w2-1.h5"]
    assert sorted(p.name for p in out.iterdir()) == sorted(names + ["README.md"])
    readme = (out / "README.md").read_text()
    assert all(f"`{n}`" in readme for n in names) and "smdp-batch tables --bmax 8" in readme
    pf = read_policy(out / "custom_rho0.70_w2-1.h5")
    ref = solve(BatchingProblem.basic(rho=0.7, w2=1.0, batch_sizes=range(1, 9)))
    assert np.array_equal(pf.policy, ref.policy)
    assert _png(fig)


def test_tables_bad_input(tmp_path, capsys):
    assert main(["tables", "--rho-grid", "0.3", "--w2-grid", "-1"]) == 2
    assert "--w2-grid values must be ≥ 0" in capsys.readouterr().err
    assert main(["tables", "--rho-grid", "0.3", "--w2-grid", "1", "-o", str(tmp_path / "no" / "dir")]) == 2
    assert "does not exist" in capsys.readouterr().err


def test_pareto_infeasible_slo_writes_nothing_and_says_so(tmp_path, capsys):
    table = tmp_path / "pick.h5"
    assert main(["pareto", "--rho", "0.3", *_SMALL, "--no-timeouts", "--slo-mean-ms", "1.4", "-o", str(table)]) == 0
    out = capsys.readouterr().out
    assert "no swept policy meets it" in out and "not written" in out and "  written" not in out
    assert not table.exists()
