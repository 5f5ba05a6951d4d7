"""Measured profiles: l(b), ζ(b) and per-b batch-time laws from a CSV of timings (paper 004 §III, §VII).

The CSV has one row per measurement (repeats allowed), e.g. exported from perf_analyzer or a timing
loop with NVML energy counters::

    batch_size,latency_ms,energy_mj          (or power_w instead of energy_mj: ζ = power·latency)
    1,1.36,39.4
    1,1.35,39.6
    2,1.66,59.3

From it:

* :class:`ProfileCurve` — l(b) or ζ(b) spelled ``csv:FILE[:monotone|interp|affine|power]``:

  - ``monotone`` (the default for l(b)): isotonic regression of the per-b means (pool adjacent
    violators, weighted by the number of measurements per size), then PCHIP through the fitted
    values.  Noisy flat-then-rising data (a GPU's l(b) is flat while the batch fills idle lanes) is
    accepted; the fit is non-decreasing, as paper 004 §III requires of l(b); equal to ``interp``
    whenever the means are already non-decreasing;
  - ``interp`` (the default for ζ(b), which the model does not require to be monotone): PCHIP
    through the per-b means themselves — exact at measured sizes, no overshoot; for l(b) it refuses
    decreasing means with the rows that decrease;
  - ``affine`` (A·b + C) or ``power`` (A·b^p): least squares over all rows.

  ``monotone`` and ``interp`` never extrapolate beyond the measured sizes;
* :class:`EmpiricalProfile` — the service law ``empirical:FILE``: at each measured b the empirical law
  of its measured times, so the measured spread enters E[G²] (eq. 11) and p_k (eq. 4); an unmeasured
  allowed b takes the shape of the nearest measured size (the smaller on ties);
* :meth:`Profile.report` — what was measured and how well each model fits (R², worst residual).

Every malformed file gets one :class:`InputError` naming the file, line and value.
"""

from __future__ import annotations

import json
import math
import os
from dataclasses import dataclass
from typing import ClassVar

import numpy as np

from ..errors import InputError
from ..limits import BMAX_LIMIT, IDLE_POWER_MAX_W, read_csv_rows
from .curves import Curve
from .families import Empirical, NaturalLatency
from .laws import ServiceLaw

__all__ = ["Profile", "read_profile", "ProfileCurve", "EmpiricalProfile", "FITS", "DEFAULT_FIT", "isotonic"]

FITS = ("monotone", "interp", "affine", "power")
_QUANTITIES = {"latency": "latency_ms", "energy": "energy_mj", "power": "power_w"}
#: the fit ``csv:FILE`` means: l(b) must be non-decreasing (problem.py), ζ(b) and P(b) only ≥ 0
DEFAULT_FIT = {"latency": "monotone", "energy": "interp", "power": "interp"}


@dataclass(frozen=True)
class Profile:
    """Rows of a profile CSV: batch sizes, latencies (ms) and energies (mJ, or None if not measured)."""

    path: str
    batch: np.ndarray  # int64 per row
    latency: np.ndarray  # ms per row
    energy: np.ndarray | None  # mJ per row
    lines: np.ndarray  # CSV line number of each row (for messages)
    power: np.ndarray | None = None  # W per row (the power_w column), or None


    @property
    def sizes(self) -> np.ndarray:
        """Measured batch sizes, ascending."""
        return np.unique(self.batch)

    def values(self, quantity: str) -> np.ndarray:
        if quantity == "power":
            if self.power is None:
                raise InputError(
                    f"profile {self.path}: no power_w column (W while a batch runs) for --power csv:FILE; "
                    "for an energy_mj column use --energy csv:FILE"
                )
            return self.power
        if quantity == "energy":
            if self.energy is None:
                raise InputError(
                    f"profile {self.path}: no energy column; add energy_mj (mJ per batch) or power_w (W during the batch)"
                )
            return self.energy
        return self.latency

    def means(self, quantity: str) -> np.ndarray:
        """Per measured batch size, the mean of the quantity."""
        v = self.values(quantity)
        return np.array([v[self.batch == b].mean() for b in self.sizes])

    def samples(self, b: int) -> np.ndarray:
        return self.latency[self.batch == b]

    def check_monotone_latency(self) -> None:
        """l(b) must be non-decreasing (paper 004 §III): name the offending rows otherwise."""
        means = self.means("latency")
        for i in np.nonzero(np.diff(means) < 0)[0]:
            b0, b1 = self.sizes[i], self.sizes[i + 1]
            rows0 = _line_list(self.lines[self.batch == b0])
            rows1 = _line_list(self.lines[self.batch == b1])
            raise InputError(
                f"profile {self.path}: mean latency decreases from b={b0} ({means[i]:.6g} ms, lines {rows0}) to "
                f"b={b1} ({means[i + 1]:.6g} ms, lines {rows1}); l(b) must be non-decreasing — re-measure, or use "
                "the default monotone fit (csv:FILE or csv:FILE:monotone) or a fitted model (csv:FILE:affine)"
            )

    def counts(self) -> np.ndarray:
        """Per measured batch size, the number of measurements."""
        return np.array([int((self.batch == b).sum()) for b in self.sizes])

    def non_monotone(self, quantity: str) -> list[dict]:
        """Each adjacent pair of measured sizes whose mean decreases: by how much, and how many standard
        errors of the difference of the two means that is (``None`` when a size has one measurement)."""
        v, sizes, means = self.values(quantity), self.sizes, self.means(quantity)
        out = []
        for i in np.nonzero(np.diff(means) < 0)[0]:
            x0, x1 = v[self.batch == sizes[i]], v[self.batch == sizes[i + 1]]
            drop = float(means[i] - means[i + 1])
            se = math.sqrt(x0.var(ddof=1) / x0.size + x1.var(ddof=1) / x1.size) if min(x0.size, x1.size) > 1 else None
            out.append({
                "from_batch_size": int(sizes[i]), "to_batch_size": int(sizes[i + 1]), "drop": drop,
                "relative_drop": drop / float(means[i]),
                "standard_errors": (drop / se if se else (math.inf if se == 0 else None)),
            })
        return out

    def report(self) -> dict:
        """Measured sizes, decreasing means, and the quality of every model for each measured quantity."""
        out = {
            "path": self.path, "rows": int(self.batch.size), "batch_sizes": self.sizes.tolist(),
            "samples_per_size": self.counts().tolist(),
        }
        for q in ("latency", "energy"):
            if q == "energy" and self.energy is None:
                continue
            fits = dict.fromkeys((DEFAULT_FIT[q], "monotone", "affine", "power") if self.sizes.size >= 2 else ("monotone",))
            out[q] = {fit: ProfileCurve(self.path, q, fit, profile=self).fit_report() for fit in fits}
            out[q]["means"] = self.means(q).tolist()
            out[q]["non_monotone"] = self.non_monotone(q)
            out[q]["default_fit"] = DEFAULT_FIT[q]
        return out


def isotonic(y: np.ndarray, w: np.ndarray) -> np.ndarray:
    """The non-decreasing sequence closest to ``y`` in weighted least squares (pool adjacent violators)."""
    y, w = np.asarray(y, dtype=np.float64), np.asarray(w, dtype=np.float64)
    try:
        from scipy.optimize import isotonic_regression  # scipy ≥ 1.12
    except ImportError:  # pragma: no cover - older scipy: the same algorithm by hand
        blocks: list[list[float]] = []  # [weighted mean, weight, length]
        for yi, wi in zip(y, w):
            blocks.append([yi, wi, 1])
            while len(blocks) > 1 and blocks[-2][0] > blocks[-1][0]:
                m1, w1, n1 = blocks.pop()
                m0, w0, n0 = blocks[-1]
                blocks[-1] = [(m0 * w0 + m1 * w1) / (w0 + w1), w0 + w1, n0 + n1]
        return np.concatenate([np.full(n, m) for m, _, n in blocks])
    return np.asarray(isotonic_regression(y, weights=w, increasing=True).x, dtype=np.float64)


def _line_list(lines: np.ndarray) -> str:
    numbers = [int(x) for x in lines]
    return ",".join(map(str, numbers[:6])) + ("…" if len(numbers) > 6 else "")


_CACHE: dict = {}


def read_profile(path: str) -> Profile:
    """Read and validate a profile CSV (cached by path and modification time)."""
    path = str(path)
    try:
        st = os.stat(path)
    except OSError as e:
        raise InputError(f"cannot read profile {path}: {e.strerror}") from None
    key = (os.path.abspath(path), st.st_mtime_ns, st.st_size)
    if key not in _CACHE:
        _CACHE[key] = _parse(path)
    return _CACHE[key]


def _parse(path: str) -> Profile:
    try:
        rows = read_csv_rows(path, "profile")
    except (OSError, UnicodeDecodeError) as e:
        raise InputError(f"cannot read profile {path}: {getattr(e, 'strerror', None) or e}") from None
    start = next((i for i, r in enumerate(rows) if any(c.strip() for c in r) and not r[0].lstrip().startswith("#")), None)
    if start is None:
        raise InputError(f"profile {path} is empty; expected a header batch_size,latency_ms[,energy_mj|power_w]")
    header = [c.strip().lower() for c in rows[start]]
    missing = [c for c in ("batch_size", "latency_ms") if c not in header]
    if missing:
        raise InputError(
            f"profile {path}: missing column {', '.join(repr(c) for c in missing)}; found {header}; "
            "expected batch_size,latency_ms[,energy_mj|power_w]"
        )
    col = {name: header.index(name) for name in ("batch_size", "latency_ms", "energy_mj", "power_w") if name in header}
    data: dict[str, list] = {name: [] for name in col}
    lines = []
    for i in range(start + 1, len(rows)):
        r = rows[i]
        if not any(c.strip() for c in r) or r[0].lstrip().startswith("#"):
            continue
        line = i + 1
        for name, j in col.items():
            cell = r[j].strip() if j < len(r) else ""
            try:
                v = float(cell)
            except ValueError:
                raise InputError(f"profile {path} line {line}: column {name!r} holds {cell!r}, not a number") from None
            if not math.isfinite(v):
                raise InputError(f"profile {path} line {line}: column {name!r} holds {cell!r}, not a finite number")
            if name == "batch_size" and (v != int(v) or not 1 <= v <= BMAX_LIMIT):
                raise InputError(f"profile {path} line {line}: batch_size {cell!r} must be an integer ≥ 1 (at most {BMAX_LIMIT})")
            if name == "latency_ms" and not v > 0:
                raise InputError(f"profile {path} line {line}: latency_ms = {cell} must be > 0")
            if name in ("energy_mj", "power_w") and v < 0:
                raise InputError(f"profile {path} line {line}: {name} = {cell} must be ≥ 0")
            data[name].append(v)
        lines.append(line)
    if not lines:
        raise InputError(f"profile {path} has a header but no measurements")
    batch = np.asarray(data["batch_size"], dtype=np.int64)
    latency = np.asarray(data["latency_ms"], dtype=np.float64)
    if "energy_mj" in data:
        energy = np.asarray(data["energy_mj"], dtype=np.float64)
    elif "power_w" in data:
        energy = np.asarray(data["power_w"], dtype=np.float64) * latency  # W · ms = mJ
    else:
        energy = None
    power = np.asarray(data["power_w"], dtype=np.float64) if "power_w" in data else None
    return Profile(path=path, batch=batch, latency=latency, energy=energy, lines=np.asarray(lines), power=power)


class ProfileCurve(Curve):
    """l(b) (``quantity='latency'``, ms), ζ(b) (``'energy'``, mJ) or P(b) (``'power'``, W, the power_w column)
    from a profile CSV; see the module doc."""

    def __init__(self, path: str, quantity: str = "latency", fit: str | None = None, profile: Profile | None = None):
        """``fit=None``: the quantity's default (:data:`DEFAULT_FIT`)."""
        if quantity not in _QUANTITIES:
            raise InputError(f"profile quantity must be latency, energy or power, got {quantity!r}")
        fit = DEFAULT_FIT[quantity] if fit is None else fit
        if fit not in FITS:
            raise InputError(f"profile fit {fit!r} is unknown; valid: {', '.join(FITS)}")
        self.path, self.quantity, self.fit = str(path), quantity, fit
        self.profile = profile or read_profile(self.path)
        prof = self.profile
        y = prof.values(quantity)
        sizes, means = prof.sizes, prof.means(quantity)
        if fit in ("interp", "monotone"):
            if fit == "interp" and quantity == "latency":
                prof.check_monotone_latency()
            self._knots = isotonic(means, prof.counts()) if fit == "monotone" else means
            if sizes.size >= 2:
                from scipy.interpolate import PchipInterpolator

                self._interp = PchipInterpolator(sizes.astype(float), self._knots, extrapolate=False)
            self.params: tuple[float, ...] = ()
        elif fit == "affine":
            if sizes.size < 2:
                raise InputError(f"profile {self.path}: an affine fit needs at least 2 measured batch sizes")
            A = np.vstack([prof.batch.astype(float), np.ones(prof.batch.size)]).T
            self.params = tuple(float(x) for x in np.linalg.lstsq(A, y, rcond=None)[0])
        else:  # power law A·b^p
            if sizes.size < 2 or np.any(means <= 0):
                raise InputError(f"profile {self.path}: a power-law fit needs ≥ 2 measured sizes with positive {quantity}")
            from scipy.optimize import curve_fit

            slope, icpt = np.polyfit(np.log(sizes), np.log(means), 1)
            f = lambda b, a, p: a * np.power(b, p)
            popt, _ = curve_fit(f, prof.batch.astype(float), y, p0=(math.exp(icpt), slope), maxfev=20000)
            self.params = (float(popt[0]), float(popt[1]))

    def __call__(self, b):
        b = np.asarray(b, dtype=np.float64)
        if self.fit == "affine":
            return self.params[0] * b + self.params[1]
        if self.fit == "power":
            return self.params[0] * np.power(b, self.params[1])
        sizes = self.profile.sizes
        outside = np.unique(b[(b < sizes[0]) | (b > sizes[-1])]).astype(int)
        if outside.size:
            raise InputError(
                f"profile {self.path} measures batch sizes {sizes[0]}..{sizes[-1]}; batch size {outside.tolist()[0]} lies "
                f"outside and cannot be interpolated; restrict the batch sizes (--bmax {sizes[-1]}) or extrapolate a "
                f"fitted model (csv:{self.path}:affine or :power)"
            )
        if sizes.size == 1:
            return np.full(b.shape, self._knots[0])
        out = np.asarray(self._interp(b), dtype=np.float64)
        if self.fit == "monotone":  # between its knots, exactly: round-off never makes l(b+1) < l(b)
            i = np.clip(np.searchsorted(sizes, b, side="right") - 1, 0, sizes.size - 2)
            out = np.clip(out, self._knots[i], self._knots[i + 1])
        return out

    def spec(self):
        return f"csv:{self.path}" + ("" if self.fit == DEFAULT_FIT[self.quantity] else f":{self.fit}")

    def fit_report(self) -> dict:
        """R² over all rows, the worst per-size residual of the mean, and the parameters."""
        prof = self.profile
        y = prof.values(self.quantity)
        pred = self(prof.batch)
        ss_res = float(((y - pred) ** 2).sum())
        ss_tot = float(((y - y.mean()) ** 2).sum())
        res = prof.means(self.quantity) - self(prof.sizes)
        i = int(np.argmax(np.abs(res)))
        return {
            "fit": self.fit, "params": list(self.params),
            "r2": 1.0 - ss_res / ss_tot if ss_tot > 0 else 1.0,
            "worst_residual": float(res[i]), "worst_at_batch_size": int(prof.sizes[i]),
        }


class EmpiricalProfile(ServiceLaw):
    """Service law ``empirical:FILE``: the measured batch times of each b, rescaled to the mean l(b)."""

    name: ClassVar[str] = "empirical"

    def __init__(self, path: str, profile: Profile | None = None):
        """``profile``: rows already in memory (e.g. sampled batch times); ``path`` then only names them."""
        self.path = str(path)
        self.profile = profile or read_profile(self.path)
        self._laws = {int(b): Empirical(self.profile.samples(b), label=f"{self.path}@b={int(b)}") for b in self.profile.sizes}

    def spec(self):
        return f"empirical:{self.path}"

    def law_for(self, b: int | None) -> Empirical:
        """The measured law of batch size b, or of the nearest measured size (the smaller on ties)."""
        sizes = self.profile.sizes
        if b is None:
            raise InputError("an empirical profile law needs the batch size b")
        i = int(np.argmin(np.abs(sizes - int(b))))
        return self._laws[int(sizes[i])]

    def natural_latency(self) -> Curve:
        curve = ProfileCurve(self.path, "latency", profile=self.profile)
        return NaturalLatency(self, lambda b: float(curve(b)))

    def lst(self, s, l, b=None):
        return self.law_for(b).lst(s, l)

    def second_moment(self, l, b=None):
        return self.law_for(b).second_moment(l)

    def arrival(self, m, kmax, b=None):
        return self.law_for(b).arrival(m, kmax)

    def sample(self, rng, l, size, b=None):
        return self.law_for(b).sample(rng, l, size)

    def cdf(self, x, l, b=None):
        return self.law_for(b).cdf(x, l)


def parse_profile_curve(arg: str, quantity: str) -> ProfileCurve:
    """``FILE`` or ``FILE:fit`` (the part after ``csv:``)."""
    fit: str | None
    path, sep, fit = arg.rpartition(":")
    if not sep or fit not in FITS:
        path, fit = arg, None
    if not path:
        raise InputError("csv:FILE needs a file name, e.g. csv:profile.csv or csv:profile.csv:affine")
    return ProfileCurve(path, quantity, fit)


#: The largest sidecar read for its idle power (bytes): ``measure`` writes a few KB.
SIDECAR_BYTES_LIMIT = 4 << 20


def measured_idle_power(path: str) -> float | None:
    """The idle power (W) ``smdp-batch measure`` recorded beside the profile ``path`` (its sidecar ``PATH.json``:
    the device's power over windows with no call running, read with an energy counter), or None: no sidecar, no
    reading (no counter, or a constant ``--power-w``), or an unreadable one.  Only that number is read; no path
    named inside the sidecar is opened."""
    side = f"{path}.json"
    try:
        if not os.path.isfile(side) or os.path.getsize(side) > SIDECAR_BYTES_LIMIT:
            return None
        with open(side, encoding="utf-8") as fh:
            meta = json.load(fh)
    except (OSError, ValueError, RecursionError):
        return None
    v = meta.get("idle_power_w") if isinstance(meta, dict) else None
    if isinstance(v, bool) or not isinstance(v, (int, float)) or not (math.isfinite(v) and 0 <= v <= IDLE_POWER_MAX_W):
        return None
    return float(v)
