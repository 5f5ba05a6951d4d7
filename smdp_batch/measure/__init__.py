"""``smdp-batch measure``: your batch function timed (and its energy read) at each batch size, written as the
profile CSV the model reads.  :func:`measure` is the API; the command's parts, one module each:

* :mod:`~smdp_batch.measure.run` — :func:`measure` and :class:`Measurement`: the sizes, the budget, the CSV and
  its sidecar, the contention summary of several callers;
* :mod:`~smdp_batch.measure.worker` — where the calls run: a child process stopped at the budget, failures named;
* :mod:`~smdp_batch.measure.callers` — ``--concurrency``: k callers at once, in threads or helper processes;
* :mod:`~smdp_batch.measure.energy` — the energy counters (NVML between its refreshes, zeus), from installed
  packages only;
* :mod:`~smdp_batch.measure.counter` — NVML's stepped counter and how its refreshes are found (shared with the
  Autopilot's energy meter).
"""

from .run import (CALLERS, CALLS_MAX, CONCURRENCY_MAX, DEFAULT_SIZES, POWER_MAX_W, REPEATS_MAX, SERIAL_SLACK, WARMUP_MAX,
                  Measurement, check_settings, contention_summary, default_make_batch, load_callable, measure,
                  module_sources)

__all__ = ["measure", "Measurement", "load_callable", "default_make_batch", "check_settings", "module_sources",
           "DEFAULT_SIZES", "REPEATS_MAX", "WARMUP_MAX", "CALLS_MAX", "POWER_MAX_W", "CONCURRENCY_MAX", "CALLERS",
           "SERIAL_SLACK", "contention_summary"]
