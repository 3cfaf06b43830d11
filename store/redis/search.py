"""The layers searched (store.base.Layers' knn, knn_many and lexical): the nearest records of a
layer, and the lexical leg — BM25 by the tenant's own statistics over the passages the shared
index finds holding a query term (store.lexical), exact in its top k past LEXICAL_CANDIDATES."""

from __future__ import annotations

import asyncio
import time
from typing import Mapping, NamedTuple, Sequence

import numpy as np

from store.facts import FactRecordHit, stored_fields
from store.indexes import HitRead, OwnVectorIndex, TenantIndex, index_missing, reply_rows, search_with_fields
from store.keys import TenantKeys
from store.lexical import (
    K1,
    LEXICAL_FIELD,
    LEXICAL_LENGTH_FIELD,
    bm25,
    bm25_idf,
    by_score,
    document_frequency,
    redis_query,
    search_terms,
)
from store.records import ENTITIES_FIELD, Hit, PassageRecordHit, similarity, vector_bytes, vector_from_bytes
from store.redis.base import TENANT_DIMS_RECHECK_S
from store.redis.layers import PASSAGE_ROW_FIELDS, fact_of_values, passage_row
from store.redis.lexical_index import LexicalIndexOps, own_lexical_hits

# The most passages a lexical search scores (Memory.lexical): every one of a tenant's passages
# holding a query term up to here, the index's BM25STD best beyond. 200 changed the top 10 of a
# third of the LoCoMo dev questions (400-660 turns a conversation; the shared BM25STD's best 200
# miss passages the tenant's own statistics rank high) and cost 4.6 points of R@5; 1,000 keeps
# every conversation exact. A 5,000-passage tenant pays for it: ~60 ms p50 (14 ms at 200).
LEXICAL_CANDIDATES = 1000
LEXICAL_READ_ALL = 64  # a tenant of at most this many passages is read whole for BM25 (one search)
LEXICAL_MAX_READ = 10_000  # RediSearch's MAXSEARCHRESULTS: no search pages past it
OWN_INDEX_TIE_MARGIN = 10  # more than k asked of a tenant's own index, so ties at the k-th are cut by id
_LEXICAL_KEY = LEXICAL_FIELD.encode()


def _lexical_page(searchable: TenantIndex, terms: list[str], offset: int, limit: int) -> list:
    """The search of the tenant's passages holding any of `terms`: their doc ids and terms, a
    page of them in the index's BM25STD order."""
    return searchable.command(
        "FT.SEARCH",
        redis_query(terms),
        "VERBATIM",
        "SCORER",
        "BM25STD",
        "RETURN",
        2,
        "doc_id",
        LEXICAL_FIELD,
        "LIMIT",
        offset,
        limit,
    )


class LexicalRows(NamedTuple):
    """A lexical search's reply, read."""

    total: int  # the passages the search matched (its reply may hold fewer: a page)
    documents: dict[str, list[str]]  # passage id → its terms
    doc_ids: dict[str, str | None]  # passage id → its document's id
    length: int  # the terms of every passage in the reply, `holding` or not


def _lexical_rows(searchable: TenantIndex, reply, holding: list[str] | None = None) -> LexicalRows:
    """A lexical search's reply, read; with `holding` (query terms), the passages holding none
    of them are only counted (in `length`), not kept — a small tenant's whole read, where most
    hold no query term. A RESP3 reply (the client's) is read in place, two fields a row, each
    passage's terms decoded once; through reply_rows' generic rows, reading and scoring 20
    passages took 0.060-0.091 ms against 0.044-0.065 ms so (0.067 before either change; the same
    scores), of a ~0.45 ms search."""
    documents: dict[str, list[str]] = {}
    doc_ids: dict[str, str | None] = {}
    length = 0
    if isinstance(reply, dict):
        rows = [
            (row[b"id"], (fields := row.get(b"extra_attributes") or {}).get(_LEXICAL_KEY), fields.get(b"doc_id"))
            for row in reply.get(b"results", [])
        ]
        total = int(reply.get(b"total_results", len(rows)))
    else:
        total, generic = reply_rows(reply)
        rows = [
            ((key or "").encode(), fields.get(LEXICAL_FIELD, "").encode(), _encoded(fields.get("doc_id")))
            for key, fields in generic
        ]
    wanted = None if holding is None else set(holding)
    for key, terms, doc_id in rows:
        held = terms.decode().split() if terms else []
        length += len(held)
        if wanted is not None and wanted.isdisjoint(held):
            continue
        pid = searchable.record_id(key)
        documents[pid] = held
        doc_ids[pid] = None if doc_id is None else doc_id.decode()
    return LexicalRows(total, documents, doc_ids, length)


def _hits(
    rows: Sequence[tuple[str, float, dict[str, str], list | None]], return_fields: list[str]
) -> list[tuple[Hit, list | None]]:
    """A KNN search's rows as hits (each beside what was read of it), equally near records by
    id, as in the in-memory store: the first stage fuses ranks, so RediSearch's arbitrary order
    of ties would otherwise change a fused answer run to run."""
    return sorted(
        (
            (Hit(rid, similarity(distance), {f: fields.get(f) for f in return_fields}), got)
            for rid, distance, fields, got in rows
        ),
        key=lambda pair: (-pair[0].score, pair[0].id),
    )


def _own_lexical_search(keys: TenantKeys, terms: list[str], k: int, *reading) -> list:
    """An FT.SEARCH of the tenant's own lexical index (its BM25STD: the tenant's BM25) for any of
    `terms`, sent VERBATIM (the terms are stems already), reading `reading` of each hit: more
    than k asked for, so passages of equal score are cut at k by id (store.lexical.by_score)."""
    search: list = ["FT.SEARCH", keys.lexical_index_name, redis_query(terms), "VERBATIM", *reading]
    return search + ["SCORER", "BM25STD", "WITHSCORES", "LIMIT", 0, k + OWN_INDEX_TIE_MARGIN, "DIALECT", 2]


def _encoded(value: str | None) -> bytes | None:
    return None if value is None else value.encode()


# A tenant's own lexical search with what a graph mode's first stage reads of each hit: its
# passage's row fields and vector, read in the search's command, where they were a round trip
# after both legs (~1-2 ms before a reconstruct walk could start, 50,000 passages). KEYS[1]: a
# key of the tenant (its slot: the index's name is of another, allow-cross-slot-keys). ARGV:
# the copies' key base, the passages' key prefix, the field count, the fields, then the
# FT.SEARCH (NOCONTENT WITHSCORES). The reply: each hit's passage id, score and fields' values.
_LEXICAL_READ = """#!lua flags=no-writes,allow-cross-slot-keys
local base, prefix, n = ARGV[1], ARGV[2], tonumber(ARGV[3])
local fields = {unpack(ARGV, 4, 3 + n)}
local reply = redis.call(unpack(ARGV, 4 + n, #ARGV))
local out = {}
for h = 2, #reply, 2 do
  local rest = string.sub(reply[h], #base + 1)
  local id = string.sub(rest, string.find(rest, ':', 1, true) + 1)
  out[#out + 1] = {id, reply[h + 1], redis.call('HMGET', prefix .. id, unpack(fields))}
end
return out
"""


class SearchOps(LexicalIndexOps):
    """store.base.Layers' searches on Redis."""

    async def knn(
        self,
        tenant: str,
        layer: str,
        vector: np.ndarray,
        k: int,
        return_fields: list[str],
        where: Mapping[str, str] | None = None,
        ensure_index: bool = False,
    ) -> list[Hit]:
        """The `k` records of `layer` nearest `vector` (cosine similarity in `Hit.score`), among
        those whose tag fields equal every value in `where` (e.g. {"status": "active"}).
        `ensure_index` (a writer deciding on the answer): a lost shared index is created again
        first, as store.base.Layers says."""
        return (await self.knn_many(tenant, layer, [vector], k, return_fields, where, ensure_index))[0]

    async def knn_many(
        self,
        tenant: str,
        layer: str,
        vectors: list[np.ndarray],
        k: int,
        return_fields: list[str],
        where: Mapping[str, str] | None = None,
        ensure_index: bool = False,
    ) -> list[list[Hit]]:
        """`knn` for each of `vectors`, all searches sent in one round trip."""
        return await self._knn_searches(tenant, layer, [(v, where) for v in vectors], k, return_fields, ensure_index)

    async def knn_each(
        self,
        tenant: str,
        layer: str,
        vector: np.ndarray,
        k: int,
        return_fields: list[str],
        wheres: list[Mapping[str, str] | None],
    ) -> list[list[Hit]]:
        """`knn` of one vector under each filter of `wheres` (a walk's facts by head, by tail, of
        each cue), all searches in one round trip."""
        return await self._knn_searches(tenant, layer, [(vector, where) for where in wheres], k, return_fields)

    async def facts_near_each(
        self,
        tenant: str,
        vector: np.ndarray,
        k: int,
        return_fields: list[str],
        wheres: list[Mapping[str, str] | None],
        vectors: bool = False,
    ) -> list[list[FactRecordHit]]:
        """knn_each over the facts, each hit with its Fact (and with `vectors` its stored vector)
        read in the same command (TenantIndex.knn_each_read): a reconstruct step searched its
        cues' facts and then read the facts it found, two dependent round trips."""
        keys = self.keys(tenant)
        # the vector read with the fields: one lookup of the hash a hit, not two (entity_passages_near)
        fields = (*stored_fields(), "vec") if vectors else stored_fields()
        reads = [HitRead("HMGET", fields), HitRead("SMEMBERS", (), keys.fact_passages(""))]
        searches = [(vector, where) for where in wheres]
        # the search returns the distance alone: the fields come with the fact; an entity's
        # facts are searched by the entity and their status checked (knn_each_read's `checked`)
        found = await self._knn_searches_read(tenant, "facts", searches, k, [], reads, checked="status")
        out = []
        for hits in found:
            facts = []
            for hit, got in hits:
                assert got is not None  # a search with reads: every hit with their replies
                values, raw = (got[0][:-1], got[0][-1]) if vectors else (got[0], None)
                read = fact_of_values(hit.id, values, got[1])
                if read is None:  # a hash the index still held a moment after its deletion
                    continue
                fact, stored = read
                vec = None if raw is None else vector_from_bytes(raw)
                facts.append(FactRecordHit(hit.id, hit.score, {f: stored.get(f) for f in return_fields}, fact, vec))
            out.append(facts)
        return out

    async def entity_passages_near(
        self, tenant: str, vector: np.ndarray, entity_ids: list[str], k: int, vectors: bool = False
    ) -> list[list[PassageRecordHit]] | None:
        """For each entity, the `k` passages naming it nearest `vector` (cosine in Hit.score),
        each with its row (and with `vectors` its stored vector) read in the same command, all
        searched at once — over a large tenant's own passages index, which tags passages by
        entity (_own_entity_tags); None where there is none (the caller reads the entity's
        passages and ranks them itself). Searched at OWN_VECTOR_EF_RUNTIME; a filter matching
        few passages is searched exactly (ad-hoc brute force over them)."""
        dims = len(vector)
        if not entity_ids or not await self._own_entity_tags(tenant, dims):
            return None
        searchable = await self.vector_searchable(tenant, "passages", dims)
        if not isinstance(searchable, OwnVectorIndex):
            return None
        encoded = vector_bytes(vector)
        reads = [HitRead("HMGET", (*PASSAGE_ROW_FIELDS, "vec") if vectors else PASSAGE_ROW_FIELDS)]
        try:
            results = await searchable.knn_each_read(
                [(encoded, {ENTITIES_FIELD: eid}) for eid in entity_ids], k, [], reads, self.keys(tenant).embedder
            )
        except Exception as exc:
            if not index_missing(exc):
                raise
            self._own_vectors_lost(tenant, dims)
            return None
        return [
            [
                PassageRecordHit(
                    hit.id,
                    hit.score,
                    hit.fields,
                    passage_row(hit.id, got[0][:-1] if vectors else got[0]),
                    None if not vectors or got[0][-1] is None else vector_from_bytes(got[0][-1]),
                )
                for hit, got in _hits(rows, [])
                if got is not None
            ]
            for rows in results
        ]

    async def _knn_searches(
        self,
        tenant: str,
        layer: str,
        searches: list[tuple[np.ndarray, Mapping[str, str] | None]],
        k: int,
        return_fields: list[str],
        ensure_index: bool = False,
    ) -> list[list[Hit]]:
        """The `k` nearest records of each (vector, filter) search, all in one round trip."""
        found = await self._knn_searches_read(tenant, layer, searches, k, return_fields, None, ensure_index)
        return [[hit for hit, _ in hits] for hits in found]

    async def _knn_searches_read(
        self,
        tenant: str,
        layer: str,
        searches: list[tuple[np.ndarray, Mapping[str, str] | None]],
        k: int,
        return_fields: list[str],
        reads: list[HitRead] | None,
        ensure_index: bool = False,
        checked: str | None = None,
    ) -> list[list[tuple[Hit, list | None]]]:
        """_knn_searches, each hit beside the replies of `reads` applied to it in the same
        command (TenantIndex.knn_each_read, with its `checked`; None: no reads, and None beside
        each hit)."""
        if not searches:
            return []
        dims = len(searches[0][0])
        if ensure_index:  # known indexes cost no round trip; a lost one is created here
            await self.index(self.shard(tenant), layer, dims=dims)
        searchable = await self.vector_searchable(tenant, layer, dims)
        if searchable is None:
            return [[] for _ in searches]
        # each distinct vector encoded once (knn_each: one vector under every filter)
        as_bytes = {key: vector_bytes(v) for key, v in {id(v): v for v, _ in searches}.items()}
        encoded = [(as_bytes[id(v)], where) for v, where in searches]

        async def search(index: TenantIndex) -> Sequence[Sequence[tuple[str, float, dict[str, str], list | None]]]:
            if reads is None:
                return [[(*row, None) for row in rows] for rows in await index.knn_each(encoded, k, return_fields)]
            return await index.knn_each_read(encoded, k, return_fields, reads, self.keys(tenant).embedder, checked)

        try:
            results = await search(searchable)
        except Exception as exc:
            if not index_missing(exc):
                raise
            if isinstance(searchable, OwnVectorIndex):  # the tenant's own index gone: the shared one answers
                self._own_vectors_lost(tenant, dims)
                return await self._knn_searches_read(
                    tenant, layer, searches, k, return_fields, reads, ensure_index, checked
                )
            # Redis restarted empty or the index was dropped under a process that knew it: a
            # reader finds nothing (it creates nothing; the next write creates the indexes
            # again); a writer creates it now and searches again — its records were written
            # while there was none (tests/test_recovery.py), and a similarity bridge or a
            # near-duplicate decided on "nothing" would be lost for good
            self._lost_indexes()
            if not ensure_index:
                return [[] for _ in searches]
            await self.index(self.shard(tenant), layer, dims=dims)
            again = await self.searchable(tenant, layer, dims=dims)
            assert again is not None  # just created
            results = await search(again)  # lost again: the handler's retry
        return [_hits(rows, return_fields) for rows in results]

    async def passages_near_read(self, tenant: str, vector: np.ndarray, k: int) -> list[PassageRecordHit] | None:
        """knn of the passages (fields: doc_id), each hit with its row read in the search's
        command (_knn_searches_read)."""
        found = await self._knn_searches_read(
            tenant, "passages", [(vector, None)], k, [], [HitRead("HMGET", PASSAGE_ROW_FIELDS)]
        )
        out = []
        for hit, got in found[0]:
            assert got is not None  # a search with reads: every hit with their replies
            doc_id = got[0][1]
            fields = {"doc_id": None if doc_id is None else doc_id.decode()}
            out.append(PassageRecordHit(hit.id, hit.score, fields, passage_row(hit.id, got[0])))
        return out

    async def lexical_read(self, tenant: str, query: str, k: int) -> list[PassageRecordHit] | None:
        """lexical, each hit with its row and vector read in the search's command — by a tenant's
        own lexical index (_LEXICAL_READ), where lexical would search it: a tenant known to be
        larger than LEXICAL_READ_ALL whose index is ready. None elsewhere (lexical answers, and
        learns whether the tenant is large), or where the index was lost."""
        terms = search_terms(query)
        if not terms or k < 1 or tenant not in self._tenant_large or not await self.own_lexical_ready(tenant):
            return None
        keys = self.keys(tenant)
        search = _own_lexical_search(keys, terms, k, "NOCONTENT")
        fields = (*PASSAGE_ROW_FIELDS, "vec")
        try:
            reply = await self._run_script(
                tenant,
                _LEXICAL_READ,
                [keys.base],
                [keys.lexical_mirror_base, keys.passage(""), len(fields), *fields, *search],
            )
        except Exception as exc:
            if not index_missing(exc):
                raise
            self._own_lexical_lost(tenant)
            return None
        hits = sorted(
            ((pid.decode(), float(score), values) for pid, score, values in reply), key=lambda h: by_score(h[1], h[0])
        )
        return [
            PassageRecordHit(
                pid,
                score,
                {"doc_id": None if values[1] is None else values[1].decode()},
                passage_row(pid, values[:-1]),
                None if values[-1] is None else vector_from_bytes(values[-1]),
            )
            for pid, score, values in hits[:k]
        ]

    async def lexical(self, tenant: str, query: str, k: int) -> list[Hit]:
        """The `k` passages of the tenant best matching `query` by BM25 over the passages' terms
        (store.lexical), any of its terms matching, best first; `Hit.score` is the BM25 score
        and `fields` hold doc_id. The statistics are the tenant's own — its passage count, their
        average length, each term's document frequency among them — so one tenant's texts never
        move another's scores (the shared index's BM25STD would count every tenant's). The
        index finds the tenant's passages holding a query term, and they are scored here: all
        of them in one search up to LEXICAL_CANDIDATES, past that as many as make the top k
        exact (_lexical_past_the_cap)."""
        terms = search_terms(query)
        if not terms or k < 1:
            return []
        searchable = await self.searchable(tenant, "passages")
        if searchable is None:
            return []
        try:
            read = await self._lexical_small_tenant(tenant, searchable, terms)
            if read is not None:  # every passage of the tenant, in one search: those holding a term kept
                count, passages, doc_ids, length = read
                average = length / count if count else 0.0
                scores = bm25(terms, passages, document_frequency(terms, passages), count, average)
            else:
                own = await self._lexical_own(tenant, terms, k) if await self.own_lexical_ready(tenant) else None
                if own is not None:  # None: no own index ready, or it was lost (the shared path is exact too)
                    return own
                scores, doc_ids = await self._lexical_candidates(searchable, terms, k)
        except Exception as exc:
            if not index_missing(exc):
                raise
            self._lost_indexes()
            return []
        # equal scores by id, as in the in-memory store
        ranked = sorted(scores.items(), key=lambda item: by_score(item[1], item[0]))[:k]
        return [Hit(pid, score, {"doc_id": doc_ids[pid]}) for pid, score in ranked]

    async def _lexical_own(self, tenant: str, terms: list[str], k: int) -> list[Hit] | None:
        """The top k by the tenant's own index (store.redis.lexical_index): its BM25STD is the
        tenant's BM25, scored in Redis. A few more than k are asked for, so passages of equal
        score are cut at k by id as everywhere else. None when the index is gone (dropped, or
        Redis restarted empty): the caller scores on the shared index."""
        keys = self.keys(tenant)
        try:
            reply = await search_with_fields(
                self.shard(tenant),
                _own_lexical_search(keys, terms, k, "RETURN", 1, "doc_id"),
                keys.base if self.clustered else None,
            )
        except Exception as exc:
            if not index_missing(exc):
                raise
            self._own_lexical_lost(tenant)
            return None
        rows = [(keys.lexical_copy_passage(key), score, doc_id) for key, score, doc_id in own_lexical_hits(reply)]
        rows.sort(key=lambda row: by_score(row[1], row[0]))
        return [Hit(pid, score, {"doc_id": doc_id}) for pid, score, doc_id in rows[:k]]

    async def _lexical_small_tenant(self, tenant: str, searchable: TenantIndex, terms: list[str]) -> LexicalRows | None:
        """Every passage of a tenant of at most LEXICAL_READ_ALL, read in one search (those
        holding one of `terms` kept): its statistics come with them, where a larger tenant needs an
        aggregate beside its search (measured, 300 tenants of 20 passages: 0.44 ms against
        0.74 ms p50). None for a larger tenant, which is remembered (and asked again every
        TENANT_DIMS_RECHECK_S: it may have shrunk, unless it has an index of its own)."""
        now, known = time.monotonic(), self._tenant_large.get(tenant)
        # a large tenant with an index of its own is not asked again (that index stays exact if
        # it shrinks): the read of up to LEXICAL_READ_ALL of its passages cost ~10 ms of Redis at
        # 50,000 passages, every TENANT_DIMS_RECHECK_S a query process
        if known is not None and (now - known < TENANT_DIMS_RECHECK_S or await self.own_lexical_ready(tenant)):
            return None
        reply = await searchable.run(
            searchable.command("FT.SEARCH", "", "RETURN", 2, "doc_id", LEXICAL_FIELD, "LIMIT", 0, LEXICAL_READ_ALL)
        )
        read = _lexical_rows(searchable, reply, terms)
        if read.total > LEXICAL_READ_ALL:
            if len(self._tenant_large) >= 100_000:
                self._tenant_large.clear()
            self._tenant_large[tenant] = now
            return None
        self._tenant_large.pop(tenant, None)
        return read

    async def _lexical_candidates(
        self, searchable: TenantIndex, terms: list[str], k: int
    ) -> tuple[dict[str, float], dict[str, str | None]]:
        """A larger tenant's statistics (its passage count and average length: one aggregate)
        beside the passages holding a query term, as many as make its top k exact: their BM25
        scores, and their doc ids."""
        # two commands sent at once cost less than a pipeline of two (1.1 -> 0.8 ms p50)
        statistics = searchable.command(
            "FT.AGGREGATE",
            "",
            "GROUPBY",
            0,
            "REDUCE",
            "COUNT",
            0,
            "AS",
            "n",
            "REDUCE",
            "SUM",
            1,
            f"@{LEXICAL_LENGTH_FIELD}",
            "AS",
            "length",
        )
        matching = _lexical_page(searchable, terms, 0, LEXICAL_CANDIDATES)
        stats, found = await asyncio.gather(searchable.run(statistics), searchable.run(matching))
        row = (reply_rows(stats)[1] or [(None, {})])[0][1]
        count, length = int(row.get("n", 0)), float(row.get("length", 0) or 0)
        average = length / count if count else 0.0
        total, documents, doc_ids, _ = _lexical_rows(searchable, found)
        if total <= len(documents):  # every matching passage is here: count the terms in them
            return bm25(terms, documents, document_frequency(terms, documents), count, average), doc_ids
        frequency = await self._term_counts(searchable, terms)
        scores = await self._lexical_past_the_cap(searchable, terms, frequency, count, average, k, documents, doc_ids)
        return scores, doc_ids

    async def _term_counts(self, searchable: TenantIndex, terms: list[str]) -> dict[str, int]:
        """How many of the tenant's passages hold each term (one count each, sent at once)."""
        counted = await asyncio.gather(
            *(
                searchable.redis.execute_command(
                    *searchable.command("FT.SEARCH", redis_query([t]), "VERBATIM", "NOCONTENT", "LIMIT", 0, 0)
                )
                for t in terms
            )
        )
        return {t: reply_rows(reply)[0] for t, reply in zip(terms, counted)}

    async def _lexical_past_the_cap(
        self,
        searchable: TenantIndex,
        terms: list[str],
        frequency: dict[str, int],
        count: int,
        average: float,
        k: int,
        documents: dict[str, list[str]],
        doc_ids: dict[str, str | None],
    ) -> dict[str, float]:
        """More passages match than one search returns: add to `documents` (the index's BM25STD
        best, already read) enough of them that the top k by the tenant's own BM25 is exact, and
        give their scores.
        Every passage holding one of the rarest terms (as many terms as fit LEXICAL_CANDIDATES
        passages) is read; a passage holding none of them scores below what the other terms
        can give at most (idf × (k1 + 1) each), so when the k-th score read reaches that bound
        nothing unread can enter the top k. Otherwise every matching passage is read, a page of
        LEXICAL_CANDIDATES at a time, up to LEXICAL_MAX_READ. (MuSiQue-100: 19 of 100 questions match over 1,000 of its
        1,890 passages; choosing them by the shared index's BM25STD, whose statistics count
        every tenant, moved lexical R@2 by 0.3.)"""
        idf = bm25_idf(terms, frequency, count)
        rarest, held = [], 0
        for term in sorted(idf, key=lambda t: (frequency[t], t)):
            if held + frequency[term] > LEXICAL_CANDIDATES:
                break
            rarest.append(term)
            held += frequency[term]
        bound = sum(idf[t] * (K1 + 1.0) for t in idf if t not in rarest)
        if rarest:
            await self._read_lexical(searchable, rarest, 0, held, documents, doc_ids)
            scores = bm25(terms, documents, frequency, count, average)
            best = sorted(scores.values(), reverse=True)
            if len(best) >= k and best[k - 1] >= bound:
                return scores
        # an upper bound on the passages matching any term; a search pages up to the query
        # engine's MAXSEARCHRESULTS (10,000 by default): past it, its BM25STD best are scored
        total = min(sum(frequency.values()), LEXICAL_MAX_READ)
        for offset in range(0, total, LEXICAL_CANDIDATES):
            if not await self._read_lexical(searchable, terms, offset, LEXICAL_CANDIDATES, documents, doc_ids):
                break
        return bm25(terms, documents, frequency, count, average)

    async def _read_lexical(
        self,
        searchable: TenantIndex,
        terms: list[str],
        offset: int,
        limit: int,
        documents: dict[str, list[str]],
        doc_ids: dict[str, str | None],
    ) -> int:
        """The terms and doc ids of the tenant's passages holding any of `terms`, a page of them
        in the index's BM25STD order (the same order every page, the index unchanged between
        them), added to `documents` and `doc_ids`; how many came."""
        reply = await searchable.run(_lexical_page(searchable, terms, offset, limit))
        _, read, ids, _ = _lexical_rows(searchable, reply)
        documents.update(read)
        doc_ids.update(ids)
        return len(read)
