"""The PPR core against igraph's prpack (HippoRAG's call) on the same graph and reset vector,
and the delta-maintained CSR against a matrix built from scratch."""

import numpy as np
import pytest
import scipy.sparse as sp

from workers.algorithms.ppr import SparseGraph, personalized_pagerank
from workers.algorithms.ppr_solver import MAX_PASSES, LeafEliminated, Transition

igraph = pytest.importorskip("igraph")


def random_graph(n: int, m: int, seed: int):
    rng = np.random.default_rng(seed)
    edges = {}
    for i in range(1, n):  # a spanning path: no isolated nodes
        edges[(i - 1, i)] = float(rng.uniform(0.1, 3))
    while len(edges) < m:
        a, b = sorted(rng.integers(0, n, 2))
        if a != b:
            edges[(int(a), int(b))] = float(rng.uniform(0.1, 3))
    return edges


@pytest.mark.parametrize("seed", [1, 2, 3])
def test_matches_igraph_prpack(seed):
    n, edges = 300, random_graph(300, 1500, seed)
    graph = SparseGraph.from_edges((f"n{a}", f"n{b}", w) for (a, b), w in edges.items())
    order = [graph.index[f"n{i}"] for i in range(n)]
    reset = np.zeros(n)
    for node in np.random.default_rng(seed).choice(n, 5, replace=False):
        reset[order[node]] = np.random.default_rng(node).uniform(0.1, 1)
    ours = personalized_pagerank(graph.matrix(), reset, damping=0.5)

    g = igraph.Graph(n=n, edges=list(edges), directed=False)
    g.es["weight"] = list(edges.values())
    theirs = np.array(
        g.personalized_pagerank(
            damping=0.5, reset=[reset[order[i]] for i in range(n)], weights="weight", implementation="prpack"
        )
    )
    ours_by_id = np.array([ours[order[i]] for i in range(n)])
    assert np.allclose(ours_by_id, theirs, atol=1e-6)
    assert list(np.argsort(-ours_by_id)[:10]) == list(np.argsort(-theirs)[:10])


def test_deltas_equal_a_fresh_build_and_no_rebuild_happens():
    edges = random_graph(100, 400, 7)
    graph = SparseGraph.from_edges((f"n{a}", f"n{b}", w) for (a, b), w in list(edges.items())[:200])
    graph.matrix()
    rebuilds = graph.rebuilds
    for (a, b), w in list(edges.items())[200:]:
        graph.set_edge(f"n{a}", f"n{b}", w)
    graph.set_edge("n0", "n1", 0)  # removal
    graph.set_edge("n1", "n2", 9.0)  # reweighting
    graph.set_edge("new", "n5", 1.0)  # a new node
    current = graph.matrix()
    expected = {**edges, (1, 2): 9.0}
    expected.pop((0, 1))
    fresh = SparseGraph.from_edges([(f"n{a}", f"n{b}", w) for (a, b), w in expected.items()] + [("new", "n5", 1.0)])
    names = graph.names
    reorder = [fresh.index[name] for name in names]
    assert np.allclose(current.toarray(), fresh.matrix().toarray()[np.ix_(reorder, reorder)])
    assert graph.rebuilds == rebuilds and graph.edges == len(expected) + 1


def test_mass_is_conserved_with_dangling_nodes():
    graph = SparseGraph()
    graph.set_edge("a", "b", 1.0)
    graph.node("lonely")
    reset = np.ones(3)
    x = personalized_pagerank(graph.matrix(), reset)
    assert abs(x.sum() - 1) < 1e-6 and x[graph.index["lonely"]] > 0
    with pytest.raises(ValueError):
        personalized_pagerank(graph.matrix(), np.zeros(3))


def hub_graph(seed: int) -> SparseGraph:
    """Hubs with rows far longer than Transition.CHUNK, a long tail, and two isolated nodes."""
    rng = np.random.default_rng(seed)
    graph = SparseGraph()
    for i in range(3000):
        graph.set_edge(f"n{i}", f"hub{i % 3}", float(rng.integers(1, 4)))
        graph.set_edge(f"n{i}", f"n{int(rng.integers(0, 3000))}", float(rng.uniform(0.5, 2)))
    graph.node("isolated-a")
    graph.node("isolated-b")
    return graph


@pytest.mark.parametrize("seed", [4, 5])
def test_cached_ppr_is_within_the_l1_tolerance_of_the_exact_solution(seed):
    graph = hub_graph(seed)
    transition = graph.transition()
    assert transition.long_rows >= 3 and transition.dangling == 2
    rng = np.random.default_rng(seed)
    reset = np.zeros(len(graph))
    reset[rng.choice(len(graph) - 2, 8, replace=False)] = rng.uniform(0.05, 1.0, 8)
    reset[graph.index["isolated-a"]] = 0.4  # seeded but unreachable: its mass returns to the seeds
    exact = personalized_pagerank(graph.matrix(), reset)
    ours = graph.pagerank(reset, damping=0.5, tol=1e-6)
    assert np.abs(ours - exact).sum() <= 1e-6
    assert list(np.argsort(-ours, kind="stable")[:10]) == list(np.argsort(-exact, kind="stable")[:10])
    assert ours[graph.index["isolated-b"]] == 0 and abs(ours.sum() - 1) <= 1e-6


def test_split_long_rows_give_the_same_product():
    transition = hub_graph(6).transition()
    x = np.random.default_rng(6).random(transition.matrix.shape[0]).astype(np.float32)
    exact = transition.matrix.astype(np.float64) @ x.astype(np.float64)
    split = transition.product(x)
    plain = transition.matrix @ x
    assert np.abs(split - exact).sum() <= np.abs(plain - exact).sum()
    assert np.allclose(split, exact, rtol=1e-5)


@pytest.mark.parametrize("threads", [2, 3, 4])
def test_a_pass_in_row_blocks_on_threads_is_the_one_thread_pass_bit_for_bit(monkeypatch, threads):
    """A large matrix's pass runs in row blocks on several threads (ppr_solver.PARALLEL_ENTRIES): the
    same rows summed the same way, so the scores — and every answer — are those of one thread,
    also after a damping change rescales the matrix the blocks share."""
    from workers.algorithms import ppr_solver

    graph = hub_graph(8)
    single = graph.transition()
    monkeypatch.setattr(ppr_solver, "PARALLEL_ENTRIES", 0)
    monkeypatch.setattr(ppr_solver, "product_threads", lambda: threads)
    graph._transition = None
    blocked = graph.transition()
    assert len(single.blocks) == 1 and len(blocked.blocks) == threads
    assert all(np.shares_memory(block.data, blocked.split.data) for block in blocked.blocks)
    reset = np.zeros(len(graph))
    reset[[3, 70, 2999]] = 1.0
    for damping in (0.5, 0.85):
        one, many = single.solve(reset, damping, 1e-6), blocked.solve(reset, damping, 1e-6)
        assert one.passes == many.passes and np.array_equal(one.scores, many.scores)
    x = np.random.default_rng(8).random(blocked.matrix.shape[0]).astype(np.float32)
    assert np.array_equal(single.product(x), blocked.product(x))


def test_an_unreachable_tolerance_is_an_error_not_a_silent_answer():
    graph = hub_graph(7)
    reset = np.ones(len(graph))
    with pytest.raises(ArithmeticError, match="did not reach"):
        graph.pagerank(reset, tol=1e-12, max_iter=3)


def test_nodes_outside_the_graph_are_isolated_nodes_of_the_exact_solution():
    graph = hub_graph(8)
    n = len(graph)
    reset = np.zeros(n)
    reset[[5, 50, 500]] = [0.3, 0.2, 0.1]
    outside = np.array([0.25, 0.15])
    padded = sp.block_diag([graph.matrix(), sp.csr_matrix((2, 2))]).tocsr()  # the same graph with two isolated nodes
    exact = personalized_pagerank(padded, np.concatenate([reset, outside]))
    ours = graph.pagerank(reset, outside=outside)
    assert len(ours) == n + 2 and np.abs(ours - exact).sum() <= 1e-6
    only_outside = graph.pagerank(np.zeros(n), outside=outside)
    assert np.allclose(only_outside[n:], outside / outside.sum()) and not only_outside[:n].any()


def tenant_like_graph(seed: int, entities: int = 400, passages: int = 3000) -> SparseGraph:
    """A tenant's shape: passages joined to 1–4 entities each (a few hubs), facts between an
    entity and the next one mentioned, a type node over some entities (a leaf too), an
    isolated entity and an isolated passage."""
    rng = np.random.default_rng(seed)
    graph = SparseGraph(leaf_prefixes=("p:", "t:"))
    popularity = 1.0 / np.arange(1, entities + 1)
    for p in range(passages):
        named = rng.choice(entities, int(rng.integers(1, 5)), replace=False, p=popularity / popularity.sum())
        for e in named:
            graph.set_edge(f"e:{e}", f"p:{p}", 1.0, "passage")
        for a, b in zip(named, named[1:]):
            graph.set_edge(f"e:{a}", f"e:{b}", graph.weight(f"e:{a}", f"e:{b}", "fact") + 1.0, "fact")
    for e in range(0, entities, 7):
        graph.set_edge(f"e:{e}", "t:PERSON", 1 / 58, "type")
    graph.node("e:alone")
    graph.node("p:alone")
    return graph


@pytest.mark.parametrize("seed", [11, 12])
def test_passages_eliminated_from_the_walk_give_the_exact_ppr_within_its_bound_in_fewer_passes(seed):
    """A graph whose passages join entities alone is solved over its entities (LeafEliminated:
    y_core = S·y_core + c, the passages after) — the PPR of the whole matrix to the same L1
    guarantee, from seeds on entities, passages, isolated nodes and outside nodes alike, in fewer
    passes (each over S, smaller than the matrix)."""
    graph = tenant_like_graph(seed)
    reduced = graph.transition()
    assert isinstance(reduced, LeafEliminated) and 0 < reduced.core_share < 1
    whole = Transition(graph.matrix(), graph.degree())
    rng = np.random.default_rng(seed)
    reset = np.zeros(len(graph))
    reset[rng.choice(len(graph), 12, replace=False)] = rng.uniform(0.05, 1.0, 12)
    reset[graph.index["e:alone"]] = 0.3  # seeded but unreachable: its mass returns to the seeds
    reset[graph.index["p:alone"]] = 0.2
    outside = np.array([0.25])
    for damping, tol in ((0.5, 1e-6), (0.5, 1e-10), (0.85, 1e-8)):
        exact = personalized_pagerank(
            sp.block_diag([graph.matrix(), sp.csr_matrix((1, 1))]).tocsr(), np.append(reset, outside), damping
        )
        ours, theirs = (
            reduced.solve(reset, damping, tol, outside=outside),
            whole.solve(reset, damping, tol, outside=outside),
        )
        assert ours.converged and ours.error_bound <= tol
        assert np.abs(ours.scores - exact).sum() <= tol
        assert ours.passes < theirs.passes, (damping, ours.passes, theirs.passes)
        assert list(np.argsort(-ours.scores, kind="stable")[:20]) == list(np.argsort(-exact, kind="stable")[:20])


def test_the_elimination_follows_the_graph_and_steps_aside_where_two_leaves_join():
    """The transition is rebuilt from the graph's deltas — a new passage, a removed mention —
    and is exact after each; an edge between two passages (no kind makes one today) makes the
    walk go over the whole matrix again, not a wrong elimination."""
    graph = tenant_like_graph(13, entities=60, passages=300)
    reset = np.zeros(len(graph))
    reset[[graph.index["e:1"], graph.index["p:5"]]] = 1.0
    graph.transition()
    graph.set_edge("e:1", "p:new", 1.0, "passage")
    graph.set_edge("e:1", "p:5", 0.0, "passage")
    reset = np.append(reset, 0.5)  # p:new, seeded
    assert isinstance(graph.transition(), LeafEliminated)
    assert np.abs(graph.pagerank(reset, tol=1e-9) - personalized_pagerank(graph.matrix(), reset)).sum() <= 1e-9
    graph.set_edge("p:5", "p:new", 1.0, "link")
    assert isinstance(graph.transition(), Transition)  # (its matrix is float32: 1e-6, not 1e-9)
    assert np.abs(graph.pagerank(reset, tol=1e-6) - personalized_pagerank(graph.matrix(), reset)).sum() <= 1e-6


def test_an_eliminated_walk_stops_at_the_pass_cap_and_reports_it():
    graph = tenant_like_graph(14, entities=60, passages=300)
    reset = np.zeros(len(graph))
    reset[graph.index["e:2"]] = 1.0
    capped = graph.solve(reset, damping=0.999999, tol=1e-12)
    assert isinstance(graph.transition(), LeafEliminated)
    assert capped.passes == MAX_PASSES and not capped.converged and capped.error_bound > 1e-12
    assert np.isfinite(capped.scores).all() and (capped.scores >= 0).all()
    for bad in (
        dict(reset=np.zeros(len(graph))),
        dict(reset=-reset),
        dict(reset=reset, damping=1.0),
        dict(reset=reset, tol=0.0),
    ):
        with pytest.raises(ValueError):
            graph.solve(**bad)


def test_a_graph_whose_passages_name_many_entities_is_walked_whole_without_making_s(monkeypatch):
    """Passages of many entities each (HotpotQA-100: 8.8) make S larger than the matrix: the
    walk is the whole matrix's, and S's two-hop product is not even computed for every graph
    version (0.99 s and 190 MB at 200,000 passages of 9 entities)."""
    rng = np.random.default_rng(15)
    graph = SparseGraph(leaf_prefixes=("p:",))
    for p in range(400):
        for e in rng.choice(300, 9, replace=False):
            graph.set_edge(f"e:{e}", f"p:{p}", 1.0, "passage")
    made = []
    monkeypatch.setattr(LeafEliminated, "two_hops", lambda self: made.append(1))
    assert isinstance(graph.transition(), Transition) and not made
