"""The c-server tail boundary's step at the truncation N, configuration by configuration.

Above N every instance serves Bmax.  An arrival at N steps to h(N) plus the increment of the tail's bias, which
depends on the batches running there: a batch with more (or less) time left than an equilibrium Bmax batch moves
the bias's slope.  These tests read that increment off a truncation eight times longer (the same policy, so the
same chain up to N) and check the short truncation's step and average cost against it.
"""

from __future__ import annotations

import numpy as np
import pytest

from smdp_batch.model.multi_server import MultiServerSMDP, phase_type
from smdp_batch.model.problem import BatchingProblem
from smdp_batch.solvers.multi_system import MultiSystem, table_policy

LAWS = ["hyperexp:0.6667/0.5,0.3333/2", "erlang:3", "exp"]


def _pair(service: str, N: int, contention: str | None = None):
    """(short, long): one table (wait at n < 2, serve 2 at n = 2, 3, then 4) evaluated on truncations N and 8·N
    with the tail boundary, two instances at ρ 0.8, sizes 1, 2, 4; each as (system, g, h)."""
    p = BatchingProblem.from_rho(0.8, service=service, instances=2, batch_sizes="1,2,4", contention=contention)
    ph = phase_type(p)
    out = []
    for n_max in (N, 8 * N):
        table = np.array([0, 0, 2, 2] + [4] * (n_max - 3))
        sysm = MultiSystem(MultiServerSMDP(p, ph, n_max), tail=True)
        g, h, _ = sysm.evaluate(table_policy(sysm, table))
        out.append((sysm, g, h))
    return out


@pytest.mark.parametrize("service", LAWS)
@pytest.mark.parametrize("contention", [None, "2:1.4:0.9"])
def test_the_step_into_the_tail_is_the_long_truncations_own_increment_for_each_running_configuration(
        service, contention):
    (short, _, _), (long, g_long, h_long) = _pair(service, 24, contention)
    top = short.top[short.feasible[short.top, 0]]  # the waiting states at N: every instance busy
    conf = short.conf[top]
    seen = h_long[long.model.state(25, conf)] - h_long[long.model.state(24, conf)]
    step = short.delta_at[top] - g_long / short.d
    spread = np.ptp(seen)  # how much the running batches move the increment
    assert spread > 0.5
    assert np.max(np.abs(seen - step)) <= 0.01 * spread


@pytest.mark.parametrize("service", LAWS)
def test_a_short_truncation_already_has_the_long_ones_average_cost(service):
    (_, g_short, _), (_, g_long, _) = _pair(service, 32)
    # one step for every configuration at N was 1e-6 (exponential) to 1.2e-3 (hyperexponential) off here
    assert g_short == pytest.approx(g_long, rel=2e-6)
