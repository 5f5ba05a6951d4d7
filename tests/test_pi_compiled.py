"""The compiled policy-iteration loop: the same answers as the Python loop, kept factors equal to the bit, a
dispatch that never compiles in the middle of a solve, and a background compile that can be turned off."""

from __future__ import annotations

import fcntl

import numpy as np
import pytest

from smdp_batch import BatchingProblem, truncate
from smdp_batch.errors import InputError
from smdp_batch.solvers import pi as pimod
from smdp_batch.solvers import pi_compiled
from smdp_batch.solvers.banded import assemble, evaluate_factored, refactor_from, stationary
from smdp_batch.solvers.pi import CONVERGED, EVAL_FAILED, _pi_pivoting, _starts, pi_loop, policy_iteration
from smdp_batch.solvers.pi_compiled import pi_loop_compiled


def _model(rho, sizes=range(1, 33), s_max=70, w2=1.0, service="det", tail=None):
    return truncate(BatchingProblem.from_rho(rho, batch_sizes=sizes, w2=w2, service=service), s_max, tail=tail)


MODELS = {
    "basic rho 0.9": lambda: _model(0.9),
    "basic rho 0.1, w2 10": lambda: _model(0.1, w2=10.0),
    "basic rho 0.5, s_max 160": lambda: _model(0.5, s_max=160),
    "hyperexp, tail boundary": lambda: _model(0.8, (1, 2, 4, 8, 16), 60, service="hyperexp:0.6667/0.5,0.3333/2",
                                              tail=16),
    "gamma, overflow": lambda: _model(0.8, (1, 2, 4, 8, 16), 120, service="gamma:0.5"),
    "degenerate (waits at the top)": lambda: _model(0.42, w2=10.0),
    "degenerate, handed over": lambda: _model(0.4733333333333334, w2=4.933964274748137),
}


def _args(m):
    return (_starts(m), m.costs(), m.sojourn_rows(), m.P, m.SF, m.klo, m.khi, m.actions, m.s_max, 1000)


@pytest.mark.parametrize("name", list(MODELS))
def test_compiled_loop_answers_as_the_python_loop(name):
    m = MODELS[name]()
    a, b = pi_loop(*_args(m)), pi_loop_compiled(*_args(m))
    assert a[0] == b[0]  # status
    assert np.array_equal(a[1], b[1])  # policy (action indices)
    assert a[2] == b[2] or (np.isnan(a[2]) and np.isnan(b[2]))  # gain, to the bit
    assert a[4] == b[4]  # iterations
    assert np.array_equal(a[3], b[3])  # relative values, to the bit
    assert a[5][2] == -1  # the Python loop hands no factors on (its models are large: no second band held)
    if b[0] != EVAL_FAILED:  # the compiled loop's: the last policy's band factored afresh, to the bit, and its
        # stationary law on them is the one factored afresh, to the bit
        rows = np.arange(m.n_states)
        Y = m.sojourn_rows()
        pc, py = m.costs()[rows, b[1]], Y[rows if Y.shape[0] > 1 else 0 * rows, b[1]]
        fresh = evaluate_factored(b[1], pc, py, m.P, m.SF, m.klo, m.khi, m.actions, m.s_max, None)[3]
        assert all(np.array_equal(x, y) for x, y in zip(b[5], (fresh[0], fresh[3], fresh[4])))
        if b[5][2] >= 0:
            assert np.array_equal(stationary(m, b[1], b[5]), stationary(m, b[1]))
    if name == "degenerate (waits at the top)":  # S_o absorbing: evaluated by the no-pivot LU, no hand-over
        m_sizes = m.actions[a[1]]
        assert a[0] == CONVERGED and m_sizes[-1] == 0 and m_sizes[-2] == 0
    if name == "degenerate, handed over":  # serving at s_max while S_o waits: S_o is reached only through the
        # arrivals' tail, B is singular to round-off, and the pivoting loop finishes from the same policy in both
        assert a[0] == EVAL_FAILED


def test_after_one_pivoting_step_the_fast_loop_finishes(monkeypatch):
    """Where the fast loop hands over (a policy it cannot evaluate), one improvement with the pivoting solve and the
    fast loop again: the same policy and gain as the pivoting loop alone, and fewer of its (slow) steps."""
    m = MODELS["degenerate, handed over"]()
    costs = m.costs()
    status, pol, g, h, it, _ = pi_loop(*_args(m))
    assert status == EVAL_FAILED
    calls = []
    real = pimod._pi_pivoting

    def counted(*a):
        calls.append(a[3])
        return real(*a)

    monkeypatch.setattr(pimod, "_pi_pivoting", counted)
    res = policy_iteration(m)
    slow = real(m, pol, costs, 1000)
    assert slow[4] and res.converged and np.array_equal(res.policy, m.actions[slow[0]])
    assert res.gain == pytest.approx(slow[1], rel=1e-12)
    assert set(calls) == {1} and len(calls) < slow[3]  # single pivoting steps, fewer than the pivoting loop's alone


@pytest.mark.parametrize("rho, w2", [(0.42, 10.0), (0.47, 5.0), (0.58, 7.0), (0.6866666666666665, 3.4657242157757318)])
def test_a_degenerate_truncation_solved_by_the_fast_loop_is_the_pivoting_loops_answer(rho, w2):
    """The fast loops evaluate a policy whose S_o waits (absorbing) by the no-pivot LU and halve a switch that does
    not evaluate: the same optimal policy and gain as the LAPACK pivoting loop from the same start."""
    m = _model(rho, w2=w2)
    st = _starts(m)
    fast = pi_loop(*_args(m))
    assert fast[0] == CONVERGED
    slow = _pi_pivoting(m, st[0].copy(), m.costs(), 1000)
    assert slow[4] and np.array_equal(fast[1], slow[0])
    assert fast[2] == pytest.approx(slow[1], rel=1e-12)
    h_fast, h_slow = fast[3], slow[2]
    assert np.allclose(h_fast, h_slow, rtol=1e-9, atol=1e-9 * np.abs(h_slow).max())
    assert policy_iteration(m).converged


def _factors_equal(x, y):
    return all(np.array_equal(u, v) for u, v in zip(x, y))


@pytest.mark.parametrize("first", [3, 20, 40, 70, 71])
def test_kept_factors_are_the_same_to_the_bit(first):
    """A policy that differs from a factored one first at state ``first`` keeps the rows below: same (g, h)
    and factors as a full factorisation.  71 = S_o: its row is the border, so no band row is factored."""
    m = _model(0.9)
    costs, Y = m.costs(), m.sojourn_rows()
    rows = np.arange(m.n_states)

    def ev(p, prev):
        return evaluate_factored(p, costs[rows, p], Y[0, p], m.P, m.SF, m.klo, m.khi, m.actions, m.s_max, prev)

    pol = _starts(m)[0]
    new = pol.copy()
    new[first] -= 1  # serve one less there (greedy: a size another state serves; border and widths stay)
    ok0, g0, h0, f0 = ev(pol, None)
    assert ok0
    ab, lw, uw, U, V, D, ext = assemble(new, m.P, m.SF, m.klo, m.khi, m.actions, m.s_max, Y[0, new], f0[4])
    assert refactor_from(ab, lw, uw, ext, f0[4], first, f0) == min(first, m.s_max + 1)  # rows really kept
    full = ev(new, None)
    kept = ev(new, (f0, first))
    assert full[0] and kept[0]
    assert full[1] == kept[1]
    assert np.array_equal(full[2], kept[2])
    assert _factors_equal(full[3], kept[3])


def test_kept_factors_are_not_used_when_the_border_state_moves():
    """Waiting in state 1 moves the border state (the first serving one): everything is factored again."""
    m = _model(0.9)
    costs, Y = m.costs(), m.sojourn_rows()
    rows = np.arange(m.n_states)
    pol = _starts(m)[0]
    new = pol.copy()
    new[1] = 0
    args = (m.P, m.SF, m.klo, m.khi, m.actions, m.s_max)
    _, _, _, f0 = evaluate_factored(pol, costs[rows, pol], Y[0, pol], *args, None)
    full = evaluate_factored(new, costs[rows, new], Y[0, new], *args, None)
    kept = evaluate_factored(new, costs[rows, new], Y[0, new], *args, (f0, 1))
    assert full[1] == kept[1] and np.array_equal(full[2], kept[2])


def test_policy_iteration_runs_the_compiled_loop_once_loaded_and_never_compiles_again():
    m = _model(0.9)
    python = policy_iteration(m)  # whichever loop this process has: the answer is the same
    pimod.warm_up_pi()
    pimod._load_compiled()
    assert pimod._compiled["fn"] is pi_loop_compiled
    fast = policy_iteration(m)
    assert np.array_equal(fast.policy, python.policy) and fast.gain == python.gain
    assert fast.iterations == python.iterations
    # arguments of a type it was not compiled for (costs in Fortran order): the Python loop answers, no compile
    n_sigs = len(pi_loop_compiled.signatures)
    args = list(_args(m))
    args[1] = np.asfortranarray(args[1])
    out = pimod._run_loop(*args)
    ref = pi_loop(*_args(m))
    assert np.array_equal(out[1], ref[1]) and out[2] == ref[2]
    assert len(pi_loop_compiled.signatures) == n_sigs


def test_background_compile_can_be_turned_off(monkeypatch):
    monkeypatch.setenv(pi_compiled.OFF_VARIABLE, "1")
    assert pi_compiled.start_background_compile() is False


def test_one_background_compile_at_a_time(tmp_path, monkeypatch):
    """While another interpreter holds the lock, a second returns without compiling."""
    lock = tmp_path / "pi.lock"
    monkeypatch.setattr(pi_compiled, "_lock_path", lambda: str(lock))
    ran = []
    with open(lock, "w") as held:
        fcntl.flock(held, fcntl.LOCK_EX | fcntl.LOCK_NB)
        pi_compiled.compile_into_cache(lambda: ran.append(1))
        assert ran == []
    pi_compiled.compile_into_cache(lambda: ran.append(1))
    assert ran == [1]


@pytest.mark.parametrize("bad, shown", [(2.5, "2.5"), ("a", "'a'"), (40, "40")])
def test_a_policy_with_a_size_not_allowed_is_named(bad, shown):
    m = _model(0.5, s_max=40)
    pol = np.full(m.n_states, bad, dtype=object if isinstance(bad, str) else None)
    with pytest.raises(InputError, match=f"policy uses batch size {shown}, which is not allowed; allowed: 0"):
        m.action_index(pol)


def test_large_models_keep_the_python_loop(monkeypatch):
    """Above COMPILED_MAX_WORK the compiled loop is slower (its product through numba): never called there."""
    def refuse(*args):
        raise AssertionError("the compiled loop ran on a large model")

    monkeypatch.setitem(pimod._compiled, "fn", refuse)
    m = _model(0.9, range(1, 65), 1000)
    assert m.costs().size * m.P.shape[1] > pimod.COMPILED_MAX_WORK
    out = pimod._run_loop(*_args(m))
    assert out[0] == 0
    small = _model(0.9)
    with pytest.raises(AssertionError, match="compiled loop ran"):
        pimod._run_loop(*_args(small))


def test_pi_answers_as_the_pivoting_loop_on_a_seeded_sample_of_problems():
    """Policy iteration (the fast loops, their halved switches and single pivoting steps) against the LAPACK pivoting
    loop alone from the same start, on seeded problems across laws, loads, weights, truncations and both boundaries,
    degenerate truncations among them: the same policy and gain (measured on 240 such problems, 27 degenerate)."""
    rng = np.random.default_rng(7)
    services = ["det", "exp", "gamma:0.5", "erlang:4", "hyperexp:0.6667/0.5,0.3333/2", "lognormal:1"]
    degenerate = 0
    for i in range(36):
        rho, w2 = float(rng.uniform(0.05, 0.95)), float(np.exp(rng.uniform(np.log(0.02), np.log(20.0))))
        sizes = range(1, 33) if rng.random() < 0.6 else (1, 2, 4, 8, 16, 32)
        s_max, tail = int(rng.choice([40, 70, 120])), (32 if rng.random() < 0.3 else None)
        m = _model(rho, sizes, s_max, w2, services[i % len(services)], tail)
        res = policy_iteration(m)
        slow = _pi_pivoting(m, _starts(m)[0].copy(), m.costs(), 1000)
        assert res.converged and slow[4]
        assert np.array_equal(res.policy, m.actions[slow[0]]), (i, rho, w2)
        assert res.gain == pytest.approx(slow[1], rel=1e-9), (i, rho, w2)
        degenerate += int(res.policy[-1] == 0)
    assert degenerate >= 2  # the sample reaches the degenerate case


def test_only_the_paths_that_call_blas_hold_one_blas_thread(monkeypatch):
    """The compiled loop calls no BLAS, and switching BLAS's thread count and back cost ~4 % of a small solve: it
    leaves the count alone, while the Python loop (which calls BLAS) holds one thread and gives the count back."""
    from smdp_batch.solvers import threads

    sets: list[int] = []

    class Lib:  # a BLAS library's controller, as threadpoolctl gives it
        num_threads = 2

        def set_num_threads(self, n: int) -> None:
            sets.append(n)
            self.num_threads = n

    monkeypatch.setattr(threads, "_libraries", [Lib()])
    model = truncate(BatchingProblem.basic(rho=0.9), 70)
    pimod.warm_up_pi()  # the process's warm-up (its tiny model runs the Python loop), then the compiled loop
    pimod._load_compiled()
    sets.clear()
    fast = policy_iteration(model)
    assert pimod._compiled["fn"] is not None and sets == []
    monkeypatch.setattr(pimod, "COMPILED_MAX_WORK", 0)  # the Python loop
    slow = policy_iteration(model)
    assert sets == [1, 2]
    assert np.array_equal(fast.policy, slow.policy) and fast.gain == pytest.approx(slow.gain, rel=1e-12)
