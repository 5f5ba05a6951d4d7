"""What a :class:`~smdp_batch.runtime.DynamicBatcher` reports: its exceptions and its counters."""

from __future__ import annotations

from collections import Counter
from dataclasses import dataclass, field

__all__ = ["BatcherClosed", "BatcherBroken", "BatcherMetrics"]


class BatcherClosed(RuntimeError):
    """The batcher was closed before this request could be served."""


class BatcherBroken(BatcherClosed):
    """The batcher stopped on a fault (its ``__cause__``); it serves nothing more."""


@dataclass
class BatcherMetrics:
    """Counters since start; waits in ms (submit → batch start)."""

    submitted: int = 0
    completed: int = 0
    failed: int = 0
    cancelled: int = 0
    batches: int = 0
    batch_sizes: Counter = field(default_factory=Counter)
    total_wait_ms: float = 0.0
    max_wait_ms: float = 0.0
    queue_length: int = 0
    busy: bool = False
    forced_batches: int = 0  # served because the oldest request reached max_wait_ms
    padded_batches: int = 0  # forced batches padded to the smallest allowed size (short_batch="pad")
    timed_out_batches: int = 0  # infer calls that passed batch_timeout_s (their callers got TimeoutError)

    @property
    def mean_wait_ms(self) -> float:
        served = sum(b * c for b, c in self.batch_sizes.items())
        return self.total_wait_ms / served if served else 0.0

    @property
    def mean_batch_size(self) -> float:
        return sum(b * c for b, c in self.batch_sizes.items()) / self.batches if self.batches else 0.0
