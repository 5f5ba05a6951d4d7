"""The Autopilot's Prometheus metrics (smdp_batch.autopilot.prometheus): every metric is in the scrape with
the Autopilot's value in Prometheus units, the HTTP endpoint serves it on 127.0.0.1, and without
prometheus_client the import is the one-line extras error.  The Autopilot is driven with a fake solver and
synthetic arrival times and readings, as in tests/test_autopilot.py."""

from __future__ import annotations

import importlib
import math
import sys
import threading
import urllib.error
import urllib.request

import numpy as np
import pytest

from smdp_batch.errors import InputError
from smdp_batch.model.problem import BatchingProblem
from smdp_batch.runtime import PolicyTable
from smdp_batch.autopilot import Autopilot, Plan
from test_autopilot import SLO, Clock, control, feed  # the Autopilot tests' synthetic clock and streams

def solver(problem, slo_ms, lams):
    """A control-limit table at Q = 3 with made-up planned metrics (timer 6 ms)."""
    table = PolicyTable(control(3), problem.batch_sizes, {"inputs": {"lam": lams[0]}})
    return Plan(table, lams[0], 6.0, 5.0, 0.5 * slo_ms, 20.0, True, "control:3")


def make() -> tuple[Autopilot, BatchingProblem]:
    p = BatchingProblem.basic(rho=0.3)
    start = Plan(PolicyTable(control(8), p.batch_sizes, {"inputs": {"lam": p.lam}}), p.lam, None, 8.0, 30.0, 15.0)
    return Autopilot(p, SLO, start, solver=solver, clock=Clock(), min_interval_s=0.0, rate_tol=10.0), p  # one swap


@pytest.fixture
def prom():
    return pytest.importorskip("prometheus_client")


def text_string_to_metric_families(text: str):
    from prometheus_client.parser import text_string_to_metric_families as parse

    return parse(text)


def scrape(prom, ap: Autopilot, prefix: str = "smdp_batch_") -> tuple[str, dict]:
    from smdp_batch.autopilot.prometheus import AutopilotCollector

    registry = prom.CollectorRegistry()
    registry.register(AutopilotCollector(ap, prefix))
    text = prom.generate_latest(registry).decode()
    samples = {}
    for fam in text_string_to_metric_families(text):
        for s in fam.samples:
            samples[(s.name, tuple(sorted(s.labels.items())))] = s.value
    return text, samples


def driven() -> Autopilot:
    """Arrivals at λ, then 2λ (a swap), batches of sizes 1, 4 (twice, one failed) and 32, energy for size 4, and
    100 response times 1..100 ms."""
    ap, p = make()
    rng = np.random.default_rng(5)
    t = feed(ap, p.lam, 1000, rng)
    feed(ap, 2 * p.lam, 600, rng, t)
    assert ap.join(10) and ap.metrics.swaps == 1
    l = p.latency_ms()
    ap.observe_batch(1, l[0] * 1e-3)
    ap.observe_batch(4, l[3] * 1e-3)
    ap.observe_batch(4, 0.5, ok=False)  # executed (counted in the histogram), teaches nothing
    ap.observe_batch(32, l[31] * 1e-3)
    ap.observe_batch(33, 0.01)  # not an allowed size: rejected, not counted
    ap.observe_energy(4, 2 * p.energy_mj()[3])
    ap.observe_response(np.arange(1.0, 101.0))
    return ap


def test_every_metric_is_scraped_with_the_autopilots_value_in_prometheus_units(prom):
    from smdp_batch.autopilot.prometheus import METRICS

    ap = driven()
    m = ap.metrics
    text, got = scrape(prom, ap)
    kinds = {fam.name: fam.type for fam in text_string_to_metric_families(text)}
    for name, (kind, _, _) in METRICS.items():
        assert kinds["smdp_batch_" + name.removesuffix("_total")] == kind, name  # the parser drops _total
    assert len(kinds) == len(METRICS)

    def one(name, **labels):
        return got[("smdp_batch_" + name, tuple(sorted(labels.items())))]

    assert m.lam_hat == pytest.approx(2 * ap.problem.lam, rel=0.25)
    assert math.isnan(one("autopilot_idle_power_watts")) and m.energy_source == "observe_energy"  # no GPU here
    assert one("autopilot_arrival_rate_per_second") == pytest.approx(m.lam_hat * 1e3, rel=1e-12)
    assert one("autopilot_arrival_rate_per_millisecond") == pytest.approx(m.lam_hat, rel=1e-12)
    lo, hi = m.lam_band
    assert one("autopilot_arrival_rate_band_per_second", bound="lower") == pytest.approx(lo * 1e3, rel=1e-12)
    assert one("autopilot_arrival_rate_band_per_second", bound="upper") == pytest.approx(hi * 1e3, rel=1e-12)
    sizes = ap.problem.batch_sizes
    lat = ap.service.latency_ms()
    energy = ap.energy.energy_mj()
    assert energy[3] > ap.problem.energy_mj()[3]  # the reading moved ζ̂(4)
    for i, b in enumerate(sizes):
        assert one("autopilot_batch_latency_seconds", batch_size=str(b)) == pytest.approx(lat[i] / 1e3, rel=1e-12)
        assert one("autopilot_batch_energy_joules", batch_size=str(b)) == pytest.approx(energy[i] / 1e3, rel=1e-12)
    assert one("autopilot_live_table") == ap.plan.id == m.live_table
    assert one("autopilot_planned_arrival_rate_per_second") == pytest.approx(ap.plan.lam * 1e3, rel=1e-12)
    assert one("autopilot_planned_response_mean_seconds") == pytest.approx(0.005)
    assert one("autopilot_planned_response_p99_seconds") == pytest.approx(SLO / 2 / 1e3)
    assert one("autopilot_planned_power_watts") == 20.0
    # 60 of the 100 responses over the SLO: the closed loop cut the timer by its largest step, e^-0.45
    assert one("autopilot_timer_scale") == m.timer_scale == pytest.approx(math.exp(-0.45))
    assert one("autopilot_responses_end_to_end") == 0.0  # the batcher's view: no observe_served yet
    assert one("autopilot_timer_seconds") == pytest.approx(0.006 * math.exp(-0.45)) and ap.plan.timer_ms == 6.0
    assert one("autopilot_slo_p99_seconds") == pytest.approx(SLO / 1e3)
    assert one("autopilot_observed_response_seconds", quantile="0.5") == pytest.approx(0.0505)
    assert one("autopilot_observed_response_seconds", quantile="0.99") == pytest.approx(0.09901)
    assert m.observed_p50_ms == pytest.approx(50.5) and m.observed_p99_ms == pytest.approx(99.01)
    # the histogram: one bucket per allowed size, cumulative; sizes 1, 4, 4, 32
    buckets = {b: one("autopilot_batch_size_bucket", le=f"{float(b)}") for b in sizes}
    assert buckets[1] == 1 and buckets[3] == 1 and buckets[4] == 3 and buckets[31] == 3 and buckets[32] == 4
    assert one("autopilot_batch_size_bucket", le="+Inf") == 4 and one("autopilot_batch_size_count") == 4
    assert one("autopilot_batch_size_sum") == 1 + 4 + 4 + 32
    assert m.batches[sizes.index(4)] == 2 and sum(m.batches) == 4
    assert one("autopilot_last_solve_seconds") == pytest.approx(m.last_solve_seconds) and m.last_solve_seconds >= 0
    assert one("autopilot_swaps_total") == 1 and one("autopilot_solves_total") == 1
    for name in ("rollbacks", "failed_solves", "infeasible_solves", "out_of_range", "late_results"):
        assert one(f"autopilot_{name}_total") == 0, name
    assert one("autopilot_rejected_inputs_total") == m.rejected_inputs == 1  # the batch of 33


def test_counters_follow_failures_and_unknown_values_are_nan(prom):
    ap, p = make()
    _, got = scrape(prom, ap)
    for name in ("arrival_rate_per_second", "timer_seconds", "last_solve_seconds"):
        assert math.isnan(got[(f"smdp_batch_autopilot_{name}", ())]), name
    assert math.isnan(got[("smdp_batch_autopilot_observed_response_seconds", (("quantile", "0.99"),))])
    assert got[("smdp_batch_autopilot_batch_size_count", ())] == 0
    ap.solver = lambda *a: (_ for _ in ()).throw(RuntimeError("solver bug"))
    rng = np.random.default_rng(6)
    feed(ap, 2 * p.lam, 600, rng, feed(ap, p.lam, 1000, rng))
    ap.join(10)
    _, got = scrape(prom, ap, prefix="svc_")
    assert got[("svc_autopilot_failed_solves_total", ())] == ap.metrics.failed_solves >= 1
    assert got[("svc_autopilot_swaps_total", ())] == 0


def test_the_registry_refuses_a_second_collector_under_the_same_prefix(prom):
    from smdp_batch.autopilot.prometheus import AutopilotCollector

    ap, _ = make()
    registry = prom.CollectorRegistry()
    registry.register(AutopilotCollector(ap))
    with pytest.raises(ValueError, match="Duplicated timeseries"):
        registry.register(AutopilotCollector(ap))
    registry.register(AutopilotCollector(ap, prefix="other_"))
    with pytest.raises(TypeError):
        AutopilotCollector(object())


def test_scrapes_while_the_hooks_run_see_consistent_snapshots(prom):
    ap, p = make()
    rng = np.random.default_rng(7)
    errors, stop = [], threading.Event()

    def scraper():
        while not stop.is_set():
            try:
                _, got = scrape(prom, ap)
                assert got[("smdp_batch_autopilot_batch_size_count", ())] >= 0
            except Exception as exc:  # noqa: BLE001 - reported below
                errors.append(exc)

    th = threading.Thread(target=scraper)
    th.start()
    t = 0.0
    for _ in range(20):
        t = feed(ap, p.lam, 100, rng, t)
        for b in (2, 8, 16):
            ap.observe_batch(b, p.latency_ms()[b - 1] * 1e-3)
        ap.observe_response(rng.uniform(1, 30, 16))
    stop.set()
    th.join(10)
    assert not errors and ap.metrics.batches[ap.sizes.index(8)] == 20


def test_serve_metrics_answers_on_localhost_and_stops(prom):
    from smdp_batch.autopilot.prometheus import serve_metrics

    ap = driven()
    server = serve_metrics(ap, 0)
    try:
        assert server.host == "127.0.0.1" and server.port > 0
        assert server.server.server_address[0] == "127.0.0.1"
        with urllib.request.urlopen(server.url, timeout=10) as r:
            body = r.read().decode()
            assert r.status == 200 and r.headers["Content-Type"].startswith("text/plain")
        assert "smdp_batch_autopilot_swaps_total 1.0" in body
        assert 'smdp_batch_autopilot_batch_size_bucket{le="+Inf"} 4.0' in body
        assert "process_cpu_seconds_total" in body  # the new registry's process collector
    finally:
        server.close()
    assert not server.thread.is_alive()
    with pytest.raises(urllib.error.URLError):
        urllib.request.urlopen(server.url, timeout=2)


def test_without_prometheus_client_the_import_names_the_extra(monkeypatch):
    monkeypatch.setitem(sys.modules, "prometheus_client", None)
    monkeypatch.delitem(sys.modules, "smdp_batch.autopilot.prometheus", raising=False)
    with pytest.raises(InputError) as err:
        importlib.import_module("smdp_batch.autopilot.prometheus")
    msg = str(err.value)
    assert msg == ("smdp_batch.autopilot.prometheus needs prometheus_client: "
                   "pip install 'smdp-batch[metrics]'")
    assert len(msg.splitlines()) == 1
    import smdp_batch.autopilot.pilot  # noqa: F401 - the Autopilot itself needs no extra


def test_the_event_log_collects_the_autopilots_lines_until_closed_and_puts_the_logger_back():
    import logging

    from smdp_batch.autopilot import EventLog

    logger = logging.getLogger("smdp_batch")
    level, handlers = logger.level, list(logger.handlers)
    logger.setLevel(logging.WARNING)  # quieter than the events: the log lets INFO through while it collects
    try:
        with EventLog(keep=3) as log:
            assert logger.getEffectiveLevel() == logging.INFO
            for i in range(5):
                logger.info('autopilot {"event": "swap", "live_table": %d}', i)
            logger.info("autopilot {not json")  # only looks like one: left out
            logger.info("something else")
        logger.info('autopilot {"event": "swap", "live_table": 9}')  # after close: not collected
        assert [e["live_table"] for e in log.lines()] == [2, 3, 4]  # the latest ``keep``
        assert all(isinstance(e["wall_s"], float) for e in log.lines())
        assert logger.level == logging.WARNING and logger.handlers == handlers
        log.close()  # twice is harmless
    finally:
        logger.setLevel(level)


def test_an_autopilots_events_reach_the_event_log():
    from smdp_batch.autopilot import EventLog

    with EventLog() as log:
        ap, p = make()
        rng = np.random.default_rng(3)
        t = feed(ap, p.lam, 1000, rng)
        feed(ap, 3 * p.lam, 600, rng, t)
        assert ap.join(10)
    swaps = [e for e in log.lines() if e["event"] == "swap"]
    assert len(swaps) == ap.metrics.swaps >= 1 and swaps[-1]["live_table"] == ap.metrics.live_table
