"""Phase tables (schema_version 2): a batch size per queue length and MAP phase, and its reader.

Layout (version 1's, :mod:`.schema`, with these changes)::

    /                 attrs: format="smdp-batch-policy", schema_version=2, content_sha256 (:func:`phase_digest`)
    /policy           int32 (s_max+2, m): batch size per queue length 0..s_max, S_o, and phase
    /arrivals         attrs: spec, rate;  D0, D1  float64 (m, m) in 1/ms
    /inputs, /truncation   as version 1
    /solution         attrs: avg_cost, iterations, converged, mean_latency_ms, mean_power_w, objective,
                      solve_seconds, summary_json; relative_values float64 (s_max+2, m);
                      qvalues float64 (R+1, m, A) = Q((n, i), a) for n ≤ R (+inf where a > n);
                      actions int32 (A,) = 0 then the batch sizes

A version-1 reader refuses the file by its version; :func:`~.schema.read_policy` of this release
refuses it with a line naming what reads it.  Every check of :mod:`.schema` applies (links, storage,
filters, dtypes and shapes from metadata before reading; values; checksums), and more:

* every declared size is bounded and matched before any dataset is read: phases ≤ ``PHASE_LIMIT``, batch
  sizes ≤ ``BMAX_LIMIT``, levels × phases ≤ ``PHASE_TABLE_STATE_LIMIT``, stored action values
  ≤ ``PHASE_TABLE_VALUES_LIMIT`` (:mod:`smdp_batch.limits`), each dataset's shape against the others';
* ``content_sha256`` is required (every version-2 writer stores it; a file without it is refused);
* the decisions must be the values': on levels 0..R the policy minimises the stored Q (1e-9 relative),
  Q at the stored decision equals the relative value (1e-6 relative), and rows above R repeat row R.
"""

from __future__ import annotations

import hashlib
import math
import os
import re
from dataclasses import dataclass, field

import h5py
import numpy as np

from ..errors import InputError
from ..limits import BMAX_LIMIT, PHASE_TABLE_STATE_LIMIT, PHASE_TABLE_VALUES_LIMIT
from ..specs.mapcheck import PHASE_LIMIT, check_map
from .schema import (FORMAT, PHASE_SCHEMA_VERSION, TableFields, _attr, _check_decisions, _child, _dataset, _guarded,
                     _load_inputs, _load_truncation, _open, _s_max, _Where, table_digest)

__all__ = ["PhasePolicyFile", "phase_digest", "read_phase_policy", "policy_version"]

_HEX64 = re.compile(r"[0-9a-f]{64}")


@dataclass(frozen=True)
class PhasePolicyFile(TableFields):
    """A loaded, validated phase table (schema_version 2): ``policy`` (s_max+2, m) batch sizes per
    queue length and MAP phase, the MAP (D0, D1), and the action values ``qvalues`` (R+1, m, A) over
    ``actions`` (0 then the batch sizes) for the belief-weighted rule."""

    policy: np.ndarray
    D0: np.ndarray
    D1: np.ndarray
    qvalues: np.ndarray
    actions: np.ndarray
    inputs: dict
    truncation: dict
    solution: dict
    meta: dict = field(default_factory=dict)
    path: str | None = None
    integrity: str = "none"

    @property
    def phases(self) -> int:
        return self.policy.shape[1]


def phase_digest(policy, D0, D1, qvalues, batch_sizes, latency_ms, energy_mj, relative_values, inputs, s_max) -> str:
    """SHA-256 of a phase table's content: :func:`table_digest` of its flattened arrays plus D0, D1 and Q."""
    h = hashlib.sha256(b"smdp-batch-phase-table-v2\0")
    h.update(table_digest(np.ravel(policy), batch_sizes, latency_ms, energy_mj, np.ravel(relative_values), inputs,
                          s_max).encode())
    for a in (D0, D1, qvalues):
        a = np.ascontiguousarray(np.asarray(a, dtype="<f8"))
        h.update(str(a.shape).encode() + b"\0" + a.tobytes())
    return h.hexdigest()


def _metadata_shape(w: _Where, g, name: str, want: tuple) -> None:
    """Dataset ``name`` of ``g`` declares shape ``want`` (from its metadata; nothing is read)."""
    d = _child(w, g, name, h5py.Dataset)
    if d.shape != want:
        w.fail(d.name, f"has shape {d.shape}; expected {want}")


def _declared(w: _Where, g) -> tuple[int, int, int, int]:
    """(s_max, phases m, batch sizes B, stored range R), every declared shape bounded and matched against
    the others from attributes and metadata, before any dataset is read."""
    gt, gs = _child(w, g, "truncation", h5py.Group), _child(w, g, "solution", h5py.Group)
    ga, gi = _child(w, g, "arrivals", h5py.Group), _child(w, g, "inputs", h5py.Group)
    s_max = _s_max(w, g)
    d0 = _child(w, ga, "D0", h5py.Dataset)
    if d0.shape is None or len(d0.shape) != 2 or d0.shape[0] != d0.shape[1] or not 1 <= d0.shape[0] <= PHASE_LIMIT:
        w.fail(d0.name, f"has shape {d0.shape}; expected a square matrix of 1..{PHASE_LIMIT} phases")
    m = d0.shape[0]
    bs = _child(w, gi, "batch_sizes", h5py.Dataset)
    if bs.shape is None or len(bs.shape) != 1 or not 1 <= bs.shape[0] <= BMAX_LIMIT:
        w.fail(bs.name, f"has shape {bs.shape}; expected (B,) batch sizes, 1 ≤ B ≤ {BMAX_LIMIT}")
    nb = bs.shape[0]
    n = s_max + 2
    if n * m > PHASE_TABLE_STATE_LIMIT:
        w.fail(f"{gt.name}@s_max", f"= {s_max} declares {n} levels × {m} phases = {n * m} states; a phase table holds "
               f"at most {PHASE_TABLE_STATE_LIMIT} (s_max ≤ {PHASE_TABLE_STATE_LIMIT // m - 2} with {m} phases)")
    R = _attr(w, gt, "converged_upto", "int", -1, low=-1, high=s_max)
    R = s_max if R == -1 else R
    values = (R + 1) * m * (nb + 1)
    if values > PHASE_TABLE_VALUES_LIMIT:
        w.fail(f"{gs.name}/qvalues", f"would hold {R + 1} levels × {m} phases × {nb + 1} actions = {values} values; a "
               f"phase table holds at most {PHASE_TABLE_VALUES_LIMIT}")
    for grp, name, want in ((ga, "D1", (m, m)), (gi, "latency_ms", (nb,)), (gi, "energy_mj", (nb,)),
                            (g, "policy", (n, m)), (gs, "relative_values", (n, m)), (gs, "actions", (nb + 1,)),
                            (gs, "qvalues", (R + 1, m, nb + 1))):
        _metadata_shape(w, grp, name, want)
    return s_max, m, nb, R


def _check_values(w: _Where, policy: np.ndarray, qv: np.ndarray, rv: np.ndarray, actions: np.ndarray, R: int) -> None:
    """The stored decisions are what the stored values say: on levels 0..R, policy[n, i] minimises Q((n, i), ·)
    (policy iteration's ties: 1e-9 relative) and Q((n, i), policy[n, i]) is the relative value h(n, i)."""
    idx = np.searchsorted(actions, policy[: R + 1])
    cur = np.take_along_axis(qv, idx[:, :, None], axis=2)[:, :, 0]
    best = qv.argmin(axis=2)
    gap = cur - np.take_along_axis(qv, best[:, :, None], axis=2)[:, :, 0]
    bad = gap > 1e-9 * (1.0 + np.abs(cur))
    if bad.any():
        n, i = (int(x) for x in np.argwhere(bad)[0])
        w.fail(f"/policy[{n},{i}]", f"= {int(policy[n, i])} contradicts /solution/qvalues, where batch size "
               f"{int(actions[best[n, i]])} is better by {gap[n, i]:.6g}: the stored decisions are not the stored values' "
               "(an altered table)")
    off = np.abs(rv[: R + 1] - cur)
    bad = off > 1e-6 * (1.0 + np.abs(cur))
    if bad.any():
        n, i = (int(x) for x in np.argwhere(bad)[0])
        w.fail(f"/solution/relative_values[{n},{i}]", f"= {float(rv[n, i])!r} contradicts /solution/qvalues (the value of "
               f"the stored decision there is {float(cur[n, i])!r}): an altered table")
    if R < policy.shape[0] - 2:
        tail = policy[R + 1:] != policy[R]
        if tail.any():
            n, i = (int(x) for x in np.argwhere(tail)[0])
            w.fail(f"/policy[{n + R + 1},{i}]", f"= {int(policy[n + R + 1, i])} differs from policy[{R},{i}] = "
                   f"{int(policy[R, i])}; a table converged up to R = {R} repeats row R above it")


def _load_phase_table(w: _Where, g, meta: dict) -> PhasePolicyFile:
    s_max, m, nb, R = _declared(w, g)
    gt = _child(w, g, "truncation", h5py.Group)
    gs = _child(w, g, "solution", h5py.Group)
    ga = _child(w, g, "arrivals", h5py.Group)
    digest = _attr(w, g, "content_sha256", "str", None)
    if digest is None:
        w.fail("/@content_sha256", "is missing: every phase table (schema_version 2) is written with its content "
               "digest; the file was altered or damaged")
    if not _HEX64.fullmatch(digest):
        w.fail("/@content_sha256", f"= {digest[:70]!r}; expected a SHA-256 digest (64 lowercase hex digits)")
    n = s_max + 2
    inputs, sizes, lat, en, c1 = _load_inputs(w, g, s_max)
    if sizes[-1] > BMAX_LIMIT:
        w.fail("/inputs/batch_sizes", f"has Bmax = {int(sizes[-1])}; expected batch sizes ≤ {BMAX_LIMIT}")
    truncation = _load_truncation(w, gt, s_max)
    D0, c2 = _dataset(w, ga, "D0", "float", (m, m), "the MAP's D0 (1/ms)")
    D1, c3 = _dataset(w, ga, "D1", "float", (m, m), "the MAP's D1 (1/ms)")
    try:
        D0, D1, _, rate = check_map(D0, D1)
    except InputError as e:
        w.fail(ga.name, f"is not a valid MAP: {e}")
    if not math.isclose(rate, inputs["lam"], rel_tol=1e-9):
        w.fail(f"{ga.name}", f"has mean rate {rate!r}, but inputs@lam = {inputs['lam']!r}")
    stated = _attr(w, ga, "rate", "float", None)
    if stated is not None and not math.isclose(stated, rate, rel_tol=1e-9):
        w.fail(f"{ga.name}@rate", f"= {stated!r}, but D0, D1 have mean rate {rate!r}")
    policy, c4 = _dataset(w, g, "policy", "int", (n, m), "a batch size per queue length 0..s_max+1 and phase")
    policy = policy.astype(np.int64)
    _check_decisions(w, "/policy", policy, sizes, s_max, "/inputs/batch_sizes")
    A = nb + 1
    actions, c5 = _dataset(w, gs, "actions", "int", A, "0 then the batch sizes")
    if not np.array_equal(actions, np.concatenate([[0], sizes])):
        w.fail(f"{gs.name}/actions", "must be 0 followed by inputs/batch_sizes")
    actions = actions.astype(np.int64)
    qv, c6 = _dataset(w, gs, "qvalues", "float", (R + 1, m, A), "action values Q((n, i), a) for n ≤ R")
    qv = qv.astype(np.float64, copy=False)
    feas = actions[None, None, :] <= np.arange(R + 1)[:, None, None]  # (R+1, 1, A): serve at most n
    if np.isnan(qv).any() or (np.isinf(qv) & feas).any():
        w.fail(f"{gs.name}/qvalues", "holds NaN or an infinite value for a feasible action")
    rv, c7 = _dataset(w, gs, "relative_values", "float", (n, m), "relative values per queue length and phase")
    if not np.all(np.isfinite(rv)):
        w.fail(f"{gs.name}/relative_values", "holds a value that is not finite")
    zeroed = np.where(feas, qv, 0.0)
    if digest != phase_digest(policy, D0, D1, zeroed, sizes, lat, en, rv, inputs, s_max):
        w.fail("", f"content checksum mismatch in {g.name} (content_sha256): the file is damaged")
    del zeroed
    np.copyto(qv, np.inf, where=~feas)
    _check_values(w, policy, qv, rv, actions, R)
    solution = {
        "avg_cost": _attr(w, gs, "avg_cost", "float"),
        "iterations": _attr(w, gs, "iterations", "int", low=0),
        "converged": _attr(w, gs, "converged", "bool"),
        "mean_latency_ms": _attr(w, gs, "mean_latency_ms", "float", low=0),
        "mean_power_w": _attr(w, gs, "mean_power_w", "float", low=0),
        "objective": _attr(w, gs, "objective", "float", None),
        "solve_seconds": _attr(w, gs, "solve_seconds", "float", None, low=0),
        "relative_values": rv,
    }
    checksummed = c1 and c2 and c3 and c4 and c5 and c6 and c7
    return PhasePolicyFile(policy, D0, D1, qv, actions, inputs, truncation, solution, meta, w.path,
                           "fletcher32+sha256" if checksummed else "sha256")


def read_phase_policy(path: str | os.PathLike) -> PhasePolicyFile:
    """Load and validate a phase table (schema_version 2); a version-1 table is refused with a pointer."""
    path = str(path)
    f, meta = _guarded(path, lambda: _open(path, FORMAT, (PHASE_SCHEMA_VERSION,)))
    with f:
        return _guarded(path, lambda: _load_phase_table(_Where(path), f, meta))


def policy_version(path: str | os.PathLike) -> int | None:
    """The schema_version of an smdp-batch policy file (None if unreadable): lets a caller pick the reader."""
    if not os.path.isfile(path):  # a FIFO or a device is never opened (the readers refuse it on one line)
        return None
    try:
        with h5py.File(str(path), "r") as f:
            if "schema_version" not in f.attrs:
                return None
            aid = f.attrs.get_id("schema_version")  # shape and type from metadata: nothing large is read
            if aid.shape != () or aid.dtype.kind not in "iu":
                return None
            return int(f.attrs["schema_version"])
    except (OSError, ValueError, TypeError, KeyError, RuntimeError):
        return None
