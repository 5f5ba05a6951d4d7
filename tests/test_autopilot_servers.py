"""The Autopilot behind real servers on 127.0.0.1: Ray Serve (``table_batch(autopilot=...)``) and Triton
(PyTriton's binary, decoupled model, an Autopilot-driven DynamicBatcher in the model process).

Bounded loads with a rate step: 150 Poisson requests at λ, then 600 at 3λ (about 12 s of wall time).  The
model is a sleep of l(b) = 8 + 1.5·b ms (real ms: no time scale, the Autopilot learns from real clocks).
Asserted: every request answered exactly once with no errors, and the Autopilot's metrics show a re-solve
and a swap to a table planned near the new rate.  No tight timings (a loaded 2-core machine).
"""

import asyncio
import functools
import math
import time

import numpy as np
import pytest

from smdp_batch.analysis.simulate import poisson_arrivals

LAM, STEP, SLO = 0.03, 3.0, 100.0  # 30 requests/s, then 90/s; p99 SLO 100 ms
PILOT = dict(base_ms=8.0, per_item_ms=1.5, lam=LAM, slo_p99_ms=SLO, min_samples=100, budget_s=60.0,
             min_interval_s=1.0)  # the step phase lasts 7 s: room for a late detection on a loaded machine


def _arrivals(seed=1):
    rng = np.random.default_rng(seed)
    a = poisson_arrivals(LAM, 150, rng)
    b = poisson_arrivals(STEP * LAM, 600, rng)
    return np.concatenate([a, a[-1] + b - b[0] + 1.0 / (STEP * LAM)])


def _settled(read) -> dict | None:
    """The Autopilot's metrics once the load has ended and no solve is in flight (a swap seen, every solve
    accounted for), read every 0.2 s for at most 60 s: a solve started near the end of the load, on a
    loaded machine, finishes after it."""
    m = None
    for _ in range(300):
        m = read()
        if m is not None and m["swaps"] >= 1 and \
                m["solves"] == m["swaps"] + m["kept"] + m["failed_solves"] + m["infeasible"]:
            break
        time.sleep(0.2)
    return m


def _replica_rates(entered: dict, n: int) -> tuple[float, float]:
    """The arrival rates (1/ms) the server itself saw before and after the step (150 requests, then the
    rest), from the times requests entered it (``time.time()`` s).  On a loaded machine these fall short of
    the rates sent (the replica's event loop lets arrivals in late, in clumps), and the estimate can only
    follow what reaches the server."""
    t = np.sort([entered[i] for i in range(n)]) * 1000.0
    return 149.0 / (t[149] - t[0]), (n - 151.0) / (t[-1] - t[150])


def check_step_plan(planned_lam: float, lam: float, slo: float, events: list | None, why) -> None:
    """The live table was solved for the new traffic (λ stepped up 3× from ``lam``), not the old — or, in the
    ``events`` (the Autopilot's event lines, where the server reports them), a swap planned the step and the served
    p99 then broke the SLO by more than the 10 % tolerance under it (a starved CI host: 129 ms), so the table before
    it was put back and the load ended before the next solve ran.  Shared with the Triton bank's test."""
    rolled = [e for e in events or () if e["event"] == "rollback"]
    if rolled and planned_lam <= 1.5 * lam:
        assert all(e["observed_p99_ms"] > 1.1 * slo for e in rolled), why
        # the plan for the step went live by a swap, or re-planned the live one in place ("kept": the same table and
        # timer at the new λ, as a Ray timer plan that did not move does; a starved host then rolled it back)
        assert any(e["event"] in ("swap", "kept") and e.get("lam", 0.0) > 1.5 * lam for e in events or ()), why
    else:
        assert planned_lam > 1.5 * lam, why


def _check_swap(m: dict, seen: tuple[float, float] | None = None, events: list | None = None):
    """The Autopilot re-solved and swapped to a table planned for the new load.  ``seen``: the server's own
    view of the rates before and after the step (where the server reports it); the estimate is judged
    against it, and the load is checked to have reached the server as a step at all.  ``events``: the
    Autopilot's event lines (where the server reports them): a rollback after the swap is then allowed
    where the served p99 broke the SLO under the new table (a starved host), the swap having planned the step."""
    why = f"metrics {m}, rates seen by the server (1/ms): {seen}"
    if seen is not None and not seen[1] > 1.5 * seen[0]:
        # measured beside two busy processes: the replica saw 16/s before and 14/s after (its event loop and
        # the client starved), and batches of 8 + 1.5·b ms took 39-89 ms; there is no step to follow then
        pytest.skip(f"the machine was too busy for the load to reach the server as a step: {why}")
    assert m["failed_solves"] == 0 and m["rejected_inputs"] == 0, why
    assert m["solves"] >= 1 and m["swaps"] >= 1, why  # the step was found and the new table went live
    check_step_plan(m["planned_lam"], LAM, SLO, events, why)
    if seen is None:
        assert m["lam_hat"] > 2.0 * LAM, why  # the estimate followed the step (90/s asked)
    else:  # it rose with what the server saw (no upper bound: a last clump of arrivals let in at once by a starved
        # replica carries λ̂ up; a CI run saw 3.3× the rate the server received over the step)
        assert max(seen[0], seen[1] / 3.0) < m["lam_hat"], why


def _ray_step(arr, name: str, make, live_knobs: bool = False, then=None) -> dict:
    """Replay ``arr`` through an autopilot deployment on a local Ray Serve; what came back and what it reported.
    ``then(h)``: more calls on the handle once the load has ended (its return is ``out["then"]``)."""
    pytest.importorskip("ray.serve")
    from smdp_batch.integrations.ray_serve import RayServe, autopilot_deployment
    from smdp_batch.integrations.loadgen import replay

    with RayServe() as rs:
        h = rs.deploy(autopilot_deployment(name, make, live_knobs=live_knobs), name)

        async def main():
            return await replay(lambda i: h.remote(i, float(i)), arr, 1.0, max_seconds=120.0)

        sent, done, results, errors = asyncio.run(main())
        out = {"results": results, "errors": errors, "m": _settled(lambda: h.metrics.remote().result(timeout_s=60)),
               "batches": h.batches.remote().result(timeout_s=60),
               "entered": {i: t_in for i, t_in, _ in h.served_times.remote().result(timeout_s=60)},
               "events": h.autopilot_events.remote().result(timeout_s=60)}
        out["then"] = then(h) if then is not None else None
    results, batches = out["results"], out["batches"]
    assert out["errors"] == 0 and all(r is not None for r in results)
    assert [r[0] for r in results] == list(range(arr.size))  # request i got request i's answer
    assert [float(r[2][0]) for r in results] == [float(i) for i in range(arr.size)]  # and its own output
    assert sum(b for b, _, _ in batches) == arr.size  # every request in exactly one batch
    assert max(b for b, _, _ in batches) > 1  # it batched
    _check_swap(out["m"], _replica_rates(out["entered"], arr.size), out["events"])
    assert out["m"]["responses_from"] == "served"  # the replica's record (entry → answer) reached it
    return out


@pytest.mark.slow
@pytest.mark.servers
def test_ray_serve_autopilot_swaps_after_a_rate_step_and_answers_every_request_once():
    from smdp_batch.integrations.triton_autopilot import sleep_pilot

    _ray_step(_arrivals(), "pilot", functools.partial(sleep_pilot, **PILOT))


@pytest.mark.slow
@pytest.mark.servers
def test_ray_serve_autopilot_sets_rays_own_batch_timeout_live_after_a_rate_step():
    """``live_knobs=True``: Ray's ``serve.batch`` forms the batches and the Autopilot (family "ray") retimes it;
    a client's own times, once told (``observe_client``), replace the replica's record; told with their request
    ids, each beside its batcher view, they teach the outside delay the client's legs."""
    from smdp_batch.integrations.triton_autopilot import sleep_pilot

    def told(h):
        n = len(_arrivals(3))
        h.observe_client.remote([77.0] * 500, list(range(n - 500, n))).result(timeout_s=60)
        h.remote(0, 0.0).result(timeout_s=60)  # whose own time is no longer told
        return h.metrics.remote().result(timeout_s=60)

    out = _ray_step(_arrivals(3), "knobs", functools.partial(sleep_pilot, **PILOT, family="ray"), True, told)
    m, batches = out["m"], out["batches"]
    assert out["then"]["observed_p99_ms"] == pytest.approx(77.0)
    assert 20.0 < out["then"]["outside_p99_ms"] < math.inf  # 77 ms less batcher views of a few tens of ms
    allowed = set(m["batch_sizes"])  # every batch of a size it plans with was told to it
    assert sum(m["batches"]) == sum(b in allowed for b, _, _ in batches)
    assert m["knob_changes"] >= 1 and m["batch_wait_timeout_ms"] == pytest.approx(m["timer_ms"])  # applied live


def test_live_knobs_refuse_an_autopilot_that_does_not_plan_rays_batcher():
    pytest.importorskip("ray.serve")
    from smdp_batch.autopilot.plan import server_table
    from smdp_batch.errors import InputError
    from smdp_batch.integrations.ray_serve import autopilot_deployment
    from smdp_batch.model.problem import BatchingProblem

    p = BatchingProblem.basic(rho=0.3)
    t = server_table(p, "ray", 12.5, p.lam, "ray:max=32,timeout_s=0.0125")
    assert t.decide(31) == 0 and t.decide(32) == 32 and t.decide(40) == 32 and t.meta["max_wait_ms"] == 12.5
    app = autopilot_deployment("x", lambda: (None, None), live_knobs=True)
    cls = app._bound_deployment.func_or_class  # the replica's class, built here without Ray running
    with pytest.raises(InputError, match="family='ray'"):
        cls()


@pytest.mark.slow
@pytest.mark.servers
def test_triton_autopilot_swaps_after_a_rate_step_and_answers_every_request_once():
    pytest.importorskip("pytriton")
    pytest.importorskip("tritonclient.grpc.aio")
    from smdp_batch.integrations.triton_autopilot import AutopilotModelSpec, AutopilotTriton, run_load

    arr = _arrivals(2)
    spec = AutopilotModelSpec("smdp_batch.integrations.triton_autopilot:sleep_pilot", PILOT)
    with AutopilotTriton({"pilot": spec}) as srv:
        ys: list = []
        sent, done, sizes, errors = run_load(srv, "pilot", arr, make_input=lambda i: [float(i)], outputs=ys)
        m = _settled(lambda: srv.metrics("pilot"))  # the metrics file is written every 0.2 s
        batches = srv.batches("pilot")
    assert errors == 0 and np.all(sizes > 0) and np.isfinite(done).all()
    assert [float(y[0]) for y in ys] == [float(i) for i in range(arr.size)]  # request i got request i's answer
    assert sum(b for b, _, _, _ in batches) == arr.size  # every request in exactly one batch
    assert max(b for b, _, _, _ in batches) > 1
    _check_swap(m, None, m["events"])  # the metrics file carries the event lines
    assert m["responses_from"] == "served"  # the server's record (model entry → answer sent) reached it
    # with the batcher's view beside it: what the server adds after a batch ends (its return leg), learned at the step's
    # load (hundreds of responses); its size is the host's (a few ms alone, a p99 of 89 ms beside the suite's other
    # worker), told one response at a time: no positions
    assert 0.0 <= m["outside_p99_ms"] < math.inf and m["outside_return_ms"] == 0.0, m


def test_table_batch_takes_an_autopilot_and_feeds_its_hooks():
    """No Ray needed: ``table_batch(autopilot=...)`` decides by the Autopilot and tells it of arrivals, batches and
    each call's time to its return (``served=False``: not that, for a caller that tells it a wider view)."""
    from smdp_batch.errors import InputError
    from smdp_batch.integrations.ray_serve import table_batch
    from smdp_batch.runtime import PolicyTable

    class Pilot:  # the Autopilot's interface, recording what the batcher tells it
        table = PolicyTable(np.array([0, 1, 2, 3]), range(1, 4))  # serve what waits, at most 3
        batch_sizes = table.batch_sizes
        max_wait_ms = None

        def __init__(self):
            self.arrivals, self.batches, self.responses, self.served = 0, [], 0, []

        def decide(self, n):
            return self.table.decide(n)

        def observe_arrival(self, t_ms):
            self.arrivals += 1

        def observe_batch(self, b, seconds, ok=True):
            self.batches.append((b, ok))

        def observe_response(self, ms):
            self.responses += len(list(ms))

        def observe_served(self, ms):
            self.served.append(ms)

    pilot = Pilot()

    @table_batch(autopilot=pilot, max_wait_ms=None)
    async def f(items):
        return [x * 10 for x in items]

    async def main():
        return await asyncio.gather(*(f(i) for i in range(4)))

    assert asyncio.run(main()) == [0, 10, 20, 30]
    assert pilot.arrivals == 4 and pilot.responses == 4  # every arrival and response reached the hooks
    assert sorted(b for b, _ in pilot.batches) == [1, 3] and all(ok for _, ok in pilot.batches)  # 4 queued: 3, then 1
    assert len(pilot.served) == 4 and all(0.0 <= ms < 5_000.0 for ms in pilot.served)  # one end-to-end time each
    quiet = Pilot()
    g = table_batch(autopilot=quiet, max_wait_ms=None, served=False)(f.__wrapped__)
    assert asyncio.run(g(5)) == 50 and quiet.served == [] and quiet.responses == 1
    for bad in ({}, {"table": Pilot.table, "autopilot": pilot}, {"autopilot": object()}):
        with pytest.raises(InputError):
            table_batch(**bad)


@pytest.mark.parametrize("freeze", [True, False])
def test_the_triton_model_freezes_the_collector_once_built_unless_told_not_to(tmp_path, freeze):
    """The model process runs gc.collect() + gc.freeze() at the end of ``initialize`` (a full collection then no
    longer walks the framework's heap and stalls serving), and leaves the collector alone with ``freeze_gc=False``.
    Run in this process with the config's own parameters, and unfrozen after."""
    import gc
    import json

    from smdp_batch.integrations.triton_autopilot import AutopilotModelSpec, TritonPythonModel, model_parameters

    spec = AutopilotModelSpec("smdp_batch.integrations.triton_autopilot:sleep_pilot", PILOT, freeze_gc=freeze)
    params = model_parameters(spec, {"batch_log": str(tmp_path / "b.csv"), "metrics_file": str(tmp_path / "m.json")})
    gc.unfreeze()
    model = TritonPythonModel()
    try:
        model.initialize({"model_config": json.dumps({"parameters": {k: {"string_value": v}
                                                                     for k, v in params.items()}})})
        frozen = gc.get_freeze_count()
    finally:
        gc.unfreeze()
        model.finalize()  # its metrics writer joined first: the two once raced for one temporary file
        model.pilot.close()
    assert (frozen > 0) == freeze, frozen
    assert not model.writer.is_alive() and json.loads((tmp_path / "m.json").read_text())["swaps"] == 0
