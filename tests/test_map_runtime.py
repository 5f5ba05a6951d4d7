"""Acting on a phase table without seeing the phase (issue 20): the filter, phase tables on disk, the runtime,
the CLI, and the comparison with today's rules on bursty streams."""

from __future__ import annotations

import asyncio
import json

import h5py
import numpy as np
import pytest
from scipy.linalg import expm

from smdp_batch.analysis.bursty import compare_bursty, two_phase
from smdp_batch.analysis.sim_kernels import _expm, phase_beliefs
from smdp_batch.cli import main
from smdp_batch.errors import InputError, PolicyFileError
from smdp_batch.export.hdf5 import write_phase_policy
from smdp_batch.model.arrivals import MAP
from smdp_batch.runtime import DynamicBatcher, PhaseFilter, PhasePolicy, PolicyTable, read_phase_policy, read_policy
from smdp_batch.runtime.phase import decide_phase, expm_direction
from smdp_batch.solvers.map_solution import map_problem, solve_map

BURSTY = MAP.mmpp([0.6, 2.4], [0.02, 0.02])
GENERAL = MAP([[-3.0, 1.0, 0.5], [0.5, -2.0, 0.2], [0.1, 0.1, -1.0]], [[1.0, 0.0, 0.5], [0.5, 0.3, 0.5], [0.2, 0.3, 0.3]])


@pytest.fixture(scope="module")
def solution():
    return solve_map(map_problem(BURSTY, w2=1.0), BURSTY)


# ----------------------------------------------------------------------------------------- the filter
@pytest.mark.parametrize("a", [BURSTY, GENERAL], ids=["mmpp", "general"])
def test_filter_is_the_forward_recursion(a):
    """Beliefs after each arrival and at a later time against the unnormalised forward product (scipy expm)."""
    t, _, _ = a.sample(60, np.random.default_rng(1))
    f = PhaseFilter(a.D0, a.D1)
    v = a.stationary @ a.D1  # first arrival
    f.observe(t[0])
    assert np.allclose(f.belief(), v / v.sum(), atol=1e-14)
    for k in range(1, t.size):
        v = v @ expm(a.D0 * (t[k] - t[k - 1])) @ a.D1
        v = v / v.sum()  # only to stay in range: the direction is the forward variable's
        f.observe(t[k])
        assert np.allclose(f.belief(), v, atol=1e-12)
    later = v @ expm(a.D0 * 7.5)
    assert np.allclose(f.belief(t[-1] + 7.5), later / later.sum(), atol=1e-12)
    # the simulator's compiled filter gives the same beliefs
    b = phase_beliefs(t, a.D0, a.D1, a.stationary)
    g = PhaseFilter(a.D0, a.D1)
    for k in range(t.size):
        g.observe(t[k])
        assert np.allclose(b[k + 1], g.belief(), atol=1e-12)


@pytest.mark.parametrize("t", [0.0, 1e-4, 0.3, 4.0, 200.0, 1e5, 1e300, 1.7e308, float("inf")])
def test_expm_twins(t):
    for a in (BURSTY, GENERAL):
        E = expm(a.D0 * t) if t < 1e3 else None
        mine, twin = expm_direction(a.D0, t), _expm(a.D0, t)
        assert np.allclose(mine, twin, atol=1e-13, rtol=0)
        if E is not None and E.max() > 1e-250:
            assert np.allclose(mine, E / E.max(), atol=1e-13)


def test_silence_shifts_the_belief_to_the_slow_phase():
    f = PhaseFilter(BURSTY.D0, BURSTY.D1)
    for k in range(50):
        f.observe(k * 0.4)  # 2.5/ms: the fast phase
    assert f.belief()[1] > 0.95
    assert f.belief(49 * 0.4 + 20.0)[0] > 0.95  # 20 ms without an arrival


def test_decision_rules(solution):
    R = solution.stored_range
    table, qv, acts = solution.table[: R + 1], solution.qvalues[: R + 1], solution.model.actions
    for n in range(R + 1):
        for i in range(2):
            e = np.eye(2)[i]
            assert decide_phase(n, e, table, None, None) == table[n, i]
            assert decide_phase(n, e, table, qv, acts) == table[n, i]  # a sure belief: the phase's own action
    assert decide_phase(R + 40, np.array([0.5, 0.5]), table, qv, acts) == table[R, 0]


# ----------------------------------------------------------------------------------------- files and runtime
def test_phase_table_round_trip_and_refusals(tmp_path, solution):
    path = tmp_path / "phase.h5"
    write_phase_policy(solution, path)
    pf = read_phase_policy(path)
    assert pf.integrity == "fletcher32+sha256"
    assert np.array_equal(pf.policy, solution.table)
    assert np.allclose(pf.D0, BURSTY.D0) and np.allclose(pf.D1, BURSTY.D1)
    R = solution.stored_range
    assert np.array_equal(pf.qvalues, solution.qvalues[: R + 1])
    for reader in (read_policy, PolicyTable.load):
        with pytest.raises(PolicyFileError, match="is a phase table"):
            reader(path)
    with h5py.File(path, "r+") as f:  # one decision changed: the content digest refuses the file
        f["policy"][3, 0] = 1
    with pytest.raises(PolicyFileError, match="checksum mismatch"):
        read_phase_policy(path)


def test_version_one_reader_refuses_by_version(tmp_path, solution, monkeypatch):
    from smdp_batch.runtime import schema

    path = tmp_path / "phase.h5"
    write_phase_policy(solution, path)
    monkeypatch.setattr(schema, "PHASE_SCHEMA_VERSION", 1)  # what a version-1 reader knows
    with pytest.raises(PolicyFileError, match="schema_version=2; this smdp-batch reads versions 1..1"):
        schema.read_policy(path)


def test_phase_policy_in_the_batcher(tmp_path, solution):
    path = tmp_path / "phase.h5"
    write_phase_policy(solution, path)
    pol = PhasePolicy.load(path)
    assert pol.phases == 2 and pol.rule == "qmdp"
    assert 0 < pol.default_max_wait_ms() < 1e3
    sizes = []

    async def infer(items):
        sizes.append(len(items))
        await asyncio.sleep(0.0005)
        return [x * 2 for x in items]

    async def go():
        async with DynamicBatcher(infer, pol) as b:
            tasks = []
            for k in range(120):
                tasks.append(asyncio.ensure_future(b.submit(k)))
                await asyncio.sleep(0.0003 if (k // 30) % 2 else 0.002)
            return await asyncio.gather(*tasks)

    out = asyncio.run(go())
    assert out == [2 * k for k in range(120)]
    assert sum(sizes) == 120 and max(sizes) > 1
    assert pol.filter.count == 120


# ----------------------------------------------------------------------------------------- CLI
def _run(args, capsys):
    rc = main(args)
    out = capsys.readouterr()
    return rc, out.out, out.err


def test_cli_solve_show_simulate(tmp_path, capsys):
    out = tmp_path / "p.h5"
    rc, text, err = _run(["solve", "--arrivals", "mmpp:0.6,2.4,0.02,0.02", "-o", str(out)], capsys)
    assert rc == 0, err
    assert "converged up to n =" in text and "phase 1" in text and out.exists()
    rc, text, err = _run(["show", str(out), "--json"], capsys)
    assert rc == 0 and json.loads(text)["schema_version"] == 2
    for rule in ("qmdp", "likely", "true"):
        rc, text, err = _run(["simulate", "--policy", str(out), "--requests", "20000", "--phase-rule", rule, "--json"],
                             capsys)
        assert rc == 0, err
        assert json.loads(text)["mean_latency_ms"] > 0
    spec = tmp_path / "map.json"
    spec.write_text(json.dumps({"D0": GENERAL.D0.tolist(), "D1": GENERAL.D1.tolist()}))
    rc, text, err = _run(["solve", "--arrivals", f"map:{spec}", "--bmax", "8", "--json"], capsys)
    assert rc == 0, err
    assert len(json.loads(text)["policy"]) == 3


@pytest.mark.parametrize("args,msg", [
    (["solve", "--arrivals", "mmpp:0.6,2.4,0.02,0.02", "--rho", "0.5"], "drop --lam/--rho"),
    (["solve", "--arrivals", "mmpp:0.6,2.4,0.02,0.02", "--solver", "rvi"], "cannot be combined"),
    (["solve", "--arrivals", "mmpp:0.6,2.4,0,0.02"], "must be > 0"),
    (["solve", "--arrivals", "map:/nonexistent/m.json"], "cannot read MAP file"),
    (["solve", "--arrivals", "mmpp:9,9,1,1"], "unstable"),
])
def test_cli_refusals(args, msg, capsys):
    rc, text, err = _run(args, capsys)
    assert rc == 2 and msg in err and "Traceback" not in err
    assert len(err.strip().splitlines()) == 1


def test_true_phase_needs_a_map_stream(tmp_path, capsys, solution):
    path = tmp_path / "p.h5"
    write_phase_policy(solution, path)
    trace = tmp_path / "t.csv"
    t, _, _ = BURSTY.sample(5000, np.random.default_rng(0))
    trace.write_text("arrival_ms\n" + "\n".join(f"{x:.6f}" for x in t))
    rc, text, err = _run(["simulate", "--policy", str(path), "--arrivals", f"trace:{trace}", "--phase-rule", "true"],
                         capsys)
    assert rc == 2 and "phase path" in err


# ----------------------------------------------------------------------------------------- the comparison
def test_filtered_map_table_beats_poisson_and_the_bank():
    """Burst ratio 10 at ρ = 0.3 (README table): beyond the paired intervals, and within 0.2 % of the true phase."""
    rep = compare_bursty(two_phase(0.3, 10, (100, 20)), w2=1.0, requests=300_000, seed=1)
    for name in ("poisson", "lambda-bank", "triton", "torchserve"):
        row = rep.row(name)
        assert row.diff - row.diff_ci > 0, (name, row.diff, row.diff_ci)
    bound = rep.row("map-true")
    assert -bound.diff <= 0.002 * rep.row("map-filter").objective
    with pytest.raises(InputError):
        two_phase(1.2, 2, (10, 10))
