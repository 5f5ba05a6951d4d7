"""Phase tables (schema_version 2; issue 20): a batch size per queue length and MAP phase, and its reader.

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
filters, dtypes and shapes from metadata before reading; values; checksums).
"""

from __future__ import annotations

import hashlib
import math
import os
from dataclasses import dataclass, field

import h5py
import numpy as np

from ..errors import InputError
from .mapcheck import PHASE_LIMIT, check_map
from .schema import (FORMAT, PHASE_SCHEMA_VERSION, TableFields, _attr, _check_decisions, _child, _dataset, _guarded,
                     _load_inputs, _load_truncation, _open, _s_max, _Where, table_digest)

__all__ = ["PhasePolicyFile", "phase_digest", "read_phase_policy", "policy_version"]


@dataclass(frozen=True)
class PhasePolicyFile(TableFields):
    """A loaded, validated phase table (schema_version 2; issue 20): ``policy`` (s_max+2, m) batch sizes per
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


def _shape_of(w: _Where, g, name: str, ndim: int, limit: int) -> tuple:
    d = _child(w, g, name, h5py.Dataset)
    if d.shape is None or len(d.shape) != ndim or any(x < 1 or x > limit for x in d.shape):
        w.fail(d.name, f"has shape {d.shape}; expected {ndim} dimensions of 1..{limit}")
    return d.shape


def _load_phase_table(w: _Where, g, meta: dict) -> PhasePolicyFile:
    gt = _child(w, g, "truncation", h5py.Group)
    gs = _child(w, g, "solution", h5py.Group)
    ga = _child(w, g, "arrivals", h5py.Group)
    s_max = _s_max(w, g)
    n = s_max + 2
    inputs, sizes, lat, en, c1 = _load_inputs(w, g, s_max)
    truncation = _load_truncation(w, gt, s_max)
    m = _shape_of(w, ga, "D0", 2, PHASE_LIMIT)[0]
    D0, c2 = _dataset(w, ga, "D0", "float", (m, m), "the MAP's D0 (1/ms)")
    D1, c3 = _dataset(w, ga, "D1", "float", (m, m), "the MAP's D1 (1/ms)")
    try:
        D0, D1, _, rate = check_map(D0, D1)
    except InputError as e:
        w.fail(ga.name, f"is not a valid MAP: {e}")
    if not math.isclose(rate, inputs["lam"], rel_tol=1e-9):
        w.fail(f"{ga.name}", f"has mean rate {rate!r}, but inputs@lam = {inputs['lam']!r}")
    policy, c4 = _dataset(w, g, "policy", "int", (n, m), "a batch size per queue length 0..s_max+1 and phase")
    policy = policy.astype(np.int64)
    _check_decisions(w, "/policy", policy, sizes, s_max, "/inputs/batch_sizes")
    A = sizes.size + 1
    R = truncation.get("converged_upto", s_max)
    actions, c5 = _dataset(w, gs, "actions", "int", A, "0 then the batch sizes")
    if not np.array_equal(actions, np.concatenate([[0], sizes])):
        w.fail(f"{gs.name}/actions", "must be 0 followed by inputs/batch_sizes")
    qv, c6 = _dataset(w, gs, "qvalues", "float", (R + 1, m, A), "action values Q((n, i), a) for n ≤ R")
    feas = actions[None, None, :] <= np.arange(R + 1)[:, None, None]
    if np.isnan(qv).any() or not np.all(np.isfinite(qv[np.broadcast_to(feas, qv.shape)])):
        w.fail(f"{gs.name}/qvalues", "holds NaN or an infinite value for a feasible action")
    qv = np.where(feas, qv, np.inf)
    rv, c7 = _dataset(w, gs, "relative_values", "float", (n, m), "relative values per queue length and phase")
    if not np.all(np.isfinite(rv)):
        w.fail(f"{gs.name}/relative_values", "holds a value that is not finite")
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
    integrity = "none"
    digest = _attr(w, g, "content_sha256", "str", None)
    if digest is not None:
        if digest != phase_digest(policy, D0, D1, np.where(feas, qv, 0.0), sizes, lat, en, rv, inputs, s_max):
            w.fail("", f"content checksum mismatch in {g.name} (content_sha256): the file is damaged")
        integrity = "sha256"
    if c1 and c2 and c3 and c4 and c5 and c6 and c7:
        integrity = "fletcher32" if integrity == "none" else "fletcher32+sha256"
    return PhasePolicyFile(policy, D0, D1, qv, actions.astype(np.int64), inputs, truncation,
                           solution, meta, w.path, integrity)


def read_phase_policy(path: str | os.PathLike) -> PhasePolicyFile:
    """Load and validate a phase table (schema_version 2); a version-1 table is refused with a pointer."""
    path = str(path)
    f, meta = _guarded(path, lambda: _open(path, FORMAT, (PHASE_SCHEMA_VERSION,)))
    with f:
        return _guarded(path, lambda: _load_phase_table(_Where(path), f, meta))


def policy_version(path: str | os.PathLike) -> int | None:
    """The schema_version of an smdp-batch policy file (None if unreadable): lets a caller pick the reader."""
    try:
        with h5py.File(str(path), "r") as f:
            v = f.attrs.get("schema_version")
            return int(v) if v is not None and np.asarray(v).shape == () and np.asarray(v).dtype.kind in "iu" else None
    except (OSError, ValueError, TypeError):
        return None
