"""LLM requests: arrival time (s), prompt and output token counts — from distributions or a CSV trace.

Token-count laws (integers ≥ 1): ``const:N``, ``uniform:A,B`` (integers A..B), ``exp:MEAN``
(geometric with that mean), ``lognormal:MEDIAN,SIGMA``.  A trace CSV has columns ``prompt_tokens``
and ``output_tokens`` and optionally ``arrival_s``; without arrivals the requests arrive as Poisson.
"""

from __future__ import annotations

import csv
import math
from dataclasses import dataclass

import numpy as np

from ..errors import InputError
from .binsim import poisson_times

__all__ = ["Requests", "token_law", "synthetic", "read_trace"]


@dataclass(frozen=True)
class Requests:
    """Arrays of one length: ``arrival`` (s, sorted), ``prompt`` and ``output`` (tokens, ≥ 1)."""

    arrival: np.ndarray
    prompt: np.ndarray
    output: np.ndarray

    def __post_init__(self):
        a, p, o = self.arrival, self.prompt, self.output
        if not (a.shape == p.shape == o.shape and a.ndim == 1 and a.size > 0):
            raise InputError("requests need non-empty arrival, prompt and output arrays of one length")
        if np.any(np.diff(a) < 0) or not np.all(np.isfinite(a)):
            raise InputError("arrival times must be finite and sorted")
        if p.min() < 1 or o.min() < 1:
            raise InputError("prompt and output token counts must be ≥ 1")

    def __len__(self) -> int:
        return self.arrival.size

    def with_arrivals(self, arrival: np.ndarray) -> "Requests":
        return Requests(np.asarray(arrival, dtype=np.float64), self.prompt, self.output)


def token_law(spec: str):
    """A sampler rng, n → int64 token counts ≥ 1 from ``const:N | uniform:A,B | exp:MEAN | lognormal:MEDIAN,SIGMA``."""
    text = str(spec).strip()
    kind, _, rest = text.partition(":")
    try:
        vals = [float(v) for v in rest.split(",")] if rest else []
        if kind == "const" and len(vals) == 1 and vals[0] >= 1:
            n0 = int(vals[0])
            return lambda rng, n: np.full(n, n0, np.int64)
        if kind == "uniform" and len(vals) == 2 and 1 <= vals[0] <= vals[1]:
            a, b = int(vals[0]), int(vals[1])
            return lambda rng, n: rng.integers(a, b + 1, n).astype(np.int64)
        if kind == "exp" and len(vals) == 1 and vals[0] >= 1:
            m = vals[0]
            return lambda rng, n: rng.geometric(1.0 / m, n).astype(np.int64)
        if kind == "lognormal" and len(vals) == 2 and vals[0] >= 1 and vals[1] > 0 and all(map(math.isfinite, vals)):
            med, sig = vals
            return lambda rng, n: np.maximum(1, np.rint(med * np.exp(sig * rng.standard_normal(n)))).astype(np.int64)
    except ValueError:
        pass
    raise InputError(
        f"token-count law {text!r}: use const:N (N ≥ 1), uniform:A,B (1 ≤ A ≤ B), exp:MEAN (MEAN ≥ 1) or "
        "lognormal:MEDIAN,SIGMA (MEDIAN ≥ 1, SIGMA > 0)"
    )


def synthetic(n: int, lam: float, prompt: str = "lognormal:200,0.8", output: str = "lognormal:150,0.7",
              seed: int = 0) -> Requests:
    """n requests, Poisson arrivals at ``lam`` requests/s (inf: all at t = 0), seeded."""
    if isinstance(n, bool) or not isinstance(n, (int, np.integer)) or n < 1:
        raise InputError(f"number of requests must be an integer ≥ 1, got {n!r}")
    rng = np.random.default_rng(seed)
    p, o = token_law(prompt)(rng, n), token_law(output)(rng, n)
    return Requests(poisson_times(lam, n, rng), p, o)


def read_trace(path: str, lam: float | None = None, seed: int = 0) -> Requests:
    """Requests from a CSV with ``prompt_tokens``, ``output_tokens`` [, ``arrival_s``]; ``lam`` replaces
    (or supplies) the arrivals with a Poisson stream."""
    with open(path, newline="") as f:
        rows = list(csv.DictReader(f))
    if not rows:
        raise InputError(f"trace {path!r} has no rows")
    for col in ("prompt_tokens", "output_tokens"):
        if col not in rows[0]:
            raise InputError(f"trace {path!r} needs a column {col!r}; columns: {', '.join(rows[0])}")
    try:
        p = np.array([int(r["prompt_tokens"]) for r in rows], np.int64)
        o = np.array([int(r["output_tokens"]) for r in rows], np.int64)
        a = np.array([float(r["arrival_s"]) for r in rows]) if "arrival_s" in rows[0] and lam is None else None
    except (TypeError, ValueError) as e:
        raise InputError(f"trace {path!r}: token counts must be integers and arrivals numbers ({e})") from None
    if a is None:
        if lam is None:
            raise InputError(f"trace {path!r} has no arrival_s column: give an arrival rate")
        a = poisson_times(lam, p.size, np.random.default_rng(seed))
    order = np.argsort(a, kind="stable")
    return Requests(a[order], p[order], o[order])
