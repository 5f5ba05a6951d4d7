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
from typing import Any

import numpy as np

from ..errors import InputError
from ..extras import require

__all__ = ["FORMATS", "FAMILY_STYLE", "family_style", "plot_policies", "plot_tradeoff", "plot_percentiles", "save"]

FORMATS = (".png", ".svg", ".pdf")

#: One colour and marker per rule family, the same in every figure (Figs. 3, 5–9 and the LLM sweeps).
FAMILY_STYLE = {
    "smdp": dict(color="#1f77b4", marker="o", label="SMDP front"),
    "greedy": dict(color="#000000", marker="^", label="greedy"),
    "static": dict(color="#7f7f7f", marker="s", label="static b"),
    "triton": dict(color="#d62728", marker="v", label="Triton (max queue delay)"),
    "tfserving": dict(color="#ff7f0e", marker="<", label="TF-Serving (batch timeout)"),
    "ray": dict(color="#2ca02c", marker="P", label="Ray Serve (batch wait timeout)"),
    "torchserve": dict(color="#9467bd", marker="X", label="TorchServe (max batch delay)"),
}
#: The SLO's pick and the user's current setting: drawn over everything, unlike any family.
PICK_STYLE = dict(color="#ffbf00", marker="*", markersize=16, markeredgecolor="black", markeredgewidth=1.0,
                  linestyle="none", zorder=6)
CURRENT_STYLE = dict(color="none", marker="o", markersize=13, markeredgecolor="#e377c2", markeredgewidth=2.5,
                     linestyle="none", zorder=8)
#: Line styles telling fronts (loads, scenarios) apart when colours mean rule families.
FRONT_LINESTYLES = ("-", "--", "-.", ":", (0, (5, 1, 1, 1, 1, 1)), (0, (1, 3)))
_MARKERS = {k: v["marker"] for k, v in FAMILY_STYLE.items()}  # kept for callers of the old name
FONT = {"title": 10, "label": 9, "tick": 8, "legend": 7.5, "note": 7.5}
WIDTH_IN = 9.5  # a notebook's width: figures are drawn for 8–10 in and read at that size


def family_style(family: str) -> dict:
    """Colour, marker and legend label of a rule family (``smdp``, ``greedy``, ``static``, ``triton``, …)."""
    return FAMILY_STYLE.get(family, dict(color="#8c564b", marker="o", label=family))


def _figure(ncols: int, nrows: int = 1, width: float = 4.6, height: float = 3.6, total_width: float | None = None):
    Figure = require("matplotlib.figure", "figures").Figure
    w = total_width if total_width is not None else width * ncols
    return Figure(figsize=(w, height * nrows), layout="constrained")


def _style_axes(ax) -> None:
    ax.tick_params(labelsize=FONT["tick"])
    ax.xaxis.label.set_size(FONT["label"])
    ax.yaxis.label.set_size(FONT["label"])
    ax.title.set_size(FONT["title"])


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
    rho = f"ρ = {_rho_text(front.problem.rho)}"
    return f"{front.label}, {rho}" if front.label else rho


def _rho_text(rho: float) -> str:
    """ρ in the fewest digits (3 to 6) that tell it apart; next to 1, as 1 − (1 − ρ)."""
    for digits in (3, 4, 5, 6):
        text = f"{rho:.{digits}g}"
        if abs(float(text) - rho) <= 1e-9 * rho:
            break
    return f"1 − {1 - rho:.2g}" if text == "1" and rho < 1 else text


def plot_policies(grid: dict, batch_sizes, max_queue: int | None = None, *, ncols: int | None = None,
                  annotate: bool | None = None):
    """Fig. 3: one chart per w2; rows are loads ρ, columns queue lengths n, cells the action (blank: wait).

    ``grid``: {(rho, w2): (policy array for n = 0..s_max, control limit or None)}.  The control limit
    of each row is boxed.  Charts are laid out ``ncols`` to a row (default: two when there are more
    than two, so the figure fits a notebook's width).  Cells print their batch size when the cells are
    wide enough to read (``annotate`` forces it on or off); otherwise only the boxed control-limit
    cells print theirs, and the colour bar gives the rest.  Wait cells (action 0) stay blank.
    """
    matplotlib = require("matplotlib", "figures")
    from matplotlib.colors import BoundaryNorm, ListedColormap
    from matplotlib.lines import Line2D
    from matplotlib.patches import Patch, Rectangle

    rhos = sorted({r for r, _ in grid})
    w2s = sorted({w for _, w in grid})
    bmax = int(max(batch_sizes))
    if max_queue is None:
        lims = [q for _, q in grid.values() if q is not None]
        max_queue = min(max(lims + [bmax]) + 4, 4 * bmax)
    n = int(max_queue) + 1
    ncols = max(1, min(len(w2s), ncols or (len(w2s) if len(w2s) <= 2 else 2)))
    nrows = -(-len(w2s) // ncols)
    panel_h = 0.32 * len(rhos) + 1.0
    fig = _figure(ncols, nrows, height=panel_h, total_width=WIDTH_IN)
    axes = fig.subplots(nrows, ncols, squeeze=False).ravel()
    cell_pt = 72 * (WIDTH_IN / ncols - 0.9) / n  # a cell's width in points at the figure's size
    digits = len(str(bmax))
    if annotate is None:
        annotate = cell_pt >= 4.6 * digits + 4
    fs = min(8.5, max(5.5, (cell_pt - 3) / (0.62 * digits)))
    cmap = ListedColormap(matplotlib.colormaps["Blues"](np.linspace(0.18, 1.0, 256)))  # b = 1 visible, unlike wait
    bounds = np.arange(0.5, bmax + 1.5) if bmax <= 16 else np.linspace(0.5, bmax + 0.5, 17)
    norm = BoundaryNorm(bounds, cmap.N)
    im = None
    for ax, w2 in zip(axes, w2s):
        img = np.full((len(rhos), n), np.nan)
        for i, rho in enumerate(rhos):
            pol, q = grid[(rho, w2)]
            row = np.array([int(pol[min(k, len(pol) - 1)]) for k in range(n)], dtype=float)
            img[i] = np.where(row > 0, row, np.nan)
            if q is not None and q < n:
                ax.add_patch(Rectangle((q - 0.5, i - 0.5), 1, 1, fill=False, edgecolor="#e377c2", linewidth=2, zorder=3))
            if annotate:
                for k in range(n):
                    if row[k] > 0:
                        ax.text(k, i, str(int(row[k])), ha="center", va="center", fontsize=fs,
                                color="white" if row[k] > 0.5 * bmax else "black", zorder=4)
            elif q is not None and q < n:  # cells too narrow for numbers: name the control limit beside its box
                left = q * cell_pt > 62  # wait cells (blank) to the left of the box have room
                ax.text(q - 0.9 if left else q + 0.9, i, f"Q={q}, b={int(row[q])}", ha="right" if left else "left",
                        va="center", fontsize=FONT["note"], zorder=4,
                        bbox=None if left else dict(boxstyle="round,pad=0.15", fc="white", ec="none", alpha=0.85))
        im = ax.imshow(img, aspect="auto", cmap=cmap, norm=norm, interpolation="nearest")
        ax.set_yticks(range(len(rhos)), [f"{r:.2g}" for r in rhos])
        if n <= 24:
            ax.set_xticks(range(n))
        ax.set_xlabel("queue length n [requests]")
        ax.set_ylabel("load ρ (share of capacity)")
        ax.set_title(f"w2 = {w2:g}")
        _style_axes(ax)
    for ax in axes[len(w2s):]:
        ax.set_visible(False)
    used = [ax for ax in axes[: len(w2s)]]
    cb = fig.colorbar(im, ax=used, shrink=0.9, pad=0.01, aspect=30)
    cb.set_label("batch size served b [requests]", fontsize=FONT["label"])
    step = max(1, int(round(bmax / 8)))
    cb.set_ticks(sorted({1, bmax, *range(step, bmax + 1, step)}))
    cb.ax.tick_params(labelsize=FONT["tick"])
    handles: list[Patch | Line2D] = [Patch(facecolor="white", edgecolor="0.6", label="blank: wait (serve nothing)"),
               Patch(facecolor="none", edgecolor="#e377c2", linewidth=2, label="box: control limit (Prop. 3–4)")]
    if not annotate:
        handles.append(Line2D([], [], linestyle="none", label="Q=…, b=…: control limit and the batch served there"))
    fig.legend(handles=handles, loc="outside lower center", ncols=len(handles), fontsize=FONT["legend"], frameon=False)
    fig.suptitle("SMDP policies: batch size served at queue length n", fontsize=FONT["title"])
    return fig


def _per_front(value, count: int) -> list:
    """``chosen`` as one entry per front: a list as given, one point for a single front, or None."""
    if value is None:
        return [None] * count
    if isinstance(value, (list, tuple)):
        return list(value) + [None] * (count - len(value))
    return [value] + [None] * (count - 1)


def _current(current) -> tuple[float, float, str] | None:
    if current is None:
        return None
    if isinstance(current, dict):
        w, p, label = current["mean_latency_ms"], current["mean_power_w"], current.get("label", "current setting")
    else:
        w, p, *rest = current
        label = rest[0] if rest else "current setting"
    return float(w), float(p), str(label)


def _note(ax, text: str, xy, edge: str, color: str = "black", avoid=()) -> None:
    """A boxed label for a marked point, offset towards the middle of the axes so it stays inside them,
    and moved further out when its box would hide one of the ``avoid`` points (e.g. the current setting)."""
    ax.autoscale_view()
    fx, fy = (ax.transData + ax.transAxes.inverted()).transform(xy)
    sx, ha = (-1, "right") if fx > 0.55 else (1, "left")
    sy, va = (-1, "top") if fy > 0.6 else (1, "bottom")
    lines = text.split("\n")
    w_pt = 0.58 * FONT["note"] * max(len(t) for t in lines) + 8  # the box's rough size in points
    h_pt = 1.35 * FONT["note"] * len(lines) + 6
    to_pt = 72.0 / ax.figure.dpi
    x0, y0 = ax.transData.transform(xy)
    others = [((x - x0) * to_pt, (y - y0) * to_pt) for x, y in (ax.transData.transform(a) for a in avoid)]
    dx, dy = 16 * sx, 12 * sy
    for dx, dy in ((16 * sx, 12 * sy), (16 * sx, 12 * sy + 26 * sy), (16 * sx, -14 * sy), (16 * sx, 12 * sy + 52 * sy)):
        xl, xr = sorted((dx, dx + sx * w_pt))
        yb, yt = sorted((dy, dy + (h_pt if va == "bottom" else -h_pt)))
        if not any(xl - 8 <= ox <= xr + 8 and yb - 8 <= oy <= yt + 8 for ox, oy in others):
            break
    ax.annotate(text, xy, xytext=(dx, dy), textcoords="offset points", ha=ha, va=va, fontsize=FONT["note"], color=color,
                bbox=dict(boxstyle="round,pad=0.25", fc="white", ec=edge, alpha=0.92),
                arrowprops=dict(arrowstyle="-", color="0.3", lw=0.6), zorder=7)


def _baseline_families(pts) -> dict:
    by_family: dict[str, list] = {}
    for b in pts:
        by_family.setdefault(b.family, []).append(b)
    return by_family


def plot_tradeoff(fronts, baselines: dict | None = None, model_panel: bool = False, *, chosen=None,
                  slo: str | None = None, slo_mean_ms: float | None = None, current=None):
    """Figs. 5, 7–9: W̄–P̄ and W̄–efficiency of each front, baselines as points or knob curves.

    ``baselines``: {front index: [BaselinePoint, …]}.  ``model_panel`` adds panel (a) of Figs. 7–9:
    the batch service rate b/l(b) and energy efficiency b/ζ(b) of each distinct scenario, or the
    service-time CDFs at b = 8 (Fig. 9(a)) when only the service law differs.

    Colours and markers mean rule families (:data:`FAMILY_STYLE`, the same in every figure); line
    styles tell the fronts apart, and timeout rules' knob curves take their front's line style.
    ``chosen``: the SLO's pick (a FrontPoint, or one per front, None where nothing meets it), drawn as
    a gold star and labelled with ``slo`` (e.g. "W̄ ≤ 5 ms"); ``slo_mean_ms`` also draws the bound.
    ``current``: your current setting, (W̄ ms, P̄ W) or (W̄, P̄, label), drawn as a pink ring.
    """
    baselines = baselines or {}
    ncols = 3 if model_panel else 2
    fig = _figure(ncols, height=4.3 if model_panel else 4.4, total_width=11.0 if model_panel else WIDTH_IN)
    axes = list(fig.subplots(1, ncols, squeeze=True))
    if model_panel:
        _model_panel(axes.pop(0), fronts)
    ax_p, ax_e = axes
    smdp = FAMILY_STYLE["smdp"]
    from matplotlib.lines import Line2D

    fam_handles: dict[str, Line2D] = {}
    front_handles = []
    scen = list(dict.fromkeys(f.label or f.problem.describe().get("service", "") for f in fronts))
    loads = list(dict.fromkeys(round(f.problem.rho, 9) for f in fronts))
    for i, front in enumerate(fronts):
        # one scenario: line style by load; several: line style by scenario, marker fill by load
        j = scen.index(front.label or front.problem.describe().get("service", ""))
        r = loads.index(round(front.problem.rho, 9))
        ls = FRONT_LINESTYLES[(r if len(scen) == 1 else j) % len(FRONT_LINESTYLES)]
        hollow = r % 2 == 1
        w = [p.mean_latency_ms for p in front.points]
        label = f"SMDP, {_front_label(front)}"
        kw = dict(color=smdp["color"], marker=smdp["marker"] if r < 2 else "D", ms=3.5 if r < 2 else 3, linestyle=ls,
                  linewidth=1.6, label=label, markerfacecolor="white" if hollow else smdp["color"])
        front_handles.append(ax_p.plot(w, [p.mean_power_w for p in front.points], **kw)[0])
        ax_e.plot(w, [p.efficiency for p in front.points], **kw)
        if len(scen) == 1 and len(fronts) > 1:  # name each front above its least-power end
            ax_p.annotate(_front_label(front), (w[-1], front.points[-1].mean_power_w), fontsize=FONT["note"],
                          xytext=(0, 7), textcoords="offset points", ha="right", va="bottom", color=smdp["color"])
        for fam, pts in _baseline_families(baselines.get(i, [])).items():
            st = family_style(fam)
            exact = fam in ("greedy", "static")
            xs = [b.mean_latency_ms for b in pts]
            style = dict(color=st["color"], marker=st["marker"], ms=6.5 if exact else 5.5, alpha=0.9,
                         linestyle="none" if exact else ls, linewidth=0.9, markeredgewidth=0.8)
            if exact:
                style.update(markerfacecolor="none" if fam == "static" else st["color"])
            line = ax_p.plot(xs, [b.mean_power_w for b in pts], **style)[0]
            ax_e.plot(xs, [b.efficiency for b in pts], **style)
            fam_handles.setdefault(fam, Line2D([], [], color=st["color"], marker=st["marker"], linestyle="none" if exact
                                               else "-", markerfacecolor=line.get_markerfacecolor(), label=st["label"]))
            if fam == "static" and j == 0:  # labelled on the first scenario's fronts only, where they do not pile up
                for b in pts:
                    ax_p.annotate("b=" + b.setting.split(":")[1], (b.mean_latency_ms, b.mean_power_w),
                                  fontsize=FONT["note"] - 1, xytext=(3, 3), textcoords="offset points", color=st["color"])
    picks = _per_front(chosen, len(fronts))
    pick_handle, picked = None, []
    for _front, pt in zip(fronts, picks):
        if pt is None:
            continue
        what = f"SLO {slo}: " if slo else "SLO pick: "
        pick_handle = ax_p.plot([pt.mean_latency_ms], [pt.mean_power_w], label=f"{what}least power", gid="slo-pick",
                                **PICK_STYLE)[0]
        ax_e.plot([pt.mean_latency_ms], [pt.efficiency], gid="slo-pick", **PICK_STYLE)
        picked.append((f"{pt.mean_power_w:.4g} W, w2 ∈ [{_w2(pt.w2_lo)}, {_w2(pt.w2_hi)}]",
                       (pt.mean_latency_ms, pt.mean_power_w)))
    bound_handle = None
    if slo_mean_ms is not None:
        for ax in (ax_p, ax_e):
            bound_handle = ax.axvline(slo_mean_ms, color="0.35", linestyle=(0, (4, 2)), linewidth=1.0,
                                      label=f"SLO W̄ ≤ {slo_mean_ms:g} ms")
    cur = _current(current)
    cur_handle = None
    if cur is not None:
        cw, cp, label = cur
        cur_handle = ax_p.plot([cw], [cp], label=label, gid="current-setting", **CURRENT_STYLE)[0]
        lams = {f.problem.lam for f in fronts}
        if len(lams) == 1:  # efficiency λ/P̄ needs the load; drawn when the fronts share one
            ax_e.plot([cw], [1e3 * lams.pop() / cp], gid="current-setting", **CURRENT_STYLE)
    for ax in (ax_p, ax_e):
        ax.set_xlabel("mean latency W̄ [ms]")
        ax.grid(True, alpha=0.3)
        _style_axes(ax)
    ax_p.set_ylabel("mean power P̄ [W]")
    ax_e.set_ylabel("energy efficiency λ/P̄ [requests/J]")
    for text, xy in picked:  # labels last, placed once the data fix the axes' limits
        _note(ax_p, text, xy, "#ffbf00", avoid=[cur[:2]] if cur is not None else ())
    marks = [h for h in (pick_handle, bound_handle, cur_handle) if h is not None]
    if len(scen) == 1:  # a few fronts of one scenario: the legend fits between them
        ax_p.legend(handles=front_handles + marks, fontsize=FONT["legend"], title="SMDP front (line style) and marks",
                    title_fontsize=FONT["legend"], loc="center right", handlelength=3)
    else:  # several scenarios: short fronts anywhere in the panel, so the fronts' legend goes under the figure
        fig.legend(handles=front_handles + marks, fontsize=FONT["legend"], loc="outside lower center",
                   ncols=min(len(front_handles) + len(marks), 4), handlelength=3,
                   title="SMDP front: line style = scenario" + (
                       ", marker fill = load (filled ρ low, hollow ρ high)" if len(loads) > 1 else ""),
                   title_fontsize=FONT["legend"])
    fam_list = [Line2D([], [], color=smdp["color"], marker=smdp["marker"], ms=3.5, label=smdp["label"])]
    ax_e.legend(handles=fam_list + list(fam_handles.values()), fontsize=FONT["legend"],
                title="rule (colour and marker)", title_fontsize=FONT["legend"], loc="lower right", handlelength=3)
    first = "b" if model_panel else "a"  # panels are lettered as in the paper's Figs. 7–9
    ax_p.set_title(f"({first}) latency–power trade-off", fontsize=FONT["title"])
    ax_e.set_title(f"({chr(ord(first) + 1)}) latency–efficiency trade-off", fontsize=FONT["title"])
    return fig


_SCENARIO_COLORS = ("#17becf", "#8c564b", "#bcbd22", "#393b79", "#e7969c", "#637939")  # none is a rule family's


def _model_panel(ax, fronts) -> None:
    probs: list[tuple[tuple, Any]] = []  # (curve specs and label, BatchingProblem)
    for f in fronts:
        key = (f.problem.latency.spec(), f.problem.energy.spec(), f.problem.service.spec(), f.label)
        if key[:3] not in [k[:3] for k, _ in probs]:
            probs.append((key, f.problem))
    same_curves = len({k[:2] for k, _ in probs}) == 1
    colors = [_SCENARIO_COLORS[i % len(_SCENARIO_COLORS)] for i in range(len(probs))]
    if same_curves and len(probs) > 1:  # only the service law differs: Fig. 9(a)
        b = 8 if 8 in probs[0][1].batch_sizes else probs[0][1].bmax
        for j, ((key, p), c) in enumerate(zip(probs, colors)):
            lb = float(p.latency_ms()[list(p.batch_sizes).index(b)])
            x = np.linspace(0.0, 4.0 * lb, 300)
            ax.plot(x, p.service.cdf(x, lb, b), color=c, linestyle=FRONT_LINESTYLES[j % len(FRONT_LINESTYLES)],
                    linewidth=1.6, label=key[3] or key[2])
        ax.set_xlabel(f"batch service time at b = {b} [ms]")
        ax.set_ylabel("CDF (probability)")
        ax.set_title("(a) service-time laws", fontsize=FONT["title"])
        ax.legend(fontsize=FONT["legend"], title="scenario", title_fontsize=FONT["legend"])
    else:  # Figs. 7(a), 8(a): batching effect in service rate and energy efficiency
        ax2 = ax.twinx()
        handles = []
        for (key, p), c in zip(probs, colors):
            b = np.asarray(p.batch_sizes, dtype=float)
            handles += ax.plot(b, b / p.latency_ms(), "-", color=c, linewidth=1.6, label=f"{key[3] or key[0]}: b/l(b)")
            handles += ax2.plot(b, 1e3 * b / p.energy_mj(), "--", color=c, linewidth=1.6,
                                label=f"{key[3] or key[1]}: b/ζ(b)")
        ax.set_xlabel("batch size b [requests]")
        ax.set_ylabel("service rate b/l(b) [requests/ms] (solid)")
        ax2.set_ylabel("energy efficiency b/ζ(b) [requests/J] (dashed)", fontsize=FONT["label"])
        ax2.tick_params(labelsize=FONT["tick"])
        ax.set_title("(a) batching effect", fontsize=FONT["title"])
        ax.legend(handles=handles, fontsize=FONT["legend"] - 0.5, loc="upper left", title="scenario",
                  title_fontsize=FONT["legend"])
    ax.grid(True, alpha=0.3)
    _style_axes(ax)


def _percentile_baselines(ax, baselines, value, fam_handles) -> None:
    """Baselines on a Fig. 6 panel: family colour and marker, static b labelled, knob rules as curves."""
    from matplotlib.lines import Line2D

    for fam, pts in _baseline_families(baselines).items():
        st = family_style(fam)
        exact = fam in ("greedy", "static")
        xy = [(value(b), b.mean_power_w) for b in pts if value(b) is not None]
        if not xy:
            continue
        xy.sort()
        xs, ys = zip(*xy)
        ax.plot(xs, ys, color=st["color"], marker=st["marker"], ms=6.5 if exact else 5.5, linestyle="none" if exact else ":",
                linewidth=0.9, markerfacecolor="none" if fam == "static" else st["color"], markeredgewidth=0.8)
        fam_handles.setdefault(fam, Line2D([], [], color=st["color"], marker=st["marker"], linestyle="none" if exact else ":",
                                           markerfacecolor="none" if fam == "static" else st["color"], label=st["label"]))
        if fam == "static":
            for b in pts:
                if value(b) is not None:
                    ax.annotate("b=" + b.setting.split(":")[1], (value(b), b.mean_power_w), fontsize=FONT["note"] - 1,
                                xytext=(3, 3), textcoords="offset points", color=st["color"])


def _cdf_style(label: str, k: int) -> dict:
    """Fig. 6(a) line of a rule by its name: family colour; SMDP policies in blue, the chosen one bold."""
    low = label.lower()
    if low.startswith("smdp"):
        chosen = "chosen" in low
        return dict(color=FAMILY_STYLE["smdp"]["color"], linewidth=2.6 if chosen else 1.2,
                    linestyle="-" if chosen else FRONT_LINESTYLES[1 + k % 3], alpha=1.0 if chosen else 0.8)
    fam = "static" if low.startswith("static") else low.split(":")[0]
    st = family_style(fam)
    return dict(color=st["color"], linewidth=1.2, linestyle=FRONT_LINESTYLES[k % len(FRONT_LINESTYLES)])


def plot_percentiles(front, baselines=(), cdfs: dict | None = None, bound_ms: float | None = None,
                     percentile: str = "p95_ms", *, chosen=None, slo: str | None = None,
                     slo_ms: float | None = None, current=None, within_target: float | None = None):
    """Fig. 6: (a) latency CDFs, (b) simulated percentile vs P̄, (c) share within ``bound_ms`` vs P̄.

    Baselines take their family's colour and marker (:data:`FAMILY_STYLE`); ``chosen`` (the SLO's
    pick, a FrontPoint) is starred on (b) and (c) and labelled with ``slo``; ``slo_ms`` draws the
    percentile bound on (b), ``bound_ms`` the latency bound on (a) and (c), ``within_target`` (a share in
    (0, 1], e.g. 0.95 for "95 % within bound_ms") the satisfaction SLO on (c).  ``current``: your current
    setting (a BaselinePoint with simulated percentiles), drawn as a pink ring on (b) and (c).
    """
    Line2D = require("matplotlib.lines", "figures").Line2D

    panels = (1 if cdfs else 0) + 1 + (1 if bound_ms is not None else 0)
    fig = _figure(panels, height=4.2, total_width=11.0 if panels == 3 else WIDTH_IN)
    axes = list(np.atleast_1d(fig.subplots(1, panels)))
    smdp = FAMILY_STYLE["smdp"]
    name = percentile[:-3]
    if cdfs:
        ax = axes.pop(0)
        for k, (label, (x, pr)) in enumerate(cdfs.items()):
            ax.plot(x, pr, label=label, **_cdf_style(label, k))
        if bound_ms is not None:
            ax.axvline(bound_ms, color="0.35", linestyle=(0, (4, 2)), linewidth=1.0, label=f"bound {bound_ms:g} ms")
        ax.set_xlabel("request latency [ms]")
        ax.set_ylabel("CDF (share of requests)")
        ax.set_title(f"(a) latency CDFs, {_front_label(front)}", fontsize=FONT["title"])
        ax.legend(fontsize=FONT["legend"] - 0.5, loc="lower right", title="rule", title_fontsize=FONT["legend"])
        ax.grid(True, alpha=0.3)
        _style_axes(ax)
    ax = axes.pop(0)
    pts = [p for p in front.points if percentile in p.percentiles]
    if not pts:
        raise InputError("the front has no simulated percentiles; sweep with simulate_requests > 0")
    pick_label = f"SLO {slo}: least power" if slo else "SLO pick: least power"
    fam_handles: dict = {}
    ax.plot([p.percentiles[percentile] for p in pts], [p.mean_power_w for p in pts], color=smdp["color"],
            marker=smdp["marker"], ms=3.5, linewidth=1.6, label=smdp["label"])
    _percentile_baselines(ax, baselines, lambda b: b.percentiles.get(percentile), fam_handles)
    extra = []
    if slo_ms is not None:
        extra.append(ax.axvline(slo_ms, color="0.35", linestyle=(0, (4, 2)), linewidth=1.0,
                                label=f"SLO {name} ≤ {slo_ms:g} ms"))
    elif bound_ms is not None:
        extra.append(ax.axvline(bound_ms, color="0.35", linestyle=(0, (4, 2)), linewidth=1.0,
                                label=f"bound {bound_ms:g} ms"))
    if chosen is not None and percentile in chosen.percentiles:
        extra += ax.plot([chosen.percentiles[percentile]], [chosen.mean_power_w], label=pick_label, gid="slo-pick",
                         **PICK_STYLE)
    cur_xy = None
    if current is not None and current.percentiles.get(percentile) is not None:
        cur_xy = (current.percentiles[percentile], current.mean_power_w)
        extra += ax.plot([cur_xy[0]], [cur_xy[1]], label=f"your setting {current.setting}", gid="current-setting",
                         **CURRENT_STYLE)
    if chosen is not None and percentile in chosen.percentiles:
        _note(ax, f"{chosen.mean_power_w:.4g} W, {name} {chosen.percentiles[percentile]:.3g} ms",
                  (chosen.percentiles[percentile], chosen.mean_power_w), "#ffbf00", avoid=[cur_xy] if cur_xy else ())
    smdp_h = Line2D([], [], color=smdp["color"], marker=smdp["marker"], ms=3.5, label=smdp["label"])
    if bound_ms is None:  # no panel (c): the families go here
        ax.legend(handles=[smdp_h, *fam_handles.values(), *extra], fontsize=FONT["legend"], loc="upper right",
                  title="rule", title_fontsize=FONT["legend"])
    else:  # the families' legend is panel (c)'s, where the upper left is empty; here what is marked
        ax.legend(handles=[smdp_h, *extra], fontsize=FONT["legend"], loc="upper right",
                  title="marks (rule colours as in the next panel)", title_fontsize=FONT["legend"] - 0.5)
    ax.set_xlabel(f"{name} latency [ms] (simulated)")
    ax.set_ylabel("mean power P̄ [W]")
    ax.set_title(f"({'b' if cdfs else 'a'}) {name}–power trade-off", fontsize=FONT["title"])
    ax.grid(True, alpha=0.3)
    _style_axes(ax)
    if bound_ms is not None:
        ax = axes.pop(0)
        ok = [p for p in front.points if bound_ms in p.within]
        ax.plot([100 * p.within[bound_ms] for p in ok], [p.mean_power_w for p in ok], color=smdp["color"],
                marker=smdp["marker"], ms=3.5, linewidth=1.6, label=smdp["label"])
        fam_handles = {}
        _percentile_baselines(ax, baselines, lambda b: 100 * b.within[bound_ms] if bound_ms in b.within else None,
                              fam_handles)
        extra = []
        if within_target is not None:
            extra.append(ax.axvline(100 * within_target, color="0.35", linestyle=(0, (4, 2)), linewidth=1.0,
                                    label=f"SLO ≥ {100 * within_target:g} % within {bound_ms:g} ms"))
        if chosen is not None and bound_ms in chosen.within:
            extra += ax.plot([100 * chosen.within[bound_ms]], [chosen.mean_power_w], label=pick_label,
                             gid="slo-pick", **PICK_STYLE)
        if current is not None and bound_ms in current.within:
            extra += ax.plot([100 * current.within[bound_ms]], [current.mean_power_w],
                             label=f"your setting {current.setting}", gid="current-setting", **CURRENT_STYLE)
        ax.legend(handles=[smdp_h, *fam_handles.values(), *extra], fontsize=FONT["legend"], loc="upper left",
                  title="rule", title_fontsize=FONT["legend"])
        ax.set_xlabel(f"requests within {bound_ms:g} ms [%] (simulated)")
        ax.set_ylabel("mean power P̄ [W]")
        ax.set_title(f"({'c' if cdfs else 'b'}) satisfaction–power trade-off", fontsize=FONT["title"])
        ax.grid(True, alpha=0.3)
        _style_axes(ax)
    return fig


def _w2(x: float) -> str:
    return "∞" if not math.isfinite(x) else f"{x:.3g}"


def finite_w2(x: float) -> str:
    """w2 for display: ∞ for the front's least-power end."""
    return "∞" if not math.isfinite(x) else f"{x:.4g}"
