"""Static, greedy and control-limit policies over states 0..s_max, S_o (paper 004 eqs. 15, 16, 31).

Each returns an int64 array of batch sizes of length s_max+2 (last entry: S_o, treated as s_max).
With an explicit batch-size set, "serve min(s, Bmax)" means the largest allowed size ≤ s.
"""

from __future__ import annotations

import numpy as np

from ..errors import InputError


def _levels(s_max: int) -> np.ndarray:
    s = np.arange(s_max + 2)
    s[-1] = s_max
    return s


def greedy_policy(batch_sizes, s_max: int) -> np.ndarray:
    """Serve the largest allowed batch ≤ s whenever s ≥ Bmin (eq. 16)."""
    sizes = np.asarray(batch_sizes, dtype=np.int64)
    s = _levels(s_max)
    pos = np.searchsorted(sizes, s, side="right") - 1
    return np.where(pos >= 0, sizes[np.clip(pos, 0, None)], 0).astype(np.int64)


def static_policy(batch_sizes, s_max: int, b: int) -> np.ndarray:
    """Wait until s ≥ b, then serve exactly b (eq. 15)."""
    if int(b) not in set(int(x) for x in batch_sizes):
        sizes = [int(x) for x in batch_sizes]
        shown = f"{sizes[0]}..{sizes[-1]}" if sizes == list(range(sizes[0], sizes[-1] + 1)) else ",".join(map(str, sizes))
        raise InputError(f"static batch size {b} is not an allowed batch size (allowed: {shown})")
    s = _levels(s_max)
    return np.where(s >= b, int(b), 0).astype(np.int64)


def control_limit_policy(batch_sizes, s_max: int, q: int) -> np.ndarray:
    """Wait while s < Q, then serve the largest allowed batch ≤ min(s, Bmax) (eq. 31)."""
    if int(q) < 1 or int(q) > s_max:
        raise InputError(f"control limit Q must satisfy 1 ≤ Q ≤ s_max = {s_max}, got {q}")
    s = _levels(s_max)
    return np.where(s >= int(q), greedy_policy(batch_sizes, s_max), 0).astype(np.int64)


def parse_policy(spec: str, batch_sizes, s_max: int) -> np.ndarray:
    """``static:B``, ``greedy`` or ``control:Q`` → policy array."""
    kind, _, arg = spec.strip().partition(":")
    kind = kind.lower()
    try:
        if kind == "greedy" and not arg:
            return greedy_policy(batch_sizes, s_max)
        if kind == "static":
            return static_policy(batch_sizes, s_max, int(arg))
        if kind in ("control", "q"):
            return control_limit_policy(batch_sizes, s_max, int(arg))
    except InputError:
        raise  # the real reason (e.g. 33 is not an allowed batch size), not "unknown policy"
    except (ValueError, OverflowError):
        pass
    raise InputError(f"unknown policy {spec!r}; valid: static:B, greedy, control:Q, or a policy FILE.h5")
