"""Effectively once (store.base.Outbox): a message's done mark and outbox, committed with its
writes by commit_once, fenced on the message's other deliveries and on what the decision read
(expect_status, expect_field, and every role's expect_*: store.redis.base._expected, checked
here by _FIELDS); the tenants the outbox sweep looks at, and the outboxes it finds unsent."""

from __future__ import annotations

import asyncio
import json
import time
from typing import cast

from redis.exceptions import WatchError

from store.keys import TENANTS_WITH_OUTBOXES, applied_offsets_key
from store.records import (
    OUTBOX_SWEEP_LOCK_S,
    AlreadyDone,
    Committed,
    Outgoing,
    StaleDecision,
    cause_held,
    parse_cause,
)
from store.redis.base import DONE_MARK_TTL_S, RedisBase, _expected, _shared_deletes, _text

SWEEP_REGISTRATION_S = 60

# The status field of each fact hash in KEYS (one round trip for a decision's checks).
# KEYS: fact hashes; ARGV: the field of each to read
_FIELDS = """
local out = {}
for i, key in ipairs(KEYS) do out[i] = redis.call('HGET', key, ARGV[i]) or false end  -- false: nil, keeps the list whole
return out
"""


# A partition's applied offset, raised only: the old owner of a partition finishing a message
# after its new owner went past it leaves the newer one (in process: store/in_memory/outbox.py's
# record_applied). KEYS: the group's hash. ARGV: field, offset.
_RAISE_APPLIED = """
local held = tonumber(redis.call('HGET', KEYS[1], ARGV[1]) or '-1')
if tonumber(ARGV[2]) > held then redis.call('HSET', KEYS[1], ARGV[1], ARGV[2]) end
return 1
"""


class OutboxOps(RedisBase):
    """store.base.Outbox on Redis."""

    # ---- effectively once: done marks and outbox ---------------------------------------
    async def pending_outbox(self, tenant: str, mark: str, cause: str = "") -> Committed | None:
        """None: the message was never committed. Committed: its committed, maybe unsent
        output. Raises AlreadyDone when the message was fully processed before, and, when it was
        not and memory does not hold the decision its `cause` names, CauseNotInMemory (read in
        the same command)."""
        keys = self.keys(tenant)
        upstream = parse_cause(cause)[0] if cause else None
        read = [keys.done_mark(mark), keys.outbox(mark)]
        if upstream is not None:
            read += [keys.done_mark(upstream), keys.outbox(upstream)]
        done, outbox, *cause_keys = await self.shard(tenant).mget(read)
        if done is not None:
            raise AlreadyDone(mark)
        if outbox is not None:
            return _committed(outbox)
        if upstream is not None:
            cause_held(cause, _decision(*cause_keys))
        return None

    def pipeline(self, tenant: str):
        """A transaction of the tenant's writes (on its shard), staged by the stage_* methods and
        sent by commit_once."""
        return self.shard(tenant).pipeline(transaction=True)

    # ---- memory = f(log): what Redis holds of each input partition -------------------------
    async def record_applied(self, group: str, topic: str, partition: int, offset: int) -> None:
        """The message at `offset` and every one before it in the partition had their effects
        written: recorded after them, so a Redis that holds this offset holds those effects (a
        snapshot, a replica, an AOF are each a prefix of the writes), and one that lost writes
        holds an older offset or none (workers.recovery)."""
        await asyncio.gather(
            *(
                client.eval(_RAISE_APPLIED, 1, key, f"{topic}:{partition}", offset)
                for client, key in await self._applied_keys(group)
            )
        )

    async def applied_offsets(self, group: str, topic: str, partitions: list[int]) -> dict[int, int | None]:
        """partition → the last offset recorded applied (None: none)."""
        if not partitions:
            return {}
        fields = [f"{topic}:{p}" for p in partitions]
        shards = await asyncio.gather(*(client.hmget(key, fields) for client, key in await self._applied_keys(group)))
        # on a cluster, the least any shard holds: what every shard holds the effects of
        return {
            p: None if any(held[n] is None for held in shards) else min(int(held[n]) for held in shards)
            for n, p in enumerate(partitions)
        }

    async def _applied_keys(self, group: str) -> list[tuple]:
        """(client, key) of each server's applied offsets of `group` (one on one server). On a
        cluster each in the slot of its shard's names (shard_tag), kept while the shard serves
        it: a reshard that moves it away moves the key too, and the shard starts another, empty
        (its partitions read as never applied: one replay of the log, which is idempotent)."""
        if not self.clustered:
            key = applied_offsets_key(group)
            return [(self.topology.for_key(key), key)]
        found = []
        for client in self.topology.servers():
            known = self._applied_key_of.get((id(client), group))
            if known is None or not self.topology.serves(client, known):
                known = self._applied_key_of[(id(client), group)] = applied_offsets_key(
                    group, await self.shard_tag(client)
                )
            found.append((client, known))
        return found

    def stage_outbox(self, pipe, tenant: str, mark: str, outbox: list[Outgoing], decision: str = "") -> None:
        """The message's outbox and decision id, published after the commit and then `finish`ed.
        An empty one has nothing to publish: the message is done with its commit (its done mark,
        which holds the decision id, staged here), which saves the finish round trip of most
        detections (a fact parked as pending)."""
        keys = self.keys(tenant)
        if not outbox:
            pipe.set(keys.done_mark(mark), decision or b"1", ex=DONE_MARK_TTL_S)
            return
        stored = {"decision": decision, "outbox": [o.to_json() for o in outbox]}
        pipe.set(keys.outbox(mark), json.dumps(stored), ex=DONE_MARK_TTL_S)
        pipe.zadd(keys.outboxes, {mark: time.time()})

    def expect_status(self, pipe, tenant: str, fact_id: str, status: str) -> None:
        """The decision staged on `pipe` read this fact with this status: its commit fails with
        StaleDecision if the status changed meanwhile (another stage decided about the fact)."""
        self.expect_field(pipe, tenant, fact_id, "status", status)

    def expect_field(self, pipe, tenant: str, fact_id: str, name: str, value: str | float | None) -> None:
        """Likewise for any field of the fact as the decision read it (None: absent)."""
        stored = None if value in (None, "") else value if isinstance(value, str) else repr(float(value))
        _expected(pipe).setdefault((self.keys(tenant).fact(fact_id), name), stored)

    async def commit_once(self, pipe, tenant: str, mark: str) -> Committed | None:
        """Execute a message's staged writes and outbox, fenced on two sides:
        - another delivery of the same message (a partition's old and new owner in a rebalance,
          a worker thought dead) committed first: our writes are discarded and we get the
          outbox that did commit (AlreadyDone if that was finished);
        - a fact the decision read (Memory.expect_status) changed status before our EXEC:
          StaleDecision, decide again.
        WATCH makes both checks hold until EXEC. None: ours committed."""
        keys = self.keys(tenant)
        await self._delete_shared_keys(_shared_deletes(pipe))
        now = time.monotonic()
        if self._sweep_registered.get(tenant, 0.0) < now - SWEEP_REGISTRATION_S:  # where the sweep looks
            await self.topology.for_key(TENANTS_WITH_OUTBOXES).sadd(
                TENANTS_WITH_OUTBOXES, tenant
            )  # again now and then: Redis may have restarted empty
            self._sweep_registered[tenant] = now
        expected = pipe.__dict__.get("memstream_expected", {})
        try:
            await pipe.watch(keys.done_mark(mark), keys.outbox(mark), *{key for key, _ in expected})
            done, committed = await pipe.mget(keys.done_mark(mark), keys.outbox(mark))
            if done is None and committed is None:
                if expected:
                    found = await pipe.eval(
                        _FIELDS, len(expected), *[key for key, _ in expected], *[name for _, name in expected]
                    )
                    if [v.decode() if v else None for v in found] != list(expected.values()):
                        raise StaleDecision(mark)
                await pipe.execute()
                return None
        except WatchError:  # committed by the other delivery, or a fact changed, between check and EXEC
            pass
        finally:
            await pipe.reset()  # idempotent; returns the watched connection to the pool on every path
        found = await self.pending_outbox(tenant, mark)
        if found is None:
            raise StaleDecision(mark)
        return found

    async def finish(self, tenant: str, mark: str, decision: str = "") -> None:
        keys = self.keys(tenant)
        pipe = self.pipeline(tenant)
        pipe.set(keys.done_mark(mark), decision or b"1", ex=DONE_MARK_TTL_S)
        pipe.delete(keys.outbox(mark))
        pipe.zrem(keys.outboxes, mark)
        await pipe.execute()

    async def unsent_outboxes(self, committed_before: float, limit: int = 500) -> list[tuple[str, str, Committed]]:
        """(tenant, mark, outbox) of outboxes committed before the given time and still not
        published, oldest first per tenant — for the sweep. A tenant is skipped while another
        worker sweeps it (a lock that expires, so a dead sweeper holds nothing for long)."""
        found = []
        registered = self.topology.for_key(TENANTS_WITH_OUTBOXES)
        for raw in sorted(await registered.smembers(TENANTS_WITH_OUTBOXES)):
            tenant = _text(raw)
            keys, client = self.keys(tenant), self.shard(tenant)
            marks = cast(  # without WITHSCORES: the members alone
                list[bytes], await client.zrangebyscore(keys.outboxes, "-inf", committed_before, start=0, num=limit)
            )
            if not marks or not await client.set(keys.outbox_sweep_lock, b"1", nx=True, ex=OUTBOX_SWEEP_LOCK_S):
                continue
            for mark in (m.decode() for m in marks):
                try:
                    outbox = await self.pending_outbox(tenant, mark)
                except AlreadyDone:
                    outbox = None
                if outbox is None:  # finished meanwhile (or expired): nothing to send
                    await client.zrem(keys.outboxes, mark)
                else:
                    found.append((tenant, mark, outbox))
        return found


def _committed(stored: bytes | str) -> Committed:
    """A stored outbox: {"decision", "outbox"} (a bare list: committed before decisions had ids)."""
    found = json.loads(stored)
    if isinstance(found, list):
        return Committed([Outgoing.from_json(item) for item in found])
    return Committed([Outgoing.from_json(item) for item in found["outbox"]], found["decision"])


def _decision(done: bytes | str | None, outbox: bytes | str | None) -> str | None:
    """The id of the decision committed for a mark, from its done mark and outbox ("" for one
    older than ids, whose done mark holds "1"; None: no decision)."""
    if done is not None:
        return "" if done in (b"1", "1") else _text(done)
    return None if outbox is None else _committed(outbox).decision
