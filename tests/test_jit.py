"""Numba's compile step: one notice on a cold cache, never counted as solve time (solvers/jit.py)."""

from __future__ import annotations

import logging
import os
import subprocess
import sys
from types import SimpleNamespace

import pytest

from smdp_batch import BatchingProblem, solve
from smdp_batch.solvers import jit
from smdp_batch.solvers.pi import COLD_SECONDS, warm_up_pi


def _dispatcher(entries: int):
    index = SimpleNamespace(_load_index=lambda: dict.fromkeys(range(entries)))
    return SimpleNamespace(_cache=SimpleNamespace(_cache_file=index))


def test_cold_cache_gives_one_notice_and_one_run(caplog, monkeypatch):
    monkeypatch.setattr(jit, "_done", set())
    runs = []
    with caplog.at_level(logging.INFO, logger="smdp_batch"):
        jit.warm_up("x", [_dispatcher(1), _dispatcher(0)], lambda: runs.append(1), 7.6)
        assert jit.warm_up("x", [_dispatcher(0)], lambda: runs.append(1), 7.6) == 0.0
    assert runs == [1]
    assert [r.getMessage() for r in caplog.records] == ["compiling kernels (first run only, ~8 s)"]


def test_warm_cache_is_silent(caplog, monkeypatch):
    monkeypatch.setattr(jit, "_done", set())
    with caplog.at_level(logging.INFO, logger="smdp_batch"):
        jit.warm_up("y", [_dispatcher(2)], lambda: None, 8)
    assert not caplog.records


def test_real_kernels_are_cached_after_a_solve():
    solve(BatchingProblem.from_rho(0.5))
    assert warm_up_pi() == 0.0  # once per process
    from smdp_batch.solvers import banded, pi

    assert jit.cache_is_warm([banded.evaluate_policy_banded, banded.stationary_banded, pi.improve_step])


@pytest.mark.slow
def test_cli_says_compiling_on_a_cold_cache_only(tmp_path):
    """A fresh numba cache (as after an install): the notice, then none on the next run."""
    env = {**os.environ, "NUMBA_CACHE_DIR": str(tmp_path / "numba")}
    runs = [subprocess.run([sys.executable, "-m", "smdp_batch", "solve"], capture_output=True, text=True, env=env,
                           timeout=600) for _ in range(2)]
    assert [r.returncode for r in runs] == [0, 0]
    assert runs[0].stderr.splitlines() == [f"smdp-batch: note: compiling kernels (first run only, ~{round(COLD_SECONDS)} s)"]
    assert runs[1].stderr == ""
    policy = [[line for line in r.stdout.splitlines() if line.lstrip().startswith("policy")] for r in runs]
    assert policy[0] == policy[1] and len(policy[0]) == 1
