"""The first stage every ranked mode starts from (workers.query.engine): modes lexical and hybrid,
reciprocal rank fusion, and the graph modes' promise never to end below it — a walk with
nothing to seed answers the first stage's ranking unchanged, and top_k is always filled. The
stages run in process (tests.inprocess, InMemoryStore) with the real embedder."""

from __future__ import annotations

import asyncio

import pytest

from tests import inprocess
from tests.inprocess import InProcess
from workers.algorithms.retrieval import fuse
from workers.models.extraction import RulesExtractor

real_embedder = inprocess.real_embedder  # the fixture, for this module's tests

# Turns where the word that answers the question ("Biscuit", a name) is rare and literal: the
# lexical leg finds it, an embedder of 22M parameters ranks the talk about pets in general higher.
TURNS = [
    "I adopted a rescue dog last week and named her Biscuit.",
    "Pets are such good company, I always wanted an animal at home.",
    "My cat sleeps all day on the windowsill.",
    "Animals in shelters need homes, adopting one is a kind thing to do.",
    "We went hiking in the mountains on Saturday.",
    "The museum had a new dinosaur exhibit.",
    "I started a pottery class and made a bowl.",
    "The lake was calm when we went camping.",
]
QUESTION = "Who is Biscuit?"


def run(coro):
    return asyncio.run(coro)


async def _ask(embedder, *queries: tuple[str, dict]) -> list[dict]:
    stages = InProcess(None, RulesExtractor(), embedder)
    try:
        for i, text in enumerate(TURNS):
            await stages.publish(f"turn-{i}", text)
        return [await stages.query(q, **body) for q, body in queries]
    finally:
        await stages.close()


def _docs(answer: dict) -> list[str]:
    return [p["doc_id"] for p in answer["passages"]]


def test_fusion_adds_reciprocal_ranks_and_keeps_first_appearance_on_ties():
    fused = fuse([["a", "b", "c"], ["c", "d"]], k=60)
    assert [x for x, _ in fused] == ["c", "a", "b", "d"]  # c is in both
    assert dict(fused)["c"] == pytest.approx(1 / 63 + 1 / 61)
    assert [x for x, _ in fuse([["a", "b"], ["b", "a"]], k=60)] == ["a", "b"]  # a tie: first seen first
    assert fuse([[], []]) == []


def test_lexical_finds_the_rare_word_and_hybrid_keeps_it(real_embedder):
    lexical, dense, hybrid = run(_ask(real_embedder, (QUESTION, {"mode": "lexical", "top_k": 3}), (QUESTION, {"mode": "dense", "top_k": 3}),
                                      (QUESTION, {"mode": "hybrid", "top_k": 3})))
    assert _docs(lexical) == ["turn-0"] and lexical["mode"] == "lexical"  # only one turn says "Biscuit"
    assert lexical["facts"] == [] and lexical["timings_ms"]["embed"] < 50  # no model in lexical mode
    assert _docs(hybrid)[0] == "turn-0" and len(_docs(hybrid)) == 3  # filled from the dense leg
    assert set(_docs(hybrid)) <= {"turn-0"} | set(_docs(dense)) | {p for p in _docs(lexical)}


def test_a_walk_with_nothing_to_seed_answers_the_first_stage_unchanged(real_embedder):
    """τ_q = 1: no fact or schema can seed the walk. The answer is the hybrid ranking, passage for
    passage and score for score (before: dense's ranking, without the lexical leg)."""
    never = {"params": {"tau_q": 1.0}, "top_k": 5}
    ppr, hybrid = run(_ask(real_embedder, (QUESTION, {"mode": "ppr", **never}), (QUESTION, {"mode": "hybrid", **never})))
    assert ppr["fallback"] == "first_stage" and ppr["mode"] == "ppr"
    assert [(p["id"], p["score"]) for p in ppr["passages"]] == [(p["id"], p["score"]) for p in hybrid["passages"]]
    assert _docs(ppr)[0] == "turn-0"


@pytest.mark.parametrize("mode", ["ppr", "reconstruct"])
def test_graph_modes_fill_top_k_and_keep_the_first_stages_best(real_embedder, mode):
    graph, hybrid = run(_ask(real_embedder, (QUESTION, {"mode": mode, "top_k": 6}), (QUESTION, {"mode": "hybrid", "top_k": 6})))
    assert len(graph["passages"]) == 6
    assert _docs(graph)[0] == _docs(hybrid)[0] == "turn-0"
