"""Triton's own batcher retimed live through a bank of loaded models (smdp_batch.integrations.triton_bank).

Without a server: the delay grid, the members' configs, the router's choice of member by the Autopilot's timer in
force and what it tells the Autopilot.  With the real Triton (slow): a bank of four members of a sleep model,
l(b) = 8 + 1.5·b ms, an Autopilot planning Triton's batcher in the client, a rate step; every request answered
once, each batch told to the Autopilot, and the step re-timed onto another member (Triton's delay planned for
p99 ≤ 60 ms: 44.3 ms at 30/s, 39.1 ms at 90/s, on a grid 0, 5.25, 10.5, 21, 42 ms).
"""

from __future__ import annotations

import math
import time

import numpy as np
import pytest

from smdp_batch.errors import InputError
from smdp_batch.integrations.triton_autopilot import AutopilotModelSpec, autopilot_config
from smdp_batch.integrations.triton_bank import BankRouter, bank_delays_us, bank_models
from test_autopilot_servers import check_step_plan  # the live plan followed the step, or a justified rollback


def test_the_delay_grid_is_zero_and_a_geometric_run_of_whole_microseconds():
    d = bank_delays_us(1.0, 40.0, 12)
    assert d[0] == 0 and len(d) == 12 and list(d) == sorted(set(d))
    r = np.array(d[2:]) / np.array(d[1:-1])
    assert np.allclose(r, 40.0 ** (1 / 10), rtol=1e-3)  # one ratio throughout
    for bad in [(1.0, 40.0, 1), (1.0, 40.0, 33), (0.0, 40.0, 4), (5.0, 2.0, 4), (1.0, math.inf, 4), (1.0, 40.0, 3.0),
                (0.001, 0.0012, 5)]:  # the last: too few whole µs between them
        with pytest.raises(InputError):
            bank_delays_us(*bad)


def test_each_member_is_the_model_with_tritons_batcher_at_its_delay():
    spec = AutopilotModelSpec("smdp_batch.integrations.triton_autopilot:sleep_model", {"base_ms": 2.0,
                                                                                        "per_item_ms": 0.5})
    members = bank_models(spec, 32, (0, 2000, 8000))
    assert list(members) == ["bank_0", "bank_2000", "bank_8000"]
    cfg = autopilot_config("bank_8000", members["bank_8000"], {"batch_log": "b", "metrics_file": "m"})
    assert "max_batch_size: 32" in cfg and "max_queue_delay_microseconds: 8000" in cfg and "decoupled" not in cfg
    assert spec.triton_batching is None  # the spec given is left as it was
    for bad in [(32, ()), (32, (0, 0)), (32, (5, 1)), (0, (0,)), (2.5, (0,))]:
        with pytest.raises(InputError):
            bank_models(spec, *bad)


class _Pilot:
    """The Autopilot's interface as the router uses it, recording what it is told."""

    def __init__(self, family="triton", timer=None):
        from smdp_batch.autopilot.plan import Plan
        from smdp_batch.runtime import PolicyTable

        self.plan = Plan(PolicyTable(np.array([0, 0, 2]), (1, 2), {"family": family}), 0.1, timer)
        self.max_wait_ms = timer
        self.arrivals, self.served, self.batches = [], [], []

    def observe_arrival(self, t_ms):
        self.arrivals.append(t_ms)

    def observe_served(self, ms):
        self.served.append(ms)

    def observe_batch(self, b, seconds, ok=True):
        self.batches.append((b, seconds))


class _Server:
    def __init__(self):
        self.logs: dict[str, list] = {}

    def batches_since(self, name, offset):
        rows = self.logs.get(name, [])
        return rows[offset:], len(rows)


def test_the_router_sends_to_the_largest_delay_at_or_below_the_timer_and_tells_the_pilot_what_the_client_sees():
    pilot, server = _Pilot(timer=9.0), _Server()
    members = {"m0": 0, "m2": 2000, "m8": 8000, "m32": 32000}
    router = BankRouter(pilot, members, server, poll_s=0.0)
    assert router.sent() == "m8"  # 8 ms ≤ 9 ms < 32 ms
    pilot.max_wait_ms = 8.0  # exactly a member's delay: that member
    assert router.sent() == "m8" and router.switches == 0
    pilot.max_wait_ms = 1.5  # between 0 and 2 ms: the lower, 0
    server.logs["m8"] = [(3, 10.0, 10.012), (1, 10.02, 10.03)]
    assert router.sent() == "m0" and router.switches == 1
    pilot.max_wait_ms = None  # no timer: the largest delay
    assert router.sent() == "m32" and router.switches == 2
    router.answered(12.5)
    assert len(pilot.arrivals) == 4 and pilot.served == [12.5]
    assert [(b, round(s, 6)) for b, s in pilot.batches] == [(3, 0.012), (1, 0.01)]  # each batch once
    router.poll(force=True)
    assert len(pilot.batches) == 2
    assert router.stats() == {"sent_to": {"m8": 2, "m0": 1, "m32": 1}, "switches": 2, "current": "m32"}
    with pytest.raises(InputError, match="family='triton'"):
        BankRouter(_Pilot("ray"), members)
    with pytest.raises(InputError, match="delay 0"):
        BankRouter(pilot, {"m2": 2000})


class _PairPilot(_Pilot):
    """An Autopilot's ``observe_served``, which takes the batcher's view beside each time."""

    def observe_served(self, ms, batch_ms=None):
        self.served.append((ms, batch_ms))


def test_the_router_tells_the_batchers_view_beside_the_clients_time_to_a_pilot_that_takes_it():
    plain, pairs = _Pilot(timer=9.0), _PairPilot(timer=9.0)
    members = {"m0": 0, "m8": 8000}
    BankRouter(plain, members).answered(12.5, 10.0)  # a pilot whose observe_served(ms) takes one time
    assert plain.served == [12.5]
    router = BankRouter(pairs, members)
    router.answered(12.5, 10.0)
    router.answered(13.0, math.nan)  # no batch end came with the answer: the time alone
    router.answered(14.0)
    assert pairs.served == [(12.5, 10.0), (13.0, None), (14.0, None)]


@pytest.mark.slow
@pytest.mark.servers
def test_a_bank_on_the_real_triton_follows_a_rate_step_and_answers_every_request_once():
    pytest.importorskip("pytriton")
    pytest.importorskip("tritonclient.grpc.aio")
    from smdp_batch.analysis.simulate import poisson_arrivals
    from smdp_batch.autopilot import Autopilot, EventLog
    from smdp_batch.integrations.triton_autopilot import AutopilotTriton, run_load
    from smdp_batch.model.curves import Table
    from smdp_batch.model.problem import BatchingProblem

    lam, slo = 0.03, 60.0  # Triton's delay planned: 44.3 ms at 30/s, 39.1 ms at 90/s
    p = BatchingProblem.basic(rho=0.3)
    sizes = tuple(p.batch_sizes)
    p = p.replace(lam=lam, latency=Table(sizes, tuple(8.0 + 1.5 * b for b in sizes)))
    rng = np.random.default_rng(1)
    a, b = poisson_arrivals(lam, 150, rng), poisson_arrivals(3 * lam, 600, rng)
    arr = np.concatenate([a, a[-1] + b - b[0] + 1.0 / (3 * lam)])
    spec = AutopilotModelSpec("smdp_batch.integrations.triton_autopilot:sleep_model", {"base_ms": 8.0,
                                                                                        "per_item_ms": 1.5})
    delays = bank_delays_us(5.25, 42.0, 5)  # 0, 5.25, 10.5, 21, 42 ms: the step moves off 42
    members = bank_models(spec, 32, delays)
    events = EventLog()
    pilot = Autopilot(p, slo, min_samples=100, budget_s=60.0, min_interval_s=1.0, energy_meter=None,
                      family="triton")  # no learned excess: on a loaded host it can lower the target out of reach
    try:
        with AutopilotTriton(members) as srv:
            router = BankRouter(pilot, {n: d for n, d in zip(members, delays)}, srv)
            ys: list = []
            sent, done, sizes_out, errors = run_load(srv, None, arr, make_input=lambda i: [float(i)], outputs=ys,
                                                     router=router)
            for _ in range(300):  # a solve started near the end finishes after it
                m = pilot.metrics
                if m.swaps >= 1 and m.solves == m.swaps + m.kept + m.failed_solves + m.infeasible:
                    break
                time.sleep(0.2)
            router.poll(force=True)  # the batches logged after the last send
            m = pilot.metrics
            logged = [x for n in members for x in srv.batches(n)]
    finally:
        pilot.close()
        events.close()
    assert errors == 0 and np.all(sizes_out > 0) and np.isfinite(done).all()
    assert [float(np.ravel(y)[0]) for y in ys] == [float(i) for i in range(arr.size)]  # request i got its own answer
    assert sum(b for b, _, _, _ in logged) == arr.size  # every request in exactly one batch, on some member
    assert sum(m.batches) == len(logged)  # every batch told to the Autopilot once
    assert m.responses_from == "served" and m.swaps >= 1, m
    lines = events.lines()
    check_step_plan(pilot.plan.lam, lam, slo, lines, (m, lines))  # or a rollback a starved host justified
    assert pilot.plan.table.meta["family"] == "triton"
    st = router.stats()
    assert sum(st["sent_to"].values()) == arr.size and len(st["sent_to"]) >= 2, st  # re-timed onto another member
    now, t = router.member(), pilot.max_wait_ms  # the member the timer in force names (a plan may have gone live
    k = router.names.index(now)  # after the last send: an outside delay learned late re-plans)
    if t is None:
        assert k + 1 == len(router.names), now  # no timer: the largest delay
    else:
        assert router.delays_ms[k] <= t + 1e-9 and (k + 1 == len(router.names) or router.delays_ms[k + 1] > t), (now, t)
