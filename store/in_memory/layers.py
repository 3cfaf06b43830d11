"""The memory layers' records in process (store.base.Layers' writes and reads), as
store/redis/layers.py: passages, entities (the smallest description wins: _SET_IF_SMALLER
there), schemas (counted toward τ: _SUPPORT_SCHEMA there), facts and their passages, read as
Redis hands them back. Its searches are store/in_memory/search.py's, its indexes
lexical_index.py's and vector_index.py's, as on Redis."""

from __future__ import annotations

import json
import time
from typing import Any, Mapping

import numpy as np

from store.facts import Fact
from store.in_memory.base import InMemoryBase, _text, _vec
from store.in_memory.expiry import _record_lapse
from store.records import (
    ENTITY_MENTIONS,
    FACT_EXTRACTIONS,
    OWN_VECTOR_FIELD,
    PASSAGE_EXTRAS,
    VECTOR_ITEM_BYTES,
    HeldVector,
    PassagesRead,
    TurnEmbedding,
    passage_extras,
    passage_json,
    turn_embedding_fields,
    vector_bytes,
)


class LayersOps(InMemoryBase):
    """store.base.Layers' records in process (store.redis.layers.LayersOps on Redis)."""

    def _hsetnx(self, tenant: str, layer: str, record_id: str, name: str, value: Any) -> None:
        if name not in self._tenant(tenant).records[layer].get(record_id, {}):
            self._hset(tenant, layer, record_id, {name: value})

    def _set_if_smaller(self, tenant: str, layer: str, record_id: str, rank: str, fields: Mapping[str, Any]) -> None:
        """As store/redis/layers.py's _SET_IF_SMALLER: the smallest description seen wins (Lua compares
        bytes, as str does)."""
        current = _text(self._tenant(tenant).records[layer].get(record_id, {}).get("_rank"))
        if current is None or rank < current:
            self._hset(tenant, layer, record_id, {"_rank": rank, **fields})

    def _count(self, tenant: str, layer: str, record_id: str, counter: str) -> None:
        """Memory's HINCRBY of a record's write counter."""
        row = self._tenant(tenant).records[layer].setdefault(record_id, {})
        row[counter] = str(int(row.get(counter) or 0) + 1)

    def stage_passage(
        self,
        pipe,
        tenant: str,
        chunk,
        entity_ids: list[str],
        vector,
        turn: TurnEmbedding | None = None,
        own_vector=None,
        preceding_text: str | None = None,
    ) -> None:
        fields = {
            "text": chunk.text,
            "doc_id": chunk.doc_id,
            "seq": chunk.seq,
            "doc_version": chunk.doc_version,
            "entities": json.dumps(entity_ids),
            "vec": vector_bytes(vector),
            **passage_extras(chunk, preceding_text),
            **(turn_embedding_fields(turn) if turn is not None else {}),
            **({OWN_VECTOR_FIELD: vector_bytes(own_vector)} if own_vector is not None else {}),
        }

        def write() -> None:
            self._hset(tenant, "passages", chunk.chunk_id, fields)
            self._tenant(tenant).lexical = None  # written again (delivered twice), its terms may differ
            self._revise(tenant, chunk.chunk_id)  # Memory.stage_passage: its counted sets change with it

        self._stage(pipe, write)

    def stage_entity(self, pipe, tenant: str, entity_id: str, name: str, type_: str, vector, passage_id: str) -> None:
        fields = {"name": name, "type": type_, "vec": vector_bytes(vector)}

        def write() -> None:
            self._set_if_smaller(tenant, "entities", entity_id, f"{name}\x1f{type_}", fields)
            self._set(tenant, "entity_passages", entity_id).add(passage_id)
            self._count(tenant, "entities", entity_id, ENTITY_MENTIONS)

        self._stage(pipe, write)

    def stage_schema(
        self, pipe, tenant: str, schema_id: str, head_type: str, relation: str, tail_type: str, vector, passage_id: str
    ) -> None:
        first = {
            "head_type": head_type,
            "relation": relation,
            "tail_type": tail_type,
            "status": "candidate",
            "vec": vector_bytes(vector),
        }

        def write() -> None:
            for name, value in first.items():
                self._hsetnx(tenant, "schemas", schema_id, name, value)
            # store/redis/layers.py's _SUPPORT_SCHEMA: distinct supporting passages; stable at τ
            supporting = self._set(tenant, "schema_passages", schema_id)
            supporting.add(passage_id)
            self._set(tenant, "passage_schemas", passage_id).add(schema_id)
            self._hset(tenant, "schemas", schema_id, {"frequency": len(supporting)})
            if len(supporting) >= self.tau:
                self._hset(tenant, "schemas", schema_id, {"status": "stable"})

        self._stage(pipe, write)

    def stage_new_fact(
        self, pipe, tenant: str, fact: Fact, vector, lapses_at: float | None = None, passage_id: str = ""
    ) -> None:
        fid, rank, now = fact.id, fact.description_rank(), time.time()
        fields = {**fact.description(), "vec": vector_bytes(vector)}

        def write() -> None:
            _record_lapse(self, tenant, fid, lapses_at)  # before the fact exists: tells its first passage
            self._set_if_smaller(tenant, "facts", fid, rank, fields)
            self._hsetnx(tenant, "facts", fid, "status", "new")
            self._hsetnx(tenant, "facts", fid, "created_at", now)
            if passage_id:
                self._set(tenant, "fact_sources", fid).add(passage_id)
                self._set(tenant, "passage_extracted", passage_id).add(fid)
                self._count(tenant, "facts", fid, FACT_EXTRACTIONS)

        self._stage(pipe, write)

    def stage_fact_passage(self, pipe, tenant: str, fact_id: str, passage_id: str) -> None:
        def write() -> None:
            self._set(tenant, "fact_passages", fact_id).add(passage_id)
            self._set(tenant, "passage_facts", passage_id).add(fact_id)
            self._revise(tenant, passage_id)

        self._stage(pipe, write)

    def stage_fact_said(self, pipe, tenant: str, fact_id: str, doc_id: str, at: float) -> None:
        def write() -> None:
            self._tenant(tenant).said.setdefault(fact_id, {}).setdefault(doc_id, float(at))  # Memory's HSETNX

        self._stage(pipe, write)

    async def set_aside_passages(self, tenant: str, fact_id: str) -> list[str]:
        return sorted(self._tenant(tenant).sets.get(("fact_set_aside", fact_id), ()))

    async def facts_said(self, tenant: str, fact_ids: list[str]) -> list[dict[str, float]]:
        said = self._tenant(tenant).said
        return [dict(said.get(fid, {})) for fid in fact_ids]

    def stage_unsupport(self, pipe, tenant: str, fact_id: str, passage_ids: list[str]) -> None:
        def write() -> None:
            self._tenant(tenant).sets.pop(("fact_passages", fact_id), None)
            self._tenant(tenant).sets.pop(("fact_set_aside", fact_id), None)
            if passage_ids:
                self._set(tenant, "fact_set_aside", fact_id).update(passage_ids)
            for pid in passage_ids:
                self._set(tenant, "passage_facts", pid).discard(fact_id)

        self._stage(pipe, write)

    def stage_fact_update(self, pipe, tenant: str, fact_id: str, fields: dict[str, Any]) -> None:
        stored = {k: ("" if v is None else v) for k, v in fields.items()}
        self._stage(pipe, lambda: self._hset(tenant, "facts", fact_id, stored))

    async def fact(self, tenant: str, fact_id: str) -> Fact | None:
        return (await self.facts(tenant, [fact_id]))[0]

    async def facts(self, tenant: str, fact_ids: list[str]) -> list[Fact | None]:
        records, out = self._tenant(tenant).records["facts"], []
        for fid in fact_ids:
            row = records.get(fid)
            out.append(
                None
                if not row
                else Fact.from_hash(
                    fid,
                    {k: _text(v) for k, v in row.items() if k not in ("vec", "_rank")},
                    list(self._set(tenant, "fact_passages", fid)),
                )
            )
        return out

    async def passages(self, tenant: str, passage_ids: list[str]) -> list[dict | None]:
        records, out = self._tenant(tenant).records["passages"], []
        for pid in passage_ids:
            row = records.get(pid, {})
            out.append(
                None
                if row.get("text") is None
                else passage_json(
                    pid,
                    _text(row["text"]),
                    _text(row["doc_id"]),
                    row["seq"],
                    row.get("doc_version"),
                    *(_text(row.get(f)) for f in PASSAGE_EXTRAS),
                )
            )
        return out

    async def entity_names(self, tenant: str, entity_ids: list[str]) -> dict[str, dict]:
        records = self._tenant(tenant).records["entities"]
        return {
            eid: {"name": records[eid]["name"], "type": records[eid].get("type", "")}
            for eid in dict.fromkeys(entity_ids)
            if records.get(eid, {}).get("name") is not None
        }

    async def passage_entities(self, tenant: str, passage_id: str) -> list[str]:
        raw = self._tenant(tenant).records["passages"].get(passage_id, {}).get("entities")
        return json.loads(raw) if raw else []

    async def passage_subjects(self, tenant: str, passage_ids: list[str]) -> list[str | None]:
        rows = [self._tenant(tenant).records["passages"].get(pid, {}) for pid in passage_ids]
        return [None if row.get("retired") == "1" else _text(row.get("subject")) for row in rows]

    async def passages_entities(self, tenant: str, passage_ids: list[str]) -> list[list[str]]:
        return [await self.passage_entities(tenant, pid) for pid in passage_ids]

    async def fact_vector(self, tenant: str, fact_id: str) -> np.ndarray | None:
        return self._vector(tenant, "facts", fact_id)

    async def read_passages(self, tenant: str, passage_ids: list[str], vectors: list[tuple[str, str]]) -> PassagesRead:
        entities = await self.passages_entities(tenant, passage_ids)
        facts = [tid for kind, tid in vectors if kind == "fact"]
        passages = [tid for kind, tid in vectors if kind == "passage"]
        held = zip(
            [("fact", f) for f in facts] + [("passage", p) for p in passages],
            [*await self.fact_vectors(tenant, facts), *[self._vector(tenant, "passages", pid) for pid in passages]],
        )
        return PassagesRead(
            await self.passages(tenant, passage_ids),
            entities,
            await self.entity_names(tenant, [eid for ids in entities for eid in ids]),
            {tag: vec for tag, vec in held if vec is not None},
        )

    async def fact_vectors(self, tenant: str, fact_ids: list[str]) -> list[np.ndarray | None]:
        return [self._vector(tenant, "facts", fid) for fid in fact_ids]

    async def held_vectors(
        self, tenant: str, entities: dict[str, str], facts: dict[str, str], schemas: dict[str, str]
    ) -> dict[str, HeldVector]:
        """Memory.held_vectors: text → the vector a record holds for that very text."""
        records = self._tenant(tenant).records
        asked = (
            [("entities", i, ["name"], text) for i, text in entities.items()]
            + [("facts", i, ["text"], text) for i, text in facts.items()]
            + [("schemas", i, ["head_type", "relation", "tail_type"], text) for i, text in schemas.items()]
        )
        held = {}
        for layer, record_id, fields, text in asked:
            row = records[layer].get(record_id, {})
            parts, vec = [row.get(f) for f in fields], row.get("vec")
            if vec is None or len(_vec(vec)) != VECTOR_ITEM_BYTES * self.dims or None in parts:
                continue
            if " ".join(_text(p) for p in parts if p is not None) == text:
                held[text] = HeldVector(_vec(vec))
        return held
