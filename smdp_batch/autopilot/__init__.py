"""The Autopilot: a batching table that re-solves itself while it serves (numpy only to import).

It sits above the analysis: its default solver (:func:`~smdp_batch.autopilot.plan.slo_plan`) calls the SLO
optimiser, which it imports when it first runs (numba, scipy), so importing this package costs a server
no more than :mod:`smdp_batch.runtime` does.  Its parts, one module each:

* :mod:`~smdp_batch.autopilot.pilot` — :class:`Autopilot`: the hooks, the solve schedule, swaps and rollbacks;
* :mod:`~smdp_batch.autopilot.responses` — the latest response times and the p99 planned for each;
* :mod:`~smdp_batch.autopilot.report` — :class:`AutopilotMetrics`, the snapshot of its counters and estimates, and
  :class:`EventLog`, its event lines collected;
* :mod:`~smdp_batch.autopilot.estimators` — online λ̂ with CUSUM change points, l̂(b) and its drift, ζ̂(b);
* :mod:`~smdp_batch.autopilot.energy_meter` — ζ̂(b) from a GPU's stepped energy counter, by regression;
* :mod:`~smdp_batch.autopilot.plan` — a plan (table + timer + its planned metrics) and the default solver;
* :mod:`~smdp_batch.autopilot.solve_process` — the lower-priority child process the solves run in;
* :mod:`~smdp_batch.autopilot.prometheus` — its Prometheus collector and endpoint (the ``[metrics]`` extra;
  imported by name, never from here).
"""

from .energy_meter import EnergyMeter, PowerRegression, nvml_meter, open_meter
from .estimators import EnergyEstimator, RateChange, ServiceEstimator
from .pilot import Autopilot
from .report import AutopilotMetrics, EventLog
from .plan import Plan, slo_plan

__all__ = ["Autopilot", "AutopilotMetrics", "EventLog", "Plan", "slo_plan", "EnergyEstimator", "RateChange",
           "ServiceEstimator", "EnergyMeter", "PowerRegression", "nvml_meter", "open_meter"]
