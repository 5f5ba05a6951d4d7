"""The c-server batching SMDP: c identical model instances sharing one FIFO queue (Triton's ``instance_group``).

Paper 004 (Xu, Zhou & Niu, *SMDP-Based Dynamic Batching for Improving Responsiveness and Energy Efficiency of
Batch Services*, arXiv:2501.02181) solves one server and names several processors as future work; this is that
model, made Markov by phase-type batch times.

**Model.** Requests arrive as a Poisson process of rate λ (1/ms).  Each of c instances is idle or serves one batch.
Whenever an instance is idle and n ≥ 1 requests wait, the policy sends a batch of b ∈ 𝓑 (b ≤ n) to an idle
instance, or waits for the next event (an arrival or a phase change of a running batch).  A batch of b takes a
phase-type time PH(α_b, T_b) with mean l(b) (ms) and costs ζ(b) (mJ) when it starts; an idle instance draws
``idle_power_w`` (W).  The state is (n, the multiset of (size, phase) of the running batches): with A sizes and m
phases, C(A·m + c, c) configurations of the c instances times the queue levels 0..N.

**Contention** (``problem.contention``, :mod:`smdp_batch.specs.contention`): while k instances are busy every
phase rate of a running batch of b is divided by s_k(b) (s_k alike for every b unless the factors are given per
size), and it draws ζ(b)·(e_k(b) − 1)/(s_k(b)·l(b)) W beyond the ζ(b) charged at its start, so a batch run
entirely beside k − 1 others takes s_k(b)·l(b) on average and costs e_k(b)·ζ(b).

**Objective** (paper 004 eq. 2 with c servers): w1·W̄ + w2·P̄, with W̄ = L/λ (Little's law, L the mean number of
requests waiting or in service) and P̄ = (Σ ζ of batches started)/time + idle_power_w · E[idle instances] (+ the
contention's energy rate).  As a
semi-Markov decision process with instantaneous dispatch decisions:

* waiting in state s: sojourn 1/q(s) with q(s) the total event rate, cost rate (w1/λ)(n + requests in service)
  + w2·(p_idle·(idle instances) + the contention's energy rate), and the next state by the event rates;
* dispatching b: no time, cost w2·ζ(b), the batch starts in phase j with probability α_b[j].

**Truncation.** The queue stops at N, where an idle instance must serve.  An arrival at n = N either steps
into the closed-form tail above N (the solver's default, :mod:`smdp_batch.solvers.multi_pi`) or is lost and
charged the latency it would have had (the plain truncation).

**Service laws** (:func:`phase_type`): exponential (1 phase), Erlang-k and gamma with integer shape (k
phases), hyperexponential (one phase per branch) are exact.  Deterministic batch times are an Erlang of
``phases`` (default 8) phases of mean l(b)/k each, which converges to them as k grows; any other law (gamma of
non-integer shape, lognormal, a measured profile) is fitted by its first two moments: an Erlang of k =
round(1/CV²) phases where CV² < 1, else a two-branch hyperexponential with balanced means.
"""

from __future__ import annotations

import itertools
import math
from dataclasses import dataclass

import numpy as np

from ..errors import InputError
from ..limits import check_memory
from .laws import Deterministic, Exponential, Gamma, HyperExponential
from .problem import BatchingProblem

__all__ = [
    "PhaseType", "MultiServerSMDP", "phase_type", "count_configurations", "MULTI_STATE_LIMIT", "PHASES_DEFAULT",
    "PHASES_LIMIT", "check_multi_size", "check_max_states", "model_size", "MULTI_WORK_LIMIT", "MULTI_STATE_MAX",
]

#: Erlang phases standing for deterministic batch times unless asked otherwise.
PHASES_DEFAULT = 8
#: Most phases per batch time.
PHASES_LIMIT = 64
#: Most states (queue levels × configurations of the instances) of one c-server model unless the caller raises
#: it (``max_states``, ``solve --max-states``): each policy iteration step factorises one sparse system, whose LU
#: fills to 50–550 entries per state (c = 2: 28 700 states in 1.1 s; c = 4: 27 090 states in 4–12 s on the 2-core
#: development machine).  Past it, the time and memory grow with the states (c = 2 with every size 1..32 at ρ 0.5
#: and 0.7: 108 273 states, 5–6 s, 0.4 GB).
MULTI_STATE_LIMIT = 60_000
#: The most ``max_states`` may be raised to; the memory budget bounds it too.
MULTI_STATE_MAX = 10_000_000
#: Most states × configurations: the LU's fill, hence its time, grows with both (≈ 1 s per 10⁶ here).
MULTI_WORK_LIMIT = 3_000_000
#: Bytes per state of the model and its policy iteration (the LU's fill dominates).
BYTES_PER_STATE = 8_000


@dataclass(frozen=True)
class PhaseType:
    """The batch time of each allowed size as a phase-type law PH(α_b, T_b) (rates in 1/ms).

    ``alpha[i]`` (A × m) the starting phase probabilities of size 𝓑[i], ``moves[i]`` (A × m × m) the rates from
    phase j to j' (zero diagonal), ``exits[i]`` (A × m) the rates of finishing from phase j; ``how`` says how
    the law was made phase-type (exact, an Erlang standing for a fixed time, or a two-moment fit).
    """

    alpha: np.ndarray
    moves: np.ndarray
    exits: np.ndarray
    how: str

    @property
    def phases(self) -> int:
        return int(self.alpha.shape[1])

    def minus_t(self, i: int) -> np.ndarray:
        """−T of size index i (m × m, rates in 1/ms): each phase's total rate out on the diagonal, less its moves."""
        return np.diag(self.moves[i].sum(axis=1) + self.exits[i]) - self.moves[i]

    def moments(self) -> tuple[np.ndarray, np.ndarray]:
        """E[G_b] (ms) and E[G_b²] (ms²) of each size: α (−T)⁻¹ 1 and 2 α (−T)⁻² 1."""
        m1, m2 = [], []
        for i, a in enumerate(self.alpha):
            inv = np.linalg.inv(self.minus_t(i))  # (−T)⁻¹
            first = inv @ np.ones(len(a))
            m1.append(float(a @ first))
            m2.append(2.0 * float(a @ inv @ first))
        return np.array(m1), np.array(m2)

    def time_left(self, speed: np.ndarray | None = None) -> np.ndarray:
        """(A, m): the mean time left (ms) of a batch of each size in each phase, (−T)⁻¹ 1, its phases run at
        ``speed``[i] (default 1; contention's 1/s_c(b) with every instance busy)."""
        speed = np.ones(len(self.alpha)) if speed is None else speed
        return np.array([np.linalg.solve(self.minus_t(i) * speed[i], np.ones(self.phases))
                         for i in range(len(self.alpha))])

    def means(self) -> np.ndarray:
        """The mean batch time of each size (ms)."""
        return self.moments()[0]


def _erlang(l: np.ndarray, k: int) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    A = l.size
    alpha = np.zeros((A, k))
    alpha[:, 0] = 1.0
    moves = np.zeros((A, k, k))
    rate = k / l
    for j in range(k - 1):
        moves[:, j, j + 1] = rate
    exits = np.zeros((A, k))
    exits[:, k - 1] = rate
    return alpha, moves, exits


def _hyper(l: np.ndarray, probs, scales) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    A, m = l.size, len(probs)
    alpha = np.tile(np.asarray(probs, dtype=np.float64), (A, 1))
    exits = 1.0 / (np.asarray(scales, dtype=np.float64)[None, :] * l[:, None])
    return alpha, np.zeros((A, m, m)), exits


def phase_type(problem: BatchingProblem, phases: int | None = None) -> PhaseType:
    """The problem's batch times as phase-type laws with the same mean l(b) (see the module doc).

    ``phases`` sets the Erlang order standing for a deterministic law (default :data:`PHASES_DEFAULT`) and caps
    the order of a two-moment fit; exact laws ignore it.
    """
    if phases is not None and (isinstance(phases, bool) or not isinstance(phases, (int, np.integer))
                               or not 1 <= phases <= PHASES_LIMIT):
        raise InputError(f"phases must be an integer from 1 to {PHASES_LIMIT}, got {phases!r}")
    l = problem.latency_ms()
    law = problem.service
    if isinstance(law, Exponential):
        return PhaseType(*_erlang(l, 1), how="exponential (exact)")
    if isinstance(law, Gamma) and float(law.shape).is_integer() and law.shape <= PHASES_LIMIT:
        k = int(law.shape)
        return PhaseType(*_erlang(l, k), how=f"Erlang-{k} (exact)")
    if isinstance(law, HyperExponential):
        if len(law.probs) > PHASES_LIMIT:
            raise InputError(f"a hyperexponential law of {len(law.probs)} branches has more than {PHASES_LIMIT} phases")
        return PhaseType(*_hyper(l, law.probs, law.scales), how=f"hyperexponential, {len(law.probs)} branches (exact)")
    k_cap = PHASES_DEFAULT if phases is None else int(phases)
    if isinstance(law, Deterministic):
        return PhaseType(*_erlang(l, k_cap), how=f"Erlang-{k_cap} for the fixed batch time")
    cv2 = np.array([law.second_moment(float(li), int(b)) / (li * li) - 1.0 for b, li in zip(problem.batch_sizes, l)])
    if not np.all(np.isfinite(cv2)):
        raise InputError(f"the service law {law.spec()} has no finite second moment to fit a phase-type law to")
    if np.all(cv2 > 1.0 + 1e-12):  # balanced-means H2 per size: p = (1 + √((c²−1)/(c²+1)))/2, means l/(2p), l/(2(1−p))
        p = 0.5 * (1.0 + np.sqrt((cv2 - 1.0) / (cv2 + 1.0)))
        alpha = np.stack([p, 1.0 - p], axis=1)
        exits = np.stack([2.0 * p / l, 2.0 * (1.0 - p) / l], axis=1)
        return PhaseType(alpha, np.zeros((l.size, 2, 2)), exits,
                         how="two-branch hyperexponential fitted to l(b) and CV²(b)")
    k = int(min(max(1, round(1.0 / max(float(np.min(cv2)), 1e-12))), k_cap))
    return PhaseType(*_erlang(l, k), how=f"Erlang-{k} fitted to l(b) and the least CV² = {float(np.min(cv2)):.3g}")


def count_configurations(symbols: int, c: int) -> int:
    """Multisets of c instance states over ``symbols`` busy (size, phase) pairs and 'idle': C(symbols + c, c)."""
    return math.comb(symbols + c, c)


def model_size(problem: BatchingProblem, ph: PhaseType, n_max: int) -> tuple[int, int]:
    """(configurations, states) of the c-server model with queue levels 0..n_max, before building it."""
    confs = count_configurations(len(problem.batch_sizes) * ph.phases, problem.instances)
    return confs, confs * (n_max + 1)


def phases_that_fit(problem: BatchingProblem, n_max: int, growth: float = 4.0, start: int = PHASES_DEFAULT) -> int | None:
    """The most phases m ≤ ``start`` whose model fits the default limits (states and work) with queue levels up to
    ``growth``·``n_max`` (a solve grows its truncation as it converges), or None when even one phase does not."""
    top = int(math.ceil(growth * (n_max + 1)))
    for m in range(int(start), 0, -1):
        confs = count_configurations(len(problem.batch_sizes) * m, problem.instances)
        states = confs * top
        if states <= MULTI_STATE_LIMIT and states * confs <= MULTI_WORK_LIMIT:
            return m
    return None


def _fewer_sizes(problem: BatchingProblem) -> str:
    """A smaller allowed-size set to try, in words: the powers of two among the sizes (and Bmax), when there
    are fewer of them; else nothing."""
    sizes = list(problem.batch_sizes)
    if len(sizes) < 2:
        return ""
    fewer = sorted({b for b in sizes if b & (b - 1) == 0} | {sizes[-1]})
    return (f"fewer sizes (--batch-sizes {','.join(map(str, fewer))})" if len(fewer) < len(sizes)
            else f"fewer sizes (now {len(sizes)})")


def check_max_states(max_states) -> int | None:
    """``max_states`` as given (None: the defaults, :data:`MULTI_STATE_LIMIT` and the work limit), or one line."""
    if max_states is None:
        return None
    if isinstance(max_states, bool) or not isinstance(max_states, (int, np.integer)) \
            or not MULTI_STATE_LIMIT <= max_states <= MULTI_STATE_MAX:
        raise InputError(f"the most states must be an integer from {MULTI_STATE_LIMIT} to {MULTI_STATE_MAX}, got "
                         f"{max_states!r}")
    return int(max_states)


def check_multi_size(problem: BatchingProblem, ph: PhaseType, n_max: int,
                     max_states: int | None = None) -> tuple[int, int]:
    """(configurations, states) of the model with queue levels 0..n_max, refused before any work past
    :data:`MULTI_STATE_LIMIT` and the work limit (or past ``max_states``, which the caller raised on purpose) or the
    memory budget, with what would fit."""
    A, c = len(problem.batch_sizes), problem.instances
    confs, states = model_size(problem, ph, n_max)
    fewer_phases = ""
    if ph.phases > 1 and "(exact)" not in ph.how:  # an exact phase-type law: --phases would not change it
        m = phases_that_fit(problem, n_max, start=ph.phases - 1)
        fewer_phases = f"fewer phases (now {ph.phases}" + (f"; --phases {m} fits)" if m is not None else ")")
    parts = [x for x in (_fewer_sizes(problem), fewer_phases) if x]
    fix = (", ".join(parts) + " or " if parts else "") + "fewer instances"
    size = (f"{c} instances with {A} batch sizes and {ph.phases}-phase batch times give {confs} configurations × "
            f"{n_max + 1} queue levels")
    raise_it = (f", or raise the limit (--max-states S, up to {MULTI_STATE_MAX}; c = 2 with every size 1..32 takes "
                "about 7 s and 0.4 GB at ρ 0.5 on 2 cores)")
    if states > (max_states or MULTI_STATE_LIMIT):
        raise InputError(f"{size} = {states} states, over the limit {max_states or MULTI_STATE_LIMIT}; use {fix}"
                         + (raise_it if max_states is None else ""))
    if max_states is None and states * confs > MULTI_WORK_LIMIT:
        raise InputError(f"{size}: {states} states × {confs} configurations is over the work limit "
                         f"{MULTI_WORK_LIMIT:.0e} (each policy-iteration step factorises the system); use {fix}"
                         + raise_it)
    check_memory(states * BYTES_PER_STATE, f"the {c}-instance model of {states} states", f"use {fix}")
    return confs, states


class MultiServerSMDP:
    """The c-server model's configurations and events (independent of the queue length), for queue levels 0..N.

    A configuration is a sorted tuple of c symbols, 0 for an idle instance and 1 + i·m + j for one serving a batch
    of size 𝓑[i] in phase j.  ``events`` lists (from, to, rate) configuration moves of the running batches;
    ``start[k, i, j]`` is the configuration after a batch of 𝓑[i] starts in phase j on an idle instance of k (−1
    when none is idle).
    """

    def __init__(self, problem: BatchingProblem, ph: PhaseType, n_max: int, idle_power_w: float = 0.0,
                 max_states: int | None = None):
        if not (isinstance(idle_power_w, (int, float)) and math.isfinite(idle_power_w) and idle_power_w >= 0):
            raise InputError(f"idle power per instance must be a finite number ≥ 0 W, got {idle_power_w!r}")
        if n_max < problem.bmax:
            raise InputError(f"the queue truncation N = {n_max} must be ≥ Bmax = {problem.bmax}")
        self.problem, self.ph, self.N, self.idle_power_w = problem, ph, int(n_max), float(idle_power_w)
        self.n_conf, self.n_states = check_multi_size(problem, ph, self.N, max_states)
        A, m, c = len(problem.batch_sizes), ph.phases, problem.instances
        confs = list(itertools.combinations_with_replacement(range(A * m + 1), c))
        index = {cf: k for k, cf in enumerate(confs)}
        arr = np.array(confs, dtype=np.int64).reshape(len(confs), c)
        sizes = np.asarray(problem.batch_sizes, dtype=np.int64)
        busy_size = np.where(arr > 0, sizes[np.maximum(arr - 1, 0) // m], 0)
        self.in_service = busy_size.sum(axis=1).astype(np.float64)  # requests in service
        self.idle = (arr == 0).sum(axis=1)
        busy = c - self.idle
        cont = problem.contention
        # 1/s_k(b) of each configuration (k busy) and size: every phase of a running batch of b progresses at it
        speed = (1.0 / cont.slow(busy[:, None], sizes[None, :]) if cont is not None
                 else np.ones((len(confs), A)))
        #: power (W) of the running batches beyond ζ(b) charged at their start: ζ(b)·(e_k(b) − 1)/(s_k(b)·l(b)) each
        self.energy_rate = np.zeros(len(confs))
        if cont is not None:
            per = problem.energy_mj() / ph.means()  # ζ(b)/l(b) per size
            extra = per[None, :] * (cont.energy_factor(busy[:, None], sizes[None, :]) - 1.0) * speed  # conf × size
            idx = np.maximum(arr - 1, 0) // m
            self.energy_rate = np.where(arr > 0, np.take_along_axis(extra, idx, axis=1), 0.0).sum(axis=1)
        src, dst, rate = [], [], []
        self.start = np.full((len(confs), A, m), -1, dtype=np.int64)
        for k, cf in enumerate(confs):
            for sym in sorted(set(cf)):
                if sym == 0:
                    continue
                cnt = cf.count(sym)
                i, j = divmod(sym - 1, m)
                pos = cf.index(sym)
                moved = [(1 + i * m + j2, ph.moves[i, j, j2]) for j2 in range(m) if ph.moves[i, j, j2] > 0]
                if ph.exits[i, j] > 0:
                    moved.append((0, ph.exits[i, j]))
                for sym2, r in moved:
                    src.append(k)
                    dst.append(index[tuple(sorted(cf[:pos] + (sym2,) + cf[pos + 1:]))])
                    rate.append(cnt * r * speed[k, i])
            if cf[0] == 0:
                rest = cf[1:]
                for i in range(A):
                    for j in range(m):
                        if ph.alpha[i, j] > 0:
                            self.start[k, i, j] = index[tuple(sorted(rest + (1 + i * m + j,)))]
        self.events = (np.array(src, dtype=np.int64), np.array(dst, dtype=np.int64), np.array(rate, dtype=np.float64))
        self.out_rate = np.bincount(self.events[0], weights=self.events[2], minlength=len(confs))
        self.configs = arr

    def state(self, n, conf):
        """The index of state (n, configuration): configuration-major, queue level minor."""
        return np.asarray(conf) * (self.N + 1) + np.asarray(n)
