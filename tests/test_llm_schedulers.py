"""LLM serving model, BucketServe (paper 001) and paper 002's controllers: every branch as printed,
and the memory cap in simulation."""

import math
from types import SimpleNamespace

import numpy as np
import pytest
from scipy import stats

from smdp_batch.errors import InputError
from smdp_batch.llm.bucketserve import BucketServe, expected_waste, safe_batch_size
from smdp_batch.llm.engine import LLMModel, run
from smdp_batch.llm.memaware import MemoryAware, SLAConstrained, clt_batch_size
from smdp_batch.llm.schedulers import ContinuousFCFS, StaticBatching
from smdp_batch.llm.workload import Requests, read_trace, synthetic, token_law


def fake_engine(prompts, outputs=None, running=(), free_tokens=10_000, completed=(), cap=20_000):
    p = np.asarray(prompts, np.int64)
    o = np.asarray(outputs if outputs is not None else [10] * len(prompts), np.int64)
    req = Requests(np.arange(p.size, dtype=float), p, o)
    model = SimpleNamespace(cap_tokens=cap)
    return SimpleNamespace(requests=req, running=list(running), free_tokens=free_tokens,
                           completed_output=list(completed), model=model, decode_steps=0,
                           recent_step_time=0.0, recent_batch=0.0)


# ----------------------------------------------------------------------------------------- model
def test_eq1_kv_memory_and_cap():
    m = LLMModel(layers=40, heads=40, head_dim=128, bytes_per_elem=2, mem_cap=2**30)
    assert m.kv_bytes(512, 8) == 2 * 40 * 40 * 128 * 512 * 2 * 8
    assert m.cap_tokens == 2**30 // (2 * 40 * 40 * 128 * 2)
    assert m.decode_time(10) == pytest.approx(m.decode_base + 10 * m.decode_per_request)
    with pytest.raises(InputError, match="layers"):
        LLMModel(layers=0)


def test_static_engine_timeline_by_hand():
    m = LLMModel(prefill_base=1.0, prefill_per_token=0.0, decode_base=1.0, decode_per_request=0.0, mem_cap=1e12)
    req = Requests(np.array([0.0, 0.0, 0.5]), np.array([4, 2, 3]), np.array([2, 3, 1]))
    r = run(req, StaticBatching(2), m)
    # batch {0,1}: prefill 1 s, then decode steps end at 2, 3, 4 (request 0 done at 3, 1 at 4);
    # then {2}: prefill 4→5, one decode step → 6
    np.testing.assert_allclose(r.latency, [3.0, 4.0, 5.5])
    assert r.groups == 2 and r.waste == pytest.approx(((4 - 3) / 4 + 0) / 2)


def test_token_laws_and_trace(tmp_path):
    rng = np.random.default_rng(0)
    assert np.all(token_law("const:7")(rng, 5) == 7)
    u = token_law("uniform:3,5")(rng, 1000)
    assert u.min() == 3 and u.max() == 5
    assert token_law("exp:50")(rng, 20000).mean() == pytest.approx(50, rel=0.05)
    with pytest.raises(InputError, match="token-count law"):
        token_law("uniform:5,1")
    f = tmp_path / "t.csv"
    f.write_text("arrival_s,prompt_tokens,output_tokens\n0.5,10,3\n0.1,20,4\n")
    r = read_trace(str(f))
    np.testing.assert_array_equal(r.prompt, [20, 10])
    with pytest.raises(InputError, match="output_tokens"):
        (tmp_path / "bad.csv").write_text("prompt_tokens\n3\n")
        read_trace(str(tmp_path / "bad.csv"))


# ----------------------------------------------------------------------------------------- paper 002
def test_eq12_clt_batch_size_is_the_largest_safe_b():
    eta, mean, var, eps = 13_000.0, 350.0, 4.0e4, 0.05
    b = clt_batch_size(eta, mean, var, eps)
    # P(S > η) = ε_M exactly at b (eq. 11 with equality)
    assert 1 - stats.norm.cdf((eta - b * mean) / math.sqrt(b * var)) == pytest.approx(eps, rel=1e-9)
    for bb in range(1, 60):
        safe = 1 - stats.norm.cdf((eta - bb * mean) / math.sqrt(bb * var)) <= eps
        assert safe == (bb <= b)


def test_alg1_every_branch():
    eta = 20_000
    s = MemoryAware(prior_mean=300, prior_var=1e4, eps_m=0.05, max_batch=40)
    L0 = s.buffer(eta, 300, 1e4)
    b0 = int(clt_batch_size(eta, 300, 1e4, 0.05))
    # line 4 false (no decode requests): b_t = b_{t−1} (initially eq. 12's b)
    eng = fake_engine([100] * 5, running=[], cap=eta)
    s.push([0, 1, 2], eng)
    assert s.batch_size(eng) == min(b0, 40)
    # line 4 false (no prefill requests waiting): unchanged
    s2 = MemoryAware(prior_mean=300, prior_var=1e4, eps_m=0.05, max_batch=40)
    s2.b = 17
    eng = fake_engine([100] * 5, running=[0, 1], cap=eta)
    assert s2.batch_size(eng) == 17
    # line 4 true: line 5's formula with current averages (prompts 100, outputs seen 200)
    s3 = MemoryAware(prior_mean=300, prior_var=1e4, eps_m=0.05, max_batch=1000)
    eng = fake_engine([100] * 6, running=[0, 1], completed=[200, 200], cap=eta)
    s3.push([2, 3], eng)
    assert s3.batch_size(eng) == math.floor((eta - L0) / 300)
    # line 6: clamped below by the running requests …
    s4 = MemoryAware(prior_mean=300, prior_var=1e4, eps_m=0.05, max_batch=1000)
    eng = fake_engine([100] * 200, running=list(range(150)), completed=[200], cap=eta)
    s4.push([150], eng)
    assert s4.batch_size(eng) == 150
    # … and above by B_max
    s5 = MemoryAware(prior_mean=300, prior_var=1e4, eps_m=0.05, max_batch=10)
    eng = fake_engine([100] * 6, running=[0, 1], completed=[200], cap=eta)
    s5.push([2], eng)
    assert s5.batch_size(eng) == 10


def test_alg2_every_branch():
    mk = lambda: SLAConstrained(d_sla=0.05, prior_mean=300, prior_var=1e4, b_min=4, max_batch=200, eps_d=0.005,
                                alpha=8, delta=2)
    s = mk()  # too slow: lines 5–7
    s.low, s.high = 20, 100
    b = s.sla_step(0.08, 60, n_dec=0)
    assert (s.high, s.low) == (max(60, 20 + 8), max(20 - 2, 4)) and b == (18 + 60) // 2
    s = mk()  # fast enough: lines 8–10
    s.low, s.high = 20, 100
    b = s.sla_step(0.02, 60, n_dec=0)
    assert (s.low, s.high) == (min(60, 100 - 8), min(100 + 2, 200)) and b == (60 + 102) // 2
    s = mk()  # within ±ε_D: lines 11–13
    s.low, s.high = 20, 100
    b = s.sla_step(0.052, 60, n_dec=0)
    assert (s.low, s.high) == (60 - 4, 60 + 4) and b == 60
    s = mk()  # line 15: never below the running requests, never above B_max
    assert s.sla_step(0.08, 10, n_dec=150) == 150
    s.low, s.high = 190, 200
    assert s.sla_step(0.02, 199, n_dec=0) <= 200


# ----------------------------------------------------------------------------------------- paper 001
def test_eq6_safe_batch_size_brute_force():
    rng = np.random.default_rng(1)
    for _ in range(50):
        S = rng.integers(1, 500, 30)
        free = float(rng.uniform(1e6, 5e8))
        bpt = 819_200.0
        n = safe_batch_size(S, free, bpt)
        ok = [N for N in range(0, 31) if S[:N].sum() <= 0.9 * free / bpt]
        assert n == max(ok)


def test_eq3_expected_waste():
    rng = np.random.default_rng(2)
    s = rng.uniform(0, 1000, 400_000)
    # one bucket [0, 1000): E[1 − S/1000] = 1/2; halves: ½·E[1 − S/500 | low] + ½·E[1 − S/1000 | high] = ½·½ + ½·¼
    assert expected_waste(s, [0, 1000]) == pytest.approx(0.5, abs=0.003)
    assert expected_waste(s, [0, 500, 1000]) == pytest.approx(0.375, abs=0.003)
    # skewed lengths: bucketing reduces the waste
    t = rng.exponential(100, 100_000).clip(1, 999)
    assert expected_waste(t, [0, 250, 1000]) < expected_waste(t, [0, 1000])


def test_alg1_merge_split_and_order():
    prompts = [10] * 30 + [900] * 5  # skewed to short
    eng = fake_engine(prompts, free_tokens=10**9)
    s = BucketServe(l_max=1000, prior_output=10)
    s.push(list(range(35)), eng)
    # total < N_max (huge memory): lines 12–13 keep/merge one bucket
    s.adjust_buckets(eng)
    assert len(s.buckets) == 1
    # little memory: N_max small → the skewed bucket with > m requests splits at its midpoint
    eng.free_tokens = 2000
    m = s.n_max(sorted(range(35)), eng)
    assert 0 < m < 35
    s.adjust_buckets(eng)
    assert [(b.low, b.up) for b in s.buckets] == [(0, 500.5), (500.5, 1001)]
    assert sorted(len(b.ids) for b in s.buckets) == [5, 30]
    # the short bucket is all below its midpoint but holds only m = 30 requests (not > m): it stays
    assert m == 30
    s.adjust_buckets(eng)
    assert len(s.buckets) == 2
    # with less memory m falls below 30 and it splits again
    eng.free_tokens = 500
    s.adjust_buckets(eng)
    assert len(s.buckets) == 3
    # not skewed (≤ θ below the midpoint): no split
    t = BucketServe(l_max=1000, prior_output=10)
    eng2 = fake_engine([900] * 30, free_tokens=2000)
    t.push(list(range(30)), eng2)
    t.adjust_buckets(eng2)
    assert len(t.buckets) == 1
    # memory frees up: merge back into one bucket
    eng.free_tokens = 10**9
    s.adjust_buckets(eng)
    assert len(s.buckets) == 1 and len(s.buckets[0].ids) == 35


def test_online_oldest_bucket_first_and_offline_sjf_ljf():
    prompts = [800, 20, 30, 10, 25]
    eng = fake_engine(prompts, free_tokens=10**9)
    on = BucketServe(l_max=1000, mode="online", prior_output=1)
    on.buckets = [on.buckets[0].__class__(0, 500), on.buckets[0].__class__(500, 1001)]
    on.push(list(range(5)), eng)
    eng.free_tokens = 2000  # N_max = 2 < 5 waiting: no merge
    assert on.admit(0.0, eng) == [0]  # the bucket holding the oldest request (id 0), alone by eq. 6
    assert on.admit(0.0, eng) == [1, 2, 3, 4]  # the short rest fits one batch: merged (lines 12–13), FCFS
    eng.free_tokens = 10**9
    sjf = BucketServe(l_max=1000, mode="sjf", prior_output=1)
    sjf.push(list(range(5)), eng)
    assert sjf.admit(0.0, eng) == [3, 1, 4, 2, 0]
    ljf = BucketServe(l_max=1000, mode="ljf", prior_output=1)
    ljf.push(list(range(5)), eng)
    assert ljf.admit(0.0, eng) == [0, 2, 4, 1, 3]
    with pytest.raises(InputError, match="mode"):
        BucketServe(l_max=10, mode="fifo")


# ----------------------------------------------------------------------------------------- memory cap
@pytest.mark.parametrize("lam", [2.0, 6.0, math.inf])
def test_no_scheme_exceeds_the_memory_cap(lam):
    m = LLMModel(mem_cap=4 * 2**30)  # 5 242 tokens: tight
    req = synthetic(400, lam, prompt="lognormal:150,0.8", output="lognormal:120,0.7", seed=3)
    tot = req.prompt + req.output
    pm, pv = float(tot.mean()), float(np.var(req.prompt) + np.var(req.output))
    schemes = [StaticBatching(16), ContinuousFCFS(64), BucketServe(int(req.prompt.max())),
               BucketServe(int(req.prompt.max()), "sjf"), BucketServe(int(req.prompt.max()), "ljf"),
               MemoryAware(pm, pv), SLAConstrained(0.024, pm, pv)]
    for s in schemes:
        r = run(req, s, m)
        assert r.peak_tokens <= m.cap_tokens, s.name
        assert np.all(np.isfinite(r.latency)) and r.latency.size == 400
        assert r.output_tokens == int(req.output.sum())


def test_alg1_periodic_update_uses_observed_lengths():
    eng = fake_engine([100] * 10, running=[0], completed=[50, 70], cap=20_000)
    eng.arrivals_left = 0
    s = MemoryAware(prior_mean=1000, prior_var=1e6, eps_m=0.05, update_every=2)
    s.push([1], eng)
    s.batch_size(eng)
    # L_0 now from E = 100 + 60 and Var = 0 + 100 (prompts all 100, outputs 50 and 70)
    assert s.L0 == pytest.approx(s.buffer(20_000, 160, 100))
