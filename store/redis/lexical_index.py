"""A large tenant's lexical index of its own (store.base.Layers' promote_lexical): exact per-tenant
BM25 inside Redis at any size.

The shared passages index serves every tenant, so its BM25STD counts every tenant's texts; a
tenant's own BM25 was therefore scored in the client, from its candidates' terms — 20-60 ms p50
at 5,000 passages, 88 ms p50 and 621 ms p99 at 6,119 real ones. Past LEXICAL_OWN_INDEX_AT (store.redis.base)
passages a tenant gets an index of its own, whose BM25STD is that same BM25 (k1 1.2, b 0.5;
tests/test_lexical_index.py checks scores and ranks against the client's): 1-3 ms at 50,000.

The index does not cover the passages themselves but a copy of their lexical fields
(`ms:{tenant}:lex:<passage id>`: terms, their count, doc_id), because a new index over existing
keys scans them, and a key written during that scan is indexed twice: its terms counted twice
for good (store.redis.base.RedisBase._initial_scan_done). A copy's prefix is empty when its
index is created, so nothing is scanned; the copies are written after.

Promotion, online and idempotent:
1. the index is created over the empty prefix (where it does not exist yet; copies left by an
   earlier index that was dropped are deleted first, with the state, so no writer copies meanwhile);
2. the state becomes 'building': from then on every write that changes a passage (a new
   passage, its retirement, its return, its erasure) updates its copy in the same transaction
   (_MIRROR_PASSAGE, staged by stage_lexical_mirror);
3. every passage is copied (the same script; a copy already equal is left alone);
4. the state becomes 'ready', and readers search the tenant's own index.
A passage written before step 2 is copied in step 3, one written after by its own write (the
script reads the state atomically with the write). A promotion cut off anywhere — SIGKILL
included — leaves the state at 'building' (readers keep the shared path, which is exact too);
the next one resumes from step 2 over the same index. No demotion: a tenant that shrinks keeps
its index until `tenant delete --purge` drops it.

Generations: this RediSearch's BM25STD statistics drift with every copy replaced or deleted
(LEXICAL_REBUILD_DRIFT), so an own index is exact only while none was. A writer's check reads
the drift (lexical_drift: FT.INFO's max_doc_id past num_docs) and past 1% builds the index
again beside the searched one (rebuild_lexical): generation g+1's copies under their own prefix,
written by the same script as g's while it copies, then the searched name moved to g+1's index
in one transaction (an alias; generation 0's index held the name itself) and g dropped. Readers
search g's until the move, g+1's after.

After a restart. Redis indexes every document again, in the background: readers pass an own
index over while its scan runs (it holds part of the copies) and the shared index is whole, and
while it drifted past LEXICAL_READER_DRIFT — a Redis restarted on its AOF indexed each of 50,000
copies of an index created with a scan twice (created without one since: _create_lexical).
Such a tenant may never write again, so the extractors also look over every own index
(own_lexical_upkeep, workers.app) and build a drifted one again."""

from __future__ import annotations

import asyncio
import logging
import time
import uuid
from typing import Awaitable, Callable

from redis.commands.search.index_definition import IndexDefinition, IndexType
from redis.exceptions import ResponseError

from store.indexes import OWN_VECTOR_SCHEMA, index_missing, own_lexical_schema, reply_rows
from store.keys import LAYERS, TenantKeys, own_lexical_tenant
from store.lexical import LEXICAL_FIELD, LEXICAL_LENGTH_FIELD
from store.redis.base import _eval, _scanning, _text, create_unless_exists
from store.redis.vector_index import VectorIndexOps

log = logging.getLogger(__name__)

LEXICAL_SIZE_RECHECK_S = 30.0  # how often a writer counts a tenant's passages (one count, ~1 ms at 50k)
LEXICAL_STATE_RECHECK_S = 5.0  # how long a reader trusts what it read of a tenant's index state
PROMOTION_BATCH = 500  # passages copied per round trip
# This RediSearch (2.10) never takes a replaced or deleted document's length out of its BM25STD
# average, and counts its terms' document frequency until its GC runs (fixed upstream in 8.x,
# RediSearch#7227): measured, 200 documents each replaced once scored 0.33x before the GC and
# 1.13x after; a Redis restarted on its AOF indexed an index's documents twice where the log
# held its FT.CREATE and that started a scan (_create_lexical). So an own index whose documents were replaced past this
# share (every edit replaces a copy: a retirement, a return, an erasure) is built again
# (rebuild_lexical), by a writer's check.
LEXICAL_REBUILD_DRIFT = 0.01
# Readers keep an own index drifted up to this share (its scores a little off while a writer's
# rebuild runs, as after edits) and pass over one drifted further (the shared path is exact):
# every copy indexed twice (a drift of 1.0, as a restart left it) changed the lexical top five of
# 85 of 100 questions at 50,000 passages.
LEXICAL_READER_DRIFT = 0.1
LEXICAL_REBUILD_LEASE_S = 600  # a promotion's or rebuild's lease (copying a 50,000-passage tenant took ~5 s)

# What FT.CREATE is told of a large tenant's own lexical index besides its schema (redisvl's has
# no place for it): BM25 reads a term's documents and its frequency in each, never its positions
# (NOOFFSETS, and NOHL with them: no phrase is searched, nothing highlighted) nor which field
# holds it (NOFIELDS: the index has one). Measured at 50,000 passages, indexes built by a scan of
# the same copies, the 20 bench scale questions' searches as Redis timed them: 0.94-0.97x the
# time, the inverted index 17.8 -> 10.5 MB and the 2.5 MB of positions gone. The same BM25, a few
# scores moved in their last bit (the terms' contributions summed in another order:
# store.lexical.by_score). An index made before keeps its options until it is built again.
OWN_LEXICAL_OPTIONS = ("NOOFFSETS", "NOFIELDS", "NOHL")
# OWN_LEXICAL_OPTIONS as redis-py's create_index names them
_CREATE_OPTION = {"NOOFFSETS": "no_term_offsets", "NOFIELDS": "no_field_flags", "NOHL": "no_highlight"}

# The copy's fields (the passage's own names) and its marker: a passage holding none of the
# others (an erased one) still has a copy, so the index's passage count is the shared index's.
MIRRORED_FIELDS = (LEXICAL_FIELD, LEXICAL_LENGTH_FIELD, "doc_id")
MIRROR_MARKER = "held"

# The copies of a passage's lexical fields, made equal to the passage (a passage gone: no copy),
# in each generation the tenant's own index has (the searched one, and the one a rebuild is
# copying); nothing without one. A copy already equal is left alone (no re-indexing: this
# RediSearch's BM25STD statistics drift with every replaced document, see LEXICAL_REBUILD_DRIFT).
# KEYS: the state, the passage. ARGV: the copies' base key, the passage id, the fields.
_MIRROR_PASSAGE = (
    """
local state = redis.call('HMGET', KEYS[1], 'state', 'gen', 'next')
if not state[1] then return 0 end
local generations = {state[2] or '0'}
if state[3] and state[3] ~= generations[1] then generations[2] = state[3] end
local fields = {}
for i = 3, #ARGV do fields[#fields + 1] = ARGV[i] end
local exists = redis.call('EXISTS', KEYS[2]) == 1
local want = exists and redis.call('HMGET', KEYS[2], unpack(fields)) or {}
local changed = 0
for _, generation in ipairs(generations) do
  local copy = ARGV[1] .. (generation == '0' and '' or generation) .. ':' .. ARGV[2]
  if not exists then
    changed = changed + redis.call('DEL', copy)
  else
    local same = false
    if redis.call('EXISTS', copy) == 1 then
      local have = redis.call('HMGET', copy, unpack(fields))
      same = true
      for i = 1, #fields do if want[i] ~= have[i] then same = false end end
      if not same then redis.call('DEL', copy) end
    end
    if not same then
      local values = {'"""
    + MIRROR_MARKER
    + """', '1'}
      for i = 1, #fields do
        if want[i] then values[#values + 1] = fields[i]; values[#values + 1] = want[i] end
      end
      redis.call('HSET', copy, unpack(values))
      changed = changed + 1
    end
  end
end
return changed
"""
)


def stage_lexical_mirror(pipe, keys: TenantKeys, passage_id: str) -> None:
    """Stage the update of the passage's copies, after the writes that change the passage (in the
    same transaction): a no-op unless the tenant has (or is building) an index of its own."""
    _eval(
        pipe,
        _MIRROR_PASSAGE,
        [keys.lexical_index_state, keys.passage(passage_id)],
        [keys.lexical_mirror_base, passage_id, *MIRRORED_FIELDS],
    )


class LexicalIndexOps(VectorIndexOps):
    """The indexes a writer ensures (store.base.Layers' ensure_indexes: the shared ones, and a
    large tenant's own lexical index, promote_lexical) and the own index's state as readers
    see it (SearchOps, TenantsOps read it through this class)."""

    async def ensure_indexes(self, tenant: str) -> None:
        """Every layer's shared index, created where missing, and the tenant's own lexical index
        once it is large (maybe_promote_lexical). Known indexes cost no round trip; every
        index_recheck_s they are checked again, since Redis may have restarted empty under a
        writer that never queries (its records are indexed when the index is created)."""
        now = time.monotonic()
        if self._indexes_checked is None or now - self._indexes_checked >= self.index_recheck_s:
            self._indexes.clear()
            self._indexes_checked = now
        for layer in LAYERS:
            await self.index(self.shard(tenant), layer)
        self.maybe_promote_lexical(tenant)

    async def own_lexical_ready(self, tenant: str) -> bool:
        """Whether the tenant's own lexical index answers its searches: state 'ready' and the
        index whole (_own_lexical_whole), read once per LEXICAL_STATE_RECHECK_S. One that is not
        is passed over — the shared path is exact — until its scan ends or it is built again."""
        now, known = time.monotonic(), self._own_lexical_read.get(tenant)
        if known is None or now - known[1] >= LEXICAL_STATE_RECHECK_S:
            state = await self.shard(tenant).hget(self.keys(tenant).lexical_index_state, "state")
            ready = state == b"ready" and await self._own_lexical_whole(tenant)
            if len(self._own_lexical_read) >= 100_000:
                self._own_lexical_read.clear()
            known = (ready, now)
            self._own_lexical_read[tenant] = known
        return known[0]

    async def _own_lexical_whole(self, tenant: str) -> bool:
        """Whether the tenant's own lexical index holds each of its copies once (FT.INFO, ~0.15 ms
        at 50,000 copies): no scan running and its statistics within LEXICAL_READER_DRIFT. A
        Redis restarted on an AOF holding the FT.CREATE of an index made with a scan (by a release
        before _create_lexical's SKIPINITIALSCAN) scans again once loading ends — until that scan
        ends the index holds part of its copies (a 50,000-copy one took 25 s) — and indexes each
        copy twice: max_doc_id 100,000, BM25's average length doubled for good, the top five of
        85 of 100 questions changed. Only a rebuild mends that (own_lexical_upkeep)."""
        info = await self._index_info(self.shard(tenant), self.keys(tenant).lexical_index_name)
        if info is None or _drift(info) > LEXICAL_READER_DRIFT:
            return False
        if not _scanning(info):
            return True
        # still scanning: passed over where the shared index the other path reads is whole (the
        # own index's FT.CREATE replayed from an AOF scans alone); both partial, the own one answers
        shared = await self.searchable(tenant, "passages")
        shared_info = None if shared is None else await self._index_info(self.shard(tenant), shared.name)
        return shared_info is not None and _scanning(shared_info)

    def _own_lexical_lost(self, tenant: str) -> None:
        """A search found no index of the tenant's own (dropped, or Redis restarted empty)."""
        self._own_lexical_read[tenant] = (False, time.monotonic())

    def maybe_promote_lexical(self, tenant: str) -> None:
        """A writer's check, at most once per LEXICAL_SIZE_RECHECK_S a tenant, in the background
        of this process (a write never waits for it: awaited, its two reads made a new tenant's
        first write 0.07 -> 1.46 ms, `bench tenants`): a tenant of at least lexical_own_index_at
        passages with no ready index of its own gets one."""
        now = time.monotonic()
        last = self._lexical_size_checked.get(tenant)
        if last is not None and now - last < LEXICAL_SIZE_RECHECK_S:
            return
        if len(self._lexical_size_checked) >= 100_000:
            self._lexical_size_checked.clear()
        self._lexical_size_checked[tenant] = now
        running = self._promotions.get(tenant)
        if running is not None and not running.done():
            return
        task = asyncio.get_running_loop().create_task(self._promote_if_large(tenant))
        self._promotions[tenant] = task
        task.add_done_callback(
            lambda done: self._promotions.pop(tenant, None) if self._promotions.get(tenant) is done else None
        )

    async def _passage_count(self, tenant: str) -> int:
        """The tenant's passages, retired and erased ones too (a count of the shared index)."""
        searchable = await self.searchable(tenant, "passages")
        if searchable is None:
            return 0
        try:
            reply = await self.shard(tenant).execute_command(
                *searchable.command("FT.SEARCH", "", "NOCONTENT", "LIMIT", 0, 0)
            )
        except ResponseError as exc:
            if not index_missing(exc):
                raise
            self._lost_indexes()  # Redis restarted empty: nothing to promote until a write creates it
            return 0
        return reply_rows(reply)[0]

    async def _promote_if_large(self, tenant: str) -> None:
        """The tenant's own lexical index past lexical_own_index_at passages (rebuilt once its
        statistics drifted, lexical_drift), its own vector indexes (store.redis.vector_index)
        past vector_own_index_at: one count, each promotion where its state is not 'ready' yet."""
        keys = self.keys(tenant)
        lexical, (vectors, schema) = await asyncio.gather(
            self.shard(tenant).hget(keys.lexical_index_state, "state"),
            self.shard(tenant).hmget(keys.vector_index_state, "state", "schema"),
        )
        if vectors == b"ready" and int(schema or 1) != OWN_VECTOR_SCHEMA:
            vectors = b"older"  # promoted under an older schema (store.indexes.OWN_VECTOR_SCHEMA): again
        if vectors == b"ready" and not await self._own_vectors_ready(tenant, await self._tenant_dims(tenant)):
            # ready, yet not on the tenant's server: its slot moved to another cluster shard (the
            # keys move with it, an index does not): made again there
            vectors = b"elsewhere"
        if lexical == b"ready":
            try:
                info = await self._index_info(self.shard(tenant), keys.lexical_index_name)
            except Exception:  # the next check tries again
                log.exception("tenant %s: reading its own lexical index failed", tenant)
                info = {}
            if info is None:  # ready, yet not on the tenant's server (as above): made again there
                lexical = b"elsewhere"
            elif info and not _scanning(info) and _drift(info) > LEXICAL_REBUILD_DRIFT:
                await self._rebuild_drifted(tenant)
        if lexical == b"ready" and vectors == b"ready":
            return
        try:
            count = await self._passage_count(tenant)
        except Exception:  # the next check (LEXICAL_SIZE_RECHECK_S) tries again
            log.exception("tenant %s: counting its passages failed", tenant)
            return
        if lexical != b"ready" and count >= self.lexical_own_index_at:
            await self._leased(tenant, lambda: self._unpromoted(tenant), "lexical index", self.promote_lexical)
        if vectors != b"ready" and count >= self.vector_own_index_at:
            await self._promote(tenant, "vector indexes", self.promote_vectors)

    async def lexical_drift(self, tenant: str) -> float:
        """The share of the tenant's own lexical index's documents replaced or deleted since it
        was built (0.0: its BM25 statistics are exact; no index: 0.0). Document ids are never
        reused, so every replacement, deletion or second indexing of a copy shows as max_doc_id
        past num_docs."""
        info = await self._index_info(self.shard(tenant), self.keys(tenant).lexical_index_name)
        return 0.0 if info is None else _drift(info)

    async def own_lexical_upkeep(self) -> list[str]:
        """A writer's round over every tenant's own lexical index (FT._LIST of each server): each
        ready one whose statistics drifted past LEXICAL_REBUILD_DRIFT, its scan over, is built
        again (rebuild_lexical). The write-time check (_promote_if_large) sees only tenants that
        write; this one mends a quiet tenant's index too — a restart that indexed its copies twice
        left it off for good, and its readers on the slower shared path. The tenants rebuilt."""
        rebuilt: list[str] = []
        for client in self.topology.servers():  # (on a cluster, the names of slots the server holds)
            try:
                names = await self._index_names(client)
            except Exception:  # that server away: the next round tries again, the others go on
                log.exception("lexical upkeep: listing a server's indexes failed")
                continue
            for tenant in sorted({t for name in names if (t := own_lexical_tenant(name))}):
                try:
                    if await self._drifted(client, tenant) and await self._rebuild_drifted(tenant):
                        rebuilt.append(tenant)
                except Exception:  # one tenant's failure leaves the others' upkeep to run
                    log.exception("lexical upkeep: tenant %s failed", tenant)
        return rebuilt

    async def _drifted(self, client, tenant: str) -> bool:
        """Whether the tenant's own lexical index is ready, scanned and drifted past
        LEXICAL_REBUILD_DRIFT (one still building is made whole by its promotion)."""
        keys = self.keys(tenant)
        if await client.hget(keys.lexical_index_state, "state") != b"ready":
            return False
        info = await self._index_info(client, keys.lexical_index_name)
        return info is not None and not _scanning(info) and _drift(info) > LEXICAL_REBUILD_DRIFT

    async def _rebuild_drifted(self, tenant: str) -> bool:
        """rebuild_lexical under the tenant's lease (_leased), the drift read again once held.
        Whether it was built again."""
        return await self._leased(
            tenant, lambda: self._drifted(self.shard(tenant), tenant), "lexical index (rebuilt)", self.rebuild_lexical
        )

    async def _unpromoted(self, tenant: str) -> bool:
        """Whether the tenant's own lexical index is not ready (or, ready, not on its server)."""
        keys = self.keys(tenant)
        if await self.shard(tenant).hget(keys.lexical_index_state, "state") != b"ready":
            return True
        return await self._index_info(self.shard(tenant), keys.lexical_index_name) is None

    async def _leased(
        self, tenant: str, needed: Callable[[], Awaitable[bool]], what: str, promote: Callable[[str], Awaitable[int]]
    ) -> bool:
        """A writer's promotion or rebuild of the tenant's own lexical index by one process at a
        time: two at once each empty the other's copies (each begins by deleting its prefix), so
        two extractors' checks promoting a tenant that crossed the size together left an index
        short of copies that readers searched. Under a lease (SET NX EX) that outlives no crash by
        more than LEXICAL_REBUILD_LEASE_S; `needed` asked again once it is held (another may have
        done it meanwhile). Whether it ran and succeeded: False when another holds the lease,
        nothing is needed, or it failed (the next check tries again). Errors reaching Redis are
        logged, not raised: a writer's background check and the upkeep's round go on."""
        client, lease, holder = self.shard(tenant), self.keys(tenant).lexical_rebuild_lease, uuid.uuid4().hex
        try:
            if not await client.set(lease, holder, nx=True, ex=LEXICAL_REBUILD_LEASE_S):
                return False
            try:
                if not await needed():
                    return False
                return await self._promote(tenant, what, promote)
            finally:  # only by its holder (a lease that lapsed midway may be another's now)
                await self._run_script(tenant, _RELEASE_LEASE, [lease], [holder])
        except asyncio.CancelledError:
            raise
        except Exception:
            log.exception("tenant %s: the own %s failed", tenant, what)
            return False

    @staticmethod
    async def _promote(tenant: str, what: str, promote) -> bool:
        """`promote(tenant)`, logged; whether it succeeded."""
        try:
            started = time.monotonic()
            held = await promote(tenant)
            log.info("tenant %s: own %s ready (%d records, %.1f s)", tenant, what, held, time.monotonic() - started)
            return True
        except asyncio.CancelledError:
            raise
        except Exception:  # the next check (LEXICAL_SIZE_RECHECK_S) tries again; the shared path stays exact
            log.exception("tenant %s: promoting its %s failed", tenant, what)
            return False

    async def promote_lexical(self, tenant: str, progress: Callable[[int, int], None] | None = None) -> int:
        """Give the tenant a lexical index of its own (the module's steps 1-4), or finish one cut
        off; idempotent. Returns how many passages it copied or checked; `progress(done, total)`
        is called after each batch."""
        keys = self.keys(tenant)
        redis = self.shard(tenant)
        if (
            await self._index_info(self.shard(tenant), keys.lexical_index_name) is None
        ):  # no index, nor a later generation's alias
            # the state gone first, so no writer copies meanwhile; copies of an index since
            # dropped, of every generation — a Redis Cluster slot moved to a shard brings the keys
            # of a tenant at generation g, not its index — go once the new index exists (`lex:`,
            # `lex<g>:`; the state and the lease, `lexindex` and `lexrebuild`, hold no second colon)
            await redis.delete(keys.lexical_index_state)
            await self._create_lexical(tenant, 0, keys.lexical_mirror_base + "*:*")
        await redis.hsetnx(keys.lexical_index_state, "state", "building")
        copied = await self._copy_passages(tenant, progress)
        # a resumed promotion may find its index scanning again (Redis reloaded it from a snapshot):
        # readers move to it only once it holds every copy
        await self._initial_scan_done(self.shard(tenant), keys.lexical_index_name)
        await redis.hset(keys.lexical_index_state, "state", "ready")
        self._own_lexical_read[tenant] = (True, time.monotonic())
        return copied

    async def rebuild_lexical(self, tenant: str, progress: Callable[[int, int], None] | None = None) -> int:
        """A ready own lexical index built again, exact (the module's Generations): generation g+1's
        index over an empty prefix, every passage copied there (writes meanwhile update both
        generations' copies), then the alias moved to it in one transaction and generation g
        dropped. Readers search g until the move, g+1 after. Idempotent and resumable (the state's
        'next'); a tenant with no ready index is promoted instead. Returns the passages copied."""
        keys = self.keys(tenant)
        redis = self.shard(tenant)
        state, searched, building = await redis.hmget(keys.lexical_index_state, "state", "gen", "next")
        if state != b"ready":
            return await self.promote_lexical(tenant, progress)
        current = int(searched or 0)
        target = int(building) if building else current + 1
        if current:  # copies of the generation before, left by a rebuild cut off after its move
            await self._delete_matching(self.shard(tenant), keys.lexical_mirror_prefix(current - 1) + "*")
        if await self._index_info(self.shard(tenant), keys.lexical_generation_index(target)) is None:
            await redis.hdel(keys.lexical_index_state, "next")  # no writer copies while the prefix is emptied
            await self._create_lexical(tenant, target, keys.lexical_mirror_prefix(target) + "*")
        await redis.hset(keys.lexical_index_state, "next", target)
        copied = await self._copy_passages(tenant, progress)
        await self._initial_scan_done(self.shard(tenant), keys.lexical_generation_index(target))
        move = redis.pipeline(transaction=True)
        if current == 0:  # generation 0's index holds the searched name: dropped, the name becomes an alias
            move.execute_command("FT.DROPINDEX", keys.lexical_index_name)
            move.execute_command("FT.ALIASADD", keys.lexical_index_name, keys.lexical_generation_index(target))
        else:
            move.execute_command("FT.ALIASUPDATE", keys.lexical_index_name, keys.lexical_generation_index(target))
            move.execute_command("FT.DROPINDEX", keys.lexical_generation_index(current))
        move.hset(keys.lexical_index_state, "gen", target)
        move.hdel(keys.lexical_index_state, "next")
        try:
            await move.execute()
        except ResponseError as exc:  # another process moved it first (its generation dropped already)
            if not index_missing(exc):
                raise
        await self._delete_matching(self.shard(tenant), keys.lexical_mirror_prefix(current) + "*")
        return copied

    async def _create_lexical(self, tenant: str, generation: int, left: str) -> None:
        """The generation's index: own_lexical_schema's, with OWN_LEXICAL_OPTIONS; one another
        process created first is as good. Without the scan FT.CREATE starts (SKIPINITIALSCAN):
        no copy is written before the state names the index, after this, and the copies a new
        index finds (the SCAN pattern `left`: an index since dropped left them, or a writer
        whose state's deletion a failover lost) are deleted once it exists — in no index, they
        are copied again; the copy pass would leave a copy equal to its passage alone. A Redis
        replaying this FT.CREATE from its AOF (made since the log's last rewrite) starts that
        scan once loading ends, over the copies the replay indexed already: each indexed twice,
        the index's statistics off until a rebuild, whose own FT.CREATE the next restart replays
        alike (2,000 copies: max_doc_id 4,000 after a restart, 2,000 without the scan; one
        loaded from a snapshot, RDB or the AOF's preamble, comes back whole either way)."""
        schema = own_lexical_schema(tenant, generation, self.clustered)
        client = self.shard(tenant)
        created = await create_unless_exists(
            client.ft(schema.index.name).create_index(
                schema.redis_fields,
                definition=IndexDefinition(prefix=[schema.index.prefix], index_type=IndexType.HASH),
                stopwords=schema.index.stopwords,
                skip_initial_scan=True,
                **{_CREATE_OPTION[option]: True for option in OWN_LEXICAL_OPTIONS},
            )
        )
        if created:  # (another's index: it deleted them)
            await self._delete_matching(client, left)
        await self._initial_scan_done(client, schema.index.name)

    async def _copy_passages(self, tenant: str, progress: Callable[[int, int], None] | None) -> int:
        """Every passage of the tenant through the mirror script (each generation's copy made
        equal), PROMOTION_BATCH a round trip; how many."""
        keys = self.keys(tenant)
        passage_ids = await self._scan_suffixes(self.shard(tenant), keys.prefix("passages"))
        for start in range(0, len(passage_ids), PROMOTION_BATCH):
            pipe = self.shard(tenant).pipeline(transaction=False)
            for pid in passage_ids[start : start + PROMOTION_BATCH]:
                stage_lexical_mirror(pipe, keys, pid)
            await pipe.execute()
            if progress is not None:
                progress(min(start + PROMOTION_BATCH, len(passage_ids)), len(passage_ids))
        return len(passage_ids)

    async def drop_own_lexical(self, tenant: str) -> None:
        """The tenant's own lexical index dropped (its copies are keys of the tenant: a purge
        deletes them), the state with it."""
        keys = self.keys(tenant)
        searched = await self.shard(tenant).hget(keys.lexical_index_state, "gen")
        await self.shard(tenant).delete(keys.lexical_index_state)
        # the searched name (generation 0's index, or the alias: dropping it drops the index it
        # names), and the next generation's, left by a rebuild cut off before its move
        for name in (keys.lexical_index_name, keys.lexical_generation_index(int(searched or 0) + 1)):
            try:
                await self.shard(tenant).execute_command("FT.DROPINDEX", name)
            except ResponseError as exc:
                if not index_missing(exc):
                    raise
        self._own_lexical_read.pop(tenant, None)


# A lease deleted by its holder alone. KEYS: the lease. ARGV: the holder's token.
_RELEASE_LEASE = """
if redis.call('GET', KEYS[1]) == ARGV[1] then return redis.call('DEL', KEYS[1]) end
return 0
"""


def _drift(info: dict) -> float:
    """lexical_drift of an own lexical index's FT.INFO."""
    held = int(info["num_docs"])
    return (int(info["max_doc_id"]) - held) / max(held, 1)


def own_lexical_hits(reply) -> list[tuple[str, float, str | None]]:
    """A WITHSCORES search of a tenant's own index: (passage id, BM25 score, doc_id) per row."""
    out = []
    if isinstance(reply, dict):  # RESP3
        for row in reply.get(b"results", []):
            fields = row.get(b"extra_attributes") or {}
            doc_id = fields.get(b"doc_id")
            out.append((_text(row[b"id"]), float(row[b"score"]), None if doc_id is None else _text(doc_id)))
        return out
    rest = reply[1:]
    for key, score, fields in zip(rest[0::3], rest[1::3], rest[2::3]):
        named = {_text(k): _text(v) for k, v in zip(fields[::2], fields[1::2])}
        out.append((_text(key), float(score), named.get("doc_id")))
    return out
