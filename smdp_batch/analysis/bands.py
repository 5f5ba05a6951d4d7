"""A λ-bank built by the SLO optimiser: one table + timer per load band, switched online by the runtime.

One setting for a whole load range (:func:`smdp_batch.analysis.slo.optimise` with a range) must meet the SLO
at the low and the high end at once; a bank can do better, one setting per band.  :func:`slo_bank` cuts
[lo, hi] into ``bands`` bands of equal width in log λ, runs the optimiser's table + timer search on each
(every band checked at ≥ 5 loads, both ends), and returns a :class:`~smdp_batch.runtime.PolicyBank` whose
tables record the λ at their band's log-centre (where :class:`~smdp_batch.runtime.AdaptivePolicy` switches
between neighbours: the band edges) and their timer as ``meta["max_wait_ms"]``, which
:class:`~smdp_batch.runtime.DynamicBatcher` takes as its bound under ``max_wait_ms="auto"``.
"""

from __future__ import annotations

import math

import numpy as np

from ..errors import InputError
from ..model.problem import BatchingProblem
from .slo import SLO, SLOAnswer, load_grid, optimise

__all__ = ["slo_bank"]


def slo_bank(problem: BatchingProblem, slo: SLO | dict, lo: float, hi: float, bands: int = 3, *,
             requests: int = 200_000, seed: int = 0):
    """(PolicyBank, [SLOAnswer per band]) for loads lo..hi (requests/ms); raises when a band has no answer."""
    from ..runtime import PolicyBank, PolicyTable

    load_grid(problem, lo, hi)  # the range's checks: order, width, stability
    if not (isinstance(bands, int) and 1 <= bands <= 16):
        raise InputError(f"bands must be an integer in 1..16, got {bands!r}")
    edges = np.geomspace(lo, hi, bands + 1)
    tables, answers = [], []
    for a, b in zip(edges[:-1], edges[1:]):
        lams = load_grid(problem, float(a), float(b))
        ans: SLOAnswer = optimise(problem.replace(lam=lams[-1]), slo, lams, families=("table+timer",),
                                  requests=requests, seed=seed, defaults=False)
        s = ans.best["table+timer"]
        if s is None or s.policy is None:
            raise InputError(f"no table + timer setting meets {ans.slo.text()} over {a * 1e3:.5g}..{b * 1e3:.5g} req/s")
        tau = s.knobs["tau_ms"]
        sizes = s.knobs.get("batch_sizes") or list(problem.batch_sizes)
        meta = {"inputs": {"lam": math.sqrt(a * b)}, "max_wait_ms": tau if math.isfinite(tau) else None,
                "short_batch": "pad-up" if s.knobs.get("forced") == "pad" else "serve", "setting": s.spec,
                "band_per_ms": (float(a), float(b))}
        tables.append(PolicyTable(np.asarray(s.policy, dtype=np.int64), sizes, meta))
        answers.append(ans)
    return PolicyBank(tables), answers
