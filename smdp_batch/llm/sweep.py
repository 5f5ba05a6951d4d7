"""Load sweeps of the LLM batching schemes on common request streams, as rows for tables and plots.

* :func:`multibin_sweep` — paper 000's multi-bin batching (fixed B; fixed B with the best maximum
  wait of a grid) against per-bin SMDP tables (:mod:`.perbin`), on the same arrivals and times.
* :func:`llm_sweep` — the LLM engine (:mod:`.engine`) under static batching, continuous batching,
  multi-bin batching, per-bin SMDP tables (run-to-completion batches like multi-bin), BucketServe
  (online and SJF) and paper 002's Alg. 1 and Alg. 2, on one stream of prompts and outputs per load.
"""

from __future__ import annotations

import math
from typing import Sequence

import numpy as np

from ..errors import InputError
from . import binsim, multibin
from .bucketserve import BucketServe
from .engine import LLMModel, run
from .memaware import MemoryAware, SLAConstrained, check_d_sla
from .perbin import solve_bins, solve_engine_bins
from .schedulers import ContinuousFCFS, MultiBinStatic, PerBinTables, StaticBatching
from .workload import synthetic

__all__ = ["multibin_sweep", "llm_sweep", "LLM_SCHEMES", "format_rows", "plot_rows"]

LLM_SCHEMES = ("static", "continuous", "multibin", "perbin-smdp", "bucketserve", "bucketserve-sjf", "mem-aware", "sla")


def _lams(lams: Sequence[float]) -> list[float]:
    out = []
    for v in lams:
        x = float(v)
        if not (math.isfinite(x) and x > 0):
            raise InputError(f"arrival rates must be finite and > 0, got {v!r}")
        out.append(x)
    if not out:
        raise InputError("give at least one arrival rate")
    return out


def multibin_sweep(lams: Sequence[float], *, law: str = "uniform:1,20", B: int = 128, k: int = 2, n: int = 100_000,
                   servers: int = 1, seed: int = 0, max_waits: Sequence[float] = (5, 10, 20, 40, 80, 160),
                   smdp: bool = True, warmup: float = 0.1, slo: float | None = None) -> list[dict]:
    """Rows (λ, scheme, throughput, mean/p95 latency, SLO attainment, mean batch) per load and scheme."""
    rl = binsim.parse_request_law(law)
    edges = multibin.quantile_boundaries(k, rl.quantile)
    if rl.kind == "exp":
        edges[-1] = math.inf
    rows = []
    for lam in _lams(lams):
        rng = np.random.default_rng(seed)
        x = rl.sample(rng, n)
        arr = binsim.poisson_times(lam, n, rng)
        bins = binsim.assign_bins(x, edges)
        runs: list[tuple[str, binsim.BinSimResult, float | None]] = [
            ("fixed B", binsim.simulate_bins(arr, x, bins, k, B, servers=servers, warmup=warmup), None)]
        if max_waits:
            tuned = [(binsim.simulate_bins(arr, x, bins, k, B, servers=servers, max_wait=w, warmup=warmup), w)
                     for w in max_waits]
            r, w = min(tuned, key=lambda t: t[0].mean_latency)
            runs.append(("fixed B, best max-wait", r, w))
        if smdp:
            if servers < 1:
                raise InputError("per-bin SMDP tables need a finite number of servers (≥ 1)")
            pol = solve_bins(lam, edges, rl, B)
            runs.append(("per-bin SMDP", binsim.simulate_bins(arr, x, bins, k, B, servers=servers, tables=pol.tables,
                                                               warmup=warmup), None))
        for name, r, wait in runs:
            row = dict(lam=lam, scheme=name, k=k, B=B, throughput=r.throughput, mean_latency=r.mean_latency,
                       p95_latency=r.percentile(95), mean_batch=r.mean_batch, max_wait=wait)
            if slo is not None:
                row["slo_attainment"] = r.slo_attainment(slo)
            rows.append(row)
    return rows


def _scheme(name: str, req, *, static_batch: int, max_batch: int, k: int, d_sla: float, max_wait: float,
            lam: float = 1.0, model: LLMModel | None = None, seed: int = 0):
    tot = req.prompt + req.output
    pm, pv = float(tot.mean()), float(np.var(req.prompt) + np.var(req.output))
    lmax = int(req.prompt.max())
    if name == "static":
        return StaticBatching(static_batch)
    if name == "continuous":
        return ContinuousFCFS(max_batch)
    if name == "multibin":
        e = np.quantile(req.output, np.linspace(0, 1, k + 1)).astype(np.float64)
        e[-1] += 1.0
        e = np.unique(e)
        return MultiBinStatic(e, static_batch, max_wait)
    if name == "perbin-smdp":
        # batch times are sampled from the stream's own (prompt, output) pairs: an oracle profile, as
        # multi-bin's bins are oracle bins
        e = np.quantile(req.output, np.linspace(0, 1, k + 1)).astype(np.float64)
        e[0], e[-1] = 0.0, np.inf
        e = np.unique(e)
        pol = solve_engine_bins(lam, e, req.prompt, req.output, model or LLMModel(), static_batch, seed=seed + 1)
        return PerBinTables(e, pol.tables)
    if name == "bucketserve":
        return BucketServe(lmax, "online", prior_output=float(req.output.mean()), max_batch=max_batch)
    if name == "bucketserve-sjf":
        return BucketServe(lmax, "sjf", prior_output=float(req.output.mean()), max_batch=max_batch)
    if name == "mem-aware":
        return MemoryAware(pm, pv, max_batch=max_batch * 4)
    if name == "sla":
        return SLAConstrained(d_sla, pm, pv, max_batch=max_batch * 4)
    raise InputError(f"unknown scheme {name!r}; valid: {', '.join(LLM_SCHEMES)}")


def llm_sweep(lams: Sequence[float], *, n: int = 2000, prompt: str = "lognormal:200,0.8",
              output: str = "lognormal:150,0.7", model: LLMModel | None = None, slo: float = 20.0,
              schemes: Sequence[str] = LLM_SCHEMES, static_batch: int = 16, max_batch: int = 64, k: int = 4,
              d_sla: float = 0.024, max_wait: float = 5.0, seed: int = 0) -> list[dict]:
    """Rows per load and scheme: throughput (tokens/s, requests/s), mean/p95 latency and TTFT (s), SLO
    attainment (latency ≤ ``slo`` s), mean TBT, waste ratio (eq. 2), peak memory share, preemptions."""
    model = model or LLMModel()
    for s in schemes:
        if s not in LLM_SCHEMES:
            raise InputError(f"unknown scheme {s!r}; valid: {', '.join(LLM_SCHEMES)}")
    if "sla" in schemes:  # a D_SLA no batch meets is the user's input, refused: not a note row per load
        check_d_sla(d_sla, model)
    rows = []
    for lam in _lams(lams):
        req = synthetic(n, lam, prompt, output, seed)
        for s in schemes:
            try:
                sch = _scheme(s, req, static_batch=static_batch, max_batch=max_batch, k=k, d_sla=d_sla,
                              max_wait=max_wait, lam=lam, model=model, seed=seed)
            except InputError as e:  # e.g. a bin's SMDP is unstable at this load: no row, a note
                rows.append(dict(lam=lam, scheme=s, note=str(e)))
                continue
            r = run(req, sch, model)
            rows.append(dict(lam=lam, **r.summary(slo)))
    return rows


def format_rows(rows: list[dict], cols: Sequence[tuple[str, str, str]]) -> str:
    """A fixed-width text table; ``cols`` = (key, header, format)."""
    head = "  ".join(f"{h:>{max(len(h), 10)}}" if i else f"{h:<24}" for i, (_, h, _) in enumerate(cols))
    lines = [head]
    for r in rows:
        cells = []
        for i, (key, h, fmt) in enumerate(cols):
            v = r.get(key)
            text = "—" if v is None else format(v, fmt) if fmt else str(v)
            cells.append(f"{text:>{max(len(h), 10)}}" if i else f"{text:<24}")
        lines.append("  ".join(cells))
    return "\n".join(lines)


# Scheme name prefix (lower case) -> colour, marker, line style.  Per-bin SMDP tables take the SMDP
# family's colour and marker and static / fixed-B batching the static family's (analysis.plots.FAMILY_STYLE),
# so a rule looks the same in every figure; the LLM-only schemes take colours no rule family uses.
_SCHEME_STYLE = (
    ("per-bin smdp", "smdp", None, None, "-"),
    ("fixed b, best", None, "#525252", "D", "--"),
    ("fixed b", "static", None, None, ":"),
    ("static", "static", None, None, ":"),
    ("continuous", None, "#8c564b", "v", "-."),
    ("multi-bin", None, "#17becf", "h", "--"),
    ("bucketserve online", None, "#bcbd22", "p", "-"),
    ("bucketserve sjf", None, "#393b79", "*", ":"),
    ("mem-aware", None, "#e7969c", "d", "-."),
    ("sla", None, "#637939", ">", "--"),
)


def scheme_style(name: str, index: int = 0) -> dict:
    """Colour, marker and line style of a scheme's line, fixed by its name (index: fallback cycle)."""
    from ..analysis.plots import FRONT_LINESTYLES, family_style

    low = name.lower()
    for prefix, fam, color, marker, ls in _SCHEME_STYLE:
        if low.startswith(prefix):
            if fam is not None:
                st = family_style(fam)
                color, marker = st["color"], st["marker"]
            return dict(color=color, marker=marker, linestyle=ls)
    return dict(color=f"C{index % 10}", marker="os^vD<>ph*"[index % 10],
                linestyle=FRONT_LINESTYLES[index % len(FRONT_LINESTYLES)])


def _spans_decades(values) -> bool:
    v = [x for x in values if x is not None and np.isfinite(x)]
    return bool(v) and min(v) > 0 and max(v) / min(v) >= 10


def _log_axis(axis, set_scale) -> None:
    """A log axis labelled in plain numbers (1, 2, 5, 10, 20, …), not powers of ten."""
    from matplotlib.ticker import FuncFormatter

    set_scale("log")
    axis.set_major_formatter(FuncFormatter(lambda v, _: f"{v:g}"))
    axis.set_minor_formatter(FuncFormatter(lambda v, _: f"{v:g}" if f"{v:e}"[0] in "25" else ""))


def plot_rows(rows: list[dict], panels: Sequence[tuple], title: str = "", *,
              xlabel: str = "arrival rate λ [requests / time unit]", logx: bool | None = None,
              logy: bool | None = None):
    """One panel per (key, label[, scale]) against the arrival rate, a line per scheme.

    Labels should carry their unit ("mean latency [s]"); ``scale`` multiplies the values (100 for a
    share in %).  Each scheme keeps one colour, marker and line style (:func:`scheme_style`); markers
    shrink from the first scheme to the last so that coinciding lines stay visible.  An axis is
    logarithmic when its values span a factor of 10 or more (``logx``/``logy`` force it).  The
    schemes' legend sits under the panels, shared by all of them.
    """
    from ..analysis.plots import FONT, WIDTH_IN, _figure, _style_axes

    fig = _figure(len(panels), height=3.6, total_width=max(WIDTH_IN * min(len(panels), 3) / 3, 6.0) if len(panels) < 3
                  else WIDTH_IN + 0.5)
    axes = fig.subplots(1, len(panels), squeeze=False)[0]
    schemes = list(dict.fromkeys(r["scheme"] for r in rows))
    lams = [r["lam"] for r in rows]
    handles: dict = {}
    for ax, panel in zip(axes, panels):
        key, label = panel[0], panel[1]
        scale = panel[2] if len(panel) > 2 else 1.0
        values: list = []
        for j, s in enumerate(schemes):
            pts = [(r["lam"], scale * r[key]) for r in rows if r["scheme"] == s and r.get(key) is not None]
            if pts:
                xs, ys = zip(*pts)
                values += ys
                st = scheme_style(s, j)
                (line,) = ax.plot(xs, ys, label=s, linewidth=1.4, alpha=0.9, ms=max(9 - 0.7 * j, 3.5),
                                  markerfacecolor="none" if j % 2 else st["color"], markeredgewidth=1.2, **st)
                handles.setdefault(s, line)
        if logx if logx is not None else _spans_decades(lams):
            _log_axis(ax.xaxis, ax.set_xscale)
        if logy if logy is not None else _spans_decades(values):
            _log_axis(ax.yaxis, ax.set_yscale)
        ax.set_xlabel(xlabel)
        ax.set_ylabel(label)
        ax.grid(alpha=0.3, which="both")
        _style_axes(ax)
    fig.legend(handles=list(handles.values()), loc="outside lower center", ncols=min(len(handles), 4),
               fontsize=FONT["legend"] + 0.5, title="scheme", title_fontsize=FONT["legend"] + 0.5)
    if title:
        fig.suptitle(title, fontsize=FONT["title"])
    return fig
