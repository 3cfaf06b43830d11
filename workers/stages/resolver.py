"""A_res: a conflict set → the (head, relation) group decided again, or a duplicate merged into
the fact it repeats; fact events on `indexed-facts`, and further groups to decide on
`conflict-sets`.

Its input, the conflict sets other stages send it, is built in workers.stages.handoffs (`duplicate`,
`adjudication`, `containment_changed`) and, for a client's retraction, workers.publisher
(`retraction`); their work ids give its done marks here.
"""

from __future__ import annotations

import asyncio
import logging
import time

from store.facts import Fact
from topics import CandidateFact, ConflictSet
from workers import metrics
from workers.algorithms.expiry import world_time
from workers.algorithms.normalize import fact_id, short_hash
from workers.algorithms.policy import CONTAINMENT_RELATIONS, Decision, GroupFact, adjudicate, is_multi_valued
from workers.envelope import Emit, Finishes, PermanentError, spawned_work_ids
from workers.models.llm import LLMError, MalformedOutput
from workers.models.protocols import ChatModel
from workers.models.resolution import RESOLUTION_SCHEMA, parse_resolution, resolution_messages, unquoted_evidence
from workers.stages.context import Stage, StageContext, current_passage
from workers.stages.handoffs import containment_changed, is_promotion, readmission, regroup

log = logging.getLogger(__name__)


def resolution_mark(conflict: ConflictSet) -> str:
    """Done mark: a hash of the conflict set's work id (a set without one: its candidate's
    fact). Hashed: a group's work id names its head entity, and an erasure leaves no key that
    names an entity it erased (workers.stages.erasure); a mark outlives its message by days."""
    if conflict.work_id:
        return f"work:{short_hash(conflict.work_id, size=32)}"
    return f"res:{conflict.candidate.passage_mark}:{conflict.candidate.fact_index}"


def superseded_at(fact: Fact, winner: Fact | None) -> str:
    """The event time an excluded fact stops holding at: where the fact that excluded it begins,
    when that is after its own beginning ("Ana lives in Paris" said in May, "Ana lives in
    Berlin" in June: Paris holds until June); '' when unknown."""
    if winner is None:
        return ""
    start, until = world_time(fact.event_start), world_time(winner.event_start)
    return winner.event_start if until is not None and (start is None or start < until) else ""


class ResolverStage(Stage):
    def __init__(self, context: StageContext):
        super().__init__(context)
        self.resolver_llm = context.resolver_llm  # None: the deterministic evidence policy

    async def handle(self, conflict: ConflictSet) -> None:
        cand, tenant = conflict.candidate, conflict.tenant

        if conflict.kind == "retract":  # a caller's request: no chunk waits for it
            return await self.once(tenant, resolution_mark(conflict), lambda pipe: self._retract(pipe, conflict))

        async def decide(pipe) -> list[Emit]:
            if conflict.kind == "duplicate":
                outbox = await self._merge(pipe, conflict)
            else:
                outbox = await self._adjudicate(pipe, cand, cand.head_id, cand.fact.relation, conflict.reason)
            self.memory.stage_spawn(pipe, tenant, cand.passage_id, spawned_work_ids(outbox))
            self.memory.stage_work_done(pipe, tenant, cand.passage_id, conflict.work_id, cand.chunk_fact_count)
            return outbox

        finishes = Finishes(cand.passage_id, conflict.work_id, cand.chunk_fact_count) if conflict.work_id else None
        await self.once(tenant, resolution_mark(conflict), decide, finishes)

    async def _merge(self, pipe, conflict: ConflictSet) -> list[Emit]:
        cand, tenant, target_id = conflict.candidate, conflict.tenant, conflict.fact_id
        target = await self.memory.fact(tenant, target_id)
        while target is not None and target.status == "merged":  # follow it to the surviving fact
            target = await self.memory.fact(tenant, target.merged_into)
        if target is None:
            raise PermanentError(f"conflict set names fact {conflict.fact_id}, which is not in memory")
        source_id = fact_id(cand.head_id, cand.fact.relation, cand.tail_id)
        source = None if source_id == target.id else await self.memory.fact(tenant, source_id)
        # a promotion's passage_id is the promoting chunk (a readmission's is its own); a passage a
        # version retired supports nothing
        own = (
            set()
            if is_promotion(cand)
            or not await current_passage(self.memory, pipe, tenant, cand.passage_id, cand.incarnation)
            else {cand.passage_id}
        )
        if target.status in ("retracted", "expired") and own:
            # it left memory while this duplicate was on its way (an edit retired its passages):
            # the candidate is decided as if it came now, as a fresh build admits it
            return [readmission(cand)]
        if own:  # the document says it too (kept if it said it before: workers.algorithms.policy.rank_key)
            self.memory.stage_fact_said(pipe, tenant, target.id, cand.doc_id, time.time())
        gained = (own | set(source.passage_ids if source else ())) - set(target.passage_ids)
        merged = self.lifecycle.merge(
            pipe, tenant, target, gained, await self.memory.graph_version(tenant), conflict.reason, source
        )
        if merged is None:
            return []
        outbox = [Emit.of(merged)]
        # more support can change how the target's group is decided
        if self.settings.conflicts and await self.memory.group_size(tenant, target.head_id, target.relation) >= 2:
            outbox += await self._adjudicate(
                pipe, cand, target.head_id, target.relation, f"{target.id} gained support", extra={target.id: gained}
            )
        return outbox

    async def _retract(self, pipe, conflict: ConflictSet) -> list[Emit]:
        """Out of memory as asked: status retracted (a `retracted` event when subscribers knew
        it), out of retrieval and standing facts, its support set aside so no decision of its
        group brings it back; a passage that says it again later brings it back. A merged fact
        is retracted where it went (the fact holding it)."""
        tenant = conflict.tenant
        fact = await self.memory.fact(tenant, conflict.fact_id)
        while fact is not None and fact.status == "merged":
            fact = await self.memory.fact(tenant, fact.merged_into)
        if fact is None:
            raise PermanentError(f"retract: no fact {conflict.fact_id!r} in tenant {tenant!r}")
        if fact.status == "retracted" and not fact.passage_ids:
            return []
        was, said_by = fact.status, list(fact.passage_ids)
        if was == "pending":
            self.memory.stage_unpend(pipe, tenant, fact.schema_id, [fact.id])
        self.memory.stage_unsupport(pipe, tenant, fact.id, said_by)
        retracted = self.lifecycle.retract(
            pipe,
            tenant,
            fact,
            await self.memory.bump_graph_version(tenant),
            f"retracted on request: {conflict.reason}" if conflict.reason else "retracted on request",
        )
        outbox = [Emit.of(retracted)] if was in ("active", "invalid") else []
        if was == "active":  # a fact it excluded may hold now
            outbox += await regroup(
                self.settings,
                self.memory,
                tenant,
                fact,
                "request",
                f"{fact.id} retracted on request",
                f"{conflict.work_id}-group",
            )
        return outbox

    async def prefetch(self, conflict: ConflictSet) -> None:
        """Read-ahead (workers/app.py): ask the LLM what `handle` will ask it about this
        adjudication, from memory as it is now, so the answer waits in the LLM cache (if a
        message before it changes the group, handle asks again). A duplicate's question
        depends on the merge handle stages first: not read ahead."""
        if self.resolver_llm is None or conflict.kind in ("duplicate", "retract"):
            return
        tenant, cand = conflict.tenant, conflict.candidate
        facts = await self._members(tenant, cand.head_id, cand.fact.relation)
        if not facts or not await self._weighs_evidence(tenant, cand.fact.relation, facts):
            return
        group = [await self._group_fact(tenant, fid, f) for fid, f in facts.items()]
        await self.resolver_llm.structured("resolve", *await self._resolution_request(tenant, group, facts))

    async def _members(self, tenant: str, head_id: str, relation: str) -> dict[str, Fact]:
        """The group's facts that take part in its decision: a lapsed fact does not (the expiry
        sweep expires it, then decides the group again), nor a merged one, nor a pending one of a
        schema that is not stable (parked behind the τ gate: a version took its schema below τ),
        nor one retracted that no current passage supports (workers.stages.chunker; one a
        passage says again is back)."""
        members = await self.memory.group(tenant, head_id, relation)
        facts = {
            fid: f
            for fid, f in zip(members, await self.memory.facts(tenant, members))
            if f and f.status != "merged" and not (f.status == "retracted" and not f.passage_ids) and not f.lapsed()
        }
        for fid, fact in list(
            facts.items()
        ):  # pending: being promoted (its schema stable), else parked behind the gate
            if fact.status == "pending" and await self.memory.schema_status(tenant, fact.schema_id) != "stable":
                del facts[fid]
        return facts

    async def _weighs_evidence(self, tenant: str, relation: str, facts: dict) -> bool:
        """False when the group is decided without reading any evidence (one fact, or a multi-valued relation)."""
        heads, multi = await self.memory.relation_counts(tenant, relation)
        return not is_multi_valued(heads, multi) and len(facts) >= 2

    async def _adjudicate(
        self, pipe, cand: CandidateFact, head_id: str, relation: str, why: str, extra: dict | None = None
    ) -> list[Emit]:
        """Decide a (head, relation) group from its content and apply the difference."""
        tenant = cand.tenant
        facts = await self._members(tenant, head_id, relation)
        if not facts:
            return []
        for fact in facts.values():  # the decision rests on every member's status, not only the ones it changes
            self.memory.expect_status(pipe, tenant, fact.id, fact.status)
        for fid, pids in (extra or {}).items():  # support staged in this transaction, not yet visible
            if fid in facts:
                facts[fid].passage_ids = sorted(set(facts[fid].passage_ids) | pids)
        if not await self._weighs_evidence(tenant, relation, facts):
            reason = "multi-valued relation" if len(facts) > 1 else "no conflict"
            decisions = {fid: Decision(status="active", kind="", reason=reason) for fid in facts}
            return await self._apply(pipe, cand, facts, decisions, why)
        group = [await self._group_fact(tenant, fid, f) for fid, f in facts.items()]
        if self.resolver_llm is not None:
            decisions = await self._llm_decisions(self.resolver_llm, tenant, group, facts)
        else:
            decisions = await self._rules_decisions(tenant, group)
        return await self._apply(pipe, cand, facts, decisions, why)

    async def _rules_decisions(self, tenant: str, group: list[GroupFact]) -> dict:
        tails = {g.tail_id for g in group}
        contains = {
            (a, b): await self.memory.broader(tenant, a, b, CONTAINMENT_RELATIONS)
            for a in tails
            for b in tails
            if a != b
        }
        return adjudicate(group, lambda a, b: contains.get((a, b), False))

    async def _llm_decisions(self, llm: ChatModel, tenant: str, group: list[GroupFact], facts: dict) -> dict:
        """The LLM reads every fact's evidence passages and names an action per fact. If it
        keeps failing, or quotes an evidence sentence that is not in the passage it cites, the
        deterministic policy decides the whole group (logged; the latter counted), so no group
        stays open and no planted passage decides through a quote it does not contain."""
        try:
            decisions, unquoted = await llm.structured("resolve", *await self._resolution_request(tenant, group, facts))
        except (MalformedOutput, LLMError) as exc:
            log.error("resolve: LLM resolver failed (%s); the evidence policy decides this group", exc)
            return await self._rules_decisions(tenant, group)
        if unquoted:
            metrics.UNGROUNDED_EVIDENCE.inc()
            log.warning(
                "resolve: the LLM's evidence for fact(s) %s is not in the passage it cites; the evidence policy decides this group",
                ", ".join(unquoted),
            )
            return await self._rules_decisions(tenant, group)
        return decisions

    async def _resolution_request(self, tenant: str, group: list[GroupFact], facts: dict) -> tuple:
        """The arguments of the resolver's structured LLM call after the stage name: messages,
        schema name, schema, validate (→ decisions, the facts whose evidence is unquoted)."""
        passage_ids = sorted({pid for g in group for pid in g.passage_ids})
        passages = {p["id"]: p["text"] for p in await self.memory.passages(tenant, passage_ids) if p}
        some = facts[group[0].id]
        messages = resolution_messages(
            some.head,
            some.relation,
            [(g, facts[g.id].text or f"{facts[g.id].head} {facts[g.id].relation} {facts[g.id].tail}") for g in group],
            passages,
        )

        def validate(data):
            return parse_resolution(data, group, passages), unquoted_evidence(data, passages)

        return messages, "resolution", RESOLUTION_SCHEMA, validate

    async def _group_fact(self, tenant: str, fid: str, fact: Fact) -> GroupFact:
        """The fact as the policy weighs it: its support, and when a document that still says it
        (one of its current passages') first said it — the fact's first extraction where no
        document's time is recorded (a fact merged in from a twin)."""
        rows, (said,) = await asyncio.gather(
            self.memory.passages(tenant, fact.passage_ids), self.memory.facts_said(tenant, [fid])
        )
        times = [said[row["doc_id"]] for row in rows if row and row["doc_id"] in said]
        return GroupFact(
            id=fid,
            tail_id=fact.tail_id,
            support=len(fact.passage_ids),
            said_at=min(times, default=fact.created_at or 0.0),
            valid_from=fact.valid_from,
            valid_to=fact.valid_to,
            passage_ids=tuple(fact.passage_ids),
        )

    async def _apply(self, pipe, cand: CandidateFact, facts: dict[str, Fact], decisions: dict, why: str) -> list[Emit]:
        """Stage the transitions that take each fact of a group to its decision."""
        tenant, outbox, version = cand.tenant, [], None
        for fid in sorted(decisions):
            fact, decision = facts[fid], decisions[fid]
            if fact.status == decision.status and fact.qualifiers == decision.qualifiers:
                continue
            version = version or await self.memory.bump_graph_version(tenant)
            metrics.CONFLICT_DECISIONS.labels(kind=decision.kind or "none", status=decision.status).inc()
            reason, told = f"{decision.reason}; {why}", f"{decision.kind or 'no conflict'}: {decision.reason}"
            if decision.status == "active":
                was_active, old_qualifiers = fact.status == "active", fact.qualifiers
                if not was_active:
                    outbox.append(
                        Emit.of(
                            self.lifecycle.activate(
                                pipe, tenant, fact, version, decision.qualifiers, reason, decision.evidence, told
                            )
                        )
                    )
                    outbox += await containment_changed(self.settings, self.memory, cand, fact)
                if decision.qualifiers != old_qualifiers:
                    outbox.append(
                        Emit.of(
                            self.lifecycle.qualify(
                                pipe, tenant, fact, version, decision.qualifiers, reason, decision.evidence, told
                            )
                        )
                    )
            elif decision.status == "invalid" and fact.status != "invalid":
                ends_at = superseded_at(fact, facts.get(decision.excluded_by))
                outbox.append(
                    Emit.of(
                        self.lifecycle.invalidate(
                            pipe, tenant, fact, version, decision.qualifiers, reason, decision.evidence, told, ends_at
                        )
                    )
                )
            else:
                self.lifecycle.requalify_silently(pipe, tenant, fact, decision.qualifiers, reason)
        return outbox
