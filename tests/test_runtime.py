"""Runtime: PolicyTable (numpy + h5py only) and the asyncio DynamicBatcher (issue: server runtime)."""

import asyncio
import random
import subprocess
import sys

import numpy as np
import pytest

from smdp_batch import BatchingProblem, solve
from smdp_batch.errors import InputError
from smdp_batch.export.hdf5 import write_policy
from smdp_batch.runtime import BatcherClosed, DynamicBatcher, PolicyTable, batched


@pytest.fixture(scope="module")
def table_file(tmp_path_factory):
    sol = solve(BatchingProblem.basic(rho=0.7, w2=1.6))
    path = tmp_path_factory.mktemp("rt") / "p.h5"
    write_policy(sol, path)
    return str(path), sol


def test_policy_table_loads_and_decides_for_every_n(table_file):
    path, sol = table_file
    t = PolicyTable.load(path)
    assert t.s_max == sol.s_max and t.lam == pytest.approx(sol.problem.lam)
    # the converged table (paper 004 Table I's w2 = 1.6 case) waits below 10, serves n up to 27, then
    # slightly less than n until 32 from n = 40: not a control-limit table
    assert t.control_limit is None and sol.converged_upto == 40
    assert [t.decide(n) for n in (9, 10, 27, 28, 39, 40, 10_000)] == [0, 10, 27, 27, 31, 32, 32]
    n = np.arange(0, 10 * t.s_max)
    many = t.decide_many(n)
    assert [t.decide(int(k)) for k in n[:200]] == many[:200].tolist()
    assert np.all(many[t.s_max:] == sol.decide(t.s_max))  # eq. 30 beyond s_max
    assert all(t.decide(int(k)) == sol.decide(int(k)) for k in n)
    with pytest.raises(InputError, match="≥ 0"):
        t.decide(-1)
    with pytest.raises(InputError, match="integers ≥ 0"):
        t.decide_many(np.array([1.5]))


@pytest.mark.parametrize(
    "policy, msg",
    [([0, 2], "between 0 and n"), ([0, 1, 0], "waits at its top"), ([[0, 1]], "1-D array"), ([0, 1.5], "1-D array")],
)
def test_policy_table_rejects_malformed_tables(policy, msg):
    with pytest.raises(InputError, match=msg):
        PolicyTable(policy)
    with pytest.raises(InputError, match="not among the allowed sizes"):
        PolicyTable([0, 1, 2, 3], batch_sizes=[1, 2])


def test_runtime_import_needs_neither_numba_nor_jax(table_file):
    code = (
        "import sys, smdp_batch.runtime as rt\n"
        f"t = rt.PolicyTable.load({table_file[0]!r}); t.decide_many(__import__('numpy').arange(10))\n"
        "bad = [m for m in ('numba', 'jax', 'scipy', 'llvmlite') if m in sys.modules]\n"
        "assert not bad, bad\n"
    )
    subprocess.run([sys.executable, "-c", code], check=True)


def _run(coro):
    return asyncio.run(coro)


def test_decision_epochs_follow_the_table():
    """Wait below 3, then serve min(n, 4): nothing moves with 2 waiting; the 3rd arrival starts a batch."""
    seen = []

    async def infer(items):
        seen.append(list(items))
        await asyncio.sleep(0.01)
        return [x * 10 for x in items]

    async def main():
        bt = DynamicBatcher(infer, PolicyTable([0, 0, 0, 3, 4]))
        t1 = asyncio.ensure_future(bt.submit(1))
        t2 = asyncio.ensure_future(bt.submit(2))
        await asyncio.sleep(0.02)
        assert seen == [] and bt.metrics.queue_length == 2
        t3 = asyncio.ensure_future(bt.submit(3))
        # while the batch of 3 runs, 4..8 arrive; at its end 5 wait → serve 4 (FIFO)
        await asyncio.sleep(0)
        later = [asyncio.ensure_future(bt.submit(i)) for i in range(4, 9)]
        assert await asyncio.gather(t1, t2, t3) == [10, 20, 30]
        await asyncio.sleep(0.03)
        assert seen[:2] == [[1, 2, 3], [4, 5, 6, 7]]
        await bt.close(drain=True)  # 8 alone is below the limit: drained at close
        assert await asyncio.gather(*later) == [40, 50, 60, 70, 80]
        assert seen[2] == [8]
        assert bt.metrics.batches == 3 and bt.metrics.mean_batch_size == pytest.approx(8 / 3)

    _run(main())


def test_exceptions_reach_exactly_their_batch():
    async def infer(items):
        await asyncio.sleep(0.005)
        if 13 in items:
            raise KeyError("bad input 13")
        return items

    async def main():
        bt = DynamicBatcher(infer, PolicyTable([0, 1, 2, 3, 4]))
        futs = [asyncio.ensure_future(bt.submit(i)) for i in range(10, 20)]
        out = await asyncio.gather(*futs, return_exceptions=True)
        failed = [i for i, r in zip(range(10, 20), out) if isinstance(r, KeyError)]
        assert 13 in failed and len(failed) <= 4
        assert all(r == i for i, r in zip(range(10, 20), out) if i not in failed)
        await bt.close()

    _run(main())


def test_wrong_result_length_and_shutdown_modes():
    async def short(items):
        return items[:-1]

    async def main():
        bt = DynamicBatcher(short, PolicyTable([0, 1]))
        with pytest.raises(ValueError, match="returned 0 results for a batch of 1"):
            await bt.submit(1)
        await bt.close()
        with pytest.raises(BatcherClosed):
            await bt.submit(2)

        bt = DynamicBatcher(lambda items: items, PolicyTable([0, 0, 0, 0, 0, 5]))
        futs = [asyncio.ensure_future(bt.submit(i)) for i in range(3)]
        await asyncio.sleep(0.01)
        await bt.close(drain=False)
        out = await asyncio.gather(*futs, return_exceptions=True)
        assert all(isinstance(r, BatcherClosed) for r in out)

    _run(main())


def test_decorator_form():
    @batched(PolicyTable([0, 1, 2, 2]))
    async def double(items):
        await asyncio.sleep(0.001)
        return [2 * x for x in items]

    async def main():
        out = await asyncio.gather(*(double(i) for i in range(50)))
        assert out == [2 * i for i in range(50)]
        assert double.batcher.metrics.completed == 50
        await double.batcher.close()

    _run(main())


def test_hundred_thousand_requests_with_cancellations_and_failures():
    """Every caller not cancelled gets exactly one result (the right one) or one exception; nothing hangs."""
    N = 100_000
    rng = random.Random(20261122)

    async def infer(items):
        if rng.random() < 0.5:
            await asyncio.sleep(0)  # callers may be cancelled while their batch runs
        if rng.random() < 0.05:
            raise RuntimeError("injected failure")
        return [x * 3 for x in items]

    async def main():
        sizes = list(range(1, 17))
        table = PolicyTable([0] + [min(n, 16) for n in range(1, 40)], batch_sizes=sizes)
        bt = DynamicBatcher(infer, table)
        outcome = {}

        async def client(i):
            try:
                outcome[i] = ("ok", await bt.submit(i))
            except RuntimeError as e:
                outcome[i] = ("err", str(e))

        tasks = []
        loop = asyncio.get_running_loop()
        for i in range(N):
            t = asyncio.ensure_future(client(i))
            tasks.append(t)
            if rng.random() < 0.1:
                loop.call_later(rng.random() * 0.05, t.cancel)
            if i % 1000 == 0:
                await asyncio.sleep(0)  # arrivals spread over time
        done = await asyncio.wait_for(asyncio.gather(*tasks, return_exceptions=True), timeout=120)
        await asyncio.wait_for(bt.close(), timeout=10)
        cancelled = {i for i, r in enumerate(done) if isinstance(r, asyncio.CancelledError)}
        assert set(outcome) == set(range(N)) - cancelled  # exactly one outcome per non-cancelled caller
        assert all(v == 3 * i for i, (kind, v) in outcome.items() if kind == "ok")
        assert all(v == "injected failure" for kind, v in outcome.values() if kind == "err")
        m = bt.metrics
        assert m.completed + m.failed >= len(outcome) and m.queue_length == 0
        assert sum(b * c for b, c in m.batch_sizes.items()) <= N
        assert 0 < len(cancelled) < N

    _run(main())


# ------------------------------------------------------------------ λ-bank
from smdp_batch.cli import main  # noqa: E402
from smdp_batch.runtime import AdaptivePolicy, PolicyBank, RateEstimator  # noqa: E402


@pytest.fixture(scope="module")
def bank_file(tmp_path_factory):
    path = tmp_path_factory.mktemp("bank") / "bank.h5"
    assert main(["solve", "--rho-grid", "0.3,0.5,0.7,0.9", "--w2", "1.6", "-o", str(path)]) == 0
    return str(path)


def test_bank_holds_the_individual_solutions(bank_file, capsys):
    bank = PolicyBank.load(bank_file)
    assert len(bank) == 4 and np.all(np.diff(bank.lams) > 0)
    for rho, table in zip((0.3, 0.5, 0.7, 0.9), bank.tables):
        sol = solve(BatchingProblem.basic(rho=rho, w2=1.6))
        assert table.lam == pytest.approx(sol.problem.lam) and np.array_equal(table.policy, sol.result.policy[:-1])
    assert bank.table_for(bank.lams[2] * 1.05) is bank.tables[2]
    assert bank.index_for(1e-6) == 0 and bank.index_for(1e6) == 3
    assert main(["show", bank_file, "--json"]) == 0
    assert len(__import__("json").loads(capsys.readouterr().out)["tables"]) == 4
    with pytest.raises(InputError, match="it is a policy bank"):
        PolicyTable.load(bank_file)


@pytest.mark.parametrize("mode", ["window", "ewma"])
def test_rate_estimator_tracks_poisson_arrivals(mode):
    rng = np.random.default_rng(3)
    est = RateEstimator(mode=mode, window=2000, tau_ms=1000.0)
    for t in np.cumsum(rng.exponential(1 / 2.0, 5000)):
        est.observe(t)
    assert est.rate == pytest.approx(2.0, rel=0.06)
    last, count = est._last, est.count
    est.observe(0.0)  # a clock stepped back: zero elapsed time, not an error
    assert est._last == last and est.count == count + 1 and est.rate == pytest.approx(2.0, rel=0.06)
    for bad in (float("nan"), float("inf"), -1.0, "5", True):
        with pytest.raises(InputError, match="arrival time"):
            est.observe(bad)
    assert est._last == last and est.count == count + 1  # unchanged by the refusals


class _FixedRate:
    """An estimator whose estimate the test sets."""

    def __init__(self):
        self.rate = None

    def observe(self, t):
        pass


def test_adaptive_policy_switches_with_hysteresis(bank_file):
    bank = PolicyBank.load(bank_file)
    est = _FixedRate()
    pol = AdaptivePolicy(bank, est, hysteresis=0.1, initial_lam=bank.lams[1])
    mid = np.sqrt(bank.lams[1] * bank.lams[2])  # boundary between tables 1 and 2
    t = 0.0
    for rate in [mid * 0.95, mid * 1.05, mid * 0.97, mid * 1.08]:  # within ±10 %: no flapping
        est.rate = rate
        pol.observe_arrival(t := t + 1)
        assert pol.index == 1
    est.rate = mid * 1.15
    pol.observe_arrival(t := t + 1)
    assert pol.index == 2 and pol.decide(40) == bank.tables[2].decide(40)
    est.rate = mid * 0.95  # back below the boundary, but not by the margin
    pol.observe_arrival(t := t + 1)
    assert pol.index == 2
    est.rate = bank.lams[0] * 0.5  # far below: several steps at once
    pol.observe_arrival(t := t + 1)
    assert pol.index == 0 and [s[2] for s in pol.switches] == [bank.lams[2], bank.lams[0]]


def test_batcher_feeds_arrivals_to_an_adaptive_policy(bank_file):
    pol = AdaptivePolicy(PolicyBank.load(bank_file), RateEstimator(window=64, min_arrivals=8))

    async def main_():
        bt = DynamicBatcher(lambda items: items, pol)
        out = await asyncio.gather(*(bt.submit(i) for i in range(300)))
        await bt.close()
        return out

    assert _run(main_()) == list(range(300))
    assert pol.estimator.count == 300 and pol.estimator.rate > 0


def test_max_wait_is_a_safety_bound_for_traffic_that_stops():
    async def main_():
        bt = DynamicBatcher(lambda items: items, PolicyTable([0, 0, 0, 3, 4], batch_sizes=[1, 2, 3, 4]), max_wait_ms=30)
        t0 = asyncio.get_running_loop().time()
        out = await asyncio.gather(bt.submit("a"), bt.submit("b"))  # below the limit, and nothing else comes
        waited = asyncio.get_running_loop().time() - t0
        assert out == ["a", "b"] and 0.025 <= waited < 1.0
        assert bt.metrics.forced_batches == 1 and bt.metrics.batch_sizes == {2: 1}
        exact = DynamicBatcher(lambda items: items, PolicyTable([0, 0, 0, 3, 4]), max_wait_ms=None)  # asked: no bound
        pending = asyncio.ensure_future(exact.submit("c"))
        await asyncio.sleep(0.05)
        assert not pending.done()
        await exact.close(drain=True)
        assert await pending == "c"
        await bt.close()

    _run(main_())
