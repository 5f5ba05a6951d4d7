"""Reading a MAP from a JSON file (``--arrivals map:FILE.json``), trusting nothing in it.

Two spellings: ``{"D0": [[…]], "D1": [[…]]}`` (rates in 1/ms) or an MMPP as
``{"rates": […], "generator": [[…]]}`` (what ``fit-arrivals`` writes; other keys such as ``"fit"`` are
ignored).  The file must be a regular file of at most :data:`~smdp_batch.limits.MAP_FILE_BYTES_LIMIT`
bytes (a device, FIFO or directory is refused before it is read: it is opened non-blocking and checked
again after opening), UTF-8 JSON nested at most :data:`~smdp_batch.limits.JSON_DEPTH_LIMIT` deep, with no
NaN/Infinity and no repeated keys.  Each matrix must be a list of equal-length rows of JSON numbers
(``true``, ``null``, strings and objects are refused), square, at most ``PHASE_LIMIT`` phases; D0's
diagonal must be negative and a generator's rows must sum to 0.  The MAP rules themselves (signs, row
sums, irreducibility, rate range) are :func:`~smdp_batch.specs.mapcheck.check_map`'s.  Every refusal
is one :class:`~smdp_batch.errors.InputError` line naming the file and the value.
"""

from __future__ import annotations

import json
import math
import os
import re
import stat

import numpy as np

from ..errors import InputError
from ..limits import JSON_DEPTH_LIMIT, MAP_FILE_BYTES_LIMIT
from ..specs.mapcheck import PHASE_LIMIT

__all__ = ["check_generator", "load_map_json", "numbers_only"]

#: Tolerance of a generator's row sums, relative to the row's largest rate.
ROW_SUM_TOL = 1e-9

#: A JSON string, or an unterminated one up to the end (with a lone trailing backslash): every quote it starts
#: at matches at once, so the scan is linear (a pattern that must find the closing quote backtracks from each
#: quote of an unterminated string to the end: quadratic).
_STRING = re.compile(rb'"(?:[^"\\]+|\\.)*(?:"|\\?\Z)', re.S)


class _Refuse(Exception):
    """A problem found while parsing (raised from json's hooks, turned into an InputError)."""


def _read_bytes(path: str) -> bytes:
    """At most MAP_FILE_BYTES_LIMIT bytes of a regular file, never blocking on a FIFO or reading a device."""
    what = f"MAP file {path!r}"
    try:
        st = os.stat(path)
    except OSError as e:
        raise InputError(f"cannot read {what}: {e.strerror or e}") from None
    if not stat.S_ISREG(st.st_mode):
        raise InputError(f"{what} is not a regular file ({_kind(st.st_mode)}); a JSON file is expected")
    if st.st_size > MAP_FILE_BYTES_LIMIT:
        raise InputError(f"{what} has {st.st_size} bytes; a MAP file has at most {MAP_FILE_BYTES_LIMIT}")
    flags = os.O_RDONLY | getattr(os, "O_NONBLOCK", 0) | getattr(os, "O_NOCTTY", 0) | getattr(os, "O_CLOEXEC", 0)
    try:
        fd = os.open(path, flags)
    except OSError as e:
        raise InputError(f"cannot read {what}: {e.strerror or e}") from None
    try:
        st = os.fstat(fd)  # the path may have been swapped for a FIFO or a device since the stat above
        if not stat.S_ISREG(st.st_mode):
            raise InputError(f"{what} is not a regular file ({_kind(st.st_mode)}); a JSON file is expected")
        chunks, size = [], 0
        while size <= MAP_FILE_BYTES_LIMIT:
            b = os.read(fd, min(1 << 20, MAP_FILE_BYTES_LIMIT + 1 - size))
            if not b:
                break
            chunks.append(b)
            size += len(b)
    except OSError as e:
        raise InputError(f"cannot read {what}: {e.strerror or e}") from None
    finally:
        os.close(fd)
    if size > MAP_FILE_BYTES_LIMIT:
        raise InputError(f"{what} has more than {MAP_FILE_BYTES_LIMIT} bytes; a MAP file has at most that")
    return b"".join(chunks)


def _kind(mode: int) -> str:
    for test, name in ((stat.S_ISDIR, "a directory"), (stat.S_ISFIFO, "a FIFO"), (stat.S_ISCHR, "a character device"),
                       (stat.S_ISBLK, "a block device"), (stat.S_ISSOCK, "a socket")):
        if test(mode):
            return name
    return "not a plain file"


def _depth(data: bytes) -> int:
    """Deepest nesting of [ and { outside JSON strings (linear, no recursion)."""
    bare = np.frombuffer(_STRING.sub(b'""', data), dtype=np.uint8)
    step = ((bare == ord("[")) | (bare == ord("{"))).astype(np.int32) - ((bare == ord("]")) | (bare == ord("}")))
    return int(np.cumsum(step).max(initial=0))


def _constant(name: str):
    raise _Refuse(f"{name} is not a number a MAP may hold; give finite rates")


def _pairs(pairs):
    seen = {}
    for k, v in pairs:
        if k in seen:
            raise _Refuse(f"key {k[:40]!r} appears twice in one object")
        seen[k] = v
    return seen


def _parse(path: str):
    data = _read_bytes(path)
    what = f"MAP file {path!r}"
    d = _depth(data)
    if d > JSON_DEPTH_LIMIT:
        raise InputError(f"{what} nests arrays/objects {d} deep; at most {JSON_DEPTH_LIMIT} (a matrix is a list of rows)")
    try:
        text = data.decode("utf-8-sig")
    except UnicodeDecodeError as e:
        raise InputError(f"{what} is not UTF-8 text (byte {e.start}); a JSON file is expected") from None
    try:
        return json.loads(text, parse_constant=_constant, object_pairs_hook=_pairs)
    except _Refuse as e:
        raise InputError(f"{what}: {e}") from None
    except json.JSONDecodeError as e:
        raise InputError(f"{what} is not valid JSON: {e}") from None
    except (ValueError, RecursionError, MemoryError) as e:  # huge integers; nesting (bounded above anyway)
        raise InputError(f"{what} is not readable JSON: {' '.join(str(e).split())[:120]}") from None


def _type(x) -> str:
    if x is None:
        return "null"
    if isinstance(x, bool):
        return "true" if x else "false"
    if isinstance(x, (int, float)):
        return "a number"
    names: dict[type, str] = {str: "a string", dict: "an object", list: "a list"}
    return names.get(type(x), type(x).__name__)


def _number(x, where: str) -> float:
    if isinstance(x, bool) or not isinstance(x, (int, float)):
        raise _Refuse(f"{where} is {_type(x)}; expected a number (a rate in 1/ms)")
    try:
        v = float(x)
    except OverflowError:
        v = math.inf
    if not math.isfinite(v):
        raise _Refuse(f"{where} = {str(x)[:24]} is not a finite number")
    return v


def _vector(x, name: str, size: int | None = None) -> np.ndarray:
    if not isinstance(x, list):
        raise _Refuse(f"{name} is {_type(x)}; expected a list of numbers, one per phase")
    if not 1 <= len(x) <= PHASE_LIMIT:
        raise _Refuse(f"{name} has {len(x)} entries; expected 1..{PHASE_LIMIT} (one per phase)")
    if size is not None and len(x) != size:
        raise _Refuse(f"{name} has {len(x)} entries; expected {size} (one per phase)")
    return np.array([_number(v, f"{name}[{i}]") for i, v in enumerate(x)], dtype=np.float64)


def _square(x, name: str, size: int | None = None) -> np.ndarray:
    """A JSON matrix: a list of 1..PHASE_LIMIT rows, each a list of as many numbers as there are rows."""
    if not isinstance(x, list):
        raise _Refuse(f"{name} is {_type(x)}; expected a square matrix, a list of rows of numbers")
    m = len(x)
    if not 1 <= m <= PHASE_LIMIT:
        raise _Refuse(f"{name} has {m} rows; expected 1..{PHASE_LIMIT} (one per phase)")
    if size is not None and m != size:
        raise _Refuse(f"{name} has {m} rows; expected {size}, as many as the other matrix")
    for i, row in enumerate(x):
        if not isinstance(row, list):
            raise _Refuse(f"{name}[{i}] is {_type(row)}; expected a row, a list of {m} numbers")
        if len(row) != m:
            raise _Refuse(f"{name}[{i}] has {len(row)} entries; expected {m} (a square matrix: one per phase)")
    return np.array([[_number(v, f"{name}[{i}][{j}]") for j, v in enumerate(row)] for i, row in enumerate(x)])


def load_map_json(path: str) -> tuple[str, np.ndarray, np.ndarray]:
    """("map", D0, D1) or ("mmpp", rates, generator) from a MAP JSON file, checked as the module says."""
    path = str(path)
    data = _parse(path)
    what = f"MAP file {path!r}"
    if not isinstance(data, dict):
        raise InputError(f"{what} holds {_type(data)}; expected a JSON object with D0 and D1 (or rates and generator)")
    has_map, has_mmpp = "D0" in data or "D1" in data, "rates" in data or "generator" in data
    if has_map and has_mmpp:
        raise InputError(f"{what} has both D0/D1 and rates/generator; give one MAP")
    try:
        if has_map:
            if "D0" not in data or "D1" not in data:
                raise _Refuse(f"needs both D0 and D1; found only {'D0' if 'D0' in data else 'D1'}")
            D0 = _square(data["D0"], "D0")
            D1 = _square(data["D1"], "D1", D0.shape[0])
            diag = np.diag(D0)
            if np.any(diag >= 0):
                i = int(np.nonzero(diag >= 0)[0][0])
                raise _Refuse(f"D0[{i}][{i}] = {float(diag[i])!r} must be < 0 (minus the total rate of events in phase {i})")
            return "map", D0, D1
        if has_mmpp:
            if "rates" not in data or "generator" not in data:
                raise _Refuse(f"needs both rates and generator; found only {'rates' if 'rates' in data else 'generator'}")
            Q = _square(data["generator"], "generator")
            lam = _vector(data["rates"], "rates", Q.shape[0])
            check_generator(Q, "generator")
            return "mmpp", lam, Q
    except (_Refuse, InputError) as e:
        raise InputError(f"{what}: {e}") from None
    raise InputError(f"{what} needs keys D0 and D1, or rates and generator; found {sorted(map(str, data))[:6]}")


def check_generator(Q: np.ndarray, name: str) -> None:
    """Off-diagonal entries ≥ 0, diagonal ≤ 0 and each row summing to 0 (within ROW_SUM_TOL of its largest rate)."""
    m = Q.shape[0]
    off = Q - np.diag(np.diag(Q))
    for i in range(m):
        for j in range(m):
            if i != j and Q[i, j] < 0:
                raise InputError(f"{name}[{i}][{j}] = {float(Q[i, j])!r} must be ≥ 0 (a switching rate)")
        want = -off[i].sum()
        if abs(Q[i, i] - want) > ROW_SUM_TOL * max(abs(want), abs(Q[i, i])):
            raise InputError(f"{name}[{i}][{i}] = {float(Q[i, i])!r} must be {float(want)!r}, minus the row's other rates "
                          "(a generator's rows sum to 0)")


def numbers_only(x, name: str):
    """``x`` itself, after refusing what numpy would quietly turn into numbers: booleans, strings, None and
    objects, in an array or in (nested, at most 2 levels) lists and tuples.  Shapes are checked later."""
    if isinstance(x, np.ndarray):
        if x.dtype.kind not in "iuf":
            raise InputError(f"{name} must hold numbers, got an array of dtype {x.dtype}")
        return x
    stack = [(x, name, 0)]
    while stack:
        v, where, depth = stack.pop()
        if isinstance(v, (list, tuple)):
            if depth >= 2:
                raise InputError(f"{where} is nested too deeply; {name} is a list of rows of numbers")
            stack.extend((e, f"{where}[{i}]", depth + 1) for i, e in enumerate(v[: PHASE_LIMIT + 1]))
        elif isinstance(v, np.ndarray) and v.dtype.kind in "iuf" and v.ndim <= 2 - depth:
            continue
        elif isinstance(v, (bool, np.bool_)) or not isinstance(v, (int, float, np.integer, np.floating)):
            raise InputError(f"{where} is {_type(v)}; {name} must hold numbers (rates in 1/ms)")
    return x
