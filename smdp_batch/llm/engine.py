"""An iteration-level LLM serving engine with prefill + decode steps and a KV-cache memory cap.

Shared by BucketServe (paper 001) and paper 002's controllers (:mod:`.bucketserve`, :mod:`.memaware`).

* A **prefill step** runs a group of requests chosen by the scheduler: time = ``prefill_base`` +
  ``prefill_per_token`` · N · S_max (the group is padded to its longest prompt, S_max).
* A **decode step** gives every running request one token: time = ``decode_base`` +
  ``decode_per_request`` · n (per-token time linear in the batch size, paper 002 §II).
* **KV memory** per eq. 1 of paper 001, 2·L·H·D·S·bytes per request of (padded) length S: a request
  holds its group's S_max plus its generated tokens.  Padding is the waste of eqs. 2–3.
* The **cap** is hard: a prefill group that does not fit is cut to what fits; a decode step that would
  overflow first preempts the most recently admitted requests (their cache and generated tokens are
  dropped: they restart from the front of the queue with a new prefill, output from token 0 — vLLM's
  recompute keeps the generated tokens instead), so memory never exceeds the cap.  Preemptions are counted.

The scheduler has one decision point, ``admit(now, engine) -> list[int]`` (request ids for a prefill
group, or [] to decode), called before every step; it owns the waiting queue (``push``,
``push_front`` for preempted requests) and may name a timer, ``wakeup(engine) -> time``, at which an
idle engine asks again (a batching timeout).
"""

from __future__ import annotations

import math
from collections import deque
from dataclasses import dataclass, field

import numpy as np

from ..errors import InputError
from .workload import Requests

__all__ = ["LLMModel", "Engine", "EngineResult", "run"]


@dataclass(frozen=True)
class LLMModel:
    """Cost model.  Defaults: a LLaMA-2-13B-like model (L = H = 40, D = 128, FP16) with 10 GiB of KV
    memory; step times in seconds.  ``kv_bytes_per_token`` = 2·L·H·D·bytes (eq. 1 per token)."""

    layers: int = 40
    heads: int = 40
    head_dim: int = 128
    bytes_per_elem: int = 2
    mem_cap: float = 10 * 2**30  # bytes of KV memory (M_remain of eq. 5)
    prefill_base: float = 0.010
    prefill_per_token: float = 6e-5
    decode_base: float = 0.020
    decode_per_request: float = 2e-4

    def __post_init__(self):
        for name in ("layers", "heads", "head_dim", "bytes_per_elem"):
            v = getattr(self, name)
            if isinstance(v, bool) or not isinstance(v, (int, np.integer)) or v < 1:
                raise InputError(f"{name} must be an integer ≥ 1, got {v!r}")
        for name in ("mem_cap", "prefill_base", "prefill_per_token", "decode_base", "decode_per_request"):
            v = float(getattr(self, name))
            if not (math.isfinite(v) and v >= 0) or (name in ("mem_cap", "decode_base") and v <= 0):
                raise InputError(f"{name} must be finite and {'> 0' if name in ('mem_cap', 'decode_base') else '≥ 0'}, got {v!r}")

    @property
    def kv_bytes_per_token(self) -> float:
        return 2.0 * self.layers * self.heads * self.head_dim * self.bytes_per_elem

    def kv_bytes(self, s_max: float, n: int) -> float:
        """Eq. 1: 2·L·H·D·S_max·B·N bytes for a batch of N padded to S_max tokens."""
        return self.kv_bytes_per_token * s_max * n

    @property
    def cap_tokens(self) -> int:
        """η: the most KV tokens the cap holds."""
        return int(self.mem_cap // self.kv_bytes_per_token)

    def decode_time(self, n: int) -> float:
        return self.decode_base + self.decode_per_request * n

    def prefill_time(self, n: int, s_max: int) -> float:
        return self.prefill_base + self.prefill_per_token * n * s_max


class Engine:
    """State visible to schedulers: ``now``, ``running`` (ids), ``used_tokens``, ``free_tokens``,
    ``model``, ``requests``, ``completed_output`` (output lengths seen so far) and the recent decode
    steps (``recent_step_time``, ``recent_batch``)."""

    def __init__(self, model: LLMModel, requests: Requests, window: int = 20):
        self.model = model
        self.requests = requests
        self.now = 0.0
        self.running: list[int] = []
        self.kv = np.zeros(len(requests), np.int64)  # tokens held
        self.gen = np.zeros(len(requests), np.int64)
        self.used_tokens = 0
        self.completed_output: list[int] = []
        self._steps: deque = deque(maxlen=window)
        self.decode_steps = 0
        self.arrivals_left = len(requests)  # requests not yet arrived (0: the stream has ended)

    @property
    def free_tokens(self) -> int:
        return self.model.cap_tokens - self.used_tokens

    @property
    def recent_step_time(self) -> float:
        return float(np.mean([s[0] for s in self._steps])) if self._steps else 0.0

    @property
    def recent_batch(self) -> float:
        return float(np.mean([s[1] for s in self._steps])) if self._steps else 0.0


@dataclass
class EngineResult:
    """Per-request ``latency``, ``ttft`` (s); totals; memory statistics; the scheduler's name."""

    scheme: str
    latency: np.ndarray
    ttft: np.ndarray
    makespan: float
    output_tokens: int
    peak_tokens: int
    cap_tokens: int
    waste: float  # mean WasteRatio of eq. 2 over prefill groups
    padded_share: float  # padding tokens / prompt tokens admitted
    preemptions: int
    groups: int
    mean_step_time: float
    extra: dict = field(default_factory=dict)

    @property
    def throughput_tokens(self) -> float:
        return self.output_tokens / self.makespan

    @property
    def throughput_requests(self) -> float:
        return self.latency.size / self.makespan

    def summary(self, slo: float | None = None) -> dict:
        d = {
            "scheme": self.scheme, "requests": int(self.latency.size),
            "throughput_tok_s": self.throughput_tokens, "throughput_req_s": self.throughput_requests,
            "mean_latency_s": float(np.mean(self.latency)), "p95_latency_s": float(np.percentile(self.latency, 95)),
            "mean_ttft_s": float(np.mean(self.ttft)), "mean_tbt_s": self.mean_step_time,
            "waste_ratio": self.waste, "peak_memory_share": self.peak_tokens / self.cap_tokens,
            "preemptions": self.preemptions,
        }
        if slo is not None:
            d["slo_attainment"] = float(np.mean(self.latency <= slo))
        return d


def run(requests: Requests, scheduler, model: LLMModel | None = None, max_steps: int = 10_000_000) -> EngineResult:
    """Serve every request under ``scheduler``; returns latencies, throughput and memory statistics."""
    model = model or LLMModel()
    eng = Engine(model, requests)
    n = len(requests)
    arr, prompt, out = requests.arrival, requests.prompt, requests.output
    if int(prompt.max()) + 1 > model.cap_tokens:
        raise InputError(
            f"a prompt of {int(prompt.max())} tokens does not fit the KV cap of {model.cap_tokens} tokens "
            f"({model.mem_cap:.4g} bytes at {model.kv_bytes_per_token:.6g} bytes/token)"
        )
    done = np.full(n, np.nan)
    first = np.full(n, np.nan)
    order_admit: list[int] = []  # admission order of running requests (preempt from the end)
    nxt, finished, preempt, groups = 0, 0, 0, 0
    peak, waste_sum, pad_tokens, prompt_tokens, step_sum = 0, 0.0, 0, 0, 0.0
    eng.now = float(arr[0])
    for _ in range(max_steps):
        j = nxt
        while nxt < n and arr[nxt] <= eng.now:
            nxt += 1
        if nxt > j:
            eng.arrivals_left = n - nxt
            scheduler.push(list(range(j, nxt)), eng)
        group = list(scheduler.admit(eng.now, eng))
        if group:
            s_max = int(prompt[group].max())
            fit = max(0, eng.free_tokens // (s_max + 1))  # room for the padded prompt and one token
            if fit < len(group):
                scheduler.push_front(group[fit:], eng)
                group = group[:fit]
        if group:
            s_max = int(prompt[group].max())
            eng.now += model.prefill_time(len(group), s_max)
            for r in group:
                eng.kv[r] = s_max
                eng.gen[r] = 0
            eng.used_tokens += s_max * len(group)
            eng.running.extend(group)
            order_admit.extend(group)
            groups += 1
            avg = float(prompt[group].mean())
            waste_sum += (s_max - avg) / s_max
            pad_tokens += s_max * len(group) - int(prompt[group].sum())
            prompt_tokens += int(prompt[group].sum())
            peak = max(peak, eng.used_tokens)
            continue
        if eng.running:
            # one decode step needs one more token per running request: preempt the newest until it fits
            while eng.used_tokens + len(eng.running) > model.cap_tokens and len(eng.running) > 1:
                victim = order_admit.pop()
                eng.running.remove(victim)
                eng.used_tokens -= int(eng.kv[victim])
                eng.kv[victim] = 0
                eng.gen[victim] = 0
                first[victim] = np.nan
                scheduler.push_front([victim], eng)
                preempt += 1
            if eng.used_tokens + len(eng.running) > model.cap_tokens:
                raise InputError(
                    f"request {eng.running[0]} alone outgrows the KV cap of {model.cap_tokens} tokens "
                    f"(prompt {int(prompt[eng.running[0]])} + output {int(out[eng.running[0]])}): raise mem_cap"
                )
            dt = model.decode_time(len(eng.running))
            eng.now += dt
            step_sum += dt
            eng.decode_steps += 1
            eng._steps.append((dt, len(eng.running)))
            r = np.asarray(eng.running, np.int64)
            eng.gen[r] += 1
            eng.kv[r] += 1
            eng.used_tokens += r.size
            peak = max(peak, eng.used_tokens)
            fresh = r[np.isnan(first[r])]
            first[fresh] = eng.now
            fin = r[eng.gen[r] >= out[r]]
            if fin.size:
                for q in fin.tolist():
                    eng.running.remove(q)
                    order_admit.remove(q)
                    eng.used_tokens -= int(eng.kv[q])
                    eng.kv[q] = 0
                    eng.completed_output.append(int(out[q]))
                done[fin] = eng.now
                finished += fin.size
                if finished == n:
                    break
            continue
        wake = getattr(scheduler, "wakeup", None)
        t_next = min(float(arr[nxt]) if nxt < n else math.inf, wake(engine=eng) if wake else math.inf)
        if t_next > eng.now and math.isfinite(t_next):
            eng.now = t_next  # idle until the next arrival or the scheduler's own timer
            continue
        raise InputError(f"scheduler {scheduler.name} left {n - finished} requests waiting with an idle engine")
    else:
        raise InputError(f"simulation did not finish within {max_steps} steps")
    return EngineResult(
        scheme=scheduler.name, latency=done - arr, ttft=first - arr, makespan=float(np.nanmax(done) - arr[0]),
        output_tokens=int(out.sum()), peak_tokens=int(peak), cap_tokens=model.cap_tokens,
        waste=waste_sum / max(groups, 1), padded_share=pad_tokens / max(prompt_tokens, 1), preemptions=preempt,
        groups=groups, mean_step_time=step_sum / max(eng.decode_steps, 1), extra=dict(getattr(scheduler, "log", {})),
    )
