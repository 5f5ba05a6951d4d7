"""BucketServe (paper 001, Zheng, Xu, Song, Ye): bucketed prefill batching with memory-safe batch sizes.

* **Buckets** (Alg. 1): start with one bucket [0, L_max); requests go to the bucket holding their
  sequence length S (the prompt).  ADJUSTBUCKETS, run before every dispatch: if all waiting requests
  fit one batch (eq. 6 over them in FCFS order is then bounded only by their number, "total <
  N_max"), merge back into one bucket (lines 11–13); otherwise split each bucket whose
  share of requests below its midpoint exceeds θ = 0.5 and which holds more than m = N_max requests
  at the midpoint (lines 14–29).
* **Safe batch size** (eqs. 5–6): M_safe = 0.9·M_remain, N_max = max{N : Σ_{i≤N} S_i ≤ M_safe/(2LHDB)}.
  Eq. 6 sums the requests' own lengths while eq. 1 charges the batch padded to S_max, so S_i here is
  the padded length S_max of the candidate batch plus the expected output (the KV the request will
  hold at its end): with that, eq. 6 bounds eq. 1's footprint, as the paper intends.
* **Order**: online work serves the bucket holding the oldest request, FCFS within it; offline work
  serves the fullest bucket, shortest (SJF) or longest (LJF) prompts first.
* **Waste** (eqs. 2–3): the engine reports the mean WasteRatio (S_max − S_avg)/S_max of the prefill
  groups; :func:`expected_waste` is eq. 3 for a length distribution and bucket edges.
"""

from __future__ import annotations

import numpy as np

from ..errors import InputError
from .schedulers import Scheduler, _check_int

__all__ = ["Bucket", "BucketServe", "safe_batch_size", "expected_waste"]

MODES = ("online", "sjf", "ljf")


def safe_batch_size(lengths, free_bytes: float, bytes_per_token: float, reserve: float = 0.1) -> int:
    """Eqs. 5–6: the largest N with Σ_{i≤N} S_i ≤ (1 − reserve)·M_remain / (2LHDB)."""
    budget = (1.0 - reserve) * float(free_bytes) / float(bytes_per_token)
    c = np.cumsum(np.asarray(lengths, dtype=np.float64))
    return int(np.searchsorted(c, budget, side="right"))


def expected_waste(samples, edges) -> float:
    """Eq. 3 estimated from length samples: Σ_b E[(1 − S/U_b); S in [L_b, U_b)]."""
    s = np.asarray(samples, dtype=np.float64)
    e = np.asarray(edges, dtype=np.float64)
    idx = np.clip(np.searchsorted(e, s, side="right") - 1, 0, e.size - 2)
    return float(np.mean(1.0 - s / e[idx + 1]))


class Bucket:
    """A length range [low, up) and the ids of its waiting requests (FCFS order)."""

    __slots__ = ("low", "up", "ids")

    def __init__(self, low: float, up: float, ids=None):
        self.low, self.up, self.ids = float(low), float(up), list(ids or [])

    def __repr__(self):
        return f"Bucket([{self.low:g}, {self.up:g}), {len(self.ids)} requests)"


class BucketServe(Scheduler):
    """Paper 001's scheduler for the engine.  ``mode``: "online" (oldest bucket first, FCFS),
    "sjf" or "ljf" (offline: fullest bucket, shortest/longest first).  ``l_max``: the longest
    sequence (tokens); ``theta``: the split threshold of Alg. 1; ``expected_output``: output tokens
    each request is budgeted in eq. 6 (default: the running mean of completed outputs, starting at
    ``prior_output``)."""

    def __init__(self, l_max: int, mode: str = "online", theta: float = 0.5, prior_output: float = 128.0,
                 max_batch: int = 512):
        super().__init__()
        self.l_max = _check_int("l_max", l_max)
        if mode not in MODES:
            raise InputError(f"BucketServe mode must be one of {', '.join(MODES)}, got {mode!r}")
        if not (0 < float(theta) < 1):
            raise InputError(f"θ must lie in (0, 1), got {theta!r}")
        self.mode, self.theta = mode, float(theta)
        self.prior_output = float(prior_output)
        self.max_batch = _check_int("max_batch", max_batch)
        self.buckets = [Bucket(0, self.l_max + 1)]
        self.name = f"BucketServe {mode}"
        self.log: dict[str, list] = {"buckets": []}

    # ---------------------------------------------------------------- queue
    def _len(self, engine, r) -> int:
        return int(engine.requests.prompt[r])

    def push(self, ids, engine) -> None:  # Alg. 1 lines 2–9
        for r in ids:
            s = self._len(engine, r)
            for b in self.buckets:
                if b.low <= s < b.up:
                    b.ids.append(r)
                    break
            else:
                raise InputError(f"request {r} has {s} tokens, more than l_max = {self.l_max}")

    def push_front(self, ids, engine) -> None:
        for r in reversed(list(ids)):
            s = self._len(engine, r)
            next(b for b in self.buckets if b.low <= s < b.up).ids.insert(0, r)

    @property
    def waiting(self) -> int:
        return sum(len(b.ids) for b in self.buckets)

    # ---------------------------------------------------------------- Alg. 1 and eqs. 5–6
    def _out(self, engine) -> float:
        outs = engine.completed_output
        return float(np.mean(outs)) if outs else self.prior_output

    def n_max(self, ids, engine) -> int:
        """Eq. 6 for the candidates ``ids`` in order, each budgeted at the running padded S_max + E[out]."""
        if not ids:
            return 0
        pad = np.maximum.accumulate(engine.requests.prompt[ids].astype(np.float64))
        need = pad * np.arange(1, len(ids) + 1) + self._out(engine) * np.arange(1, len(ids) + 1)
        budget = 0.9 * engine.free_tokens  # eq. 5, in tokens (M/(2LHDB))
        return int(min(np.searchsorted(need, budget, side="right"), self.max_batch))

    def adjust_buckets(self, engine) -> None:
        """ADJUSTBUCKETS (Alg. 1 lines 10–29)."""
        all_ids = [r for b in self.buckets for r in b.ids]
        m = self.n_max(sorted(all_ids), engine)  # N_max over the waiting requests, FCFS
        if len(all_ids) <= m:  # lines 12–13: all waiting requests fit one batch (total < N_max): merge
            if len(self.buckets) > 1:
                self.buckets = [Bucket(0, self.l_max + 1, sorted(all_ids))]
            return
        split = []
        for b in self.buckets:  # lines 16–19
            if not b.ids:
                continue
            mid = 0.5 * (b.low + b.up)
            cs = sum(1 for r in b.ids if self._len(engine, r) < mid)
            if cs / len(b.ids) > self.theta and len(b.ids) > m and b.up - b.low >= 2:
                split.append(b)
        for b in split:  # lines 20–27
            mid = 0.5 * (b.low + b.up)
            left = Bucket(b.low, mid, [r for r in b.ids if self._len(engine, r) < mid])
            right = Bucket(mid, b.up, [r for r in b.ids if self._len(engine, r) >= mid])
            i = self.buckets.index(b)
            self.buckets[i:i + 1] = [left, right]
        if split:
            self.log["buckets"].append(len(self.buckets))

    def admit(self, now, engine) -> list[int]:
        if not self.waiting or 0.9 * engine.free_tokens < self._out(engine) + 1:
            return []  # nothing waits, or eq. 6 admits nobody: skip the bucket pass
        self.adjust_buckets(engine)
        full = [b for b in self.buckets if b.ids]
        if self.mode == "online":  # oldest request first (ids are in arrival order)
            b = min(full, key=lambda q: min(q.ids))
            cand = sorted(b.ids)
        else:
            b = max(full, key=lambda q: len(q.ids))
            cand = sorted(b.ids, key=lambda r: (self._len(engine, r), r), reverse=self.mode == "ljf")
        n = self.n_max(cand, engine)
        take = cand[:n]
        chosen = set(take)
        b.ids = [r for r in b.ids if r not in chosen]
        return take
