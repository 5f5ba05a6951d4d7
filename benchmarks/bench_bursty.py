"""Bursty traffic: the MAP table with the phase filter against the Poisson table, the λ-bank and
best-tuned server timeouts, on the same streams — the table and front figure of docs/how-to/bursty-traffic.md.

    python benchmarks/bench_bursty.py [--requests 1000000] [--front-requests 300000] [--figure docs/figures/bursty_front.png]
    python benchmarks/bench_bursty.py --quick      # 200 000 requests, no front (≈ 2 min)
    python benchmarks/bench_bursty.py --front-only # the figure alone (≈ 2 min)

Settings: two-phase MMPPs with burst ratio 2–10 and mean load ρ 0.3–0.8 (:func:`two_phase`), and a
synthetic diurnal + burst trace (a slow sinusoidal rate with short bursts, drawn as an inhomogeneous
Poisson process) to which a 2–4 phase MMPP is fitted (``fit-arrivals``); on the trace no true phase
exists, so the bound is left out and every rule runs on the trace itself.  The front: for w2 over a grid,
each family's best-tuned point (W̄, P̄) at ratio 10, ρ 0.3.  About 6 minutes on 2 cores.
"""

from __future__ import annotations

import argparse
import json
import time

import numpy as np

from smdp_batch.analysis.bursty import compare_bursty, format_report, two_phase

SETTINGS = [  # (ρ, burst ratio, mean sojourns low/high in ms)
    (0.3, 10, (100, 20)),
    (0.5, 4, (50, 50)),
    (0.7, 3, (40, 40)),
    (0.8, 2, (100, 100)),
]
FRONT_W2 = (0.0, 0.25, 0.5, 1.0, 2.0, 4.0)
FRONT_FAMILIES = ("map-filter", "poisson", "lambda-bank", "triton", "map-true")


def diurnal_trace(requests: int, seed: int = 0, rho: float = 0.5) -> np.ndarray:
    """Arrival times (ms) of an inhomogeneous Poisson process: mean load ρ, a sinusoidal 'day' of 20 s
    (rate ×0.4 … ×1.6) and bursts (×3 for 30 ms, about every 400 ms), by thinning."""
    from smdp_batch.model.problem import BatchingProblem

    rng = np.random.default_rng([seed, 77])
    base = rho * BatchingProblem.from_rho(0.5).max_lam
    top = base * 1.6 * 3.0
    horizon = requests / base * 1.1
    n = rng.poisson(top * horizon)
    t = np.sort(rng.uniform(0.0, horizon, n))
    starts = np.cumsum(rng.exponential(400.0, int(horizon / 400.0 * 2) + 10))
    in_burst = np.zeros(t.size, dtype=bool)
    idx = np.searchsorted(starts, t, side="right") - 1
    ok = idx >= 0
    in_burst[ok] = t[ok] - starts[idx[ok]] < 30.0
    rate = base * (1.0 + 0.6 * np.sin(2 * np.pi * t / 20_000.0)) * np.where(in_burst, 3.0, 1.0)
    keep = rng.random(t.size) < rate / top
    t = t[keep][:requests]
    observed = (t.size - 1) / (t[-1] - t[0])
    return (t - t[0]) * observed / base  # time rescaled so the mean rate is exactly ρ's


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--requests", type=int, default=1_000_000)
    ap.add_argument("--front-requests", type=int, default=300_000)
    ap.add_argument("--figure", default="docs/figures/bursty_front.png")
    ap.add_argument("--json", default=None, help="also write every row as JSON here")
    ap.add_argument("--quick", action="store_true")
    ap.add_argument("--front-only", action="store_true", help="only the front figure")
    args = ap.parse_args()
    if args.front_only:
        front(args.front_requests, args.figure, {})
        return
    n = 200_000 if args.quick else args.requests
    out = {"settings": [], "front": []}
    for rho, ratio, soj in SETTINGS:
        t0 = time.perf_counter()
        rep = compare_bursty(two_phase(rho, ratio, soj), w2=1.0, requests=n, seed=1)
        print(format_report(rep), f"\n  [{time.perf_counter() - t0:.1f} s]\n", flush=True)
        out["settings"].append({"rho": rho, "ratio": ratio, "sojourn_ms": soj, "rows": [r.as_dict() for r in rep.rows]})
    try:
        from smdp_batch.model.fit import fit_mmpp
    except ImportError:  # pragma: no cover - fit-arrivals not installed
        fit_mmpp = None
    if fit_mmpp is not None:
        t0 = time.perf_counter()
        trace = diurnal_trace(n)
        fit = fit_mmpp(trace, phases="auto", seed=0)
        rep = compare_bursty(fit.map, w2=1.0, stream=(trace, None, None), seed=1)
        print("diurnal + burst trace, fitted MMPP (fit-arrivals):")
        print(format_report(rep), f"\n  [{time.perf_counter() - t0:.1f} s]\n", flush=True)
        out["trace"] = {"fit": fit.map.describe(), "rows": [r.as_dict() for r in rep.rows]}
    if not args.quick:
        front(args.front_requests, args.figure, out)
    if args.json:
        with open(args.json, "w") as f:
            json.dump(out, f, indent=1, default=float)


def front(requests: int, figure: str, out: dict) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    a = two_phase(0.3, 10, (100, 20))
    stream = a.sample(requests, np.random.default_rng([1, 20]))
    pts = {f: [] for f in FRONT_FAMILIES}
    for w2 in FRONT_W2:
        rep = compare_bursty(a, w2=w2, stream=stream, seed=1)
        for f in FRONT_FAMILIES:
            r = rep.row(f).result
            pts[f].append((r.mean_power_w, r.mean_latency_ms, w2))
        print(f"front w2 = {w2:g}: " + ", ".join(f"{f} ({p[-1][0]:.2f} W, {p[-1][1]:.2f} ms)" for f, p in pts.items()),
              flush=True)
    out["front"] = {f: [{"mean_power_w": p, "mean_latency_ms": w, "w2": x} for p, w, x in v] for f, v in pts.items()}
    style = {"map-filter": ("C3", "o", "MAP table + phase filter (ours)"), "map-true": ("C3", "x", "MAP table, true phase (bound)"),
             "poisson": ("C0", "s", "Poisson table at mean λ (paper 004)"), "lambda-bank": ("C2", "^", "λ-bank (AdaptivePolicy)"),
             "triton": ("C7", "D", "Triton, best-tuned delay")}
    fig, ax = plt.subplots(figsize=(7.2, 4.6))
    for f in FRONT_FAMILIES:
        c, mk, label = style[f]
        v = sorted(pts[f])
        ax.plot([p for p, _, _ in v], [w for _, w, _ in v], marker=mk, color=c, label=label,
                linestyle=":" if f == "map-true" else "-", markersize=6, fillstyle="none" if f == "map-true" else "full")
    labels: list = []  # one label per spot: points within 0.1 W and 0.1 ms share it ("w2=0.25, 0.5")
    for p, w, x in pts["map-filter"]:
        near = [lab for lab in labels if abs(lab[0] - p) < 0.1 and abs(lab[1] - w) < 0.1]
        if near:
            near[0][2].append(f"{x:g}")
        else:
            labels.append((p, w, [f"{x:g}"]))
    for p, w, xs in labels:
        ax.annotate("w2=" + ", ".join(xs), (p, w), textcoords="offset points", xytext=(6, 4), fontsize=8, color="C3")
    ax.set_xlabel("mean power P̄ [W]")
    ax.set_ylabel("mean latency W̄ [ms]")
    ax.set_title(f"Bursty arrivals: MMPP, burst ratio 10, mean ρ = 0.3 ({requests} requests per point)", fontsize=10)
    ax.grid(alpha=0.3)
    ax.legend(fontsize=8)
    fig.tight_layout()
    fig.savefig(figure, dpi=130)
    print(f"figure: {figure}")


if __name__ == "__main__":
    main()
