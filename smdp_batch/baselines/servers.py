"""The batching rules of real servers, as the simulator runs them (one model instance, one batch at a time; Triton
and TF-Serving also on c instances sharing the queue, Ray Serve on c replicas behind its router:
:mod:`smdp_batch.analysis.sim_kernels`).

Times are given in each server's own unit and converted to ms.  Semantics, and what we read:

* **Triton** ``dynamic_batching`` (Triton user guide, "Batchers → Dynamic Batcher"; model_config.proto
  ``ModelDynamicBatching``).  When the instance is free, the batcher forms a batch from the queued
  requests in arrival order.  If it can form a preferred size, it sends the largest preferred size it
  can form at once.  Otherwise it sends the largest batch ≤ max_batch_size. With
  max_queue_delay > 0 it first waits while no request has waited longer than the delay, unless an
  arrival makes a preferred size, or max_batch_size with no preferred sizes, formable. 0 means never
  wait: serve whatever is queued when the instance frees.
* **TF-Serving** ``batching_parameters`` (tensorflow_serving/batching README; SharedBatchScheduler).
  Requests join an open batch. The batch becomes schedulable when it is full (max_batch_size) or when
  batch_timeout_micros has passed since its first request, and it keeps accepting requests until a
  thread takes it. With one batch thread (num_batch_threads = 1), that is Triton's rule without
  preferred sizes and with delay = timeout.  ``allowed_batch_sizes`` pads a batch up to the next
  allowed size: the padded size's time and energy are paid.
* **Ray Serve** ``@serve.batch(max_batch_size, batch_wait_timeout_s)`` (ray/serve/batching.py of Ray 2.60,
  ``_BatchQueue.wait_for_batch`` and ``_process_batches``; measured on a real deployment: docs
  how-to/ray-serve.md, "What the real Ray Serve showed").  Batches are formed independently of the model: a batch opens when its first request is
  taken from the queue, closes batch_wait_timeout_s later or when it holds max_batch_size requests, and
  the next batch opens with the next arrival at once — ``_process_batches`` hands each batch to a task and
  loops without waiting for it; the task waits on a semaphore of ``max_concurrent_batches`` (1) permits,
  so closed batches run FIFO, one at a time.  So the batch size is set by the arrivals in the timeout
  window, not by the queue when the model frees: with batch_wait_timeout_s = 0 every request is its own
  batch (measured: mean batch 1.05 at ρ = 0.5 of the basic scenario, where batches of 1 cannot carry the
  load).  Older Ray (the source stored at commit 0156dec) awaited each batch before forming the next; that
  rule (timer from when the batcher starts waiting) is no longer what ``ray:`` simulates.
* **TorchServe** ``batch_size``, ``max_batch_delay`` (ms) (TorchServe docs, "Batch inference"). When the
  worker is free it takes the first request, then waits up to max_batch_delay for batch_size requests,
  and sends what it has.

The SMDP table and the simple policies (static, greedy, control-limit) are table rules: a batch size
per queue length, applied when a batch ends or a request reaches an idle server.

**Table + timer** (:func:`table_timer`, spelled ``SPEC+timer:MS``): a table with a guard on the oldest
request's wait, exactly as :class:`~smdp_batch.runtime.DynamicBatcher` runs it with ``max_wait_ms`` = τ.  At
each epoch (an arrival, a batch end) the table decides; while it says wait, once the oldest request has
waited τ the largest allowed batch size ≤ n is served (fewer than the smallest allowed size: the n waiting,
padded to it; the runtime's ``short_batch="pad"``).  τ = ∞ is the pure table.  The family holds Triton's
rule: :func:`triton_table` writes ``triton:max=B,delay_us=D[,preferred=…]`` as a table (serve the largest
preferred size ≤ min(n, B), or B once n ≥ B without preferred sizes; wait otherwise) with τ = D, and the
two run identically (tested request by request); TF-Serving without ``allowed_batch_sizes`` is that rule
too.  Ray Serve's and TorchServe's timers do not run from the oldest request's arrival, so they are not
members; the SLO optimiser (:mod:`smdp_batch.analysis.slo`) searches them beside it.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import numpy as np

from ..errors import InputError
from ..limits import BMAX_LIMIT, STATE_LIMIT
from ..runtime.table import PolicyTable
from ..specs.rows import as_rows

__all__ = ["ServerRule", "table_rule", "busy_table_rule", "is_busy_table", "table_timer", "triton_table", "split_timer", "triton", "tf_serving", "ray_serve", "torchserve", "server_padding", "parse_rule", "RULE_FORMS"]

RULE_FORMS = (
    "static:B, greedy, control:Q, FILE.h5 (each optionally +timer:MS), triton:max=B[,delay_us=D][,preferred=P1/P2][,pad=S1/S2/…], "
    "tfserving:max=B,timeout_us=T[,allowed=S1/S2/…], ray:max=B,timeout_s=T[,pad=…], torchserve:batch=B,delay_ms=D[,pad=…]"
)


@dataclass(frozen=True)
class ServerRule:
    """A batching rule in the simulator's terms (see the module doc)."""

    mode: str  # "table" | "busy" | "timer" | "timer-pad" | "triton" | "ray" | "torchserve"
    spec: str
    table: np.ndarray  # int64 policy[s], s = 0..top (table rules; "busy": its rows k = 0..c−1 one after the other)
    top: int
    maxb: int
    pref: np.ndarray  # int64 preferred sizes (Triton)
    delay: float  # ms
    allowed: tuple[int, ...] = ()  # padding targets (TF-Serving); () = no padding

    def pad_map(self, smax_exec: int) -> np.ndarray:
        """pad[n] = executed size for a batch of n requests."""
        pad = np.arange(smax_exec + 1, dtype=np.int64)
        if self.allowed:
            al = np.asarray(self.allowed)
            idx = np.searchsorted(al, pad[1:], side="left")
            pad[1:] = np.where(idx < al.size, al[np.minimum(idx, al.size - 1)], pad[1:])
        return pad

    def max_executed(self) -> int:
        return int(max(self.maxb, max(self.allowed, default=0), int(self.table.max())))

    def executed_sizes(self) -> list[int]:
        """Sizes this rule can execute (after padding)."""
        if self.mode in ("table", "busy"):
            return sorted({int(a) for a in self.table if a > 0})
        if self.mode in ("timer", "timer-pad"):  # the table's sizes and the allowed sizes a forced batch may use
            return sorted({int(a) for a in self.table if a > 0} | {int(a) for a in self.pref})
        if self.allowed:
            return list(self.allowed)
        return list(range(1, self.maxb + 1))

    def fewest_requests_for(self, s: int) -> int:
        """The fewest requests a batch executed at size s can hold."""
        if not self.allowed:
            return int(s)
        below = [a for a in self.allowed if a < s]
        return (max(below) + 1) if below else 1

    def check(self, batch_sizes) -> None:
        """Every executed size must be an allowed batch size of the problem (l, ζ are defined there)."""
        allowed = set(int(b) for b in batch_sizes)
        bad = [s for s in self.executed_sizes() if s not in allowed]
        if bad:
            raise InputError(
                f"rule {self.spec} executes batch size {bad[0]}, which the problem does not allow "
                f"(allowed: {sorted(allowed)[0]}..{sorted(allowed)[-1]} or the listed set); "
                "use --batch-sizes / --bmax to match the rule, or a policy file solved for these sizes"
            )


def _int(name: str, v, lo: int = 1) -> int:
    try:
        x = int(v)
        if x > BMAX_LIMIT * 1000:
            raise ValueError
    except (TypeError, ValueError, OverflowError):
        raise InputError(f"{name} must be an integer ≥ {lo}, got {v!r}") from None
    if x != float(v) or x < lo:
        raise InputError(f"{name} must be an integer ≥ {lo}, got {v!r}")
    return x


def _time(name: str, v) -> float:
    try:
        x = float(v)
    except (TypeError, ValueError):
        raise InputError(f"{name} must be a number ≥ 0, got {v!r}") from None
    if not (math.isfinite(x) and x >= 0):
        raise InputError(f"{name} must be a finite number ≥ 0, got {v!r}")
    return x


def _dummy() -> np.ndarray:
    return np.zeros(1, dtype=np.int64)


def table_rule(policy, batch_sizes=None, spec: str = "table") -> ServerRule:
    """A policy table: policy[s] for s = 0..s_max (validated as a :class:`~smdp_batch.runtime.PolicyTable`)."""
    p = PolicyTable(policy, batch_sizes).policy
    return ServerRule("table", spec, p, p.size - 1, int(p.max()), _dummy()[:0], 0.0)


def is_busy_table(policy) -> bool:
    """Whether ``policy`` is given as rows (a busy-aware table): a 2-D array or a list of sequences."""
    if isinstance(policy, np.ndarray):
        return policy.ndim == 2
    return isinstance(policy, (list, tuple)) and bool(policy) and all(isinstance(r, (list, tuple, np.ndarray))
                                                                        for r in policy)


def busy_table_rule(busy, batch_sizes=None, spec: str = "busy-aware table") -> ServerRule:
    """A busy-aware table for c instances sharing the queue: busy[k, s], the size started at queue length s with k
    instances busy (k = 0..c−1; each row validated as a :class:`~smdp_batch.runtime.PolicyTable`), applied at
    arrivals and batch ends while an instance is idle (:func:`~smdp_batch.solvers.multi_pi.solve_instances`).
    The simulator runs it as a table + timer with τ = ∞."""
    b, got = as_rows(busy)
    if b.ndim != 2 or b.shape[0] < 1:
        raise InputError(f"a busy-aware table is 2-D, one row per busy count 0..c−1, got {got}")
    rows = np.stack([PolicyTable(row, batch_sizes).policy for row in b])
    return ServerRule("busy", spec, rows.ravel(), rows.shape[1] - 1, int(rows.max()), _dummy()[:0], math.inf)


def table_timer(policy, batch_sizes, tau_ms: float, spec: str | None = None, forced: str = "largest") -> ServerRule:
    """A table with a timer τ (ms) on the oldest request's wait (module doc); τ = inf is the pure table.  A 2-D
    ``policy`` is a busy-aware table (:func:`busy_table_rule`), asked again at batch ends too.

    ``batch_sizes``: the allowed sizes.  ``forced``: a forced batch serves the largest allowed size ≤ n
    (``"largest"``, the runtime's default) or min(n, largest size) requests padded up to the next allowed
    size (``"pad"``, the runtime's ``short_batch="pad-up"``; Triton's rule on padded profiles)."""
    if forced not in ("largest", "pad"):
        raise InputError(f"a forced batch is 'largest' or 'pad', got {forced!r}")
    base = busy_table_rule(policy, batch_sizes) if is_busy_table(policy) else table_rule(policy, batch_sizes, spec="table")
    try:
        tau = float(tau_ms)
    except (TypeError, ValueError):
        raise InputError(f"the timer must be a number of ms ≥ 0 (or inf), got {tau_ms!r}") from None
    if not tau >= 0:
        raise InputError(f"the timer must be a number of ms ≥ 0 (or inf), got {tau_ms!r}")
    sizes = np.asarray(sorted(int(b) for b in (batch_sizes if batch_sizes is not None else base.executed_sizes())),
                       dtype=np.int64)
    top = int(base.table.max())
    small = int(sizes[0])
    allowed = tuple(int(b) for b in sizes if b <= max(top, small))
    if forced == "largest" and small == 1:
        allowed = ()  # nothing to pad: every n ≤ the largest size is itself allowed or above a smaller one
    name = spec if spec is not None else f"table+timer:{tau:g}" + (":pad" if forced == "pad" else "")
    return ServerRule("timer" if forced == "largest" else "timer-pad", name, base.table, base.top, base.maxb,
                      sizes[sizes <= max(top, small)], tau, allowed)


def split_timer(spec: str) -> tuple[str, float | None, str]:
    """``SPEC+timer:MS[:pad]`` → (SPEC, τ in ms, forced form); τ is None when there is no timer suffix."""
    text = spec.strip()
    head, plus, timer = text.rpartition("+")
    if not (plus and timer.strip().lower().startswith("timer")):
        return text, None, "largest"
    key, colon, value = timer.strip().partition(":")
    if key.strip().lower() != "timer" or not colon:
        raise InputError(f"rule {spec!r}: a timer is written +timer:MS[:pad] (the oldest request's wait bound in ms)")
    value, _, mode = value.strip().partition(":")
    if mode.strip().lower() not in ("", "pad"):
        raise InputError(f"rule {spec!r}: after +timer:MS only :pad may follow (forced batches padded up)")
    value = value.strip()
    tau = math.inf if value.lower() in ("inf", "infinity") else _time("the timer (ms)", value)
    return head, tau, "pad" if mode.strip() else "largest"


def triton_table(max_batch_size: int, preferred=()) -> np.ndarray:
    """Triton's dynamic batcher without its delay, as a table over n = 0..max_batch_size (module doc):
    the largest preferred size ≤ min(n, B), or B at n ≥ B when there are no preferred sizes; 0 = wait.
    With the timer τ = max_queue_delay it is Triton's rule (:func:`table_timer`)."""
    b = _int("Triton max_batch_size", max_batch_size)
    pref = sorted({_int("Triton preferred_batch_size", x) for x in preferred} | ({b} if not preferred else set()))
    n = np.arange(b + 1)
    out = np.zeros(b + 1, dtype=np.int64)
    for q in pref:
        out[n >= q] = q
    return out


def _pad(name: str, b: int, pad) -> tuple[int, ...]:
    """Sizes the model pads a batch up to (TensorRT profiles); the last must be max_batch_size."""
    al = tuple(sorted({_int(f"{name} pad size", x) for x in pad}))
    if al and al[-1] != b:
        raise InputError(f"{name}: the largest pad size must equal the max batch size {b}, got {list(al)}")
    return al


def server_padding(batch_sizes) -> tuple[int, ...]:
    """The sizes a server's batch is padded up to when the model allows only ``batch_sizes`` (TensorRT profiles
    1,2,4,…): () when every size 1..max is allowed, as the servers form any batch up to their maximum."""
    sizes = tuple(int(b) for b in batch_sizes)
    return () if sizes == tuple(range(1, sizes[-1] + 1)) else sizes


def _pad_spec(al) -> str:
    return f",pad={'/'.join(map(str, al))}" if al else ""


def triton(max_batch_size: int, max_queue_delay_us: float = 0.0, preferred=(), pad=()) -> ServerRule:
    """Triton's dynamic batcher; ``pad``: the model pads each batch to the next of these sizes (Triton itself
    forms any size ≤ max_batch_size, so a model with TensorRT profiles 1,2,4,… must pad)."""
    b = _int("Triton max_batch_size", max_batch_size)
    pref = sorted({_int("Triton preferred_batch_size", x) for x in preferred})
    if pref and pref[-1] > b:
        raise InputError(f"Triton preferred_batch_size {pref[-1]} exceeds max_batch_size {b}")
    d = _time("Triton max_queue_delay_microseconds", max_queue_delay_us)
    al = _pad("Triton", b, pad)
    spec = f"triton:max={b},delay_us={d:g}" + (f",preferred={'/'.join(map(str, pref))}" if pref else "") + _pad_spec(al)
    return ServerRule("triton", spec, _dummy(), 0, b, np.asarray(pref, dtype=np.int64), d / 1000.0, al)


def tf_serving(max_batch_size: int, batch_timeout_us: float, allowed=()) -> ServerRule:
    b = _int("TF-Serving max_batch_size", max_batch_size)
    al = tuple(sorted({_int("TF-Serving allowed_batch_sizes", x) for x in allowed}))
    if al and al[-1] != b:
        raise InputError(f"TF-Serving requires the last allowed_batch_sizes entry to equal max_batch_size {b}, got {list(al)}")
    d = _time("TF-Serving batch_timeout_micros", batch_timeout_us)
    spec = f"tfserving:max={b},timeout_us={d:g}" + (f",allowed={'/'.join(map(str, al))}" if al else "")
    return ServerRule("triton", spec, _dummy(), 0, b, _dummy()[:0], d / 1000.0, al)


def ray_serve(max_batch_size: int, batch_wait_timeout_s: float, pad=()) -> ServerRule:
    b = _int("Ray Serve max_batch_size", max_batch_size)
    d = _time("Ray Serve batch_wait_timeout_s", batch_wait_timeout_s)
    al = _pad("Ray Serve", b, pad)
    return ServerRule("ray", f"ray:max={b},timeout_s={d:g}" + _pad_spec(al), _dummy(), 0, b, _dummy()[:0], d * 1000.0, al)


def torchserve(batch_size: int, max_batch_delay_ms: float, pad=()) -> ServerRule:
    b = _int("TorchServe batch_size", batch_size)
    d = _time("TorchServe max_batch_delay", max_batch_delay_ms)
    al = _pad("TorchServe", b, pad)
    return ServerRule("torchserve", f"torchserve:batch={b},delay_ms={d:g}" + _pad_spec(al), _dummy(), 0, b,
                      _dummy()[:0], d, al)


def _kv(spec: str, arg: str, keys: dict) -> dict:
    out = {}
    for part in filter(None, (p.strip() for p in arg.split(","))):
        k, eq, v = part.partition("=")
        k = k.strip().lower()
        if not eq or k not in keys:
            raise InputError(f"rule {spec!r}: unknown setting {part!r}; valid settings: {', '.join(keys)}")
        out[keys[k]] = v.strip()
    return out


def parse_rule(spec: str, problem) -> ServerRule:
    """A rule from its CLI spelling (:data:`RULE_FORMS`); tables and files via the simple policies."""
    from . import parse_policy

    text = spec.strip()
    kind, _, arg = text.partition(":")
    kind = kind.lower()
    sizes = problem.batch_sizes
    if kind == "triton":
        kw = _kv(spec, arg, {"max": "b", "max_batch_size": "b", "delay_us": "d", "max_queue_delay_microseconds": "d",
                             "preferred": "p", "preferred_batch_size": "p", "pad": "a"})
        if "b" not in kw:
            raise InputError(f"rule {spec!r} needs max=B (max_batch_size)")
        return triton(kw["b"], kw.get("d", 0), [x for x in kw.get("p", "").split("/") if x],
                      [x for x in kw.get("a", "").split("/") if x])
    if kind in ("tfserving", "tf-serving", "tf"):
        kw = _kv(spec, arg, {"max": "b", "max_batch_size": "b", "timeout_us": "d", "batch_timeout_micros": "d",
                             "allowed": "a", "allowed_batch_sizes": "a"})
        if "b" not in kw or "d" not in kw:
            raise InputError(f"rule {spec!r} needs max=B and timeout_us=T")
        return tf_serving(kw["b"], kw["d"], [x for x in kw.get("a", "").split("/") if x])
    if kind in ("ray", "rayserve"):
        kw = _kv(spec, arg, {"max": "b", "max_batch_size": "b", "timeout_s": "d", "batch_wait_timeout_s": "d", "pad": "a"})
        if "b" not in kw or "d" not in kw:
            raise InputError(f"rule {spec!r} needs max=B and timeout_s=T")
        return ray_serve(kw["b"], kw["d"], [x for x in kw.get("a", "").split("/") if x])
    if kind == "torchserve":
        kw = _kv(spec, arg, {"batch": "b", "batch_size": "b", "delay_ms": "d", "max_batch_delay": "d", "pad": "a"})
        if "b" not in kw or "d" not in kw:
            raise InputError(f"rule {spec!r} needs batch=B and delay_ms=D")
        return torchserve(kw["b"], kw["d"], [x for x in kw.get("a", "").split("/") if x])
    head, tau, forced = split_timer(text)
    if tau is not None:
        base = parse_rule(head, problem)
        if base.mode not in ("table", "busy"):
            raise InputError(f"rule {spec!r}: +timer goes with a table (static:B, greedy, control:Q, FILE.h5), "
                             f"not with {base.spec.partition(':')[0]}'s own rule")
        return table_timer(base.table.reshape(-1, base.top + 1) if base.mode == "busy" else base.table, sizes, tau,
                           spec=f"{base.spec}+timer:{tau:g}" + (":pad" if forced == "pad" else ""), forced=forced)
    if text.lower().endswith((".h5", ".hdf5")):
        from ..runtime.schema import read_policy

        pf = read_policy(text)
        if tuple(pf.batch_sizes) != tuple(sizes):
            raise InputError(f"{text} was solved for batch sizes {list(pf.batch_sizes)}, not {list(sizes)}")
        if pf.policy_busy is not None:  # a c-server table's busy-aware rows: what the runtime follows
            return busy_table_rule(pf.policy_busy[:, :-1], sizes, spec=text)
        return table_rule(pf.policy[:-1], sizes, spec=text)
    if kind in ("static", "greedy", "control", "q"):
        s_max = problem.bmax
        if kind in ("control", "q"):
            s_max = max(s_max, _int("control limit Q", arg or "x"))
            if s_max > STATE_LIMIT:
                raise InputError(f"control limit Q must be ≤ {STATE_LIMIT} (the state limit), got {arg}")
        return table_rule(parse_policy(text, sizes, s_max)[:-1], sizes, spec=text)
    raise InputError(f"unknown policy or rule {spec!r}; valid: {RULE_FORMS}")
