"""Effectively once in process (store.base.Outbox), as store/redis/outbox.py: done marks,
outboxes and the decision ids messages name as their cause; the fields a decision read
(expect_status, expect_field), checked by commit_once with no await between its checks and its
writes (what WATCH … EXEC gives Redis); the applied offsets (_RAISE_APPLIED there) and the
sweep's unsent outboxes. No TTLs: nothing expires."""

from __future__ import annotations

import time

from store.in_memory.base import InMemoryBase, StagedWrites, _stored, _text
from store.records import OUTBOX_SWEEP_LOCK_S, AlreadyDone, Committed, Outgoing, StaleDecision, cause_held, parse_cause


class OutboxOps(InMemoryBase):
    """store.base.Outbox in process (store.redis.outbox.OutboxOps on Redis)."""

    async def pending_outbox(self, tenant: str, mark: str, cause: str = "") -> Committed | None:
        t = self._tenant(tenant)
        if mark in t.done:
            raise AlreadyDone(mark)
        found = t.outboxes.get(mark)
        if found is not None:
            return Committed(list(found.outbox), found.decision)
        if cause:
            upstream = parse_cause(cause)[0]
            held = t.done.get(upstream)
            if held is None and upstream in t.outboxes:
                held = t.outboxes[upstream].decision
            cause_held(cause, held)
        return None

    def pipeline(self, tenant: str) -> StagedWrites:
        """A transaction of the tenant's writes, as Memory.pipeline."""
        return StagedWrites()

    def stage_outbox(self, pipe, tenant: str, mark: str, outbox: list[Outgoing], decision: str = "") -> None:
        t, at = self._tenant(tenant), time.time()

        def write() -> None:
            if not outbox:  # done with its commit, as Memory.stage_outbox
                t.done[mark] = decision
                return
            t.outboxes[mark], t.committed_at[mark] = Committed(list(outbox), decision), at

        self._stage(pipe, write)

    def expect_status(self, pipe, tenant: str, fact_id: str, status: str) -> None:
        self.expect_field(pipe, tenant, fact_id, "status", status)

    def expect_field(self, pipe, tenant: str, fact_id: str, name: str, value: str | float | None) -> None:
        pipe.expected.setdefault((tenant, "facts", fact_id, name), None if value in (None, "") else _stored(value))

    def _read_field(self, tenant: str, layer: str, record_id: str, name: str) -> str | None:
        t = self._tenant(tenant)
        if layer == "documents":
            value = (t.documents.get(record_id) or {}).get(name)
            return None if value in (None, "") else str(value)
        if layer == "passage_revisions":
            return str(t.revisions[record_id]) if record_id in t.revisions else None
        if layer == "session_turn_changes":
            session, _, turn = record_id.rpartition("\x1f")
            count = t.session_turn_changes.get(session, {}).get(int(turn))
            return str(count) if count else None
        return _text(t.records[layer].get(record_id, {}).get(name)) or None

    async def commit_once(self, pipe, tenant: str, mark: str) -> Committed | None:
        """store/redis/outbox.py's commit_once with nothing between its checks and its writes (no await), so no
        WatchError case: another delivery's commit is found, or ours applies."""
        t = self._tenant(tenant)
        self._tenants_with_outboxes.add(tenant)  # (Memory re-registers now and then: Redis may restart empty)
        if mark in t.done or mark in t.outboxes:
            await pipe.reset()
            return await self.pending_outbox(tenant, mark)
        for (read_tenant, layer, record_id, name), value in pipe.expected.items():
            if self._read_field(read_tenant, layer, record_id, name) != value:
                await pipe.reset()
                raise StaleDecision(mark)
        await pipe.execute()
        return None

    async def record_applied(self, group: str, topic: str, partition: int, offset: int) -> None:
        """As store/redis/outbox.py's _RAISE_APPLIED (raised only)."""
        key = (group, topic, partition)
        self._applied[key] = max(offset, self._applied.get(key, -1))

    async def applied_offsets(self, group: str, topic: str, partitions: list[int]) -> dict[int, int | None]:
        return {p: self._applied.get((group, topic, p)) for p in partitions}

    async def finish(self, tenant: str, mark: str, decision: str = "") -> None:
        t = self._tenant(tenant)
        t.done[mark] = decision
        t.outboxes.pop(mark, None)
        t.committed_at.pop(mark, None)

    async def unsent_outboxes(self, committed_before: float, limit: int = 500) -> list[tuple[str, str, Committed]]:
        found = []
        for tenant in sorted(self._tenants_with_outboxes):
            t = self._tenant(tenant)
            marks = [
                mark for at, mark in sorted((at, mark) for mark, at in t.committed_at.items()) if at <= committed_before
            ][:limit]
            if not marks or t.sweep_locked_until > time.monotonic():
                continue
            t.sweep_locked_until = time.monotonic() + OUTBOX_SWEEP_LOCK_S
            for mark in marks:
                try:
                    outbox = await self.pending_outbox(tenant, mark)
                except AlreadyDone:
                    outbox = None
                if outbox is None:
                    t.committed_at.pop(mark, None)
                else:
                    found.append((tenant, mark, outbox))
        return found
