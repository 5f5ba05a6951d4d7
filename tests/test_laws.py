"""Arrival-count laws p_k^[b] (paper 004 eqs. 4–6) against independent computations."""

import math

import numpy as np
import pytest
from hypothesis import given, settings, strategies as st
from scipy import integrate, stats

from smdp_batch.errors import InputError
from smdp_batch.model.laws import Deterministic, Erlang, Exponential, HyperExponential
from smdp_batch.model.spec import parse_service

LAWS = [Deterministic(), Exponential(), Erlang(2), Erlang(5), HyperExponential()]


def _eq4_by_quadrature(law, l, lam, k):
    """p_k = ∫ e^{-λt}(λt)^k/k! dG(t) by direct numerical integration of the density."""
    if isinstance(law, Deterministic):
        return stats.poisson.pmf(k, lam * l)
    if isinstance(law, Exponential):
        dens = lambda t: math.exp(-t / l) / l
    elif isinstance(law, Erlang):
        dens = lambda t: stats.gamma.pdf(t, law.k, scale=l / law.k)
    else:
        dens = lambda t: sum(p * math.exp(-t / (c * l)) / (c * l) for p, c in zip(law.probs, law.scales))
    f = lambda t: stats.poisson.pmf(k, lam * t) * dens(t)
    return integrate.quad(f, 0, np.inf, limit=200, epsabs=1e-14)[0]


@pytest.mark.parametrize("law", LAWS, ids=lambda x: x.spec())
@pytest.mark.parametrize("m", [0.05, 1.3, 7.0])
def test_pmf_matches_quadrature_of_eq4(law, m):
    l, lam = 2.0, m / 2.0
    p = law.arrival_pmf(m, 30)
    for k in (0, 1, 2, 5, 11):
        assert p[k] == pytest.approx(_eq4_by_quadrature(law, l, lam, k), abs=1e-11, rel=1e-7)


@pytest.mark.parametrize("law", LAWS, ids=lambda x: x.spec())
@pytest.mark.parametrize("m", [0.01, 3.0, 50.0, 500.0, 1000.0])
def test_pmf_normalised_mean_and_tail(law, m):
    kmax = int(m * 60 + 400) if not isinstance(law, Deterministic) else int(m + 40 * math.sqrt(m) + 100)
    p = law.arrival_pmf(m, kmax)
    sf = law.arrival_sf(m, kmax)
    assert np.all(np.isfinite(p)) and np.all(p >= 0)
    assert p.sum() + sf[-1] == pytest.approx(1.0, abs=1e-12)
    assert (np.arange(kmax + 1) @ p) == pytest.approx(m, rel=1e-9)
    # the directly computed tail agrees with 1 - cumsum where that is accurate
    assert np.allclose(sf, np.clip(1 - np.cumsum(p), 0, 1), atol=1e-12)


@pytest.mark.parametrize("law", LAWS, ids=lambda x: x.spec())
def test_lst_moments(law):
    """−g̃'(0) = l and g̃''(0) = E[G²] (eq. 1 and eq. 11), by finite differences of the transform."""
    l, h = 1.7, 1e-4
    g = lambda s: float(np.real(law.lst(s, l)))
    assert g(0.0) == pytest.approx(1.0)
    assert -(g(h) - g(-h)) / (2 * h) == pytest.approx(l, rel=1e-7)
    assert (g(h) - 2 * g(0) + g(-h)) / h**2 == pytest.approx(law.second_moment(l), rel=1e-5)


@pytest.mark.parametrize("law", LAWS, ids=lambda x: x.spec())
def test_pgf_matches_transform_eq5(law):
    """A(z) = Σ p_k z^k = g̃(λ(1−z)) (eq. 5)."""
    l, lam = 1.3, 2.0
    p = law.arrival_pmf(lam * l, 400)
    for z in (0.0, 0.3, 0.9):
        assert (p @ z ** np.arange(p.size)) == pytest.approx(float(law.lst(lam * (1 - z), l)), rel=1e-12)


def test_paper_cov_values():
    assert Deterministic().cov() == 0
    assert Erlang(2).cov() == pytest.approx(1 / math.sqrt(2))  # paper says CoV 0.5 for its Erlang-2 (it is 1/√2)
    assert Exponential().cov() == pytest.approx(1.0)
    assert HyperExponential().cov() == pytest.approx(math.sqrt(2.0))


@settings(max_examples=60, deadline=None)
@given(
    kind=st.sampled_from(["det", "exp", "erlang:3", "hyperexp:0.3/0.2,0.7/1.3429"]),
    m=st.floats(min_value=1e-3, max_value=200.0),
)
def test_property_pmf_valid(kind, m):
    law = parse_service(kind)
    kmax = int(40 * m + 200)
    p = law.arrival_pmf(m, kmax)
    assert np.all(p >= 0)
    assert p.sum() + law.arrival_sf(m, kmax)[-1] == pytest.approx(1.0, abs=1e-10)
    assert (np.arange(kmax + 1) @ p) == pytest.approx(m, rel=1e-7)


@pytest.mark.parametrize("bad", ["weibull", "erlang:x", "erlang:0", "hyperexp:0.5/1,0.6/2", "hyperexp:1/-1", "det:3", 5])
def test_bad_service_specs(bad):
    with pytest.raises(InputError):
        parse_service(bad)


def test_spec_round_trip():
    for law in LAWS:
        assert parse_service(law.spec()) == law


@pytest.mark.parametrize("spec", ["det", "exp", "gamma:0.5", "gamma:2.7", "erlang:4", "hyperexp"])
@pytest.mark.parametrize("kmax", [0, 70, 600, 4096])
def test_a_laws_rows_in_one_broadcast_are_its_rows_one_by_one_to_the_bit(spec, kmax):
    """arrival_rows (what the arrival tables use up to k = 4096) gives exactly arrival(m) per row, over means from
    1e-3 to 3 000 arrivals per batch; beyond 4096 it declines and the tables go row by row; and a whole table built
    from it is the table built row by row."""
    from smdp_batch.model.problem import BatchingProblem
    from smdp_batch.model.truncation import _build_arrival_table

    law = parse_service(spec)
    ms = [1e-3, 0.37, 1.0, 5.5, 31.0, 250.0, 3000.0]
    P, F = law.arrival_rows(ms, kmax)
    for i, m in enumerate(ms):
        p, f = law.arrival(m, kmax)
        assert np.array_equal(P[i], p) and np.array_equal(F[i], np.clip(f, 0.0, 1.0))
    assert law.arrival_rows(ms, 4097) is None
    prob = BatchingProblem.from_rho(0.8, batch_sizes=range(1, 33), service=spec)
    whole = _build_arrival_table(prob, kmax)

    class RowByRow(type(law)):  # the same law without its broadcast form
        def arrival_rows(self, ms, kmax):
            return None

    one = RowByRow.__new__(RowByRow)
    one.__dict__.update(law.__dict__)
    for name in getattr(law, "__dataclass_fields__", {}):
        object.__setattr__(one, name, getattr(law, name))
    by_row = _build_arrival_table(prob.replace(service=one), kmax)
    assert np.array_equal(whole.pmf, by_row.pmf) and np.array_equal(whole.sf, by_row.sf)
    assert whole.span == by_row.span
