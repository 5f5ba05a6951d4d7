"""Issue 17 (runtime): the default safety bound ``max_wait_ms="auto"``.

Its definition (``default_max_wait_ms``): 2 × the (1 − 10⁻⁶) quantile of Erlang(k, λ), k the table's last
waiting queue length.  Measured here in a small event simulation of the batcher's rule (Poisson arrivals,
the table's own batch latencies): how often the bound fires per batch.  ``python tests/test_runtime_bound.py``
prints the figures quoted in the README.
"""

import asyncio
import math

import numpy as np
import pytest

from smdp_batch import BatchingProblem, solve
from smdp_batch.export.hdf5 import write_policy
from smdp_batch.runtime import AdaptivePolicy, DynamicBatcher, PolicyBank, PolicyTable, batched
from smdp_batch.runtime.batcher import FALLBACK_MAX_WAIT_MS, default_max_wait_ms, erlang_quantile_ms

SCENARIOS = {  # name: BatchingProblem.basic kwargs
    "basic rho=0.7 (Q=10)": dict(rho=0.7, w2=1.6),
    "sizes 4,8,16,32 rho=0.7": dict(rho=0.7, w2=1.6, batch_sizes=(4, 8, 16, 32)),
    "exp service rho=0.3": dict(rho=0.3, w2=1.6, service="exp"),
}


def _table(kwargs, path) -> PolicyTable:
    write_policy(solve(BatchingProblem.basic(**kwargs)), path)
    return PolicyTable.load(path)


@pytest.fixture(scope="module")
def tables(tmp_path_factory):
    d = tmp_path_factory.mktemp("bound")
    return {name: _table(kw, d / f"{i}.h5") for i, (name, kw) in enumerate(SCENARIOS.items())}


def simulate_forced(table: PolicyTable, bound_ms: float, lam: float, n: int = 200_000, seed: int = 0):
    """(batches, forced batches) of the batcher's rule under Poisson(lam) arrivals: decide at every arrival
    to an idle server and every batch end; while the table waits, serve the largest allowed batch ≤ n
    (or all n) once the oldest has waited ``bound_ms``.  Service: the table's l(b), deterministic or
    exponential as its model says.  Stops when the arrivals run out (the tail is not counted)."""
    rng = np.random.default_rng(seed)
    arr = np.cumsum(rng.exponential(1.0 / lam, n)).tolist()
    inputs = table.meta["inputs"]
    sizes = [int(b) for b in inputs["batch_sizes"]]
    lat = dict(zip(sizes, (float(x) for x in inputs["latency_ms"])))
    exp = inputs["service"].startswith("exp")
    policy, smax = table.policy.tolist(), table.s_max
    h = i = batches = forced = 0
    t = 0.0
    while i < n:
        if h == i:  # empty and idle: the next arrival is the next epoch
            t = arr[i]
            i += 1
        w = i - h
        b = policy[min(w, smax)]
        if b == 0:
            deadline = arr[h] + bound_ms
            if arr[i] <= deadline:
                t = arr[i]
                i += 1
                continue
            t = max(t, deadline)
            b = max([s for s in sizes if s <= w], default=w)
            forced += 1
        batches += 1
        h += b
        mean = lat[min(s for s in sizes if s >= b)]
        t += rng.exponential(mean) if exp else mean
        while i < n and arr[i] <= t:
            i += 1
    return batches, forced


def test_default_bound_is_twice_the_erlang_quantile(tables):
    scipy_stats = pytest.importorskip("scipy.stats")  # only the test uses scipy; the runtime does not
    for t in tables.values():
        k = int(np.nonzero(t.policy == 0)[0][-1])
        d = default_max_wait_ms(t)
        assert d == pytest.approx(2.0 * scipy_stats.gamma.isf(1e-6, k, scale=1.0 / t.lam), rel=1e-9)
        assert DynamicBatcher(lambda x: x, t).max_wait_ms == pytest.approx(d)
    q10 = tables["basic rho=0.7 (Q=10)"]
    assert int(np.nonzero(q10.policy == 0)[0][-1]) == 9 and default_max_wait_ms(q10) == pytest.approx(29.895, abs=1e-3)
    assert default_max_wait_ms(q10, lam=q10.lam / 2) == pytest.approx(2 * default_max_wait_ms(q10))
    assert erlang_quantile_ms(1, 1.0, 1 - 1e-6) == pytest.approx(-math.log(1e-6))


def test_bound_without_a_rate_and_explicit_no_bound():
    plain = PolicyTable([0, 0, 0, 3, 4])  # no λ recorded
    assert DynamicBatcher(lambda x: x, plain).max_wait_ms == FALLBACK_MAX_WAIT_MS == 1000.0
    assert DynamicBatcher(lambda x: x, lambda n: n).max_wait_ms == FALLBACK_MAX_WAIT_MS
    assert DynamicBatcher(lambda x: x, plain, lam=1.0).max_wait_ms == pytest.approx(
        2 * erlang_quantile_ms(2, 1.0, 1 - 1e-6))
    assert DynamicBatcher(lambda x: x, plain, None).max_wait_ms is None
    assert DynamicBatcher(lambda x: x, plain, math.inf).max_wait_ms is None
    assert DynamicBatcher(lambda x: x, PolicyTable([0, 1, 2]), lam=5.0).max_wait_ms == 0.0  # never waits
    for bad in (-1, "soon", math.nan):
        with pytest.raises(ValueError, match="max_wait_ms"):
            DynamicBatcher(lambda x: x, plain, bad)
    with pytest.raises(ValueError, match="lam"):
        DynamicBatcher(lambda x: x, plain, lam=0.0)


def test_adaptive_policy_bound_follows_its_current_table():
    bank = PolicyBank([PolicyTable([0, 0, 0, 3, 4], meta={"inputs": {"lam": lam}}) for lam in (0.5, 2.0)])
    pol = AdaptivePolicy(bank, initial_lam=0.5)
    bt = DynamicBatcher(lambda x: x, pol)
    assert bt.max_wait_ms == pytest.approx(default_max_wait_ms(bank.tables[0]))
    pol.index = 1
    assert bt.max_wait_ms == pytest.approx(default_max_wait_ms(bank.tables[1]))
    assert default_max_wait_ms(bank.tables[1]) < default_max_wait_ms(bank.tables[0])


def test_last_requests_are_served_when_traffic_stops():
    """Below the control limit and nothing else arrives: the default bound serves them (no option given)."""
    table = PolicyTable([0, 0, 0, 3, 4], batch_sizes=[1, 2, 3, 4], meta={"inputs": {"lam": 1.0}})
    bound = default_max_wait_ms(table)  # 2 × Erlang(2, 1/ms) 1e-6 quantile ≈ 34 ms
    assert 30 < bound < 40

    @batched(table)
    async def echo(items):
        return items

    async def main():
        loop = asyncio.get_running_loop()
        t0 = loop.time()
        out = await asyncio.wait_for(asyncio.gather(echo("a"), echo("b")), 2)
        return out, loop.time() - t0

    out, waited = asyncio.run(main())
    assert out == ["a", "b"] and bound / 1e3 * 0.95 <= waited < 1.0
    assert echo.batcher.metrics.forced_batches == 1 and echo.batcher.metrics.batch_sizes == {2: 1}


@pytest.mark.parametrize("name", list(SCENARIOS))
def test_default_bound_almost_never_fires_under_poisson_traffic(tables, name):
    """At the table's λ (and even at half of it) the default bound fires for < 0.1 % of batches (measured:
    0 in every case); a bound at the mean time (q − 1)/λ to the first serving state q fires often, so the
    simulation does see firings."""
    t = tables[name]
    d = default_max_wait_ms(t)
    batches, forced = simulate_forced(t, d, t.lam)
    assert batches > 10_000 and forced / batches < 1e-3
    batches, forced = simulate_forced(t, d, t.lam / 2, n=100_000, seed=1)
    assert forced / batches < 1e-3
    q = int(np.nonzero(t.policy)[0][0])
    batches, forced = simulate_forced(t, (q - 1) / t.lam, t.lam, n=50_000, seed=2)
    assert forced / batches > 0.05


if __name__ == "__main__":  # the figures for the README
    import tempfile

    d = tempfile.mkdtemp()
    for i, (name, kw) in enumerate(SCENARIOS.items()):
        t = _table(kw, f"{d}/{i}.h5")
        bound = default_max_wait_ms(t)
        k = int(np.nonzero(t.policy == 0)[0][-1])
        row = [f"{name}: k={k}, λ={t.lam:.4g}/ms, bound {bound:.2f} ms"]
        for label, lam, n in (("at λ", t.lam, 1_000_000), ("at λ/2", t.lam / 2, 500_000)):
            b, f = simulate_forced(t, bound, lam, n=n)
            row.append(f"{label}: {f}/{b} batches forced")
        q = int(np.nonzero(t.policy)[0][0])
        b, f = simulate_forced(t, (q - 1) / t.lam, t.lam, n=200_000)
        row.append(f"bound = (q-1)/λ = {(q - 1) / t.lam:.2f} ms: {f / b:.1%} forced")
        print("; ".join(row))
