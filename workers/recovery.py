"""Memory = f(log): a Redis that lost writes is caught up from Kafka without a human.

Kafka's committed offset of a partition says which messages the group handled; Redis's applied
offset (the envelope records it after each message's effects: the store's record_applied) says
which of their effects Redis still holds. In normal operation the applied offset is never
behind the committed one — a message's offset is committed only after it is recorded applied.
Redis restored from a snapshot or a backup, failed over to a lagging replica, or restarted
empty holds an older applied offset, or none: the messages in between were handled, but their
effects are gone.

Each stage then reads its input again from the first message whose effects Redis lacks
(`rewind_targets`, run when a worker is assigned partitions: workers.faust_patches), and the
done marks — lost with the same writes — let every one of them run again, while those whose
marks survived stay no-ops. A running worker notices the loss on its own (`lost_partitions`,
on a timer: Redis now holds less than this process recorded, or less than Kafka committed) and
rejoins its group, which rewinds it. A downstream message replayed before the upstream effect
it depends on is in memory again, or after that decision was made again otherwise — its
`cause` names a decision Redis does not hold — is passed over without a done mark
(store.records.CauseNotInMemory): its upstream stage replays too and sends it again, and that
copy runs.

A partition of which Redis holds no applied offset at all while Kafka committed some is read
from its beginning: Redis emptied, or a worker of a version before this record upgraded (its
done marks make that replay cheap)."""

from __future__ import annotations

from typing import Mapping

from store.base import Outbox

TopicPartition = tuple[str, int]  # (topic name, partition)


async def applied_offsets(
    memory: Outbox, group: str, partitions: list[TopicPartition]
) -> dict[TopicPartition, int | None]:
    """(topic, partition) → the last offset Redis holds the effects of (None: none recorded)."""
    by_topic: dict[str, list[int]] = {}
    for topic, partition in partitions:
        by_topic.setdefault(topic, []).append(partition)
    out: dict[TopicPartition, int | None] = {}
    for topic, numbers in by_topic.items():
        for partition, offset in (await memory.applied_offsets(group, topic, numbers)).items():
            out[(topic, partition)] = offset
    return out


def behind(applied: int | None, committed: int | None) -> int | None:
    """Where the partition must be read again from — the first offset whose effects Redis lacks —
    when Redis holds less than Kafka committed; None when it holds all of it."""
    if not committed or committed <= 0:  # nothing handled yet (the read starts at the beginning anyway)
        return None
    start = 0 if applied is None else applied + 1
    return start if start < committed else None


async def rewind_targets(
    memory: Outbox, group: str, committed: Mapping[TopicPartition, int | None]
) -> dict[TopicPartition, int]:
    """(topic, partition) → the offset to read it again from, for each partition whose effects
    Redis lost in part (see `behind`)."""
    applied = await applied_offsets(memory, group, list(committed))
    targets = {tp: behind(applied[tp], offset) for tp, offset in committed.items()}
    return {tp: start for tp, start in targets.items() if start is not None}


class Recovery:
    """One worker's side of it: the rewinds at assignment and the check on a timer, over the
    offsets this process recorded applied (the envelope's `applied`, shared, not copied)."""

    def __init__(self, memory: Outbox, group: str, recorded_here: dict[TopicPartition, int]):
        self.memory = memory
        self.group = group
        self.recorded_here = recorded_here
        # partitions read again after a loss → the committed offset the replay runs up to: until
        # Redis holds it, Redis being behind Kafka is the replay itself, not another loss
        self.replaying: dict[TopicPartition, int] = {}
        # the partitions of the latest assignment once its rewind ran: only they are checked (a
        # timer that runs mid-rebalance sees partitions whose rewind has not run yet)
        self.rewound: set[TopicPartition] = set()

    async def rewind(self, committed: Mapping[TopicPartition, int | None]) -> dict[TopicPartition, int]:
        """At an assignment: the offset to read each partition again from, where Redis lost
        effects of it (rewind_targets). What this process recorded of them before is forgotten:
        another process may have handled them since."""
        self.rewound = set()
        for tp in committed:
            self.recorded_here.pop(tp, None)
            self.replaying.pop(tp, None)
        targets = await rewind_targets(self.memory, self.group, committed)
        self.rewound = set(committed)
        for tp in targets:
            self.replaying[tp] = int(committed[tp] or 0)
        return targets

    async def lost(self, committed: Mapping[TopicPartition, int | None]) -> list[TopicPartition]:
        """The held partitions (`committed`: their committed offsets) whose effects Redis lost
        under this running worker: it holds less than this process recorded applied there (Redis
        never lowers the record itself), or less than Kafka committed (but for a replay running).
        Only the partitions whose rewind ran at the latest assignment count (`rewound`)."""
        committed = {tp: offset for tp, offset in committed.items() if tp in self.rewound}
        applied = await applied_offsets(self.memory, self.group, list(committed))
        lost = []
        for tp, held in applied.items():
            until = self.replaying.get(tp)
            if until is not None and held is not None and held + 1 >= until:
                del self.replaying[tp]  # the replay caught up
                until = None
            mine = self.recorded_here.get(tp)
            if (mine is not None and (held is None or held < mine)) or (
                until is None and behind(held, committed.get(tp)) is not None
            ):
                lost.append(tp)
        return sorted(lost)
