"""The bounded load generator's own behaviour (smdp_batch.integrations.loadgen): every request sent on its schedule
and answered once, and the process's heap frozen while it sends (a full garbage collection over the libraries'
objects would stop the sender and land in the measured p99), then given back as it was."""

from __future__ import annotations

import asyncio
import gc
import threading

import numpy as np
import pytest

from smdp_batch.errors import InputError
from smdp_batch.integrations.loadgen import frozen_heap, replay, send_lag_ms


def _run(arr, seen=None):
    async def send(i: int):
        if seen is not None:
            seen.append(gc.get_freeze_count())
        await asyncio.sleep(0.001)
        return 2 * i

    return asyncio.run(replay(send, arr, 1.0, max_seconds=10.0))


def test_replay_sends_every_request_once_and_answers_it_with_its_own_result():
    arr = np.arange(50) * 2.0  # every 2 ms
    sent, done, results, errors = _run(arr)
    assert errors == 0 and results == [2 * i for i in range(50)]
    assert np.all(done >= sent) and np.all(np.diff(sent) >= 0)
    assert np.nanmax(np.abs(send_lag_ms(sent, arr, 1.0))) < 1000.0  # on schedule within a loaded host's slack
    with pytest.raises(InputError, match="sorted"):
        _run(np.array([3.0, 1.0]))


def test_the_heap_is_frozen_while_replay_sends_and_given_back_after():
    gc.unfreeze()
    seen: list = []
    _run(np.arange(20) * 1.0, seen)
    assert len(seen) == 20 and min(seen) > 0  # frozen for every send
    assert gc.get_freeze_count() == 0  # and given back


def test_the_environment_can_leave_the_collector_alone(monkeypatch):
    gc.unfreeze()
    monkeypatch.setenv("SMDP_BATCH_LOADGEN_FREEZE_GC", "0")
    seen: list = []
    _run(np.arange(5) * 1.0, seen)
    assert seen == [0] * 5


def test_a_heap_the_caller_froze_or_a_collector_it_disabled_is_left_as_it_is():
    gc.unfreeze()
    gc.freeze()
    try:
        _run(np.arange(5) * 1.0)
        assert gc.get_freeze_count() > 0  # not unfrozen by us
    finally:
        gc.unfreeze()
    gc.disable()
    try:
        seen: list = []
        _run(np.arange(5) * 1.0, seen)
        assert seen == [0] * 5 and not gc.isenabled()
    finally:
        gc.enable()


def test_nested_and_concurrent_loads_share_one_freeze_undone_by_the_last():
    gc.unfreeze()
    inside = threading.Event()
    release = threading.Event()

    def other():
        with frozen_heap():
            inside.set()
            release.wait(10)

    t = threading.Thread(target=other)
    t.start()
    assert inside.wait(10)
    with frozen_heap():
        assert gc.get_freeze_count() > 0
    assert gc.get_freeze_count() > 0  # the other thread's load still runs
    release.set()
    t.join(10)
    assert gc.get_freeze_count() == 0
