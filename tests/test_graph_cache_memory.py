"""The graph cache's memory layout, without Redis: a load adds each kind's edges at once into
arrays (no Python object per edge or per passage) and builds exactly the graph, the passage
statistics and the walk that applying the same edges one by one builds."""

import tracemalloc

import numpy as np
import pytest

from store.graph_log import EdgeChange
from workers.algorithms.retrieval import PassageStats
from workers.query.graph_cache import TenantGraph


def synthetic_edges(passages: int, seed: int = 3) -> list[EdgeChange]:
    """A small tenant as the adjacency hashes give it (each edge once, from its smaller end):
    passages of 4–6 entities drawn by a Zipf law, facts and similarity edges, typed entities."""
    rng = np.random.default_rng(seed)
    entities = passages // 3
    zipf = 1.0 / np.arange(1, entities + 1)
    zipf /= zipf.sum()
    edges = []
    for p in range(passages):
        mentioned = sorted(set(rng.choice(entities, int(rng.integers(4, 7)), p=zipf).tolist()))
        edges += [EdgeChange(f"e:{e}", f"p:{p}", 1.0, "passage") for e in mentioned]
        if len(mentioned) > 1 and p % 2:
            a, b = sorted(f"e:{e}" for e in mentioned[:2])
            edges.append(EdgeChange(a, b, float(rng.integers(1, 3)), "fact"))
            if p % 3 == 0:
                edges.append(EdgeChange(a, b, float(rng.uniform(0.8, 1)), "similar"))
    edges += [EdgeChange(f"e:{e}", f"t:T{e % 7}", 1.0, "type") for e in range(entities)]
    edges = list({(e.a, e.b, e.kind): e for e in edges}.values())  # one field per kind and pair
    rng.shuffle(edges)  # the order hashes come back in
    return edges


def loaded(edges: list[EdgeChange]) -> TenantGraph:
    graph = TenantGraph("t")
    for start in range(0, len(edges), 500):  # one list per round trip, as the store yields them
        graph.apply_loaded(edges[start : start + 500])
    graph.finish_loading()
    graph.flush()
    return graph


def applied(edges: list[EdgeChange]) -> TenantGraph:
    graph = TenantGraph("t")
    for edge in edges:
        graph.apply(edge.a, edge.b, edge.weight, edge.kind)
    graph.flush()
    return graph


def test_a_load_builds_exactly_the_graph_of_its_edges_applied_one_by_one():
    edges = synthetic_edges(600)
    bulk, one_by_one = loaded(edges), applied(edges)
    assert bulk.graph.names == one_by_one.graph.names
    assert bulk.graph.edges == one_by_one.graph.edges == len({(e.a, e.b) for e in edges})
    a, b = bulk.graph.matrix(), one_by_one.graph.matrix()
    assert (a != b).nnz == 0 and np.array_equal(bulk.graph.degree(), one_by_one.graph.degree())
    assert sorted(bulk.graph.edge_weights()) == sorted(one_by_one.graph.edge_weights())
    reset = np.zeros(len(bulk.graph))
    reset[[3, 30, 300]] = [0.5, 0.3, 0.2]
    assert np.array_equal(bulk.graph.pagerank(reset), one_by_one.graph.pagerank(reset))


def test_passage_statistics_read_from_the_graph_are_those_of_the_sets_they_replace():
    edges = synthetic_edges(300)
    graph = loaded(edges)
    reference = PassageStats()
    for edge in edges:
        if edge.kind == "passage":
            reference.link(edge.a, edge.b, True)
    # changes after the load: a link removed, one added, a passage new
    for a, b, weight in (("e:0", "p:7", 0.0), ("e:1", "p:7", 1.0), ("e:2", "p:new", 1.0), ("e:2", "p:new", 1.0)):
        graph.apply(a, b, weight, "passage")
        reference.link(a, b, weight > 0)
    total = len(graph.passage_index())
    for passage in [f"p:{p}" for p in range(300)] + ["p:new", "p:none"]:
        # (the sets summed their terms in hash order, which varies with PYTHONHASHSEED: equal to rounding)
        assert graph.stats.density(passage, total) == pytest.approx(reference.density(passage, total), rel=1e-12)
        assert set(graph.stats.entities_of.get(passage) or ()) == reference.entities_of.get(passage, set())
    for entity in [f"e:{e}" for e in range(100)] + ["e:none"]:
        assert len(graph.stats.passages_of.get(entity, ())) == len(reference.passages_of.get(entity, ()))


@pytest.mark.parametrize("build", [loaded, applied])
def test_a_graph_holds_under_150_bytes_an_edge(build):
    """It held ~500 (a dict entry per edge and kind, a set entry per passage link at both ends),
    loaded or built change by change."""
    edges = synthetic_edges(3000)
    tracemalloc.start()
    try:
        graph = build(edges)
        graph.graph.transition()
        graph.passage_index()
        held, _ = tracemalloc.get_traced_memory()
    finally:
        tracemalloc.stop()
    assert graph.graph.edges > 15_000
    assert held / graph.graph.edges < 150
