"""Click parameter types shared by every command: numbers with ranges, comma grids, choices, paths.

Each type turns a bad value into :class:`OneLineError`, whose message names the option, the value
and what is valid (``--requests must be ≥ 100, got '10'``); ``main`` prints it as the one line
``smdp-batch: error: …``.  Domain checks that need the whole problem (ρ < 1, Bmin ≤ Bmax, s_max ≥
Bmax) stay with the model and the solvers.
"""

from __future__ import annotations

import math
import re

import click

from ..errors import InputError
from ..limits import GRID_LIMIT, STATE_LIMIT

__all__ = ["Option", "option", "OneLineError", "Number", "Duration", "Seconds", "Power", "Rate", "Headroom", "Grid",
           "OneOf", "SMax", "SloWithin", "SloBound", "Range", "Rates", "OutputPath", "OutputDir", "FigurePath",
           "check_extension", "InputFile"]


class OneLineError(click.BadParameter):
    """A bad option value whose message already says everything (no "Invalid value for" prefix)."""

    def format_message(self) -> str:
        return self.message


def _flag(param) -> str:
    """The option as the user knows it: its long spelling (or its metavar for an argument)."""
    if param is None:
        return "value"
    longs = [o for o in getattr(param, "opts", []) if o.startswith("--")]
    if longs:
        return longs[0]
    if getattr(param, "param_type_name", "") == "argument":
        return param.human_readable_name
    return param.opts[0] if param.opts else param.name


INT_MAX = 2**63 - 1


def _short(text: str) -> str:
    """A value for an error line: repr, cut to 60 characters."""
    r = repr(text)
    return r if len(r) <= 60 else r[:50] + f"…' ({len(text)} characters)"


def _fmt(x) -> str:
    return f"{x:g}" if isinstance(x, float) else str(x)


class _Type(click.ParamType):
    """Base: ``parse(text, flag)`` raises InputError; ``convert`` turns it into a OneLineError."""

    def parse(self, text: str, flag: str):  # pragma: no cover - abstract
        raise NotImplementedError

    def convert(self, value, param, ctx):
        if not isinstance(value, str):
            return value  # a default that is already converted
        try:
            return self.parse(value, _flag(param))
        except InputError as e:
            raise OneLineError(str(e), ctx=ctx, param=param) from None


class Number(_Type):
    """A finite float (or an int) with optional bounds: ``Number(min=0, min_open=True)``."""

    def __init__(self, *, integer: bool = False, min=None, max=None, min_open: bool = False, zero_ok: bool = False):
        self.integer, self.min, self.max, self.min_open, self.zero_ok = integer, min, max, min_open, zero_ok
        self.name = "integer" if integer else "number"

    def get_metavar(self, param, ctx=None) -> str:
        return "INT" if self.integer else "X"

    def parse_one(self, text: str, flag: str, what: str = ""):
        label = f"{flag}{what}"
        try:
            v = int(text) if self.integer else float(text)
        except (TypeError, ValueError):
            raise InputError(f"{label} must be {'an integer' if self.integer else 'a number'}, got {_short(text)}") from None
        if not self.integer and not math.isfinite(v):
            raise InputError(f"{label} must be finite, got {_short(text)}")
        if self.integer and abs(v) > INT_MAX and self.max is None:
            raise InputError(f"{label} must be an integer of magnitude ≤ 2^63 − 1, got {_short(text)}")
        if self.zero_ok and v == 0:
            return v
        low_bad = self.min is not None and (v <= self.min if self.min_open else v < self.min)
        if low_bad:  # name the bound that was crossed (the lower one alone, as before upper bounds existed)
            bound = f"{'>' if self.min_open else '≥'} {_fmt(self.min)}"
            raise InputError(f"{label} must be {'0 or ' if self.zero_ok else ''}{bound}, got {_short(text)}")
        if self.max is not None and v > self.max:
            raise InputError(f"{label} must be ≤ {_fmt(self.max)} (the limit for this option), got {_short(text)}")
        return v

    def _range(self) -> str:
        parts = []
        if self.zero_ok:
            parts.append("0 or")
        if self.min is not None:
            parts.append(f"{'>' if self.min_open else '≥'} {_fmt(self.min)}")
        if self.max is not None:
            parts.append(f"{'and ' if self.min is not None else ''}≤ {_fmt(self.max)}")
        return " ".join(parts)

    def parse(self, text: str, flag: str):
        return self.parse_one(text, flag)


class _WithUnit(Number):
    """A number in the option's unit (``kind`` of :func:`~smdp_batch.model.units.quantity`, in its base unit divided
    by ``per``) that may carry a unit of its own; a bound crossed is named with the text as given."""

    kind, per, metavar = "time", 1.0, "MS"
    units: tuple[str, str] | None = None  # (the units' text of the quantity's messages, this option's)

    def get_metavar(self, param, ctx=None) -> str:
        return self.metavar

    def parse_one(self, text: str, flag: str, what: str = ""):
        from ..model.units import quantity

        t = str(text).strip()
        try:
            float(t)
        except ValueError:  # 20ms, 0.02s, 8W → the option's unit; a wrong unit is named there
            try:
                converted = repr(quantity(t, self.kind, f"{flag}{what}") / self.per)
            except InputError as e:
                raise InputError(str(e).replace(*self.units) if self.units else str(e)) from None
            try:
                return super().parse_one(converted, flag, what)
            except InputError as e:
                raise InputError(str(e).replace(_short(converted), _short(t))) from None
        return super().parse_one(t, flag, what)


class Duration(_WithUnit):
    """A time in ms; the number may carry its own unit (``20ms``, ``0.02s``, ``800us``), as the curve specs' do."""


class Seconds(_WithUnit):
    """A time in s; the number may carry its own unit (``30s``, ``2000ms``)."""

    per, metavar = 1000.0, "S"
    units = ("ms (bare numbers), s,", "s (bare numbers), ms,")


class Power(_WithUnit):
    """A power in W; the number may carry its own unit (``8W``, ``800mW``, ``0.3kW``)."""

    kind, metavar = "power", "W"


#: Spellings of a rate's unit → requests per ms each stands for.
RATE_UNITS = {"/ms": 1.0, "req/ms": 1.0, "r/ms": 1.0, "/s": 1e-3, "req/s": 1e-3, "r/s": 1e-3, "rps": 1e-3,
              "qps": 1e-3}
_RATE = re.compile(r"^\s*([+-]?(?:\d+(?:\.\d*)?|\.\d+)(?:[eE][+-]?\d+)?)\s*(k)?\s*([a-z/]*)\s*$", re.IGNORECASE)


class Rate(Number):
    """An arrival rate in the option's own unit (``per="ms"``: requests/ms, ``per="s"``: requests/s).

    The number may carry a ``k`` (×1000) and a unit of its own — ``/ms``, ``req/ms``, ``/s``, ``req/s``, ``rps``,
    ``qps`` — converted to the option's unit: ``--load-range 2/ms:8/ms`` is ``--load-range 2000:8000``, ``--lam
    800req/s`` is ``--lam 0.8``, ``--rps 2k`` is ``--rps 2000``."""

    def __init__(self, per: str = "ms", **kw):
        super().__init__(**kw)
        self.per = per

    def get_metavar(self, param, ctx=None) -> str:
        return "RATE"

    def read(self, text: str, flag: str, what: str = "") -> tuple[float, bool]:
        """(the rate in the option's unit, whether the text carried a unit of its own: a bare number in the
        wrong unit is then worth naming)."""
        m = _RATE.match(str(text))
        if m is None:
            return super().parse_one(text, flag, what), False  # the plain number's message
        number, kilo, unit = m.groups()
        unit = unit.lower()
        if unit and unit not in RATE_UNITS:
            raise InputError(f"{flag}{what}: {_short(text)} has an unknown unit {unit!r}; a rate takes requests/"
                             f"{self.per} as a bare number, or a unit: /ms, req/ms, /s, req/s, rps (and k for ×1000)")
        value = float(number) * (1000.0 if kilo else 1.0)
        if unit:
            value *= RATE_UNITS[unit] / (1.0 if self.per == "ms" else 1e-3)
        return super().parse_one(repr(value), flag, what), bool(unit)

    def parse_one(self, text: str, flag: str, what: str = ""):
        return self.read(text, flag, what)[0]


class Headroom(_Type):
    """``--headroom MS|PCT``: slack kept below every SLO bound — ms (``3``, ``3ms``, ``0.5s``) or a share (``10%``)
    → ``("ms", x)`` or ``("pct", x)``."""

    name = "headroom"

    def get_metavar(self, param, ctx=None) -> str:
        return "MS|PCT"

    def parse(self, text: str, flag: str):
        t = text.strip()
        if t.endswith("%"):
            pct = Number(min=0, max=90).parse_one(t[:-1].strip(), flag, " (a share of each bound, %)")
            return ("pct", float(pct))
        return ("ms", float(Duration(min=0).parse_one(t, flag)))


class Grid(_Type):
    """Comma-separated numbers, e.g. ``0.1,0.3`` → sorted distinct values (``allow_empty``: '' → [])."""

    name = "grid"

    def __init__(self, *, integer: bool = False, min=None, allow_empty: bool = False, keep_order: bool = False,
                 item: Number | None = None):
        self.item = Number(integer=integer) if item is None else item  # item: e.g. Duration() for values with units
        self.min, self.allow_empty, self.keep_order = min, allow_empty, keep_order

    def get_metavar(self, param, ctx=None) -> str:
        return "X,Y,…"

    def parse(self, text: str, flag: str):
        items = [x for x in text.split(",") if x.strip()]
        if len(items) > GRID_LIMIT:
            raise InputError(f"{flag} has {len(items)} values; at most {GRID_LIMIT} are allowed")
        values = [self.item.parse_one(x.strip(), flag, " values") for x in items]
        if not values:
            if self.allow_empty and not text.strip():
                return []
            raise InputError(f"{flag} needs comma-separated numbers, e.g. 0.3,0.7")
        if self.min is not None and any(v < self.min for v in values):
            raise InputError(f"{flag} values must be ≥ {_fmt(self.min)}, got {_short(text)}")
        return list(dict.fromkeys(values)) if self.keep_order else sorted(set(values))


class OneOf(_Type):
    """One word of a fixed list: ``unknown solver 'magic'; valid: pi, rvi``."""

    name = "choice"

    def __init__(self, choices, what: str):
        self.choices, self.what = tuple(choices), what

    def get_metavar(self, param, ctx=None) -> str:
        return "|".join(self.choices)

    def parse(self, text: str, flag: str):
        if text not in self.choices:
            raise InputError(f"unknown {self.what} {_short(text)}; valid: {', '.join(self.choices)}")
        return text


class SMax(_Type):
    """``auto``, ``minimal`` or an integer truncation level (the solver checks s_max ≥ Bmax)."""

    name = "s_max"

    def get_metavar(self, param, ctx=None) -> str:
        return "auto|minimal|N"

    def parse(self, text: str, flag: str):
        if text.strip().lower() in ("auto", "minimal"):
            return text.strip().lower()
        try:
            v = int(text)
        except ValueError:
            raise InputError(f"{flag} must be auto, minimal or an integer ≥ Bmax, got {_short(text)}") from None
        if not 1 <= v <= STATE_LIMIT:
            raise InputError(f"{flag} must be auto, minimal or an integer in Bmax..{STATE_LIMIT}, got {_short(text)}")
        return v


class Instances(_Type):
    """``auto`` or a number of model instances 1..64."""

    name = "instances"

    def get_metavar(self, param, ctx=None) -> str:
        return "N|auto"

    def parse(self, text: str, flag: str):
        if text.strip().lower() == "auto":
            return "auto"
        try:
            v = int(text)
        except ValueError:
            raise InputError(f"{flag} must be auto or an integer in 1..64, got {_short(text)}") from None
        if not 1 <= v <= 64:
            raise InputError(f"{flag} must be auto or an integer in 1..64, got {_short(text)}")
        return v


class SloWithin(_Type):
    """``BOUND_MS:PERCENT`` → (bound in ms, share in (0, 1])."""

    name = "bound:percent"

    def get_metavar(self, param, ctx=None) -> str:
        return "BOUND_MS:PERCENT"

    def parse(self, text: str, flag: str):
        bound, sep, pct = text.partition(":")
        if not sep:
            raise InputError(f"{flag} must be BOUND_MS:PERCENT, e.g. 10:95, got {_short(text)}")
        b = Number().parse_one(bound, flag, " bound")
        p = Number().parse_one(pct, flag, " percent")
        if b <= 0 or not (0 < p <= 100):
            raise InputError(f"{flag} needs a bound > 0 ms and a percentage in (0, 100], got {_short(text)}")
        return b, p / 100.0


class SloBound(_Type):
    """``METRIC:MS`` (metric mean, p50, p90, p95 or p99) → (metric, bound in ms)."""

    name = "metric:ms"
    METRICS = ("mean", "p50", "p90", "p95", "p99")

    def get_metavar(self, param, ctx=None) -> str:
        return "METRIC:MS"

    def parse(self, text: str, flag: str):
        metric, sep, bound = text.partition(":")
        metric = metric.strip().lower()
        if not sep:
            raise InputError(f"{flag} must be METRIC:MS with METRIC one of {', '.join(self.METRICS)}, e.g. p99:20, "
                             f"got {_short(text)}")
        if metric not in self.METRICS:
            raise InputError(f"{flag}: unknown SLO metric {metric!r}; valid: {', '.join(self.METRICS)}")
        b = Duration(min=0, min_open=True).parse_one(bound.strip(), flag, f" ({metric} bound in ms)")
        return metric, b


class Rates(tuple):
    """A range of rates ``(lo, hi)`` and whether either end carried its own unit (:class:`Rate`)."""

    explicit: bool = False


class Range(_Type):
    """``LO:HI``, two numbers > 0 with LO < HI (the order and width are checked by the model); ``per="s"`` or
    ``"ms"``: a range of rates (:class:`Rate`, each end may carry a unit or a k), returned as :class:`Rates`."""

    name = "range"

    def __init__(self, per: str | None = None):
        self.per = per

    def get_metavar(self, param, ctx=None) -> str:
        return "LO:HI"

    def parse(self, text: str, flag: str):
        lo, sep, hi = text.partition(":")
        if not sep:
            raise InputError(f"{flag} must be LO:HI, e.g. 500:1500, got {_short(text)}")
        if self.per is not None:  # rates: a unit may follow each end (2/ms:8/ms, 600req/s:2k)
            item = Rate(self.per, min=0, min_open=True)
            a, unit_a = item.read(lo.strip(), flag, " low end")
            b, unit_b = item.read(hi.strip(), flag, " high end")
            out = Rates(self._checked(a, b, text, flag))
            out.explicit = unit_a or unit_b
            return out
        a = Number(min=0, min_open=True).parse_one(lo.strip(), flag, " low end")
        b = Number(min=0, min_open=True).parse_one(hi.strip(), flag, " high end")
        return self._checked(a, b, text, flag)

    @staticmethod
    def _checked(a: float, b: float, text: str, flag: str) -> tuple[float, float]:
        if b < a:
            raise InputError(f"{flag} {_short(text)} is inverted: write LO:HI with LO < HI")
        if b == a:
            raise InputError(f"{flag} {_short(text)} is empty (LO = HI); for one load give --lam or --rho")
        return a, b


def _out_flag(param) -> str:
    """``-o`` for the output option (as the issue and the help spell it), else the long spelling."""
    return "-o" if "-o" in getattr(param, "opts", []) else _flag(param)


#: File formats known by their extension: an output option refuses an extension naming a format it
#: does not write (``solve -o t.json``), and one that writes several follows the extension.
FORMAT_NAMES = {".h5": "HDF5", ".hdf5": "HDF5", ".csv": "CSV", ".tsv": "TSV", ".json": "JSON", ".png": "PNG",
                ".svg": "SVG", ".pdf": "PDF", ".jpg": "JPEG", ".jpeg": "JPEG", ".gif": "GIF", ".eps": "EPS",
                ".ps": "PostScript", ".tif": "TIFF", ".tiff": "TIFF", ".webp": "WebP", ".txt": "text",
                ".pbtxt": "protobuf text", ".md": "Markdown", ".html": "HTML", ".xml": "XML", ".py": "Python",
                ".yaml": "YAML", ".yml": "YAML", ".toml": "TOML", ".npy": "NumPy", ".npz": "NumPy",
                ".pkl": "pickle", ".parquet": "Parquet", ".xlsx": "Excel"}


def check_extension(path: str, flag: str, exts: tuple[str, ...], strict: bool = False) -> str:
    """``path``'s extension (lower case) if ``flag`` can write it: one of ``exts``, or (``strict`` False) none or
    one naming no known format; an extension naming another format is refused with the valid ones."""
    import os

    ext = os.path.splitext(str(path))[1].lower()
    if ext in exts or not exts:
        return ext
    valid = ", ".join(exts)
    if ext in FORMAT_NAMES:
        names = list(dict.fromkeys(FORMAT_NAMES.get(e, e) for e in exts))
        kinds = names[0] if len(names) == 1 else ", ".join(names[:-1]) + " or " + names[-1]
        raise InputError(f"{flag} {path}: {ext} is the extension of {FORMAT_NAMES[ext]} files, but {flag} writes {kinds}; "
                         f"the name must end in one of {valid}")
    if strict:
        raise InputError(f"{flag} {path}: the name must end in one of {valid} (the format follows the extension)")
    return ext


class OutputPath(_Type):
    """A file to write: a regular file, a symlink to one, or a new name in a writable folder
    (:func:`smdp_batch.files.check_output`); nothing is opened or created while parsing.  Each command
    checks its outputs against its inputs and each other before any work (``options.prepare_outputs``).

    ``exts``: the extensions the option writes (``OutputPath(".h5", ".hdf5")``); an extension naming another
    format is refused (:func:`check_extension`); none given: any name (the command checks it itself)."""

    name = "output"

    def __init__(self, *exts: str):
        self.exts = tuple(e.lower() for e in exts)

    def get_metavar(self, param, ctx=None) -> str:
        return "FILE" + self.exts[0] if self.exts else "PATH"

    def check(self, text: str, flag: str):
        from ..files import check_output

        check_extension(text, flag, self.exts)
        check_output(text, flag)
        return text

    def convert(self, value, param, ctx):
        if not isinstance(value, str):
            return value
        try:
            return self.check(value, _out_flag(param))
        except InputError as e:
            raise OneLineError(str(e), ctx=ctx, param=param) from None


class OutputDir(OutputPath):
    """A folder to write files into: an existing writable folder, or a new name in a writable folder."""

    name = "folder"

    def get_metavar(self, param, ctx=None) -> str:
        return "DIR"

    def check(self, text: str, flag: str):
        from ..files import check_output_dir

        check_output_dir(text, flag)
        return text


class FigurePath(OutputPath):
    """A figure to write: FILE.png, .svg or .pdf, checked as an :class:`OutputPath`."""

    name = "figure"

    def __init__(self):
        super().__init__(".png", ".svg", ".pdf")

    def get_metavar(self, param, ctx=None) -> str:
        return "FILE.png|svg|pdf"

    def check(self, text: str, flag: str):
        from ..analysis.plots import check_path

        check_extension(text, flag, self.exts, strict=True)
        check_path(text, flag)
        return text

    def convert(self, value, param, ctx):
        if isinstance(value, str):  # matplotlib (the plot extra) is checked before any work
            from ..extras import require

            try:
                require("matplotlib", " ".join(filter(None, (getattr(ctx, "info_name", None), _flag(param)))))
            except InputError as e:
                raise OneLineError(str(e), ctx=ctx, param=param) from None
        return super().convert(value, param, ctx)


def InputFile() -> click.Path:  # noqa: N802 - reads like a type
    """An existing file to read (click's own check: "File 'x' does not exist.")."""
    return click.Path(exists=True, dir_okay=False)


class Option(click.Option):
    """A click option whose described default (``show_default="…"``) reads like a value:
    ``[default: 0.5]``, as for real defaults, not click's ``[default: (0.5)]``."""

    def get_help_extra(self, ctx):
        extra = super().get_help_extra(ctx)
        if isinstance(self.show_default, str) and "default" in extra:
            extra["default"] = self.show_default
        return extra


def option(*names, **kw):
    """``click.option`` with :class:`Option` (every option of this CLI is declared through it)."""
    kw.setdefault("cls", Option)
    return click.option(*names, **kw)
