"""Issue 17 (runtime): the batcher never freezes the event loop and never strands a request.

Every scenario runs with a hard timeout (a thread join or ``asyncio.wait_for``), so a regression fails
instead of hanging the suite.
"""

import asyncio
import math
import random
import time

import numpy as np
import pytest

from smdp_batch.errors import InputError
from smdp_batch.runtime import BatcherClosed, DynamicBatcher, PolicyTable, batched
from smdp_batch.runtime.batcher import BatcherBroken

from _threads import loop_within

SIZES = (4, 8, 16, 32)  # TensorRT-style profiles: Bmin = 4


def _bmin4_table() -> PolicyTable:
    """Wait below 4, then serve the largest profile ≤ min(n, 32)."""
    policy = [0 if s < 4 else max(b for b in SIZES if b <= min(s, 32)) for s in range(41)]
    return PolicyTable(policy, batch_sizes=SIZES)


class _Watchdog:
    """Ticks every 10 ms and records the longest gap between ticks (a frozen loop shows a long gap)."""

    def __init__(self):
        self.max_gap = 0.0
        self._task = asyncio.get_running_loop().create_task(self._tick())

    async def _tick(self):
        last = time.monotonic()
        while True:
            await asyncio.sleep(0.01)
            now = time.monotonic()
            self.max_gap = max(self.max_gap, now - last)
            last = now

    async def stop(self):
        self._task.cancel()
        await asyncio.gather(self._task, return_exceptions=True)


class _CountingPolicy:
    """A table's decide, counting how often the decision loop runs."""

    def __init__(self, table):
        self.t, self.calls = table, 0
        self.batch_sizes = table.batch_sizes

    def decide(self, n):
        self.calls += 1
        return self.t.decide(n)


# ------------------------------------------------------------------ 1. event-loop freeze
@pytest.mark.parametrize("short_batch", ["serve", "pad", "wait"])
def test_bound_below_bmin_never_freezes_the_loop(short_batch):
    """max_wait_ms=10 with Bmin = 4 and 2 waiting: the old loop spun at 100 % CPU for ever once the bound
    passed.  Now: 'serve' serves the 2, 'pad' pads them to 4, 'wait' sleeps until the next arrival."""
    seen = []

    async def infer(items):
        seen.append(list(items))
        await asyncio.sleep(0.001)
        return [f"y{x}" for x in items]

    async def main():
        pol = _CountingPolicy(_bmin4_table())
        bt = DynamicBatcher(infer, pol, max_wait_ms=10, short_batch=short_batch, pad_item="PAD")
        dog = _Watchdog()
        cpu0, t0 = time.process_time(), time.monotonic()
        first = [asyncio.ensure_future(bt.submit(x)) for x in "ab"]
        await asyncio.sleep(0.3)
        cpu, wall = time.process_time() - cpu0, time.monotonic() - t0
        assert dog.max_gap < 0.2, f"event loop stalled {dog.max_gap:.3f} s"
        assert cpu < 0.5 * wall, f"{cpu:.3f} s CPU in {wall:.3f} s: the batcher spins"
        assert pol.calls <= 6  # the decision loop ran a handful of times, not in a tight loop
        if short_batch == "wait":
            assert not any(f.done() for f in first) and seen == []
            later = [asyncio.ensure_future(bt.submit(x)) for x in "cd"]  # 4 waiting: the table serves them
            assert await asyncio.wait_for(asyncio.gather(*first, *later), 2) == ["ya", "yb", "yc", "yd"]
            assert seen == [list("abcd")] and bt.metrics.forced_batches == 0
        else:
            assert await asyncio.wait_for(asyncio.gather(*first), 2) == ["ya", "yb"]
            assert seen == [["a", "b"]] if short_batch == "serve" else [["a", "b", "PAD", "PAD"]]
            assert bt.metrics.forced_batches == 1 and bt.metrics.padded_batches == (short_batch == "pad")
            assert 0.009 <= bt.metrics.max_wait_ms / 1e3 < 0.2
        await dog.stop()
        await asyncio.wait_for(bt.close(), 2)

    loop_within(main)


def test_wait_mode_drain_fails_only_the_short_remainder():
    """short_batch='wait' never hands infer a batch below Bmin, not even at close(drain=True)."""

    async def main():
        seen = []
        bt = DynamicBatcher(lambda items: seen.append(list(items)) or items, _bmin4_table(), max_wait_ms=None,
                            short_batch="wait")
        futs = [asyncio.ensure_future(bt.submit(i)) for i in range(6)]
        await asyncio.sleep(0.01)  # 4 served at the 4th arrival, 2 left below Bmin
        await asyncio.wait_for(bt.close(drain=True), 2)
        out = await asyncio.gather(*futs, return_exceptions=True)
        assert out[:4] == [0, 1, 2, 3] and all(isinstance(r, BatcherClosed) for r in out[4:])
        assert seen == [[0, 1, 2, 3]]

    loop_within(main)


def test_forced_batch_serves_the_largest_profile_then_the_rest():
    """Overdue with 6 waiting and a callable policy that always waits: a batch of 4, then the 2 left."""
    seen = []

    class Never:
        batch_sizes = SIZES

        def decide(self, n):
            return 0

    async def main():
        bt = DynamicBatcher(lambda items: seen.append(list(items)) or items, Never(), max_wait_ms=5)
        assert await asyncio.wait_for(asyncio.gather(*(bt.submit(i) for i in range(6))), 2) == list(range(6))
        assert seen == [[0, 1, 2, 3], [4, 5]] and bt.metrics.forced_batches == 2
        await bt.close()

    loop_within(main)


# ------------------------------------------------------------------ 2. faults: exactly one outcome each
class Boom(BaseException):
    """A KeyboardInterrupt-like BaseException that is not an Exception."""


def _bad_policy(kind):
    def decide(n):
        if decide.calls == 1:  # the first batch is served normally
            if kind == "raise":
                raise ValueError("policy exploded")
            return {"negative": -1, "too_many": n + 1, "float": 2.0, "nan": math.nan, "str": "3",
                    "bool": True, "none": None}[kind]
        decide.calls += 1
        return min(n, 2)

    decide.calls = 0
    return decide


FAULTS = ["infer_base", "infer_cancelled", "sync_infer_base", "task_cancelled", "policy_raise", "policy_negative",
          "policy_too_many", "policy_float", "policy_nan", "policy_str", "policy_bool", "policy_none"]


@pytest.mark.parametrize("drain", [True, False])
@pytest.mark.parametrize("fault", FAULTS)
def test_every_fault_ends_every_request_once_and_breaks_the_batcher(fault, drain):
    batches = []

    async def ainfer(items):
        batches.append(list(items))
        await asyncio.sleep(0.005)
        if len(batches) == 2:
            if fault == "infer_base":
                raise Boom("infer died")
            if fault == "infer_cancelled":
                raise asyncio.CancelledError()
        return [x * 10 for x in items]

    def sinfer(items):
        batches.append(list(items))
        if len(batches) == 2:
            raise Boom("sync infer died")
        return [x * 10 for x in items]

    async def main():
        policy = _bad_policy(fault[7:]) if fault.startswith("policy") else PolicyTable([0, 1, 2, 2])
        bt = DynamicBatcher(sinfer if fault.startswith("sync") else ainfer, policy, max_wait_ms=None)
        outcomes = {}

        async def client(i):
            try:
                r = await bt.submit(i)
            except asyncio.CancelledError:
                outcomes.setdefault(i, []).append("cancelled")
                raise
            except BaseException as exc:  # noqa: BLE001 - the outcome under test
                outcomes.setdefault(i, []).append(exc)
            else:
                outcomes.setdefault(i, []).append(r)

        tasks = [asyncio.ensure_future(client(i)) for i in range(8)]
        if fault == "task_cancelled":
            for _ in range(2000):  # until the second batch is running (not a fixed sleep: robust under load)
                if len(batches) == 2:
                    break
                await asyncio.sleep(0.0005)
            bt._task.cancel()
        await asyncio.wait_for(asyncio.gather(*tasks, return_exceptions=True), 2)
        assert sorted(outcomes) == list(range(8)) and all(len(v) == 1 for v in outcomes.values())
        got = [v[0] for _, v in sorted(outcomes.items())]
        assert got[:2] == [0, 10]  # the first batch, before the fault
        assert all(isinstance(r, BatcherBroken) for r in got[2:]), got
        assert isinstance(bt.broken, BaseException) and "stopped on a fault" in str(got[2])
        cause = got[2].__cause__
        assert cause is bt.broken
        if fault.startswith("policy"):
            assert "queue length" in str(cause)
        with pytest.raises(BatcherBroken, match="stopped on a fault"):
            await bt.submit(99)  # refuses new work, naming the cause
        with pytest.raises(BatcherClosed):  # BatcherBroken is a BatcherClosed
            await bt.submit(100)
        await asyncio.wait_for(bt.close(drain=drain), 2)  # does not re-raise the fault
        await asyncio.wait_for(bt.close(drain=not drain), 2)
        assert bt.metrics.queue_length == 0 and len(bt._queue) == 0

    loop_within(main)


def test_keyboard_interrupt_still_stops_the_program_after_ending_every_request():
    outcomes = {}

    async def infer(items):
        await asyncio.sleep(0.002)
        raise KeyboardInterrupt

    async def main():
        bt = DynamicBatcher(infer, PolicyTable([0, 1, 1]), max_wait_ms=None)

        async def client(i):
            try:
                outcomes[i] = await bt.submit(i)
            except BaseException as exc:  # noqa: BLE001
                outcomes[i] = exc
                if isinstance(exc, asyncio.CancelledError):
                    raise

        await asyncio.gather(*(client(i) for i in range(5)))

    with pytest.raises(KeyboardInterrupt):
        loop_within(main)
    assert sorted(outcomes) == list(range(5))  # nobody left waiting


def test_caller_cancelled_mid_batch_gets_cancelled_and_the_rest_their_results():
    async def infer(items):
        await asyncio.sleep(0.02)
        return [x + 1 for x in items]

    async def main():
        bt = DynamicBatcher(infer, PolicyTable([0, 1, 2, 3, 3]))
        futs = [asyncio.ensure_future(bt.submit(i)) for i in range(3)]
        await asyncio.sleep(0.005)
        assert bt.metrics.busy
        futs[1].cancel()
        out = await asyncio.wait_for(asyncio.gather(*futs, return_exceptions=True), 2)
        assert out[0] == 1 and isinstance(out[1], asyncio.CancelledError) and out[2] == 3
        assert bt.broken is None and await bt.submit(7) == 8
        await bt.close()

    loop_within(main)


@pytest.mark.parametrize("fault", ["infer_base", "policy_bad"])
def test_stress_with_a_fault_in_the_middle(fault):
    """10⁴ requests, random cancellations and failures, one fault mid-stream, submissions continuing after
    it: every request ends with exactly one outcome and nothing hangs."""
    N = 10_000
    rng = random.Random(17)
    table = PolicyTable([0] + [min(n, 16) for n in range(1, 40)])
    state = {"batches": 0}

    async def infer(items):
        state["batches"] += 1
        if rng.random() < 0.5:
            await asyncio.sleep(0)
        if fault == "infer_base" and state["batches"] == 300:
            raise Boom("mid-stream")
        if rng.random() < 0.05:
            raise RuntimeError("injected failure")
        return [x * 3 for x in items]

    def policy(n):
        return -1 if fault == "policy_bad" and state["batches"] >= 300 else table.decide(n)

    async def main():
        bt = DynamicBatcher(infer, policy, max_wait_ms=None)
        outcome = {}

        async def client(i):
            try:
                r = await bt.submit(i)
            except asyncio.CancelledError:
                outcome.setdefault(i, []).append("cancel")
                raise
            except (RuntimeError, BatcherClosed) as exc:
                outcome.setdefault(i, []).append(type(exc).__name__)
            else:
                outcome.setdefault(i, []).append(("ok", r))

        tasks, loop = [], asyncio.get_running_loop()
        for i in range(N):
            t = asyncio.ensure_future(client(i))
            tasks.append(t)
            if rng.random() < 0.1:
                loop.call_later(rng.random() * 0.02, t.cancel)
            if i % 100 == 0:
                await asyncio.sleep(0)
        await asyncio.wait_for(asyncio.gather(*tasks, return_exceptions=True), 30)
        await asyncio.wait_for(bt.close(), 2)
        assert sorted(outcome) == list(range(N)) and all(len(v) == 1 for v in outcome.values())
        kinds = [v[0] for v in outcome.values()]
        assert all(k[1] == 3 * i for i, (k,) in outcome.items() if isinstance(k, tuple))
        assert "BatcherBroken" in kinds and any(isinstance(k, tuple) for k in kinds)
        assert bt.broken is not None and bt.metrics.queue_length == 0

    loop_within(main, timeout=60)


# ------------------------------------------------------------------ 4. memory and decide()
def test_submit_then_cancel_keeps_the_queue_bounded():
    """20 000 submit-then-cancel cycles below the control limit: the queue stays ≤ 2n + 33 entries, and the
    few requests left waiting are still served FIFO."""

    async def main():
        bt = DynamicBatcher(lambda items: items, PolicyTable([0] * 2000 + [2000]), max_wait_ms=None)
        keep, worst = [], 0
        for round_ in range(20):
            tasks = [asyncio.ensure_future(bt.submit((round_, i))) for i in range(1000)]
            await asyncio.sleep(0)  # all submitted
            for i, t in enumerate(tasks):
                if i == 500:
                    keep.append(t)
                else:
                    t.cancel()
            await asyncio.sleep(0)
            await asyncio.sleep(0)  # cancellation callbacks ran
            worst = max(worst, len(bt._queue) - 2 * bt.metrics.queue_length)
        assert bt.metrics.queue_length == 20 and worst <= 33, (len(bt._queue), worst)
        await asyncio.wait_for(bt.close(drain=True), 2)
        assert [await t for t in keep] == [(r, 500) for r in range(20)]
        assert bt.metrics.cancelled == 20 * 999

    loop_within(main)


def test_decide_and_decide_many_follow_one_rule():
    t = PolicyTable([0, 0, 2, 3])
    assert t.decide_many([]).dtype == np.int64 and t.decide_many([]).shape == (0,)
    assert t.decide_many(np.empty((0, 3), dtype=np.int64)).shape == (0, 3)
    assert t.decide(np.int64(3)) == t.decide(3) == 3 and type(t.decide(np.int64(3))) is int
    assert t.decide(np.uint8(200)) == 3 and t.decide(10**30) == 3
    assert t.decide_many(np.array([0, 2, 3, 10**12])).tolist() == [0, 2, 3, 3]
    assert t.decide_many(np.array([1, 5], dtype=np.uint64)).tolist() == [0, 3]
    for bad in (math.nan, 2.7, 3.0, -1, True, np.float64(3), "3", None):
        with pytest.raises(InputError, match="integer"):
            t.decide(bad)
        with pytest.raises(InputError, match="integers"):
            t.decide_many([bad])


# ------------------------------------------------------------------ the decorator
def test_batched_takes_the_batcher_options_and_one_batcher_per_loop():
    seen = []

    @batched(_bmin4_table(), max_wait_ms=5, short_batch="pad", pad_item=0)
    async def double(items):
        seen.append(list(items))
        return [2 * x for x in items]

    async def main():
        out = await asyncio.wait_for(asyncio.gather(*(double(i) for i in (1, 2, 3))), 2)
        assert out == [2, 4, 6] and double.batcher.max_wait_ms == 5
        await double.batcher.close()
        return double.batcher

    first = loop_within(main)
    assert seen == [[1, 2, 3, 0]] and first.metrics.padded_batches == 1
    assert loop_within(main) is not first  # a new loop gets a fresh batcher
    with pytest.raises(ValueError, match="short_batch"):
        batched(_bmin4_table(), short_batch="drop")
    with pytest.raises(ValueError, match="max_wait_ms"):
        batched(_bmin4_table(), max_wait_ms=-1)
