"""What the Autopilot reports: :class:`AutopilotMetrics`, one snapshot of its counters and estimates (read by
``Autopilot.metrics``, exported by :mod:`~smdp_batch.autopilot.prometheus`), and :class:`EventLog`, its event lines
(a swap, a kept plan, a rollback, a failed solve: one JSON line each on the ``smdp_batch`` logger) collected as
dicts.  Units: ms, W, mJ, 1/ms."""

from __future__ import annotations

import collections
import json
import logging
import math
from dataclasses import dataclass
from typing import Any

__all__ = ["AutopilotMetrics", "EventLog", "event_fields"]

#: What starts each event line on the ``smdp_batch`` logger: ``autopilot {"event": …, …}``.
EVENT_PREFIX = "autopilot "


def event_fields(message: str) -> dict[str, Any] | None:
    """The JSON fields of an Autopilot event line (``autopilot {…}``), or None for any other message (or one that
    only looks like an event line)."""
    if not message.startswith(EVENT_PREFIX):
        return None
    try:
        fields = json.loads(message[len(EVENT_PREFIX):])
    except ValueError:
        return None
    return fields if isinstance(fields, dict) else None


class _Collect(logging.Handler):
    def __init__(self, lines: collections.deque):
        super().__init__(logging.INFO)
        self.lines = lines

    def emit(self, record: logging.LogRecord) -> None:
        fields = event_fields(record.getMessage())
        if fields is not None:
            self.lines.append({**fields, "wall_s": record.created})


class EventLog:
    """The latest ``keep`` Autopilot event lines of this process, from now until :meth:`close` (or the end of a
    ``with`` block), each a dict of its JSON fields plus ``wall_s``, when it was logged (``time.time()`` s).

    It lets the ``smdp_batch`` logger pass INFO where it was set quieter (the events are INFO; failures WARNING),
    and puts the logger's level back on close.

    >>> from smdp_batch.autopilot.report import EventLog
    >>> import logging
    >>> with EventLog() as log:
    ...     logging.getLogger("smdp_batch").info('autopilot {"event": "swap", "live_table": 2}')
    >>> for e in log.lines():
    ...     print(e["event"], e["live_table"])
    swap 2
    """

    def __init__(self, keep: int = 1000):
        self._lines: collections.deque = collections.deque(maxlen=int(keep))
        self._handler = _Collect(self._lines)
        self._logger = logging.getLogger("smdp_batch")
        self._level = self._logger.level
        self._logger.addHandler(self._handler)
        if self._logger.getEffectiveLevel() > logging.INFO:
            self._logger.setLevel(logging.INFO)

    def lines(self) -> list[dict[str, Any]]:
        """The lines collected so far, oldest first."""
        return list(self._lines)

    def close(self) -> None:
        """Stop collecting (the lines stay readable)."""
        if self._handler in self._logger.handlers:
            self._logger.removeHandler(self._handler)
            self._logger.setLevel(self._level)

    def __enter__(self) -> EventLog:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()


@dataclass(frozen=True)
class AutopilotMetrics:
    """A snapshot of the Autopilot's counters and estimates (ms, W, 1/ms)."""

    swaps: int
    rollbacks: int
    failed_solves: int  # raised, timed out, or returned no usable plan
    infeasible: int  # solved, but no table meets the SLO at the estimated load
    out_of_range: int  # an estimate the model cannot take (λ̂ ≥ 98 % of the stable rate)
    solves: int  # started
    late_results: int  # results of abandoned solves, dropped
    last_solve_seconds: float
    live_table: int
    planned_lam: float
    planned_mean_ms: float
    planned_p99_ms: float
    planned_power_w: float
    timer_ms: float | None
    lam_hat: float | None
    lam_band: tuple[float, float] | None
    latency_hat_ms: tuple[float, ...]
    observed_p99_ms: float
    rejected_inputs: int
    last_event: str
    observed_p50_ms: float = math.nan  # of the same window as observed_p99_ms
    batch_sizes: tuple[int, ...] = ()  # 𝓑, the order of the per-size fields below
    batches: tuple[int, ...] = ()  # executed batches of each size (failed ones too), since the start
    energy_hat_mj: tuple[float, ...] = ()  # ζ̂(b)
    excess_ms: float = 0.0  # learned: observed p99 less planned p99 (the server's own delays)
    overhead_ms: float = 0.0  # given: the time outside the response times it judges (network, client)
    target_p99_ms: float = math.nan  # what the next solve plans for: SLO − overhead − excess
    solve_in: str = "thread"  # "process" (a lower-priority child) or "thread"
    kept: int = 0  # solves that kept the live plan (the same table and timer, too little saved, or blocked)
    best_effort: int = 0  # infeasible solves whose best effort went live (a lower p99 at λ̂ than the live plan's)
    energy_source: str = "model"  # where ζ̂(b) comes from: the model, an energy meter, or observe_energy readings
    idle_power_w: float = math.nan  # the energy meter's idle power estimate (W)
    timer_scale: float = 1.0  # the closed loop's multiplier on the live plan's timer (timer_ms is the product)
    responses_from: str = "batcher"  # whose response times it judges: the batcher's hook, or "served" (end-to-end)
    outside_p99_ms: float = math.nan  # the outside delay's p99 learned at λ̂ (end-to-end less the batcher's view)
    outside_return_ms: float = 0.0  # the return per position in a batch, learned with it (ms)
