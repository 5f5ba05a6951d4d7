"""What the Autopilot reports: :class:`AutopilotMetrics`, one snapshot of its counters and estimates (read by
``Autopilot.metrics``, exported by :mod:`~smdp_batch.autopilot.prometheus`).  Units: ms, W, mJ, 1/ms."""

from __future__ import annotations

import math
from dataclasses import dataclass

__all__ = ["AutopilotMetrics"]


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
