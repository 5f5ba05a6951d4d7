"""BatchingProblem validation: every bad input is one InputError naming the value."""

import math

import pytest

from smdp_batch import BatchingProblem, InputError
from smdp_batch.model import parse_curve


def test_basic_scenario_values():
    p = BatchingProblem.basic(rho=0.9)
    assert p.bmax == 32 and p.bmin == 1
    assert p.max_lam == pytest.approx(32 / (0.3051 * 32 + 1.0524))
    assert p.rho == pytest.approx(0.9)
    assert p.latency_ms()[7] == pytest.approx(0.3051 * 8 + 1.0524)
    assert p.energy_mj()[7] == pytest.approx(19.899 * 8 + 19.603)


@pytest.mark.parametrize(
    "kwargs, match",
    [
        (dict(lam=5.0), "maximum stable λ is Bmax/l\\(Bmax\\) = 2.9586"),
        (dict(lam=0.0), "λ"),
        (dict(lam=-1.0), "λ"),
        (dict(lam=float("nan")), "finite"),
        (dict(lam=1.0, w1=-1), "w1"),
        (dict(lam=1.0, w2=-0.5), "w2"),
        (dict(lam=1.0, w2=float("nan")), "w2"),
        (dict(lam=1.0, latency="affine:-1,40"), "non-decreasing"),
        (dict(lam=1.0, latency="affine:1,-5"), "> 0"),
        (dict(lam=1.0, latency="affine:inf,1"), "finite"),
        (dict(lam=1.0, energy="const:-3"), "energy"),
        (dict(lam=1.0, service="weibull"), "unknown service law"),
        (dict(lam=1.0, batch_sizes=[0, 1]), "positive"),
        (dict(lam=1.0, latency="quadratic:1,2"), "unknown latency model"),
        (dict(lam=1.0, batch_sizes=[1, 2], latency="table:1=1.0"), "no value for batch size"),
    ],
)
def test_bad_inputs(kwargs, match):
    with pytest.raises(InputError, match=match):
        BatchingProblem(**kwargs)


def test_rho_bounds_and_bmin_bmax():
    with pytest.raises(InputError, match="\\(0, 1\\)"):
        BatchingProblem.from_rho(1.0)
    with pytest.raises(InputError, match="Bmin \\(5\\) must be ≤ Bmax \\(3\\)"):
        from smdp_batch.model import batch_size_set

        batch_size_set(5, 3)


def test_explicit_batch_sizes_and_curves():
    p = BatchingProblem.from_rho(0.5, batch_sizes="1,2,4,8,16,32", energy="log:105,60")
    assert p.batch_sizes == (1, 2, 4, 8, 16, 32)
    assert p.energy_mj()[0] == pytest.approx(60.0)
    assert p.energy_mj()[-1] == pytest.approx(105 * math.log(32) + 60)
    for spec in ["affine:0.3051,1.0524", "const:6.0859", "log:105,60", "table:1=1.5,2=2.5"]:
        assert parse_curve(spec).spec() == spec
