"""What one stage hands another: the work the resolver is sent (a duplicate to merge, a group to
decide again; a client's retraction is workers.publisher's) with the probes and work ids that
make its done marks (the texts an extraction embeds are workers.derived's). Topics and partition keys are the stage
graph's (topics.graph, through Emit.of). Stages import this module, never each other
(tests/test_import_graph.py)."""

from __future__ import annotations

from dataclasses import replace

from store.base import MemoryStore
from store.facts import Fact
from topics import CandidateFact, ConflictSet
from workers.algorithms.policy import CONTAINMENT_RELATIONS
from workers.envelope import Emit
from workers.publisher import fact_probe
from workers.settings import Settings


def duplicate(cand: CandidateFact, target: Fact, reason: str) -> Emit:
    """Work for the resolver: merge the candidate into `target`, the fact it repeats."""
    # keyed by the target's head: the resolver decides the target's group, and one head's
    # groups are decided on one partition (a symmetric twin's head is the candidate's tail) —
    # a key the record does not hold, so it is named here (topics.graph.conflict_key)
    work = f"res:duplicate:{target.id}:{cand.passage_mark}:{cand.fact_index}:{int(cand.activation)}"
    record = ConflictSet(
        tenant=cand.tenant,
        kind="duplicate",
        candidate=cand,
        fact_id=target.id,
        conflicting=[target.id],
        passage_ids=[cand.passage_id],
        work_id=work,
        reason=reason,
    )
    return Emit.of(record, key=target.head_id)


READMISSION = "readmission"  # the extractor field of a readmitted candidate (`readmission`)


def readmission(cand: CandidateFact) -> Emit:
    """Work for the detector: decide `cand` again as if it came now — the resolver found the fact
    it was to merge into out of memory (an edit retired that fact's passages while the merge was
    on its way), where a fresh build of the current documents admits the candidate itself. An
    activation (a chunk-progress work item, the detector's `act:` mark) marked as a readmission."""
    return Emit.of(
        replace(
            cand,
            activation=True,
            extractor=READMISSION,
            work_id=f"readmit:{cand.passage_mark}:{cand.fact_index}",
        )
    )


def is_readmission(cand: CandidateFact) -> bool:
    return cand.activation and cand.extractor == READMISSION


def is_promotion(cand: CandidateFact) -> bool:
    """A pending fact's activation, sent when its schema became stable: its passage is the
    promoting chunk's, which need not say the fact (a readmission's is its own)."""
    return cand.activation and cand.extractor != READMISSION


def adjudication(cand: CandidateFact, head_id: str, relation: str, reason: str, cause: str) -> Emit:
    """Work for the resolver: decide the group (head_id, relation) again, because of `cand`."""
    # the cause keeps work ids apart when one fact triggers a group for several reasons
    work = f"adj:{cause}:{head_id}|{relation}:{cand.passage_mark}:{cand.fact_index}:{int(cand.activation)}"
    probe = replace(cand, head_id=head_id, fact=replace(cand.fact, relation=relation))
    record = ConflictSet(
        tenant=cand.tenant,
        kind="adjudicate",
        candidate=probe,
        fact_id="",
        conflicting=[],
        passage_ids=[cand.passage_id],
        work_id=work,
        reason=reason,
    )
    return Emit.of(record)  # keyed by the group's head: the probe's head_id


async def regroup(
    settings: Settings, memory: MemoryStore, tenant: str, fact: Fact, why: str, reason: str, cause: str
) -> list[Emit]:
    """The adjudication of the fact's (head, relation) group, when conflicts are decided and the
    group has another member (a fact that left memory may have excluded it; one that lost
    support may lose its group), probed at the fact (fact_probe, `why`); else nothing."""
    if settings.conflicts and await memory.group_size(tenant, fact.head_id, fact.relation) >= 2:
        return [adjudication(fact_probe(tenant, fact, why), fact.head_id, fact.relation, reason, cause)]
    return []


async def containment_changed(settings: Settings, memory: MemoryStore, cand: CandidateFact, fact: Fact) -> list[Emit]:
    """A new containment fact (X located in Y) can turn a mutual exclusion between tails X
    and Y into a granularity qualification: decide the groups with those tails again."""
    if not settings.conflicts or fact.relation not in CONTAINMENT_RELATIONS:
        return []
    outbox, seen = [], set()
    for entity in (fact.head_id, fact.tail_id):
        for other in await memory.facts(cand.tenant, await memory.facts_with_tail(cand.tenant, entity)):
            group = (other.head_id, other.relation) if other else None
            if group and group not in seen and await memory.group_size(cand.tenant, *group) >= 2:
                seen.add(group)
                outbox.append(
                    adjudication(
                        cand,
                        *group,
                        f"containment {fact.head_id} {fact.relation} {fact.tail_id} is active",
                        f"containment-{fact.head_id}",
                    )
                )
    return outbox
