"""JAX backend (optional extra ``smdp-batch[jax]``): jit-compiled PI and RVI, vmapped over problems.

The model is the numba path's (:mod:`.pi`, :mod:`.kernels`), in float64 (``jax.enable_x64``):

* every expectation Σ_j m̂(j|s,a)h(j) (eq. 18) for all (s, a) is one matrix product of the
  (S, W) windows of h̄ — h padded with h(S_o) past s_max — with the filter matrix F (W × A) of
  :func:`smdp_batch.solvers.kernels.window_filters`, plus tail[a]·h(S_o): O(S·W·A) flops, O(S·W + W·A)
  memory, never S×A×S;
* policy iteration evaluates π by one dense solve of (I − M_π with column 0 replaced by y)·(g, h)
  = ĉ_π, i.e. eq. 20 with h(0) ≡ 0 (unique for a unichain π, paper 004 Lemma 2) — O(S²) memory
  for that one policy, O(S³) flops, which a GPU does fast; improvement as in the numba loop
  (switch only when better by > 1e-11 relative), stop when the policy repeats;
* RVI is Algorithm 1 (eq. 29) with reference state 0 and the span stop of DESIGN.md §3;
* both loops are ``lax.while_loop`` and are ``vmap``-ped over a batch of problems that share
  s_max and the action set (a grid of w2 × λ, say): one call, one compilation per shape.  A
  batch may be warm-started with one policy per problem (e.g. the previous sweep's).

Results equal the numba path: same policy and ĝ to ~1e-12 relative (tests).  A problem whose PI
meets a numerically singular policy (a non-finite solve, or a gain that rises — PI's gains never
do) stops there with ``converged=False`` and a warning; :func:`smdp_batch.solvers.solve_batch`
and ``solve(..., backend="jax")`` then re-solve it on the numba path, which falls back to a
pivoting solve and to partial switches.
"""

from __future__ import annotations

import functools
import time
from typing import Any

import numpy as np

from ..errors import InputError, warn_not_converged
from ..extras import require
from .kernels import window_filters
from ..model.truncation import TruncatedSMDP
from .pi import _initial_policy
from .result import SolveResult

# the optional dependency, bound by _require() on first use
jax: Any = None
jnp: Any = None
lax: Any = None

__all__ = ["available", "device", "pi_batch", "rvi_batch"]


def available() -> bool:
    """True when JAX is importable."""
    try:
        _require()
    except InputError:
        return False
    return True


def _require():
    """Bind jax, jax.numpy and jax.lax, or raise the one-line InputError naming the jax extra."""
    global jax, jnp, lax
    try:
        mod = require("jax", "backend 'jax'")  # checked on each use: a JAX blocked since counts too
    except InputError as e:
        raise InputError(f"{e} (GPU: also jax[cuda12]); valid: numba, jax") from None
    if jax is None:
        jax, jnp, lax = mod, require("jax.numpy", "backend 'jax'"), mod.lax


def device() -> str:
    """The device JAX computes on, e.g. 'cpu:0' or 'NVIDIA H100 80GB HBM3'."""
    _require()
    d = jax.devices()[0]
    return getattr(d, "device_kind", str(d)) if d.platform != "cpu" else f"cpu ({jax.device_count()} device)"


# ---------------------------------------------------------------- stacking problems
def _stack(models: list[TruncatedSMDP]):
    """Batch arrays (costs, F, tail, y) in one common window frame; plus jmin and s_max."""
    if not models:
        raise InputError("no models to solve")
    if any(m.extra is not None for m in models):
        raise InputError("the JAX backend solves eq. 19's overflow boundary only; a model has the tail boundary "
                         "(use backend='numba')")
    m0 = models[0]
    for m in models[1:]:
        if m.s_max != m0.s_max or not np.array_equal(m.actions, m0.actions):
            raise InputError(
                "a JAX batch needs one s_max and one set of batch sizes; got s_max "
                f"{m0.s_max} and {m.s_max} (solve different shapes in separate batches)"
            )
    filt = [window_filters(m.P, m.SF, m.klo, m.khi, m.actions, m.s_max) for m in models]
    jmin = min(f[2] for f in filt)
    jmax = max(f[2] + f[0].shape[0] - 1 for f in filt)
    B, A = len(models), len(m0.actions)
    F = np.zeros((B, jmax - jmin + 1, A))
    for i, (Fi, _, j0) in enumerate(filt):
        F[i, j0 - jmin : j0 - jmin + Fi.shape[0], : Fi.shape[1]] = Fi
    tail = np.stack([f[1] for f in filt])
    costs = np.stack([m.costs() for m in models])
    y = np.stack([m.y for m in models])
    return costs, F, tail, y, int(jmin), int(m0.s_max)


# ---------------------------------------------------------------- pure single-problem pieces
def _expect(h, F, tail, jmin: int, s_max: int):
    """(S, A) table of Σ_j m̂(j|s,a)h(j); row S_o equals row s_max (both act at level s_max)."""
    n, W = s_max + 1, F.shape[0]
    idx = jnp.arange(n)[:, None] + (jmin + jnp.arange(W))[None, :]
    hbar = jnp.where(idx > s_max, h[-1], jnp.where(idx < 0, 0.0, h[jnp.clip(idx, 0, s_max)]))
    EH = hbar @ F + tail[None, :] * h[-1]
    return jnp.concatenate([EH, EH[-1:]], axis=0)


def _evaluate(pol, costs, F, tail, y, jmin: int, s_max: int):
    """(g, h) of π with h(0) = 0: dense solve of eq. 20 (column of h(0) replaced by y)."""
    S, W = s_max + 2, F.shape[0]
    rows = jnp.arange(S)
    lev = jnp.minimum(rows, s_max)
    cols = lev[:, None] + (jmin + jnp.arange(W))[None, :]
    cols = jnp.where(cols > s_max, S - 1, jnp.maximum(cols, 0))
    M = jnp.zeros((S, S)).at[rows[:, None], cols].add(F[:, pol].T)
    M = M.at[:, S - 1].add(tail[pol])
    Amat = (jnp.eye(S) - M).at[:, 0].set(y[pol])
    x = jnp.linalg.solve(Amat, costs[rows, pol])
    return x[0], x.at[0].set(0.0)


def _improve(pol, g, h, costs, F, tail, y, jmin: int, s_max: int):
    Q = costs - g * y[None, :] + _expect(h, F, tail, jmin, s_max)
    rows = jnp.arange(Q.shape[0])
    best = jnp.argmin(Q, axis=1)
    qcur = Q[rows, pol]
    better = qcur - Q[rows, best] > 1e-11 * (1.0 + jnp.abs(qcur))
    return jnp.where(better, best, pol)


def _pi_one(pol0, costs, F, tail, y, jmin: int, s_max: int, max_iter: int):
    g0, h0 = _evaluate(pol0, costs, F, tail, y, jmin, s_max)

    def ok(g, h):
        return jnp.isfinite(g) & jnp.all(jnp.isfinite(h))

    def cond(st):
        pol, g, h, it, done, good = st
        return (~done) & good & (it < max_iter)

    def body(st):
        pol, g, h, it, done, good = st
        new = _improve(pol, g, h, costs, F, tail, y, jmin, s_max)
        same = jnp.all(new == pol)
        g2, h2 = _evaluate(new, costs, F, tail, y, jmin, s_max)
        # PI's gains never increase; a rise means the solve met a numerically multichain policy
        monotone = g2 <= g + 1e-9 * (1.0 + jnp.abs(g))
        return new, g2, h2, it + 1, same, ok(g2, h2) & monotone

    st = (pol0, g0, h0, jnp.asarray(0), jnp.asarray(False), ok(g0, h0))
    pol, g, h, it, done, good = lax.while_loop(cond, body, st)
    return pol, g, h, it, done & good


def _rvi_one(H0, costs, F, tail, y, eta, eps, jmin: int, s_max: int, max_iter: int):
    ctil = costs / y[None, :]
    w = eta / y

    def sweep(H):
        Q = ctil + w[None, :] * _expect(H, F, tail, jmin, s_max) + (1.0 - w)[None, :] * H[:, None]
        pol = jnp.argmin(Q, axis=1)
        J = Q[jnp.arange(Q.shape[0]), pol]
        d = J - H
        return J - J[0], pol, d.min(), d.max()

    def cond(st):
        H, pol, lo, hi, it = st
        return (hi - lo >= eps) & (it < max_iter)

    def body(st):
        H, _, _, _, it = st
        H2, pol, lo, hi = sweep(H)
        return H2, pol, lo, hi, it + 1

    H1, pol1, lo1, hi1 = sweep(H0)
    H, pol, lo, hi, it = lax.while_loop(cond, body, (H1, pol1, lo1, hi1, jnp.asarray(1)))
    return H, pol, lo, hi, it


@functools.lru_cache(maxsize=None)
def _compiled(kind: str, jmin: int, s_max: int, max_iter: int):
    if kind == "pi":
        f = functools.partial(_pi_one, jmin=jmin, s_max=s_max, max_iter=max_iter)
        return jax.jit(jax.vmap(f))
    f = functools.partial(_rvi_one, jmin=jmin, s_max=s_max, max_iter=max_iter)
    return jax.jit(jax.vmap(f, in_axes=(0, 0, 0, 0, 0, 0, None)))


# ---------------------------------------------------------------- public batch solvers
def pi_batch(
    models: list[TruncatedSMDP], policy0: np.ndarray | None = None, max_iter: int = 1000
) -> list[SolveResult]:
    """Exact policy iteration for a batch of models sharing s_max and batch sizes (one vmapped call).

    policy0 : optional (B, s_max+2) batch sizes to warm-start each problem; default greedy.
    """
    _require()
    costs, F, tail, y, jmin, s_max = _stack(models)
    if policy0 is None:
        pol0 = np.stack([_initial_policy(m) for m in models])
    else:
        p0 = np.asarray(policy0)
        if p0.shape != (len(models), s_max + 2):
            raise InputError(f"policy0 must have shape (B, s_max+2) = ({len(models)}, {s_max + 2}), got {p0.shape}")
        pol0 = np.stack([m.action_index(p) for m, p in zip(models, p0)])
    t0 = time.perf_counter()
    with jax.enable_x64(True):
        out = _compiled("pi", jmin, s_max, int(max_iter))(
            jnp.asarray(pol0, dtype=jnp.int64), jnp.asarray(costs), jnp.asarray(F), jnp.asarray(tail), jnp.asarray(y)
        )
        pol, g, h, it, conv = (np.asarray(a) for a in jax.block_until_ready(out))
    secs = time.perf_counter() - t0
    if not conv.all():
        warn_not_converged(
            f"JAX policy iteration did not certify {int((~conv).sum())} of {len(models)} problems (iteration cap or a "
            "numerically singular policy): use backend='numba' for them")
    acts = models[0].actions
    return [
        SolveResult(
            policy=acts[pol[i]], gain=float(g[i]), gain_bracket=(float(g[i]), float(g[i])), relative_values=h[i],
            iterations=int(it[i]), span=0.0, converged=bool(conv[i]), solver="pi", seconds=secs / len(models), backend="jax",
        )
        for i in range(len(models))
    ]


def rvi_batch(
    models: list[TruncatedSMDP], eps: float = 0.01, max_iter: int = 100_000, eta_fraction: float = 0.99
) -> list[SolveResult]:
    """Relative value iteration (Algorithm 1) for a batch of models sharing s_max and batch sizes."""
    _require()
    if not (np.isfinite(eps) and eps > 0):
        raise InputError(f"eps must be > 0, got {eps!r}")
    costs, F, tail, y, jmin, s_max = _stack(models)
    eta = np.array([eta_fraction * m.eta_bound() for m in models])
    t0 = time.perf_counter()
    with jax.enable_x64(True):
        out = _compiled("rvi", jmin, s_max, int(max_iter))(
            jnp.zeros((len(models), s_max + 2)), jnp.asarray(costs), jnp.asarray(F), jnp.asarray(tail),
            jnp.asarray(y), jnp.asarray(eta), float(eps),
        )
        H, pol, lo, hi, it = (np.asarray(a) for a in jax.block_until_ready(out))
    secs = time.perf_counter() - t0
    conv = hi - lo < eps
    if not conv.all():
        warn_not_converged(
            f"JAX RVI stopped at max_iter={max_iter} for {int((~conv).sum())} of {len(models)} problems: NOT certified "
            "ε-optimal (raise max_iter, or use solver='pi')")
    acts = models[0].actions
    return [
        SolveResult(
            policy=acts[pol[i]], gain=float(0.5 * (lo[i] + hi[i])), gain_bracket=(float(lo[i]), float(hi[i])),
            relative_values=eta[i] * H[i], iterations=int(it[i]), span=float(hi[i] - lo[i]), converged=bool(conv[i]),
            solver="rvi", seconds=secs / len(models), eps=float(eps), eta=float(eta[i]), backend="jax",
        )
        for i in range(len(models))
    ]
