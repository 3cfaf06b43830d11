"""A_det: a candidate fact → through the τ gate (pending while its schema is a candidate), then
conflict detection: activated (event on `indexed-facts`), merged with its active twin, or handed
to the resolver on `conflict-sets`. A schema that becomes stable sends the facts parked under it
back onto `candidate-facts` as activations.

This module owns its input's done marks (`detection_mark`, `activation_work_id`); its partition
key is the contract's (topics.records.candidate_key, through the stage graph: Emit.of).
"""

from __future__ import annotations

import time

from store import Hit
from store.facts import Fact, event
from store.nodes import entity_node
from topics import CandidateFact
from topics.records import VALUE_TYPES
from workers.algorithms.normalize import fact_id, schema_id
from workers.algorithms.policy import (
    MIN_MULTI_HEADS,
    MULTI_HEAD_SHARE,
    SYMMETRIC_RELATIONS,
    UNCONTESTED_CATEGORIES,
    needs_no_tau,
)
from workers.envelope import Emit, Finishes, PermanentError, spawned_work_ids
from workers.stages.context import Stage, current_passage
from workers.stages.handoffs import adjudication, containment_changed, duplicate, is_promotion, is_readmission

MULTI_RULE = (MIN_MULTI_HEADS, MULTI_HEAD_SHARE)  # decided in Redis with the group join (Memory.join_group)


def detection_mark(cand: CandidateFact, fid: str) -> str:
    """Done mark: an extracted fact's detection is one per (passage, fact index); a promoted
    pending fact's activation one per (fact, promoting passage)."""
    return f"act:{fid}:{cand.passage_mark}" if cand.activation else f"det:{cand.passage_mark}:{cand.fact_index}"


def activation_work_id(pending_fact_id: str) -> str:
    """The chunk-progress work item of a pending fact's activation."""
    return f"act:{pending_fact_id}"


class DetectorStage(Stage):
    async def handle(self, cand: CandidateFact) -> None:
        tenant, fid = cand.tenant, fact_id(cand.head_id, cand.fact.relation, cand.tail_id)

        async def decide(pipe) -> list[Emit]:
            fact = await self.memory.fact(tenant, fid)
            if fact is None:
                raise PermanentError(
                    f"candidate fact {fid} has no extracted record in memory (publish documents, not candidate facts)"
                )
            if fact.lapsed():  # its TTL is over (every passage's): nothing to admit; the expiry sweep expires it
                return self._finish(pipe, cand, cand.work_id if cand.activation else None, [])
            # a readmission (workers.stages.handoffs) is decided as an extracted candidate, and finishes its work item
            work = cand.work_id if is_readmission(cand) else None
            if cand.activation and work is None:  # a promoted pending fact
                if fact.status == "pending" and await self.memory.schema_status(tenant, fact.schema_id) != "stable":
                    # a document version took its schema below τ since the promotion was sent: it waits again
                    self.memory.stage_pend(pipe, tenant, fact.schema_id, [fid])
                    return self._finish(pipe, cand, cand.work_id, [])
                outbox = await self._admit(pipe, cand, fact) if fact.status == "pending" else []
                return self._finish(pipe, cand, cand.work_id, outbox)
            if not await current_passage(self.memory, pipe, tenant, cand.passage_id, cand.incarnation):
                if fact.status == "new" and not fact.passage_ids:
                    # extracted, never decided, and its passage left memory first: as in a fresh
                    # build of the current documents, it is not in memory (nobody was told of it)
                    self.lifecycle.retract(pipe, tenant, fact, 0, "its passage left memory before it was decided")
                return [] if work is None else self._finish(pipe, cand, work, [])  # it supports nothing
            if cand.passage_id in fact.passage_ids and fact.status != "new":
                return self._finish(pipe, cand, work, [])  # the same fact twice in one passage
            if fact.status in ("active", "invalid", "merged"):
                # a known fact gains support: merge the provenance (and re-adjudicate) in the resolver
                return self._finish(pipe, cand, work, [duplicate(cand, fact, "same fact")])
            schema = schema_id(cand.fact.head_type, cand.fact.relation, cand.fact.tail_type)
            ungated = needs_no_tau(cand.fact)  # a constraint, refusal or failure as stated binds when said once
            held = (
                self.settings.schema_filter
                and not ungated
                and await self.memory.hold_pending(tenant, schema, fid, cand.passage_id)
            )
            if held is None:  # a version retired the passage just now: it supports nothing
                return [] if work is None else self._finish(pipe, cand, work, [])
            if held:  # candidate schema: pending — told once, when its first supporting passage holds it there
                told = []
                if fact.status in ("new", "retracted", "pending") and not set(fact.passage_ids) - {cand.passage_id}:
                    fact.status, fact.passage_ids = "pending", [cand.passage_id]
                    told = [
                        Emit.of(
                            event(
                                tenant,
                                "pending",
                                fact,
                                await self.memory.graph_version(tenant),
                                f"its schema is seen in fewer than τ={self.settings.effective_tau} passages",
                            )
                        )
                    ]
                return self._finish(pipe, cand, work, told)
            outbox = await self._promote_pending(pipe, cand)
            return self._finish(
                pipe, cand, work, outbox + await self._admit(pipe, cand, fact, schema_stable=not ungated)
            )

        finishes = (
            Finishes(cand.passage_id, cand.work_id, cand.chunk_fact_count) if cand.activation and cand.work_id else None
        )
        await self.once(tenant, detection_mark(cand, fid), decide, finishes)

    def _finish(self, pipe, cand: CandidateFact, finished_work: str | None, outbox: list[Emit]) -> list[Emit]:
        """Chunk progress: the work this message spawned is outstanding; its own fact (or its
        own work item) is done."""
        self.memory.stage_spawn(pipe, cand.tenant, cand.passage_id, spawned_work_ids(outbox))
        if finished_work is None:
            self.memory.stage_fact_done(pipe, cand.tenant, cand.passage_id, cand.fact_index, cand.chunk_fact_count)
        else:
            self.memory.stage_work_done(pipe, cand.tenant, cand.passage_id, finished_work, cand.chunk_fact_count)
        return outbox

    async def _promote_pending(self, pipe, cand: CandidateFact) -> list[Emit]:
        """The schema is stable: every fact parked under it goes back onto candidate-facts
        (keyed by its own head) to be activated."""
        schema = schema_id(cand.fact.head_type, cand.fact.relation, cand.fact.tail_type)
        parked = await self.memory.pending_facts(cand.tenant, schema)
        if not parked:
            return []
        self.memory.stage_unpend(pipe, cand.tenant, schema, parked)
        outbox = []
        for pid, fact in zip(parked, await self.memory.facts(cand.tenant, parked)):
            if fact is None or fact.status != "pending":
                continue
            promoted = CandidateFact(
                tenant=cand.tenant,
                passage_id=cand.passage_id,
                doc_id=cand.doc_id,
                fact=fact.triple(),
                fact_index=cand.fact_index,
                chunk_fact_count=cand.chunk_fact_count,
                head_id=fact.head_id,
                tail_id=fact.tail_id,
                extractor="promotion",
                activation=True,
                work_id=activation_work_id(pid),
                incarnation=cand.incarnation,
            )
            outbox.append(Emit.of(promoted))  # keyed by candidate_key(fact.head_id, fact.relation, fact.tail_id)
        return outbox

    async def _admit(self, pipe, cand: CandidateFact, fact: Fact, schema_stable: bool = True) -> list[Emit]:
        """A fact passed the τ gate (or needs none, `schema_stable` False: its schema may still be a
        candidate): detect conflicts, then activate it or hand it to A_res."""
        tenant, relation, fid = cand.tenant, fact.relation, fact.id
        version = None  # the graph version of this fact's edges: one bump for its type and fact edges
        if self.settings.type_bridging and schema_stable:  # its entities join their types
            version = await self.memory.bump_graph_version(tenant)
            for entity_id, entity_type in ((fact.head_id, fact.head_type), (fact.tail_id, fact.tail_type)):
                if entity_type not in VALUE_TYPES:  # a value joins no type: no node a walk passes through
                    self.memory.stage_type_member(pipe, tenant, version, entity_node(entity_id), entity_type)
        # a promotion adds no passage (its passage is the promoting chunk's); a readmission its own
        support = None if is_promotion(cand) else cand.passage_id
        if support:
            self.memory.stage_fact_passage(pipe, tenant, fid, support)
            self.memory.stage_fact_said(pipe, tenant, fid, cand.doc_id, time.time())  # kept if said before
            fact.passage_ids = sorted(set(fact.passage_ids) | {support})
        if self.settings.conflicts:
            taken_over = []
            twin = await self._active_twin(tenant, fact)
            if twin is not None:
                other, why = twin
                if other.id < fact.id:  # the canonical fact (smaller id) is in memory: merge into it
                    return [duplicate(cand, other, why)]
                # this fact is the canonical one: it takes the twin's place, so the memory ends the
                # same whichever of the two arrived first
                merged = self.lifecycle.merge(
                    pipe,
                    tenant,
                    fact,
                    set(other.passage_ids),
                    await self.memory.bump_graph_version(tenant),
                    why,
                    source=other,
                )
                taken_over = [Emit.of(merged)] if merged else []
                if await self.memory.group_size(tenant, other.head_id, other.relation) >= 2:  # its group lost a member
                    taken_over.append(
                        adjudication(
                            cand,
                            other.head_id,
                            other.relation,
                            f"{other.id} merged into {fact.id}",
                            f"merged-{other.id}",
                        )
                    )
            if fact.category in UNCONTESTED_CATEGORIES:  # one rejection or failure among many: no group
                return taken_over + await self._activate(pipe, cand, fact, version)
            joined = await self.memory.join_group(
                tenant, fact.head_id, relation, fact.tail_id, fid, detection_mark(cand, fid), MULTI_RULE
            )
            outbox = []
            if joined.flipped:
                # the relation's cardinality flipped: every group with several tails is decided again
                for head in await self.memory.relation_multi_heads(tenant, relation):
                    if head != fact.head_id:
                        outbox.append(
                            adjudication(
                                cand,
                                head,
                                relation,
                                f"relation '{relation}' is now {joined.verdict}-valued",
                                "cardinality",
                            )
                        )
            outbox = taken_over + outbox
            if joined.size >= 2 and joined.verdict == "single":
                return outbox + [
                    adjudication(
                        cand,
                        fact.head_id,
                        relation,
                        f"single-valued relation '{relation}' with {joined.size} tails",
                        "group",
                    )
                ]
            return outbox + await self._activate(pipe, cand, fact, version)
        return await self._activate(pipe, cand, fact, version)

    async def _active_twin(self, tenant: str, fact: Fact) -> tuple[Fact, str] | None:
        """An active fact that is this one said otherwise — head and tail swapped under a
        symmetric relation, or a near-duplicate — and why."""
        if fact.relation in SYMMETRIC_RELATIONS:
            swapped = await self.memory.fact(tenant, fact_id(fact.tail_id, fact.relation, fact.head_id))
            if swapped and swapped.status == "active":
                return swapped, f"symmetric relation '{fact.relation}' with head and tail swapped"
        near = await self._near_duplicate(tenant, fact)
        if near:
            other = await self.memory.fact(tenant, near.id)
            if other and other.status == "active":
                return other, f"near-duplicate of {near.id} (cosine {near.score:.3f} > δ {self.settings.delta})"
        return None

    async def _near_duplicate(self, tenant: str, fact: Fact) -> Hit | None:
        """An active fact that says the same thing in other words: the same head and tail
        entities (after normalisation and aliases) with a relation whose fact embedding is
        within δ ("born in" / "native of"). Similarity only proposes: facts of different
        entities are never the same fact, whatever their cosine ("Bayezid I" / "Bayezid II",
        "1998" / "1999" — 56 of 63 similarity-only merges on a Wikipedia corpus were such)."""
        vector = await self.memory.fact_vector(tenant, fact.id)
        if vector is None:
            return None
        same_entities = {"status": "active", "head_id": fact.head_id, "tail_id": fact.tail_id}
        near = await self.memory.knn(
            tenant, "facts", vector, 4, ["head_id", "tail_id", "relation"], same_entities, ensure_index=True
        )
        for hit in near:
            if (
                hit.id != fact.id
                and hit.score > self.settings.delta
                and (hit.fields["head_id"], hit.fields["tail_id"]) == (fact.head_id, fact.tail_id)
            ):
                return hit
        return None

    async def _activate(self, pipe, cand: CandidateFact, fact: Fact, version: int | None = None) -> list[Emit]:
        if version is None:
            version = await self.memory.bump_graph_version(cand.tenant)
        activated = self.lifecycle.activate(pipe, cand.tenant, fact, version)
        return [Emit.of(activated)] + await containment_changed(self.settings, self.memory, cand, fact)
