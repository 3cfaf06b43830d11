"""The retrieval core without I/O: the reset vector of docs/architecture.md §5 term by term, parameter
validation, and the query worker's graph applying change-stream entries as deltas."""

import math

import numpy as np
import pytest

from workers.algorithms.ppr import SparseGraph
from workers.algorithms.retrieval import FactHit, PassageStats, RetrievalParams, SchemaHit, rank_passages, seed
from workers.query.graph_cache import TenantGraph


def small_memory():
    """Two passages: p1 mentions a, b (b also in p2); p2 mentions b, c. Fact a–b, type PERSON {a, c}."""
    tg = TenantGraph("t")
    for e, p in (("e:a", "p:1"), ("e:b", "p:1"), ("e:b", "p:2"), ("e:c", "p:2")):
        tg.apply(e, p, 1.0, "passage")
    tg.apply("e:a", "e:b", 1.0, "fact")
    tg.apply("e:a", "t:PERSON", 1.0, "type")
    tg.apply("e:c", "t:PERSON", 1.0, "type")
    tg.flush()
    return tg


DESIGN = RetrievalParams(temperature=0, alpha=0.05)  # docs/architecture.md §5's raw-similarity form


def test_reset_vector_follows_design_section_5():
    tg = small_memory()
    params = DESIGN
    facts = [
        FactHit("f1", "e:a", "e:b", 0.8),
        FactHit("f2", "e:b", "e:c", 0.6),
        FactHit("f3", "e:c", "e:a", 0.3),
    ]  # f3 below τ_q
    schemas = [SchemaHit("s1", "PERSON", "PLACE", 0.7), SchemaHit("s2", "PERSON", "PERSON", 0.5)]
    seeds = seed(tg.graph, tg.stats, tg.type_sizes(), 2, facts, schemas, [("p:1", 0.9)], params)
    assert [f.id for f in seeds.facts] == ["f1", "f2"]
    assert seeds.entities == pytest.approx({"e:a": 0.8, "e:b": 0.7, "e:c": 0.6})  # mean over its retrieved facts
    # type: mean schema similarity × 1/log(deg + 1), deg(PERSON) = 2
    assert seeds.types["t:PERSON"] == pytest.approx(0.6 / math.log(3))
    assert seeds.types["t:PLACE"] == pytest.approx(0.7 / math.log(2))  # unknown size counts as 1
    # passage: Sim · α · sigmoid(ΣIDF / log(|E_p| + 1)); IDF(a) = log 2, IDF(b) = log 1 = 0
    density = 1 / (1 + math.exp(-(math.log(2) + 0) / math.log(3)))
    assert seeds.passages["p:1"] == pytest.approx(0.9 * 0.05 * density)
    assert seeds.reset[tg.graph.index["e:a"]] == pytest.approx(0.8)

    plain = seed(
        tg.graph,
        tg.stats,
        tg.type_sizes(),
        2,
        facts,
        schemas,
        [("p:1", 0.9)],
        RetrievalParams(temperature=0, alpha=0.05, hub_suppression=False, information_density=False),
    )
    assert plain.types["t:PERSON"] == pytest.approx(0.6) and plain.passages["p:1"] == pytest.approx(0.9 * 0.05)
    assert (
        seed(tg.graph, tg.stats, tg.type_sizes(), 2, facts, schemas, [], RetrievalParams(schema_seeds=False)).types
        == {}
    )


def test_calibrated_weights_are_a_softmax_over_facts_schemas_and_passages():
    """The shipped default: exp((sim − best) / T), so a strong passage outweighs weak facts."""
    tg = small_memory()
    facts = [FactHit("f1", "e:a", "e:b", 0.5), FactHit("f2", "e:b", "e:c", 0.45)]
    seeds = seed(
        tg.graph, tg.stats, tg.type_sizes(), 2, facts, [], [("p:2", 0.7)], RetrievalParams(information_density=False)
    )
    w = lambda s: math.exp((s - 0.7) / 0.05)  # noqa: E731
    assert seeds.entities == pytest.approx({"e:a": w(0.5), "e:b": (w(0.5) + w(0.45)) / 2, "e:c": w(0.45)})
    assert seeds.passages == pytest.approx({"p:2": 2.0})  # the best candidate: weight 1 × α
    assert seeds.passages["p:2"] > 50 * seeds.entities["e:a"]


def test_constraints_are_boosted_and_nothing_above_tau_q_means_dense_fallback():
    tg = small_memory()
    seeds = seed(tg.graph, tg.stats, {}, 2, [FactHit("f", "e:a", "e:b", 0.5, "HARD_CONSTRAINT")], [], [], DESIGN)
    assert seeds.entities == pytest.approx({"e:a": 0.5 * 1.35, "e:b": 0.5 * 1.35})
    weak = [FactHit("f", "e:a", "e:b", 0.39)]
    assert (
        seed(tg.graph, tg.stats, {}, 2, weak, [SchemaHit("s", "X", "Y", 0.2)], [("p:1", 0.9)], RetrievalParams())
        is None
    )


def test_ppr_ranks_the_passage_reached_through_a_fact_edge():
    """A query about a alone: p1 holds a; p2 is reached only through the fact a–b and b's mention."""
    tg = small_memory()
    seeds = seed(tg.graph, tg.stats, {}, 2, [FactHit("f", "e:a", "e:a2", 0.9)], [], [], RetrievalParams())
    scores = tg.graph.pagerank(seeds.reset)
    ranked = rank_passages(tg.graph, scores, tg.passage_index(), 2)
    assert [p for p, _ in ranked] == ["p:1", "p:2"] and ranked[1][1] > 0


def test_a_passage_without_entities_is_still_ranked_by_its_seed():
    """p:note has no entity, so no graph node: it joins the walk as an isolated node and keeps
    its share of the restart mass instead of vanishing from PPR answers."""
    tg = small_memory()
    facts = [FactHit("f", "e:a", "e:b", 0.6)]
    seeds = seed(tg.graph, tg.stats, {}, 3, facts, [], [("p:note", 0.9), ("p:2", 0.5)], RetrievalParams())
    assert list(seeds.outside) == ["p:note"] and "p:note" not in tg.graph.index
    scores = tg.graph.pagerank(seeds.reset, outside=list(seeds.outside.values()))
    assert len(scores) == len(tg.graph) + 1 and abs(scores.sum() - 1) < 1e-6
    ranked = rank_passages(tg.graph, scores, tg.passage_index(), 3, list(seeds.outside))
    assert ranked[0][0] == "p:note" and {p for p, _ in ranked} == {"p:note", "p:1", "p:2"}


def test_type_edges_are_normalised_by_the_type_size_as_members_join_and_leave():
    tg = small_memory()
    assert tg.graph.weight("e:a", "t:PERSON", "type") == pytest.approx(0.5)
    tg.apply("e:d", "t:PERSON", 1.0, "type")
    tg.flush()
    assert tg.graph.weight("e:a", "t:PERSON", "type") == pytest.approx(1 / 3)
    tg.apply("e:a", "t:PERSON", 0.0, "type")
    tg.flush()
    assert tg.graph.weight("e:a", "t:PERSON", "type") == 0 and tg.graph.weight(
        "e:c", "t:PERSON", "type"
    ) == pytest.approx(0.5)
    assert tg.type_sizes() == {"PERSON": 2}


def test_several_kinds_on_one_pair_add_up_and_removing_one_keeps_the_other():
    g = SparseGraph()
    g.set_edge("e:a", "e:b", 2.0, "fact")
    g.set_edge("e:a", "e:b", 0.85, "similar")
    assert g.matrix()[g.index["e:a"], g.index["e:b"]] == pytest.approx(2.85) and g.edges == 1
    g.set_edge("e:a", "e:b", 0.0, "fact")
    assert g.matrix()[g.index["e:a"], g.index["e:b"]] == pytest.approx(0.85) and g.edges == 1
    assert np.allclose(g.degree(), [0.85, 0.85])


def test_capacity_grows_without_a_rebuild_and_ppr_still_matches_the_reference():
    from workers.algorithms.ppr import personalized_pagerank

    g = SparseGraph(capacity=4)
    rng = np.random.default_rng(3)
    for i in range(200):
        g.set_edge(f"n{i}", f"n{int(rng.integers(0, i + 1))}", float(rng.uniform(0.5, 2)))
        if i % 50 == 0:
            g.transition()  # fold part-way, as queries would
    reset = np.zeros(len(g))
    reset[[3, 40, 150]] = [0.2, 0.5, 0.3]
    assert g.rebuilds == 0
    assert np.allclose(g.pagerank(reset, tol=1e-10), personalized_pagerank(g.matrix(), reset), atol=1e-9)


def test_retrieval_params_from_json_rejects_unknown_and_ill_typed_values():
    assert RetrievalParams.from_json({"alpha": 0.1, "hub_suppression": False}) == RetrievalParams(
        alpha=0.1, hub_suppression=False
    )
    with pytest.raises(ValueError, match="unknown retrieval parameter"):
        RetrievalParams.from_json({"alpah": 0.1})
    with pytest.raises(ValueError, match="must be bool"):
        RetrievalParams.from_json({"hub_suppression": "no"})
    with pytest.raises(ValueError, match="must be float"):
        RetrievalParams.from_json({"alpha": True})
    with pytest.raises(ValueError, match="damping"):
        RetrievalParams.from_json({"damping": 1.0})


def test_passage_without_entities_has_neutral_density():
    assert PassageStats().density("p:none", 10) == 0.5


def test_episode_smoothing_raises_a_turn_by_its_best_neighbour_and_brings_neighbours_in():
    from workers.algorithms.retrieval import episode_smoothing

    scores = {"t2": 1.0, "t7": 0.6, "doc": 0.5}  # t2 and t7 are turns; doc is no turn
    neighbours = {"t2": ["t1", "t3"], "t7": ["t6", "t8"]}
    smoothed = dict(episode_smoothing(scores, neighbours, 0.25))
    assert smoothed["t2"] == pytest.approx(1.0) and smoothed["doc"] == pytest.approx(
        0.5
    )  # no scored neighbour, nothing added
    assert smoothed["t3"] == pytest.approx(0.25) and smoothed["t1"] == pytest.approx(0.25)  # joined on t2's score
    assert list(smoothed)[:3] == ["t2", "t7", "doc"]
    # a turn between two scored ones takes the better neighbour, not their sum
    assert dict(episode_smoothing({"a": 0.4, "c": 0.8, "b": 0.1}, {"b": ["a", "c"]}, 0.5))["b"] == pytest.approx(
        0.1 + 0.4
    )
    assert episode_smoothing(scores, neighbours, 0.0)[:3] == [("t2", 1.0), ("t7", 0.6), ("doc", 0.5)]


def test_linked_entities_weigh_by_rarity_so_a_hub_counts_little():
    from workers.algorithms.retrieval import linked_weights

    stats = PassageStats()
    for i in range(100):
        stats.link("e:caroline", f"p:{i}", True)  # the speaker: named in every passage
    stats.link("e:biscuit", "p:7", True)
    weights = linked_weights(stats, 100, ["e:caroline", "e:biscuit", "e:unknown"])
    assert (
        weights["e:biscuit"] == pytest.approx(1.0)
        and weights["e:caroline"] == pytest.approx(0.0)
        and "e:unknown" not in weights
    )


def test_top_stable_is_a_stable_full_sort_cut_at_k():
    """The walk's rankings (rank_passages, the engine's entities) select the top k without
    sorting every score: the same positions, ties in position order, as the full stable sort."""
    import numpy as np

    from workers.algorithms.retrieval import top_stable

    rng = np.random.default_rng(3)
    for size in (0, 1, 5, 50, 2000):
        for values in (rng.random(size), rng.integers(0, 4, size).astype(float), np.zeros(size)):
            for k in (0, 1, 3, 10, size, size + 5):
                expected = np.argsort(-values, kind="stable")[: max(k, 0)]
                assert top_stable(values, k).tolist() == expected.tolist(), (size, k)
