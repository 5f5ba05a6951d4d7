"""The responses the Autopilot has seen: the latest ``window`` response times (ms) in a ring, each with the p99
the live plan promised when it was recorded.

Two readings are taken from it: the p99 of a full window (the rollback watch judges a swapped-in plan by it)
and the *excess*, the ring's p99 less the mean p99 planned for the same responses (what the plan does not
model: the server's own delays; learned with ``Autopilot(learn=True)``).  Recording a batch of responses is
two contiguous slice writes, so the hook stays cheap at 10⁴ requests/s.  numpy only; not thread-safe by
itself (the Autopilot holds its lock around every call).
"""

from __future__ import annotations

import math

import numpy as np

__all__ = ["Responses", "response_times"]


def response_times(ms: object, most_ms: float) -> np.ndarray:
    """``ms`` (one response time in ms, or an iterable of them) as a float64 array of the values that are times in
    [0, ``most_ms``]; empty when it is not a number or numbers (10**400 does not fit a float: left out too)."""
    try:
        seq = ms if isinstance(ms, (list, tuple, np.ndarray)) else list(ms) if hasattr(ms, "__iter__") else [ms]
        vals = np.asarray(seq, dtype=np.float64).ravel()
    except (TypeError, ValueError, OverflowError):
        return np.empty(0)
    return vals[np.isfinite(vals) & (vals >= 0) & (vals <= most_ms)]


class Responses:
    """A ring of the latest ``window`` response times (ms) and the planned p99 (ms) beside each."""

    def __init__(self, window: int):
        self.window = int(window)
        self._ms = np.full(self.window, math.nan)
        self._planned = np.full(self.window, math.nan)
        self._i = 0

    def add(self, ms: np.ndarray, planned_p99_ms: float) -> None:
        """Record finite response times ``ms`` (at most ``window`` of them; the oldest leave the ring)."""
        ms = ms[-self.window:]
        i, n, w = self._i, ms.size, self.window
        head = min(n, w - i)  # contiguous slices into the rings (cheaper than fancy indexing)
        self._ms[i:i + head] = ms[:head]
        self._planned[i:i + head] = planned_p99_ms
        if head < n:
            self._ms[:n - head] = ms[head:]
            self._planned[:n - head] = planned_p99_ms
        self._i = (i + n) % w

    def p99(self, last: int | None = None) -> float:
        """The p99 of the ring (ms), read when a full window of responses has been recorded; of its ``last``
        responses (at most ``window``) when given."""
        if last is None or last >= self.window:
            return float(np.percentile(self._ms, 99))
        return float(np.percentile(self._ms[(self._i - np.arange(1, max(last, 1) + 1)) % self.window], 99))

    def percentiles(self, qs: tuple[float, ...]) -> tuple[float, ...]:
        """The percentiles ``qs`` of the responses recorded so far (ms); NaN each while there are none."""
        seen = self._ms[np.isfinite(self._ms)]
        return tuple(float(x) for x in np.percentile(seen, qs)) if seen.size else tuple(math.nan for _ in qs)

    def excess(self, least: int) -> float | None:
        """The ring's p99 less the mean p99 planned for the same responses, at least 0 (ms); None while fewer
        than ``least`` responses are recorded."""
        ok = np.isfinite(self._ms) & np.isfinite(self._planned)
        if ok.sum() < least:
            return None
        return max(float(np.percentile(self._ms[ok], 99)) - float(np.mean(self._planned[ok])), 0.0)
