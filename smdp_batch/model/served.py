"""The served-delay model: what a real server adds to the batch model's response time, as measured.

Paper 004's model (§III) answers a request when its batch ends: response = wait + batch time.  A serving
stack adds time the model does not hold, of the same order as l(b) at real speed (Triton's Python backend
spends 1–1.5 ms per batch and ~0.5 ms per response; an HTTP proxy milliseconds per request).  A
:class:`ServedDelay` holds it in three parts, each measured on the user's server by ``smdp-batch calibrate``
(:mod:`smdp_batch.analysis.served`):

* **l(b) as served**: the model's batch time as it ran in the server (a CPU model shares the cores with the
  server and the client), planned with in place of the profile's (:meth:`ServedDelay.apply`).
* **per-batch time on the instance**, a + c·b ms beyond l(b): forming and dispatching a batch, handing its b
  responses back.  The instance is busy for it, so it delays the next batch: the simulator runs a batch of b
  for l(b)·U + a + c·b (U the service law's unit draw; exact, not a scaled l(b)).
* **the return of each position**, r ms: the k-th response of a batch (k = 0 … b − 1, in FIFO order) leaves
  k·r after the first, where the server answers a batch's requests one at a time.
* **the outside delay** O: everything else between the client's send and its answer (the front end, the
  hand-offs, the legs on the wire), an empirical distribution measured at each calibrated load.  It does not
  hold the instance, so the response time is the model's response plus an independent draw of O: a
  convolution, not a constant taken off the bound.  Planning at a load uses the sample of the nearest
  calibrated load at or above it (the delay grows with load where the front end is CPU-bound).

``carried_per_s`` is the highest calibrated load the server's own path carried (every request answered, no
growing queue); a plan beyond it is refused with the figure measured there.

Files are JSON, ``{"format": "smdp-batch served-delay", "version": 1, ...}``, read back strictly
(:meth:`ServedDelay.load`): bounded size, every number finite and in range, samples of at most 10⁶ values.
"""

from __future__ import annotations

import json
import math
import os
from dataclasses import dataclass, field

import numpy as np

from ..errors import InputError

__all__ = ["ServedDelay", "as_served", "batch_positions", "floor_ms", "FORMAT", "VERSION", "PER_BATCH_MIN_PAIRS"]

FORMAT = "smdp-batch served-delay"
VERSION = 1
_MAX_BYTES = 64 * 1024 * 1024
_MAX_SAMPLE = 1_000_000
_MAX_MS = 1e6  # no part of a served delay beyond 1000 s is a measurement
#: a + c·b is fitted from at least this many back-to-back batch pairs; with fewer it is 0 + 0·b, not measured
PER_BATCH_MIN_PAIRS = 5


def as_served(problem, served_latency_ms: dict):
    """``problem`` with l(b) as the server ran it: the measured mean where a size ran (``served_latency_ms``, size →
    ms), elsewhere the profile's l(b) times the median ratio served ÷ profile over the sizes that ran; made
    non-decreasing.  Unchanged without measured sizes.  ζ(b) stays the profile's.

    The problem's own λ is kept where it is stable with l(b) as served; where batches as served cannot carry it
    (a loaded host stretched them), it becomes half the rate they carry: the callers give the loads they check
    explicitly, and a load beyond the server is refused there, by name, not here."""
    sizes = [int(b) for b in problem.batch_sizes]
    lat = [float(x) for x in problem.latency_ms()]
    meas = {b: float(v) for b, v in served_latency_ms.items() if b in sizes}
    if not meas:
        return problem
    ratio = float(np.median([meas[b] / lat[sizes.index(b)] for b in meas]))
    new = np.maximum.accumulate([meas.get(b, x * ratio) for b, x in zip(sizes, lat)])
    latency = "table:" + ",".join(f"{b}={v:.9g}" for b, v in zip(sizes, new))
    carried = problem.max_lam * float(lat[-1]) / float(new[-1])  # the stable rate with l(Bmax) as served
    return problem.replace(latency=latency, lam=problem.lam if problem.lam < carried else 0.5 * carried)


def floor_ms(problem, metric: str, outside: np.ndarray) -> float:
    """The least ``metric`` ("mean" or "p<q>") any setting reaches on a server that adds the outside delays
    ``outside`` (ms), ms: a request served at once, alone, in a batch of the smallest size (l(b_min) of
    ``problem``, which carries l(b) as served) plus that metric of the outside delay."""
    o = np.asarray(outside, dtype=np.float64)
    return float(problem.latency_ms()[0]) + (float(np.mean(o)) if metric == "mean"
                                              else float(np.percentile(o, float(metric[1:]))))


def batch_positions(done: np.ndarray) -> np.ndarray:
    """Each request's place in its batch (0, 1, …), from the completion times of requests in FIFO order: a batch's
    requests are consecutive and complete together, so a batch is a run of equal completion times (two batches
    ending at the same instant on two instances count as one, which errs on the safe side)."""
    n = done.size
    first = np.concatenate(([True], np.abs(np.diff(done)) > 1e-9 * np.maximum(np.abs(done[1:]), 1.0)))
    starts = np.flatnonzero(first)
    return np.arange(n) - np.repeat(starts, np.diff(np.append(starts, n)))


def _ms(name: str, x, lo: float = 0.0, hi: float = _MAX_MS) -> float:
    if isinstance(x, bool) or not isinstance(x, (int, float)) or not math.isfinite(x) or not lo <= x <= hi:
        raise InputError(f"served delay: {name} must be a number of ms in [{lo:g}, {hi:g}], got {x!r}")
    return float(x)


@dataclass(frozen=True)
class ServedDelay:
    """What the server adds to the batch model (module doc).  Times in ms, loads in requests/s.

    ``loads_per_s[i]`` is a calibrated load and ``outside_ms[i]`` the outside delays measured there (sorted).
    ``served_latency_ms``: l(b) as the server ran it (mean per executed size that ran ≥ 5 batches): plans use
    it (:meth:`apply`), since a model sharing the host with its server runs slower than when profiled alone.  ``stats[i]``: what was measured at load i (the
    requests, the client's lag, whether the path carried it, its p99 …).  ``source``: server, model, when.
    """

    a_ms: float
    c_ms: float
    return_ms: float
    loads_per_s: tuple[float, ...]
    outside_ms: tuple[np.ndarray, ...]
    carried_per_s: float | None = None
    served_latency_ms: dict = field(default_factory=dict)
    idle_power_w: float | None = None
    stats: tuple[dict, ...] = ()
    source: dict = field(default_factory=dict)

    def __post_init__(self):
        _ms("a", self.a_ms, -_MAX_MS)
        _ms("c", self.c_ms, -_MAX_MS)
        _ms("the return per position", self.return_ms)
        loads = [float(x) for x in self.loads_per_s]
        if not loads or len(loads) != len(self.outside_ms):
            raise InputError("served delay: needs one outside-delay sample per calibrated load, and at least one load")
        if any(not (math.isfinite(x) and x > 0) for x in loads) or any(b <= a for a, b in zip(loads, loads[1:])):
            raise InputError(f"served delay: the calibrated loads must be increasing req/s > 0, got {loads}")
        samples = []
        for lam, o in zip(loads, self.outside_ms):
            x = np.sort(np.asarray(o, dtype=np.float64).ravel())
            if not 1 <= x.size <= _MAX_SAMPLE or not np.all(np.isfinite(x)) or np.any(np.abs(x) > _MAX_MS):
                raise InputError(f"served delay: the outside delays at {lam:g} req/s must be 1..{_MAX_SAMPLE} "
                                 f"finite ms within ±{_MAX_MS:g}")
            x.setflags(write=False)
            samples.append(x)
        object.__setattr__(self, "loads_per_s", tuple(loads))
        object.__setattr__(self, "outside_ms", tuple(samples))
        c = self.carried_per_s
        if c is not None and (isinstance(c, bool) or not isinstance(c, (int, float)) or not 0 <= c <= 1e9):
            raise InputError(f"served delay: the carried load must be req/s in [0, 1e9] or null, got {c!r}")
        if self.idle_power_w is not None and not (math.isfinite(self.idle_power_w) and 0 <= self.idle_power_w <= 1e5):
            raise InputError(f"served delay: idle power must be W in [0, 1e5], got {self.idle_power_w!r}")
        if any(self.a_ms + self.c_ms * b < 0 for b in (1, 1024)):
            raise InputError(f"served delay: a + c·b must be ≥ 0 ms for every b, got a = {self.a_ms:g}, "
                             f"c = {self.c_ms:g}")
        for lam, st in zip(loads, self.stats):
            share = st.get("new_run_share") if isinstance(st, dict) else None
            if share is not None and (isinstance(share, bool) or not isinstance(share, (int, float))
                                      or not (math.isnan(share) or 0 <= share <= 10)):
                raise InputError(f"served delay: the new run's share at {lam:g} req/s must be a number in [0, 10] "
                                 f"(a share of the plan), got {share!r}")

    # ------------------------------------------------------------------ use
    def per_batch_ms(self, b) -> np.ndarray:
        """a + c·b (ms): the instance's time on a batch of b beyond l(b)."""
        return self.a_ms + self.c_ms * np.asarray(b, dtype=np.float64)

    def index_at(self, lam_per_ms: float) -> int:
        """The calibrated load a plan at λ (req/ms) uses: the nearest at or above it, else the top one."""
        per_s = float(lam_per_ms) * 1000.0
        for i, x in enumerate(self.loads_per_s):
            if x >= per_s * (1.0 - 1e-9):
                return i
        return len(self.loads_per_s) - 1

    def outside_at(self, lam_per_ms: float) -> np.ndarray:
        """The outside delays (ms, sorted) a plan at λ (req/ms) draws from (:meth:`index_at`)."""
        return self.outside_ms[self.index_at(lam_per_ms)]

    def apply(self, problem):
        """``problem`` with l(b) as the server ran it (:func:`as_served`)."""
        return as_served(problem, self.served_latency_ms)

    def add_to(self, arr: np.ndarray, resp: np.ndarray, lam_per_ms: float, seed) -> None:
        """Add what the server adds to the batch model's response times ``resp`` (ms, in place) of the requests
        arriving at ``arr`` (ms): k·r for the k-th request of its batch (:func:`batch_positions`) and an
        independent draw of the outside delay at λ (:meth:`outside_at`), from a generator of its own
        (``SeedSequence(seed)``'s second child), so that the batch times drawn for the stream stay as they are."""
        n = resp.size
        if n == 0:
            return
        if self.return_ms:
            resp += self.return_ms * batch_positions(arr + resp)
        sample = self.outside_at(lam_per_ms)
        rng = np.random.default_rng(np.random.SeedSequence(seed).spawn(2)[1])
        resp += sample[rng.integers(0, sample.size, n)]

    def halfwidth(self, lam_per_ms: float, q: float | None, value: float | None = None) -> float:
        """95 % half-width (ms) a served metric's interval adds (in quadrature) at λ (req/ms): the outside
        delay's q-th percentile (None: its mean) from the calibration sample's own size (200 seeded bootstrap
        resamples for a percentile, the t-free normal interval of the mean) and, for a percentile of ``value``
        ms, how far a new run may land from its plan on this host: ``new_run_share`` of the load × ``value``
        (the runs' spread about their plans where runs were repeated, else one run's own p99 interval).  A plan
        on its bound would otherwise rest on the luck of one calibration."""
        i = self.index_at(lam_per_ms)
        share = self.stats[i].get("new_run_share") if q is not None and i < len(self.stats) else None
        run = 0.0
        if value is not None and isinstance(share, (int, float)) and math.isfinite(share):
            run = float(share) * float(value)
        return math.hypot(self._sample_halfwidth(i, q), run)

    def _sample_halfwidth(self, i: int, q: float | None) -> float:
        key = (i, q)
        cache = self.__dict__.setdefault("_halfwidths", {})
        if key not in cache:
            o = self.outside_ms[i]
            if o.size < 2:
                h = 0.0
            elif q is None:
                h = 1.96 * float(np.std(o, ddof=1)) / math.sqrt(o.size)
            else:
                rng = np.random.default_rng(12345 + i)
                boot = np.percentile(o[rng.integers(0, o.size, (200, o.size))], q, axis=1)
                h = 1.96 * float(np.std(boot, ddof=1))
            cache[key] = h
        return cache[key]

    def beyond(self, lam_per_ms: float) -> str | None:
        """Why the server's own path cannot carry λ (req/ms), or None: λ above the carried load, where a
        calibrated load above it did not carry."""
        per_s = float(lam_per_ms) * 1000.0
        if self.carried_per_s is None or per_s <= self.carried_per_s * (1.0 + 1e-9):
            return None
        failed = [(x, s) for x, s in zip(self.loads_per_s, self.stats or [{}] * len(self.loads_per_s))
                  if x > self.carried_per_s]
        if not failed:
            return None
        x, s = next(((x, s) for x, s in failed if x >= per_s), failed[0])
        why = s.get("why", "its queue grew")
        return (f"the server's own path does not carry {per_s:.4g} req/s on this host: calibrated at "
                f"{x:.4g} req/s, {why}; it carries up to {self.carried_per_s:.4g} req/s")

    def grows_with_load(self) -> bool:
        """Whether the outside delay's p99 rises across the calibrated loads by more than 20 % and 0.5 ms."""
        p = [float(np.percentile(o, 99)) for o in self.outside_ms]
        return len(p) > 1 and p[-1] - p[0] > max(0.5, 0.2 * abs(p[0]))

    def summary(self) -> str:
        """One line: the parts and the outside p99 at each calibrated load."""
        outs = ", ".join(f"{x:.4g}/s: p50 {np.percentile(o, 50):.3g} p99 {np.percentile(o, 99):.3g} ms"
                         for x, o in zip(self.loads_per_s, self.outside_ms))
        grow = "; grows with load" if self.grows_with_load() else ""
        carried = "" if self.carried_per_s is None else f"; carries up to {self.carried_per_s:.4g} req/s"
        got = [st.get("new_run_share") for st in self.stats]
        hw = [100.0 * float(h) for h in got if isinstance(h, (int, float)) and math.isfinite(h)]
        spread = ""
        if hw and len(hw) == len(got):
            pct = lambda v: f"{v:.0f}" if v >= 100 else f"{v:.2g}"  # noqa: E731  (1000 %, not 1e+03 %)
            lo, hi = pct(min(hw)), pct(max(hw))
            spread = (f"; a run's p99 lands within ± {lo if lo == hi else f'{lo}–{hi}'} % of its plan (95 %, "
                      + _between(self.source) + ")")
        pairs, at = self.source.get("per_batch_pairs"), self.source.get("per_batch_sizes")
        bursts = " (the bursts' too)" if self.source.get("probe_bursts") else ""
        if isinstance(pairs, int) and pairs < PER_BATCH_MIN_PAIRS and self.a_ms == self.c_ms == 0.0:
            per = (f"per batch not measured ({pairs} batches were waiting when the one before ended{bursts}: a setting "
                   "that keeps the instance busier than this one is planned without it; calibrate that setting too)")
        elif isinstance(at, list) and len(at) == 1:
            per = f"per batch {self.a_ms:.3g} ms (measured at b = {at[0]} only: taken at every size)"
        else:
            per = f"per batch {self.a_ms:.3g} + {self.c_ms:.3g}·b ms"
        return f"{per}, {self.return_ms:.3g} ms per position, outside delay {outs}{grow}{carried}{spread}"

    # ------------------------------------------------------------------ files
    def as_dict(self) -> dict:
        return {
            "format": FORMAT, "version": VERSION, "a_ms": self.a_ms, "c_ms": self.c_ms, "return_ms": self.return_ms,
            "loads_per_s": list(self.loads_per_s), "outside_ms": [[float(v) for v in o] for o in self.outside_ms],
            "carried_per_s": self.carried_per_s, "grows_with_load": self.grows_with_load(),
            "served_latency_ms": {str(k): float(v) for k, v in self.served_latency_ms.items()},
            "idle_power_w": self.idle_power_w, "stats": list(self.stats), "source": dict(self.source),
        }

    def save(self, path: str) -> None:
        """Write the JSON file atomically (a temporary file renamed over ``path``)."""
        tmp = f"{path}.tmp{os.getpid()}"
        try:
            with open(tmp, "w") as f:
                json.dump(self.as_dict(), f, indent=1)
            os.replace(tmp, path)
        except OSError as e:
            raise InputError(f"cannot write the served-delay file {path}: {e.strerror or e}") from None
        finally:
            if os.path.exists(tmp):
                os.unlink(tmp)

    @classmethod
    def from_dict(cls, d, where: str = "served delay") -> "ServedDelay":
        if not isinstance(d, dict) or d.get("format") != FORMAT:
            raise InputError(f"{where} is not a served-delay file (its format is not {FORMAT!r}); write one with "
                             "smdp-batch calibrate")
        if d.get("version") != VERSION:
            raise InputError(f"{where}: served-delay version {d.get('version')!r} is not read by this version "
                             f"(it reads {VERSION})")
        try:
            lat = {int(k): _ms(f"l({k})", v, 0.0) for k, v in (d.get("served_latency_ms") or {}).items()}
            stats = tuple(dict(s) for s in (d.get("stats") or []))
            outs = d["outside_ms"]
            if not isinstance(outs, list) or not all(isinstance(o, list) for o in outs):
                raise InputError(f"{where}: outside_ms must be a list of lists of ms")
            return cls(d["a_ms"], d["c_ms"], d["return_ms"], tuple(d["loads_per_s"]),
                       tuple(np.asarray(o, dtype=np.float64) for o in outs), d.get("carried_per_s"), lat,
                       d.get("idle_power_w"), stats, dict(d.get("source") or {}))
        except KeyError as e:
            raise InputError(f"{where}: the field {e.args[0]} is missing") from None
        except InputError:
            raise
        except (TypeError, ValueError) as e:
            raise InputError(f"{where}: {e}") from None

    @classmethod
    def load(cls, path: str) -> "ServedDelay":
        """Read a file :meth:`save` wrote; one clear line for anything else."""
        try:
            if not os.path.isfile(path):
                raise InputError(f"served-delay file {path} does not exist or is not a regular file")
            if os.path.getsize(path) > _MAX_BYTES:
                raise InputError(f"served-delay file {path} is over {_MAX_BYTES >> 20} MiB")
            with open(path, "rb") as f:
                d = json.loads(f.read().decode("utf-8"))
        except (OSError, UnicodeDecodeError, ValueError) as e:
            if isinstance(e, InputError):
                raise
            raise InputError(f"served-delay file {path} is not readable JSON: {e}") from None
        return cls.from_dict(d, f"served-delay file {path}")


def _between(source: dict) -> str:
    """What a served model's room for the next run was measured over: runs, and the deployments they ran on."""
    if source.get("runs_per_load", 1) <= 1:
        return "within one run"
    d = source.get("deployments")
    return f"between runs on {d} deployments" if isinstance(d, int) and d > 1 else "between runs"
