"""Units on the numbers people type: times (ms), energies (mJ), powers (W), and arrival-trace time units.

The model computes in ms, mJ and W (W = mJ/ms).  A number in a curve spec may carry a unit of its
quantity (``60mJ``, ``0.06J``, ``800us``, ``0.0012s``, ``60W``, ``1.2kW``); a bare number keeps the base
unit.  Conversions go through :class:`decimal.Decimal`, so ``0.06J`` is exactly the float of ``60``
and ``800us`` exactly that of ``0.8``: a spec with units solves the same problem bit for bit.

:func:`quantity` is the one number parser of the curve specs (:mod:`.spec`); :data:`TIME_UNITS` and
:func:`check_trace_unit` serve the arrival-trace readers; :func:`energy_text` words ζ(b) in mJ and W.
"""

from __future__ import annotations

import math
import re
from decimal import Context, Decimal, InvalidOperation

import numpy as np

from ..errors import InputError

__all__ = ["UNITS", "TIME_UNITS", "quantity", "quantity_of", "check_trace_unit", "to_ms", "energy_text"]

#: Per quantity: its base unit, and each accepted spelling → its size in the base unit (an exact decimal).
UNITS: dict[str, tuple[str, dict[str, str]]] = {
    "time": ("ms", {"s": "1000", "ms": "1", "us": "0.001", "µs": "0.001", "μs": "0.001", "ns": "0.000001"}),
    "energy": ("mJ", {"kJ": "1000000", "J": "1000", "mJ": "1", "uJ": "0.001", "µJ": "0.001", "μJ": "0.001"}),
    "power": ("W", {"kW": "1000", "W": "1", "mW": "0.001"}),
}
_VALID = {"time": "ms (bare numbers), s, us/µs, ns", "energy": "mJ (bare numbers), J, uJ/µJ, kJ",
          "power": "W (bare numbers), kW, mW"}
_NAME = {"time": "a time", "energy": "an energy", "power": "a power"}

#: ``--time-unit`` of arrival traces: spelling → ms per unit.
TIME_UNITS = {"s": 1000.0, "ms": 1.0, "us": 1e-3, "µs": 1e-3, "ns": 1e-6}
_TRACE_FACTORS = {"s": "1000", "ms": "1", "us": "0.001", "µs": "0.001", "ns": "0.000001"}

_NUMBER_UNIT = re.compile(r"^\s*([+-]?(?:\d+(?:\.\d*)?|\.\d+)(?:[eE][+-]?\d+)?)\s*([^\d\s.+-][^\s]*)\s*$")
_CTX = Context(prec=60)


def _unit_of(word: str) -> tuple[str, str] | None:
    """(quantity, exact factor) of a unit spelling; the case of the letters does not matter (no mega- units)."""
    for q, (_, table) in UNITS.items():
        if word in table:
            return q, table[word]
    if word.startswith("M"):  # mega-: never read as milli-
        return None
    low = word.lower()
    for q, (_, table) in UNITS.items():
        for name, factor in table.items():
            if name.lower() == low:
                return q, factor
    return None


def quantity_of(what: str) -> str | None:
    """The quantity a curve's name speaks of ("latency model" → time, "energy model" → energy), else None."""
    for key, q in (("power", "power"), ("energy", "energy"), ("latency", "time"), ("time", "time")):
        if key in what:
            return q
    return None


def quantity(text: str, kind: str | None, where: str) -> float:
    """``text`` as a float in the base unit of ``kind`` (time: ms, energy: mJ, power: W).

    A bare number is in the base unit; ``60mJ``, ``0.06J``, ``800us`` carry theirs.  ``where`` names the
    spec in messages.  A unit of another quantity, or an unknown one, is one InputError naming the value
    and the valid units."""
    t = str(text).strip()
    try:
        return float(t)
    except ValueError:
        pass
    m = _NUMBER_UNIT.match(t)
    if not m:
        raise InputError(f"{where}: {t!r} must be a number{'' if kind is None else ', optionally with a unit: ' + _VALID[kind]}")
    number, word = m.groups()
    found = _unit_of(word)
    if kind is None:
        raise InputError(f"{where}: {t!r} carries a unit, but this value takes a bare number")
    if found is None:
        raise InputError(f"{where}: {t!r} has an unknown unit {word!r}; {_NAME[kind]} takes {_VALID[kind]}")
    q, factor = found
    if q != kind:
        hint = ""
        if kind == "energy" and q == "power":
            hint = "; for power while serving a batch use --power (ζ(b) = P(b)·l(b))"
        elif kind == "power" and q == "energy":
            hint = "; for energy per batch use --energy"
        raise InputError(f"{where}: {t!r} is {_NAME[q]}, not {_NAME[kind]}; valid units: {_VALID[kind]}{hint}")
    try:
        value = float(_CTX.multiply(Decimal(number), Decimal(factor)))
    except InvalidOperation:  # pragma: no cover - the pattern admits only decimal numbers
        raise InputError(f"{where}: {t!r} must be a number") from None
    return value


# ------------------------------------------------------------------------------------------ traces
#: A median gap below this, read as ms (1 µs: a million requests per second), suggests the times are seconds.
GAP_SECONDS_MS = 1e-3
#: A median gap above this, read as ms (100 s between requests), suggests µs or ns timestamps.
GAP_MICROS_MS = 1e5


def to_ms(cells: list[str], unit: str) -> np.ndarray:
    """Decimal texts of times in ``unit`` (:data:`TIME_UNITS`) as float64 ms, each the float nearest the exact
    product (``0.0012`` s is exactly the float of ``1.2`` ms)."""
    if TIME_UNITS[unit] == 1.0:
        return np.asarray([float(c) for c in cells], dtype=np.float64)
    factor = Decimal(_TRACE_FACTORS[unit])
    return np.asarray([float(_CTX.multiply(Decimal(c), factor)) for c in cells], dtype=np.float64)


def check_trace_unit(path: str, t_ms: np.ndarray, unit: str | None) -> None:
    """Refuse a trace whose times, read with the default unit (ms, ``unit`` None), look like another unit.

    The median gap between distinct arrivals decides: below :data:`GAP_SECONDS_MS` ms they look like
    seconds, above :data:`GAP_MICROS_MS` ms like µs or ns.  An explicit ``unit`` is never second-guessed."""
    if unit is not None or t_ms.size < 3:
        return
    gaps = np.diff(t_ms)
    gaps = gaps[gaps > 0]
    if gaps.size == 0:
        return
    med = float(np.median(gaps))
    if med < GAP_SECONDS_MS:
        raise InputError(
            f"trace {path}: read as ms, the median gap between arrivals is {med:.3g} ms ({1e3 / med:.3g} requests/s); "
            "the times look like seconds: give --time-unit s (or --time-unit ms to keep ms)")
    if med > GAP_MICROS_MS:
        raise InputError(
            f"trace {path}: read as ms, the median gap between arrivals is {med:.3g} ms ({med / 1e3:.3g} s); the times "
            "look like microseconds or nanoseconds: give --time-unit us or ns (or --time-unit ms to keep ms)")


# ----------------------------------------------------------------------------------------- wording
def _g(x: float) -> str:
    return f"{x:.3g}" if math.isfinite(x) else str(x)


def energy_text(energy, latency, sizes, hint: bool = False) -> str:
    """One line saying what ζ(b) means at the smallest and largest allowed b: mJ per batch and the power
    while that batch is served (ζ(b)/l(b), W = mJ/ms); for ζ(b) = P(b)·l(b), the mJ it gives.  ``hint``: a
    constant typed without a unit also names the --power spelling of the same number in W."""
    from .curves import Constant, PowerEnergy

    ends = sorted({int(sizes[0]), int(sizes[-1])})
    b = np.asarray(ends, dtype=np.float64)
    z = np.asarray(energy(b), dtype=np.float64)
    lat = np.asarray(latency(b), dtype=np.float64)
    if isinstance(energy, PowerEnergy):
        parts = [f"{_g(zi)} mJ per batch at b = {bi} (l({bi}) = {_g(li)} ms)" for bi, zi, li in zip(ends, z, lat)]
        return f"ζ(b) = P(b)·l(b) with P(b) = {energy.power.spec()} W: " + ", ".join(parts)
    if isinstance(energy, Constant):
        parts = [f"≈ {_g(zi / li)} W at b = {bi} (l({bi}) = {_g(li)} ms)" for bi, zi, li in zip(ends, z, lat)]
        return (f"ζ(b) = {_g(energy.value)} mJ per batch " + ", ".join(parts)
                + (f"; for {_g(energy.value)} W while a batch runs use --power const:{_g(energy.value)}W" if hint else ""))
    parts = [f"{_g(zi)} mJ ≈ {_g(zi / li)} W at b = {bi} (l({bi}) = {_g(li)} ms)" for bi, zi, li in zip(ends, z, lat)]
    return f"ζ(b) = {energy.spec()} mJ per batch: " + ", ".join(parts)
