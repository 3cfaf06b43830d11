"""Memory-guided retrieval (pure: no I/O). docs/architecture.md §5 steps 1–3: keep the retrieved schemas and
facts above τ_q, build the structure-aware reset vector, run PPR over the cached graph and rank
passages. The query worker fetches the layers and keeps the graph; everything here is math on
what it hands over, so the benchmark and the tests run the very same code.

One departure from docs/architecture.md §5, measured: every similarity becomes a seed weight through
exp((sim − best) / T) before the DESIGN terms apply, and passages weigh α = 2 instead of 0.05.
With raw all-MiniLM-L6-v2 cosines a fact at 0.5 seeds almost as heavily as a passage at 0.65,
and PPR ranked below dense on MuSiQue (R@2 41.7 vs 47.2); calibrated, 48.6 / 70.5 vs 47.2 / 62.2.
`temperature=0, alpha=0.05` gives DESIGN's raw form back."""

from __future__ import annotations

import math
from collections import defaultdict
from dataclasses import dataclass, field, fields
from typing import Sequence

import numpy as np

from store.nodes import node_id, type_node
from topics import BadInput
from topics.contract import quoted, quoted_names
from workers.algorithms.ppr import SparseGraph

BOOSTED_CATEGORIES = ("HARD_CONSTRAINT", "REJECTED_OPTION")


@dataclass(frozen=True)
class Range:
    low: float
    high: float
    low_open: bool = False  # the low end itself excluded

    def __contains__(self, value) -> bool:  # False for NaN
        return (self.low < value if self.low_open else self.low <= value) and value <= self.high

    def __str__(self) -> str:
        return f"{'(' if self.low_open else '['}{self.low:g}, {self.high:g}]"


# What a request may set. Each range bounds one request's work — layer_k the KNN sizes, damping
# and tolerance the PPR passes (about 65 at damping 0.95 and tolerance 1e-9, against ~20,000 at
# 0.999999 and 1e-12) — or keeps the reset vector finite and non-negative.
PARAM_RANGES = {
    "layer_k": Range(1, 200),
    "tau_q": Range(-1.0, 1.0),
    "alpha": Range(0.0, 1000.0),
    "temperature": Range(0.0, 100.0),
    "damping": Range(0.0, 0.95, low_open=True),
    "tolerance": Range(1e-9, 1e-2),
    "constraint_boost": Range(0.0, 100.0),
    "first_stage_k": Range(1, 200),
    "rrf_k": Range(0.0, 1000.0),
    "turn_dense_weight": Range(0.0, 100.0),
    "walk_weight": Range(0.0, 100.0),
    "link_weight": Range(0.0, 100.0),
    "turn_link_weight": Range(0.0, 100.0),
    "turn_walk_weight": Range(0.0, 100.0),
    "read_weight": Range(0.0, 100.0),
    "first_kept": Range(0, 50),
    "turn_first_kept": Range(0, 50),
    "named_pages": Range(0, 10),
    "linked_pages": Range(0, 10),
    "bridge_passages": Range(0, 10),
    "episode_weight": Range(0.0, 100.0),
    "time_weight": Range(0.0, 100.0),
}


@dataclass(frozen=True)
class RetrievalParams:
    """Every default is the one the recall benchmark measured; each mechanism can be switched off."""

    layer_k: int = 5  # top-K per memory layer (schemas, facts, passages)
    tau_q: float = 0.4  # query similarity a schema or fact needs to seed
    # passage seed weight relative to entity seeds (the facts'). Swept 1–1000 on the three dev
    # sets (docs/benchmarks.md): past 2, within one or two evidence passages of 200 either way
    alpha: float = 2.0
    temperature: float = 0.05  # similarity → seed weight: exp((sim − best sim) / T); 0 uses raw similarities
    damping: float = 0.5  # λ: probability of following an edge
    tolerance: float = 1e-6  # guaranteed L1 error of the PPR vector
    constraint_boost: float = 1.35
    hub_suppression: bool = True  # type seeds × 1/log(deg + 1)
    information_density: bool = True  # passage seeds × sigmoid(ΣIDF / log(|E_p| + 1))
    schema_seeds: bool = True  # seed types from retrieved schemas
    # The first stage (modes hybrid, ppr, reconstruct): each leg's candidates, fused by
    # reciprocal rank with this constant (fuse()). Measured with all-MiniLM-L6-v2 on three dev
    # sets, R@5 (LoCoMo dev) / R@2 (MuSiQue-100, HotpotQA-100), legs of 30: rrf_k 1 → 60.2 /
    # 46.4 / 64.5; 5 → 59.1 / 46.3 / 64.5; 60 (the paper's) → 52.4 / 44.2 / 64.5 — a weak leg
    # (dense on conversations, BM25 on MuSiQue) drags a large constant's consensus down, a small
    # one keeps each leg's top. first_stage_k 20–50 changes R@5 by ≤ 0.6.
    first_stage_k: int = 30
    rrf_k: float = 1.0
    # The dense leg's weight in that fusion over conversation turns (the lexical leg's is 1, and the
    # dense leg's over documents), in proportion to the share of turns among the answer's top at
    # equal weights (first_stage_weights). A turn is short and chatty, and its vector a weaker
    # signal than its words (LoCoMo dev R@5: dense 47.3, lexical 69.9); at equal weights each leg's
    # top scores the same and the dense one came first, so hybrid fell below lexical at R@2 and R@5
    # (44.2 / 68.8 against 51.3 / 69.9). At 0.75 the lexical top leads and the legs interleave below
    # it. LoCoMo dev (in memory, R@2 / R@5 / R@10): 1 → hybrid 44.2 / 68.8 / 80.8, ppr 50.5 / 74.5 /
    # 82.5, reconstruct 50.7 / 73.7 / 81.7; 0.95 (ties alone) → 45.3 / 70.0 / 80.5, 50.8 / 75.0 /
    # 83.0, 51.4 / 73.9 / 81.9; 0.75 → 46.2 / 71.2 / 80.6, 53.4 / 74.7 / 82.6, 53.1 / 74.6 / 82.0;
    # 0.6 → 50.7 / 71.7 / 81.2, 54.3 / 73.8 / 82.6, 54.8 / 73.8 / 82.8; 0.5 → 52.1 / 71.9 / 80.3,
    # 55.4 / 73.6 / 82.4, 55.9 / 74.2 / 82.2. Below 0.75 ppr loses at R@5; its multi-hop questions
    # (where a paraphrase finds the evidence) lose at every weight below 1 (R@5 31.8 → 29.6 at
    # 0.75). Documents are not turns: MuSiQue and HotpotQA rank as at 1.
    turn_dense_weight: float = 0.75
    # PPR: the walk's ranking's weight in its fusion with the first stage's (weight 1), by what
    # the first stage's candidates are (walk_weight()): over documents the walk leads, over
    # conversation turns it re-ranks. Measured, R@5 (R@2 / R@5 for the QA sets): MuSiQue-100
    # (replay; hybrid 62.7) 63.2 at 0.25, 68.4 at 1, 69.7 at 4, 70.3 at 8, 69.9 at 16; HotpotQA-100
    # (rules; hybrid 81.5) 83.5 at 0.25, 85.5 at 1, 83.5 at 8; LoCoMo dev, R@5 / R@10 (hybrid
    # 61.1 / 69.9, episodes on) 65.0 / 74.7 at 0.25, 64.6 / 74.0 at 0.5, 63.1 / 71.7 at 1. The
    # entity graph a rules extractor makes of turns (speakers, their first person, common nouns)
    # is weaker than their neighbours in time (episode_weight); a document's entities are its
    # strongest links. Weighting the walk by its seeds' share of the reset mass, or by how rare
    # its seed entities are, did not tell the two apart (LoCoMo fell to 56–63 R@5).
    walk_weight: float = 8.0
    turn_walk_weight: float = 0.25
    # Reconstruct: the weight of its reading order (the passages its walk read, in the order
    # read) in the same fusion, every corpus. Its order is a walk's, not a score: at 8 it fell to
    # R@5 54.8 on MuSiQue-100 and 62.0 on HotpotQA-100 (hybrid 62.7 and 81.5); at 0.25 63.5 and 80.5.
    # With the first stage's top kept in place (first_kept), R@2 / R@5 at 0.25 48.0 / 64.8 and
    # 64.5 / 84.0; at 0.5 46.6 / 65.7 and 62.5 / 85.0; at 1 47.1 / 64.0 and 62.5 / 82.5; at 8
    # 47.1 / 59.4 and 61.0 / 78.0.
    read_weight: float = 0.25
    # ppr and reconstruct: the first stage's top passages the walk's fusion keeps in place
    # (keep_first): `first_kept` over documents, `turn_first_kept` over conversation turns, by
    # the share of the candidates that are turns (kept_first). Over documents the walk and the
    # pages find the second hop at rank 2: keeping two costs ppr R@2 on MuSiQue-100 60.5 → 48.3
    # and on HotpotQA-100 80.5 → 65.5 (bench recall, first_kept_2). Over turns the walk
    # re-ranks (weight 0.25), and where it changed the second passage (44 of LoCoMo dev's 495
    # questions) the first stage's was more often the evidence (kept: ppr R@2 better on 5,
    # worse on 3; reconstruct on 10 and 5). LoCoMo dev R@2 / R@5 / R@10 with one kept:
    # ppr 53.4 / 74.7 / 82.6, reconstruct 53.1 / 74.6 / 82.0, against the first stage with
    # episodes and the time cue alone (no walk) 54.0 / 74.8 / 82.5; with two, ppr
    # 54.0 / 74.7 / 82.6 and reconstruct 54.0 / 74.6 / 82.0 (multi-hop R@2 17.2 → 16.5 in ppr);
    # with three, ppr as with two.
    first_kept: int = 1
    turn_first_kept: int = 2
    # ppr and reconstruct over titled documents (workers.algorithms.subjects): right below the
    # kept top passage (none where first_kept is 0: the pages are that passage's), at most
    # `named_pages` pages whose subject the question names, then at most `linked_pages` pages
    # whose subject the top passage names (its hyperlinks: a bridge question's second hop), each
    # of the mode's first first_stage_k. Measured, R@2 / R@5: HotpotQA-100 rules
    # ppr 64.5 / 86.5 with neither, 73.5 / 90.5 with linked pages alone, 79.5 / 92.0 with both at
    # 2 (linked pages 1 and 3, earlier: 1.0 lower and 1.0 higher at R@5); MuSiQue-100 replay 50.9 /
    # 70.8 with neither, 53.7 / 72.6 with linked pages alone (1: 53.7 / 73.2; 3: 53.7 / 72.1),
    # 57.8 / 74.1 with both. A named page is more often gold than a linked one: it goes first.
    named_pages: int = 2
    linked_pages: int = 2
    # ... then at most this many of the first stage's candidates that share a bridge entity with
    # the top passage (workers.algorithms.subjects.bridge_passages: a second hop whose page is not
    # the name's). R@2 / R@5 with 0, 1, 2: MuSiQue-100 ppr 57.8 / 74.1, 59.9 / 77.2, 59.9 / 77.7;
    # reconstruct 53.7 / 69.2, 56.8 / 72.0 (at 1); HotpotQA-100 ppr 79.5 / 92.0, 79.5 / 92.5,
    # 79.5 / 92.5; reconstruct 79.0 / 91.5, 78.5 / 92.0 (at 1). Over conversation turns (no
    # title; tried without that condition) LoCoMo dev ppr R@5 fell 65.8 → 65.4: titled tops only.
    bridge_passages: int = 1
    # Graph modes: temporal contiguity (episode_smoothing; 0.25 was the largest weight that kept
    # LoCoMo dev's multi-hop questions at or above hybrid); 0 turns it off. With the lexical leg
    # leading over turns (turn_dense_weight 0.75), ppr R@2 / R@5 / R@10 at 0.1, 0.15, 0.2, 0.25:
    # 52.2 / 75.0 / 82.4, 52.7 / 74.9 / 82.8, 53.2 / 74.8 / 82.9, 53.4 / 74.7 / 82.6 — within
    # two questions; multi-hop R@5 31.3, 30.0, 29.3, 29.6 against hybrid's 30.9.
    episode_weight: float = 0.25
    # Graph modes: a turn that meets the question's time cue (workers.algorithms.time_cue)
    # scores × (1 + time_weight); 0 turns it off. Measured on LoCoMo dev, PPR R@5 / R@10 overall
    # and temporal: off 65.0 / 74.7 and 78.3 / 86.1; 0.25 → 65.0 / 75.0 and 78.3 / 86.7; 0.5 →
    # 65.5 / 75.0 and 80.0 / 86.7; 1 → 66.0 / 75.0 and 81.7 / 86.7; 2 → 66.0 / 75.4 and 81.7 /
    # 88.9 (reconstruct at 1: 65.9 / 75.9, off 65.4 / 74.8). No other category moved by more
    # than one question. Passages without a time (documents) are never raised, so MuSiQue and
    # HotpotQA rank as without it.
    time_weight: float = 1.0
    # Seed the entities the query names (linked_weights), each at this weight at idf 1: over
    # documents `link_weight` where `entity_links` is on, over conversation turns
    # `turn_link_weight`, in proportion to the share of the first stage's candidates that are
    # turns (link_weight()), as the walk's own weight. Over documents it costs: R@2 / R@5 on
    # MuSiQue-100 43.3 / 63.5 against 49.8 / 70.3, on HotpotQA-100 60.0 / 79.5 against 64.0 /
    # 83.5 (a question names an entity of each hop, and the named one outweighs the facts the
    # question is near). Over turns, LoCoMo dev ppr R@5 / R@10: before turns were embedded and
    # indexed after the turn before them 65.2 / 74.8 against 65.0 / 74.7 without; since,
    # 71.6 / 80.5 against 71.4 / 79.6 (docs/benchmarks.md).
    entity_links: bool = False
    link_weight: float = 1.0
    turn_link_weight: float = 1.0

    @classmethod
    def from_json(cls, body: dict | None) -> "RetrievalParams":
        """Overrides from a request's "params" object: unknown names, ill-typed values and values
        outside PARAM_RANGES are an error naming the parameter."""
        if not body:
            return cls()
        if not isinstance(body, dict):
            raise BadInput("'params' must be an object")
        known = {f.name: str(f.type) for f in fields(cls)}  # "int", "float", "bool": annotations are postponed
        unknown = sorted(set(body) - set(known))
        if unknown:
            raise BadInput(f"unknown retrieval parameter(s) [{quoted_names(unknown)}]; known: {sorted(known)}")
        values = {}
        for name, value in body.items():
            kind = {"int": int, "float": float, "bool": bool}[known[name]]
            accepted = (bool,) if kind is bool else (int,) if kind is int else (int, float)
            if not isinstance(value, accepted) or kind is not bool and isinstance(value, bool):
                raise BadInput(f"parameter {name!r} must be {kind.__name__}")
            if kind is float:
                try:
                    value = float(value)
                except OverflowError:  # a JSON integer of hundreds of digits
                    raise BadInput(f"parameter {name!r} is out of range; allowed range {PARAM_RANGES[name]}") from None
            if name in PARAM_RANGES and value not in PARAM_RANGES[name]:
                raise BadInput(f"parameter {name!r} is {quoted(value)}; allowed range {PARAM_RANGES[name]}")
            values[name] = value
        return cls(**values)


# the retrieval parameters that turn off what a titled top passage's links join to the query
# (workers.query.links): the benches' ablations
NO_LINKS: dict[str, float | bool] = {"named_pages": 0, "linked_pages": 0, "bridge_passages": 0}


@dataclass(frozen=True)
class FactHit:
    id: str
    head: str  # graph node names (store.nodes.entity_node)
    tail: str
    score: float
    category: str = "DECLARATIVE"


@dataclass(frozen=True)
class SchemaHit:
    id: str
    head_type: str
    tail_type: str
    score: float


@dataclass
class Seeds:
    facts: list[FactHit]  # the facts that seeded entities (above τ_q)
    schemas: list[SchemaHit]
    entities: dict[str, float]  # node → reset weight
    types: dict[str, float]
    passages: dict[str, float]
    reset: np.ndarray = field(repr=False)
    outside: dict[str, float] = field(
        default_factory=dict
    )  # seeded passages with no graph node yet (no entity): isolated in the walk


@dataclass
class PassageStats:
    """What information density needs, maintained by the graph cache from entity–passage edges."""

    entities_of: dict[str, set[str]] = field(default_factory=lambda: defaultdict(set))  # passage node → entity nodes
    passages_of: dict[str, set[str]] = field(default_factory=lambda: defaultdict(set))  # entity node → passage nodes

    def link(self, entity: str, passage: str, present: bool) -> None:
        if present:
            self.entities_of[passage].add(entity)
            self.passages_of[entity].add(passage)
        else:
            self.entities_of[passage].discard(entity)
            self.passages_of[entity].discard(passage)

    def density(self, passage: str, total_passages: int) -> float:
        """sigmoid(Σ_{e∈E_p} IDF(e) / log(|E_p| + 1)); IDF(e) = log(N_pas / df(e)); no entities ⇒ sigmoid(0)."""
        entities = self.entities_of.get(passage) or ()
        if not entities:
            return 0.5
        n = max(total_passages, 1)
        idf = sum(math.log(n / max(len(self.passages_of.get(e, ())), 1)) for e in entities)
        return 1.0 / (1.0 + math.exp(-idf / math.log(len(entities) + 1)))


def linked_weights(stats: PassageStats, total_passages: int, entities: list[str]) -> dict[str, float]:
    """Seed weights of the entities a query names (graph nodes): how rare each is among the
    passages, idf(e) / log(N) = 1 − log(df) / log(N) — 1 for an entity of one passage, 0 for one
    in every passage. A hub (a conversation's speaker, a word on every page) seeds with a weight
    that shrinks with its degree, so a rare name it is asked with leads the walk."""
    n = max(total_passages, 2)
    out = {}
    for node in entities:
        df = len(stats.passages_of.get(node, ()))
        if df:
            out[node] = max(0.0, 1.0 - math.log(df) / math.log(n))
    return out


def seed(
    graph: SparseGraph,
    stats: PassageStats,
    type_sizes: dict[str, int],
    total_passages: int,
    facts: list[FactHit],
    schemas: list[SchemaHit],
    passages: list[tuple[str, float]],
    params: RetrievalParams,
    linked: dict[str, float] | None = None,
) -> Seeds | None:
    """The structure-aware reset vector (docs/architecture.md §5 step 2), or None when no schema or fact
    survives τ_q and the query names no entity of the memory (`linked`: entity node → seed
    weight, linked_weights × link_weight) — the caller answers the first stage then. `facts` must already exclude
    invalid, merged and expired facts: they contribute nothing."""
    kept_facts = [f for f in facts if f.score > params.tau_q]
    kept_schemas = [s for s in schemas if s.score > params.tau_q] if params.schema_seeds else []
    linked = {node: w for node, w in (linked or {}).items() if w > 0}
    if not kept_facts and not kept_schemas and not linked:
        return None
    best = max([f.score for f in kept_facts] + [s.score for s in kept_schemas] + [s for _, s in passages] or [1.0])

    def weight_of(similarity: float) -> float:
        # Calibration: a small embedder compresses cosines (unrelated ≈ 0.2, related ≈ 0.6), so
        # raw cosines make a weak fact seed as heavily as a strong passage; a softmax does not.
        return math.exp((similarity - best) / params.temperature) if params.temperature > 0 else similarity

    per_entity: dict[str, list[float]] = defaultdict(list)
    boosted: set[str] = set()
    for fact in kept_facts:
        for node in (fact.head, fact.tail):
            per_entity[node].append(weight_of(fact.score))
            if fact.category in BOOSTED_CATEGORIES:
                boosted.add(node)
    entities = {
        node: float(np.mean(s)) * (params.constraint_boost if node in boosted else 1.0)
        for node, s in per_entity.items()
    }
    for node, weight in linked.items():
        entities[node] = entities.get(node, 0.0) + weight

    per_type: dict[str, list[float]] = defaultdict(list)
    for schema in kept_schemas:
        for type_ in {schema.head_type, schema.tail_type}:
            per_type[type_node(type_)].append(weight_of(schema.score))
    types = {}
    for node, scores in per_type.items():
        weight = float(np.mean(scores))
        if params.hub_suppression:
            weight /= math.log(max(type_sizes.get(node_id(node), 1), 1) + 1)
        types[node] = weight
    passage_seeds = {}
    for node, score in passages:
        weight = weight_of(score) * params.alpha
        if params.information_density:
            weight *= stats.density(node, total_passages)
        passage_seeds[node] = max(weight, 0.0)
    reset = np.zeros(len(graph))
    for mapping in (entities, types, passage_seeds):
        for node, weight in mapping.items():
            index = graph.index.get(node)
            if index is not None:
                reset[index] += weight
    outside = {node: weight for node, weight in passage_seeds.items() if weight > 0 and node not in graph.index}
    if reset.sum() + sum(outside.values()) <= 0:
        return None
    return Seeds(kept_facts, kept_schemas, entities, types, passage_seeds, reset, outside)


@dataclass(frozen=True)
class FirstStage:
    """What every ranked mode starts from: each leg's candidates and their fusion."""

    dense: list  # store.records.Hit, cosine scores, best first
    lexical: list  # store.records.Hit, BM25 scores, best first
    fused: list[tuple[str, float]]  # (passage id, fused score), best first
    cosines: dict[str, float]  # passage id → cosine to the query, for the fused candidates known
    turn_share: float = 0.0  # the share of the fused candidates that are conversation turns (graph modes)
    rows: dict[str, dict] = field(default_factory=dict)  # passage id → its stored row, for those read so far


def cosines(rows, vector) -> list[float]:
    """The cosine of each row (a matrix, or a list of vectors) to `vector`, in float32."""
    rows = np.asarray(rows, dtype=np.float32)
    vector = np.asarray(vector, dtype=np.float32)
    norms = np.linalg.norm(rows, axis=1) * max(float(np.linalg.norm(vector)), 1e-12)
    return [float(x) for x in (rows @ vector) / np.maximum(norms, 1e-12)]


EPISODE_RADIUS = 1  # a turn's neighbours for episode_smoothing: the turns just before and after it


def episode_smoothing(
    scores: dict[str, float], neighbours: dict[str, list[str]], weight: float
) -> list[tuple[str, float]]:
    """Temporal contiguity as a re-ranking: each passage scores its own score plus `weight` ×
    the best of its session neighbours' (`neighbours`: passage → the turns next to it, for the
    passages that are turns), and the neighbours of scored passages join the ranking on their
    neighbours' score alone — an answer is often the turn after the one that shares the
    question's words. Best first; equal scores keep the order of `scores`, then of discovery.

    Measured on the LoCoMo dev conversations (first stage of rrf_k 1, legs of 30, neighbours
    joining), R@5 / R@10 overall and multi-hop: off 60.2 / 68.9 and 31.8 / 42.7; weight 0.1 →
    62.5 / 71.3 and 31.8 / 43.0; 0.25 → 64.9 / 75.2 and 32.9 / 44.6; 0.5 → 66.0 / 76.4 but
    multi-hop 29.6 / 38.9 (a question's turns in other sessions pushed out by neighbours);
    1.0 → 60.8 / 74.0. Without the neighbours joining, 0.5 gave 65.5 / 75.3; summing both
    neighbours instead of taking the best gave no more."""
    adjacent: dict[str, set[str]] = {}
    for pid, near in neighbours.items():
        for other in near:
            adjacent.setdefault(pid, set()).add(other)
            adjacent.setdefault(other, set()).add(pid)
    order = list(scores) + [
        pid for pid in dict.fromkeys(o for p in scores for o in sorted(adjacent.get(p, ()))) if pid not in scores
    ]
    smoothed = {
        pid: scores.get(pid, 0.0) + weight * max((scores.get(o, 0.0) for o in adjacent.get(pid, ())), default=0.0)
        for pid in order
    }
    return sorted(smoothed.items(), key=lambda x: -x[1])


def fuse(rankings: list[list[str]], k: float = 60.0, weights: list[float] | None = None) -> list[tuple[str, float]]:
    """Reciprocal rank fusion (Cormack et al. 2009): each id scores Σ weight / (k + rank) over the
    rankings it is in (rank from 1), best first; equal scores keep the order of first appearance
    (the earlier ranking's, then its rank). Ranks, not scores: BM25 and cosine are on scales that
    do not compare, and a leg missing an id adds nothing for it."""
    weights = weights or [1.0] * len(rankings)
    scores: dict[str, float] = {}
    for ranking, weight in zip(rankings, weights):
        for rank, item in enumerate(ranking, 1):
            scores[item] = scores.get(item, 0.0) + weight / (k + rank)
    return sorted(scores.items(), key=lambda x: -x[1])  # stable: ties keep first appearance


def keep_first(
    ranked: list[tuple[str, float]], first: list[str], kept: int, pages: Sequence[str] = ()
) -> list[tuple[str, float]]:
    """`ranked` (a fusion of the first stage's ranking `first` with a walk's) with the first
    stage's top `kept` passages in place above the rest: the walk ranks what follows them, so
    it can bring a second hop up to rank `kept` + 1 but never push the passage that matches the
    question best down — over documents its weight (walk_weight) lets it reorder the whole list,
    and on a 2Wiki-style set it cost ppr five points of R@2. The `pages` (those a subject joins
    to the question or to the top passage: workers.algorithms.subjects), in their order, follow
    the kept ones. A kept passage or page scores at least the best of the rest, so scores still
    fall down the list."""
    top = list(dict.fromkeys([*first[:kept], *pages]))
    if not top:
        return ranked
    score, held = dict(ranked), set(top)
    rest = [(pid, s) for pid, s in ranked if pid not in held]
    floor, kept_scores = rest[0][1] if rest else 0.0, []
    for pid in reversed(top):  # from the last kept up: each at least the one below it
        floor = max(score.get(pid, 0.0), floor)
        kept_scores.append((pid, floor))
    return kept_scores[::-1] + rest


def fuse_walk(
    first: list[str], walked: list[str], params: RetrievalParams, weight: float, kept: int
) -> list[tuple[str, float]]:
    """The first stage's ranking fused with a walk's of this weight (fuse), the first stage's top
    `kept` passages kept in place (keep_first; kept_first says how many): ppr's and
    reconstruct's answer."""
    return keep_first(fuse([first, walked], params.rrf_k, [1.0, weight]), first, kept)


def by_turn_share(documents: float, turns: float, turn_share: float) -> float:
    """A weight that is `documents` over documents and `turns` over conversation turns, in
    proportion to the share of the candidates that are turns: the one formula of the weights
    that follow what the candidates are."""
    return documents * (1.0 - turn_share) + turns * turn_share


def first_stage_weights(params: RetrievalParams, turn_share: float) -> list[float]:
    """The first stage's fusion weights, [dense, lexical]: the dense leg weighs 1 over documents
    and `turn_dense_weight` over conversation turns, in proportion to the share of the answer's
    top that are turns; the lexical leg weighs 1."""
    return [by_turn_share(1.0, params.turn_dense_weight, turn_share), 1.0]


def kept_first(params: RetrievalParams, turn_share: float) -> int:
    """How many of the first stage's top passages the walk's fusion keeps in place: `first_kept`
    over documents, `turn_first_kept` over conversation turns, in proportion to the share of the
    first stage's candidates that are turns (to the nearest whole passage, a half up)."""
    return math.floor(by_turn_share(params.first_kept, params.turn_first_kept, turn_share) + 0.5)


def link_weight(params: RetrievalParams, turn_share: float) -> float:
    """The seed weight of an entity the query names (at idf 1): `link_weight` over documents
    where `entity_links` is on, `turn_link_weight` over conversation turns, in proportion to the
    share of the first stage's candidates that are turns."""
    return by_turn_share(params.link_weight if params.entity_links else 0.0, params.turn_link_weight, turn_share)


def walk_weight(params: RetrievalParams, turn_share: float) -> float:
    """The walk's weight in its fusion with the first stage: `walk_weight` over documents,
    `turn_walk_weight` over conversation turns, in proportion to the share of the first stage's
    candidates that are turns."""
    return by_turn_share(params.walk_weight, params.turn_walk_weight, turn_share)


def rank_passages(
    graph: SparseGraph, scores: np.ndarray, passage_index: np.ndarray, top_k: int, outside: Sequence[str] = ()
) -> list[tuple[str, float]]:
    """The top passages by PPR score: the graph's passage nodes (`passage_index`) and the
    `outside` passages scored after the graph's nodes (`SparseGraph.pagerank(..., outside=...)`).
    The graph's size is the one the scores were computed on: ranking may run on another thread
    while the graph grows (node names only append)."""
    n = len(scores) - len(outside)
    indexes = np.concatenate([passage_index, n + np.arange(len(outside), dtype=np.int64)])
    if not len(indexes):
        return []
    top = indexes[top_stable(scores[indexes], top_k)]
    return [(graph.names[i] if i < n else outside[i - n], float(scores[i])) for i in top]


def top_stable(values: np.ndarray, k: int) -> np.ndarray:
    """The positions of the `k` largest values, largest first, equal values in position order:
    np.argsort(-values, kind="stable")[:k], without sorting them all. Only the values at least
    the k-th largest are sorted (a partition finds it): at 200,000 passages a full sort was
    ~10-20 ms of every walk."""
    if k <= 0:
        return np.zeros(0, dtype=np.int64)
    if k >= len(values):
        return np.argsort(-values, kind="stable")
    kth = np.partition(-values, k - 1)[k - 1]
    kept = np.flatnonzero(-values <= kth)  # every value tied with the k-th too, in position order
    return kept[np.argsort(-values[kept], kind="stable")[:k]]
