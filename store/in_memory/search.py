"""Layers' searches in process (knn, knn_many, knn_each, facts_near_each,
entity_passages_near, lexical), as store/redis/search.py on Redis: KNN by brute force as
RediSearch's FLAT index computes it (_unit, _tag_equals), the lexical leg over
store/in_memory/lexical_index.py's BM25 index."""

from __future__ import annotations

from typing import Mapping

import numpy as np

from store.facts import FactRecordHit
from store.in_memory.base import _text, _vec
from store.in_memory.layers import LayersOps
from store.in_memory.lexical_index import _LexicalIndex
from store.lexical import search_terms
from store.records import (
    VECTOR_DTYPE,
    VECTOR_ITEM_BYTES,
    Hit,
    PassageRecordHit,
    similarity,
    vector_bytes,
    vector_from_bytes,
)


class SearchOps(LayersOps):
    """Layers' searches in process (store.redis.search.SearchOps on Redis); over LayersOps, the
    records a fact search reads."""

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
        return [await self.knn(tenant, layer, vector, k, return_fields, where, ensure_index) for vector in vectors]

    async def knn_each(
        self,
        tenant: str,
        layer: str,
        vector: np.ndarray,
        k: int,
        return_fields: list[str],
        wheres: list[Mapping[str, str] | None],
    ) -> list[list[Hit]]:
        return [await self.knn(tenant, layer, vector, k, return_fields, where) for where in wheres]

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
        """Memory.knn by brute force, as RediSearch's FLAT index computes it: cosine distance in
        float32 over unit vectors, given back to 12 significant digits; records without a vector
        of `dims` floats are not in the index; tag equality is case-insensitive and matches any
        of a comma-separated value's tags. Equal distances are ordered by id here; Memory gives
        them in no defined order (RediSearch's heap, over vectors indexed in the background: it
        varies from run to run), nor which of more than k equally near records it keeps."""
        if ensure_index:
            self._tenant(tenant).indexed = True
        t = self._tenants.get(tenant)
        if t is None or not t.indexed:
            return []
        rows = [
            (rid, row)
            for rid, row in t.records[layer].items()
            if len(row.get("vec", b"")) == VECTOR_ITEM_BYTES * self.dims
            and all(_tag_equals(row.get(f), v) for f, v in (where or {}).items())
        ]
        if not rows:
            return []
        matrix = np.vstack([_unit(vector_from_bytes(_vec(row["vec"]))) for _, row in rows])
        distances = np.float32(1.0) - matrix @ _unit(vector_from_bytes(vector_bytes(vector)))
        ranked = sorted(zip(distances.tolist(), rows), key=lambda x: (x[0], x[1][0]))[:k]
        return [
            Hit(rid, similarity(float(f"{distance:.12g}")), {f: _text(row.get(f)) for f in return_fields})
            for distance, (rid, row) in ranked
        ]

    async def lexical(self, tenant: str, query: str, k: int) -> list[Hit]:
        """Memory.lexical with bm25s (Lucene's BM25, RediSearch's k1 and b) over the passages'
        Snowball stems (store.lexical): the `k` passages matching any query term, best first,
        equal scores by id. The index is rebuilt on the first search after passages change
        (this store serves tests and in-process benchmarks; Redis maintains its own)."""
        t = self._tenants.get(tenant)
        terms = search_terms(query)
        if t is None or not t.indexed or not terms or k < 1:
            return []
        passages = t.records["passages"]
        if t.lexical is None or t.lexical.size != len(passages):
            t.lexical = _LexicalIndex(passages)
        return [
            Hit(pid, score, {"doc_id": _text(passages[pid].get("doc_id"))}) for pid, score in t.lexical.search(terms, k)
        ]

    async def facts_near_each(
        self,
        tenant: str,
        vector: np.ndarray,
        k: int,
        return_fields: list[str],
        wheres: list[Mapping[str, str] | None],
        vectors: bool = False,
    ) -> list[list[FactRecordHit]]:
        out = []
        for hits in await self.knn_each(tenant, "facts", vector, k, return_fields, wheres):
            ids = [h.id for h in hits]
            records = await self.facts(tenant, ids)
            held = await self.fact_vectors(tenant, ids) if vectors else [None] * len(ids)
            out.append([FactRecordHit(h.id, h.score, h.fields, f, v) for h, f, v in zip(hits, records, held)])
        return out

    async def passages_near_read(self, tenant: str, vector: np.ndarray, k: int) -> list[PassageRecordHit] | None:
        return None  # a search and a read in process cost no round trip: the first stage reads after

    async def lexical_read(self, tenant: str, query: str, k: int) -> list[PassageRecordHit] | None:
        return None

    async def entity_passages_near(
        self, tenant: str, vector: np.ndarray, entity_ids: list[str], k: int, vectors: bool = False
    ) -> list[list[PassageRecordHit]] | None:
        return None  # no index tags its passages by entity: the walk reads and ranks them (entity_passage_vectors)


def _unit(vector: np.ndarray) -> np.ndarray:
    """The vector as VecSim stores it for cosine distance: scaled to length 1 in float32, held
    in the index's type (distances are then summed in float32)."""
    norm = np.float32(np.sqrt(np.dot(vector, vector)))
    return (vector / norm if norm else vector).astype(VECTOR_DTYPE).astype(np.float32)


def _tag_equals(stored: str | bytes | None, wanted: str) -> bool:
    """RediSearch's tag match: any of the comma-separated tags, trimmed, case-insensitive."""
    return stored is not None and wanted.strip().lower() in {tag.strip().lower() for tag in _text(stored).split(",")}
