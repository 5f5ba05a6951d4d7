"""PolicyTable: the n ↦ b lookup a server follows (paper 004 eq. 30).  numpy and h5py only.

``policy[s]`` for s = 0..s_max is the batch size to serve with s requests waiting (0 = wait);
for n > s_max the table serves ``policy[s_max]`` (eq. 30).  HDF5 files store s_max + 2 entries
(the last one is the truncated model's overflow state S_o); the runtime never uses it.
"""

from __future__ import annotations

import os

import numpy as np

from ..errors import InputError
from ..specs.rows import as_rows
from .guard import real
from .schema import eq30, read_policy

__all__ = ["PolicyTable", "control_limit"]


def control_limit(policy: np.ndarray, batch_sizes) -> int | None:
    """Q if policy[s], s = 0..s_max, is 'wait below Q, then serve the largest allowed batch ≤ min(s, Bmax)'
    (a control-limit policy, paper 004 Def. 3), else None."""
    policy = np.asarray(policy)
    sizes = np.asarray(batch_sizes)
    serve = np.nonzero(policy > 0)[0]
    if serve.size == 0:
        return None
    q = int(serve[0])
    s = np.arange(policy.size)
    pos = np.searchsorted(sizes, np.minimum(s, sizes[-1]), side="right") - 1
    greedy = np.where(pos >= 0, sizes[np.clip(pos, 0, None)], 0)
    return q if np.array_equal(policy, np.where(s >= q, greedy, 0)) else None


class PolicyTable:
    """A validated batching table: ``decide(n)`` for every n ≥ 0, vectorised ``decide_many``; with ``busy`` (a
    c-server table's busy-aware rows, one per busy count k = 0..c−1, each like ``policy``) also
    ``decide_busy(n, k)``, which :class:`~smdp_batch.runtime.DynamicBatcher` asks with its running batches."""

    def __init__(self, policy, batch_sizes=None, meta: dict | None = None, path: str | None = None, busy=None):
        try:
            p = np.asarray(policy)
        except (ValueError, TypeError):  # ragged: not a table
            p = np.asarray(None)
        if p.dtype.kind not in "biuf":  # ints beyond int64 (object arrays), strings, None, ragged rows
            raise InputError("a policy table must be a 1-D array of integer batch sizes, one per queue length 0..s_max")
        if p.ndim != 1 or p.size < 1 or not np.all(np.isfinite(p)) or np.any(p != np.round(p)):
            raise InputError("a policy table must be a 1-D array of integer batch sizes, one per queue length 0..s_max")
        p = p.astype(np.int64)
        s = np.arange(p.size)
        bad = np.nonzero((p < 0) | (p > s))[0]
        if bad.size:
            i = int(bad[0])
            raise InputError(f"policy[{i}] = {int(p[i])}: a table must serve between 0 and n requests at queue length n")
        if p[-1] == 0:
            raise InputError(f"policy waits at its top queue length {p.size - 1}; by eq. 30 it would never serve a long queue")
        if batch_sizes is not None:
            allowed = {0, *(int(b) for b in batch_sizes)}
            used = sorted(set(int(a) for a in p) - allowed)
            if used:
                raise InputError(f"policy uses batch size {used[0]}, which is not among the allowed sizes {sorted(allowed - {0})}")
        self._policy = p
        self._policy.setflags(write=False)
        self.batch_sizes = tuple(int(b) for b in batch_sizes) if batch_sizes is not None else tuple(sorted(set(p[p > 0].tolist())))
        self.meta = dict(meta or {})
        self.path = path
        self._busy: np.ndarray | None = None
        if busy is not None:
            b, got = as_rows(busy)
            if b.ndim != 2 or b.shape[0] < 2 or b.shape[1] != p.size:
                raise InputError(f"a busy-aware table has one row per busy count 0..c−1 (c ≥ 2), each of {p.size} "
                                 f"queue lengths like the table, got {got}")
            rows = np.stack([PolicyTable(row, self.batch_sizes).policy for row in b])
            if self.instances > 1 and rows.shape[0] != self.instances:
                raise InputError(f"a table of {self.instances} instances needs a busy-aware row per busy count "
                                 f"0..{self.instances - 1}, got {rows.shape[0]} rows")
            rows.setflags(write=False)
            self._busy = rows

    @classmethod
    def control(cls, q: int, batch_sizes) -> "PolicyTable":
        """The control-limit table (paper 004 Def. 3, eq. 31): wait while fewer than ``q`` requests wait, then serve
        the largest allowed size ≤ n.  With ``q`` the smallest size it is greedy; with one allowed size b and q = b,
        static b.  It holds queue lengths 0..max(q, Bmax), which eq. 30 extends.

        >>> PolicyTable.control(3, range(1, 5)).policy.tolist()
        [0, 0, 0, 3, 4]
        """
        sizes = sorted({int(b) for b in batch_sizes})
        if not sizes or sizes[0] < 1:
            raise InputError(f"a control-limit table needs allowed batch sizes ≥ 1, got {list(batch_sizes)!r}")
        try:
            limit = int(q)
        except (TypeError, ValueError):
            raise InputError(f"the control limit must be a whole number of requests ≥ {sizes[0]}, got {q!r}") from None
        if not sizes[0] <= limit <= 1_000_000:
            raise InputError(f"the control limit must be between the smallest allowed size {sizes[0]} and 10⁶, got {q!r}")
        n = np.arange(max(limit, sizes[-1]) + 1)
        pos = np.searchsorted(np.asarray(sizes), n, side="right") - 1
        policy = np.where(n >= limit, np.asarray(sizes)[np.clip(pos, 0, None)], 0)
        return cls(policy, sizes)

    @classmethod
    def load(cls, path: str | os.PathLike, busy_aware: bool = True) -> "PolicyTable":
        """Read a smdp-batch HDF5 policy table (format and schema version checked).  ``busy_aware=False`` leaves
        out a c-server table's busy-aware rows: the batcher then follows the table n ↦ b, as Triton would."""
        pf = read_policy(path)
        meta = {**pf.meta, "integrity": pf.integrity, "inputs": pf.inputs, "truncation": pf.truncation,
                "solution": {k: v for k, v in pf.solution.items() if k not in ("relative_values", "summary_json")}}
        if not isinstance(busy_aware, bool):
            raise TypeError(f"busy_aware must be True or False, got {busy_aware!r}")
        busy = None if pf.policy_busy is None or not busy_aware else pf.policy_busy[:, :-1]
        return cls(pf.policy[:-1], pf.batch_sizes, meta, str(path), busy)

    @property
    def busy_table(self) -> np.ndarray | None:
        """busy_table[k, s]: the size to start at queue length s with k instances busy (k = 0..c−1; read-only),
        where the table was solved for c instances and a rule that sees k does better than one that sees n
        alone; else None."""
        return self._busy

    def decide_busy(self, n: int, busy: int) -> int:
        """Batch size with n requests waiting and ``busy`` instances serving (0..c−1): the busy-aware table's
        where there is one, else :meth:`decide`."""
        if self._busy is None:
            return self.decide(n)
        if isinstance(busy, bool) or not isinstance(busy, (int, np.integer)) or not 0 <= busy:
            raise InputError(f"the busy instance count must be an integer ≥ 0, got {busy!r}")
        return eq30(self._busy[min(int(busy), self._busy.shape[0] - 1)], self.s_max, n)

    @property
    def policy(self) -> np.ndarray:
        """policy[s], s = 0..s_max (read-only)."""
        return self._policy

    @property
    def s_max(self) -> int:
        return self._policy.size - 1

    @property
    def lam(self) -> float | None:
        """The arrival rate (1/ms) the table was solved for, if known."""
        v = self.meta.get("inputs", {}).get("lam")
        return None if v is None else real(v)  # an int beyond the float range: inf (unusable, see bound)

    @property
    def instances(self) -> int:
        """The model instances sharing the queue the table was solved for (a c-server table), else 1."""
        return int(self.meta.get("inputs", {}).get("instances", 1))

    @property
    def max_batch(self) -> int:
        return int(self._policy.max())

    def decide(self, n: int) -> int:
        """Batch size to serve with n requests waiting (0: wait), for any integer n ≥ 0 (eq. 30 beyond s_max).

        One rule for :meth:`decide` and :meth:`decide_many`: a queue length is an integer (``int`` or a
        numpy integer) ≥ 0.  Floats — even integral ones like 3.0 — NaN, bools and negatives raise
        :class:`InputError`; nothing is rounded.
        """
        return eq30(self._policy, self.s_max, n)

    def decide_many(self, n) -> np.ndarray:
        """Vectorised :meth:`decide` over an array of queue lengths (same rule; same shape, int64).
        An empty input gives an empty array."""
        n = np.asarray(n)
        if n.size == 0:
            return np.zeros(n.shape, dtype=np.int64)
        if not np.issubdtype(n.dtype, np.integer):
            raise InputError(f"queue lengths must be integers ≥ 0, got an array of {n.dtype}")
        if n.min() < 0:
            raise InputError(f"queue lengths must be integers ≥ 0, got {n.min()}")
        return self._policy[np.where(n > self.s_max, self.s_max, n).astype(np.intp, copy=False)]

    @property
    def control_limit(self) -> int | None:
        """Q if the table is 'wait below Q, then serve min(n, Bmax)', else None."""
        return control_limit(self._policy, self.batch_sizes)

    def __repr__(self) -> str:
        q = self.control_limit
        rule = f"wait below {q}, then serve min(n, {self.max_batch})" if q is not None else "general table"
        lam = f", λ = {self.lam:.6g}/ms" if self.lam is not None else ""
        lam += f", {self.instances} instances" if self.instances > 1 else ""
        lam += ", busy-aware" if self._busy is not None else ""
        src = f" from {self.path}" if self.path else ""
        return f"<PolicyTable s_max={self.s_max}{lam}: {rule}{src}>"
