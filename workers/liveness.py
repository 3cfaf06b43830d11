"""Liveness of a worker's consumer: a partition it holds with messages waiting (its committed
offset below the end of the log) that makes no progress — no message of it handled, its
committed offset unmoved — for MEMSTREAM_STALL_SECONDS is stalled. faust-streaming #523/#175
describe such a consumer (in 1 of 11 chaos runs a restarted resolver was assigned its partitions,
logged "Worker ready" and fetched nothing for 5.6 minutes, until the next rebalance); nothing
upstream fixes it. The first stall makes the worker leave and rejoin its group (a rebalance
starts its fetcher again); a second one exits the process with EXIT_STALLED so its supervisor
starts it again. Effectively-once makes both safe: what was not committed is delivered again.

`StallWatch` decides (pure, time given); workers.app reads the consumer and acts."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Generic, Hashable, Mapping, TypeVar

EXIT_STALLED = 75  # EX_TEMPFAIL: a supervisor restarts the worker
P = TypeVar("P", bound=Hashable)  # a partition (faust's TP in workers.app)


@dataclass
class StallWatch(Generic[P]):
    bound_s: float
    stalls: int = 0  # stalls seen by this process
    _seen: dict[P, tuple[float, int | None]] = field(
        default_factory=dict
    )  # partition → (last progress, committed offset then)

    def handled(self, tp: P, now: float) -> None:
        """A message of the partition was handled: progress."""
        self._seen[tp] = (now, self._seen.get(tp, (now, None))[1])

    def check(self, now: float, committed: Mapping[P, int | None], end_offsets: Mapping[P, int | None]) -> list[P]:
        """The assigned partitions (`committed`: each one's committed offset) stalled now.
        A partition seen for the first time, whose committed offset moved, or with nothing to
        fetch (committed at the end of its log) made progress now."""
        for gone in set(self._seen) - set(committed):
            del self._seen[gone]
        stalled = []
        for tp, offset in committed.items():
            end = end_offsets.get(tp)
            last, then = self._seen.get(tp, (None, None))
            if last is None or offset != then or end is None or (offset or 0) >= end:
                self._seen[tp] = (now, offset)
            elif now - last > self.bound_s:
                stalled.append(tp)
        return sorted(stalled, key=repr)

    def stalled(self, tps: list[P], now: float) -> str:
        """What to do about a stall: 'rejoin' the first time, 'exit' after; the partitions'
        clocks start again (a rejoin gets its bound before the next verdict)."""
        self.stalls += 1
        for tp in tps:
            self._seen[tp] = (now, self._seen[tp][1])
        return "rejoin" if self.stalls == 1 else "exit"
