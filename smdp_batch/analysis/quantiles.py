"""Percentiles of the simulator's response times, by batch-means group and overall, in one compiled pass.

A simulated run reports each percentile of its response times and, for its interval, the same percentile in
each of its batch-means groups (:func:`~.simulate.simulate`).  Both use numpy's default ("linear") definition:
with the values sorted ascending, x₍ₚ₎ = x[⌊p⌋] + (p − ⌊p⌋)·(x[⌊p⌋ + 1] − x[⌊p⌋]) at p = q/100·(n − 1), written
as here (``np.percentile`` rounds the interpolation its own way: the two agree to 1e-14 relative).

Only the two order statistics either side of p are needed.  For a high percentile (the p99 an SLO bounds) they
are the two least of the n − ⌊p⌋ largest values, which a min-heap of that many entries keeps in one pass: nearly
every value is refused by one comparison with the heap's least (k = 101 entries for the p99 of 10⁴ values).
Each group holds n_g − ⌊p_g⌋ values at or above its own x₍⌊p_g⌋₎, so where those counts add up to the n − ⌊p⌋
the whole run needs, the least of the groups' bounds the whole run's from below: its order statistics are found
among the values above that bound, a few thousand of 2·10⁵.  This is 2–3× faster than partitions, which move every
value, and it runs without the GIL, so the SLO search's threads simulate and summarise at once.  Other percentiles
(k above an eighth of n) take a partition of a copy.
The order statistics are the same values either way, so the percentiles are the same to the last bit.
"""

from __future__ import annotations

import math

import numpy as np

from ..kernel_cache import njit

__all__ = ["group_percentiles"]


@njit(cache=True, nogil=True)
def _order_pair(x, lo):
    """(x₍lo₎, x₍lo+1₎) of x sorted ascending (x₍lo₎ twice at the top), without sorting or changing x."""
    n = x.size
    hi = min(lo + 1, n - 1)
    k = n - lo  # the values ≥ x₍lo₎ kept: the k largest
    if k > n // 8 + 2:
        y = np.partition(x, np.array([lo, hi]))
        return y[lo], y[hi]
    heap = np.empty(k)
    for i in range(k):  # a min-heap of the first k values
        v = x[i]
        j = i
        while j > 0:
            parent = (j - 1) // 2
            if heap[parent] <= v:
                break
            heap[j] = heap[parent]
            j = parent
        heap[j] = v
    for i in range(k, n):
        v = x[i]
        if v <= heap[0]:
            continue
        j = 0  # replace the least and sift it down
        while True:
            c = 2 * j + 1
            if c >= k:
                break
            if c + 1 < k and heap[c + 1] < heap[c]:
                c += 1
            if heap[c] >= v:
                break
            heap[j] = heap[c]
            j = c
        heap[j] = v
    if hi == lo:
        return heap[0], heap[0]
    second = heap[1] if k == 2 or heap[1] <= heap[2] else heap[2]  # the next least: a child of the root
    return heap[0], second


@njit(cache=True, nogil=True)
def _grouped(r, edges, qs):
    """By group, then overall, where the groups' least kept value bounds the overall one from below (module doc)."""
    G = edges.size - 1
    n = r.size
    by_group = np.empty((G, qs.size))
    whole = np.empty(qs.size)
    for j in range(qs.size):
        floor_at = np.inf  # the least over the groups of x₍lo₎: each group holds n_g − lo_g values at or above it
        held = 0
        for g in range(G):
            x = r[edges[g]:edges[g + 1]]
            p = qs[j] / 100.0 * (x.size - 1)
            lo = int(math.floor(p))
            a, b = _order_pair(x, lo)
            by_group[g, j] = a + (p - lo) * (b - a)
            floor_at = min(floor_at, a)
            held += x.size - lo
        p = qs[j] / 100.0 * (n - 1)
        lo = int(math.floor(p))
        k = n - lo
        if held >= k:  # at least k values ≥ floor_at: the k largest are among them
            buf = r[r >= floor_at]
            a, b = _order_pair(buf, buf.size - k)
        else:
            a, b = _order_pair(r, lo)
        whole[j] = a + (p - lo) * (b - a)
    return by_group, whole


def group_percentiles(r: np.ndarray, edges: np.ndarray, qs) -> tuple[np.ndarray, np.ndarray]:
    """(by group, overall): the percentiles ``qs`` (0–100) of ``r`` in each group ``r[edges[g]:edges[g + 1]]``,
    shape (groups, len(qs)), and of all of ``r``, shape (len(qs),); numpy's linear definition (module doc).
    ``r`` is not changed; every group must hold at least one value.

    >>> r = np.arange(10.0)
    >>> by, whole = group_percentiles(r, np.array([0, 5, 10]), (50, 99))
    >>> by.tolist(), whole.tolist() == np.percentile(r, [50, 99]).tolist()
    ([[2.0, 3.96], [7.0, 8.96]], True)
    """
    r = np.ascontiguousarray(r, dtype=np.float64)
    edges = np.ascontiguousarray(edges, dtype=np.int64)
    q = np.asarray(qs, dtype=np.float64)
    if edges.ndim != 1 or edges.size < 2 or edges[0] < 0 or edges[-1] > r.size or np.any(np.diff(edges) < 1):
        raise ValueError(f"group edges must rise strictly within 0..{r.size}, got {edges.tolist()}")
    if q.ndim != 1 or not np.all((q >= 0) & (q <= 100)):
        raise ValueError(f"percentiles must lie in 0..100, got {q.tolist()}")
    return _grouped(r, edges, q)
