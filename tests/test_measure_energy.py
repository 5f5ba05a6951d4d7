"""measure's NVML reading against a board whose counter refreshes every 100 ms (as NVML's did on an H200):
blocks of timed calls far shorter than a refresh still get each call's energy from the power between two
refreshes, not the zero-or-one step a plain difference would see."""

import sys
import threading
import time
import types

import numpy as np
import pytest

from smdp_batch.measure import measure

IDLE_W, BUSY_W, REFRESH_S = 60.0, 300.0, 0.1


class Board:
    """Power IDLE_W, or BUSY_W while a call runs; the counter shows the energy (mJ) at its latest refresh."""

    def __init__(self):
        self.lock = threading.Lock()
        self.t, self.e, self.busy = time.perf_counter(), 0.0, False
        self.shown, self.next = 0.0, self.t + REFRESH_S
        self.reads = 0

    def _advance(self):
        now = time.perf_counter()
        p = BUSY_W if self.busy else IDLE_W
        while self.next <= now:
            self.shown = self.e + p * (self.next - self.t)
            self.next += REFRESH_S
        self.e += p * (now - self.t)
        self.t = now

    def set(self, busy: bool):
        with self.lock:
            self._advance()
            self.busy = busy

    def read_mj(self, _h=None) -> float:
        with self.lock:
            self._advance()
            self.reads += 1
            return self.shown * 1e3


@pytest.fixture
def board(monkeypatch):
    b = Board()
    fake = types.ModuleType("pynvml")
    fake.nvmlInit = lambda: None
    fake.nvmlDeviceGetHandleByIndex = lambda i: i
    fake.nvmlDeviceGetName = lambda h: b"Stepped GPU"
    fake.nvmlDeviceGetTotalEnergyConsumption = b.read_mj
    monkeypatch.setitem(sys.modules, "pynvml", fake)
    return b


def test_each_call_gets_the_power_between_two_refreshes_times_its_duration(board):
    def fn(batch):
        board.set(True)
        time.sleep(0.002 * len(batch))
        board.set(False)

    m = measure(fn, lambda b: [0] * b, sizes=(1, 4), warmup=1, repeats=4, energy="nvml", progress=False)
    assert m.meta["energy_source"] == "nvml" and m.meta["complete"]
    assert "between two of its refreshes" in m.meta["energy_method"]
    assert np.array_equal(m.batch, [1] * 4 + [4] * 4)  # the calls that only extend the block are not rows
    # each block of 4 calls lasts 8-32 ms, a fraction of one 100 ms refresh: a plain difference of two reads
    # would give 0 or a whole step (30 J); between refreshes it is BUSY_W × the call's own time
    assert m.energy_mj == pytest.approx(BUSY_W * m.latency_ms, rel=0.03)


def test_a_counter_that_never_refreshes_is_read_as_it_is(monkeypatch):
    fake = types.ModuleType("pynvml")
    fake.nvmlInit = lambda: None
    fake.nvmlDeviceGetHandleByIndex = lambda i: i
    fake.nvmlDeviceGetName = lambda h: "Frozen GPU"
    fake.nvmlDeviceGetTotalEnergyConsumption = lambda h: 1234.0
    monkeypatch.setitem(sys.modules, "pynvml", fake)
    monkeypatch.setattr("smdp_batch.measure.energy.EDGE_WAIT_S", 0.05)
    t0 = time.perf_counter()
    m = measure(lambda batch: None, lambda b: [0] * b, sizes=(1, 2), repeats=3, energy="nvml", progress=False)
    assert m.meta["complete"] and np.all(m.energy_mj == 0.0)  # no refresh: the plain difference, 0
    assert time.perf_counter() - t0 < 2.0  # it waited EDGE_WAIT_S per size, no longer


def test_measure_reads_the_idle_power_and_compare_plans_with_it(board, tmp_path, monkeypatch, capsys):
    """Windows with no call (before the first size, after the last) give the board's idle draw; the sidecar
    carries it, ``profile`` shows it, and ``compare`` on that profile plans with it unless told otherwise."""
    import json

    from smdp_batch.cli import main

    def fn(batch):
        board.set(True)
        time.sleep(0.002 * len(batch))
        board.set(False)

    m = measure(fn, lambda b: [0] * b, sizes=(1, 4), warmup=1, repeats=4, energy="nvml", progress=False)
    assert m.meta["idle_power_w"] == pytest.approx(IDLE_W, rel=0.03)
    assert len(m.meta["idle_power_readings_w"]) == 2
    monkeypatch.chdir(tmp_path)
    m.write(str(tmp_path / "p.csv"))
    assert main(["profile", "p.csv", "--json"]) == 0
    assert json.loads(capsys.readouterr().out)["idle_power_w"] == pytest.approx(IDLE_W, rel=0.03)
    args = ["compare", "--latency", "csv:p.csv", "--energy", "csv:p.csv", "--batch-sizes", "1,4", "--rho", "0.5",
            "--slo-p99-ms", "100", "--requests", "2000", "--json"]
    assert main(args) == 0
    out = capsys.readouterr()
    d = json.loads(out.out)
    assert d["idle_power_w"] == pytest.approx(IDLE_W, rel=0.03) and d["idle_power_assumed"] is False
    assert "as measured beside p.csv" in out.err
    assert main([*args, "--idle-power", "0"]) == 0  # the option overrides it
    assert json.loads(capsys.readouterr().out)["idle_power_w"] == 0.0
