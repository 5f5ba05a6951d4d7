"""Contention between model instances on one device: batch times and energies that depend on how many run.

c instances on one GPU (Triton's ``instance_group { count: c, kind: KIND_GPU }``, Ray Serve replicas with
fractional ``num_gpus``) share its compute, so a batch runs slower while others run beside it.  A
:class:`Contention` gives, for k = 1..K busy instances, a latency factor s_k and an energy factor e_k (s₁ = e₁ = 1:
one instance alone is the measured l(b), ζ(b)):

* **time** — while k instances are busy, each running batch progresses at speed 1/s_k: a batch of b that runs
  entirely beside k − 1 others takes s_k·l(b) on average, and one that sees k change takes the sum of its pieces
  (processor sharing with a concurrency-dependent rate, as in the phase-type model of
  :mod:`smdp_batch.model.multi_server`, where every phase rate is divided by s_k);
* **energy** — a batch of b draws ζ(b)·e_k/(s_k·l(b)) W while k are busy, so one run entirely at level k costs
  e_k·ζ(b) mJ.  With e_k = 1 the energy per batch is unchanged (a slower batch at a proportionally lower power);
  e_k < 1 is a device that is more efficient when shared, e_k > 1 one that wastes energy on contention.

More instances must never lower the throughput of a full device: k/s_k must not fall as k grows (else run fewer
instances), so s_k ≤ s_{k−1}·k/(k − 1); s_k ≥ 1 (a batch is never faster beside others).

The spec is ``K:S[:E],…`` for K = 2, 3, … in order, e.g. ``2:1.4,3:1.9:0.95,4:2.4:0.9`` (omitted E: 1).  Factors
that differ by batch size are written per measured size, ``B=K:S[:E],…/B=…`` (sizes ascending, the same K at
each), e.g. ``1=2:1.78/8=2:1.06/32=2:1.04``: a size between two measured ones takes the factors interpolated
linearly in b, a size outside them the nearest one's (interpolation keeps k/s_k non-decreasing, as it is linear).
``smdp-batch measure FN --concurrency K`` measures s_k (and e_k) by timing each size with k callers at once
against one alone (:func:`smdp_batch.measure.contention_summary`; ``--latency`` is l(b) at k = 1), and prints
the spec both ways.

It lives in ``specs/`` (numpy only) because both sides need it: :class:`~smdp_batch.model.problem.BatchingProblem`
holds one, and a server reads a c-server table's contention without the model's dependencies.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import numpy as np

from ..errors import InputError

__all__ = ["Contention", "parse_contention", "FACTOR_LIMIT"]

#: Largest latency or energy factor accepted (a batch 1 000× slower beside others is a broken measurement).
FACTOR_LIMIT = 1000.0
#: Most busy-instance levels a spec may give (the most instances sharing a queue).
LEVELS_LIMIT = 64


@dataclass(frozen=True)
class Contention:
    """Latency factors s_k and energy factors e_k for k = 1..K busy instances (index k − 1; s₁ = e₁ = 1).

    ``sizes``: factors per measured batch size, ``((b, latency, energy), …)`` with b ascending; ``latency`` and
    ``energy`` are then the largest size's (what the stable rate at Bmax uses when Bmax is that size).
    """

    latency: tuple[float, ...]
    energy: tuple[float, ...]
    sizes: tuple = ()

    @classmethod
    def by_size(cls, factors: dict) -> "Contention":
        """Factors per batch size: ``{b: Contention or (latency, energy)}``, every size with the same levels."""
        if not factors:
            raise InputError("contention by batch size needs at least one size")
        rows = []
        for b in sorted(factors):
            if isinstance(b, bool) or not isinstance(b, (int, np.integer)) or not 1 <= b <= 1 << 20:
                raise InputError(f"contention batch size must be an integer ≥ 1, got {b!r}")
            f = factors[b]
            try:
                one = f if isinstance(f, Contention) else Contention(tuple(f[0]), tuple(f[1]))
            except InputError as e:
                raise InputError(f"at batch size {int(b)}: {e}") from None
            if one.sizes:
                raise InputError(f"at batch size {int(b)}: give one factor per busy count, not per size again")
            rows.append((int(b), one.latency, one.energy))
        if len({len(r[1]) for r in rows}) != 1:
            raise InputError("contention by batch size must give the same busy counts at every size, got "
                             + ", ".join(f"{len(r[1])} at b = {r[0]}" for r in rows))
        return cls(rows[-1][1], rows[-1][2], tuple(rows))

    def __post_init__(self):
        s, e = tuple(float(x) for x in self.latency), tuple(float(x) for x in self.energy)
        if len(s) != len(e) or not 2 <= len(s) <= LEVELS_LIMIT:
            raise InputError(f"contention needs the same number of latency and energy factors for 2 to {LEVELS_LIMIT} "
                             f"busy instances, got {len(s)} and {len(e)}")
        if s[0] != 1.0 or e[0] != 1.0:
            raise InputError(f"contention factors at 1 busy instance must be 1 (l(b) and ζ(b) are measured alone), "
                             f"got {s[0]:g} and {e[0]:g}")
        for k in range(2, len(s) + 1):
            sk, ek = s[k - 1], e[k - 1]
            if not (math.isfinite(sk) and 1.0 <= sk <= FACTOR_LIMIT):
                raise InputError(f"contention latency factor at {k} busy instances must be a number from 1 to "
                                 f"{FACTOR_LIMIT:g} (a batch never runs faster beside others), got {sk!r}")
            if not (math.isfinite(ek) and 0.0 < ek <= FACTOR_LIMIT):
                raise InputError(f"contention energy factor at {k} busy instances must be a number in (0, "
                                 f"{FACTOR_LIMIT:g}], got {ek!r}")
            if k * s[k - 2] < (k - 1) * sk * (1.0 - 1e-12):
                raise InputError(
                    f"contention latency factor {sk:g} at {k} busy instances against {s[k - 2]:g} at {k - 1}: {k} "
                    f"instances would serve less than {k - 1} ({k}/{sk:g} < {k - 1}/{s[k - 2]:g}), so run fewer "
                    f"instances; at {k} it must be ≤ {s[k - 2] * k / (k - 1):.6g}")
        object.__setattr__(self, "latency", s)
        object.__setattr__(self, "energy", e)

    @property
    def levels(self) -> int:
        """K: the most busy instances the factors cover."""
        return len(self.latency)

    def check(self, instances: int) -> None:
        """Refuse, in one line, a count of instances past the levels the factors cover."""
        if instances > self.levels:
            raise InputError(f"contention gives factors up to {self.levels} busy instances, but {instances} "
                             f"instances need them up to {instances}: add {self.levels + 1}:S[:E]…")

    def slow(self, k, b=None) -> np.ndarray:
        """s_k for busy counts k (0 counts as 1: no batch runs), of batch size b (broadcast with k; factors per
        size interpolated as the module doc says; b None: the largest measured size's)."""
        return self._factor(k, b, 1)

    def energy_factor(self, k, b=None) -> np.ndarray:
        """e_k for busy counts k (0 counts as 1), of batch size b (as :meth:`slow`)."""
        return self._factor(k, b, 2)

    def _factor(self, k, b, which: int) -> np.ndarray:
        level = np.maximum(np.asarray(k, dtype=np.int64), 1) - 1
        if not self.sizes or b is None:
            return np.asarray(self.latency if which == 1 else self.energy)[level] + 0.0 * np.asarray(
                0.0 if b is None else b, dtype=np.float64)
        at = np.array([r[0] for r in self.sizes], dtype=np.float64)
        table = np.array([r[which] for r in self.sizes], dtype=np.float64).T  # levels × measured sizes
        lv, bb = np.broadcast_arrays(level, np.asarray(b, dtype=np.float64))
        out = np.empty(lv.shape)
        for x in np.unique(lv):
            m = lv == x
            out[m] = np.interp(bb[m], at, table[x])
        return out

    def spec(self) -> str:
        """``K:S[:E],…`` (per size: ``B=K:S[:E],…/…``) that parses back to these factors exactly (shortest
        round-trip digits)."""
        if self.sizes:
            return "/".join(f"{b}={Contention(s, e).spec()}" for b, s, e in self.sizes)
        return ",".join(f"{k}:{_exact(s)}" + (f":{_exact(e)}" if e != 1.0 else "")
                        for k, (s, e) in enumerate(zip(self.latency, self.energy), start=1) if k > 1)

    def describe(self) -> str:
        """Words for a user: the latency (and energy) factor per busy count (per measured size)."""
        if self.sizes:
            return "by batch size: " + "; ".join(f"b = {b}: {Contention(s, e).describe()}" for b, s, e in self.sizes)
        return ", ".join(f"{k} busy ×{s:g}" + (f" time, ×{e:g} energy" if e != 1.0 else "")
                         for k, (s, e) in enumerate(zip(self.latency, self.energy), start=1) if k > 1)


def _exact(x: float) -> str:
    text = repr(float(x))
    return text[:-2] if text.endswith(".0") else text


def parse_contention(spec) -> Contention | None:
    """A :class:`Contention` from ``K:S[:E],…`` (K = 2, 3, … in order), an existing one, or None/''/'none'."""
    if spec is None or isinstance(spec, Contention):
        return spec
    text = str(spec).strip()
    if text.lower() in ("", "none"):
        return None
    if len(text) > 20000:
        raise InputError(f"contention spec is {len(text)} characters long; give K:S[:E] for K = 2..{LEVELS_LIMIT}")
    if "=" in text:  # per batch size: B=K:S[:E],…/B=…
        factors: dict[int, Contention] = {}
        for part in text.split("/"):
            head, eq, rest = part.strip().partition("=")
            try:
                b = int(head)
                if not eq or b < 1:
                    raise ValueError
            except ValueError:
                raise InputError(f"contention by batch size is B=K:S[:E],…/B=…, e.g. 1=2:1.8/32=2:1.05; got "
                                 f"{part.strip()!r}") from None
            if b in factors or (factors and b < max(factors)):
                raise InputError(f"contention batch sizes must be given once each, ascending; got {b} after "
                                 f"{max(factors)}")
            try:
                one = parse_contention(rest)
            except InputError as err:
                raise InputError(f"contention at batch size {b}: {err}") from None
            if one is None or one.sizes:
                raise InputError(f"contention at batch size {b} must be K:S[:E],…, got {rest.strip()!r}")
            factors[b] = one
        return Contention.by_size(factors)
    s, e = [1.0], [1.0]
    for item in text.split(","):
        parts = item.strip().split(":")
        try:
            if len(parts) not in (2, 3):
                raise ValueError
            k = int(parts[0])
            vals = [float(x) for x in parts[1:]]
        except ValueError:
            raise InputError(f"contention item {item.strip()!r} is not K:S or K:S:E (busy instances K, latency "
                             f"factor S, energy factor E), e.g. 2:1.4,3:1.9:0.95") from None
        if k == 1 and vals[0] == 1.0 and (len(vals) == 1 or vals[1] == 1.0) and len(s) == 1:
            continue  # 1:1 spelled out
        if k != len(s) + 1:
            raise InputError(f"contention items must give K = 2, 3, … in order, got {k} after {len(s)}")
        if not all(math.isfinite(v) for v in vals):
            raise InputError(f"contention factors must be finite numbers, got {item.strip()!r}")
        s.append(vals[0])
        e.append(vals[1] if len(vals) == 2 else 1.0)
    return Contention(tuple(s), tuple(e))
