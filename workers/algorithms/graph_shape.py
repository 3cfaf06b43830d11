"""The shape of a tenant's graph (pure): how many entities a passage holds, how many passages a
walk can leave through an entity that is not a hub, and how many entities are junk — what
decides whether a walk over the graph can find anything the first stage did not
(`memstream bench shape`; docs/benchmarks.md "The graph's shape").

It reads what the export gives (ops.export: each entity's name, each passage edge), so any
tree's memory can be measured by this one definition."""

from __future__ import annotations

import re
from collections import Counter
from dataclasses import asdict, dataclass
from typing import Iterable, Mapping

# an entity in more than this share of a tenant's passages is a hub (a conversation's speaker,
# a word on every page): a walk through it reaches everything, so it joins nothing
HUB_SHARE = 0.05
# ... and never one in fewer passages than this (a small tenant's shared names are no hubs)
HUB_MIN_PASSAGES = 10

# what a walk should never pass through: a value read as a name ("3", "000", "EUR" from
# "3,000 EUR", an ordinal), a pronoun, a word of conversation ("Wow", "Thanks")
_VALUE = re.compile(r"^(?:[\d.,:/%$€£+-]+|EUR|USD|GBP|CHF|\d+(?:st|nd|rd|th|s)?)$", re.IGNORECASE)
_PRONOUNS = frozenset(
    "i me my mine you your yours he him his she her hers it its it's we us our ours they them their theirs "
    "this that these those there here who whom whose which what someone something everyone everything".split()
)
_DISCOURSE = frozenset(
    "yes no yeah yep nope ok okay oh ah wow hey hi hello bye thanks thank sure well so also however "
    "but and or then now great cool awesome nice really actually anyway sorry please congrats "
    "congratulations haha lol omg good glad".split()
)


def junk_kind(name: str) -> str | None:
    """'value', 'pronoun' or 'discourse' for a name a walk should not pass through; None for a
    name (what a name is made of beyond that is the extractor's business)."""
    text = name.strip()
    if _VALUE.match(text):
        return "value"
    if len(text) > 1 and text.isupper():  # an acronym ("US", "IT"), not a pronoun
        return None
    words = text.lower().replace("\u2019", "'").split()
    if not words:
        return "value"
    if all(w in _PRONOUNS for w in words):
        return "pronoun"
    if all(w.strip("!?.,") in _DISCOURSE for w in words):
        return "discourse"
    return None


@dataclass(frozen=True)
class GraphShape:
    passages: int
    entities: int  # every entity record, joined to a passage or not
    walked: int  # the entities joined to a passage: the walk's nodes (a value-typed one is not)
    entities_per_passage: float  # distinct entities joined to a passage, over all passages
    passages_without_entity: float  # share
    hubs: int  # entities in more than max(HUB_MIN_PASSAGES, HUB_SHARE of the passages)
    joined: float  # share of passages sharing a non-hub entity with another passage
    junk: float  # share of the walked entities whose name is a value, a pronoun or a discourse word
    junk_by_kind: dict[str, int]
    junk_examples: list[str]  # the most frequent junk names

    def to_json(self) -> dict:
        return asdict(self)


def _share(part: int, whole: int) -> float:
    return round(part / whole, 4) if whole else 0.0


def joins_of(
    passage_ids: Iterable[str], passage_edges: Iterable[tuple[str, str]]
) -> tuple[dict[str, set[str]], Counter[str], set[str]]:
    """One tenant's (entity id, passage id) joins as the entities each passage holds, each
    entity's degree (its passages) and its hubs."""
    holds: dict[str, set[str]] = {p: set() for p in passage_ids}
    for entity, passage in passage_edges:
        holds.setdefault(passage, set()).add(entity)
    degree: Counter[str] = Counter(e for held in holds.values() for e in held)
    hub_above = max(HUB_MIN_PASSAGES, HUB_SHARE * len(holds))
    return holds, degree, {e for e, d in degree.items() if d > hub_above}


def graph_shape(
    passages: Iterable[str], entity_names: Mapping[str, str], passage_edges: Iterable[tuple[str, str]]
) -> GraphShape:
    """The shape of one tenant: `passages` its passage ids, `entity_names` each entity id's name,
    `passage_edges` its (entity id, passage id) joins."""
    return pooled([(passages, entity_names, passage_edges)])


def pooled(tenants: Iterable[tuple[Iterable[str], Mapping[str, str], Iterable[tuple[str, str]]]]) -> GraphShape:
    """The shape of several tenants taken together (a dev set of conversations, a tenant each):
    hubs and joins are each tenant's own, shares are over all their passages and entities."""
    n_passages = n_entities = n_walked = n_hubs = n_joined = n_empty = joins = 0
    junk: Counter[str] = Counter()
    junk_names: Counter[str] = Counter()
    for passage_ids, names, edges in tenants:
        holds, degree, hubs = joins_of(passage_ids, edges)
        n_passages += len(holds)
        n_entities += len(names)
        n_walked += len(degree)
        n_hubs += len(hubs)
        joins += sum(len(held) for held in holds.values())
        n_empty += sum(1 for held in holds.values() if not held)
        n_joined += sum(1 for held in holds.values() if any(degree[e] >= 2 and e not in hubs for e in held))
        for entity in degree:
            kind = junk_kind(names.get(entity) or "")
            if kind:
                junk[kind] += 1
                junk_names[(names.get(entity) or "").strip()] += degree[entity]
    return GraphShape(
        passages=n_passages,
        entities=n_entities,
        walked=n_walked,
        entities_per_passage=round(joins / n_passages, 2) if n_passages else 0.0,
        passages_without_entity=_share(n_empty, n_passages),
        hubs=n_hubs,
        joined=_share(n_joined, n_passages),
        junk=_share(sum(junk.values()), n_walked),
        junk_by_kind=dict(sorted(junk.items())),
        junk_examples=[name for name, _ in junk_names.most_common(8)],
    )
