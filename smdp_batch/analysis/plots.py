"""Figures of paper 004 §VII from our own numbers: policy charts (Fig. 3), trade-off fronts with baselines
(Figs. 5, 7–9: W̄–P̄ and W̄–efficiency), and latency CDFs, percentile and satisfaction fronts (Fig. 6).

The CLI (``smdp-batch tables --plot``, ``smdp-batch pareto --plot``) and the notebooks draw through
these functions, so every notebook figure has a command that makes it.  Matplotlib (the ``plot``
extra) is imported on use; figures are ``matplotlib.figure.Figure`` objects made without pyplot, so
they work headless and display in Jupyter.
"""

from __future__ import annotations

import math
import os

import numpy as np

from ..errors import InputError

__all__ = ["FORMATS", "plot_policies", "plot_tradeoff", "plot_percentiles", "save"]

FORMATS = (".png", ".svg", ".pdf")
_MARKERS = {"greedy": "^", "static": "s", "triton": "x", "tfserving": "+", "ray": "1", "torchserve": "2"}


def _figure(ncols: int, nrows: int = 1, width: float = 4.6, height: float = 3.6):
    try:
        from matplotlib.figure import Figure
    except ImportError:
        raise InputError("figures need matplotlib: pip install 'smdp-batch[plot]'") from None
    return Figure(figsize=(width * ncols, height * nrows), layout="constrained")


def check_path(path: str, flag: str = "") -> None:
    """Validate a figure path before any work: a known extension, and an output path that
    :func:`smdp_batch.files.check_output` accepts (a regular file or a new name in a writable folder)."""
    from ..files import check_output

    ext = os.path.splitext(str(path))[1].lower()
    if ext not in FORMATS:
        raise InputError(f"figure file {flag + ' ' if flag else ''}{path} must end in one of {', '.join(FORMATS)}")
    check_output(path, flag)


def save(fig, path: str) -> str:
    """Write ``fig`` to ``path`` (png at 150 dpi, svg or pdf) through :func:`smdp_batch.files.atomic_output`:
    renamed into place at once (or, inside the CLI, together with the command's other outputs)."""
    from ..files import atomic_output

    check_path(path)
    ext = os.path.splitext(path)[1].lower()
    with atomic_output(path, ext) as tmp:
        fig.savefig(tmp, dpi=150, format=ext[1:])
    return path


def _front_label(front) -> str:
    rho = f"ρ = {front.problem.rho:.3g}"
    return f"{front.label}, {rho}" if front.label else rho


def plot_policies(grid: dict, batch_sizes, max_queue: int | None = None):
    """Fig. 3: one chart per w2; rows are loads ρ, columns queue lengths n, cells the action (blank: wait).

    ``grid``: {(rho, w2): (policy array for n = 0..s_max, control limit or None)}.  The control limit
    of each row is boxed.
    """
    rhos = sorted({r for r, _ in grid})
    w2s = sorted({w for _, w in grid})
    bmax = int(max(batch_sizes))
    if max_queue is None:
        lims = [q for _, q in grid.values() if q is not None]
        max_queue = min(max(lims + [bmax]) + 4, 4 * bmax)
    n = int(max_queue) + 1
    fig = _figure(len(w2s), 1, width=max(3.5, 0.22 * n + 1.2), height=0.45 * len(rhos) + 1.4)
    axes = fig.subplots(1, len(w2s), squeeze=False)[0]
    from matplotlib.patches import Rectangle

    for ax, w2 in zip(axes, w2s):
        img = np.full((len(rhos), n), np.nan)
        for i, rho in enumerate(rhos):
            pol, q = grid[(rho, w2)]
            row = np.array([int(pol[min(k, len(pol) - 1)]) for k in range(n)], dtype=float)
            img[i] = np.where(row > 0, row, np.nan)
            if q is not None and q < n:
                ax.add_patch(Rectangle((q - 0.5, i - 0.5), 1, 1, fill=False, edgecolor="#e377c2", linewidth=2))
            if n <= 40:
                for k in range(n):
                    ax.text(k, i, str(int(row[k])), ha="center", va="center", fontsize=6)
        ax.imshow(img, aspect="auto", cmap="Blues", vmin=0, vmax=bmax * 1.3, interpolation="nearest")
        ax.set_yticks(range(len(rhos)), [f"{r:.2g}" for r in rhos])
        ax.set_xlabel("queue length n")
        ax.set_ylabel("ρ")
        ax.set_title(f"w2 = {w2:g}")
    fig.suptitle("SMDP policies: batch size served at queue length n (blank: wait; box: control limit)", fontsize=9)
    return fig


def plot_tradeoff(fronts, baselines: dict | None = None, model_panel: bool = False):
    """Figs. 5, 7–9: W̄–P̄ and W̄–efficiency of each front, baselines as points or knob curves.

    ``baselines``: {front index: [BaselinePoint, …]}.  ``model_panel`` adds panel (a) of Figs. 7–9:
    the batch service rate b/l(b) and energy efficiency b/ζ(b) of each distinct scenario, or the
    service-time CDFs at b = 8 (Fig. 9(a)) when only the service law differs.
    """
    baselines = baselines or {}
    ncols = 3 if model_panel else 2
    fig = _figure(ncols)
    axes = list(fig.subplots(1, ncols, squeeze=True))
    if model_panel:
        _model_panel(axes.pop(0), fronts)
    ax_p, ax_e = axes
    colors = [f"C{i % 10}" for i in range(len(fronts))]
    for i, (front, c) in enumerate(zip(fronts, colors)):
        w = [p.mean_latency_ms for p in front.points]
        ax_p.plot(w, [p.mean_power_w for p in front.points], "-o", color=c, ms=3, label=f"SMDP, {_front_label(front)}")
        ax_e.plot(w, [p.efficiency for p in front.points], "-o", color=c, ms=3, label=f"SMDP, {_front_label(front)}")
        by_family: dict[str, list] = {}
        for b in baselines.get(i, []):
            by_family.setdefault(b.family, []).append(b)
        for fam, pts in by_family.items():
            m = _MARKERS.get(fam, "o")
            xs = [b.mean_latency_ms for b in pts]
            style = dict(color=c, marker=m, ms=6 if fam in ("greedy", "static") else 5, alpha=0.8,
                         linestyle=":" if fam not in ("greedy", "static") else "none", linewidth=0.8)
            lab = fam if i == 0 else None
            ax_p.plot(xs, [b.mean_power_w for b in pts], label=lab, **style)
            ax_e.plot(xs, [b.efficiency for b in pts], **style)
            if fam == "static":
                for b in pts:
                    ax_p.annotate(b.setting.split(":")[1], (b.mean_latency_ms, b.mean_power_w), fontsize=6,
                                  xytext=(3, 3), textcoords="offset points", color=c)
    for ax in (ax_p, ax_e):
        ax.set_xlabel("mean latency W̄ [ms]")
        ax.grid(True, alpha=0.3)
    ax_p.set_ylabel("mean power P̄ [W]")
    ax_e.set_ylabel("energy efficiency λ/P̄ [requests/J]")
    ax_p.legend(fontsize=7)
    ax_p.set_title("latency–power trade-off", fontsize=9)
    ax_e.set_title("latency–efficiency trade-off", fontsize=9)
    return fig


def _model_panel(ax, fronts) -> None:
    probs = []
    for f in fronts:
        key = (f.problem.latency.spec(), f.problem.energy.spec(), f.problem.service.spec(), f.label)
        if key[:3] not in [k[:3] for k, _ in probs]:
            probs.append((key, f.problem))
    same_curves = len({k[:2] for k, _ in probs}) == 1
    if same_curves and len(probs) > 1:  # only the service law differs: Fig. 9(a)
        b = 8 if 8 in probs[0][1].batch_sizes else probs[0][1].bmax
        for (key, p), c in zip(probs, [f"C{i}" for i in range(10)]):
            lb = float(p.latency_ms()[list(p.batch_sizes).index(b)])
            x = np.linspace(0.0, 4.0 * lb, 300)
            ax.plot(x, p.service.cdf(x, lb, b), color=c, label=key[3] or key[2])
        ax.set_xlabel(f"batch service time at b = {b} [ms]")
        ax.set_ylabel("CDF")
        ax.set_title("service-time laws", fontsize=9)
    else:  # Figs. 7(a), 8(a): batching effect in service rate and energy efficiency
        ax2 = ax.twinx()
        for (key, p), c in zip(probs, [f"C{i}" for i in range(10)]):
            b = np.asarray(p.batch_sizes, dtype=float)
            ax.plot(b, b / p.latency_ms(), "-", color=c, label=f"{key[3] or key[0]}: b/l(b)")
            ax2.plot(b, 1e3 * b / p.energy_mj(), "--", color=c, label=f"{key[3] or key[1]}: b/ζ(b)")
        ax.set_xlabel("batch size b")
        ax.set_ylabel("batch service rate b/l(b) [requests/ms] (solid)")
        ax2.set_ylabel("energy efficiency b/ζ(b) [requests/J] (dashed)")
        ax.set_title("batching effect", fontsize=9)
    ax.legend(fontsize=7)
    ax.grid(True, alpha=0.3)


def plot_percentiles(front, baselines=(), cdfs: dict | None = None, bound_ms: float | None = None,
                     percentile: str = "p95_ms"):
    """Fig. 6: (a) latency CDFs, (b) simulated percentile vs P̄, (c) share within ``bound_ms`` vs P̄."""
    panels = (1 if cdfs else 0) + 1 + (1 if bound_ms is not None else 0)
    fig = _figure(panels)
    axes = list(np.atleast_1d(fig.subplots(1, panels)))
    if cdfs:
        ax = axes.pop(0)
        for i, (label, (x, pr)) in enumerate(cdfs.items()):
            ax.plot(x, pr, label=label, color=f"C{i % 10}", linewidth=1.2)
        if bound_ms is not None:
            ax.axvline(bound_ms, color="grey", linestyle="--", linewidth=0.8)
        ax.set_xlabel("request latency [ms]")
        ax.set_ylabel("CDF")
        ax.set_title(f"latency CDFs, {_front_label(front)}", fontsize=9)
        ax.legend(fontsize=7)
        ax.grid(True, alpha=0.3)
    ax = axes.pop(0)
    pts = [p for p in front.points if percentile in p.percentiles]
    if not pts:
        raise InputError("the front has no simulated percentiles; sweep with simulate_requests > 0")
    ax.plot([p.percentiles[percentile] for p in pts], [p.mean_power_w for p in pts], "-o", ms=3, color="C0", label="SMDP")
    for b in baselines:
        if percentile in b.percentiles:
            ax.plot(b.percentiles[percentile], b.mean_power_w, _MARKERS.get(b.family, "o"), color="C3", ms=5)
            if b.family in ("greedy", "static"):
                ax.annotate(b.setting, (b.percentiles[percentile], b.mean_power_w), fontsize=6, xytext=(3, 3),
                            textcoords="offset points")
    if bound_ms is not None:
        ax.axvline(bound_ms, color="grey", linestyle="--", linewidth=0.8)
    name = percentile[:-3]
    ax.set_xlabel(f"{name} latency [ms] (simulated)")
    ax.set_ylabel("mean power P̄ [W]")
    ax.set_title(f"{name}–power trade-off", fontsize=9)
    ax.grid(True, alpha=0.3)
    if bound_ms is not None:
        ax = axes.pop(0)
        ok = [p for p in front.points if bound_ms in p.within]
        ax.plot([100 * p.within[bound_ms] for p in ok], [p.mean_power_w for p in ok], "-o", ms=3, color="C0", label="SMDP")
        for b in baselines:
            if bound_ms in b.within:
                ax.plot(100 * b.within[bound_ms], b.mean_power_w, _MARKERS.get(b.family, "o"), color="C3", ms=5)
        ax.set_xlabel(f"requests within {bound_ms:g} ms [%] (simulated)")
        ax.set_ylabel("mean power P̄ [W]")
        ax.set_title("satisfaction–power trade-off", fontsize=9)
        ax.grid(True, alpha=0.3)
    return fig


def finite_w2(x: float) -> str:
    """w2 for display: ∞ for the front's least-power end."""
    return "∞" if not math.isfinite(x) else f"{x:.4g}"
