"""``measure --concurrency K``: each size timed again with k = 2..K callers at once, and the ``--contention`` spec
those runs give.  Stand-in devices with known contention: one that runs one call at a time (S_k = k), one with
room for every caller (S_k = 1); the factor arithmetic on known numbers; failures and the budget."""

from __future__ import annotations

import json
import shlex
import threading
import time

import numpy as np
import pytest

from smdp_batch.cli import main
from smdp_batch.errors import InputError
from smdp_batch.measure import SERIAL_SLACK, contention_summary, measure
from smdp_batch.specs.contention import parse_contention

_ONE_AT_A_TIME = threading.Lock()


def _serial(batch) -> None:
    """A device that runs one batch at a time: callers queue for it.  Calls of 20–40 ms, so that a loaded machine's
    thread wake-ups (a few ms with two busy processes on two cores) stay a small share."""
    with _ONE_AT_A_TIME:
        time.sleep(0.0025 * len(batch) + 0.02)


def _fast_serial(batch) -> None:
    """:func:`_serial` at 10 ms a call, for the budget."""
    with _ONE_AT_A_TIME:
        time.sleep(0.001 * len(batch) + 0.002)


def _roomy(batch) -> None:
    """A device with room for every caller (sleep releases the GIL)."""
    time.sleep(0.0025 * len(batch) + 0.02)


def _factors(m) -> tuple[float, ...]:
    return tuple(m.meta["concurrency"]["latency"])


@pytest.mark.exclusive  # a ratio of sleeps timed at two moments: a neighbour's load between them moves it
def test_a_device_that_runs_one_call_at_a_time_takes_k_times_as_long():
    """Per size S_k ≈ k.  k callers on such a device serve exactly as many batches as k − 1, so the spec takes S_k at
    its bound k·S_{k−1}/(k − 1) while the threads' overhead stays within the slack, and otherwise (a loaded
    machine's thread wake-ups) stops at k − 1 instances and says so: either answer is right for this device."""
    m = measure(_serial, sizes=(2, 8), warmup=1, repeats=5, concurrency=3, progress=False)
    cont = m.meta["concurrency"]
    rows = cont["sizes"]
    assert {(r["batch_size"], r["callers"]) for r in rows} == {(2, 2), (2, 3), (8, 2), (8, 3)}
    assert all(r["latency_factor"] == pytest.approx(r["callers"], rel=0.1) for r in rows)
    s = _factors(m)
    for k in range(2, len(s) + 1):
        assert s[k - 1] == pytest.approx(k, rel=0.08) and s[k - 1] <= s[k - 2] * k / (k - 1) * (1 + 1e-3)
    if len(s) < 3:
        assert f"{len(s) + 1} callers at once served less than {len(s)}" in cont["note"]
        assert f"run at most {len(s)} instance" in cont["note"]
    else:
        assert not cont["note"]
    if cont["spec"] is not None:
        parse_contention(cont["spec"]).check(len(s))  # a spec the solver takes as it is
    assert m.batch.size == 10  # the profile's rows are the runs alone


@pytest.mark.exclusive  # a ratio of sleeps timed at two moments: a neighbour's load between them moves it
def test_a_device_with_room_for_every_caller_does_not_slow_down():
    m = measure(_roomy, sizes=(2, 8), warmup=1, repeats=5, concurrency=3, progress=False)
    assert all(x == pytest.approx(1.0, abs=0.15) for x in _factors(m))
    assert m.meta["concurrency"]["energy"] is None and not m.meta["concurrency"]["note"]


def test_the_factors_from_known_runs():
    """Spans and energies given: S_k over all sizes weighs each size by its time; E_k is per batch; a factor below
    1 counts as 1; a k that serves less than k − 1 ends the spec (within SERIAL_SLACK it is taken at the bound)."""
    ms = 1_000_000  # ns
    blocks = [(1, [2 * ms] * 4, 40.0), (8, [10 * ms] * 4, 200.0)]  # alone: 2 and 10 ms, 10 and 50 mJ a batch
    levels = [(1, 2, [3 * ms] * 4, 8 * 12.0), (8, 2, [15 * ms] * 4, 8 * 45.0),  # two at once: 1.5×, E 1.2 and 0.9
              (1, 3, [1 * ms] * 4, 12 * 10.0), (8, 3, [24 * ms] * 4, 12 * 50.0),  # three: (1 + 24)/12 = 25/12
              (1, 4, [40 * ms] * 4, None), (8, 4, [40 * ms] * 4, None)]  # four: serves less than three
    out = contention_summary(blocks, levels, energy=True)
    assert out["latency"][1] == pytest.approx(18 / 12, rel=1e-3)
    assert out["energy"][1] == pytest.approx((12 + 45) / (10 + 50), rel=1e-3)
    assert out["latency"][2] == pytest.approx(25 / 12, rel=1e-3) and len(out["latency"]) == 3
    assert "4 callers at once served less than 3" in out["note"] and "run at most 3 instances" in out["note"]
    assert parse_contention(out["spec"]).latency == tuple(out["latency"])
    by = {(r["batch_size"], r["callers"]): r for r in out["sizes"]}
    assert by[(1, 2)]["latency_factor"] == pytest.approx(1.5) and by[(8, 2)]["energy_factor"] == pytest.approx(0.9)
    near = contention_summary(blocks[:1], [(1, 2, [int(2 * ms * 2 * (1 + SERIAL_SLACK / 2))] * 4, None)], False)
    assert near["latency"] == [1.0, 2.0] and not near["note"]  # one call at a time, plus overhead: S_2 = 2
    faster = contention_summary(blocks[:1], [(1, 2, [ms] * 4, None)], False)
    assert faster["latency"] == [1.0, 1.0]


def test_a_call_that_fails_beside_another_stops_the_run_at_its_size():
    busy = threading.Event()

    def alone_only(batch):
        if busy.is_set():
            raise RuntimeError("device busy")
        busy.set()
        try:
            time.sleep(0.003)
        finally:
            busy.clear()

    m = measure(alone_only, sizes=(1, 2), warmup=0, repeats=4, concurrency=2, progress=False, warn=False)
    assert m.failure and "RuntimeError: device busy" in m.failure and m.meta["stopped_at"] == 1
    assert "with 2 callers at once raised" in m.note and "b = 2 not measured (b = 1 was measured alone)" in m.note
    assert sorted(set(m.batch.tolist())) == [1]  # the run alone was measured before the failure


def test_the_budget_cuts_a_concurrent_round_and_says_so():
    """Alone: 30 calls of 10 ms; two at once: 30 rounds of 20 ms, cut by the 0.8 s budget."""
    m = measure(_fast_serial, sizes=(8, 16), warmup=0, repeats=30, concurrency=2, budget_s=0.8, progress=False)
    assert not m.complete
    assert "ran out at b = 8 with 2 callers at once" in m.note and "of 30 timed rounds" in m.note
    assert "sizes [16] not measured" in m.note
    assert sorted(set(m.batch.tolist())) == [8]


@pytest.mark.parametrize("bad", [0, 9, 1.5, True, "2"])
def test_bad_concurrency_is_refused(bad):
    with pytest.raises(InputError, match="concurrency must be an integer from 1 to 8"):
        measure(_roomy, sizes=(1,), concurrency=bad)


@pytest.mark.parametrize("value", ["0", "9", "1.5"])
def test_bad_concurrency_on_the_command_line_is_one_line(value, capsys, tmp_path):
    assert main(["measure", "slowmod:infer", "--concurrency", value, "-o", str(tmp_path / "p.csv")]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and "--concurrency" in err[0]


@pytest.mark.exclusive  # a ratio of sleeps timed at two moments: a neighbour's load between them moves it
def test_the_command_prints_the_factors_and_the_spec_to_solve_with(tmp_path, monkeypatch, capsys):
    """Through the child process: a device with two slots, each call twice as long beside another (S₂ = 2 is the
    bound itself, so S₂ is set by the sleeps, not the threads' overhead: 1.5 here)."""
    (tmp_path / "twoslots.py").write_text(
        "import threading, time\nL = threading.Lock()\nN = [0]\n\ndef infer(batch):\n    with L:\n"
        "        N[0] += 1\n        beside = N[0] > 1\n    time.sleep((0.0025 * len(batch) + 0.02) * (1.5 if beside else 1))\n"
        "    with L:\n        N[0] -= 1\n")
    monkeypatch.chdir(tmp_path)
    out = str(tmp_path / "p.csv")
    assert main(["measure", "twoslots:infer", "--sizes", "2,4", "--repeats", "5", "--concurrency", "2", "-o", out,
                 "--json"]) == 0
    d = json.loads(capsys.readouterr().out)
    spec = d["concurrency"]["spec"]
    assert parse_contention(spec).latency[1] == pytest.approx(1.5, rel=0.12)
    # the c-server solve it prints fits the default limits as printed (fewer phases for the measured spread, where
    # the solve would refuse the 8 of its default fit) and runs
    assert f"--instances 2 --contention {spec}" in d["next"]
    assert main(shlex.split(d["next"])[1:]) == 0
    capsys.readouterr()
    side = json.loads((tmp_path / "p.csv.json").read_text())
    assert side["concurrency"]["spec"] == spec and side["concurrency"]["callers"] == 2
    assert np.loadtxt(out, delimiter=",", skiprows=1).shape == (10, 2)  # the rows alone


def test_the_factors_per_size_become_a_spec_by_size():
    """Per size, as measured (a factor below 1 counts as 1; one past k·S_{k−1}/(k − 1) is taken at that bound)."""
    ms = 1_000_000
    blocks = [(1, [2 * ms] * 4, None), (8, [100 * ms] * 4, None)]
    levels = [(1, 2, [int(3.6 * ms)] * 4, None), (8, 2, [90 * ms] * 4, None),
              (1, 3, [8 * ms] * 4, None), (8, 3, [145 * ms] * 4, None)]
    out = contention_summary(blocks, levels, energy=False)
    assert len(out["latency"]) == 3  # over all sizes: 1, (3.6 + 90)/102 → 1, (8 + 145)/102 = 1.5
    assert out["spec_by_size"] == "1=2:1.8,3:2.7/8=2:1,3:1.45"  # b = 1 at k = 3: 4 measured, 1.8·3/2 taken
    assert parse_contention(out["spec_by_size"]).slow(3, 8) == pytest.approx(1.45)


def test_a_factor_taken_at_its_bound_is_rounded_down_to_stay_within_it():
    """S₂ = 1.993 and three callers measured at 3: the bound 1.993·3/2 = 2.9895 is written 2.989, not 2.99 (which
    the contention check refuses: three instances would then serve less than two)."""
    ms = 1_000_000
    blocks = [(4, [100 * ms] * 4, None)]
    levels = [(4, 2, [int(199.3 * ms)] * 4, None), (4, 3, [300 * ms] * 4, None)]
    out = contention_summary(blocks, levels, energy=False)
    assert out["latency"] == [1.0, 1.993, 2.989]
    parse_contention(out["spec"]).check(3)
    assert out["spec_by_size"] == "4=2:1.993,3:2.989"
    parse_contention(out["spec_by_size"]).check(3)
