"""Which factors a c-server solve uses (smdp_batch.solvers.multi_system): a densely filled complete factorisation
moves the solve's later policies to incomplete factors, and an incomplete factorisation that hits a zero pivot is
tried again with SuperLU's basic drop rule, then a finer tolerance, before the complete one.  Each path gives the
complete factorisations' answer."""

from __future__ import annotations

import pytest

from smdp_batch.model.problem import BatchingProblem
from smdp_batch.solvers import multi_system
from smdp_batch.solvers.multi_pi import solve_instances
from tests.test_instances_solver import _assert_same_answer


def _problem() -> BatchingProblem:
    return BatchingProblem.from_rho(0.8, service="exp", instances=2, batch_sizes="1,2,4,8,16")


def _record(monkeypatch, name: str) -> list:
    """Record the calls to multi_system's ``name`` (splu or spilu): (states, its keyword options)."""
    calls: list = []
    real = getattr(multi_system, name)
    monkeypatch.setattr(multi_system, name, lambda M, **kw: calls.append((M.shape[0], kw)) or real(M, **kw))
    return calls


def test_a_densely_filled_factorisation_moves_the_later_policies_to_incomplete_factors(monkeypatch):
    fresh = solve_instances(_problem())
    monkeypatch.setattr(multi_system, "DENSE_FILL", 0)  # any complete factorisation counts as dense here
    monkeypatch.setattr(multi_system, "DENSE_FROM", 0)
    complete, incomplete = _record(monkeypatch, "splu"), _record(monkeypatch, "spilu")
    seen: list[int] = []  # incomplete_from of each truncation's system as it starts
    real = multi_system.MultiSystem._solve

    def solve(self, act):
        if not seen or seen[-1] != (self.N, self.incomplete_from):
            seen.append((self.N, self.incomplete_from))
        return real(self, act)

    monkeypatch.setattr(multi_system.MultiSystem, "_solve", solve)
    got = solve_instances(_problem())
    assert len(complete) == 1 and incomplete  # the first policy only, then incomplete factors throughout
    assert all(n > complete[0][0] // 2 for n, _ in incomplete)
    later = [f for N, f in seen if N > seen[0][0]]
    assert later and all(f == 0 for f in later)  # the next truncation starts on incomplete factors at once
    _assert_same_answer(got, fresh)


def test_a_sparse_fill_keeps_complete_factors(monkeypatch):
    """At the default threshold a small two-instance model fills sparsely (under 200 a row): no incomplete factors."""
    incomplete = _record(monkeypatch, "spilu")
    solve_instances(_problem())
    assert not incomplete


def test_a_zero_pivot_tries_the_basic_rule_then_a_finer_tolerance_before_complete_factors(monkeypatch):
    fresh = solve_instances(_problem())
    monkeypatch.setattr(multi_system, "ILU_FROM", 0)
    real = multi_system.spilu
    tried: list[dict] = []

    def picky(M, **kw):  # only the finer tolerance factorises
        tried.append(kw)
        if kw["drop_tol"] >= multi_system.ILU_DROP:
            raise RuntimeError("Factor is exactly singular")
        return real(M, **kw)

    monkeypatch.setattr(multi_system, "spilu", picky)
    complete = _record(monkeypatch, "splu")
    got = solve_instances(_problem())
    assert not complete
    first = tried[:3]
    assert "drop_rule" not in first[0] and first[1]["drop_rule"] == "basic"
    assert first[2]["drop_tol"] == pytest.approx(multi_system.ILU_DROP / 100)
    _assert_same_answer(got, fresh)
