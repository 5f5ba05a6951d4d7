"""Finite-state approximation of the batching SMDP (paper 004 §V-A, eqs. 18–19), held compactly.

States are 0..s_max plus the overflow state S_o (index s_max+1), which aggregates the tail
{s_max+1, …} and behaves as s_max with an extra abstract cost c_o·y(s, a) (eq. 19).  Actions are
0 ("wait") followed by the allowed batch sizes in increasing order; action a is feasible in
state s iff a ≤ s (S_o counts as s_max ≥ Bmax, so every action is feasible there; the tail boundary
below allows s_max < Bmax, and the batch sizes above s_max are then feasible nowhere).

Transitions (eq. 18) out of (s, a ≠ 0) are a shifted copy of the arrival-count law p^[a]:
the next state is s − a + k with probability p_k for k ≤ s_max − s + a, and S_o with the tail
mass P(K > s_max − s + a).  Waiting moves s → s+1 (s_max → S_o, S_o → S_o).  We therefore store
per action only

* ``P[a, k]`` = p_k^[a] and ``SF[a, k]`` = P(K > k), k = 0..s_max — stored only up to where both are
  exactly 0 for every action (the laws' tails underflow: ~350 columns for deterministic service at
  s_max = 2²⁰); the kernels read P(K > k) past the stored columns as 0,
* ``y[a]`` the mean sojourn (eq. 9: l(a), or 1/λ for waiting),
* cost pieces with c(s, a) = fixed[a] + slope[a]·s (eq. 11):
  fixed = w2·ζ(a) + w1·E[G_a²]/2, slope = w1·y(a)/λ (waiting: fixed 0, slope w1/λ²).

Memory is O(A·K), K the arrival counts' support (the columns past it are 0 and not stored); nothing
of size S×A×S is built except by :meth:`TruncatedSMDP.dense` (tests and peers only).

**The tail boundary** (``truncate(..., tail=B)``, the converged rule's model).  Eq. 19's S_o carries
the overflow at a flat cost c_o, so ĝ and every decision feel the truncation until the queue tail
above s_max is negligible — P(N > n) decays as z₀⁻ⁿ, slowly near ρ = 1 (s_max ≈ 8 000 for gamma:0.5
at ρ = 0.9).  The tail boundary instead serves a fixed batch B (λ·l(B) < B) above s_max and charges
each transition that leaves the truncation the exact cost and time of its excursion.  Under "serve B"
the infinite queue's bias solves h(n) = c0 + c1·n − g·l(B) + E h(n − B + K_B) (eq. 20; c0 + c1·n the
cost of eq. 11), whose solutions are h(n) = αn² + βn + γ plus terms in the roots zᵇ = K(z) inside the
unit circle, which die out geometrically in n.  Matching powers of n gives, with d = B − E K_B > 0 and
M2 = E (K_B − B)²,

    α = c1 / (2d),    β = (c0 + α·M2 − g·l(B)) / d,

so a jump from s_max to j > s_max adds h(j) − h(s_max) = Cc(j) − g·Tc(j): time Tc = l(B)(j − s_max)/d
(Wald: d requests drained per batch), energy ζ(B)(j − s_max)/d and holding
(j − s_max)[(j + s_max)·l(B)/(2λd) + E G_B²/(2d) + l(B)·M2/(2λd²)].  These are added, in expectation
over the overshoot, to the row's cost and sojourn (``extra``, so y becomes state-dependent:
:meth:`TruncatedSMDP.sojourn`), and the overflow mass moves to S_o, which here is a copy of s_max (c_o
= 0, only B feasible at both), so h(S_o) = h(s_max).  The model is again an SMDP with positive costs
and times; its ĝ, decisions and metrics differ from the infinite queue's only through the dropped
geometric terms, not through the queue tail, so a few hundred states past the last change of action
suffice where eq. 19 needs thousands.  Those terms fall like rⁿ, r the largest root of zᴮ = K(z) inside
the unit circle other than 1 (deterministic service: r ≈ 1 − 2π²ρ/((1 − ρ)B²), 0.84 at B = 32 and
ρ = 0.9, but 0.99999 at B = 4 096, where the boundary gains little).
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from ..errors import InputError
from ..limits import arrival_table_bytes, check_memory, check_model
from .problem import BatchingProblem

__all__ = ["ArrivalTable", "TruncatedSMDP", "arrival_table", "check_tail_action", "check_truncation", "excursion_rates",
           "truncate"]

#: Terms p_k of a row outside [klo, khi] carry less than this mass on each side; the solver
#: kernels skip them (their effect on any value is below 1e-18·span(h)).  Evaluation uses full rows.
SUPPORT_EPS = 1e-18


@dataclass(frozen=True)
class ArrivalTable:
    """p_k^[b] and P(K > k) for every allowed b and k = 0..kmax (rows follow ``problem.batch_sizes``).

    ``klo``/``khi`` are each row's support bounds on the whole table (:func:`_with_supports`); a truncation
    at s_max clips them to s_max (the prefix sums that define them do not depend on the table's end).
    Rows of batch sizes b > kmax are left empty (p = 0, P(K > k) = 1): b is infeasible at every state of
    any truncation the table serves (s_max ≤ kmax; only the tail boundary's truncations are shorter than
    Bmax), so no kernel reads them.

    The table may be stored *compactly*: ``pmf``/``sf`` hold the columns k < ``width`` and ``span`` (when
    set) is kmax; every column the arrays do not hold is exactly 0 in both (the laws' tails underflow —
    deterministic service at s_max = 2²⁰ needs ~350 columns, not 10⁶).  Empty rows are the exception
    (P(K > k) = 1 everywhere), and they are never read.  :meth:`dense_sf` spells the zeros out.
    """

    pmf: np.ndarray
    sf: np.ndarray
    klo: np.ndarray | None = None
    khi: np.ndarray | None = None
    span: int | None = None  # kmax when the arrays stop early (their missing columns are 0); None: the arrays' end

    @property
    def kmax(self) -> int:
        return self.pmf.shape[1] - 1 if self.span is None else int(self.span)

    @property
    def width(self) -> int:
        """Columns held (k = 0..width − 1); the rest, up to kmax, are exact zeros."""
        return self.pmf.shape[1]

    def head(self, kmax: int) -> "ArrivalTable":
        """The table cut to k = 0..kmax (views)."""
        if kmax >= self.kmax:
            return self
        w = min(self.width, kmax + 1)
        return ArrivalTable(self.pmf[:, :w], self.sf[:, :w], self.klo, self.khi,
                            None if w == kmax + 1 else int(kmax))

    def dense_sf(self, rows: int) -> np.ndarray:
        """P(K > k) of the first ``rows`` rows on the whole range k = 0..kmax (zeros past the stored columns)."""
        out = np.zeros((rows, self.kmax + 1))
        out[:, : self.width] = self.sf[:rows, : self.kmax + 1]
        return out


#: Recently built arrival tables: (law object, λ, batch sizes, latencies) → the largest table built.
#: Keyed by the law *object* (kept alive in the entry), so an edited data file read into a new law
#: never meets an old table.  A front or a bank reuses one table across w2.
_TABLES: dict = {}
_TABLES_MAX = 8


def _table_key(problem: BatchingProblem) -> tuple:
    return (id(problem.service), float(problem.lam), tuple(int(b) for b in problem.batch_sizes),
            problem.latency_ms().tobytes())


def arrival_table(problem: BatchingProblem, kmax: int) -> ArrivalTable:
    """Arrival-count laws during a batch of each allowed size (eqs. 4–6), k = 0..kmax (cached per law)."""
    key = _table_key(problem.single())
    hit = _TABLES.get(key)
    if hit is not None and hit[1].kmax >= kmax:
        return hit[1].head(int(kmax))
    table = _with_supports(_build_arrival_table(problem, kmax))
    _TABLES.pop(key, None)
    while len(_TABLES) >= _TABLES_MAX:
        _TABLES.pop(next(iter(_TABLES)))
    _TABLES[key] = (problem.service, table)
    return table


def _checked(law, p, f) -> tuple[np.ndarray, np.ndarray]:
    """A law's p_k and P(K > k) (a row, or rows) as float64, refused in one line where not finite or p_k < 0; P(K > k)
    clipped to [0, 1]."""
    p, f = np.asarray(p, dtype=np.float64), np.asarray(f, dtype=np.float64)
    if not (np.all(np.isfinite(p)) and np.all(p >= 0) and np.all(np.isfinite(f))):
        raise InputError(f"service law {law.spec()} produced invalid arrival probabilities")
    return p, np.clip(f, 0.0, 1.0)


def _build_arrival_table(problem: BatchingProblem, kmax: int) -> ArrivalTable:
    """The table for k = 0..kmax, stored compactly: each row is computed on the whole range and its trailing
    exact zeros are dropped (:class:`ArrivalTable`), so memory is O(A·support), not O(A·kmax)."""
    law = problem.service
    check_memory(arrival_table_bytes(len(problem.batch_sizes), kmax),
                 f"the arrival table for {len(problem.batch_sizes)} batch sizes and k ≤ {kmax}",
                 "use fewer batch sizes or a smaller s_max")
    sizes = [(int(b), problem.lam * float(l)) for b, l in zip(problem.batch_sizes, problem.latency_ms()) if b <= kmax]
    # (b > kmax: infeasible in every truncation this table serves, s_max ≤ kmax: left empty)
    n = len(problem.batch_sizes)
    whole = law.arrival_rows([m for _, m in sizes], kmax) if sizes else None
    if whole is not None:  # every row at once (the closed-form laws up to k = 4096), trailing zero columns dropped
        P, F = _checked(law, *whole)
        used = np.flatnonzero((P != 0).any(axis=0) | (F != 0).any(axis=0))
        width = max(int(used[-1]) + 1 if used.size else 0, 1)
        pmf, sf = np.zeros((n, width)), np.zeros((n, width))
        pmf[: len(sizes)], sf[: len(sizes)] = P[:, :width], F[:, :width]
        sf[len(sizes):] = 1.0  # the empty rows (b > kmax)
        return ArrivalTable(pmf, sf, span=None if width == kmax + 1 else int(kmax))
    rows: list[tuple[np.ndarray, np.ndarray]] = []
    width = 1
    for b, m in sizes:
        p, f = _checked(law, *law.arrival(m, kmax, b))
        nz = np.flatnonzero(p)
        nzf = np.flatnonzero(f)
        w = max(int(nz[-1]) + 1 if nz.size else 0, int(nzf[-1]) + 1 if nzf.size else 0)
        width = max(width, w)
        rows.append((p[:w].copy(), f[:w].copy()))  # copies: the law's full-length arrays are freed
    pmf = np.zeros((n, width))
    sf = np.zeros((n, width))
    for i, (p, f) in enumerate(rows):
        pmf[i, : p.size] = p
        sf[i, : f.size] = f
    sf[len(rows):] = 1.0  # the empty rows (b > kmax)
    return ArrivalTable(pmf, sf, span=None if width == kmax + 1 else int(kmax))


@dataclass(frozen=True)
class TruncatedSMDP:
    """The truncated SMDP 𝒫̂ (eqs. 18–19) in compact per-action form. Index s_max+1 is S_o."""

    problem: BatchingProblem
    s_max: int
    abstract_cost: float
    actions: np.ndarray  # int64 (A,), 0 first then batch sizes ascending
    y: np.ndarray  # (A,) mean sojourn, ms
    P: np.ndarray  # (A, W) p_k, W ≤ s_max+1 (compact: p_k = P(K > k) = 0 for k ≥ W); row 0 (wait) unused
    SF: np.ndarray  # (A, W) P(K > k); the kernels read columns ≥ W as 0 (:meth:`sf_at`)
    klo: np.ndarray  # (A,) int64 support bounds used by the kernels
    khi: np.ndarray
    cost_fixed: np.ndarray  # (A,)
    cost_slope: np.ndarray  # (A,)
    energy: np.ndarray  # (A,) ζ(a) mJ, 0 for waiting
    hold_fixed: np.ndarray  # (A,) E[G_a²]/2 (ms²), 0 for waiting
    tail_action: int = 0  # B served above s_max (the tail boundary); 0: eq. 19's S_o with c_o
    extra: np.ndarray | None = None  # (3, S, A) tail boundary: the excursions' time, energy, holding

    def sf_at(self, i: int, m: int) -> float:
        """P(K > m) of action index i (0 past the stored columns, where the law's tail is exactly 0)."""
        return float(self.SF[i, m]) if m < self.SF.shape[1] else 0.0

    def p_at(self, i: int, k: int) -> float:
        """p_k of action index i (0 past the stored columns)."""
        return float(self.P[i, k]) if k < self.P.shape[1] else 0.0

    @property
    def boundary(self) -> str:
        """"tail" (exact excursions above s_max under ``tail_action``) or "overflow" (eq. 19)."""
        return "tail" if self.tail_action else "overflow"

    @property
    def n_states(self) -> int:
        return self.s_max + 2

    @property
    def overflow(self) -> int:
        """Index of S_o."""
        return self.s_max + 1

    def state_level(self) -> np.ndarray:
        """Queue length each state stands for (S_o counts as s_max), shape (S,)."""
        s = np.arange(self.n_states, dtype=np.float64)
        s[-1] = self.s_max
        return s

    def feasible(self) -> np.ndarray:
        """Boolean (S, A): action a feasible in state s (a ≤ s; S_o as s_max; the tail boundary allows only
        its B at s_max and S_o)."""
        f = self.actions[None, :] <= self.state_level()[:, None]
        if self.tail_action:
            f[-2:] = self.actions[None, :] == self.tail_action
        return f

    def costs(self, infeasible: np.ndarray | None = None) -> np.ndarray:
        """ĉ(s, a) (eq. 19, or with the tail boundary's excursion costs) as an (S, A) array; +inf where infeasible.

        ``infeasible``: ``~feasible()`` when the caller holds it (models of one truncation and size set share it)."""
        c = np.multiply.outer(self.state_level(), self.cost_slope)
        c += self.cost_fixed
        c[-1] += self.abstract_cost * self.y
        if self.extra is not None:
            c += self.excursion_costs()
        np.copyto(c, np.inf, where=~self.feasible() if infeasible is None else infeasible)
        return c

    def excursion_costs(self) -> np.ndarray:
        """The tail boundary's part of ĉ, w2·energy + w1·holding of the excursions above s_max, (S, A)."""
        p = self.problem
        return p.w2 * self.extra[1] + p.w1 * self.extra[2]  # type: ignore[index]  # asked only when extra is set

    def sojourn(self) -> np.ndarray:
        """Mean time to the next decision epoch, (S, A) in ms: y(a), plus the excursion's with the tail boundary."""
        Y = np.broadcast_to(self.y[None, :], (self.n_states, len(self.actions)))
        return np.ascontiguousarray(Y + self.extra[0] if self.extra is not None else Y)

    def sojourn_rows(self) -> np.ndarray:
        """:meth:`sojourn` as the kernels take it: (S, A), or (1, A) — the row every state shares — when it does
        not depend on the state (no tail boundary), so the solvers do not hold an S × A copy of y."""
        return self.sojourn() if self.extra is not None else np.ascontiguousarray(self.y[None, :])

    def sojourn_of(self, pol_idx: np.ndarray) -> np.ndarray:
        """The sojourn of each state under the action indices ``pol_idx``, (S,): ``sojourn()[s, pol_idx[s]]``."""
        y = self.y[pol_idx]
        if self.extra is not None:
            y = y + self.extra[0][np.arange(self.n_states), pol_idx]
        return y

    def costs_of(self, pol_idx: np.ndarray) -> np.ndarray:
        """ĉ of each state under the action indices ``pol_idx``, (S,): ``costs()[s, pol_idx[s]]`` without the S × A
        array (the indices must be feasible: :meth:`action_index`)."""
        if self.extra is not None:
            return self.costs()[np.arange(self.n_states), pol_idx]
        c = self.state_level() * self.cost_slope[pol_idx]
        c += self.cost_fixed[pol_idx]
        c[-1] += self.abstract_cost * self.y[pol_idx[-1]]
        return c

    def hold_of(self, pol_idx: np.ndarray) -> np.ndarray:
        """:meth:`hold` of each state under the action indices ``pol_idx``, (S,)."""
        if self.extra is not None:
            return self.hold()[np.arange(self.n_states), pol_idx]
        return self.y[pol_idx] * self.state_level() / self.problem.lam + self.hold_fixed[pol_idx]

    def energies_of(self, pol_idx: np.ndarray) -> np.ndarray:
        """:meth:`energies` of each state under the action indices ``pol_idx``, (S,)."""
        e = self.energy[pol_idx]
        return e + self.extra[1][np.arange(self.n_states), pol_idx] if self.extra is not None else e

    def hold(self) -> np.ndarray:
        """Holding part of ĉ with w1 = 1, w2 = 0 (ms²·/ms: W̄·y summed by Little's law), (S, A)."""
        h = self.y[None, :] * self.state_level()[:, None] / self.problem.lam + self.hold_fixed[None, :]
        return h + self.extra[2] if self.extra is not None else h

    def energies(self) -> np.ndarray:
        """ζ per epoch, (S, A) in mJ (with the excursion's batches under the tail boundary)."""
        e = np.broadcast_to(self.energy[None, :], (self.n_states, len(self.actions)))
        return e + self.extra[1] if self.extra is not None else np.array(e)

    def eta_bound(self) -> float:
        """Upper bound on the discretization constant η (eqs. 24–25)."""
        bound = self.y[0]  # waiting: 1/λ, m̂(s|s,0) = 0
        for i in range(1, len(self.actions)):
            a = int(self.actions[i])
            if a > self.s_max:  # infeasible everywhere (the tail boundary's short truncations)
                continue
            stay_max = max(1.0 - self.p_at(i, a), 1.0 - self.sf_at(i, a))  # states ≤ s_max, and S_o
            if stay_max > 0:
                bound = min(bound, self.y[i] / stay_max)
        return float(bound)

    def action_index(self, policy: np.ndarray) -> np.ndarray:
        """Map a policy of batch sizes (length S) to action indices; validates feasibility."""
        policy = np.asarray(policy)
        if policy.shape != (self.n_states,):
            raise InputError(f"policy must have s_max+2 = {self.n_states} entries, got shape {policy.shape}")
        try:
            idx = np.minimum(np.searchsorted(self.actions, policy), len(self.actions) - 1)
            unknown = np.nonzero(self.actions[idx] != policy)[0]
        except (TypeError, ValueError):  # not numbers
            unknown, idx = np.zeros(1, dtype=np.int64), None
        if unknown.size:
            a = policy.flat[int(unknown[0])]
            a = a.item() if isinstance(a, np.generic) else a
            shown = int(a) if isinstance(a, float) and a.is_integer() else a
            raise InputError(
                f"policy uses batch size {shown!r}, which is not allowed; allowed: 0 (wait) and "
                f"{_fmt_sizes(self.problem.batch_sizes)}"
            )
        idx = idx.astype(np.int64, copy=False)  # type: ignore[union-attr]  # set whenever nothing is unknown
        bad = np.nonzero(policy > self.state_level())[0]
        if bad.size:
            s = int(bad[0])
            raise InputError(f"policy serves {int(policy[s])} requests in state {s}, which holds only {s}")
        if self.tail_action and not np.all(policy[-2:] == self.tail_action):
            raise InputError(f"with the tail boundary the policy must serve B = {self.tail_action} at s_max = "
                             f"{self.s_max} and beyond, got {int(policy[-2])}")
        return idx

    def dense(self) -> np.ndarray:
        """Dense m̂(j|s,a) as an (S, A, S) array (eq. 18) — for tests and peer solvers only."""
        S, A = self.n_states, len(self.actions)
        M = np.zeros((S, A, S))
        lv = self.state_level().astype(np.int64)
        for s in range(S):
            for i, a in enumerate(self.actions):
                if a > lv[s]:
                    continue
                if a == 0:
                    M[s, i, min(s + 1, S - 1)] = 1.0
                    continue
                base = lv[s] - a
                m = self.s_max - base
                row = self.P[i, : m + 1]  # columns past the stored ones are 0
                M[s, i, base : base + row.size] = row
                M[s, i, S - 1] += self.sf_at(i, m)
        return M


def _fmt_sizes(sizes) -> str:
    sizes = list(sizes)
    if sizes == list(range(sizes[0], sizes[-1] + 1)) and len(sizes) > 3:
        return f"{sizes[0]}..{sizes[-1]}"
    return ",".join(str(b) for b in sizes)


def _with_supports(arrivals: ArrivalTable) -> ArrivalTable:
    """The table with each row's support bounds on its whole length (unclipped: khi may be kmax + 1): klo the first k
    whose cumulative pmf exceeds SUPPORT_EPS, khi one past the last k with P(K > k) ≥ SUPPORT_EPS (0 if none); an
    empty row (b > kmax: all its mass beyond) gets kmax + 1 for both.  All rows at once."""
    pmf, sf, kmax = arrivals.pmf, arrivals.sf, arrivals.kmax
    # the cumulative pmf does not decrease (pmf ≥ 0), so the count of its entries ≤ ε is searchsorted's "right"
    klo = np.count_nonzero(np.cumsum(pmf, axis=1) <= SUPPORT_EPS, axis=1).astype(np.int64)
    above = sf >= SUPPORT_EPS
    width = sf.shape[1]
    khi = np.where(above.any(axis=1), width - np.argmax(above[:, ::-1], axis=1), 0).astype(np.int64)
    empty = (sf[:, 0] == 1.0) & ~pmf.any(axis=1)
    klo[empty] = khi[empty] = kmax + 1
    return ArrivalTable(pmf, sf, klo, khi, arrivals.span)


def check_truncation(problem: BatchingProblem, s_max, abstract_cost, model_actions: int,
                     tail: int | None = None) -> tuple[int, float]:
    """(s_max, c_o) checked for a truncated model (s_max an integer ≥ Bmax, c_o finite ≥ 0), and its memory
    (:func:`~smdp_batch.limits.check_model` with ``model_actions`` per-action rows) refused before work; shared
    by the Poisson and MAP truncations.

    The tail boundary (``tail`` = B) needs only s_max ≥ B: batch sizes above s_max are then infeasible at
    every state (paper 004 §V-A's s_max ≥ Bmax is for S_o, which must be able to serve every batch size)."""
    low, what = (problem.bmax, "Bmax") if tail is None else (int(tail), "the tail action B")
    try:
        s_max_i = int(s_max)
    except (TypeError, ValueError, OverflowError):
        raise InputError(f"s_max must be an integer ≥ {what} = {low}, got {s_max!r}") from None
    if s_max_i != s_max or s_max_i < low:
        raise InputError(f"s_max must be an integer ≥ {what} = {low} (paper 004 §V-A), got {s_max!r}")
    check_model(model_actions, s_max_i)
    c_o = float(abstract_cost)
    if not (np.isfinite(c_o) and c_o >= 0):
        raise InputError(f"abstract cost c_o must be finite and ≥ 0, got {abstract_cost!r}")
    return s_max_i, c_o


def truncate(
    problem: BatchingProblem,
    s_max: int,
    abstract_cost: float = 100.0,
    arrivals: ArrivalTable | None = None,
    tail: int | None = None,
) -> TruncatedSMDP:
    """Build the truncated SMDP with states 0..s_max, S_o and abstract cost c_o (eqs. 18–19).

    ``tail=B`` builds the tail boundary of the module doc instead (B served above s_max, c_o unused)."""
    problem.single()
    if tail is not None:
        tail = check_tail_action(problem, tail)
    s_max_i, c_o = check_truncation(problem, s_max, abstract_cost, len(problem.batch_sizes) + 1, tail)
    if tail is not None:
        c_o = 0.0
    if arrivals is None or arrivals.kmax < s_max_i:
        arrivals = arrival_table(problem, s_max_i)
    if arrivals.klo is None:
        arrivals = _with_supports(arrivals)
    A = len(problem.batch_sizes) + 1
    K = s_max_i + 1
    W = min(K, arrivals.width + 1)  # a compact table: one zero column past its stored ones (khi ≤ width)
    P = np.zeros((A, W))
    SF = np.zeros((A, W))
    w = min(W, arrivals.width)
    P[1:, :w] = arrivals.pmf[:, :w]
    SF[1:, :w] = arrivals.sf[:, :w]
    klo = np.zeros(A, dtype=np.int64)
    khi = np.zeros(A, dtype=np.int64)
    klo[1:] = np.minimum(arrivals.klo, K - 1)  # type: ignore[arg-type]  # set by _with_supports above
    khi[1:] = np.minimum(arrivals.khi, K - 1)  # type: ignore[arg-type]  # set by _with_supports above
    lam, w1, w2 = problem.lam, problem.w1, problem.w2
    l = problem.latency_ms()
    y = np.concatenate([[1.0 / lam], l])
    energy = np.concatenate([[0.0], problem.energy_mj()])
    hold_fixed = np.concatenate([[0.0], 0.5 * problem.second_moments()])
    extra = None if tail is None else _tail_extras(problem, arrivals, s_max_i, tail)
    return TruncatedSMDP(
        problem=problem,
        s_max=s_max_i,
        abstract_cost=c_o,
        actions=np.concatenate([[0], problem.batch_sizes]).astype(np.int64),
        y=y,
        P=P,
        SF=SF,
        klo=klo,
        khi=khi,
        cost_fixed=w2 * energy + w1 * hold_fixed,
        cost_slope=w1 * y / lam,
        energy=energy,
        hold_fixed=hold_fixed,
        tail_action=int(tail or 0),
        extra=extra,
    )


def check_tail_action(problem: BatchingProblem, tail) -> int:
    """B for the tail boundary: an allowed batch size that drains the queue (λ·l(B) < B)."""
    sizes = [int(b) for b in problem.batch_sizes]
    try:
        b = int(tail)
    except (TypeError, ValueError, OverflowError):
        b = None
    if b is None or b != tail or b not in sizes:
        raise InputError(f"the tail action must be one of the allowed batch sizes, got {tail!r}")
    l = float(problem.latency_ms()[sizes.index(b)])
    if not problem.lam * l < b:
        raise InputError(f"the tail action B = {b} does not drain the queue (λ·l(B) = {problem.lam * l:.6g} ≥ B)")
    return b


def excursion_rates(problem: BatchingProblem, B: int) -> tuple[float, float, float, float]:
    """(c_t, c_e, c_h1, c_h2): the excursion above s_max under "serve B" costs time c_t·e, energy c_e·e and holding
    c_h2·e·(e + 2s_max) + c_h1·e for an overshoot e (module doc: d = B − E K_B, M2 = E (K_B − B)²)."""
    sizes = [int(b) for b in problem.batch_sizes]
    iB = sizes.index(B)
    lam, l, m2 = problem.lam, float(problem.latency_ms()[iB]), float(problem.second_moments()[iB])
    EK_B = lam * l
    d = B - EK_B
    M2 = lam * l + lam * lam * m2 - 2.0 * B * EK_B + B * B
    return l / d, float(problem.energy_mj()[iB]) / d, 0.5 * m2 / d + l * M2 / (2.0 * lam * d * d), l / (2.0 * lam * d)


def _tail_extras(problem: BatchingProblem, arrivals: ArrivalTable, s_max: int, B: int) -> np.ndarray:
    """(3, S, A): expected time, energy and holding of the excursion above s_max after (s, a) (module doc).

    For the overshoot e = j − s_max = K − m (m = s_max − s + a): E e⁺ = Σ_{k≥m} P(K > k) and
    E (e⁺)² = Σ_{k≥m} (2(k − m) + 1) P(K > k), by reverse recursions (no cancellation).  Mass beyond the
    table (a heavy tail the table does not reach, P(K > kmax) ≥ 1e-18) is restored from the exact moments
    E K = λl(a) and E K(K − 1) = λ²E G_a² (eqs. 4–6).
    """
    lam = problem.lam
    sizes = [int(b) for b in problem.batch_sizes]
    l = problem.latency_ms()
    m2 = problem.second_moments()
    A, S, n = len(sizes) + 1, s_max + 2, s_max + 1
    kmax = arrivals.kmax
    c_t, c_e, c_h1, c_h2 = excursion_rates(problem, B)
    out = np.zeros((3, S, A))
    s = np.arange(n)
    U = int(np.searchsorted(np.asarray(sizes), s_max, side="right"))  # sizes ≤ s_max; the rest are infeasible
    sf = arrivals.dense_sf(U)  # on the whole range 0..kmax (a compact table's zeros spelled out)
    C0 = np.zeros((U, kmax + 2))  # C0[m] = Σ_{k≥m} sf[k]
    C0[:, :-1] = np.cumsum(sf[:, ::-1], axis=1)[:, ::-1]
    D1 = np.zeros((U, kmax + 2))  # D1[m] = Σ_{k≥m} (k − m) sf[k] = D1[m+1] + C0[m+1]
    D1[:, :-1] = np.cumsum(C0[:, :0:-1], axis=1)[:, ::-1]
    for r in np.nonzero(sf[:, -1] >= SUPPORT_EPS)[0]:  # the table stops inside the support: Σ_{k>kmax} from the moments
        EK, EKK = lam * l[r], lam * lam * m2[r]
        miss0 = max(EK - float(C0[r, 0]), 0.0)  # Σ_{k>kmax} sf[k]
        k = np.arange(kmax + 2, dtype=np.float64)
        miss1 = max(0.5 * EKK - float(k[:-1] @ sf[r]) - kmax * miss0, 0.0)  # Σ_{k>kmax} (k − kmax) sf[k]
        C0[r] += miss0
        D1[r] += miss1 + (kmax - k) * miss0
    for i, a in enumerate(sizes[:U], start=1):
        srow = s[s >= a]
        m = s_max - srow + a  # ≤ s_max ≤ kmax
        e1 = C0[i - 1, m]
        e2 = 2.0 * D1[i - 1, m] + e1 + 2.0 * s_max * e1  # E (j − s_max)(j + s_max)
        out[0, srow, i] = c_t * e1
        out[1, srow, i] = c_e * e1
        out[2, srow, i] = c_h2 * e2 + c_h1 * e1
    out[:, -1] = out[:, -2]  # S_o is a copy of s_max
    return out
