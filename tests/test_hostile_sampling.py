"""Hostile MAP sampling: the JSON pre-scan on crafted strings, MMPPs with many fast-switching phases, switching
so slow that one phase visit would hold billions of arrivals, one-phase MAPs, and phase tables run on arrivals
with another phase count.

Each CLI case exits 0, or 2 with one ``smdp-batch: error:`` line; the cases that could hang or blow up memory
run in a subprocess under a 60 s timeout and a 4 GiB address-space limit (RLIMIT_AS).
"""

from __future__ import annotations

import dataclasses
import json
import math
import subprocess
import sys
import time

import numpy as np
import pytest

from smdp_batch.analysis import sim_kernels
from smdp_batch.analysis.phased import phase_rule
from smdp_batch.analysis.simulate import simulate
from smdp_batch.cli import main
from smdp_batch.errors import InputError
from smdp_batch.limits import MAP_FILE_BYTES_LIMIT, REQUESTS_LIMIT
from smdp_batch.model.arrivals import MAP, SAMPLE_CHANGES_LIMIT, read_map_file
from smdp_batch.model.map_file import _depth
from smdp_batch.model.problem import BatchingProblem

#: Eight phases, rates 0.1..0.5 /ms, every switching rate 2 /ms: ≈ 47 phase changes per arrival.
RATES8 = np.linspace(0.1, 0.5, 8)
GEN8 = np.full((8, 8), 2.0) - np.diag(np.full(8, 16.0))
MMPP8 = MAP.mmpp(RATES8, GEN8)
ONE = {"D0": [[-0.5]], "D1": [[0.5]]}
#: A general MAP (arrivals that change the phase).
GENERAL = MAP([[-3.0, 1.0, 0.5], [0.5, -2.0, 0.2], [0.1, 0.1, -1.0]],
              [[1.0, 0.0, 0.5], [0.5, 0.3, 0.5], [0.2, 0.3, 0.3]])

_RUNNER = """
import resource, sys
resource.setrlimit(resource.RLIMIT_AS, (4 << 30, 4 << 30))
from smdp_batch.cli import main
sys.exit(main(sys.argv[1:]))
"""


def run_limited(args, cwd, timeout: float = 60.0) -> tuple[int, str, float]:
    """``smdp-batch args`` in a subprocess under RLIMIT_AS = 4 GiB and ``timeout`` s: (rc, stderr, seconds)."""
    t0 = time.perf_counter()
    r = subprocess.run([sys.executable, "-c", _RUNNER, *map(str, args)], cwd=cwd, capture_output=True, text=True,
                       timeout=timeout)
    return r.returncode, r.stderr, time.perf_counter() - t0


def ok_or_one_line(rc: int, err: str) -> None:
    assert rc in (0, 2), (rc, err[-2000:])
    if rc == 2:
        lines = err.strip().splitlines()
        assert len(lines) == 1 and lines[0].startswith("smdp-batch: error:"), err


def cli(capsys, args) -> tuple[int, str, str]:
    rc = main([str(a) for a in args])
    out, err = capsys.readouterr()
    ok_or_one_line(rc, err)
    return rc, out, err


def write(path, obj) -> str:
    path.write_text(json.dumps(obj))
    return str(path)


def mmpp8_file(tmp_path) -> str:
    return write(tmp_path / "mmpp8.json", {"rates": RATES8.tolist(), "generator": GEN8.tolist()})


# ------------------------------------------------------------------------------ the JSON pre-scan
_L = MAP_FILE_BYTES_LIMIT
PATHOLOGICAL = {
    "quote-then-escaped-quotes": b'"' + b'\\"' * (_L // 2 - 1),
    "backslashes": b'"' + b"\\" * (_L - 1),
    "backslashes-then-char": b'"' + b"\\" * (_L - 2) + b"x",
    "escaped-quotes-only": b'\\"' * (_L // 2),
    "alternating-quotes": b'"a' * (_L // 2),
    "quotes": b'"' * _L,
    "brackets-in-strings": b'["\\' * (_L // 3),
    "mixed-escapes": b'"\\"\\\\' * (_L // 5),
    "long-unterminated": b'{"a": "' + b"x" * (_L - 8),
}


@pytest.mark.parametrize("name", sorted(PATHOLOGICAL))
def test_depth_prescan_is_linear(name):
    """Four times the input takes about four times the CPU, not sixteen (a backtracking pattern grows at least
    quadratically): a ratio in this process, so that a slower host does not fail it (an absolute bound of 1 s did,
    on a host a third as fast as the development machine).  The bound is 12×, between linear and quadratic: the
    quarter's arrays fit in the cache and the whole input's do not, which on the CI host alone made a linear scan
    take 8.8× as long."""
    data = PATHOLOGICAL[name]
    assert len(data) <= _L

    def cpu(x: bytes) -> float:  # this process's CPU time, best of three: a busy machine's other work does not count
        best = math.inf
        for _ in range(3):
            t0 = time.process_time()
            _depth(x)
            best = min(best, time.process_time() - t0)
        return best

    quarter = data[: len(data) // 4]
    assert cpu(data) < 12.0 * cpu(quarter) + 0.05, name


def test_depth_prescan_still_skips_strings():
    assert _depth(b'{"a": "[[[[", "b": [[1]]}') == 3
    assert _depth(b'{"a": "x\\"[[[", "b": [1]}') == 2
    assert _depth(b'[[1], "unterminated [[[[') == 2
    assert _depth(b'["ends in a backslash \\') == 1


def test_crafted_string_file_is_refused_fast(tmp_path):
    (tmp_path / "q.json").write_bytes(b'"' + b'\\"' * 1_500_000)
    rc, err, secs = run_limited(["solve", "--bmax", "8", "--arrivals", "map:q.json"], tmp_path)
    ok_or_one_line(rc, err)
    assert rc == 2 and "not valid JSON" in err and secs < 30
    t0 = time.process_time()
    with pytest.raises(InputError, match="not valid JSON"):
        read_map_file(str(tmp_path / "q.json"))
    assert time.process_time() - t0 < 2.0


# ------------------------------------------------------------------------------ the sampler
def test_many_phases_fast_switching_samples_in_seconds():
    per = MMPP8.events_per_arrival()
    n = int(1e7 / per)  # 10⁷ events, ≈ 9.5·10⁶ of them phase changes
    MMPP8.sample(1000, np.random.default_rng(0))  # compile
    t0 = time.process_time()
    t, sw_t, sw_p = MMPP8.sample(n, np.random.default_rng(0))
    assert time.process_time() - t0 < 15.0
    assert t.size == n and np.all(np.diff(t) >= 0) and sw_t.size > 0.9 * n * (per - 1)
    assert t.size / t[-1] == pytest.approx(MMPP8.rate, rel=0.02)
    # time-average phase law of the path against π
    dwell = np.diff(np.append(sw_t, t[-1]))
    occ = np.bincount(sw_p, weights=dwell, minlength=8) / t[-1]
    assert occ == pytest.approx(MMPP8.stationary, abs=0.01)


@pytest.mark.parametrize("a", [MMPP8, GENERAL, MAP.mmpp([0.6, 2.4], [0.02, 0.02]), MAP.poisson(2.0)],
                         ids=["mmpp8", "general", "mmpp2", "poisson"])
def test_sampling_is_seeded_and_deterministic(a):
    x = a.sample(20_000, np.random.default_rng(7))
    y = a.sample(20_000, np.random.default_rng(7))
    z = a.sample(20_000, np.random.default_rng(8))
    for u, v in zip(x, y):
        assert np.array_equal(u, v)
    assert not np.array_equal(x[0], z[0])
    t, sw_t, sw_p = x
    assert t.size == 20_000 and sw_t[0] == 0.0 and sw_t.shape == sw_p.shape
    assert np.all(np.diff(sw_t) > 0) and sw_p.min() >= 0 and sw_p.max() < a.phases
    assert np.all(sw_p[1:] != sw_p[:-1])  # only real phase changes are recorded


def test_general_map_phase_after_arrivals():
    t, sw_t, sw_p = GENERAL.sample(200_000, np.random.default_rng(4))
    assert t.size / t[-1] == pytest.approx(GENERAL.rate, rel=0.02)
    after = sw_p[np.searchsorted(sw_t, t, side="right") - 1]
    assert np.bincount(after, minlength=3) / t.size == pytest.approx(GENERAL.after_arrival(), abs=0.01)


def test_sampling_work_is_bounded_before_any_draw():
    n = int(SAMPLE_CHANGES_LIMIT / MMPP8.changes_per_arrival()) + 1000

    class NoDraws:
        def __getattr__(self, name):
            raise AssertionError("drew before refusing")

    with pytest.raises(InputError) as e:
        MMPP8.sample(n, NoDraws())
    msg = str(e.value)
    assert "\n" not in msg and "phase" in msg and "--requests ≤" in msg and "slower switching" in msg
    # the arrivals themselves are not counted: slow switching allows the most requests a simulation takes
    MAP.mmpp([0.3, 0.7], [1e-6, 1e-6]).check_sampling(REQUESTS_LIMIT)


@pytest.mark.parametrize("switch", [1e-8, 1e-9, 1e-12])
def test_slow_switching_memory_is_per_request(switch):
    a = MAP.mmpp([0.3, 0.7], [switch, switch])
    t, sw_t, sw_p = a.sample(1000, np.random.default_rng(1))
    assert t.size == 1000 and sw_t.size < 10 and np.all(np.diff(t) >= 0)


def test_one_phase_map_is_poisson():
    a = MAP(ONE["D0"], ONE["D1"])
    t, sw_t, sw_p = a.sample(100_000, np.random.default_rng(3))
    assert t.size / t[-1] == pytest.approx(0.5, rel=0.02)
    gaps = np.diff(t)
    assert gaps.std() / gaps.mean() == pytest.approx(1.0, rel=0.03)
    assert sw_t.tolist() == [0.0] and sw_p.tolist() == [0]


# ------------------------------------------------------------------------------ the CLI
def test_cli_many_phases_simulate_and_compare(tmp_path):
    f = mmpp8_file(tmp_path)
    for args in (["simulate", "--policy", "greedy", "--bmax", "8", "--arrivals", f"map:{f}"],
                 ["compare", "--slo-p99-ms", "200", "--bmax", "8", "--arrivals", f"map:{f}"],
                 ["simulate", "--policy", "greedy", "--bmax", "8", "--arrivals", f"map:{f}", "--requests", "50000000"]):
        rc, err, secs = run_limited(args, tmp_path)
        ok_or_one_line(rc, err)
        assert secs < 60
        if "50000000" in args:
            assert rc == 2 and "--requests ≤" in err
        else:
            assert rc == 0, err


@pytest.mark.parametrize("switch", ["1e-8", "1e-9", "1e-12"])
def test_cli_slow_switching_fits_in_memory(tmp_path, switch):
    rc, err, _ = run_limited(["simulate", "--bmax", "8", "--requests", "1000", "--policy", "greedy", "--arrivals",
                              f"mmpp:0.3,0.7,{switch},{switch}"], tmp_path)
    assert rc == 0, err


def test_cli_one_phase_map_everywhere(tmp_path, capsys):
    f = write(tmp_path / "p1.json", ONE)
    h5 = tmp_path / "p1.h5"
    assert cli(capsys, ["simulate", "--policy", "greedy", "--bmax", "8", "--requests", "20000", "--arrivals",
                        f"map:{f}"])[0] == 0
    assert cli(capsys, ["solve", "--bmax", "8", "--arrivals", f"map:{f}", "-o", h5])[0] == 0
    for rule in ("qmdp", "likely", "true"):
        assert cli(capsys, ["simulate", "--policy", h5, "--requests", "20000", "--phase-rule", rule])[0] == 0
    assert cli(capsys, ["simulate", "--policy", h5, "--requests", "20000", "--arrivals", f"map:{f}",
                        "--phase-rule", "true"])[0] == 0


def test_phase_table_on_arrivals_with_another_phase_count(tmp_path, capsys):
    f8, f1 = mmpp8_file(tmp_path), write(tmp_path / "p1.json", ONE)
    h5 = tmp_path / "ph.h5"
    assert cli(capsys, ["solve", "--bmax", "8", "--arrivals", "mmpp:1,3,0.05,0.05", "-o", h5])[0] == 0
    for other in (f8, f1):
        rc, err, _ = run_limited(["simulate", "--policy", h5, "--arrivals", f"map:{other}", "--requests", "20000",
                                  "--phase-rule", "true"], tmp_path)
        ok_or_one_line(rc, err)
        assert rc == 2 and "--phase-rule true" in err and "qmdp or likely" in err
    for rule in ("qmdp", "likely"):  # the table's filter runs on any arrivals
        assert cli(capsys, ["simulate", "--policy", h5, "--arrivals", f"map:{f8}", "--requests", "20000",
                            "--phase-rule", rule])[0] == 0


def test_no_kernel_indexes_past_the_table():
    a = MAP.mmpp([0.1, 0.3], [0.05, 0.05])
    p = BatchingProblem.from_rho(0.5, batch_sizes=range(1, 9))
    t, sw_t, sw_p = a.sample(5000, np.random.default_rng(0))
    table = np.ones((10, 2), dtype=np.int64)
    table[0] = 0
    with pytest.raises(InputError, match="phase 6 but the table has 2"):
        phase_rule(table, a, "true", path=(sw_t, sw_p + 5))
    with pytest.raises(InputError, match="does not fit a MAP of 8 phases"):
        phase_rule(table, MMPP8, "likely")
    rule = phase_rule(table, a, "true", path=(sw_t, sw_p))
    assert simulate(p, rule, arrivals=t, seed=0).requests > 0
    ctx = rule.make(t)
    bad = dataclasses.replace(rule, make=lambda arr: (*ctx[:6], ctx[6] + 5, *ctx[7:]))
    assert ctx[0] == sim_kernels.CTX_PATH
    with pytest.raises(IndexError, match="outside the table's phases"):
        simulate(p, bad, arrivals=t, seed=0)
