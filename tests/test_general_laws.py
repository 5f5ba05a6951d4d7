"""The general Laplace-transform route and the extra families (issue: service-time laws).

Independent computations: closed forms vs FFT inversion of eq. 5; closed-form moments vs Richardson
extrapolation of the transform; scipy quadrature of eq. 4 over the quantile function; Monte Carlo of
the samplers; brute-force max of b.
"""

import math

import numpy as np
import pytest
from hypothesis import given, settings, strategies as st
from scipy import integrate, stats

from smdp_batch import BatchingProblem, solve
from smdp_batch.errors import InputError
from smdp_batch.model.families import (
    Empirical, LogNormal, MaxOf, ShiftedExponential, TransformLaw, Uniform,
)
from smdp_batch.model.inversion import invert_pgf, transform_moments
from smdp_batch.model.laws import Deterministic, Erlang, Exponential, Gamma, HyperExponential
from smdp_batch.model.spec import parse_service

CLOSED = [Deterministic(), Exponential(), Erlang(2), Erlang(5), HyperExponential(), Gamma(0.5), Gamma(3.7)]


def _general(law):
    """The same law through the general route: only its transform (at mean 1) is known."""
    return TransformLaw(lambda s: law.lst(s, 1.0), name=law.spec())


def _kmax(m):
    return int(m + 12 * math.sqrt(m) + 60)


# ------------------------------------------------------------------ FFT inversion vs closed forms
@pytest.mark.parametrize("law", CLOSED, ids=lambda x: x.spec())
@pytest.mark.parametrize("m", [0.01, 0.1, 1.0, 10.0, 100.0, 500.0])
def test_fft_inversion_matches_closed_forms(law, m):
    kmax = _kmax(m)
    p, sf = law.arrival(m, kmax)
    inv = invert_pgf(lambda z: law.lst(m * (1.0 - z), 1.0), kmax)
    assert np.max(np.abs(inv.pmf - p)) <= 1e-10
    assert np.max(np.abs(inv.sf - sf)) <= 1e-10
    assert inv.error <= 1e-12  # the stated bound
    g = _general(law)
    pg, sfg = g.arrival(m, kmax)
    assert np.max(np.abs(pg - p)) <= 1e-10 and np.max(np.abs(sfg - sf)) <= 1e-10


@pytest.mark.parametrize("law", CLOSED, ids=lambda x: x.spec())
def test_fft_inversion_at_lambda_l_1000(law):
    m, kmax = 1000.0, 1600
    inv = invert_pgf(lambda z: law.lst(m * (1.0 - z), 1.0), kmax)
    assert np.all(np.isfinite(inv.pmf)) and np.all(np.isfinite(inv.sf))
    assert np.all(inv.pmf >= 0)
    assert abs(inv.pmf.sum() + inv.tail_mass - 1.0) <= 1e-12  # rows sum to 1 after tail accounting
    p, _ = law.arrival(m, kmax)
    assert np.max(np.abs(inv.pmf - p)) <= 1e-10


def test_inversion_rejects_a_non_pgf():
    with pytest.raises(InputError, match="p_1 = .* < 0"):
        invert_pgf(lambda z: 1.2 - 0.2 * z, 20)  # p_1 = −0.2


# ------------------------------------------------------------------ moments
@pytest.mark.parametrize("law", CLOSED + [ShiftedExponential(0.4), Uniform(1, 20)], ids=lambda x: x.spec())
@pytest.mark.parametrize("l", [0.01, 1.0, 37.0])
def test_numerical_moments_match_closed_forms(law, l):
    mom = transform_moments(lambda s: law.lst(s, l))
    assert mom.mean == pytest.approx(l, rel=1e-8)
    assert mom.second == pytest.approx(law.second_moment(l), rel=1e-8)


def test_transform_law_rejects_invalid_transforms():
    with pytest.raises(InputError, match=r"g̃\(0\) must equal 1"):
        TransformLaw(lambda s: 0.9 * np.exp(-s))
    with pytest.raises(InputError, match="not a probability law"):
        TransformLaw(lambda s: 1.3 * np.exp(-s) - 0.3 * np.exp(-3 * s))  # a signed measure
    # Pareto-like mixture of exponentials: finite mean, second moment ∝ Σ 2^{j/2} (effectively infinite)
    j = np.arange(61)
    w = 2.0 ** (-1.5 * j)
    w /= w.sum()
    with pytest.raises(InputError, match="infinite second moment"):
        TransformLaw(lambda s: (w / (1.0 + np.multiply.outer(np.asarray(s), 2.0**j))).sum(axis=-1))
    with pytest.raises(InputError, match="could not be evaluated"):
        TransformLaw(lambda s: math.exp(-s))  # not vectorised over complex arrays
    with pytest.raises(InputError, match="cannot be sampled"):
        _general(Exponential()).sample(np.random.default_rng(0), 1.0, 3)


def test_transform_law_rescales_to_l_of_b():
    g = TransformLaw(lambda s: 1.0 / (1.0 + 5.0 * s))  # an exponential of mean 5, used as a shape
    assert g.second_moment(2.0) == pytest.approx(8.0, rel=1e-9)
    assert complex(g.lst(np.array([0.3]), 2.0)[0]) == pytest.approx(1.0 / 1.6, rel=1e-12)


# ------------------------------------------------------------------ solving through the general route
@pytest.mark.parametrize("service", ["det", "erlang:2", "exp", "hyperexp"])
def test_general_route_solves_like_closed_form_for_fig9_laws(service):
    closed = BatchingProblem.basic(rho=0.5, w2=1.0, service=service)
    sol = solve(closed)
    general = closed.replace(service=_general(closed.service))
    sol_g = solve(general, s_max=sol.s_max, abstract_cost=sol.model.abstract_cost)
    assert np.array_equal(sol_g.policy, sol.result.policy)
    assert sol_g.result.gain == pytest.approx(sol.result.gain, rel=1e-9)


# ------------------------------------------------------------------ families vs independent routes
def _eq4_over_quantile(law, m, k, b=None):
    f = lambda u: stats.poisson.pmf(k, m * law.quantile(np.array([u]), np.array([1.0 - u]), b)[0])
    return integrate.quad(f, 0, 1, limit=1000, epsabs=1e-15, epsrel=1e-12, points=[0.5, 0.9, 0.99])[0]


@pytest.mark.parametrize(
    "law, b",
    [(Uniform(1, 20), None), (Uniform(0, 1), None), (ShiftedExponential(0.3), None), (LogNormal(0.5), None),
     (LogNormal(1.2), None), (parse_service("max:uniform:1,20"), 8)],
    ids=lambda x: x.spec() if hasattr(x, "spec") else str(x),
)
@pytest.mark.parametrize("m", [0.05, 5.0, 100.0])
def test_family_pmf_matches_quadrature_of_eq4(law, b, m):
    kmax = int(4 * m + 60)
    p, sf = law.arrival(m, kmax, b)
    for k in (0, 1, int(m), int(2 * m) + 1):
        assert p[k] == pytest.approx(_eq4_over_quantile(law, m, k, b), abs=1e-12)
    assert abs(p.sum() + sf[-1] - 1.0) <= 1e-12
    assert np.all(np.diff(sf) <= 0)


@pytest.mark.parametrize("m", [0.05, 5.0, 100.0, 1000.0])
def test_max_of_exponentials_matches_renyi_product(m):
    """Max of n Exp(1) = Σ_i Exp(rate i) (Rényi), so its PGF is Π_i i/(i + t(1−z)) exactly."""
    n = 16
    law = parse_service("max:exp@5")
    t = m / sum(1.0 / i for i in range(1, n + 1))  # unit-mean shape: scale by E[max] = H_n
    kmax = int(4 * m + 60)
    exact = invert_pgf(lambda z: np.prod([i / (i + t * (1 - z)) for i in range(1, n + 1)], axis=0), kmax)
    p, sf = law.arrival(m, kmax, n)
    assert np.max(np.abs(p - exact.pmf)) <= 1e-12 and np.max(np.abs(sf - exact.sf)) <= 1e-12
    H2 = sum(1.0 / i**2 for i in range(1, n + 1)) + sum(1.0 / i for i in range(1, n + 1)) ** 2
    assert law.second_moment(1.0, n) == pytest.approx(H2 / sum(1.0 / i for i in range(1, n + 1)) ** 2, rel=1e-12)


@pytest.mark.parametrize("law", [Uniform(1, 20), ShiftedExponential(0.3), Gamma(0.7)], ids=lambda x: x.spec())
@pytest.mark.parametrize("m", [0.01, 20.0, 500.0])
def test_closed_form_families_match_fft_route(law, m):
    kmax = int(3 * m + 12 * math.sqrt(m) + 60)
    p, sf = law.arrival(m, kmax)
    inv = invert_pgf(lambda z: law.lst(m * (1.0 - z), 1.0), kmax)
    assert np.max(np.abs(p - inv.pmf)) <= 1e-10 and np.max(np.abs(sf - inv.sf)) <= 1e-10


def test_uniform_closed_form_against_its_own_quadrature_route():
    law = Uniform(2, 7)
    p, sf = law.arrival(30.0, 200)
    q, sq = super(Uniform, law).arrival(30.0, 200)  # the generic tanh–sinh route
    assert np.max(np.abs(p - q)) <= 1e-12 and np.max(np.abs(sf - sq)) <= 1e-12


def test_mixture_equals_hyperexponential():
    mix = parse_service("mix:0.6666666666666666*exp@0.5;0.3333333333333333*exp@2")
    hyp = HyperExponential()
    for m in (0.3, 40.0):
        assert np.allclose(mix.arrival(m, 300)[0], hyp.arrival(m, 300)[0], atol=1e-15)
    assert mix.second_moment(3.0) == pytest.approx(hyp.second_moment(3.0), rel=1e-14)
    assert parse_service(mix.spec()) == mix


def test_empirical_law_is_an_average_of_poisson_pmfs():
    x = np.array([1.0, 2.0, 2.0, 7.0])
    law = Empirical(x)
    l, lam = 3.0, 0.8  # rescaled: samples x·l/mean(x)
    p = law.arrival_pmf(lam * l, 60)
    ref = np.mean([stats.poisson.pmf(np.arange(61), lam * xi * l / x.mean()) for xi in x], axis=0)
    assert np.allclose(p, ref, atol=1e-15)
    assert law.second_moment(l) == pytest.approx(np.mean((x * l / x.mean()) ** 2), rel=1e-14)


def test_max_of_b_uniform_closed_forms_and_brute_force():
    """Paper 000: request times U[1, 20]; E[max of b] = 1 + 19·b/(b+1); CDF F(x)^b."""
    law = parse_service("max:uniform:1,20")
    for b in (1, 2, 8, 128):
        assert law.natural_mean_of(b) == pytest.approx(1 + 19 * b / (b + 1), rel=1e-12)
        e2 = 1 + 2 * 19 * b / (b + 1) + 19**2 * b / (b + 2)  # E[(1 + 19U)^2], U ~ Beta(b, 1)
        assert law.second_moment(law.natural_mean_of(b), b) == pytest.approx(e2, rel=1e-10)
    rng = np.random.default_rng(3)
    draws = rng.uniform(1, 20, size=(200_000, 8)).max(axis=1)
    mean8 = law.natural_mean_of(8)
    for x in (12.0, 17.0, 19.5):
        assert float(law.cdf(x, mean8, 8)) == pytest.approx(((x - 1) / 19) ** 8, abs=1e-12)
        assert float(law.cdf(x, mean8, 8)) == pytest.approx(np.mean(draws <= x), abs=4e-3)
    s = law.sample(rng, mean8, 200_000, 8)
    assert s.mean() == pytest.approx(mean8, rel=3e-3)


def test_max_of_empirical_is_exact():
    x = np.array([1.0, 3.0, 4.0])
    law = MaxOf(Empirical(x))
    # max of 2 draws: P(1)=1/9, P(3)=3/9, P(4)=5/9
    assert law.natural_mean_of(2) == pytest.approx((1 * 1 + 3 * 3 + 4 * 5) / 9, rel=1e-14)


@pytest.mark.parametrize(
    "law, b",
    [(Gamma(0.6), None), (Uniform(1, 20), None), (ShiftedExponential(0.5), None), (LogNormal(0.7), None),
     (parse_service("mix:0.5*det@0.8;0.5*gamma:2@1.2"), None), (parse_service("max:uniform:1,20"), 16),
     (Empirical([0.5, 1.0, 1.0, 4.0]), None), (HyperExponential(), None)],
    ids=lambda x: x.spec() if hasattr(x, "spec") else str(x),
)
def test_samplers_match_the_law(law, b):
    rng = np.random.default_rng(11)
    l = 2.5
    x = law.sample(rng, l, 400_000, b)
    assert x.mean() == pytest.approx(l, rel=1e-2)
    assert (x**2).mean() == pytest.approx(law.second_moment(l, b), rel=3e-2)
    pts = np.quantile(x, [0.25, 0.5, 0.9])
    assert np.allclose(law.cdf(pts, l, b), [np.mean(x <= p) for p in pts], atol=5e-3)


def test_family_errors_are_one_line_input_errors():
    for spec, msg in [
        ("uniform:5,1", "0 ≤ A < B"), ("uniform:1", "expected 2 number"), ("shiftexp:1", "0 ≤ F < 1"),
        ("lognormal:-1", "0 < σ"), ("gamma:0", "shape α"), ("gamma:x", "shape α"), ("mix:0.5*exp", None),
        ("mix:oops", "W\\*LAW@C"), ("max:gamma:2", "needs the mean request time"), ("max:exp@x", "must be a number"),
        ("max:hyperexp@3", "no quantile function"), ("lst:foo", "cannot be rebuilt"), ("weibull:2", "unknown service law"),
    ]:
        if msg is None:
            parse_service(spec)  # one component is fine
            continue
        with pytest.raises(InputError, match=msg):
            parse_service(spec)


def test_specs_round_trip():
    for spec in ["det", "exp", "erlang:3", "gamma:0.5", "uniform:1,20", "shiftexp:0.25", "lognormal:0.8",
                 "max:uniform:1,20", "max:exp@5", "max:lognormal:0.5@2"]:
        assert parse_service(spec).spec() == spec


# ------------------------------------------------------------------ properties
def _tail_x(law, b):
    """A unit-mean batch time beyond which the law has < 1e-16 mass."""
    if isinstance(law, Empirical):
        return float(law._unit.max())
    return float(law.quantile(np.array([1.0 - 1e-16]), np.array([1e-16]), b)[0])


_laws = st.one_of(
    st.builds(Gamma, st.floats(0.3, 20)),
    st.builds(lambda a, w: Uniform(a, a + w), st.floats(0, 5), st.floats(0.1, 10)),
    st.builds(ShiftedExponential, st.floats(0, 0.95)),
    st.builds(LogNormal, st.floats(0.05, 0.6)),
    st.builds(lambda b: (parse_service("max:uniform:1,20"), b), st.integers(1, 64)),
    st.builds(lambda xs: Empirical(xs), st.lists(st.floats(0.01, 10), min_size=1, max_size=30)),
)


@settings(max_examples=40, deadline=None)
@given(law=_laws, m=st.floats(0.01, 40))
def test_property_pmf_is_a_law_with_mean_m(law, m):
    law, b = law if isinstance(law, tuple) else (law, None)
    kmax = int(m * _tail_x(law, b) + 12 * math.sqrt(m * _tail_x(law, b)) + 60)
    p, sf = law.arrival(m, kmax, b)
    assert np.all(p >= 0) and np.all(sf >= 0)
    assert p.sum() == pytest.approx(1.0, abs=1e-11)
    assert np.arange(kmax + 1) @ p == pytest.approx(m, rel=1e-9)


def test_quadrature_cache_stays_bounded_and_keeps_answering(monkeypatch):
    """Past its bound the cache evicts its oldest entries instead of failing (multibin --batch 5000 raised KeyError)."""
    from smdp_batch.model.quadrature import _BoundedCache

    monkeypatch.setattr(_BoundedCache, "MAX_ENTRIES", 8)
    law = parse_service("max:uniform:1,20")
    first = law.arrival(3.0, 64, 1)
    for b in range(2, 40):
        law.arrival(3.0, 64, b)
    assert len(law._cache) <= 8
    again = law.arrival(3.0, 64, 1)  # recomputed after eviction, identical
    assert np.array_equal(first[0], again[0]) and np.array_equal(first[1], again[1])
