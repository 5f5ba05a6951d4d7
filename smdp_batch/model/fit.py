"""Fitting a 1–4 phase MMPP to an arrival trace: counts-per-window HMM, then the exact likelihood.

An MMPP with m phases (rates λ_i /ms, phase generator Q) is the MAP D0 = Q − Λ, D1 = Λ = diag(λ_i)
(:mod:`smdp_batch.model.arrivals`).  Given arrival times t_0 ≤ … ≤ t_{n−1} (ms), :func:`fit_mmpp`:

0. **Ties and quantised timestamps** (:mod:`.trace_clean`): times on a grid (whole ms, 10 ms, …) are
   spread uniformly within their quantum, seeded, so that zero gaps do not pull the fit to a phase of
   enormous rate; the report's note says what was done.  Steps 1–3 see the spread times.

1. **Start: a Poisson HMM on counts per window** (Rydén 1996 §2; hmmlearn's ``PoissonHMM``).  The
   trace is cut into windows of w ms; N_j, the count of window j, is Poisson(λ_i·w) given the phase i
   at the window's start, and the phase moves by the per-window matrix P ≈ e^{Qw}.  EM (Baum–Welch)
   fits (λ_i·w, P) from a quantile start and seeded random starts; the best likelihood is kept.
   Then λ_i = mean count / w and Q = logm(P)/w (closed form for two phases:
   Q = −ln(1 − a − b)/(a + b) · [[−a, a], [b, −b]] / w with a = P_12, b = P_21), negative
   off-diagonal entries set to 0 and the diagonal made −(row sum) (the nearest generator; P need not
   be embeddable).  The default w makes the mean count per window ~10 (:data:`TARGET_COUNT`): enough
   arrivals that a window's count tells a 1 /ms phase from a 3 /ms one, and — for phases that last
   many inter-arrival times, which is what makes an MMPP worth fitting — still much shorter than a
   sojourn, so few windows straddle a switch.  It is widened so that the trace has at most
   :data:`HMM_WINDOWS` windows (EM cost), and narrowed so that it has at least :data:`MIN_WINDOWS`.
   The windows only place the start: step 2 does not use them.
2. **Refinement: the exact likelihood** of the inter-arrival times Δ_k = t_k − t_{k−1} (Neuts 1979;
   Rydén 1996 eq. 2.2), given an arrival at t_0 with the phase in its event-stationary law
   α_0 = π·D1/λ̄:

       L = α_0 · Π_k e^{D0·Δ_k} D1 · 1,

   computed forward by uniformization (:mod:`.map_likelihood`).
   log L is maximised over the logarithms of the m rates and m(m − 1) switching rates by L-BFGS-B
   (scipy; forward-difference gradient; at most :data:`REFINE_EVALS` likelihood evaluations) from the
   HMM estimate; whichever of the two has the higher exact likelihood is kept.  On a trace of more than
   :data:`REFINE_BLOCK` arrivals, log L is the sum over :data:`REFINE_PIECES` blocks of consecutive
   arrivals spread evenly over the trace, REFINE_BLOCK in all, each block's likelihood computed as above
   from its own first arrival (a composite likelihood: the blocks are taken as independent, which they
   nearly are when a block spans many phase visits).  The report says so; the HMM start and the report's
   trace statistics see the whole trace.
3. **Order and choice.**  Phases are ordered by increasing rate.  ``phases="auto"`` fits m = 1..4 and
   keeps the least BIC = k·ln N − 2 log L, with N the number of gaps in log L and k = m² free
   parameters (m = 1 is the Poisson process at its MLE λ = N/(time spanned by the gaps),
   log L = N(ln λ − 1)); AIC = 2k − 2 log L is reported too.  In auto mode the m-phase refinement
   starts from the better (by exact likelihood) of the HMM estimate and each split of one phase of the
   (m − 1)-phase fit into two with rates ×0.9 and ×1.1.
4. **Mean rate.**  A candidate whose mean rate π·λ is more than :data:`RATE_TOL` off the trace's
   (n − 1)/(t_last − t_first) (a short trace that visits a phase a few times leaves it loose) is refitted
   with the rates scaled so that π·λ equals it (the exact likelihood maximised on that surface; m = 1:
   λ = the trace's rate).  The kept model is checked once more; a miss is refused.

The report compares the trace with the model: mean rates, and the index of dispersion of counts
IDC(L) = Var N(L)/E N(L) over windows of L = w, 10w, 100w, 1000w (those with ≥ 20 windows in the
trace): the trace's from its counts in consecutive windows of L ms, the model's from
:meth:`MAP.idc`.  IDC is 1 for Poisson traffic and grows with L for bursty traffic.

Everything is seeded (hmmlearn's random_state = seed + restart) and deterministic.
References: Rydén, "An EM algorithm for estimation in Markov-modulated Poisson processes", CSDA 21
(1996); Fischer & Meier-Hellstern, "The MMPP cookbook", Perf. Eval. 18 (1993); Grassmann,
"Transient solutions in Markovian queueing systems", Comput. Oper. Res. 4 (1977).
"""

from __future__ import annotations

import json
import logging
import math
import time
import warnings
from dataclasses import dataclass, field

import numpy as np

from ..errors import InputError
from ..extras import require
from ..limits import RATE_MAX, RATE_MIN
from .arrivals import MAP
from .map_likelihood import _loglik, map_loglik
from .trace_clean import MIN_ARRIVALS, RATE_TOL, check_rate, check_times, clean_trace, trace_idc, window_counts

__all__ = ["MmppFit", "fit_mmpp", "map_loglik", "default_window", "trace_idc", "PHASES_MAX", "MIN_ARRIVALS"]

#: Most phases fitted (``auto`` tries 1..PHASES_MAX).
PHASES_MAX = 4
#: Mean arrivals per window of the default window.
TARGET_COUNT = 10.0
#: Windows of the count HMM: at least MIN_WINDOWS; the default window keeps at most HMM_WINDOWS, a given
#: one at most WINDOWS_MAX.
MIN_WINDOWS, HMM_WINDOWS, WINDOWS_MAX = 50, 100_000, 1_000_000
#: EM starts (one from quantiles, the others seeded random) and EM iterations per start.
RESTARTS, HMM_ITER = 4, 100
#: Most arrivals of the exact likelihood, the blocks they are taken in from a longer trace, and the most
#: likelihood evaluations of the refinement.
REFINE_BLOCK, REFINE_PIECES, REFINE_EVALS = 200_000, 10, 400
#: Window lengths of the IDC table, in units of the fit's window (kept where the trace has ≥ IDC_WINDOWS).
IDC_FACTORS, IDC_WINDOWS = (1, 10, 100, 1000), 20


# ------------------------------------------------------------------------------------------ inputs
def default_window(times_ms) -> float:
    """The default count window (ms): ~TARGET_COUNT arrivals on average, MIN_WINDOWS..HMM_WINDOWS windows."""
    t = check_times(times_ms)
    span = float(t[-1] - t[0])
    w = TARGET_COUNT * span / (t.size - 1)
    return float(min(max(w, span / HMM_WINDOWS), span / MIN_WINDOWS))


def _check_window(window_ms, span: float) -> float:
    try:
        w = float(window_ms)
    except (TypeError, ValueError):
        raise InputError(f"the window must be a number of ms, got {window_ms!r}") from None
    lo, hi = span / WINDOWS_MAX, span / MIN_WINDOWS
    if not (math.isfinite(w) and lo <= w <= hi):
        raise InputError(f"window {window_ms!r} ms is not valid for a trace of {span:g} ms: use {lo:.4g}..{hi:.4g} ms "
                         f"({MIN_WINDOWS}..{WINDOWS_MAX} windows)")
    return w


# ------------------------------------------------------------------------------------------ the fit
@dataclass(frozen=True)
class MmppFit:
    """A fitted MMPP and its report; rates in 1/ms, times in ms.

    ``loglik`` is the exact log-likelihood (module docstring, step 2) of the blocks of arrivals ``blocks`` =
    ((first arrival, number of arrivals), …): the whole trace up to REFINE_BLOCK arrivals;
    ``candidates`` lists every m tried (one entry unless ``phases="auto"``).
    """

    map: MAP
    loglik: float
    bic: float
    aic: float
    n_params: int
    candidates: list
    selection: str
    estimate: str  # "refined" (the exact-likelihood optimum), the start when refining did not improve it, or m = 1's MLE
    optimizer: dict
    window_ms: float
    arrivals: int
    span_ms: float
    blocks: tuple
    trace_rate: float
    idc: list
    seed: int
    seconds: float
    notes: list = field(default_factory=list)
    timestamps: dict = field(default_factory=dict)  # ties and quantisation found, and what was spread (CleanTrace)

    @property
    def phases(self) -> int:
        return self.map.phases

    @property
    def rates(self) -> np.ndarray:
        """Arrival rate of each phase (1/ms), increasing."""
        return self.map.phase_rates

    @property
    def generator(self) -> np.ndarray:
        """Phase generator Q (1/ms)."""
        return self.map.D0 + self.map.D1

    @property
    def model_rate(self) -> float:
        return self.map.rate

    @property
    def sojourn_ms(self) -> np.ndarray:
        """Mean time per visit of each phase, 1/(−Q_ii) (ms; inf for the one phase of a Poisson process)."""
        leave = -np.diag(self.generator)
        return np.divide(1.0, leave, out=np.full(leave.size, np.inf), where=leave > 0)

    def to_dict(self) -> dict:
        """The fit report (JSON-ready; docs/json.md ``fit-arrivals``)."""
        return {
            "phases": self.phases, "rates": self.rates.tolist(), "generator": self.generator.tolist(),
            "stationary": self.map.stationary.tolist(), "sojourn_ms": self.sojourn_ms.tolist(),
            "trace_rate": self.trace_rate, "model_rate": self.model_rate,
            "idc": [dict(d) for d in self.idc],
            "loglik": self.loglik, "n_params": self.n_params, "bic": self.bic, "aic": self.aic,
            "selection": self.selection, "candidates": [dict(c) for c in self.candidates],
            "estimate": self.estimate, "optimizer": dict(self.optimizer),
            "window_ms": self.window_ms, "arrivals": self.arrivals, "span_ms": self.span_ms,
            "blocks": [{"first": f, "arrivals": c} for f, c in self.blocks], "seed": self.seed, "seconds": self.seconds,
            "notes": list(self.notes), "timestamps": dict(self.timestamps), "rate_tolerance": RATE_TOL,
        }

    def to_json(self) -> str:
        """``{"rates": […], "generator": [[…]], "fit": {report}}``: what :func:`read_map_file` reads
        (``--arrivals map:FILE.json``)."""
        data = {"rates": self.rates.tolist(), "generator": self.generator.tolist(), "fit": self.to_dict()}
        return json.dumps(_finite(data), indent=2, allow_nan=False)


def _finite(o):
    """``o`` with NaN and ±inf as None (strict JSON)."""
    if isinstance(o, dict):
        return {k: _finite(v) for k, v in o.items()}
    if isinstance(o, (list, tuple)):
        return [_finite(v) for v in o]
    return None if isinstance(o, float) and not math.isfinite(o) else o


def fit_mmpp(times_ms, phases: int | str = 2, window_ms: float | None = None, seed: int = 0,
             progress=None) -> MmppFit:
    """Fit an MMPP with ``phases`` = 1..4 phases (or ``"auto"``: the least BIC of 1..4) to sorted arrival
    times (ms); ``window_ms`` the count window of the HMM start (default: :func:`default_window`);
    ``progress(1)`` is called after each number of phases fitted.

    >>> import numpy as np
    >>> t, _, _ = MAP.mmpp([1.0, 4.0], [0.01, 0.02]).sample(20_000, np.random.default_rng(1))
    >>> f = fit_mmpp(t, 2)
    >>> f.phases, f.rates.round(1).tolist()
    (2, [1.0, 4.0])
    """
    t0 = time.perf_counter()
    raw = check_times(times_ms)
    choices = _check_phases(phases)
    seed = _check_seed(seed)
    clean = clean_trace(raw, seed)  # step 0: tied or quantised times spread within their quantum
    t, span = clean.times, float(raw[-1] - raw[0])
    rate = (raw.size - 1) / span
    if window_ms is None:  # a window no shorter than a quantum: shorter ones count the spread, not the trace
        quantum = clean.quantum_ms if clean.spread == "quantum" else None  # set whenever the spread is "quantum"
        window = max(default_window(t), quantum if quantum is not None else 0.0)
    else:
        window = _check_window(window_ms, float(t[-1] - t[0]))
    notes = [clean.note] if clean.note else []
    if t.size > REFINE_BLOCK:
        size = REFINE_BLOCK // REFINE_PIECES
        firsts = np.linspace(0, t.size - size, REFINE_PIECES).round().astype(np.int64)
        notes.append(f"exact likelihood on {REFINE_PIECES} blocks of {size} consecutive arrivals spread over the "
                     f"trace ({REFINE_BLOCK} of {t.size}); the count HMM start used the whole trace")
    else:
        size, firsts = t.size, [0]
    blocks = tuple((int(f), int(size)) for f in firsts)
    gaps = [np.diff(t[f:f + c]) for f, c in blocks]
    counts = window_counts(t, window).reshape(-1, 1)
    cands: list[dict] = []
    for m in choices:  # auto: each m also starts from splits of the (m − 1)-phase fit
        cands.append(_fit_one(m, gaps, counts, window, seed, cands[-1]["_map"] if cands else None, rate))
        if progress is not None:
            progress(1)
    auto = len(choices) > 1
    best = min(cands, key=lambda c: c["bic"]) if auto else cands[0]
    fitted = best.pop("_map")
    notes += [best["_note"]] if best.get("_note") else []
    for c in cands:
        c.pop("_map", None)
        c.pop("_note", None)
    check_rate(fitted.rate, rate, f"{fitted.phases}-phase MMPP fit")  # step 4's guard
    if best["phases"] > 1:
        short = float(np.min(1.0 / np.maximum(-np.diag(fitted.D0 + fitted.D1), 1e-300)))
        if short < 5 * window:
            notes.append(f"the shortest mean sojourn ({short:.4g} ms) is under 5 count windows ({window:.4g} ms): "
                         "the HMM start blurs it; the exact refinement does not use windows")
    idc = [{"window_ms": L, "trace": trace_idc(t, L), "model": fitted.idc(L)}
           for L in (window * f for f in IDC_FACTORS) if span / L >= IDC_WINDOWS]
    return MmppFit(
        map=fitted, loglik=best["loglik"], bic=best["bic"], aic=best["aic"], n_params=best["n_params"],
        candidates=cands, selection="auto (least BIC)" if auto else "given",
        estimate=best["estimate"], optimizer=best["optimizer"], window_ms=window, arrivals=int(t.size),
        span_ms=span, blocks=blocks, trace_rate=rate, idc=idc, seed=seed,
        seconds=time.perf_counter() - t0, notes=notes, timestamps=clean.as_dict())


def _check_phases(phases) -> list[int]:
    if isinstance(phases, str) and phases.strip().lower() == "auto":
        return list(range(1, PHASES_MAX + 1))
    if isinstance(phases, (int, np.integer)) and not isinstance(phases, bool) and 1 <= phases <= PHASES_MAX:
        return [int(phases)]
    raise InputError(f"phases must be 1..{PHASES_MAX} or auto, got {phases!r}")


def _check_seed(seed) -> int:
    if isinstance(seed, (int, np.integer)) and not isinstance(seed, bool) and 0 <= seed < 2**32 - RESTARTS:
        return int(seed)
    raise InputError(f"seed must be an integer in 0..{2**32 - RESTARTS - 1}, got {seed!r}")


def _fit_one(m: int, gaps: list, counts: np.ndarray, window: float, seed: int, previous: MAP | None,
             target: float) -> dict:
    """One candidate: the m-phase fit to the blocks' ``gaps`` (exact likelihood), started from the count HMM or,
    when it is better, from a split of ``previous`` (an (m − 1)-phase fit); refitted at the mean rate ``target``
    (1/ms) when its own is more than RATE_TOL off (module docstring, step 4)."""
    n = sum(g.size for g in gaps)
    span = float(sum(g.sum() for g in gaps))
    lam_bar, note = n / span, None
    if m == 1:
        lam = lam_bar if abs(lam_bar / target - 1) <= RATE_TOL else target
        mp, ll, opt = MAP.poisson(lam), n * math.log(lam) - lam * span, {}
        est = "closed form (MLE)" if lam == lam_bar else "the trace's mean rate"
    else:
        lo, hi = _bounds(m, lam_bar, span)
        starts = {"counts HMM": _theta(*_hmm_start(counts, m, window, seed), lo, hi)}
        if previous is not None and previous.phases == m - 1:
            for i in range(m - 1):
                starts[f"split of phase {i + 1} of the {m - 1}-phase fit"] = _theta(*_split(previous, i), lo, hi)
        scored = [(_theta_loglik(th, m, gaps), name, th) for name, th in starts.items()]
        ll0, start, theta0 = max(scored, key=lambda x: x[0])
        theta, ll, opt = _refine(theta0, ll0, m, gaps, lo, hi)
        opt["start"] = start
        est = "refined" if ll > ll0 else start
        if ll <= ll0:
            theta, ll = theta0, ll0
        lam, Q, pi = _params(theta, m)
        off = float(pi @ lam) / target - 1
        if abs(off) > RATE_TOL:  # step 4: the likelihood's optimum on the surface π·λ = target
            note = (f"the {m}-phase likelihood optimum's mean rate {pi @ lam:.4g} /ms is {100 * abs(off):.3g} % off the "
                    f"trace's {target:.4g} /ms: refitted with the mean rate held at the trace's")
            held = (target, math.exp(lo[0]), math.exp(hi[0]))  # the rates stay in the box: no runaway phase
            theta, ll, opt_c = _refine(theta, _theta_loglik(theta, m, gaps, held), m, gaps, lo, hi, held)
            opt, est = {**opt_c, "start": opt["start"]}, "refined at the trace's mean rate"
            lam, Q, pi = _params(theta, m, held)
        order = np.argsort(lam, kind="stable")
        mp = MAP.mmpp(lam[order], Q[np.ix_(order, order)])
        ll = _loglik(mp.D0, mp.D1, mp.after_arrival(), gaps)  # the reported value, from the validated MAP
    k = m * m
    return {"phases": m, "loglik": ll, "n_params": k, "bic": k * math.log(n) - 2 * ll, "aic": 2 * k - 2 * ll,
            "estimate": est, "optimizer": opt, "_map": mp, "_note": note}


def _hmm_start(counts: np.ndarray, m: int, window: float, seed: int) -> tuple[np.ndarray, np.ndarray]:
    """(λ_i, Q) from the best of RESTARTS Poisson-HMM EM runs on the window counts (module docstring, step 1)."""
    PoissonHMM = require("hmmlearn.hmm", "fit_mmpp with 2–4 phases").PoissonHMM

    best, best_score = None, -math.inf
    log = logging.getLogger("hmmlearn")
    level = log.level
    log.setLevel(logging.ERROR)  # "model is not converging" lines would break the CLI's one-line contract
    try:
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")
            for r in range(RESTARTS):
                h = PoissonHMM(n_components=m, random_state=seed + r, n_iter=HMM_ITER, tol=1e-4,
                               implementation="scaling", init_params="" if r == 0 else "stl")
                if r == 0:  # rates at the counts' quantiles, sticky phases
                    h.startprob_ = np.full(m, 1.0 / m)
                    h.transmat_ = np.full((m, m), 0.05 / (m - 1)) + np.eye(m) * (0.95 - 0.05 / (m - 1))
                    qs = np.quantile(counts[:, 0], (np.arange(m) + 0.5) / m)
                    h.lambdas_ = (np.maximum(qs, 0.1) * (1 + 0.01 * np.arange(m))).reshape(-1, 1)
                try:
                    h.fit(counts)
                    score = h.score(counts)
                except (ValueError, FloatingPointError, np.linalg.LinAlgError):
                    continue  # e.g. counts without spread: the random start's moments are 0/0
                ok = np.all(np.isfinite(h.lambdas_)) and np.all(np.isfinite(h.transmat_))
                if ok and np.isfinite(score) and score > best_score:
                    best, best_score = h, score
    finally:
        log.setLevel(level)
    if best is None:  # rates spread around the mean count, phases kept for ~20 windows
        mean = max(float(counts.mean()), 1e-3)
        return mean * np.linspace(0.5, 1.5, m) / window, _generator(np.full((m, m), 0.05 / (m - 1)) + np.eye(m) * (
            0.95 - 0.05 / (m - 1)), window)
    return best.lambdas_[:, 0] / window, _generator(best.transmat_, window)


def _split(prev: MAP, i: int) -> tuple[np.ndarray, np.ndarray]:
    """(λ, Q) of m phases from an (m − 1)-phase MMPP: phase i copied into a new last phase, rates ×0.9 and ×1.1,
    arrivals into i shared by both, the copies switching between them at i's leaving rate (with equal rates it
    would be the same process as ``prev``)."""
    lam, Q = prev.phase_rates, prev.D0 + prev.D1
    k = lam.size
    lam2 = np.r_[lam, lam[i] * 1.1]
    lam2[i] *= 0.9
    Q2 = np.zeros((k + 1, k + 1))
    Q2[:k, :k] = Q
    Q2[k, :k] = Q[i]
    Q2[:k, k] = Q[:, i] / 2
    Q2[:k, i] /= 2
    Q2[i, k] = Q2[k, i] = -Q[i, i]
    np.fill_diagonal(Q2, 0.0)
    return lam2, Q2 - np.diag(Q2.sum(axis=1))


def _theta(lam: np.ndarray, Q: np.ndarray, lo: np.ndarray, hi: np.ndarray) -> np.ndarray:
    m = lam.size
    return np.clip(np.log(np.maximum(np.r_[lam, Q[~np.eye(m, dtype=bool)]], 1e-300)), lo, hi)


def _generator(P: np.ndarray, window: float) -> np.ndarray:
    """The generator nearest to logm(P)/window (closed form for two phases)."""
    m = P.shape[0]
    if m == 2:
        a, b = float(P[0, 1]), float(P[1, 0])
        s = a + b
        f = -math.log(max(1.0 - s, 1e-2)) / s if s > 0 else 1.0
        L = f * np.array([[-a, a], [b, -b]])
    else:
        from scipy.linalg import logm

        with warnings.catch_warnings():
            warnings.simplefilter("ignore")
            L = np.real(logm(P))
        if not np.all(np.isfinite(L)):
            L = P - np.eye(m)
    off = np.clip(L - np.diag(np.diag(L)), 0.0, None)
    return (off - np.diag(off.sum(axis=1))) / window


def _bounds(m: int, lam_bar: float, span: float) -> tuple[np.ndarray, np.ndarray]:
    """Box of the log-parameters: rates in [1e-6, 1e3]·λ̄, switching rates in [1e-3/span, 50·λ̄] (1/ms)."""
    r_lo, r_hi = max(lam_bar * 1e-6, RATE_MIN * 10), min(lam_bar * 1e3, RATE_MAX / 10)
    q_lo, q_hi = max(1e-3 / span, RATE_MIN * 10), min(50 * lam_bar, RATE_MAX / 10)
    k = m * (m - 1)
    lo = np.log(np.r_[np.full(m, r_lo), np.full(k, q_lo)])
    hi = np.log(np.r_[np.full(m, r_hi), np.full(k, q_hi)])
    return lo, hi


def _unpack(theta: np.ndarray, m: int) -> tuple[np.ndarray, np.ndarray]:
    p = np.exp(theta)
    Q = np.zeros((m, m))
    Q[~np.eye(m, dtype=bool)] = p[m:]
    np.fill_diagonal(Q, -Q.sum(axis=1))
    return p[:m], Q


def _params(theta: np.ndarray, m: int, held: tuple | None = None) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """(λ, Q, π) of the log-parameters; with ``held`` = (target, lo, hi) (1/ms) the rates scaled so that
    π·λ = target, then kept in [lo, hi]."""
    lam, Q = _unpack(theta, m)
    A = np.vstack([Q.T, np.ones((1, m))])
    pi = np.linalg.lstsq(A, np.r_[np.zeros(m), 1.0], rcond=None)[0]
    mean = float(np.clip(pi, 0.0, None) @ lam)
    if held is not None and mean > 0:
        lam = np.clip(lam * (held[0] / mean), held[1], held[2])
    return lam, Q, pi


def _theta_loglik(theta: np.ndarray, m: int, gaps: list, held: tuple | None = None) -> float:
    lam, Q, pi = _params(theta, m, held)
    x0 = np.clip(pi * lam, 0.0, None)
    if not x0.sum() > 0:
        return -math.inf
    return _loglik(Q - np.diag(lam), np.diag(lam), x0 / x0.sum(), gaps, fast=True)


class _Budget(Exception):
    pass


def _refine(theta0, ll0, m, gaps, lo, hi, held=None):
    """L-BFGS-B on −log L/n over the box (rates held at a mean rate, :func:`_params`); stops after REFINE_EVALS
    evaluations, keeping the best point seen."""
    from scipy.optimize import minimize

    n = sum(g.size for g in gaps)
    best = [ll0, theta0.copy()]
    evals = [0]

    def f(th):
        if evals[0] >= REFINE_EVALS:
            raise _Budget
        evals[0] += 1
        ll = _theta_loglik(th, m, gaps, held)
        if ll > best[0]:
            best[:] = [ll, th.copy()]
        return -ll / n if np.isfinite(ll) else 1e10

    def grad(th, h=1e-6):
        f0 = f(th)
        g = np.empty_like(th)
        for i in range(th.size):
            e = th.copy()
            step = h if th[i] + h <= hi[i] else -h
            e[i] += step
            g[i] = (f(e) - f0) / step
        return f0, g

    try:
        res = minimize(grad, theta0, jac=True, method="L-BFGS-B", bounds=list(zip(lo, hi)),
                       options={"maxiter": REFINE_EVALS, "ftol": 1e-2 / n, "gtol": 1e-6})
        info = {"evaluations": evals[0], "iterations": int(res.nit), "converged": bool(res.success),
                "message": str(res.message)}
    except _Budget:
        info = {"evaluations": evals[0], "iterations": None, "converged": False,
                "message": f"stopped at the budget of {REFINE_EVALS} likelihood evaluations (best point kept)"}
    return best[1], best[0], info
