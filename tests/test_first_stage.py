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
    lexical, dense, hybrid = run(
        _ask(
            real_embedder,
            (QUESTION, {"mode": "lexical", "top_k": 3}),
            (QUESTION, {"mode": "dense", "top_k": 3}),
            (QUESTION, {"mode": "hybrid", "top_k": 3}),
        )
    )
    assert _docs(lexical) == ["turn-0"] and lexical["mode"] == "lexical"  # only one turn says "Biscuit"
    assert lexical["facts"] == [] and lexical["timings_ms"]["embed"] < 50  # no model in lexical mode
    assert _docs(hybrid)[0] == "turn-0" and len(_docs(hybrid)) == 3  # filled from the dense leg
    assert set(_docs(hybrid)) <= {"turn-0"} | set(_docs(dense)) | {p for p in _docs(lexical)}


def test_a_walk_with_nothing_to_seed_answers_the_first_stage_unchanged(real_embedder):
    """τ_q = 1: no fact or schema can seed the walk. The answer is the hybrid ranking, passage for
    passage and score for score (before: dense's ranking, without the lexical leg)."""
    never = {"params": {"tau_q": 1.0}, "top_k": 5}
    ppr, hybrid = run(
        _ask(real_embedder, (QUESTION, {"mode": "ppr", **never}), (QUESTION, {"mode": "hybrid", **never}))
    )
    assert ppr["fallback"] == "first_stage" and ppr["mode"] == "ppr"
    assert [(p["id"], p["score"]) for p in ppr["passages"]] == [(p["id"], p["score"]) for p in hybrid["passages"]]
    assert _docs(ppr)[0] == "turn-0"


@pytest.mark.parametrize("mode", ["ppr", "reconstruct"])
def test_graph_modes_fill_top_k_and_keep_the_first_stages_best(real_embedder, mode):
    graph, hybrid = run(
        _ask(real_embedder, (QUESTION, {"mode": mode, "top_k": 6}), (QUESTION, {"mode": "hybrid", "top_k": 6}))
    )
    assert len(graph["passages"]) == 6
    assert _docs(graph)[0] == _docs(hybrid)[0] == "turn-0"


@pytest.mark.parametrize("mode", ["lexical", "dense", "hybrid", "ppr", "reconstruct"])
def test_as_of_leaves_out_a_turn_said_later(real_embedder, mode):
    """Turns with times: asked as of a moment before the Biscuit turn, no mode returns it
    (before: as_of filtered facts only, and the later turn still ranked first)."""

    async def main():
        stages = InProcess(None, RulesExtractor(), real_embedder)
        try:
            for i, text in enumerate(TURNS):
                await stages.publish(
                    f"turn-{i}", text, session_id="s1", turn=i, speaker="Ana", ts=1_700_000_000 + 60 * i
                )
            return (
                await stages.query(QUESTION, mode=mode, top_k=4),
                await stages.query(QUESTION, mode=mode, top_k=4, as_of="2023-11-14T22:14:00Z"),
            )  # turn-0 at 22:13:20, turn-1 at 22:14:20
        finally:
            await stages.close()

    now, then = run(main())
    assert _docs(now)[0] == "turn-0"
    assert "turn-0" in _docs(then) and all(doc == "turn-0" for doc in _docs(then))  # only turn-0 was said by 22:14


# A session where the answer is the turn before the one that shares the question's words. (A
# reply is found by the first stage itself: its vector embeds the turn before it, the question it
# answers — workers.algorithms.turns.turn_embedded_text; the turn before is not embedded with its reply.)
SESSION = [  # (session, speaker, text): the question's session ends at the turn it matches
    ("s1", "Caroline", "She said to start with a home study through the Brightside agency."),
    ("s1", "Melanie", "So that is what the counselor suggested for the adoption paperwork?"),
    ("s2", "Melanie", "We painted the fence on Sunday."),
    ("s2", "Caroline", "I started reading a novel about sailing."),
    # nearer the question than the answer for an embedder (therapist ~ counselor, forms ~
    # paperwork, fostering ~ adoption), sharing none of its words
    ("s2", "Melanie", "My therapist recommended filling out the forms for fostering kids."),
    ("s2", "Caroline", "The lake was calm when we went camping."),
]
EPISODE_QUESTION = "What did the counselor suggest for the adoption paperwork?"


def test_graph_modes_bring_in_the_turn_before_the_turn_the_question_matches(real_embedder):
    """The question's words are in turn 1; its answer is turn 0, the turn it follows up on.
    Temporal contiguity (episode_weight) ranks it right after turn 1; the first stage alone does not."""

    async def main():
        stages = InProcess(None, RulesExtractor(), real_embedder)
        try:
            for i, (session, speaker, text) in enumerate(SESSION):
                await stages.publish(
                    f"{session}:{i}", text, session_id=session, turn=i, speaker=speaker, ts=1_700_000_000 + 60 * i
                )
            return [
                await stages.query(EPISODE_QUESTION, mode=mode, top_k=2) for mode in ("hybrid", "ppr", "reconstruct")
            ]
        finally:
            await stages.close()

    hybrid, ppr, reconstruct = run(main())
    assert _docs(hybrid)[0] == "s1:1" and "s1:0" not in _docs(hybrid)
    assert _docs(ppr) == ["s1:1", "s1:0"] and _docs(reconstruct) == ["s1:1", "s1:0"]


def test_a_rare_entity_named_in_the_query_ranks_its_passage_over_a_speaker_hub(real_embedder):
    """Caroline speaks and is named all through the conversation; Biscuit is in one turn. Asked
    about Caroline and Biscuit, every ranked mode puts Biscuit's turn first (before: dense put one
    of Caroline's many turns about pets first)."""
    turns = (
        [("Caroline", "Caroline here: I love animals, Melanie, pets make Caroline happy.")] * 1
        + [("Caroline", f"Caroline again: my pets and animals are the best part of day {i}.") for i in range(12)]
        + [("Melanie", "Your new puppy Biscuit chewed my shoe yesterday!")]
    )

    async def main():
        stages = InProcess(None, RulesExtractor(), real_embedder)
        try:
            for i, (speaker, text) in enumerate(turns):
                await stages.publish(
                    f"s1:{i}", text, session_id="s1", turn=i, speaker=speaker, ts=1_700_000_000 + 60 * i
                )
            return [
                await stages.query("What did Caroline's pet Biscuit do?", mode=mode, top_k=3)
                for mode in ("dense", "hybrid", "ppr")
            ]
        finally:
            await stages.close()

    dense, hybrid, ppr = run(main())
    biscuit = f"s1:{len(turns) - 1}"
    assert _docs(hybrid)[0] == biscuit and _docs(ppr)[0] == biscuit


def test_over_turns_the_entity_a_question_names_seeds_the_walk_and_over_documents_not():
    """No fact or schema can seed (τ_q = 1). Over conversation turns the entity the question
    names seeds the walk (turn_link_weight; link_weight()) — it walks, no fallback; over the same
    texts as documents nothing seeds (entity_links is off there: it cost MuSiQue and HotpotQA),
    nor over turns with turn_link_weight 0 (before: no question's entity seeded by default)."""
    from tests.inprocess import HashEmbedder
    from workers.models.embedding import BatchingEmbedder

    never = {"params": {"tau_q": 1.0}, "top_k": 3, "mode": "ppr"}

    async def ask(as_turns: bool, params: dict) -> dict:
        stages = InProcess(None, RulesExtractor(), BatchingEmbedder(HashEmbedder()))
        try:
            for i, text in enumerate(TURNS):
                turn = {"session_id": "s1", "turn": i, "speaker": "Ann"} if as_turns else {}
                await stages.publish(f"t{i}", text, **turn)
            return await stages.query(QUESTION, **{**never, "params": {**never["params"], **params}})
        finally:
            await stages.close()

    async def main():
        return await asyncio.gather(ask(True, {}), ask(False, {}), ask(True, {"turn_link_weight": 0.0}))

    turns, documents, unlinked = run(main())
    assert turns.get("fallback") is None
    assert documents["fallback"] == "first_stage" and unlinked["fallback"] == "first_stage"


def test_a_named_entitys_seed_weight_follows_what_the_candidates_are():
    from workers.algorithms.retrieval import RetrievalParams, link_weight

    params = RetrievalParams()
    assert link_weight(params, 0.0) == 0.0 and link_weight(params, 1.0) == params.turn_link_weight
    assert link_weight(params, 0.5) == pytest.approx(0.5 * params.turn_link_weight)
    linked = RetrievalParams(entity_links=True, link_weight=2.0, turn_link_weight=0.0)
    assert link_weight(linked, 0.0) == 2.0 and link_weight(linked, 1.0) == 0.0


def test_over_turns_the_lexical_legs_top_leads_and_over_documents_the_dense_legs(real_embedder):
    """One candidate from each leg (first_stage_k 1), the legs disagreeing: at equal weights both
    score the same and the dense one came first, over turns too, where a vector is the weaker
    signal (LoCoMo dev R@5: dense 47.3, lexical 69.9; hybrid fell below lexical at R@2). Over
    turns the dense leg now weighs turn_dense_weight and the lexical top leads — in hybrid and
    as ppr's kept top; over documents the dense top still does, as over turns at weight 1."""
    one = {"top_k": 1, "params": {"first_stage_k": 1}}
    modes = ("dense", "lexical", "hybrid", "ppr")

    async def ask(as_turns: bool, question: str, params: dict) -> dict[str, list[str]]:
        stages = InProcess(None, RulesExtractor(), real_embedder)
        try:
            for i, text in enumerate(TURNS):
                turn = {"session_id": "s1", "turn": i, "speaker": "Ann", "ts": 1_700_000_000 + 60 * i}
                await stages.publish(f"t{i}", text, **(turn if as_turns else {}))
            body = {**one, "params": {**one["params"], **params}}
            return {mode: _docs(await stages.query(question, mode=mode, **body)) for mode in modes}
        finally:
            await stages.close()

    async def main():
        return (
            await ask(True, "What did I adopt last week?", {}),
            await ask(True, "What did I adopt last week?", {"turn_dense_weight": 1.0}),
            await ask(False, "Which pet was named?", {}),
        )

    turns, equal, documents = run(main())
    for top in (turns, documents):
        assert top["dense"] != top["lexical"]  # the legs disagree at the top
    assert turns["hybrid"] == turns["ppr"] == turns["lexical"]
    assert equal["hybrid"] == equal["dense"] != equal["lexical"]  # before: the dense top led over turns
    assert documents["hybrid"] == documents["ppr"] == documents["dense"]


def test_the_dense_legs_weight_follows_what_the_candidates_are():
    from workers.algorithms.retrieval import RetrievalParams, first_stage_weights

    params = RetrievalParams()
    assert first_stage_weights(params, 0.0) == [1.0, 1.0]
    assert first_stage_weights(params, 1.0) == [params.turn_dense_weight, 1.0]
    assert first_stage_weights(params, 0.5)[0] == pytest.approx(0.5 + 0.5 * params.turn_dense_weight)


@pytest.mark.parametrize("as_turns", [True, False])
def test_weighing_the_legs_reads_no_more_rows_than_an_equal_fusion(real_embedder, as_turns):
    """Telling turns from documents takes the rows a mode reads anyway: ppr and reconstruct read
    every candidate's row in one round trip before the fusion, hybrid its answer's; over
    documents no mode reads a row more than at equal weights, over turns hybrid at most one
    round trip more (the lexical top that joins its answer)."""
    question = "What did I adopt last week?"

    async def main():
        stages = InProcess(None, RulesExtractor(), real_embedder)
        reads: list[int] = []
        passages = stages.memory.passages

        async def counted(tenant, passage_ids):
            reads.append(len(passage_ids))
            return await passages(tenant, passage_ids)

        stages.memory.passages = counted  # type: ignore[method-assign]
        try:
            for i, text in enumerate(TURNS):
                turn = {"session_id": "s1", "turn": i, "speaker": "Ann", "ts": 1_700_000_000 + 60 * i}
                await stages.publish(f"t{i}", text, **(turn if as_turns else {}))
            counts = {}
            for mode in ("hybrid", "ppr", "reconstruct"):
                for weight in (1.0, 0.75):
                    reads.clear()
                    body = {"mode": mode, "top_k": 3, "params": {"turn_dense_weight": weight, "first_stage_k": 4}}
                    await stages.query(f"{question} ({mode} {weight})", **body)  # not a cached answer
                    counts[(mode, weight)] = (len(reads), sum(reads))
            return counts
        finally:
            await stages.close()

    counts = run(main())
    for mode in ("ppr", "reconstruct"):
        assert counts[(mode, 0.75)] == counts[(mode, 1.0)], (mode, counts)
    if as_turns:
        assert counts[("hybrid", 0.75)][0] <= counts[("hybrid", 1.0)][0] + 1, counts
    else:
        assert counts[("hybrid", 0.75)] == counts[("hybrid", 1.0)], counts
