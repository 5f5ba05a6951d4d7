"""The server rules' timeout knob over a fixed grid: the baseline points drawn beside a trade-off front
(:func:`smdp_batch.analysis.pareto.baseline_points`, paper 004 Fig. 5).

Answering "which setting draws the least power at my SLO" is not done on a grid: that is the SLO
optimiser, :func:`smdp_batch.analysis.slo.optimise`, which ``compare``, ``pareto`` and ``export`` share.
"""

from __future__ import annotations

import numpy as np

from ..baselines.servers import ray_serve, tf_serving, torchserve, triton
from ..model.problem import BatchingProblem

__all__ = ["MAKERS", "timeout_delays"]

#: family → (max batch, delay in ms) → ServerRule
MAKERS = {
    "triton": lambda b, d: triton(b, d * 1000.0),
    "tfserving": lambda b, d: tf_serving(b, d * 1000.0),
    "ray": lambda b, d: ray_serve(b, d / 1000.0),
    "torchserve": lambda b, d: torchserve(b, d),
}


def timeout_delays(problem: BatchingProblem, points: int = 12) -> list[float]:
    """The timeout knob's grid (ms): 0 and ``points`` − 1 log-spaced multiples of l(Bmax) in [0.05, 4]."""
    lmax = float(problem.latency_ms()[-1])
    return [0.0] + [float(x) for x in np.geomspace(0.05, 4.0, int(points) - 1) * lmax]
