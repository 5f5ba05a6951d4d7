"""The one parser of the model's "name:args" spellings (CLI, JSON, HDF5 ``/inputs`` attributes).

* :func:`parse_service` — service laws (:data:`SERVICE_FORMS`): the closed forms of
  :mod:`.laws`, the families of :mod:`.families`, and ``empirical:FILE`` profiles (:mod:`.profile`).
* :func:`parse_curve` — l(b) and ζ(b) curves (:data:`CURVE_FORMS`): :mod:`.curves`, ``csv:FILE``
  profiles, and the l(b) a law defines itself (``max:…``, ``empirical:FILE``).

Every law and curve has a ``spec()`` that round-trips through these functions.  The grammar lives
here alone so that the law and curve modules import only each other's classes (no import circle):
``curves ← laws ← families ← profile ← spec``.
"""

from __future__ import annotations

import re
from typing import cast

from ..errors import InputError
from ..limits import NESTING_LIMIT
from .curves import Affine, Constant, Curve, Logarithmic, PowerEnergy, Table
from .families import LogNormal, MaxOf, Mixture, ShiftedExponential, Uniform
from .laws import Deterministic, Erlang, Exponential, Gamma, HyperExponential, ServiceLaw
from .profile import EmpiricalProfile, parse_profile_curve
from .units import quantity, quantity_of

__all__ = ["CURVE_FORMS", "SERVICE_FORMS", "parse_curve", "parse_service"]


SERVICE_FORMS = (
    "det, exp, erlang:K (integer K ≥ 1), gamma:ALPHA (shape > 0), hyperexp:P1/C1,P2/C2,… "
    "(probabilities/relative means), uniform:A,B (shape of U[A,B]), shiftexp:F (shift fraction F in [0,1)), "
    "lognormal:SIGMA, mix:W1*LAW1@C1;W2*LAW2@C2 (weights, laws, relative means), "
    "max:LAW@MEAN or max:uniform:A,B (batch time = max of b request times), empirical:FILE.csv"
)


def parse_service(spec: str | ServiceLaw) -> ServiceLaw:
    """Parse a service-law spelling (see :data:`SERVICE_FORMS`), e.g. ``det``, ``erlang:2``, ``gamma:0.5``."""
    if isinstance(spec, ServiceLaw):
        return spec
    if not isinstance(spec, str):
        raise InputError(f"service law must be a string such as 'det', got {spec!r}")
    text = spec.strip()
    if len(text) > 4096:
        raise InputError(f"service law spec has {len(text)} characters; at most 4096 are allowed")
    depth = len(re.findall(r"(?i)\b(?:mix|max):", text))
    if depth > NESTING_LIMIT:
        raise InputError(
            f"service law {text[:40]!r}… nests {depth} mix:/max: laws; at most {NESTING_LIMIT} are allowed"
        )
    kind, _, arg = text.partition(":")
    kind = kind.lower()
    if kind in ("det", "deterministic") and not arg:
        return Deterministic()
    if kind in ("exp", "exponential", "m") and not arg:
        return Exponential()
    if kind == "erlang":
        try:
            k = int(arg)
        except ValueError:
            raise InputError(f"service law {spec!r}: Erlang needs an integer shape, e.g. 'erlang:2'") from None
        return Erlang(k)
    if kind == "gamma":
        try:
            return Gamma(float(arg))
        except ValueError:
            raise InputError(f"service law {spec!r}: gamma needs a shape α > 0, e.g. 'gamma:0.5'") from None
    if kind == "hyperexp":
        if not arg:
            return HyperExponential()
        try:
            pairs = [item.split("/") for item in arg.split(",")]
            probs = tuple(float(p) for p, _ in pairs)
            scales = tuple(float(c) for _, c in pairs)
        except ValueError:
            raise InputError(
                f"service law {spec!r}: hyperexp needs P/C pairs, e.g. 'hyperexp:0.6667/0.5,0.3333/2'"
            ) from None
        return HyperExponential(probs, scales)
    law = _family(kind, arg, spec)
    if law is not None:
        return law
    if kind in ("lst", "samples"):
        raise InputError(
            f"service law {spec!r} was built from a Python object and cannot be rebuilt from its name; "
            "pass the law object itself (service=...)"
        )
    raise InputError(f"unknown service law {spec!r}; valid: {SERVICE_FORMS}")


def _floats(spec: str, arg: str, count: int, example: str) -> list[float]:
    try:
        vals = [float(x) for x in arg.split(",")]
    except ValueError:
        vals = []
    if len(vals) != count:
        raise InputError(f"service law {spec!r}: expected {count} number(s), e.g. {example!r}")
    return vals


def _family(kind: str, arg: str, spec: str) -> ServiceLaw | None:
    """The laws of :mod:`.families` by their CLI spelling; None for an unknown kind."""
    if kind == "uniform":
        return Uniform(*_floats(spec, arg, 2, "uniform:1,20"))
    if kind in ("shiftexp", "shifted-exp"):
        return ShiftedExponential(*_floats(spec, arg, 1, "shiftexp:0.5"))
    if kind in ("lognormal", "lognorm"):
        return LogNormal(*_floats(spec, arg, 1, "lognormal:0.5"))
    if kind in ("mix", "mixture"):
        comps: list[tuple[float, str, float]] = []
        for part in arg.split(";"):
            wt, star, rest = part.partition("*")
            law, at, scale = rest.rpartition("@") if "@" in rest else (rest, "", "1")
            try:
                comps.append((float(wt), law.strip(), float(scale)))
            except ValueError:
                comps = []  # refused below
                break
            if not star or not law:
                comps = []  # refused below
                break
        if not comps:
            raise InputError(f"service law {spec!r}: mix needs W*LAW@C parts joined by ';', e.g. 'mix:0.5*det@0.8;0.5*exp@1.2'")
        return Mixture([(w, parse_service(part), c) for w, part, c in comps])
    if kind == "max":
        base, at, mean = arg.rpartition("@") if "@" in arg else (arg, "", "")
        if not base:
            raise InputError(f"service law {spec!r}: max needs a request-time law, e.g. 'max:uniform:1,20' or 'max:exp@5'")
        rm = quantity(mean, "time", f"service law {spec!r}: the mean after '@'") if at else None
        if base.lower().startswith("empirical:"):
            raise InputError(f"service law {spec!r}: for measured request times use Python: MaxOf(Empirical(samples))")
        return MaxOf(parse_service(base), rm)
    if kind == "empirical":
        if not arg:
            raise InputError("empirical:FILE needs a profile CSV with columns batch_size, latency_ms")
        return EmpiricalProfile(arg)
    return None


CURVE_FORMS = (
    "affine:A,C (A·b+C), const:C, log:A,C (A·ln b + C), table:1=V1,2=V2,…, csv:FILE[:monotone|interp|affine|power], "
    "max:LAW (mean of the max of b request times), empirical:FILE (measured per-b means), "
    "power:SPEC (energy only: ζ(b) = P(b)·l(b), P in W); numbers may carry units (1.2ms, 800us, 60mJ, 0.06J, 60W)"
)


def _numbers(spec: str, arg: str, count: int, kind: str | None, where: str) -> list[float]:
    """``count`` comma-separated numbers in the base unit of ``kind`` (:func:`.units.quantity`)."""
    parts = arg.split(",")
    if len(parts) != count:
        raise InputError(f"{spec!r}: expected {count} number(s), got {len(parts)}; valid forms: {CURVE_FORMS}")
    return [quantity(p, kind, where) for p in parts]


def parse_curve(spec: str | Curve, what: str = "model") -> Curve:
    """Parse ``affine:A,C`` / ``const:C`` / ``log:A,C`` / ``table:b=v,…`` into a :class:`Curve`.

    ``what`` names the quantity ("latency model": ms, "energy model": mJ, "power model": W); its numbers
    may carry units of that quantity (``800us``, ``0.06J``, ``60W``).  An energy may be ``power:SPEC``
    (:class:`PowerEnergy`, bound to l(b) by the problem)."""
    if isinstance(spec, Curve):
        return spec
    if not isinstance(spec, str):
        raise InputError(f"{what} must be a string such as 'affine:0.3051,1.0524', got {spec!r}")
    kind, _, arg = spec.strip().partition(":")
    kind, unit = kind.lower(), quantity_of(what)
    where = f"{what.removesuffix(' model')} {spec.strip()!r}"
    if kind == "affine":
        return Affine(*_numbers(spec, arg, 2, unit, where))
    if kind in ("const", "constant"):
        return Constant(*_numbers(spec, arg, 1, unit, where))
    if kind in ("log", "logarithmic"):
        return Logarithmic(*_numbers(spec, arg, 2, unit, where))
    if kind == "table":
        try:
            pairs = [item.split("=") for item in arg.split(",")]
            sizes = tuple(int(b) for b, _ in pairs)
            texts = [v for _, v in pairs]
        except ValueError:
            raise InputError(f"{what} {spec!r}: table needs b=value pairs, e.g. 'table:1=1.3,2=1.6'") from None
        return Table(sizes, tuple(quantity(v, unit, where) for v in texts))
    if kind == "csv":
        return parse_profile_curve(spec.strip()[4:], unit if unit in ("energy", "power") else "latency")
    if kind in ("max", "empirical") and unit not in ("energy", "power"):
        return cast(Curve, parse_service(spec).natural_latency())  # the max and empirical laws define one
    if kind == "power" and unit == "energy":
        return PowerEnergy(parse_curve(arg, "power model"))
    if unit == "power":
        raise InputError(f"unknown {what} {spec!r}; valid forms: const:P, affine:A,C, log:A,C, table:1=P1,2=P2,…, "
                         "csv:FILE[:fit] (its power_w column); numbers in W, or with a unit: 60W, 0.06kW, 500mW")
    raise InputError(f"unknown {what} {spec!r}; valid forms: {CURVE_FORMS}")
