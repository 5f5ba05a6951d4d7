"""The batching problem of paper 004 §III: Poisson arrivals λ, batch sizes 𝓑, l(b), ζ(b), G_b, weights.

Objective (eq. 2): minimise w1·W̄ + w2·P̄ with W̄ the mean response time (ms) and P̄ the mean
power (W = mJ/ms).  ρ = λ·l(Bmax)/Bmax is the load relative to the maximum service rate
θ(Bmax) = Bmax/l(Bmax); ρ < 1 is necessary for stability.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any, Iterable

import numpy as np

from ..errors import InputError
from ..limits import BMAX_LIMIT, WEIGHT_LIMIT, check_int, check_rate
from ..specs.contention import Contention, parse_contention
from .curves import Affine, Curve, PowerEnergy
from .laws import Deterministic, ServiceLaw
from .spec import parse_curve, parse_service

__all__ = ["BatchingProblem", "BASIC_LATENCY", "BASIC_ENERGY", "batch_size_set"]

#: GoogLeNet on a Tesla P4, paper 004 §VII (Fig. 2): l(b) = 0.3051 b + 1.0524 ms.
BASIC_LATENCY = Affine(0.3051, 1.0524)
#: ζ(b) = 19.899 b + 19.603 mJ.
BASIC_ENERGY = Affine(19.899, 19.603)


def _finite_number(name: str, value, *, positive: bool = False, nonneg: bool = False) -> float:
    try:
        v = float(value)
    except (TypeError, ValueError):
        raise InputError(f"{name} must be a number, got {value!r}") from None
    if not math.isfinite(v):
        raise InputError(f"{name} must be finite, got {value!r}")
    if positive and not v > 0:
        raise InputError(f"{name} must be > 0, got {value!r}")
    if nonneg and not v >= 0:
        raise InputError(f"{name} must be ≥ 0, got {value!r}")
    if name in ("w1", "w2") and v > WEIGHT_LIMIT:
        raise InputError(
            f"{name} must be ≤ {WEIGHT_LIMIT:g}, got {value!r} (only the ratio w2/w1 shapes the policy: scale both down)"
        )
    return v


def batch_size_set(bmin: int = 1, bmax: int = 32, sizes: Iterable[int] | str | None = None) -> tuple[int, ...]:
    """The allowed batch sizes: ``sizes`` if given (e.g. "1,2,4,8"), else Bmin..Bmax."""
    if sizes is not None:
        if isinstance(sizes, str):
            try:
                sizes = [int(x) for x in sizes.split(",") if x.strip()]
            except ValueError:
                raise InputError(
                    f"batch sizes must be comma-separated positive integers such as '1,2,4,8', got {sizes!r}"
                ) from None
        sizes = list(sizes)
        out = sorted(set(check_int("a batch size (a positive integer)", b, 1, BMAX_LIMIT) for b in sizes))
        if not out:
            raise InputError(f"batch sizes must be positive integers, got {sizes!r}")
        return tuple(out)
    try:
        bmin_i, bmax_i = int(bmin), int(bmax)
    except (TypeError, ValueError, OverflowError):
        raise InputError(f"Bmin and Bmax must be integers, got {bmin!r}, {bmax!r}") from None
    if bmin_i != bmin or bmax_i != bmax:
        raise InputError(f"Bmin and Bmax must be integers, got {bmin!r}, {bmax!r}")
    if bmin_i < 1:
        raise InputError(f"Bmin must be ≥ 1, got {bmin_i}")
    if bmax_i > BMAX_LIMIT:
        raise InputError(f"Bmax must be ≤ {BMAX_LIMIT} (the model has one action per batch size), got {bmax_i}")
    if bmin_i > bmax_i:
        raise InputError(f"Bmin ({bmin_i}) must be ≤ Bmax ({bmax_i})")
    return tuple(range(bmin_i, bmax_i + 1))


MAX_INSTANCES = 64  #: the most model instances sharing one queue


def check_instances(c: Any) -> int:
    """The number of model instances, an integer from 1 to :data:`MAX_INSTANCES` (one clear line if not)."""
    if isinstance(c, bool) or not isinstance(c, (int, np.integer)) or not 1 <= c <= MAX_INSTANCES:
        raise InputError(f"instances must be an integer from 1 to {MAX_INSTANCES}, got {c!r}")
    return int(c)


def _latency_curve(latency, service: ServiceLaw) -> Curve:
    """The given l(b), else the law's own (max of b, measured profile), else the paper's basic model."""
    if latency is None:
        return service.natural_latency() or BASIC_LATENCY
    return parse_curve(latency, "latency model")


@dataclass(frozen=True)
class BatchingProblem:
    """A validated dynamic-batching problem (paper 004 §III–IV).

    Parameters
    ----------
    lam : arrival rate λ in requests/ms.
    batch_sizes : the allowed batch sizes 𝓑 (sorted, unique, ≥ 1).
    latency : mean batch time l(b) in ms (positive, finite, non-decreasing on 𝓑).  Default: the
        service law's own l(b) where it defines one (max of b request times, a measured profile),
        else the paper's GoogLeNet/P4 model.
    energy : batch energy ζ(b) in mJ (non-negative, finite); ``"power:SPEC"`` gives it as a power P(b) in
        W while a batch is served, ζ(b) = P(b)·l(b).  Numbers in specs may carry units (``0.06J``, ``800us``).
    service : shape of the batch-time law G_b with mean l(b).
    w1, w2 : weights of mean latency (per ms) and mean power (per W); w1 > 0, w2 ≥ 0.
    instances : c identical model instances sharing the one FIFO queue (Triton's ``instance_group``), 1 to
        64; ρ and the stable rate then count all c.  The one-server solvers and evaluation refuse c > 1; the
        c-server SMDP (:func:`smdp_batch.solvers.multi_pi.solve_instances`) solves it, and the simulator runs any
        rule on c instances.
    contention : how instances on one device slow each other down (:mod:`smdp_batch.specs.contention`): a
        :class:`~smdp_batch.specs.contention.Contention` or its spec ``K:S[:E],…``; None (default) for
        instances that do not interact.  It must cover every count up to ``instances``, and the stable rate
        counts it: c·Bmax/(s_c·l(Bmax)).
    """

    lam: float
    batch_sizes: tuple[int, ...] = tuple(range(1, 33))
    if TYPE_CHECKING:  # a Curve once __post_init__ has parsed it
        latency: Curve = None  # type: ignore[assignment]
    else:
        latency: Curve | str | None = None
    energy: Curve = BASIC_ENERGY
    service: ServiceLaw = field(default_factory=Deterministic)
    w1: float = 1.0
    w2: float = 1.0
    instances: int = 1
    contention: Contention | None = None

    if TYPE_CHECKING:  # what the constructor takes; __post_init__ turns it into the fields above
        def __init__(self, lam: float, batch_sizes: Iterable[int] | str = ..., latency: Curve | str | None = None,
                     energy: Curve | str = ..., service: ServiceLaw | str = ..., w1: float = 1.0,
                     w2: float = 1.0, instances: int = 1, contention: Contention | str | None = None) -> None: ...

    def __post_init__(self):
        sizes = batch_size_set(sizes=self.batch_sizes)
        object.__setattr__(self, "batch_sizes", sizes)
        object.__setattr__(self, "service", parse_service(self.service))
        object.__setattr__(self, "latency", _latency_curve(self.latency, self.service))
        energy = parse_curve(self.energy, "energy model")
        if isinstance(energy, PowerEnergy):  # ζ(b) = P(b)·l(b) with this problem's l(b)
            energy = energy.bind(self.latency)
        object.__setattr__(self, "energy", energy)
        object.__setattr__(self, "w1", _finite_number("w1", self.w1, positive=True))
        object.__setattr__(self, "w2", _finite_number("w2", self.w2, nonneg=True))
        object.__setattr__(self, "instances", check_instances(self.instances))
        cont = parse_contention(self.contention)
        if cont is not None:
            cont.check(self.instances)
        object.__setattr__(self, "contention", cont)
        lam = _finite_number("λ (lam)", self.lam, positive=True)
        check_rate("λ (lam)", lam)
        object.__setattr__(self, "lam", lam)

        b = np.asarray(sizes, dtype=np.float64)
        l = np.asarray(self.latency(b), dtype=np.float64)
        z = np.asarray(self.energy(b), dtype=np.float64)
        bad = [(s, v) for s, v in zip(sizes, l) if not (math.isfinite(v) and v > 0)]
        if bad:
            raise InputError(f"latency l(b) must be finite and > 0 ms; l({bad[0][0]}) = {bad[0][1]!r}")
        dec = np.nonzero(np.diff(l) < 0)[0]
        if dec.size:
            i = dec[0]
            raise InputError(
                f"latency l(b) must be non-decreasing in b (paper 004 §III); "
                f"l({sizes[i]}) = {l[i]:.6g} > l({sizes[i + 1]}) = {l[i + 1]:.6g}"
            )
        bad = [(s, v) for s, v in zip(sizes, z) if not (math.isfinite(v) and v >= 0)]
        if bad:
            raise InputError(f"energy ζ(b) must be finite and ≥ 0 mJ; ζ({bad[0][0]}) = {bad[0][1]!r}")
        c = self.instances
        max_lam = self.max_lam
        if not lam < max_lam:
            slowed = f"({float(cont.slow(c, self.bmax)):g}·l(Bmax))" if cont is not None and c > 1 else "l(Bmax)"
            on = f"{c}·Bmax/{slowed} on {c} instances" if c > 1 else "Bmax/l(Bmax)"
            per_s = (f"; λ is in requests/ms: for {lam:.6g} requests/s write {lam:.6g}req/s (ρ = "
                     f"{lam / 1e3 / max_lam:.4g})" if lam / 1e3 < max_lam else "")
            raise InputError(
                f"λ = {lam:.6g} /ms gives ρ = {lam / max_lam:.6g} ≥ 1: the queue is unstable; "
                f"the maximum stable λ is {on} = {max_lam:.6g} /ms (use ρ < 1){per_s}"
            )

    # ------------------------------------------------------------------ constructors
    @classmethod
    def from_rho(cls, rho: float, **kwargs) -> "BatchingProblem":
        """Build from the normalised load ρ = λ·s_c·l(Bmax)/(c·Bmax) ∈ (0, 1) (c = ``instances``, default 1; s_c
        the contention's latency factor at c busy, else 1)."""
        rho_v = _finite_number("ρ (rho)", rho)
        if not 0 < rho_v < 1:
            raise InputError(f"ρ must lie in (0, 1) for a stable queue, got {rho!r}")
        sizes = batch_size_set(sizes=kwargs.get("batch_sizes", tuple(range(1, 33))))
        latency = _latency_curve(kwargs.get("latency"), parse_service(kwargs.get("service", "det")))
        lmax = float(latency(np.float64(sizes[-1])))
        if not (math.isfinite(lmax) and lmax > 0):
            raise InputError(f"latency l(b) must be finite and > 0 ms; l({sizes[-1]}) = {lmax!r}")
        c = check_instances(kwargs.get("instances", 1))
        cont = parse_contention(kwargs.get("contention"))
        if cont is not None:
            cont.check(c)
            lmax *= float(cont.slow(c, sizes[-1]))
        return cls(lam=rho_v * c * sizes[-1] / lmax, **kwargs)

    @classmethod
    def basic(cls, rho: float = 0.5, w2: float = 1.0, **kwargs) -> "BatchingProblem":
        """Paper 004's basic scenario (GoogLeNet on a Tesla P4, deterministic, 𝓑 = 1..32)."""
        return cls.from_rho(rho, w2=w2, **kwargs)

    @classmethod
    def preset(cls, name: str, rho: float = 0.5, w2: float = 1.0, **kwargs) -> "BatchingProblem":
        """A named scenario of paper 004 (:data:`smdp_batch.model.presets.PRESETS`); kwargs override it."""
        from .presets import preset

        return cls.from_rho(rho, w2=w2, **{**preset(name), **kwargs})

    # ------------------------------------------------------------------ derived values
    @property
    def bmin(self) -> int:
        return self.batch_sizes[0]

    @property
    def bmax(self) -> int:
        return self.batch_sizes[-1]

    @property
    def max_lam(self) -> float:
        """Maximum stable arrival rate c·Bmax/(s_c·l(Bmax)) (requests/ms; c = ``instances``, s_c the contention's
        latency factor at c busy, else 1)."""
        c = self.instances
        s = float(self.contention.slow(c, self.bmax)) if self.contention is not None else 1.0
        return c * self.bmax / (s * float(self.latency(np.float64(self.bmax))))

    @property
    def rho(self) -> float:
        return self.lam / self.max_lam

    def latency_ms(self) -> np.ndarray:
        """l(b) for b in 𝓑 (ms)."""
        return np.asarray(self.latency(np.asarray(self.batch_sizes, dtype=np.float64)), dtype=np.float64)

    def energy_mj(self) -> np.ndarray:
        """ζ(b) for b in 𝓑 (mJ)."""
        return np.asarray(self.energy(np.asarray(self.batch_sizes, dtype=np.float64)), dtype=np.float64)

    def second_moments(self) -> np.ndarray:
        """E[G_b²] for b in 𝓑 (ms²)."""
        return np.array(
            [self.service.second_moment(float(l), int(b)) for b, l in zip(self.batch_sizes, self.latency_ms())]
        )

    def replace(self, **changes) -> "BatchingProblem":
        """A copy with some fields changed (validated again)."""
        fields: dict[str, Any] = dict(
            lam=self.lam, batch_sizes=self.batch_sizes, latency=self.latency, energy=self.energy,
            service=self.service, w1=self.w1, w2=self.w2, instances=self.instances, contention=self.contention,
        )
        fields.update(changes)
        return BatchingProblem(**fields)

    def describe(self) -> dict:
        """Plain-data description (for JSON / HDF5)."""
        return {
            "lam": self.lam,
            "rho": self.rho,
            "batch_sizes": list(self.batch_sizes),
            "latency": self.latency.spec(),
            "energy": self.energy.spec(),
            "service": self.service.spec(),
            "w1": self.w1,
            "w2": self.w2,
            **({"instances": self.instances} if self.instances > 1 else {}),
            **({"contention": self.contention.spec()} if self.contention is not None and self.instances > 1 else {}),
        }

    def single(self) -> "BatchingProblem":
        """This problem, refused with one clear line if it has several instances: for the solvers and the exact
        evaluation, which are those of one server (paper 004)."""
        if self.instances > 1:
            raise InputError(
                f"this solve and its exact evaluation are for one server; {self.instances} instances sharing a queue "
                "are solved by the c-server model (solve --instances, solvers.multi_pi.solve_instances) and "
                "simulated by simulate --instances")
        return self
