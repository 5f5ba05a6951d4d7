"""The HDF5 policy-table schema (version 1) and its one reader.  numpy and h5py only.

Both sides of the file format live here: the writer (:mod:`smdp_batch.export.hdf5`) takes the
format names, version and :func:`table_digest` from this module, and every reader —
:class:`~smdp_batch.runtime.PolicyTable`, :class:`~smdp_batch.runtime.PolicyBank`, the CLI's
``show``/``evaluate``/``export``, the simulator's ``FILE.h5`` policies — goes through
:func:`read_policy` / :func:`read_bank`.

Layout (DESIGN.md §4)::

    /                attrs: format="smdp-batch-policy", schema_version=1, creator, created (ISO 8601),
                            units_time="ms", units_energy="mJ", units_power="W", units_rate="1/ms"
    /policy          int32 (s_max+2,): batch size per queue length 0..s_max, then S_o;
                     for n > s_max serve policy[s_max] (paper 004 eq. 30, :func:`eq30`)
    /inputs          attrs: lam, rho, w1, w2, service, latency, energy (model specs: provenance text); a
                     c-server table also instances (c; ρ is then per instance), idle_power_w, phases, and
                     contention (K:S[:E],… when its instances slow each other; ρ then counts s_c) (these in its
                     digest) and batch_time_model (provenance text)
    /inputs/batch_sizes   int32;  /inputs/latency_ms, /inputs/energy_mj  float64 per batch size
    /truncation      attrs: s_max, s_max_auto, abstract_cost, delta, tol_delta
                     (files written before 0.2 say smax, smax_auto: read as s_max, s_max_auto);
                     from 0.3: s_max_rule ("auto" converged, "minimal" paper 004, "fixed") and
                     converged_upto R (−1: not verified) — policy[n] for n ≤ R equals the decision
                     of a truncation ≥ 2R, and policy[n] = policy[R] above R (a version-1 addition);
                     newer files: boundary ("tail": exact excursion costs above s_max, abstract_cost 0 and
                     delta = |ĝ(s_max) − ĝ(s_max/2)|; "overflow": eq. 19's S_o; absent = overflow);
                     verified_against (the exponential rule: R verified against this truncation, not 2R;
                     delta = |ĝ(s_max) − ĝ(verified_against)|)
    /solution        attrs: avg_cost, solver, iterations, converged, eps, eta (NaN = none), span, gain_lo,
                            gain_hi, mean_latency_ms, mean_power_w, throughput, mean_batch_size, objective,
                            control_limit (-1 = none), solve_seconds, summary_json; a c-server table with
                            busy-aware rows also busy_avg_cost, busy_mean_latency_ms, busy_mean_power_w
    /solution/relative_values  float64 (s_max+2,)
    /policy_busy     int32 (c, s_max+2), a c-server table's optional busy-aware rows: row k the batch size per
                     queue length with k instances busy (k = 0..c−1; in its digest)
    content_sha256   (attr of the table's group; files from 0.2 on) :func:`table_digest` of the policy,
                     the inputs and s_max

A policy bank (``format="smdp-batch-policy-bank"``) holds ``/lams`` (float64, ascending) and one
such table per rate under ``/tables/000``, ``/tables/001``, …

Integrity (0.2): every dataset is written with HDF5 fletcher32 checksums (a damaged chunk fails to
read) and each table carries ``content_sha256``.  Both are additions a version-1 reader ignores, so
the schema version stays 1; files without them (earlier writers, the shipped ``policies/``) still
load, with :attr:`PolicyFile.integrity` = ``"none"`` — except a c-server table (``/inputs@instances``):
those never existed without ``content_sha256``, so one without it was altered and is refused.  Sizes a file
declares are bounded as products before anything is read (a c-server table's busy-aware rows: c·(s_max + 2)).

The reader trusts nothing it reads: it checks every dataset's link, storage, filters, dtype and
shape from metadata *before* reading it (so a file that declares 2²⁹ entries is refused without
allocating them), reads only the attributes it knows, checks their types, finiteness and ranges,
and never follows a link or an external storage into another file.  Every problem is a
:class:`PolicyFileError` naming the file and the dataset or attribute.
"""

from __future__ import annotations

import hashlib
import json
import math
import numbers
import os
from dataclasses import dataclass, field
from typing import NoReturn

import h5py
import numpy as np

from ..errors import InputError, PolicyFileError
from ..specs.contention import parse_contention

FORMAT = "smdp-batch-policy"
BANK_FORMAT = "smdp-batch-policy-bank"
SCHEMA_VERSION = 1
#: Phase tables (MAP arrivals, :func:`read_phase_policy`) are version 2: a version-1 reader refuses them
#: by their version, and this one's :func:`read_policy` with a line that names what reads them.
PHASE_SCHEMA_VERSION = 2

#: Limits on what a file may declare (far above any table smdp-batch solves; the shipped ones have s_max ≤ 505).
MAX_S_MAX = 10_000_000
MAX_BATCH_SIZES = 100_000
MAX_BANK_TABLES = 1_000
MAX_BANK_STATES = 20_000_000  # Σ (s_max + 2) over a bank's tables
MAX_CHUNK_BYTES = 8 << 20  # one HDF5 chunk, decompressed (h5py's own chunks are ≤ 1 MiB)
MAX_TEXT = 4 << 20  # characters of one string attribute
MAX_INSTANCES = 64  # model instances a c-server table may name (the problem's own limit)
MAX_BUSY_VALUES = 20_000_000  # c·(s_max + 2): a c-server table's busy-aware rows, bounded as a product

_ALLOWED_FILTERS = {h5py.h5z.FILTER_DEFLATE, h5py.h5z.FILTER_SHUFFLE, h5py.h5z.FILTER_FLETCHER32, 32000}  # 32000: lzf

__all__ = ["FORMAT", "BANK_FORMAT", "SCHEMA_VERSION", "PHASE_SCHEMA_VERSION", "PolicyFile", "eq30", "read_policy", "read_bank",
           "table_digest"]


def eq30(policy: np.ndarray, s_max: int, n: int) -> int:
    """Batch size for queue length n: policy[min(n, s_max)] (paper 004 eq. 30).

    A queue length is an integer (``int`` or a numpy integer) ≥ 0.  Floats — even integral ones
    like 3.0 — NaN, bools and negatives raise :class:`InputError`; nothing is rounded.
    """
    if type(n) is not int:
        if isinstance(n, (bool, np.bool_)) or not isinstance(n, numbers.Integral):
            raise InputError(f"a queue length must be an integer ≥ 0, got {n!r} ({type(n).__name__})")
        n = int(n)
    if n < 0:
        raise InputError(f"a queue length must be an integer ≥ 0, got {n}")
    return int(policy[n if n < s_max else s_max])


class TableFields:
    """What every loaded table answers from its ``policy`` (queue length on the first axis), ``inputs`` and
    ``truncation``: shared by :class:`PolicyFile` and the phase tables' ``PhasePolicyFile``."""

    policy: np.ndarray
    inputs: dict
    truncation: dict

    @property
    def s_max(self) -> int:
        return self.policy.shape[0] - 2

    @property
    def batch_sizes(self) -> tuple[int, ...]:
        return tuple(int(b) for b in self.inputs["batch_sizes"])

    @property
    def converged_upto(self) -> int | None:
        """R of a converged table (decisions up to R verified against a larger truncation), else None."""
        return self.truncation.get("converged_upto")


@dataclass(frozen=True)
class PolicyFile(TableFields):
    """A loaded, validated policy table: the policy array and every stored attribute the readers use.

    ``integrity``: ``"fletcher32+sha256"`` (datasets checksummed and the content digest verified) or
    ``"none"`` (a file written before checksums: loaded, but damage cannot be detected).
    """

    policy: np.ndarray
    inputs: dict
    truncation: dict
    solution: dict
    meta: dict = field(default_factory=dict)
    path: str | None = None
    integrity: str = "none"
    #: a c-server table's busy-aware rows (c, s_max + 2): the size at queue length n with k instances busy
    policy_busy: np.ndarray | None = None

    def decide(self, n: int) -> int:
        """Batch size for queue length n ≥ 0 (n > s_max uses the s_max action, eq. 30)."""
        return eq30(self.policy, self.s_max, n)


def table_digest(policy, batch_sizes, latency_ms, energy_mj, relative_values, inputs: dict, s_max: int,
                 policy_busy=None) -> str:
    """SHA-256 of what a table decides with: its arrays (as little-endian int64/float64; a c-server table's
    busy-aware rows too, where it has them), the scalar inputs (lam, rho, w1, w2, service, latency, energy) and
    s_max.  The writer stores it as the table group's ``content_sha256``; the reader recomputes it."""
    h = hashlib.sha256(b"smdp-batch-table-v1\0")
    arrays = [(policy, "<i8"), (batch_sizes, "<i8"), (latency_ms, "<f8"), (energy_mj, "<f8"), (relative_values, "<f8")]
    if policy_busy is not None:  # files without it: the digest as before
        arrays.append((policy_busy, "<i8"))
    for a, dt in arrays:
        a = np.ascontiguousarray(np.asarray(a).astype(dt, copy=False))
        h.update(str(a.size).encode() + b"\0")
        h.update(a.tobytes())
    scalars: list[float | str] = [float(inputs[k]) for k in ("lam", "rho", "w1", "w2")]
    scalars += [str(inputs[k]) for k in ("service", "latency", "energy")] + [int(s_max)]
    if "instances" in inputs:  # a c-server table (files without it: one instance, the digest as before)
        scalars += [int(inputs["instances"]), float(inputs["idle_power_w"]), int(inputs.get("phases", 0))]
        if inputs.get("contention"):  # files without it: no contention, the digest as before
            scalars.append(str(inputs["contention"]))
    h.update(json.dumps(scalars, allow_nan=False).encode())
    return h.hexdigest()


# ------------------------------------------------------------------------------------------ checks
class _Where:
    """The file being read: builds the one-line errors that name it and the object at fault."""

    def __init__(self, path: str):
        self.path = path

    def fail(self, what: str, msg: str) -> NoReturn:
        raise PolicyFileError(f"{self.path!r}: {what} {msg}")


def _child(w: _Where, g, name: str, kind):
    """Member ``name`` of group ``g``: a hard link to a ``kind`` (h5py.Group or h5py.Dataset)."""
    where = f"{g.name.rstrip('/')}/{name}"
    what = "dataset" if kind is h5py.Dataset else "group"
    link = g.get(name, getlink=True)
    if link is None:
        w.fail(where, f"is missing: a damaged policy file (expected a {what})")
    if not isinstance(link, h5py.HardLink):
        w.fail(where, f"is a {type(link).__name__}; expected a {what} stored in the file itself "
                      "(smdp-batch never follows links to other objects or files)")
    obj = g.get(name)
    if not isinstance(obj, kind):
        w.fail(where, f"is a {type(obj).__name__}; expected a {what}")
    return obj


def _dataset(w: _Where, g, name: str, kind: str, length: int | tuple, expect: str):
    """Read dataset ``name`` of ``g`` after checking from its metadata that it is a plain array of
    shape ``length`` (an int: 1-D) of ints (``kind="int"``) or float64s stored in this file with known filters."""
    d = _child(w, g, name, h5py.Dataset)
    where = d.name
    shape = (length,) if isinstance(length, int) else tuple(length)
    want = f"expected {'integers' if kind == 'int' else 'float64'} of shape {shape} ({expect})"
    if d.is_virtual or d.external:
        w.fail(where, "keeps its data in other files; expected data stored in the file itself")
    dt = d.dtype
    plain = dt.names is None and dt.subdtype is None and h5py.check_string_dtype(dt) is None \
        and h5py.check_vlen_dtype(dt) is None and h5py.check_enum_dtype(dt) is None
    ok_kind = dt.kind in "iu" and dt.itemsize <= 8 if kind == "int" else dt.kind == "f" and dt.itemsize == 8
    if not (plain and ok_kind):
        w.fail(where, f"has dtype {dt}; {want}")
    if d.shape != shape:
        w.fail(where, f"has shape {d.shape}; {want}")
    checksummed = False
    if d.chunks is not None:
        if int(np.prod(d.chunks, dtype=np.int64)) * dt.itemsize > MAX_CHUNK_BYTES:
            w.fail(where, f"declares chunks of shape {d.chunks}; expected chunks of at most {MAX_CHUNK_BYTES >> 20} MiB")
        plist = d.id.get_create_plist()
        for i in range(plist.get_nfilters()):
            code = plist.get_filter(i)[0]
            if code not in _ALLOWED_FILTERS:
                w.fail(where, f"uses HDF5 filter {code}; expected only deflate, shuffle, lzf or fletcher32")
            checksummed |= code == h5py.h5z.FILTER_FLETCHER32
    try:
        a = d[()]
    except OSError as e:  # HDF5 reports a fletcher32 mismatch as a filter failure
        if checksummed or "checksum" in str(e).lower():
            w.fail("", f"checksum mismatch in {where}: the file is damaged")
        w.fail(where, f"cannot be read ({' '.join(str(e).split())}): the file is damaged")
    return np.asarray(a), checksummed


_MISSING = object()


def _attr(w: _Where, g, name: str, kind: str, default=_MISSING, *, low=None, high=None, low_open=False,
          nan_is_none=False):
    """Attribute ``name`` of ``g`` checked before and after reading: ``kind`` is "float" (finite, or
    None for NaN with ``nan_is_none``), "int", "bool" or "str"; ``low``/``high`` bound numbers."""
    where = f"{g.name.rstrip('/')}@{name}"
    if name not in g.attrs:
        if default is _MISSING:
            w.fail(where, "is missing: a damaged policy file")
        return default
    aid = g.attrs.get_id(name)
    dt = aid.dtype
    want = {"float": "a number", "int": "an integer", "bool": "a boolean", "str": "a string"}[kind]
    if aid.shape != ():
        w.fail(where, f"has shape {aid.shape}; expected a scalar ({want})")
    is_str = h5py.check_string_dtype(dt) is not None
    if kind == "str":
        if not is_str or (h5py.check_string_dtype(dt).length or 0) > MAX_TEXT:
            w.fail(where, f"has dtype {dt}; expected {want}")
        v = g.attrs[name]
        if isinstance(v, bytes):
            try:
                v = v.decode()
            except UnicodeDecodeError:
                w.fail(where, "is not UTF-8 text")
        if not isinstance(v, str) or len(v) > MAX_TEXT:
            w.fail(where, f"is not a string of at most {MAX_TEXT} characters")
        return v
    plain = not is_str and dt.names is None and dt.subdtype is None and h5py.check_vlen_dtype(dt) is None
    ok = {"float": "iuf", "int": "iu", "bool": "biu"}[kind]
    if not (plain and dt.kind in ok and (dt.kind == "b" or h5py.check_enum_dtype(dt) is None)):
        w.fail(where, f"has dtype {dt}; expected {want}")
    v = g.attrs[name].item()
    if kind == "bool":
        if v not in (0, 1):
            w.fail(where, f"= {v!r}; expected a boolean")
        return bool(v)
    if kind == "float":
        v = float(v)
        if not math.isfinite(v):
            if nan_is_none and math.isnan(v):
                return None
            w.fail(where, f"= {v!r}; expected a finite number")
    else:
        v = int(v)
    if low is not None and (v <= low if low_open else v < low):
        w.fail(where, f"= {v!r}; expected {'>' if low_open else '≥'} {low}")
    if high is not None and v > high:
        w.fail(where, f"= {v!r}; expected ≤ {high}")
    return v


# ------------------------------------------------------------------------------------------ reading
_META_TEXT = ("creator", "created", "units_time", "units_energy", "units_power", "units_rate")


def _open(path: str, fmt: str, versions: tuple[int, ...] = (SCHEMA_VERSION,)):
    """Open an smdp-batch HDF5 file and check its format and schema version (one of ``versions``)."""
    if not os.path.isfile(path):
        if os.path.exists(path):
            raise PolicyFileError(f"policy file {path!r} is not a regular file (a directory, FIFO or device); "
                                  "expected an HDF5 file written by smdp-batch")
        raise PolicyFileError(f"policy file {path!r} does not exist")
    try:
        f = h5py.File(path, "r")
    except OSError:
        raise PolicyFileError(f"{path!r} is not an HDF5 file (expected a {fmt} file written by smdp-batch)") from None
    try:
        w = _Where(path)
        names = {FORMAT: "smdp-batch policy table", BANK_FORMAT: "smdp-batch policy bank"}
        hint = {FORMAT: "; it is a policy table (use read_policy / PolicyTable.load)",
                BANK_FORMAT: "; it is a policy bank (use read_bank / PolicyBank.load)"}
        try:
            got = _attr(w, f, "format", "str", None)
        except PolicyFileError:
            got = "?"
        if got != fmt:
            raise PolicyFileError(
                f"{path!r} is not a {names[fmt]} (format={got!r}, expected {fmt!r}){hint.get(got, '')}")
        if "schema_version" in f.attrs and f.attrs.get_id("schema_version").dtype.kind not in "iu":
            version = "?"
        else:
            version = _attr(w, f, "schema_version", "int", None)
        if version == PHASE_SCHEMA_VERSION and fmt == FORMAT and PHASE_SCHEMA_VERSION not in versions:
            raise PolicyFileError(
                f"{path!r} is a phase table (schema_version=2: a policy per queue length and MAP phase); "
                "a one-column reader cannot serve it: load it with PhasePolicy.load or run it with "
                "`smdp-batch simulate --policy FILE`")
        if not isinstance(version, int) or version < 1 or version > PHASE_SCHEMA_VERSION:
            raise PolicyFileError(
                f"{path!r} has schema_version={version!r}; this smdp-batch reads versions 1..{PHASE_SCHEMA_VERSION} "
                "(upgrade smdp-batch to read newer tables)"
            )
        if version not in versions:
            raise PolicyFileError(f"{path!r} has schema_version={version!r}; expected a version-1 policy table")
        meta = {"format": got, "schema_version": version}
        for k in _META_TEXT:
            v = _attr(w, f, k, "str", None)
            if v is not None:
                meta[k] = v[:256]
    except BaseException:
        f.close()
        raise
    return f, meta


def _s_max(w: _Where, g) -> int:
    """The table's recorded truncation s_max (old files: smax), checked before any dataset is read."""
    t = _child(w, g, "truncation", h5py.Group)
    name = "s_max" if "s_max" in t.attrs or "smax" not in t.attrs else "smax"
    return _attr(w, t, name, "int", low=1, high=MAX_S_MAX)


def _load_inputs(w: _Where, g, s_max: int):
    """The /inputs group: (inputs dict with the arrays, sizes, latency, energy, all checksummed?)."""
    gi = _child(w, g, "inputs", h5py.Group)
    gt = _child(w, g, "truncation", h5py.Group)

    # inputs: the batch-size set first (its length bounds the per-size curves)
    bs = _child(w, gi, "batch_sizes", h5py.Dataset)
    nb = bs.shape[0] if bs.shape is not None and len(bs.shape) == 1 and bs.shape[0] <= MAX_BATCH_SIZES else -1
    if nb < 1:
        w.fail(bs.name, f"has shape {bs.shape}; expected integers of shape (B,), 1 ≤ B ≤ {MAX_BATCH_SIZES}")
    sizes, c1 = _dataset(w, gi, "batch_sizes", "int", nb, "the allowed batch sizes")
    sizes = sizes.astype(np.int64)
    if sizes[0] < 1 or np.any(np.diff(sizes) <= 0):
        w.fail(bs.name, f"= {sizes[:8].tolist()}{'…' if nb > 8 else ''}; expected batch sizes ≥ 1, strictly increasing")
    bmax = int(sizes[-1])
    if s_max < bmax and _attr(w, gt, "boundary", "str", None) != "tail":  # a tail-boundary table may end below Bmax
        w.fail(f"{gt.name}@s_max", f"= {s_max}; expected ≥ Bmax = {bmax} (eq. 19's S_o; only a tail-boundary table "
               "may be shorter)")
    lat, c2 = _dataset(w, gi, "latency_ms", "float", nb, "l(b) in ms per batch size")
    en, c3 = _dataset(w, gi, "energy_mj", "float", nb, "ζ(b) in mJ per batch size")
    if not (np.all(np.isfinite(lat)) and np.all(lat > 0)):
        w.fail(f"{gi.name}/latency_ms", "has a value that is not finite and > 0; expected l(b) > 0 ms")
    if not (np.all(np.isfinite(en)) and np.all(en >= 0)):
        w.fail(f"{gi.name}/energy_mj", "has a value that is not finite and ≥ 0; expected ζ(b) ≥ 0 mJ")
    inputs = {
        "lam": _attr(w, gi, "lam", "float", low=0, low_open=True),
        "rho": _attr(w, gi, "rho", "float", low=0, low_open=True),
        "w1": _attr(w, gi, "w1", "float", low=0),
        "w2": _attr(w, gi, "w2", "float", low=0),
        "service": _attr(w, gi, "service", "str"),
        "latency": _attr(w, gi, "latency", "str"),
        "energy": _attr(w, gi, "energy", "str"),
    }
    cont = None
    if "instances" in gi.attrs:  # a c-server table: solved for that many instances sharing the queue
        inputs["instances"] = _attr(w, gi, "instances", "int", low=1, high=MAX_INSTANCES)
        inputs["idle_power_w"] = _attr(w, gi, "idle_power_w", "float", low=0)
        model = _attr(w, gi, "batch_time_model", "str", None)
        if model is not None:
            inputs["batch_time_model"] = model[:200]
        phases = _attr(w, gi, "phases", "int", None, low=1, high=64)
        if phases is not None:
            inputs["phases"] = phases
        spec = _attr(w, gi, "contention", "str", None)
        if spec is not None:
            try:
                cont = parse_contention(spec)
                if cont is None:
                    raise InputError("names no contention")
                cont.check(inputs["instances"])
            except InputError as e:
                w.fail(f"{gi.name}@contention", f"is not a contention for its instances: {e}")
            inputs["contention"] = cont.spec()
    c = inputs.get("instances", 1)
    if not inputs["rho"] < 1:
        w.fail(f"{gi.name}@rho", f"= {inputs['rho']!r}; expected ρ in (0, 1)")
    slow = float(cont.slow(c, bmax)) if cont is not None else 1.0
    rho = inputs["lam"] * float(lat[-1]) * slow / (c * bmax)
    if not math.isclose(rho, inputs["rho"], rel_tol=1e-6):
        per = "/(c·Bmax)" if c > 1 else "/Bmax"
        per = f"·s_c{per}" if slow != 1.0 else per
        w.fail(f"{gi.name}@rho", f"= {inputs['rho']!r} disagrees with λ·l(Bmax){per} = {rho!r}")
    inputs.update(batch_sizes=sizes, latency_ms=lat, energy_mj=en)
    return inputs, sizes, lat, en, bool(c1 and c2 and c3)


def _load_truncation(w: _Where, gt, s_max: int) -> dict:
    truncation = {
        "s_max": s_max,
        "s_max_auto": _attr(w, gt, "s_max_auto" if "s_max_auto" in gt.attrs else "smax_auto", "bool", None),
        "abstract_cost": _attr(w, gt, "abstract_cost", "float", low=0),
        "delta": _attr(w, gt, "delta", "float", low=0),
        "tol_delta": _attr(w, gt, "tol_delta", "float", None, low=0),
        "s_max_rule": _attr(w, gt, "s_max_rule", "str", None),
        "converged_upto": _attr(w, gt, "converged_upto", "int", None, low=-1, high=s_max),
        "boundary": _attr(w, gt, "boundary", "str", None),
        "verified_against": _attr(w, gt, "verified_against", "int", None, low=0, high=s_max),
    }
    if truncation["s_max_rule"] is not None and truncation["s_max_rule"] not in ("auto", "minimal", "fixed"):
        w.fail(f"{gt.name}@s_max_rule", f"= {truncation['s_max_rule'][:40]!r}; expected auto, minimal or fixed")
    if truncation["boundary"] is not None and truncation["boundary"] not in ("tail", "overflow"):
        w.fail(f"{gt.name}@boundary", f"= {truncation['boundary'][:40]!r}; expected tail or overflow")
    if truncation["converged_upto"] == -1:
        truncation["converged_upto"] = None  # written, but not verified
    return {k: v for k, v in truncation.items() if v is not None}


def _check_decisions(w: _Where, where: str, policy: np.ndarray, sizes: np.ndarray, s_max: int, sizes_name: str) -> None:
    """A table's decisions (queue length on the first axis; a phase table has a column per phase): each 0 or an
    allowed size, at most n at queue length n, and serving at s_max (eq. 30 repeats that row for ever)."""
    n = s_max + 2
    bad = ~(np.isin(policy, sizes) | (policy == 0))
    if bad.any():
        at = tuple(int(x) for x in np.argwhere(bad)[0])
        w.fail(f"{where}[{','.join(map(str, at))}]", f"= {int(policy[at])}; expected 0 (wait) or a batch size of {sizes_name}")
    over = policy[:-1] > np.arange(n - 1).reshape((-1,) + (1,) * (policy.ndim - 1))
    if over.any():
        at = tuple(int(x) for x in np.argwhere(over)[0])
        w.fail(f"{where}[{','.join(map(str, at))}]", f"= {int(policy[at])}; a table serves at most n requests at queue length n")
    if np.any(policy[s_max] == 0):
        w.fail(where, f"waits at its top queue length s_max = {s_max}{' in some phase' if policy.ndim > 1 else ''}; "
                      "by eq. 30 it would never serve a long queue")


def _load_table(w: _Where, g, meta: dict) -> PolicyFile:
    gi = _child(w, g, "inputs", h5py.Group)
    gt = _child(w, g, "truncation", h5py.Group)
    gs = _child(w, g, "solution", h5py.Group)
    s_max = _s_max(w, g)
    n = s_max + 2
    inputs, sizes, lat, en, c1 = _load_inputs(w, g, s_max)
    truncation = _load_truncation(w, gt, s_max)

    policy, c4 = _dataset(w, g, "policy", "int", n, f"s_max + 2 = {n} batch sizes, s_max from {gt.name}")
    policy = policy.astype(np.int64)
    _check_decisions(w, f"{g.name.rstrip('/')}/policy", policy, sizes, s_max, f"{gi.name}/batch_sizes")

    rv, c5 = _dataset(w, gs, "relative_values", "float", n, f"s_max + 2 = {n} values")
    if np.isnan(rv).any():
        w.fail(f"{gs.name}/relative_values", "holds NaN; expected numbers")
    solution = {
        "avg_cost": _attr(w, gs, "avg_cost", "float"),
        "solver": _attr(w, gs, "solver", "str")[:64],
        "iterations": _attr(w, gs, "iterations", "int", low=0),
        "converged": _attr(w, gs, "converged", "bool"),
        "eps": _attr(w, gs, "eps", "float", None, nan_is_none=True, low=0),
        "eta": _attr(w, gs, "eta", "float", None, nan_is_none=True, low=0),
        "span": _attr(w, gs, "span", "float", None, nan_is_none=True),
        "gain_lo": _attr(w, gs, "gain_lo", "float", None, nan_is_none=True),
        "gain_hi": _attr(w, gs, "gain_hi", "float", None, nan_is_none=True),
        "mean_latency_ms": _attr(w, gs, "mean_latency_ms", "float", low=0),
        "mean_power_w": _attr(w, gs, "mean_power_w", "float", low=0),
        "throughput": _attr(w, gs, "throughput", "float", None, low=0),
        "mean_batch_size": _attr(w, gs, "mean_batch_size", "float", None, low=0),
        "objective": _attr(w, gs, "objective", "float", None),
        "control_limit": _attr(w, gs, "control_limit", "int", None, low=-1, high=s_max + 1),
        "solve_seconds": _attr(w, gs, "solve_seconds", "float", None, low=0),
        "busy_avg_cost": _attr(w, gs, "busy_avg_cost", "float", None),  # a c-server table's busy-aware rows'
        "busy_mean_latency_ms": _attr(w, gs, "busy_mean_latency_ms", "float", None, low=0),
        "busy_mean_power_w": _attr(w, gs, "busy_mean_power_w", "float", None, low=0),
    }
    solution = {k: v for k, v in solution.items() if v is not None or k in ("eps", "eta")}
    solution["relative_values"] = rv

    busy, c6 = _busy_rows(w, g, inputs, sizes, s_max, f"{gi.name}/batch_sizes")
    integrity = "none"
    digest = _attr(w, g, "content_sha256", "str", None)
    if digest is None and "instances" in inputs:  # every c-server table was written with its digest
        w.fail("", f"{g.name} is a table for {inputs['instances']} instances without content_sha256: every such "
                   "file is written with one, so this one was altered")
    if digest is not None:
        if digest != table_digest(policy, sizes, lat, en, rv, inputs, s_max, busy):
            w.fail("", f"content checksum mismatch in {g.name} (content_sha256): the file is damaged")
        integrity = "sha256"
    if c1 and c4 and c5 and c6:
        integrity = "fletcher32" if integrity == "none" else "fletcher32+sha256"
    return PolicyFile(policy, inputs, truncation, solution, meta, w.path, integrity, busy)


def _busy_rows(w: _Where, g, inputs: dict, sizes: np.ndarray, s_max: int,
               sizes_name: str) -> tuple[np.ndarray | None, bool]:
    """A c-server table's busy-aware rows ``/policy_busy`` (c, s_max + 2), checked as tables; (None, True) where
    there are none."""
    if g.get("policy_busy", getlink=True) is None:
        return None, True
    c = int(inputs.get("instances", 1))
    where = f"{g.name.rstrip('/')}/policy_busy"
    if c < 2:
        w.fail(where, "is in a one-instance table; busy-aware rows belong to a table of several instances")
    if c * (s_max + 2) > MAX_BUSY_VALUES:  # each factor is bounded; their product is bounded before any read
        w.fail(where, f"declares {c} rows of s_max + 2 = {s_max + 2} values ({c * (s_max + 2)}); at most "
                      f"{MAX_BUSY_VALUES} are read")
    busy, checked = _dataset(w, g, "policy_busy", "int", (c, s_max + 2),
                             f"one row per busy count 0..{c - 1}, each s_max + 2 batch sizes")
    busy = busy.astype(np.int64)
    for k in range(c):
        _check_decisions(w, f"{where}[{k}]", busy[k], sizes, s_max, sizes_name)
    return busy, checked


def _guarded(path: str, read):
    """Run ``read`` with any low-level failure of a hostile file turned into one PolicyFileError."""
    try:
        return read()
    except PolicyFileError:
        raise
    except (OSError, KeyError, ValueError, TypeError, RuntimeError, AttributeError, IndexError) as e:
        msg = " ".join(str(e).split())[:200]
        raise PolicyFileError(f"{path!r} cannot be read ({type(e).__name__}: {msg}): a damaged policy file") from None


def read_policy(path: str | os.PathLike) -> PolicyFile:
    """Load and validate a policy table; refuses other formats, newer schema versions and damaged files."""
    path = str(path)
    f, meta = _guarded(path, lambda: _open(path, FORMAT))
    with f:
        return _guarded(path, lambda: _load_table(_Where(path), f, meta))


def _read_bank(w: _Where, f, meta: dict) -> list[PolicyFile]:
    tg = _child(w, f, "tables", h5py.Group)
    keys = list(tg.keys()) if len(tg) <= MAX_BANK_TABLES else None
    if not keys or not all(k.isdigit() and k.isascii() for k in keys):
        w.fail("/tables", f"holds {len(tg)} members; expected 1..{MAX_BANK_TABLES} tables named 000, 001, …")
    keys.sort(key=int)
    groups = [_child(w, tg, k, h5py.Group) for k in keys]
    states = sum(_s_max(w, g) + 2 for g in groups)  # bound the total before reading any table
    if states > MAX_BANK_STATES:
        w.fail("/tables", f"declare {states} states in all; expected at most {MAX_BANK_STATES}")
    lams, _ = _dataset(w, f, "lams", "float", len(keys), "one arrival rate per table")
    if not (np.all(np.isfinite(lams)) and np.all(lams > 0) and np.all(np.diff(lams) > 0)):
        w.fail("/lams", f"= {lams[:8].tolist()}; expected finite rates > 0, strictly increasing")
    tables = [_load_table(w, g, meta) for g in groups]
    table_lams = np.array([t.inputs["lam"] for t in tables])
    if not np.array_equal(table_lams, lams):
        w.fail("/lams", "disagrees with the λ recorded in the tables (/tables/NNN/inputs@lam)")
    return tables


def read_bank(path: str | os.PathLike) -> list[PolicyFile]:
    """Load and validate a policy bank: its tables, λ strictly ascending."""
    path = str(path)
    f, meta = _guarded(path, lambda: _open(path, BANK_FORMAT))
    with f:
        return _guarded(path, lambda: _read_bank(_Where(path), f, meta))
