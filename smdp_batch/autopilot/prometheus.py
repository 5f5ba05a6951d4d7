"""Prometheus metrics of an :class:`~smdp_batch.autopilot.pilot.Autopilot` (the ``[metrics]`` extra).

:class:`AutopilotCollector` is a custom collector (prometheus_client's ``Collector`` protocol): at each scrape
its ``collect()`` reads one :attr:`Autopilot.metrics <smdp_batch.autopilot.pilot.Autopilot.metrics>`
snapshot and yields gauge, counter and histogram families from it, so nothing is updated on the request path
(the Autopilot's hooks only count executed batches per size, which they did already).  Units follow
Prometheus: seconds, joules, watts, requests per second (λ̂ also per millisecond, the unit of the tables' λ);
counters end in ``_total``.  :data:`METRICS` lists every name with its unit and meaning (docs/how-to/autopilot.md,
"Metrics").  A value not known yet (λ̂ in its first 32 gaps after the start or a change point, the last
solve's time before the first solve, no timer) is NaN.

:func:`serve_metrics` serves a registry with the collector (and the process's CPU and memory) over HTTP on
127.0.0.1 by default; register the collector in your own registry instead with
``registry.register(AutopilotCollector(pilot))``.

Importing this module without prometheus_client raises the one-line
:class:`~smdp_batch.errors.InputError` naming the extra (``pip install 'smdp-batch[metrics]'``).
"""

from __future__ import annotations

import math
import socket
import threading
from socketserver import ThreadingMixIn
from typing import Any, Iterator
from wsgiref.simple_server import WSGIRequestHandler, WSGIServer, make_server

from ..extras import missing

try:
    from prometheus_client import CollectorRegistry, make_wsgi_app
    from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily, HistogramMetricFamily, Metric
    from prometheus_client.process_collector import ProcessCollector
    from prometheus_client.utils import floatToGoString
except ImportError:  # one line naming the extra ([metrics])
    raise missing("prometheus_client", "smdp_batch.autopilot.prometheus") from None

from .pilot import Autopilot
from .report import AutopilotMetrics

__all__ = ["AutopilotCollector", "METRICS", "MetricsServer", "serve_metrics"]

_NAN = math.nan

#: name (after the prefix; a histogram's samples add _bucket, _count, _sum) → (type, unit, meaning)
METRICS: dict[str, tuple[str, str, str]] = {
    "autopilot_arrival_rate_per_second": ("gauge", "requests/s", "λ̂, the estimated arrival rate"),
    "autopilot_arrival_rate_per_millisecond": ("gauge", "requests/ms", "λ̂ in the unit of the tables' λ"),
    "autopilot_arrival_rate_band_per_second": ("gauge", "requests/s", "λ̂'s 95 % band (label bound: lower, upper)"),
    "autopilot_batch_latency_seconds": ("gauge", "s", "l̂(b), the estimated batch time (label batch_size)"),
    "autopilot_batch_energy_joules": ("gauge", "J", "ζ̂(b), the estimated batch energy (label batch_size)"),
    "autopilot_idle_power_watts": ("gauge", "W", "the GPU's idle power, estimated by the energy meter (NaN: none)"),
    "autopilot_live_table": ("gauge", "id", "the live table's id (it changes at a swap or a rollback)"),
    "autopilot_planned_arrival_rate_per_second": ("gauge", "requests/s", "the λ the live table was solved for"),
    "autopilot_planned_response_mean_seconds": ("gauge", "s", "the live table's planned mean response time W̄"),
    "autopilot_planned_response_p99_seconds": ("gauge", "s", "the live table's planned p99 response time"),
    "autopilot_planned_power_watts": ("gauge", "W", "the live table's planned mean power P̄"),
    "autopilot_timer_seconds": ("gauge", "s", "the timer in force: the live plan's × the closed loop's multiplier (NaN: none)"),
    "autopilot_timer_scale": ("gauge", "1", "the closed loop's multiplier on the live plan's timer (1: as planned)"),
    "autopilot_responses_end_to_end": ("gauge", "1", "1: the responses judged are end-to-end times (observe_served); "
                                       "0: the batcher's view, entry → batch end"),
    "autopilot_outside_p99_seconds": ("gauge", "s", "the outside delay's p99 learned at λ̂: end-to-end less the batcher's "
                                      "view (NaN before a rate bin holds enough)"),
    "autopilot_outside_return_seconds": ("gauge", "s", "the return per position in a batch, learned with the outside delay"),
    "autopilot_slo_p99_seconds": ("gauge", "s", "the p99 response-time SLO"),
    "autopilot_overhead_seconds": ("gauge", "s", "the given overhead budget: the SLO's share outside the response times the Autopilot is told"),
    "autopilot_excess_seconds": ("gauge", "s", "the learned excess: observed p99 less the live plan's planned p99"),
    "autopilot_target_p99_seconds": ("gauge", "s", "the p99 the next solve plans for: SLO − overhead − excess"),
    "autopilot_observed_response_seconds": (
        "gauge", "s", "observed response-time quantiles of the latest window (label quantile: 0.5, 0.99)"),
    "autopilot_batch_size": ("histogram", "requests", "sizes of the executed batches (one bucket per allowed size)"),
    "autopilot_last_solve_seconds": ("gauge", "s", "how long the last re-solve took (NaN before the first)"),
    "autopilot_solves_total": ("counter", "1", "re-solves started"),
    "autopilot_swaps_total": ("counter", "1", "new tables put live"),
    "autopilot_kept_total": ("counter", "1", "solves that kept the live table (the same, too little saved, or rolled back at this load)"),
    "autopilot_rollbacks_total": ("counter", "1", "tables taken back on observed p99"),
    "autopilot_failed_solves_total": ("counter", "1", "solves that raised, timed out or returned no usable plan"),
    "autopilot_infeasible_solves_total": ("counter", "1", "solves where no table meets the SLO at λ̂"),
    "autopilot_best_effort_total": ("counter", "1", "infeasible solves whose best effort (a lower p99 at λ̂) went live"),
    "autopilot_out_of_range_total": ("counter", "1", "estimates not solved for (λ̂ ≥ 98 % of the stable rate)"),
    "autopilot_late_results_total": ("counter", "1", "results of abandoned solves, dropped"),
    "autopilot_rejected_inputs_total": ("counter", "1", "hook readings ignored (NaN, negative, unknown batch size)"),
}

_COUNTERS = {"autopilot_solves_total": "solves", "autopilot_swaps_total": "swaps", "autopilot_kept_total": "kept",
             "autopilot_rollbacks_total": "rollbacks", "autopilot_failed_solves_total": "failed_solves",
             "autopilot_infeasible_solves_total": "infeasible", "autopilot_out_of_range_total": "out_of_range",
             "autopilot_late_results_total": "late_results", "autopilot_rejected_inputs_total": "rejected_inputs",
             "autopilot_best_effort_total": "best_effort"}


def _s(ms: float | None) -> float:
    """ms → s (None → NaN)."""
    return _NAN if ms is None else float(ms) / 1e3


class AutopilotCollector:
    """The Autopilot's metrics at scrape time (module docstring); ``prefix`` goes before every name."""

    def __init__(self, autopilot: Autopilot, prefix: str = "smdp_batch_"):
        if not isinstance(autopilot, Autopilot):
            raise TypeError(f"AutopilotCollector needs an Autopilot, got {type(autopilot).__name__}")
        self.autopilot, self.prefix = autopilot, str(prefix)

    def describe(self) -> Iterator[Metric]:
        """The families without reading the Autopilot (lets a registry check for name clashes)."""
        for name, (kind, _, doc) in METRICS.items():
            cls = {"gauge": GaugeMetricFamily, "counter": CounterMetricFamily, "histogram": HistogramMetricFamily}[kind]
            yield cls(self.prefix + name, doc)

    def collect(self) -> Iterator[Metric]:
        yield from self.families(self.autopilot.metrics)

    def families(self, m: AutopilotMetrics) -> Iterator[Metric]:
        """The metric families of one snapshot."""
        p = self.prefix

        def gauge(name: str, value: float) -> GaugeMetricFamily:
            return GaugeMetricFamily(p + name, METRICS[name][2], value=float(value))

        lam = _NAN if m.lam_hat is None else float(m.lam_hat)
        yield gauge("autopilot_arrival_rate_per_second", lam * 1e3)
        yield gauge("autopilot_arrival_rate_per_millisecond", lam)
        band = GaugeMetricFamily(p + "autopilot_arrival_rate_band_per_second",
                                 METRICS["autopilot_arrival_rate_band_per_second"][2], labels=["bound"])
        lo, hi = m.lam_band if m.lam_band is not None else (_NAN, _NAN)
        band.add_metric(["lower"], lo * 1e3)
        band.add_metric(["upper"], hi * 1e3)
        yield band
        for name, values in (("autopilot_batch_latency_seconds", m.latency_hat_ms),
                             ("autopilot_batch_energy_joules", m.energy_hat_mj)):
            fam = GaugeMetricFamily(p + name, METRICS[name][2], labels=["batch_size"])
            for b, v in zip(m.batch_sizes, values):
                fam.add_metric([str(b)], float(v) / 1e3)  # ms → s, mJ → J
            yield fam
        yield gauge("autopilot_idle_power_watts", m.idle_power_w)
        yield gauge("autopilot_live_table", m.live_table)
        yield gauge("autopilot_planned_arrival_rate_per_second", m.planned_lam * 1e3)
        yield gauge("autopilot_planned_response_mean_seconds", _s(m.planned_mean_ms))
        yield gauge("autopilot_planned_response_p99_seconds", _s(m.planned_p99_ms))
        yield gauge("autopilot_planned_power_watts", m.planned_power_w)
        yield gauge("autopilot_timer_seconds", _s(m.timer_ms))
        yield gauge("autopilot_timer_scale", m.timer_scale)
        yield gauge("autopilot_responses_end_to_end", float(m.responses_from == "served"))
        yield gauge("autopilot_outside_p99_seconds", _s(m.outside_p99_ms))
        yield gauge("autopilot_outside_return_seconds", _s(m.outside_return_ms))
        yield gauge("autopilot_slo_p99_seconds", _s(self.autopilot.slo_ms))
        yield gauge("autopilot_overhead_seconds", _s(m.overhead_ms))
        yield gauge("autopilot_excess_seconds", _s(m.excess_ms))
        yield gauge("autopilot_target_p99_seconds", _s(m.target_p99_ms))
        obs = GaugeMetricFamily(p + "autopilot_observed_response_seconds",
                                METRICS["autopilot_observed_response_seconds"][2], labels=["quantile"])
        obs.add_metric(["0.5"], _s(m.observed_p50_ms))
        obs.add_metric(["0.99"], _s(m.observed_p99_ms))
        yield obs
        buckets, seen = [], 0
        for b, k in zip(m.batch_sizes, m.batches):
            seen += k
            buckets.append((floatToGoString(b), float(seen)))
        buckets.append(("+Inf", float(seen)))
        yield HistogramMetricFamily(p + "autopilot_batch_size", METRICS["autopilot_batch_size"][2], buckets=buckets,
                                    sum_value=float(sum(b * k for b, k in zip(m.batch_sizes, m.batches))))
        yield gauge("autopilot_last_solve_seconds", m.last_solve_seconds)
        for name, field in _COUNTERS.items():
            yield CounterMetricFamily(p + name, METRICS[name][2], value=float(getattr(m, field)))


class _QuietHandler(WSGIRequestHandler):
    def log_message(self, *args: Any) -> None:  # no line on stderr per scrape
        pass


class MetricsServer:
    """A running metrics endpoint (:func:`serve_metrics`): ``url``, ``port``, ``registry``; ``close()`` stops
    it (also as a context manager)."""

    def __init__(self, server: WSGIServer, thread: threading.Thread, registry: CollectorRegistry, host: str):
        self.server, self.thread, self.registry, self.host = server, thread, registry, host

    @property
    def port(self) -> int:
        return int(self.server.server_port)

    @property
    def url(self) -> str:
        host = f"[{self.host}]" if ":" in self.host else self.host
        return f"http://{host}:{self.port}/metrics"

    def close(self) -> None:
        self.server.shutdown()
        self.server.server_close()
        self.thread.join(5.0)

    def __enter__(self) -> "MetricsServer":
        return self

    def __exit__(self, *exc: Any) -> None:
        self.close()


def serve_metrics(autopilot: Autopilot, port: int, addr: str = "127.0.0.1", *, prefix: str = "smdp_batch_",
                  registry: CollectorRegistry | None = None) -> MetricsServer:
    """Serve the Autopilot's metrics at ``http://addr:port/metrics`` from a daemon thread (port 0: any free one).

    ``registry``: where to register the collector (default: a new one, which also gets prometheus_client's
    process collector: ``process_cpu_seconds_total``, ``process_resident_memory_bytes``, ...).  Bound to
    127.0.0.1 unless ``addr`` says otherwise (``"0.0.0.0"`` for every interface: the metrics carry no secrets,
    but expose them only where your scraper needs them).  When the port cannot be bound, the collector is taken
    out of ``registry`` again, so a retry on another port registers it afresh.
    """
    if registry is None:
        registry = CollectorRegistry()
        ProcessCollector(registry=registry)
    collector = AutopilotCollector(autopilot, prefix)
    registry.register(collector)
    try:
        family = socket.getaddrinfo(addr, port, type=socket.SOCK_STREAM)[0][0]

        class _Server(ThreadingMixIn, WSGIServer):
            daemon_threads = True
            address_family = family

        server = make_server(addr, int(port), make_wsgi_app(registry), _Server, handler_class=_QuietHandler)
    except BaseException:
        registry.unregister(collector)
        raise
    thread = threading.Thread(target=server.serve_forever, name="smdp-autopilot-metrics", daemon=True)
    thread.start()
    return MetricsServer(server, thread, registry, addr)
