"""Commands for the LLM-serving side: ``multibin`` (multi-bin batching, papers 000/003, against
per-bin SMDP tables on a request-time law) and ``llm`` (serving schemes of papers 000–002 on one
token-level engine)."""

from __future__ import annotations

import click

from ..errors import InputError
from ..limits import BMAX_LIMIT, LLM_REQUESTS_LIMIT, REQUESTS_LIMIT, SEED_MAX, check_llm_work
from .options import apply_renames, deprecated_option, emit, json_option, prepare_outputs, spec_files
from .types import FigurePath, Grid, Number, Seconds, option

_MB_COLS = [("scheme", "scheme", ""), ("lam", "λ", "g"), ("throughput", "throughput", ".4g"),
            ("mean_latency", "mean latency", ".4g"), ("p95_latency", "p95 latency", ".4g"),
            ("slo_attainment", "SLO share", ".3f"), ("mean_batch", "mean batch", ".1f"), ("max_wait", "max wait", "")]
_LLM_COLS = [("scheme", "scheme", ""), ("lam", "λ req/s", "g"), ("throughput_tok_s", "tokens/s", ".1f"),
             ("mean_latency_s", "mean s", ".3g"), ("p95_latency_s", "p95 s", ".3g"), ("mean_ttft_s", "TTFT s", ".3g"),
             ("slo_attainment", "SLO share", ".3f"), ("waste_ratio", "waste", ".3f"),
             ("peak_memory_share", "peak mem", ".3f"), ("preemptions", "preempted", "d")]
_LLM_SCHEMES = ("static", "continuous", "multibin", "perbin-smdp", "bucketserve", "bucketserve-sjf", "mem-aware", "sla")


@click.command("multibin", short_help="Compare multi-bin batching with per-bin SMDP tables over a load sweep.")
@option("--lam-grid", type=Grid(), default="1,2,4,6,8", show_default=True,
              help="Arrival rates λ (requests per time unit of --law).")
@option("--law", default="uniform:1,20", show_default=True, metavar="LAW",
              help="Request time law: uniform:LO,HI | exp:MU | trace:FILE[:COLUMN].")
@option("--bins", "k", type=Number(integer=True, min=1, max=64), default="2", show_default=True,
              help="Number of bins k (equal-mass edges, Lemma 4.1).")
@option("--batch", "B", type=Number(integer=True, min=1, max=BMAX_LIMIT), default="128", show_default=True, help="Batch size B.")
@option("--servers", type=Number(integer=True, min=0, max=1024), default="1", show_default=True,
              help="Servers (0: infinitely many; no per-bin SMDP then).")
@option("--requests", type=Number(integer=True, min=1, max=REQUESTS_LIMIT), default="100000", show_default=True,
              help="Requests simulated per load.")
@option("--max-waits", type=Grid(allow_empty=True), default="5,10,20,40,80,160", show_default=True,
              help="Max-wait grid for the tuned fixed-B rule ('' for none).")
@option("--smdp/--no-smdp", default=True, show_default=True, help="Solve and simulate the per-bin SMDP tables.")
@option("--slo-within-time", "slo", type=Number(min=0, min_open=True), default=None,
              help="Latency bound, in the time units of --law, for the SLO share column (share of requests within it).")
@deprecated_option("--slo", "--slo-within-time", "slo", type=Number(min=0, min_open=True))
@option("--seed", type=Number(integer=True, min=0, max=SEED_MAX), default="0", show_default=True,
              help="Random seed (the same stream for every scheme).")
@option("--plot", "plot_path", type=FigurePath(), default=None, help="Draw throughput and latency to FILE.png|.svg|.pdf.")
@json_option
@apply_renames
def multibin_cmd(lam_grid, law, k, B, servers, requests, max_waits, smdp, slo, seed, plot_path, as_json):
    """Multi-bin batching (papers 000/003) vs per-bin SMDP tables over a load sweep.

    Prints the closed forms (Thm 4.2 throughput, c_max, Lemma 5.1 latency for uniform laws), then one
    row per load and scheme on the same simulated stream.
    """
    from ..analysis.plots import save
    from ..llm import binsim, multibin
    from ..llm.sweep import format_rows, multibin_sweep, plot_rows

    prepare_outputs([("--plot", plot_path)], spec_files(law, "--law"))
    lams, n = lam_grid, requests
    if servers == 0 and smdp:
        raise InputError("--servers 0 (infinitely many) has no per-bin SMDP: add --no-smdp, or give --servers ≥ 1")
    rl = binsim.parse_request_law(law)
    rows = multibin_sweep(lams, law=rl, B=B, k=k, n=n, servers=servers, seed=seed, max_waits=max_waits, smdp=smdp, slo=slo)
    theory = {}
    if rl.kind == "uniform":
        lo, hi = rl.params
        theory = {"throughput_thm_4_2": multibin.uniform_throughput(k, B, lo, hi), "c_max": multibin.capacity(B, lo, hi),
                  "lemma_5_1_latency": {str(l): multibin.uniform_latency(l, k, B, lo, hi) for l in lams}}
    if plot_path:
        unit = "time unit"
        save(plot_rows(rows, [("throughput", f"throughput [requests / {unit}]"),
                              ("mean_latency", f"mean latency [{unit}s]"), ("p95_latency", f"p95 latency [{unit}s]")],
                       f"multi-bin batching, {rl.spec()} (times in its unit), k = {k}, B = {B}, servers = {servers or '∞'}",
                       xlabel=f"arrival rate λ [requests / {unit}]"), plot_path)
    head = f"multi-bin batching: {rl.spec()}, k = {k}, B = {B}, servers = {servers or '∞'}, {n} requests per load"
    if theory:
        head += (f"\n  Thm 4.2 saturation throughput {theory['throughput_thm_4_2']:.4g}, c_max {theory['c_max']:.4g}; "
                 "Lemma 5.1 latency " + ", ".join(f"λ={l}: {v:.4g}" for l, v in theory["lemma_5_1_latency"].items()))
    emit({"theory": theory, "rows": rows}, as_json, head + "\n" + format_rows(rows, _MB_COLS))


@click.command("llm", short_help="Run LLM serving schemes on one engine and one request stream per load.")
@option("--lam-grid", type=Grid(), default="0.5,1,2,3", show_default=True, help="Arrival rates (requests/s).")
@option("--requests", type=Number(integer=True, min=1, max=LLM_REQUESTS_LIMIT), default="2000", show_default=True,
        help="Requests per load (the engine is an event loop in Python: ~10³–10⁴ requests/s per scheme).")
@option("--prompt", default="lognormal:200,0.8", show_default=True, metavar="LAW",
              help="Prompt tokens: const:N | uniform:A,B | exp:MEAN | lognormal:MEDIAN,SIGMA.")
@option("--output-tokens", default="lognormal:150,0.7", show_default=True, metavar="LAW",
              help="Output tokens (same laws).")
@option("--schemes", default=",".join(_LLM_SCHEMES), show_default=True, metavar="NAME,…", help="Schemes to run.")
@option("--mem-gib", type=Number(min=0, min_open=True, max=1e6), default="10", show_default=True, help="KV-cache memory cap (GiB).")
@option("--slo-within-s", "slo", type=Seconds(min=0, min_open=True), default="20", show_default=True,
              help="End-to-end latency bound in seconds; the SLO share column is the share of requests within it.")
@deprecated_option("--slo", "--slo-within-s", "slo", type=Seconds(min=0, min_open=True))
@option("--d-sla", type=Number(min=0, min_open=True), default="0.024", show_default=True,
        help="Paper 002 Alg. 2's decode-step SLA D_SLA (s); at least one decode step of a single request.")
@option("--static-batch", type=Number(integer=True, min=1, max=BMAX_LIMIT), default="16", show_default=True,
              help="Batch size of static and multi-bin batching.")
@option("--max-batch", type=Number(integer=True, min=1, max=BMAX_LIMIT), default="64", show_default=True,
              help="Continuous batching's and BucketServe's largest batch.")
@option("--bins", "k", type=Number(integer=True, min=1, max=64), default="4", show_default=True,
              help="Multi-bin: bins by output length (equal mass).")
@option("--seed", type=Number(integer=True, min=0, max=SEED_MAX), default="0", show_default=True,
              help="Random seed (the same stream for every scheme).")
@option("--plot", "plot_path", type=FigurePath(), default=None, help="Draw the sweep to FILE.png|.svg|.pdf.")
@json_option
@apply_renames
def llm_cmd(lam_grid, requests, prompt, output_tokens, schemes, mem_gib, slo, d_sla, static_batch, max_batch, k, seed,
            plot_path, as_json):
    """LLM serving schemes (papers 000, 001, 002) on one engine and one request stream per load."""
    from ..analysis.plots import save
    from ..llm.engine import LLMModel
    from ..llm.sweep import format_rows, llm_sweep, plot_rows

    prepare_outputs([("--plot", plot_path)])
    mem = mem_gib
    model = LLMModel(mem_cap=mem * 2**30)
    names = [s.strip() for s in schemes.split(",") if s.strip()]
    check_llm_work(requests, len(lam_grid), len(names))
    rows = llm_sweep(lam_grid, n=requests, prompt=prompt, output=output_tokens, model=model, slo=slo, schemes=names,
                     static_batch=static_batch, max_batch=max_batch, k=k, d_sla=d_sla, seed=seed)
    if plot_path:
        save(plot_rows(rows, [("throughput_tok_s", "throughput [tokens/s]"), ("mean_latency_s", "mean latency [s]"),
                              ("slo_attainment", f"requests within {slo:g} s [%]", 100.0)],
                       f"LLM serving schemes, KV cap {mem:g} GiB", xlabel="arrival rate λ [requests/s]"), plot_path)
    head = (f"LLM serving: {requests} requests per load, prompts {prompt}, outputs {output_tokens}, "
            f"KV cap {mem:g} GiB = {model.cap_tokens} tokens, SLO {slo:g} s")
    notes = [f"  {r['scheme']} at λ = {r['lam']:g}: {r['note']}" for r in rows if "note" in r]
    table = format_rows([r for r in rows if "note" not in r], _LLM_COLS)
    emit({"rows": rows}, as_json, "\n".join([head, table] + notes))
