"""Size limits and cost estimates checked *before* work.

Every entry point whose memory or time grows with an input (the truncated model and its arrival
table, the auto-s_max scan, the simulator, grids, law nesting, llm sizes) calls a ``check_*``
function here first, so a small input can never ask for GiBs of memory or hours of work; the
refusal is an :class:`~smdp_batch.errors.InputError` naming the limit and what would fit.

Numbers (all in one place):

* ``MEMORY_BUDGET`` = min(4 GiB, ½ of physical memory) for the arrays of one run;
* ``STATE_LIMIT`` = 2²⁰ (1 048 576) queue states (s_max) for a truncated model or an evaluation (memory is
  checked as well: O(s_max·(A + K)), e.g. 1.2 GB and ~13 s for a solve at s_max = 2²⁰, Bmax = 32,
  deterministic service; the check assumes the arrival table's full width, which a law whose counts never
  reach an exact 0 (a heavy tail) keeps, so it is an upper bound for the others);
* ``SEARCH_STATE_LIMIT`` = 50 000 states for the automatic s_max searches and the heavy-tail refusal;
* ``WORK_LIMIT`` = 2·10⁸ (actions × states × arrival support) for one model (≈ a minute or two of PI scan);
* ``BMAX_LIMIT`` = 4096 (the model has one action per batch size and s_max ≥ 4·Bmax states);
* ``REQUESTS_LIMIT`` = 50 000 000 simulated requests (≈ 100 B each);
* ``GRID_LIMIT`` = 1000 points per grid (--rho-grid, --lam-grid, --w2-grid, --points);
* ``NESTING_LIMIT`` = 8 levels of ``mix:``/``max:`` law specs;
* ``RATE_MIN`` / ``RATE_MAX`` = 1e-12 / 1e12 per ms for arrival and switching rates.
"""

from __future__ import annotations

import math
import os

from .errors import InputError

__all__ = [
    "MEMORY_BUDGET", "STATE_LIMIT", "SEARCH_STATE_LIMIT", "WORK_LIMIT", "BMAX_LIMIT", "REQUESTS_LIMIT", "GRID_LIMIT", "NESTING_LIMIT",
    "RATE_MIN", "RATE_MAX", "SEED_MAX", "FILE_BYTES_LIMIT", "LINE_BYTES_LIMIT", "ITER_LIMIT", "WEIGHT_LIMIT",
    "LLM_REQUESTS_LIMIT", "HEAVY_TAIL_COV2", "check_llm_work", "MAP_FILE_BYTES_LIMIT", "JSON_DEPTH_LIMIT",
    "PHASE_TABLE_STATE_LIMIT", "PHASE_TABLE_VALUES_LIMIT", "SWITCH_RATIO_MIN", "SLO_MAX_MS",
    "check_memory", "check_states", "arrival_table_bytes", "model_bytes", "check_model", "check_requests",
    "check_grid", "check_rate", "check_int", "predicted_queue", "check_tail", "gib", "usable_cpus",
]

GiB = 1 << 30


def _physical_memory() -> int:
    try:
        return int(os.sysconf("SC_PAGE_SIZE")) * int(os.sysconf("SC_PHYS_PAGES"))
    except (ValueError, OSError, AttributeError):  # pragma: no cover - non-POSIX
        return 8 * GiB


def usable_cpus() -> int:
    """The CPUs this process may run on (its affinity mask where the OS has one): what threaded work sizes to."""
    try:
        return max(1, len(os.sched_getaffinity(0)))
    except (AttributeError, OSError):  # pragma: no cover - not Linux
        return os.cpu_count() or 1


#: Bytes one run may allocate for its big arrays.
MEMORY_BUDGET = min(4 * GiB, _physical_memory() // 2)
#: Largest truncation level s_max (queue states) of a model or an evaluation.
STATE_LIMIT = 1 << 20
#: Largest s_max the automatic searches (auto, minimal) try; each candidate is also work-limited.
SEARCH_STATE_LIMIT = 50_000
#: Elementary operations (≈ actions × states × support width) one model may ask of a solver sweep set
#: (one improvement sweep of 6e8 takes ~0.5 s on the 2-core development machine; a solve 5–10 sweeps).
WORK_LIMIT = 6e8
#: Largest batch size.
BMAX_LIMIT = 4096
#: Most simulated requests.
REQUESTS_LIMIT = 50_000_000
#: Requests per load of the LLM engine (a Python event loop, ~10³–10⁴ requests/s per scheme).
LLM_REQUESTS_LIMIT = 50_000
#: Requests × schemes the LLM engine simulates per second, measured on the 2-core development machine
#: (2 000 requests × 8 schemes in 21 s); and the longest sweep accepted before work, in seconds.
LLM_REQUESTS_PER_S = 750.0
LLM_SECONDS_LIMIT = 300.0
#: Bytes per simulated request (arrival, response, service draw, bookkeeping).
BYTES_PER_REQUEST = 48
#: Most points of a grid (loads, weights, Pareto points).
GRID_LIMIT = 1000
#: Deepest nesting of mix:/max: law specs.
NESTING_LIMIT = 8
#: Arrival and switching rates (1/ms) that float arithmetic handles (sums of 1e8 gaps stay finite).
RATE_MIN, RATE_MAX = 1e-12, 1e12
#: Input files (traces, profiles): bytes per file and per line.
FILE_BYTES_LIMIT = 256 << 20
LINE_BYTES_LIMIT = 64 << 10
#: Largest random seed.
SEED_MAX = 2**63 - 1
#: Hard cap on iterations of loops whose count is not bounded by arithmetic alone.
ITER_LIMIT = 10_000_000
#: A MAP JSON file (``--arrivals map:FILE.json``): bytes read, and nesting depth of its arrays/objects.
MAP_FILE_BYTES_LIMIT = 4 << 20
JSON_DEPTH_LIMIT = 32
#: What a phase table (schema_version 2) may declare, checked before any dataset is read: levels × phases
#: (the solver writes at most 8 200) and stored action values, levels × phases × actions (float64: 128 MiB;
#: the solver's work limit keeps its tables to a few million).
PHASE_TABLE_STATE_LIMIT = 1 << 16
PHASE_TABLE_VALUES_LIMIT = 1 << 24
#: Slowest phase change over the fastest MAP event (1/ms over 1/ms) the (n, phase) SMDP is solved for.
SWITCH_RATIO_MIN = 1e-6


def gib(n: float) -> str:
    return f"{n / GiB:.3g} GiB" if n >= GiB / 100 else f"{n / (1 << 20):.3g} MiB"


def check_memory(nbytes: float, what: str, fix: str) -> None:
    """Refuse work whose arrays would exceed :data:`MEMORY_BUDGET`."""
    if not nbytes <= MEMORY_BUDGET:
        raise InputError(f"{what} would need about {gib(nbytes)}, over the {gib(MEMORY_BUDGET)} limit; {fix}")


def check_int(name: str, value, lo: int, hi: int) -> int:
    """An integer in [lo, hi] (no OverflowError for 1e30 or 10**40: one line naming the range)."""
    try:
        if isinstance(value, float) and not value.is_integer():
            raise ValueError
        v = int(value)
    except (TypeError, ValueError, OverflowError):
        raise InputError(f"{name} must be an integer in {lo}..{hi}, got {value!r}") from None
    if not lo <= v <= hi:
        raise InputError(f"{name} must be an integer in {lo}..{hi}, got {value!r}")
    return v


def check_states(s_max: int, what: str = "s_max") -> None:
    if s_max > STATE_LIMIT:
        raise InputError(f"{what} = {s_max} exceeds the state limit {STATE_LIMIT}; use a smaller value")


def arrival_table_bytes(n_actions: int, kmax: int) -> float:
    """An arrival table: pmf and sf, A × (kmax+1) float64 each (plus the FFT's workspace)."""
    return float(n_actions) * (kmax + 1) * 8 * 2 * 2


def model_bytes(n_actions: int, s_max: int) -> float:
    """The truncated model (P, SF) and its arrival table, the solver's state × action tables (costs, sojourns,
    expectations, the tail boundary's excursions: 6 of them) and its per-state vectors."""
    return (arrival_table_bytes(n_actions, s_max) + float(n_actions + 1) * (s_max + 2) * 8 * (2 + 6)
            + (s_max + 2) * 8 * 16)


def check_model(n_actions: int, s_max: int) -> None:
    """Before building a truncated model with ``n_actions`` batch sizes and states 0..s_max."""
    if s_max > STATE_LIMIT:
        raise InputError(
            f"s_max = {s_max} exceeds the state limit {STATE_LIMIT}; use --s-max ≤ {STATE_LIMIT} (or auto) "
            "or a lower load"
        )
    check_memory(model_bytes(n_actions, s_max), f"a truncated model with {n_actions} batch sizes and s_max = {s_max}",
                 f"use fewer batch sizes (Bmax ≤ {max_bmax_for(s_max)}) or a smaller s_max")


def max_bmax_for(s_max: int) -> int:
    b = 1
    while b < BMAX_LIMIT and model_bytes(2 * b, max(s_max, 8 * b)) <= MEMORY_BUDGET:
        b *= 2
    return b


def check_requests(n: int, what: str = "--requests") -> int:
    """A simulation of n requests: ≤ REQUESTS_LIMIT and its arrays within the memory budget."""
    n = check_int(what, n, 1, REQUESTS_LIMIT)
    check_memory(n * BYTES_PER_REQUEST, f"simulating {n} requests",
                 f"use {what} ≤ {int(MEMORY_BUDGET // BYTES_PER_REQUEST)}")
    return n


def check_grid(values, what: str) -> None:
    if len(values) > GRID_LIMIT:
        raise InputError(f"{what} has {len(values)} points; at most {GRID_LIMIT} are allowed")


def check_rate(name: str, rate: float, zero_ok: bool = False) -> float:
    """An arrival or switching rate in 1/ms within [RATE_MIN, RATE_MAX] (1e-320 or 1e308 would stall or overflow)."""
    r = float(rate)
    if zero_ok and r == 0:
        return r
    if not (math.isfinite(r) and RATE_MIN <= r <= RATE_MAX):
        raise InputError(f"{name} must lie in [{RATE_MIN:g}, {RATE_MAX:g}] per ms, got {rate!r}")
    return r


def predicted_queue(problem) -> float:
    """Mean queue length (requests) when every batch is full: Pollaczek–Khinchine for batches of Bmax
    arriving at rate λ/Bmax with service G_Bmax, λ²·E[G²]/(2·Bmax·(1−ρ)).  The tail the auto scan must
    cover is a few times this (heavy-tailed laws: CoV² ≫ 1 makes it large)."""
    B = problem.bmax
    m2 = float(problem.second_moments()[-1])
    rho = problem.rho
    if not (math.isfinite(m2) and rho < 1):
        return math.inf
    return problem.lam ** 2 * m2 / (2.0 * B * (1.0 - rho))


def tail_factor(cov2: float) -> float:
    """The auto scan's s_max is about Bmax + this × the predicted mean queue (measured: exp at ρ = 0.9
    needs 6.5×, gamma:0.1 (CoV² 10) at ρ = 0.5 17×): heavier tails need more multiples."""
    return min(6.0 + 2.0 * max(cov2, 0.0), 30.0)


#: Largest weight w1 or w2: beyond it w2·ζ(b) and the sums over states overflow float64, and only
#: the ratio w2/w1 shapes the policy anyway.
WEIGHT_LIMIT = 1e12

#: Batch-time CoV² above which :func:`check_tail` predicts the truncation before scanning.
HEAVY_TAIL_COV2 = 4.0


def check_tail(problem, tol: float = 1e-3) -> None:
    """Refuse a problem whose queue tail needs a truncation beyond the state limit (the law's CoV and λ·l).

    Applied to heavy-tailed batch times only (CoV² > :data:`HEAVY_TAIL_COV2`: ``gamma:1e-3``,
    ``lognormal:3``, extreme hyperexponentials), where the single-server estimate λ²E[G²]/(2·Bmax·(1−ρ))
    is dominated by the variance and is the right order.  For light tails it overestimates bulk
    service badly (Bmax = 256, det, ρ = 0.9: predicted 6 500 states, needed 256), so those scans
    rely on the per-candidate state and work limits instead.
    """
    l = float(problem.latency_ms()[-1])
    cov2 = float(problem.second_moments()[-1]) / l ** 2 - 1.0
    if not cov2 > HEAVY_TAIL_COV2:
        return
    q = predicted_queue(problem)
    f = tail_factor(cov2)
    need = problem.bmax + f * q
    n_actions = len(problem.batch_sizes) + 1
    work = n_actions * need * need / 4  # each row's arrival support spans a good part of the tail
    if need > SEARCH_STATE_LIMIT or work > WORK_LIMIT:
        ok = max(0.0, (SEARCH_STATE_LIMIT - problem.bmax) / f)
        raise InputError(
            f"service {problem.service.spec()} at ρ = {problem.rho:.3g} (λ·l(Bmax) = {problem.lam * l:.4g}) has a "
            f"batch-time CoV² of {cov2:.4g}: the queue tail needs a truncation of about s_max = {need:.3g}, beyond what "
            f"fits (state limit {SEARCH_STATE_LIMIT}, work limit {WORK_LIMIT:.3g} for {n_actions - 1} batch sizes); use a lighter-tailed law (smaller CoV) or a lower load "
            f"(predicted mean queue λ²E[G²]/(2·Bmax·(1−ρ)) must stay below about {min(ok, _q_for_work(problem)):.0f})"
        )


def _q_for_work(problem) -> float:
    n_actions = len(problem.batch_sizes) + 1
    l = float(problem.latency_ms()[-1])
    f = tail_factor(float(problem.second_moments()[-1]) / l ** 2 - 1.0)
    return max(0.0, (math.sqrt(4 * WORK_LIMIT / n_actions) - problem.bmax) / f)


def read_csv_rows(path: str, what: str) -> list[list[str]]:
    """Rows of a small CSV input (trace, profile): a regular file of at most FILE_BYTES_LIMIT bytes,
    lines of at most LINE_BYTES_LIMIT bytes, UTF-8 text (``/dev/zero``, a binary file or a huge field
    is refused on one line, before reading it whole)."""
    import csv
    import stat

    try:
        st = os.stat(path)
    except OSError as e:
        raise InputError(f"cannot read {what} {path}: {e.strerror}") from None
    if not stat.S_ISREG(st.st_mode):
        raise InputError(f"{what} {path} is not a regular file (a CSV file is expected)")
    if st.st_size > FILE_BYTES_LIMIT:
        raise InputError(f"{what} {path} has {gib(st.st_size)}; at most {gib(FILE_BYTES_LIMIT)} are read")
    try:
        with open(path, "rb") as fh:
            data = fh.read(FILE_BYTES_LIMIT + 1)
    except OSError as e:
        raise InputError(f"cannot read {what} {path}: {e.strerror}") from None
    if b"\0" in data:
        raise InputError(f"{what} {path} is binary (NUL bytes); a CSV text file is expected")
    try:
        text = data.decode("utf-8-sig")
    except UnicodeDecodeError as e:
        raise InputError(f"{what} {path} is not UTF-8 text (byte {e.start}); a CSV text file is expected") from None
    lines = text.splitlines()
    for i, line in enumerate(lines):
        if len(line) > LINE_BYTES_LIMIT:
            raise InputError(f"{what} {path} line {i + 1} has {len(line)} characters; at most {LINE_BYTES_LIMIT} are allowed")
    try:
        return list(csv.reader(lines))
    except csv.Error as e:
        raise InputError(f"{what} {path} is not valid CSV: {e}") from None


def check_llm_work(requests: int, loads: int, schemes: int) -> None:
    """Refuse an LLM sweep whose estimated run time exceeds :data:`LLM_SECONDS_LIMIT` (before any work)."""
    seconds = float(requests) * loads * max(schemes, 1) / LLM_REQUESTS_PER_S
    if seconds > LLM_SECONDS_LIMIT:
        fit = int(LLM_SECONDS_LIMIT * LLM_REQUESTS_PER_S / (loads * max(schemes, 1)))
        raise InputError(
            f"{requests} requests × {loads} load(s) × {schemes} scheme(s) would take about {seconds / 60:.0f} min "
            f"(≈ {LLM_REQUESTS_PER_S:.0f} requests/s); at most {LLM_SECONDS_LIMIT / 60:.0f} min is run: use "
            f"--requests ≤ {fit}, or fewer loads or schemes"
        )

#: The largest latency bound an SLO may give (ms; 10⁶ ms ≈ 17 min): beyond it the timers a search tunes no
#: longer fit the servers' integer settings (Triton's µs, TorchServe's ms).
SLO_MAX_MS = 1e6
#: The largest idle power an instance may be given (W): a whole 8-GPU server idles below 2 kW, so 10⁵ W can
#: only be a typo, and it would swamp every P̄ (the figures would print as differences of huge numbers).
IDLE_POWER_MAX_W = 1e5
#: The longest batch time (ms) and the largest batch energy (mJ) an online estimator takes as a reading: an
#: hour, and a megajoule (a GPU at 1 kW for 1000 s).  Beyond them a reading is a broken clock or counter,
#: rejected and counted, never averaged in.
BATCH_MS_MAX, BATCH_MJ_MAX = 3.6e6, 1e9
#: How far (×, either way) one reading may move an estimator from its current estimate: a reading beyond is
#: taken at the bound (winsorised), so one absurd value moves l̂(b) or ζ̂(b) by a bounded amount.
READING_CLIP = 10.0
