"""Multi-bin batching (papers 000/003): closed forms vs brute force, quadrature and simulation."""

import math

import numpy as np
import pytest
from scipy import optimize

from smdp_batch.errors import InputError
from smdp_batch.llm import binsim as bs
from smdp_batch.llm import multibin as mb

B, LO, HI = 128, 1.0, 20.0  # paper 000 Fig. 3 / Fig. 4 setting
U = bs.parse_request_law("uniform:1,20")


def test_toy_example_of_section_1():
    times = [1, 5, 2, 6]
    assert mb.toy_makespan(times, 2) == 11.0
    assert mb.toy_makespan(times, 2, edges=[0, 3.5, 7]) == 8.0


def test_lemma_4_1_equal_width_bins_minimise_batch_time():
    # brute force: minimise eq. 10 over the k−1 inner edges numerically
    for k in (2, 3, 5):
        def f(inner):
            e = np.concatenate([[LO], np.sort(np.clip(inner, LO, HI)), [HI]])
            p = np.diff(e) / (HI - LO)
            return float(np.sum(p * (B / (B + 1) * e[1:] + e[:-1] / (B + 1))))
        x0 = np.sort(np.random.default_rng(k).uniform(LO, HI, k - 1))
        best = optimize.minimize(f, x0, method="Nelder-Mead", options=dict(xatol=1e-9, fatol=1e-13, maxiter=20000))
        np.testing.assert_allclose(np.sort(best.x), mb.uniform_boundaries(k, LO, HI)[1:-1], atol=1e-4)
        assert f(mb.uniform_boundaries(k, LO, HI)[1:-1]) == pytest.approx(mb.uniform_batch_time(k, B, LO, HI), rel=1e-13)


def test_eq8_typo_and_theorem_4_2_against_quadrature():
    # E[max of B uniforms on [a, b]] = a/(B+1) + B·b/(B+1) (eq. 17), not eq. 8's swapped weights
    a, b = 3.0, 7.0
    e = mb.batch_time([a, b], B, lambda x: (x - a) / (b - a))
    assert e == pytest.approx(a / (B + 1) + B * b / (B + 1), rel=1e-12)
    for k in (1, 2, 3, 5, 10, 32):
        q = mb.throughput(mb.uniform_boundaries(k, LO, HI), B, U.cdf)
        assert mb.uniform_throughput(k, B, LO, HI) == pytest.approx(q, rel=1e-11)


def test_theorem_4_2_increasing_to_capacity():
    th = [mb.uniform_throughput(k, B, LO, HI) for k in range(1, 200)]
    assert np.all(np.diff(th) > 0)
    c = mb.capacity(B, LO, HI)
    assert c == pytest.approx(128 / 10.5)  # 12.19; the paper rounds it to "≈ 12.3"
    assert th[-1] < c and c - th[-1] < 0.01 * c


def test_theorem_4_3_smallest_k_by_brute_force():
    c = mb.capacity(B, LO, HI)
    for eps in (0.05, 0.1, 0.3, 0.5, 1.0, 2.0, 5.0, c - mb.uniform_throughput(7, B, LO, HI)):
        k = mb.bins_for_throughput(eps, B, LO, HI)
        brute = next(j for j in range(1, 100000) if mb.uniform_throughput(j, B, LO, HI) >= c - eps)
        assert k == brute
    with pytest.raises(InputError, match="ε"):
        mb.bins_for_throughput(c + 1, B, LO, HI)


@pytest.mark.parametrize("k", [1, 2, 3, 5, 10])
def test_fig3_saturation_throughput_within_1pct_of_theorem_4_2(k):
    sims = []
    for seed in range(2):
        rng = np.random.default_rng(seed)
        n = 500_000
        x = U.sample(rng, n)
        bins = bs.assign_bins(x, mb.uniform_boundaries(k, LO, HI))
        sims.append(bs.simulate_bins(np.zeros(n), x, bins, k, B).throughput)
    assert np.mean(sims) == pytest.approx(mb.uniform_throughput(k, B, LO, HI), rel=0.01)


def test_fig3_simulated_throughput_rises_towards_capacity():
    rng = np.random.default_rng(7)
    n = 256_000
    x = U.sample(rng, n)
    th = [bs.simulate_bins(np.zeros(n), x, bs.assign_bins(x, mb.uniform_boundaries(k, LO, HI)), k, B).throughput
          for k in (1, 2, 3, 5, 10, 20)]
    assert np.all(np.diff(th) > 0)
    assert th[-1] < mb.capacity(B, LO, HI)
    # below saturation the throughput is the arrival rate
    arr = bs.poisson_times(4.0, n, rng)
    r = bs.simulate_bins(arr, x, bs.assign_bins(x, mb.uniform_boundaries(2, LO, HI)), 2, B)
    assert r.throughput == pytest.approx(4.0, rel=0.01)


@pytest.mark.parametrize("lam,k", [(0.5, 1), (0.5, 3), (1.0, 2), (1.0, 3)])
def test_lemma_5_1_low_load_latency_within_2pct(lam, k):
    rng = np.random.default_rng(11)
    n = 300_000
    x = U.sample(rng, n)
    arr = bs.poisson_times(lam, n, rng)
    bins = bs.assign_bins(x, mb.uniform_boundaries(k, LO, HI))
    exact = mb.uniform_latency(lam, k, B, LO, HI)
    inf = bs.simulate_bins(arr, x, bins, k, B, servers=0).mean_latency  # Assumption 5.1
    one = bs.simulate_bins(arr, x, bins, k, B, servers=1).mean_latency  # the paper's Fig. 4 system
    assert inf == pytest.approx(exact, rel=0.01)
    assert one == pytest.approx(exact, rel=0.02)
    assert one >= inf - 1e-9  # Remark 5.1: a lower bound


def test_lemma_a1_boundaries_minimise_the_bound_and_corollary_is_a_lower_bound():
    B2, mu = 200, 0.1  # paper 000 Fig. 8 setting
    for k in (2, 3, 4, 6):
        e = mb.exponential_boundaries(k, B2, mu)
        assert e[0] == 0 and math.isinf(e[-1]) and np.all(np.diff(e[:-1]) > 0)

        def f(inner):
            return mb.exponential_bound_terms(np.concatenate([[0.0], np.sort(np.abs(inner)), [math.inf]]), B2, mu)
        best = optimize.minimize(f, e[1:-1] * 1.3, method="Nelder-Mead", options=dict(xatol=1e-10, fatol=1e-14, maxiter=40000))
        assert f(e[1:-1]) <= best.fun + 1e-9
        np.testing.assert_allclose(np.sort(best.x), e[1:-1], rtol=1e-4)
        # the bound holds: exact quadrature throughput, and simulation at saturation
        law = bs.parse_request_law(f"exp:{mu}")
        exact = mb.throughput(e, B2, law.cdf)
        bound = mb.exponential_throughput_bound(k, B2, mu)
        assert exact >= bound
        rng = np.random.default_rng(k)
        x = law.sample(rng, 400_000)
        sim = bs.simulate_bins(np.zeros(x.size), x, bs.assign_bins(x, e), k, B2).throughput
        assert sim == pytest.approx(exact, rel=0.01)
    # k = 1: the bound is exact, E[max of B Exp(μ)] = H_B/μ
    assert mb.exponential_throughput_bound(1, B2, mu) == pytest.approx(B2 * mu / mb.harmonic(B2))


def test_prediction_errors_fig8_of_paper_003():
    rng = np.random.default_rng(3)
    n = 128_000
    x = U.sample(rng, n)
    base = bs.simulate_bins(np.zeros(n), x, np.zeros(n, np.int64), 1, B).throughput
    for k in (2, 4, 8):
        true = bs.assign_bins(x, mb.uniform_boundaries(k, LO, HI))
        th = []
        for p in (0.0, 0.01, 0.05, 0.1, 0.2, 0.5):
            bins = bs.perturb_bins(true, k, p, np.random.default_rng(100 + k))
            th.append(bs.simulate_bins(np.zeros(n), x, bins, k, B).throughput)
        assert np.all(np.diff(th) < 0), th  # falls as the error probability grows
        assert th[1] > base and th[2] > base  # small errors: still above k = 1
    # the error model moves exactly a share p to adjacent bins
    true = bs.assign_bins(x, mb.uniform_boundaries(4, LO, HI))
    moved = bs.perturb_bins(true, 4, 0.2, np.random.default_rng(0))
    d = moved - true
    assert set(np.unique(d)) <= {-1, 0, 1} and np.mean(d != 0) == pytest.approx(0.2, abs=0.005)
    assert moved.min() == 0 and moved.max() == 3


def test_max_wait_sends_partial_batches_and_fixed_rule_edge_cases():
    arr = np.array([0.0, 1.0, 2.0, 10.0, 11.0])
    x = np.array([1.0, 2.0, 3.0, 4.0, 5.0])
    bins = np.zeros(5, np.int64)
    r = bs.simulate_bins(arr, x, bins, 1, 3)  # one full batch at t=2 (time 3), then the flushed pair at t=11
    np.testing.assert_allclose(r.latency, [5, 4, 3, 6, 5])
    # {0,1} at 1.5 (2 s), {2} at 3.5; {10,11} is flushed at the stream's end, 11 (before its 11.5 timeout)
    r = bs.simulate_bins(arr, x, bins, 1, 3, max_wait=1.5)
    np.testing.assert_allclose(r.latency, [3.5, 2.5, 4.5, 6.0, 5.0])
    r = bs.simulate_bins(arr, x, bins, 1, 3, flush=False)  # without the flush the pair never completes
    assert r.served == 3
    with pytest.raises(InputError, match="bin indices"):
        bs.simulate_bins(arr, x, bins + 1, 1, 3)
    with pytest.raises(InputError, match="uniform"):
        bs.parse_request_law("uniform:5,1")


def test_trace_law_and_quantile_boundaries(tmp_path):
    f = tmp_path / "times.csv"
    f.write_text("service_s\n" + "\n".join(str(v) for v in range(1, 101)) + "\n")
    law = bs.parse_request_law(f"trace:{f}:service_s")
    assert law.kind == "empirical" and law.mean == pytest.approx(50.5)
    e = mb.quantile_boundaries(4, law.quantile)
    np.testing.assert_allclose(e, np.quantile(np.arange(1, 101), [0, 0.25, 0.5, 0.75, 1]))
    x = law.sample(np.random.default_rng(0), 50_000)
    bins = bs.assign_bins(x, e)
    assert np.bincount(bins).min() > 0.22 * x.size  # equal mass
    # an empirical law's E[max of B] per bin is exact from its atoms; simulation at saturation agrees
    r = bs.simulate_bins(np.zeros(x.size), x, bins, 4, 8)
    assert r.throughput == pytest.approx(mb.throughput(e, 8, atoms=law.params), rel=0.01)
    # and one bin of atoms 1..100: E[max of 2] = Σ v (F(v)² − F(v−1)²)
    assert mb.batch_time([0, 1000], 2, atoms=range(1, 101)) == pytest.approx(sum(v * ((v / 100) ** 2 - ((v - 1) / 100) ** 2) for v in range(1, 101)))
    with pytest.raises(InputError, match="no column"):
        bs.parse_request_law(f"trace:{f}:nope")
