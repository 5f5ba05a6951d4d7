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
from .memaware import MemoryAware, SLAConstrained
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
        runs = [("fixed B", binsim.simulate_bins(arr, x, bins, k, B, servers=servers, warmup=warmup), None)]
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
        for name, r, w in runs:
            row = dict(lam=lam, scheme=name, k=k, B=B, throughput=r.throughput, mean_latency=r.mean_latency,
                       p95_latency=r.percentile(95), mean_batch=r.mean_batch, max_wait=w)
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


def plot_rows(rows: list[dict], panels: Sequence[tuple[str, str]], title: str = ""):
    """One panel per (key, label) against the arrival rate, a line per scheme."""
    from ..analysis.plots import _figure

    fig = _figure(len(panels))
    axes = fig.subplots(1, len(panels), squeeze=False)[0]
    schemes = list(dict.fromkeys(r["scheme"] for r in rows))
    for ax, (key, label) in zip(axes, panels):
        for s in schemes:
            pts = [(r["lam"], r[key]) for r in rows if r["scheme"] == s and r.get(key) is not None]
            if pts:
                xs, ys = zip(*pts)
                ax.plot(xs, ys, marker="o", label=s)
        ax.set_xlabel("arrival rate λ")
        ax.set_ylabel(label)
        ax.grid(alpha=0.3)
    axes[0].legend(fontsize=8)
    if title:
        fig.suptitle(title)
    return fig
