"""Erasure: a deleted document's text gone from Redis (`memstream delete --purge`), decided on
the chunker's transaction after the deletion (workers.stages.chunker).

What goes, and why each rule:
- passages: every passage any version of the document held (TenantKeys.document_passages)
  that is retired and that no other document's current version holds — a text another
  document still holds is that document's too. Each is left as a skeleton (retired, purged, its
  incarnation), so a chunk of it still in flight is not extracted again; publishing the text
  again brings it back (a revert) and extracts it anew.
- facts: those whose every source passage (the extractions that wrote them) is erased and that
  no passage supports now — a fact another passage extracted stays, as does one that holds on
  support merged into it from elsewhere. A fact merged into an erased one is retracted (with
  its event) instead of pointing nowhere.
- entities: those the erased passages or facts named that no current passage mentions and no
  remaining fact names (their graph edges, aliases and relation-head counts with them).
- model caches: the LLM's answers for the passages' extractions and the cached vectors of the
  passages, the erased entities' names and the erased facts.
The decision is fenced on every count it read: a passage's documents and support
(Memory.expect_passage), a fact's extractions and status, an entity's mentions — a writer that
changes one between the reads and the commit makes it run again.

The tenant-wide erasure (`memstream tenant delete --purge`, ops/erase.py) finds its cache
entries with the same two helpers (workers.derived)."""

from __future__ import annotations

from store.facts import Fact, document_event
from store.records import FACT_EXTRACTIONS, Erasure
from workers.derived import extraction_cache_keys, left_to_erase, texts_of_records
from workers.envelope import Emit
from workers.stages.context import Stage


class Erasing(Stage):
    async def erase(self, pipe, tenant: str, doc_id: str) -> list[Emit]:
        """Stage the erasure of a deleted document on `pipe`; its `purged` event (none when
        nothing of it is left to erase)."""
        memory = self.memory
        record = await memory.document_record(tenant, doc_id)
        if record is None or not record.deleted:
            return []  # published again since: the current version is not erased
        memory.expect_document(pipe, tenant, doc_id, record)
        passages = await left_to_erase(memory, pipe, tenant, doc_id)
        if not passages:
            return []
        gone = set(passages)
        rows = [(pid, row) for pid, row in zip(passages, await memory.passages(tenant, passages)) if row is not None]

        candidates = sorted(
            {fid for extracted in await memory.passage_extracted(tenant, passages) for fid in extracted}
        )
        facts: list[Fact] = []
        for fact, (sources, extractions) in zip(
            await memory.facts(tenant, candidates), await memory.fact_sources(tenant, candidates)
        ):
            if fact is None or not sources <= gone or fact.passage_ids:
                continue  # extracted elsewhere too, or supported now
            memory.expect_field(pipe, tenant, fact.id, FACT_EXTRACTIONS, extractions)
            memory.expect_status(pipe, tenant, fact.id, fact.status)
            facts.append(fact)
        erased_facts = {f.id for f in facts}
        named = sorted(
            {eid for pid in passages for eid in await memory.passage_entities(tenant, pid)}
            | {e for f in facts for e in (f.head_id, f.tail_id)}
        )
        naming = {
            eid: set(await memory.facts_naming(tenant, eid)) for eid in named
        }  # entity → the facts with it as head or tail
        outbox = await self._unmerge(pipe, tenant, facts, erased_facts, doc_id, naming)

        entities: list[str] = []
        for eid, (current, mentions) in zip(named, await memory.entity_mentions(tenant, named)):
            if current or naming[eid] - erased_facts:
                continue  # a current passage mentions it, or a remaining fact names it
            memory.expect_entity(pipe, tenant, eid, mentions)
            entities.append(eid)
        erased_entities = set(entities)
        names = await memory.entity_names(tenant, entities)
        aliases = [
            alias
            for alias, canonical in (await memory.alias_map(tenant)).items()
            if alias in erased_entities or canonical in erased_entities
        ]

        cache_keys = extraction_cache_keys(self.settings, rows)
        embedder = await memory.recorded_embedder(tenant)
        if embedder is not None:
            vectors = memory.embedding_cache(embedder.cache_name)
            fact_rows = [(f.id, {"head": f.head, "relation": f.relation, "tail": f.tail}) for f in facts]
            cache_keys += [
                vectors.key(text) for text in texts_of_records(rows, [(e, n) for e, n in names.items()], fact_rows)
            ]
            # a turn embedded after the turn before it: that text's vector, by the digest it
            # recorded (the next turn's pair went at the retirement this erasure follows:
            # Versions._next_turns_alone)
            made = await memory.turn_embeddings(tenant, [pid for pid, _ in rows])
            cache_keys += [vectors.key_of_digest(m.embedded_sha) for m in made if m.embedded_sha]
        memory.stage_erase(
            pipe,
            tenant,
            Erasure(
                doc_id=doc_id,
                passage_ids=tuple(passages),
                facts=tuple(facts),
                entity_ids=tuple(entities),
                relation_heads=tuple(sorted({(f.relation, f.head_id) for f in facts if f.head_id in erased_entities})),
                aliases=tuple(sorted(aliases)),
                cache_keys=tuple(dict.fromkeys(cache_keys)),
            ),
        )
        reason = (
            f"document {doc_id} erased: {len(passages)} passage(s), {len(facts)} fact(s), {len(entities)} entit(y/ies)"
        )
        return outbox + [
            Emit.of(
                document_event(
                    tenant, "purged", doc_id, passages, await memory.graph_version(tenant), reason, sorted(erased_facts)
                )
            )
        ]

    async def _unmerge(
        self, pipe, tenant: str, facts: list[Fact], erased: set[str], doc_id: str, naming: dict[str, set[str]]
    ) -> list[Emit]:
        """A fact that stays but was merged into an erased one (its twin, of the same entities:
        another passage extracted it) would point nowhere: it is retracted instead (it has no
        support either: its target had none), so a passage that says it again admits it anew."""
        memory, outbox, version = self.memory, [], None
        near = sorted({fid for f in facts for fid in naming[f.head_id]} - erased)
        for fact in await memory.facts(tenant, near):
            if fact is None or fact.status != "merged" or fact.merged_into not in erased:
                continue
            version = version or await memory.graph_version(tenant)
            fact.merged_into = ""
            memory.stage_fact_update(pipe, tenant, fact.id, {"merged_into": ""})
            outbox.append(
                Emit.of(
                    self.lifecycle.retract(
                        pipe, tenant, fact, version, f"the fact it was merged into was erased with document {doc_id}"
                    )
                )
            )
        return outbox
