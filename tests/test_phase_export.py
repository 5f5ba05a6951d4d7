"""Phase tables (schema 2) through the user path: ``export PHASE.h5 --to …`` and ``compare --arrivals mmpp:…``.

Checks are against a second path through the product: the export's simulated figures must be what
``simulate`` prints for the same rule on the same stream, and the setting tuned on the bursty traffic must
do at least as well on it as the setting tuned for Poisson arrivals of the same mean rate."""

from __future__ import annotations

import json

import pytest

from smdp_batch.cli import main

MAP_SPEC = "mmpp:1,3,0.05,0.05"
N = 40_000


def _run(capsys, args):
    code = main(args)
    out, err = capsys.readouterr()
    assert code == 0, err
    return json.loads(out)


@pytest.fixture(scope="module")
def phase_file(tmp_path_factory):
    path = tmp_path_factory.mktemp("phase") / "phase.h5"
    assert main(["solve", "--arrivals", MAP_SPEC, "--bmax", "16", "-o", str(path)]) == 0
    return path


@pytest.fixture(scope="module")
def poisson_file(tmp_path_factory):
    path = tmp_path_factory.mktemp("poisson") / "poisson.h5"
    assert main(["solve", "--lam", "2", "--bmax", "16", "-o", str(path)]) == 0
    return path


def _objective(d):
    return d["mean_latency_ms"] + d["mean_power_w"]  # w1 = w2 = 1 in these files


@pytest.mark.parametrize("target", ["triton", "ray", "tfserving"])
def test_phase_table_exports_its_best_single_setting_for_its_traffic(capsys, phase_file, poisson_file, target):
    ex = _run(capsys, ["export", str(phase_file), "--to", target, "--requests", str(N), "--json"])
    assert ex["arrivals"] == MAP_SPEC
    assert ("PhasePolicy.load" in ex["runtime"]) != (target == "ray") and ("table_batch" in ex["runtime"]) == (target == "ray")
    assert any("arrival phase" in x for x in ex["limitations"])
    # the table's figures are the phase table run with its filter, as `simulate --policy FILE` runs it
    table = _run(capsys, ["simulate", "--policy", str(phase_file), "--requests", str(N), "--seed", "0", "--json"])
    assert ex["gap"]["table"]["mean_latency_ms"] == pytest.approx(table["mean_latency_ms"], rel=1e-12)
    assert ex["gap"]["table"]["mean_power_w"] == pytest.approx(table["mean_power_w"], rel=1e-12)
    # the exported rule's figures are its simulation on the same bursty stream
    mine = _run(capsys, ["simulate", "--policy", ex["rule"], "--arrivals", MAP_SPEC, "--lam", "2", "--bmax", "16",
                         "--requests", str(N), "--seed", "0", "--json"])
    assert ex["gap"]["export"]["mean_latency_ms"] == pytest.approx(mine["mean_latency_ms"], rel=1e-12)
    # tuned on the bursts, it does at least as well on them as the setting tuned for Poisson arrivals
    plain = _run(capsys, ["export", str(poisson_file), "--to", target, "--requests", str(N), "--json"])
    theirs = _run(capsys, ["simulate", "--policy", plain["rule"], "--arrivals", MAP_SPEC, "--lam", "2", "--bmax", "16",
                           "--requests", str(N), "--seed", "0", "--json"])
    if plain["settings"].get("max_batch_size") == ex["settings"].get("max_batch_size"):
        assert _objective(mine) <= _objective(theirs) + 1e-9
    # off-peak loads are the MAP scaled down, not Poisson
    assert [r["share"] for r in ex["off_peak"]["loads"]] == [0.5, 0.1]


def test_phase_table_export_at_an_slo_meets_it_on_the_bursty_traffic(capsys, phase_file):
    ex = _run(capsys, ["export", str(phase_file), "--to", "ray", "--slo-p99-ms", "30", "--requests", str(N), "--json"])
    assert ex["arrivals"] == MAP_SPEC
    got = _run(capsys, ["simulate", "--policy", ex["rule"], "--arrivals", MAP_SPEC, "--lam", "2", "--bmax", "16",
                        "--requests", str(N), "--seed", "0", "--json"])
    assert got["p99_ms"] <= 30.0  # the same stream the search checked at this load


def test_phase_table_export_refuses_an_slo_it_cannot_meet(capsys, phase_file):
    code = main(["export", str(phase_file), "--to", "triton", "--slo-p99-ms", "3", "--requests", "20000"])
    _, err = capsys.readouterr()
    assert code == 2 and len(err.strip().splitlines()) == 1 and "no triton setting meets" in err


def test_compare_prices_every_family_under_a_map(capsys):
    d = _run(capsys, ["compare", "--arrivals", MAP_SPEC, "--lam", "2", "--bmax", "16", "--slo-p99-ms", "40",
                      "--requests", "30000", "--json"])
    assert d["arrivals"] == MAP_SPEC
    assert {"smdp", "triton", "ray", "tfserving", "torchserve"} <= set(d["best"])
    # the answer is priced on the bursty stream (scaled from the sample's own rate to the load): re-simulating it
    # on the MAP at its mean rate gives its power within the interval
    rec = d["recommended"]
    got = _run(capsys, ["simulate", "--policy", rec["setting"], "--arrivals", MAP_SPEC, "--lam", "2", "--bmax", "16",
                        "--requests", "30000", "--seed", "0", "--json"])
    at = rec["loads"][-1]
    assert abs(got["mean_power_w"] - at["mean_power_w"]) <= at["mean_power_ci_w"] + got["mean_power_ci_w"]
    # and bursts cost: the same setting on Poisson arrivals of the same mean rate draws a different power
    poisson = _run(capsys, ["simulate", "--policy", rec["setting"], "--lam", "2", "--bmax", "16", "--requests", "30000",
                            "--seed", "0", "--json"])
    assert poisson["p99_ms"] < got["p99_ms"]


def test_table_batch_runs_a_phase_table_from_its_path(phase_file):
    """The export's "runs as is" line for Ray Serve: ``table_batch(PATH)`` loads a phase table with its filter
    (no Ray needed: the decorator is plain asyncio)."""
    import asyncio

    from smdp_batch.integrations.ray_serve import table_batch
    from smdp_batch.runtime.phase import PhasePolicy

    seen = []

    @table_batch(str(phase_file))
    async def infer(items):
        seen.append(len(items))
        return [2 * x for x in items]

    async def burst():
        return await asyncio.wait_for(asyncio.gather(*(infer(i) for i in range(40))), timeout=30)

    assert asyncio.run(burst()) == [2 * i for i in range(40)]
    assert sum(seen) == 40 and max(seen) <= 16

    async def policy_kind():
        return type(infer.batcher_for(None).table)

    assert asyncio.run(policy_kind()) is PhasePolicy


def test_export_of_a_general_map_table_opens_no_file_named_by_its_map(capsys, tmp_path, monkeypatch):
    """A MAP that is not an MMPP spells itself "map:2 phases": the export samples the stored MAP itself and never
    opens a file of that name (one planted in the working folder must change nothing)."""
    spec = tmp_path / "map2.json"
    spec.write_text(json.dumps({"D0": [[-1.2, 0.1], [0.05, -2.2]], "D1": [[0.8, 0.3], [0.15, 2.0]]}))
    table = tmp_path / "m2.h5"
    assert main(["solve", "--arrivals", f"map:{spec}", "--bmax", "8", "-o", str(table)]) == 0
    capsys.readouterr()
    monkeypatch.chdir(tmp_path)
    first = _run(capsys, ["export", str(table), "--to", "triton", "--requests", "20000", "--json"])
    (tmp_path / "2 phases").write_text(json.dumps({"D0": [[-9.0, 1.0], [1.0, -9.0]], "D1": [[8.0, 0.0], [0.0, 8.0]]}))
    second = _run(capsys, ["export", str(table), "--to", "triton", "--requests", "20000", "--json"])
    assert first["gap"] == second["gap"] and first["settings"] == second["settings"]
    assert first["arrivals"] == "map:2 phases"


def test_simulate_never_ignores_a_load_given_with_bursty_arrivals(capsys, phase_file):
    """With a MAP or trace stream, the reported λ is the stream's; a load given scales the stream to it (as compare
    does), and a phase table refuses one."""
    free = _run(capsys, ["simulate", "--policy", "greedy", "--arrivals", "mmpp:0.2,1.8,0.05,0.05", "--requests", "50000",
                         "--json"])
    assert free["lam"] == pytest.approx(1.0) and free["throughput"] == pytest.approx(1.0, rel=0.1)
    code = main(["simulate", "--policy", "greedy", "--arrivals", "mmpp:0.2,1.8,0.05,0.05", "--rho", "0.9",
                 "--requests", "50000", "--json"])
    out, err = capsys.readouterr()
    scaled = json.loads(out)
    assert code == 0 and scaled["throughput"] == pytest.approx(scaled["lam"], rel=0.1) and scaled["rho"] == pytest.approx(0.9)
    assert "scaled to the load given" in err
    code = main(["simulate", "--policy", str(phase_file), "--lam", "0.1", "--requests", "5000"])
    _, err = capsys.readouterr()
    assert code == 2 and err.count("\n") == 1 and "drop --lam/--rho/--rps" in err
