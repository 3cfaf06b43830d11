"""Query mode "reconstruct" (workers.query.reconstruct, workers.algorithms.reconstruction): a
step-by-step recall that finds a two-hop answer dense retrieval misses, and says how it got
there; its budget; the LLM router (through the fake OpenAI server, a test double) and the
fallback to the similarity router when the model fails. The stages run in process
(tests.inprocess, InMemoryStore, τ = 1 so every fact is active), with the real embedder."""

from __future__ import annotations

import asyncio
import gc
import json
import warnings

import pytest

from ops.fake_llm import FakeOpenAI
from tests import inprocess
from tests.inprocess import InProcess, ScriptedExtractor
from topics import ContractError
from workers.algorithms.normalize import entity_id, fact_id, relation_name
from workers.algorithms.reconstruction import (
    Branch,
    Budget,
    Cue,
    Spent,
    Stop,
    admit,
    attribute_words,
    choose_mentions,
    mention_candidates,
    similarity_choice,
    time_expressions,
    time_keys,
)
from workers.models.extraction import RulesExtractor
from workers.models.llm import LLMClient, LLMConfig
from workers.query.engine import QueryEngine, QueryRequest
from workers.query.reconstruct import Reconstructor
from workers.query.routing import LLMRouter
from workers.settings import Settings

real_embedder = inprocess.real_embedder  # the fixture, for this module's tests

QUESTION = "Where was the author of The Silent Orchard born?"
BOOK = "The Silent Orchard is a novel written by Mara Kellen."
BIRTH = "Mara Kellen was born in Tromsø."
# Passages that share the question's words ("author", "born", "Silent Orchard") and so outrank,
# in dense retrieval, the one passage that answers it.
DISTRACTORS = {
    "Where was the author Jon Frey born? Jon Frey was born in Bergen.": [("Jon Frey", "born in", "Bergen")],
    "The author of The Silent Orchard's sequel remains unknown; critics argue where the author was born.": [],
    "Ilse Varga, author of many orchard poems, was born in Pécs.": [("Ilse Varga", "born in", "Pécs")],
    "The Silent Orchard was published in 1998 by Northwind Press.": [
        ("The Silent Orchard", "published by", "Northwind Press", "WORK", "ORGANIZATION")
    ],
    "Author Tomas Brand was born in Linz and writes about silent orchards.": [("Tomas Brand", "born in", "Linz")],
    "The author's birthplace is a common question on book tours.": [],
    "Karl Oster, an author, was born in Graz.": [("Karl Oster", "born in", "Graz")],
}
SCRIPT = {
    BOOK: [("The Silent Orchard", "written by", "Mara Kellen", "WORK", "PERSON")],
    BIRTH: [("Mara Kellen", "born in", "Tromsø")],
    **DISTRACTORS,
}
WRITTEN = fact_id(entity_id("The Silent Orchard"), relation_name("written by"), entity_id("Mara Kellen"))
BORN = fact_id(entity_id("Mara Kellen"), relation_name("born in"), entity_id("Tromsø"))
PUBLISHED = fact_id(entity_id("The Silent Orchard"), relation_name("published by"), entity_id("Northwind Press"))


def run(coro):
    return asyncio.run(coro)


async def _memory(embedder) -> InProcess:
    stages = InProcess(None, ScriptedExtractor(SCRIPT), embedder, tau=1)
    for i, text in enumerate([BOOK, BIRTH, *DISTRACTORS]):
        await stages.publish(f"doc-{i}", text)
    return stages


def _texts(answer: dict, via: str | None = None) -> list[str]:
    return [p["text"] for p in answer["passages"] if via is None or p["via"] == via]


def test_reconstruct_finds_the_two_hop_answer_dense_misses_and_shows_its_path(real_embedder):
    async def main():
        stages = await _memory(real_embedder)
        try:
            # six steps: the query cue's passages (the dense ranking's top) compete with the facts now
            # top_k over the nine passages: every passage comes back, marked by how it was found
            return await stages.query(QUESTION, top_k=5, mode="dense"), await stages.query(
                QUESTION, top_k=9, mode="reconstruct", budget={"steps": 6}
            )
        finally:
            await stages.close()

    dense, answer = run(main())
    assert BIRTH not in _texts(dense) and BOOK in _texts(dense)  # dense finds the book, not the birthplace
    assert answer["mode"] == "reconstruct" and len(answer["passages"]) == 9
    assert BIRTH in _texts(answer, "walk") and BOOK in _texts(answer, "walk")
    # the audit trail: the book's cue → "written by" → its passage; the new cue Mara Kellen → the passage that mentions
    # her → the answer
    passage_of = {p["text"]: p["id"] for p in answer["passages"]}
    steps = {step["tag"].get("fact_id") or step["tag"]["passage_id"]: step for step in answer["path"]}
    assert [step["step"] for step in answer["path"]] == list(range(1, len(answer["path"]) + 1))
    written, born = steps[WRITTEN], steps[passage_of[BIRTH]]
    assert written["step"] < born["step"]
    assert {"id": "mara_kellen", "from": f"fact:{WRITTEN}"}.items() <= born["cue"].items() and born["cue"]["hop"] == 1
    assert any(cue["id"] == "mara_kellen" for cue in written["new_cues"])
    assert written["content"]["passages"] == [passage_of[BOOK]] and born["content"]["passages"] == [passage_of[BIRTH]]
    # a second hop scores by its chain: the passage alone is far from the question, the chain is not
    assert born["tag"]["chain"] == "The Silent Orchard written by Mara Kellen; Mara Kellen was born in Tromsø."
    assert born["tag"]["chain_score"] > born["tag"]["passage_score"] + 0.2
    assert answer["cues"]["entities"][0]["id"] == "silent_orchard" and answer["cues"]["attributes"] == [
        "author",
        "born",
    ]
    assert answer["router"] == {"name": "similarity"}
    assert answer["stopped"]["reason"] in ("below_threshold", "exhausted")
    assert answer["budget"]["spent"]["steps"] == len(answer["path"]) <= answer["budget"]["steps"]
    assert {f["id"] for f in answer["facts"]} == {
        step["tag"]["fact_id"] for step in answer["path"] if "fact_id" in step["tag"]
    }
    # one ranking: the first stage's fused with the walk's (a passage both found first), best first
    scores = [p["score"] for p in answer["passages"]]
    assert scores == sorted(scores, reverse=True) and {p["via"] for p in answer["passages"]} == {"walk", "first_stage"}


# Two turns joined only by the person they name; the rules extractor finds the names, no fact.
TURN_QUESTION = "What did Maya promise the person who lent her a pickup truck?"
LENT = "My old neighbor Tomás lent me his pickup truck for the move."
DINNER = "Tomás is coming over tonight for the chicken mole dinner."
TURN_NOISE = [
    "Renting a truck costs a lot in this city.",
    "Someone asked me whether a pickup is worth it.",
    "A promise is a promise, my mother used to say.",
    "The weather was rainy all week.",
]


def test_reconstruct_hops_between_turns_through_a_shared_entity_without_facts(real_embedder):
    async def main():
        stages = InProcess(None, RulesExtractor(), real_embedder)
        try:
            for i, text in enumerate([LENT, DINNER, *TURN_NOISE]):
                await stages.publish(f"turn-{i}", text)
            return await stages.query(TURN_QUESTION, top_k=3, mode="dense"), await stages.query(
                TURN_QUESTION, top_k=6, mode="reconstruct"
            )
        finally:
            await stages.close()

    dense, answer = run(main())
    assert LENT in _texts(dense) and DINNER not in _texts(dense)  # the second turn shares no word with the question
    assert answer["facts"] == [] and {LENT, DINNER} <= set(_texts(answer, "walk"))
    passage_of = {p["text"]: p["id"] for p in answer["passages"]}
    first, second = answer["path"][:2]
    # cue (the question) → passage → new cue (Tomás) → passage
    assert first["cue"]["kind"] == "query" and first["tag"]["passage_id"] == passage_of[LENT]
    assert first["content"] == {"passages": [passage_of[LENT]], "tokens": first["content"]["tokens"]}
    assert [cue["name"] for cue in first["new_cues"]] == ["Tomás"]
    assert {"kind": "entity", "name": "Tomás", "hop": 1, "from": f"passage:{passage_of[LENT]}"}.items() <= second[
        "cue"
    ].items()
    assert second["tag"]["passage_id"] == passage_of[DINNER] and second["content"]["passages"] == [passage_of[DINNER]]
    assert (
        second["tag"]["chain_score"] > second["tag"]["passage_score"] + 0.2
    )  # the chain carries the question to the dinner


def test_the_budget_bounds_steps_passages_and_tokens(real_embedder):
    async def main():
        stages = await _memory(real_embedder)
        try:
            return [
                await stages.query(QUESTION, top_k=5, mode="reconstruct", budget=budget)
                for budget in ({"steps": 1}, {"passages": 2}, {"tokens": 20})
            ]
        finally:
            await stages.close()

    one_step, two_passages, few_tokens = run(main())
    assert len(one_step["path"]) == 1 and one_step["budget"]["spent"]["steps"] == 1
    assert one_step["stopped"] == {"reason": "budget", "detail": "steps budget of 1 spent"}
    assert BIRTH not in _texts(one_step)  # one step does not reach the second hop
    assert len(one_step["passages"]) == 5  # the dense ranking fills the response, outside the budget
    assert len(_texts(two_passages, "walk")) == 2 == two_passages["budget"]["spent"]["passages"]
    assert two_passages["stopped"]["reason"] == "budget" and "passages" in two_passages["stopped"]["detail"]
    # the first passage read (the nearest the query: the sequel's) holds 16 tokens, the second (the book's) 10
    assert two_passages["budget"] == {
        "steps": 6,
        "passages": 2,
        "tokens": 2000,
        "spent": {"steps": 2, "passages": 2, "tokens": 26},
    }
    # 20 tokens admit the first, and the walk stops before the next
    assert few_tokens["budget"]["spent"] == {"steps": 1, "passages": 1, "tokens": 16}
    assert few_tokens["stopped"]["reason"] == "budget" and "tokens" in few_tokens["stopped"]["detail"]


def _llm_engine(stages: InProcess, server: FakeOpenAI) -> QueryEngine:
    llm = LLMClient(LLMConfig(server.base_url, "sk-test", "test-router", max_attempts=1))
    return QueryEngine(stages.memory, stages.embedder, reconstructor=Reconstructor(stages.memory, LLMRouter(llm)))


def _ask(stages: InProcess) -> QueryRequest:
    return QueryRequest.from_json(
        {"query": QUESTION, "tenant": stages.tenant, "top_k": 5, "mode": "reconstruct"}, stages.tenant, 5
    )


def test_the_llm_router_chooses_the_branches_and_stops(real_embedder):
    def route(body: dict) -> str:
        """The test double's router, by what the request holds: the answer read → stop; the book's
        passage read → the birthplace; else the book's author (never the similarity router's first pick)."""
        content = "\n".join(m["content"] for m in body["messages"]).split("Open branches:")[0]  # the evidence read
        if BIRTH in content:
            return json.dumps({"branch": None, "stop": True, "reason": "the birthplace is known"})
        chosen = BORN if BOOK in content else WRITTEN
        return json.dumps({"branch": f"fact:{chosen}", "stop": False, "reason": f"follow {chosen}"})

    async def main(server):
        stages = await _memory(real_embedder)
        engine = _llm_engine(stages, server)
        try:
            return (await engine.answer(_ask(stages))).to_json()
        finally:
            engine.close()
            await stages.close()

    with FakeOpenAI(schema_answers={"route": route}) as server:
        answer = run(main(server))
        assert len(server.requests) == 3
        assert server.requests[0]["response_format"]["json_schema"]["name"] == "route"
    assert [step["tag"]["fact_id"] for step in answer["path"]] == [
        WRITTEN,
        BORN,
    ]  # the similarity router starts with a passage
    assert all(step["router"] == "llm" for step in answer["path"]) and answer["path"][0]["why"] == f"follow {WRITTEN}"
    assert answer["stopped"] == {"reason": "router", "detail": "the birthplace is known"}
    assert answer["router"] == {"name": "llm"}
    assert _texts(answer, "walk") == [BOOK, BIRTH]


@pytest.mark.parametrize("failure", ["http_400", "unknown_fact_id"])
def test_a_failing_llm_router_falls_back_to_the_similarity_router_and_says_so(real_embedder, failure):
    async def main(server):
        stages = await _memory(real_embedder)
        engine = _llm_engine(stages, server)
        try:
            return (await engine.answer(_ask(stages))).to_json()
        finally:
            engine.close()
            await stages.close()

    bad = json.dumps({"branch": "not-a-branch", "stop": False, "reason": ""})
    with FakeOpenAI(schema_answers={"route": bad}) as server:
        if failure == "http_400":
            server.script.append({"status": 400})
        answer = run(main(server))
    assert answer["router"]["name"] == "similarity" and answer["router"]["fallback_from"] == "llm"
    assert answer["router"]["fallback_at_step"] == 1
    assert ("HTTP 400" if failure == "http_400" else "not one of the open branches") in answer["router"]["error"]
    assert all(step["router"] == "similarity" for step in answer["path"]) and answer["path"]  # the walk went on


@pytest.mark.parametrize(
    "body, message",
    [
        ({"mode": "reconstruct", "budget": {"steps": 0}}, "budget 'steps' must be an integer from 1 to 32"),
        ({"mode": "reconstruct", "budget": {"passages": "8"}}, "budget 'passages' must be an integer from 1 to 100"),
        ({"mode": "reconstruct", "budget": {"tokens": True}}, "budget 'tokens' must be an integer"),
        ({"mode": "reconstruct", "budget": {"hops": 3}}, "unknown budget field(s) ['hops']"),
        ({"mode": "reconstruct", "budget": [4]}, "'budget' must be an object"),
        ({"mode": "dense", "budget": {"steps": 2}}, "'budget' applies to mode reconstruct only, not 'dense'"),
    ],
)
def test_a_bad_budget_is_a_contract_error_and_a_400(body, message):
    with pytest.raises(ContractError) as error:
        QueryRequest.from_json({"query": QUESTION, **body}, "t", 5)
    assert message in str(error.value)

    from aiohttp.test_utils import TestClient, TestServer

    from workers.query.server import query_app

    async def main():  # rejected before anything reads Redis: none is needed at this address
        async with TestClient(
            TestServer(query_app(Settings(redis_url="redis://127.0.0.1:9/0"), inprocess.DigitBlindEmbedder()))
        ) as client:
            response = await client.post("/v1/query", data=json.dumps({"query": QUESTION, **body}))
            return response.status, await response.json()

    status, answer = run(main())
    assert status == 400 and message in answer["error"]


def test_a_request_budget_overrides_only_what_it_names():
    request = QueryRequest.from_json({"query": QUESTION, "mode": "reconstruct", "budget": {"steps": 2}}, "t", 5)
    assert request.budget == Budget(steps=2) and request.budget.over(Budget(4, 8, 2000)) == Budget(2, 8, 2000)
    assert QueryRequest.from_json({"query": QUESTION, "mode": "reconstruct"}, "t", 5).budget is None


def test_settings_choose_the_router_and_the_default_budget():
    with pytest.raises(ValueError, match="MEMSTREAM_ROUTER='oracle'"):
        Settings.from_env({"MEMSTREAM_ROUTER": "oracle"})
    with pytest.raises(ValueError, match="MEMSTREAM_LLM_BASE_URL"):
        Reconstructor.from_settings(Settings.from_env({"MEMSTREAM_ROUTER": "llm"}), None)
    with pytest.raises(ValueError, match="MEMSTREAM_RECONSTRUCT_.*steps"):
        Reconstructor.from_settings(Settings.from_env({"MEMSTREAM_RECONSTRUCT_STEPS": "0"}), None)
    made = Reconstructor.from_settings(Settings.from_env({"MEMSTREAM_RECONSTRUCT_PASSAGES": "3"}), None)
    assert made.budget == Budget(6, 3, 2000) and made.router.name == "similarity"


def test_closing_the_engine_closes_the_llm_routers_http_client():
    from store.in_memory import InMemoryStore

    settings = Settings.from_env(
        {"MEMSTREAM_ROUTER": "llm", "MEMSTREAM_LLM_BASE_URL": "http://127.0.0.1:9/v1", "MEMSTREAM_LLM_MODEL": "m"}
    )
    engine = QueryEngine.from_settings(settings, InMemoryStore(), None)
    client = engine.reconstructor.router.llm._client
    assert not client.is_closed()
    run(engine.aclose())
    assert client.is_closed()


# ---- the pure parts ---------------------------------------------------------------------------
def test_cues_from_the_query():
    query = "What did Mara Kellen write about The Silent Orchard on 8 May, 2023 and in 1998? It may rain."
    candidates = mention_candidates(query)
    known = {
        entity_id("The Silent Orchard"): "silent_orchard",
        entity_id("Orchard"): "orchard",
        entity_id("Mara Kellen"): "mara_kellen",
        entity_id("1998"): "1998",
    }
    chosen = choose_mentions(candidates, known)
    assert [(m.text, eid) for m, eid in chosen] == [
        ("Mara Kellen", "mara_kellen"),
        ("The Silent Orchard", "silent_orchard"),
        ("1998", "1998"),
    ]
    times = time_expressions(query)
    assert times == ["8 May, 2023", "1998"]  # "may" the verb is no month
    assert time_keys(times) == {"2023", "may", "1998"}
    assert attribute_words(query, [m for m, _ in chosen], times) == ["write", "rain"]


def _branch(fid: str, score: float) -> Branch:
    return Branch(Cue("entity", "e", "E", 1.0, 0, "query"), "fact", fid, fid, ("x",), ("p",), score, score, score)


def test_the_similarity_router_takes_the_best_branch_and_stops_below_the_margin():
    assert similarity_choice([_branch("b", 0.5), _branch("a", 0.5), _branch("c", 0.7)], None).tag_id == "c"
    assert similarity_choice([_branch("b", 0.5), _branch("a", 0.5)], None).tag_id == "a"  # ties by key
    assert similarity_choice([_branch("a", 0.5)], 0.7, margin=0.25).tag_id == "a"
    assert similarity_choice([_branch("a", 0.4)], 0.7, margin=0.25) == Stop(
        "below_threshold", "best open branch 0.400 < best taken 0.700 - margin 0.25"
    )
    assert similarity_choice([], 0.7).reason == "exhausted"


def test_admit_counts_passages_and_tokens_in_order():
    budget = Budget(4, 3, 100)
    assert admit(budget, Spent(1, 1, 50), [30, 10, 5]) == 2  # the third passage would be the fourth
    assert admit(budget, Spent(1, 0, 50), [60, 10]) == 0  # the first does not fit: none after it either


# Temporal contiguity: a question and its reply are neighbouring turns of a session; the reply
# names nothing the question does ("He studies cod …"), so only the episode leads there.
FIANCE_QUESTION = "What does Elin's fiancé do for a living?"
# The answer is the turn before the one the question matches (a reply would be found by dense
# itself: its vector embeds the turn before it, workers.algorithms.turns.turn_embedded_text).
ANSWER = "I met Erik last weekend. Quiet and kind; he studies cod populations off the coast near Bergen."
ENGAGED = "That is my sister Elin's fiancé! She just got engaged to him."
EPISODE_TURNS = [
    ("s1", 1, "Jonas", ANSWER),
    ("s1", 2, "Maya", ENGAGED),
    # another session, with turns numbered like s1's: never s1's neighbours
    ("s2", 1, "Maya", "Living in the city is expensive these days."),
    ("s2", 2, "Jonas", "My fiancé and I want to do a road trip."),
    ("s2", 3, "Maya", "What do you even do all day on a living room couch?"),
    ("s2", 4, "Jonas", "Elin wants to know what to do for her birthday."),
]


async def _episodes(stages: InProcess) -> None:
    for session, turn, speaker, text in EPISODE_TURNS:
        await stages.publish(f"{session}:{turn}", text, session_id=session, turn=turn, speaker=speaker)


def test_reconstruct_recalls_the_neighbouring_turn_dense_misses_through_an_episode_cue(real_embedder):
    async def main():
        stages = InProcess(None, RulesExtractor(), real_embedder)
        try:
            await _episodes(stages)
            return (
                await stages.query(FIANCE_QUESTION, top_k=3, mode="dense"),
                await stages.query(FIANCE_QUESTION, top_k=6, mode="reconstruct"),
                {
                    (p["metadata"]["session_id"], p["metadata"]["turn"]): p["id"]
                    for p in await stages.memory.passages(
                        stages.tenant, await stages.memory.scan_ids(stages.tenant, "passages")
                    )
                },
                await stages.query(FIANCE_QUESTION, top_k=4, mode="reconstruct", budget={"steps": 1}),
            )
        finally:
            await stages.close()

    dense, answer, passage_of, short = run(main())
    assert ENGAGED in _texts(dense) and ANSWER not in _texts(dense)
    assert ANSWER in _texts(answer, "walk")
    # the path: the engaged turn is read, its episode (s1 turn 2 ± 1) recalls the turn before it
    step = next(step for step in answer["path"] if step["tag"].get("passage_id") == passage_of[("s1", 1)])
    assert {"kind": "episode", "id": "episode:s1:2", "from": f"passage:{passage_of[('s1', 2)]}"}.items() <= step[
        "cue"
    ].items()
    engaged = next(s for s in answer["path"] if s["content"]["passages"] == [passage_of[("s1", 2)]])
    assert engaged["step"] < step["step"] and any(cue["kind"] == "episode" for cue in engaged["new_cues"])
    assert step["tag"]["chain"].endswith(
        f"{ENGAGED}; {ANSWER}"
    )  # the chain that read the engaged turn, then the answer
    assert step["score"] <= engaged["score"]  # capped by the branch that read the engaged turn
    # neighbours only within the session: every passage an episode cue read is of the cue's session
    session_of = {pid: key[0] for key, pid in passage_of.items()}
    episode_steps = [s for s in answer["path"] if s["cue"]["kind"] == "episode"]
    assert episode_steps and all(
        session_of[s["tag"]["passage_id"]] == s["cue"]["id"].split(":")[1] for s in episode_steps
    )
    assert all(cue["kind"] != "episode" for cue in answer["entities"])
    # every passage, read by the walk or filled in from dense, maps back to its turn as in the
    # other modes: metadata and context line
    assert {p["via"] for p in short["passages"]} == {"walk", "first_stage"}
    for passage in answer["passages"] + short["passages"]:
        assert passage_of[(passage["metadata"]["session_id"], passage["metadata"]["turn"])] == passage["id"]
        assert passage["context"].endswith(":")


def test_session_neighbours_are_the_sessions_turns_within_the_radius_and_survive_redelivery(redis_url):
    async def index(delivery: inprocess.Delivery) -> tuple[dict, int]:
        stages = InProcess(redis_url, RulesExtractor(), delivery=delivery)
        try:
            await _episodes(stages)
            await stages.publish("plain", "Elin's fiancé is a marine biologist.")  # no turn: in no session
            await stages.publish("no-turn", "A session note without a turn number.", session_id="s1")
            ids = {
                (p["metadata"].get("session_id"), p["metadata"].get("turn")): p["id"]
                for p in await stages.memory.passages(
                    stages.tenant, await stages.memory.scan_ids(stages.tenant, "passages")
                )
            }
            near = {
                (session, turn, radius): await stages.memory.session_neighbours(stages.tenant, session, turn, radius)
                for session, turn in [("s1", 1), ("s1", 2), ("s2", 2), ("s3", 1)]
                for radius in (1, 2)
            }
            return {
                key: [(t, next(k for k, v in ids.items() if v == pid)) for t, pid in found]
                for key, found in near.items()
            }, stages.broker.redeliveries
        finally:
            await stages.close()

    once, _ = run(index(inprocess.Delivery()))
    assert (
        once[("s1", 1, 1)] == once[("s1", 1, 2)] == [(2, ("s1", 2))]
    )  # the turn itself left out; s2's turn 2 is not s1's
    assert once[("s1", 2, 1)] == [(1, ("s1", 1))]
    assert once[("s2", 2, 1)] == [(1, ("s2", 1)), (3, ("s2", 3))]
    assert once[("s2", 2, 2)] == [(1, ("s2", 1)), (3, ("s2", 3)), (4, ("s2", 4))]
    assert once[("s3", 1, 1)] == []
    again, redeliveries = run(index(inprocess.Delivery(partitions=3, consumers=3, seed=7, redeliver=1.0)))
    assert redeliveries > 0 and again == once  # every chunk extracted twice: the same index


def test_episode_score_prefers_the_nearer_turn_and_the_next_before_the_previous():
    from workers.algorithms.reconstruction import episode_score

    assert episode_score(0.6, 1) == 0.6
    assert episode_score(0.6, 1) > episode_score(0.6, -1) > episode_score(0.6, 2) > episode_score(0.6, -2)
    assert 0.6 - episode_score(0.6, -2) < 0.01  # a tie-break, not a discount


def test_an_entity_cue_reads_at_most_entity_passages_read_of_its_passages(redis_url, monkeypatch):
    """A cue entity in more passages than the cap (a speaker of a long-lived tenant): the walk
    reads the ids and vectors of the first ENTITY_PASSAGES_READ by id only, on both stores."""
    from tests.test_expiry import PrefixEmbedder
    from workers.query import reconstruct_walk

    monkeypatch.setattr(reconstruct_walk, "ENTITY_PASSAGES_READ", 2)
    notes = {
        f"Tomás wrote note {n} about the harbour.": [("Tomás", "wrote", f"note {n}", "PERSON", "THING")]
        for n in range(6)
    }

    async def main():
        stages = InProcess(redis_url, ScriptedExtractor(notes), PrefixEmbedder(), tau=1)
        read = []
        entity_passage_vectors = stages.memory.entity_passage_vectors

        async def counted(tenant, entities, limit):
            read.extend(found := await entity_passage_vectors(tenant, entities, limit))
            return found

        try:
            for n, text in enumerate(notes):
                await stages.publish(f"note-{n}", text)
            every = await stages.memory.entity_passages(stages.tenant, entity_id("Tomás"))
            first = await stages.memory.entity_passages(stages.tenant, entity_id("Tomás"), 2)
            stages.memory.entity_passage_vectors = counted
            answer = await stages.query("What did Tomás write?", mode="reconstruct")
            return every, first, answer, read
        finally:
            await stages.close()

    every, first, answer, read = run(main())
    assert len(every) == 6 and first == every[:2]
    assert entity_id("Tomás") in [cue["id"] for cue in answer["cues"]["entities"]]
    # the cue's passages read with their vectors: the first two by id, no more
    assert read and all(len(pairs) <= 2 for pairs in read)
    assert [pid for pid, _ in read[0]] == first


async def _publish_three_notes(stages) -> None:
    await stages.publish("a", "Elin Berg met Tomás Ruiz in Lisbon.")
    await stages.publish("b", "Tomás Ruiz sailed from Lisbon to Porto.")
    await stages.publish("c", "Elin Berg stayed in Porto.")


def test_the_walks_batched_reads_equal_the_reads_one_at_a_time(redis_url):
    """entity_passage_vectors (an entity's first passages by id with their vectors, every
    entity in one command) and passages_entities read what entity_passages, passage_vectors
    and passage_entities read one at a time, on both stores; an unknown id reads empty."""

    async def main():
        stages = InProcess(redis_url, RulesExtractor())
        try:
            await _publish_three_notes(stages)
            memory, tenant = stages.memory, stages.tenant
            pids = sorted(await memory.scan_ids(tenant, "passages"))
            entities = sorted({eid for pid in pids for eid in await memory.passage_entities(tenant, pid)})
            asked = [*entities, "nobody"]
            batched = await memory.entity_passage_vectors(tenant, asked, 2)
            single = []
            for eid in asked:
                ids = await memory.entity_passages(tenant, eid, 2)
                single.append(list(zip(ids, await memory.passage_vectors(tenant, ids))))
            return (
                [[(pid, vec.tolist()) for pid, vec in pairs] for pairs in batched],
                [[(pid, vec.tolist()) for pid, vec in pairs] for pairs in single],
                await memory.passages_entities(tenant, [*pids, "missing"]),
                [await memory.passage_entities(tenant, pid) for pid in [*pids, "missing"]],
                entities,
            )
        finally:
            await stages.close()

    batched, single, entities_each, entities_one, entities = run(main())
    assert len(entities) >= 3 and any(len(pairs) == 2 for pairs in batched)
    assert batched == single and batched[-1] == []
    assert entities_each == entities_one and entities_each[-1] == []


def test_a_steps_reads_in_one_command_equal_the_reads_they_replace(redis_url):
    """read_passages (a step's passages, the entities they name with their names, and vectors)
    and facts_near_each (the cues' fact searches with each fact and vector) read what passages,
    passages_entities, entity_names, fact_vectors, passage_vectors, knn_each and facts read
    apart, on both stores — a passage whose entities are still a JSON list (a release before)
    and unknown ids included."""

    async def main():
        stages = InProcess(redis_url, RulesExtractor(), tau=1)
        try:
            await _publish_three_notes(stages)
            memory, tenant = stages.memory, stages.tenant
            pids = sorted(await memory.scan_ids(tenant, "passages"))
            if redis_url:  # one passage as a release before this one wrote it
                key = memory.keys(tenant).passage(pids[0])
                await memory.shard(tenant).hset(
                    key, "entities", json.dumps(await memory.passage_entities(tenant, pids[0]))
                )
            fids = sorted(await memory.scan_ids(tenant, "facts"))
            asked = [*pids, "missing"]
            tags = [("fact", fids[0]), ("passage", pids[1]), ("fact", "missing")]
            read = await memory.read_passages(tenant, asked, tags)
            entities = await memory.passages_entities(tenant, asked)
            apart = (
                await memory.passages(tenant, asked),
                entities,
                await memory.entity_names(tenant, [eid for ids in entities for eid in ids]),
                {
                    ("fact", fids[0]): (await memory.fact_vectors(tenant, [fids[0]]))[0].tolist(),
                    ("passage", pids[1]): (await memory.passage_vectors(tenant, [pids[1]]))[0].tolist(),
                },
            )
            together = (read.rows, read.entities, read.names, {tag: vec.tolist() for tag, vec in read.vectors.items()})
            vector = (await stages.embedder.embed(["Tomás Ruiz in Porto"]))[0]
            wheres = [None, {"head_id": entity_id("Tomás Ruiz")}, {"tail_id": "nobody"}]
            near = await memory.facts_near_each(tenant, vector, 3, ["head", "expires_at"], wheres, True)
            hits = await memory.knn_each(tenant, "facts", vector, 3, ["head", "expires_at"], wheres)
            searched = [
                [(h.id, round(h.score, 5), h.fields) for h in each] + [(await memory.facts(tenant, [h.id]))[0]]
                for each in hits
                for h in each[:1]
            ]
            found = [[(h.id, round(h.score, 5), h.fields) for h in each] + [each[0].fact] for each in near if each]
            vectors = [
                (h.vector.tolist(), (await memory.fact_vectors(tenant, [h.id]))[0].tolist())
                for each in near
                for h in each
            ]
            return together, apart, [len(each) for each in near], searched, found, vectors
        finally:
            await stages.close()

    together, apart, sizes, searched, found, vectors = run(main())
    assert together == apart
    assert together[0][-1] is None and together[1][-1] == [] and len(together[2]) >= 3
    assert sizes[0] == 3 and sizes[1] >= 1 and sizes[2] == 0
    assert found == searched
    assert vectors and all(got == held for got, held in vectors)


def test_an_entitys_facts_searched_by_the_entity_then_checked_are_its_live_ones(redis_url):
    """facts_near_each searches an entity's facts by the entity alone and checks their status
    (on Redis: knn_each_read's `checked`), running the whole filter's search only where a hit is
    not active: with the nearest of the entity's facts invalidated it answers what the whole
    filter's search answers — the live facts, nearest first — on both stores."""

    async def main():
        stages = InProcess(redis_url, RulesExtractor(), tau=1)
        try:
            await stages.publish("a", "Tomás Ruiz met Elin Berg in Lisbon.")
            await stages.publish("b", "Tomás Ruiz sailed from Lisbon to Porto.")
            await stages.publish("c", "Tomás Ruiz wrote to Ana Lima and Elin Berg.")
            memory, tenant = stages.memory, stages.tenant
            vector = (await stages.embedder.embed(["Tomás Ruiz met Elin Berg"]))[0]
            head = {"head_id": entity_id("Tomás Ruiz"), "status": "active"}
            before = await memory.facts_near_each(tenant, vector, 2, ["head"], [head], False)
            nearest = before[0][0].id
            pipe = memory.pipeline(tenant)
            memory.stage_fact_update(pipe, tenant, nearest, {"status": "invalid", "reason": "test"})
            await pipe.execute()
            after = await memory.facts_near_each(tenant, vector, 2, ["head"], [head], False)
            whole = await memory.knn_each(tenant, "facts", vector, 2, ["head"], [head])
            return before, nearest, after, whole
        finally:
            await stages.close()

    before, nearest, after, whole = run(main())
    assert len(before[0]) == 2 and all(h.fact.status == "active" for h in before[0])
    assert [h.id for h in after[0]] == [h.id for h in whole[0]]
    assert nearest not in [h.id for h in after[0]] and len(after[0]) == 2
    assert after[0][0].id == before[0][1].id  # the second nearest comes first now
    assert all(h.fact.status == "active" for h in after[0])


def test_a_large_tenants_own_index_ranks_an_entitys_passages_as_the_walk_did(stack_env):
    """Past its promotion a tenant's own passages index tags each passage by entity, and an
    entity cue's nearest passages are one search there (Memory.entity_passages_near) instead of
    its first ENTITY_PASSAGES_READ passages' vectors read and ranked here: where an entity is in
    fewer passages than that, the walk reads the same passages, in the same order, and answers
    the same. Passages written before (entities as a JSON list) are rewritten at promotion."""
    notes = [
        "Tomás Ruiz sailed from Lisbon to Porto with Elin Berg.",
        "Elin Berg keeps the harbour ledger in Porto.",
        "Tomás Ruiz wrote about the Lisbon storms in his ledger.",
        "The Porto harbour master is Ana Lima, who met Tomás Ruiz in Lisbon.",
        "Ana Lima and Elin Berg sailed the Douro together.",
    ]
    questions = ["Who sailed from Lisbon with Tomás Ruiz?", "What does Elin Berg keep in Porto?", "Who met Ana Lima?"]

    async def main():
        stages = InProcess(stack_env["MEMSTREAM_REDIS_URL"], RulesExtractor(), tau=1)
        memory = stages.memory
        try:
            for n, text in enumerate(notes):
                await stages.publish(f"note-{n}", text)
            pids = await memory.scan_ids(stages.tenant, "passages")
            # one passage as a release before this one wrote it: its entities a JSON list
            key = memory.keys(stages.tenant).passage(pids[0])
            before = await memory.passage_entities(stages.tenant, pids[0])
            await memory.redis.hset(key, "entities", json.dumps(before))

            async def walks() -> list:
                engine = QueryEngine(memory, stages.embedder)
                try:
                    return [
                        (await engine.answer(QueryRequest(q, stages.tenant, 3, "reconstruct"))).to_json()
                        for q in questions
                    ]
                finally:
                    engine.close()

            read_here = await walks()
            porto, vector = entity_id("Porto"), (await stages.embedder.embed(["Porto"]))[0]
            near = await memory.entity_passages_near(stages.tenant, vector, [porto], 3)
            await memory.promote_vectors(stages.tenant)
            read_vectors = memory.entity_passage_vectors
            reads: list = []

            async def counted(*args):
                reads.append(args)
                return await read_vectors(*args)

            memory.entity_passage_vectors = counted  # type: ignore[method-assign]
            ranked_there = await walks()
            assert reads == []  # every entity cue ranked by the index
            found = await memory.entity_passages_near(stages.tenant, vector, [porto, "nobody"], 10)
            with_vectors = (await memory.entity_passages_near(stages.tenant, vector, [porto], 10, True))[0]
            held = await memory.passage_vectors(stages.tenant, [h.id for h in with_vectors])
            # read with their vectors, the same rows (the vector read with the row's fields)
            assert [(h.id, h.row) for h in with_vectors] == [(h.id, h.row) for h in found[0]]
            assert [h.vector.tolist() for h in with_vectors] == [vec.tolist() for vec in held]
            naming = await memory.entity_passages(stages.tenant, porto)
            rewritten = await memory.redis.hget(key, "entities")
            return before, rewritten, near, read_here, ranked_there, found, naming
        finally:
            await stages.close()

    before, rewritten, near, read_here, ranked_there, found, naming = run(main())
    assert before and rewritten.decode() == ",".join(before)  # the JSON list rewritten comma-joined
    assert near is None  # before the promotion: no index ranks an entity's passages
    assert sorted(h.id for h in found[0]) == sorted(naming) and len(naming) >= 2 and found[1] == []
    assert [h.score for h in found[0]] == sorted((h.score for h in found[0]), reverse=True)

    def walked(answers):
        return [
            ([p["id"] for p in a["passages"]], [(s["cue"].get("id"), s["content"]["passages"]) for s in a["path"]])
            for a in answers
        ]

    assert walked(ranked_there) == walked(read_here)
    assert any(len(a["path"]) > 1 for a in read_here)  # the walks went past the first hop


class _PlacedEmbedder(inprocess.HashEmbedder):
    """Test double: the texts the test places get the vectors it gives; every other text the
    hash embedder's (near orthogonal to all in 384 dimensions)."""

    def __init__(self, placed: dict):
        self.placed = placed

    def embed(self, texts: list[str]):
        import numpy as np

        rows = super().embed(texts)
        for i, text in enumerate(texts):
            if text in self.placed:
                rows[i] = self.placed[text] / np.linalg.norm(self.placed[text])
        return rows


class _TaggingExtractor(ScriptedExtractor):
    """Test double: a scripted extractor that also reads a text's listed words as tags."""

    def __init__(self, tags: dict[str, list[str]]):
        super().__init__({text: [] for text in tags})
        self.tags = tags

    async def extract(self, text: str, context: str = ""):
        from topics.records import TAG_TYPE
        from workers.models.extraction import Entity, Extraction

        return Extraction([Entity("Mara Kellen", "PERSON"), *(Entity(t, TAG_TYPE) for t in self.tags[text])], [])


def test_a_query_naming_no_entity_takes_its_cues_from_the_nearest_names_not_the_nearer_tags():
    """A conversation's tags are entities: the three entities nearest a question that names none
    may all be tags, which are no cues; the nearest names at the cue threshold are still found."""
    import numpy as np

    question = "which plans did we keep for the weekend"
    turn = "Mara Kellen kept the weekend hiking plan."
    basis = np.eye(384, dtype=np.float32)
    placed = {question: basis[0], "Mara Kellen": basis[0] + 1.1 * basis[1]}  # cosine 0.67
    placed |= {tag: basis[0] + 0.2 * basis[2 + i] for i, tag in enumerate(["weekend", "hiking", "plan"])}  # 0.98

    async def main():
        from workers.models.embedding import BatchingEmbedder

        embedder = BatchingEmbedder(_PlacedEmbedder(placed))
        stages = InProcess(None, _TaggingExtractor({turn: ["weekend", "hiking", "plan"]}), embedder)
        try:
            await stages.publish("turn-0", turn)
            return await stages.query(question, top_k=3, mode="reconstruct")
        finally:
            await stages.close()

    answer = run(main())
    assert [(c["name"], c["from"]) for c in answer["cues"]["entities"]] == [("Mara Kellen", "entity-knn")]


def test_the_last_steps_cues_are_searched_only_where_the_walks_stop_depends_on_them(real_embedder):
    """A step after which the budget is spent opens no branch the walk could take: its new cues
    are recorded (the answer lists them) and their facts and passages not searched — unless the
    walk has nothing else open, where they decide whether it stops exhausted or out of budget
    (the next test)."""

    async def main():
        stages = await _memory(real_embedder)
        searched: list[dict] = []
        facts_near_each = stages.memory.facts_near_each

        async def counted(tenant, vector, k, return_fields, wheres, vectors=False):
            searched.extend(where for where in wheres if where)
            return await facts_near_each(tenant, vector, k, return_fields, wheres, vectors)

        stages.memory.facts_near_each = counted  # type: ignore[method-assign]
        try:
            return await stages.query(QUESTION, top_k=5, mode="reconstruct", budget={"steps": 2}), searched
        finally:
            await stages.close()

    two_steps, searched = run(main())
    assert two_steps["stopped"]["reason"] == "budget" and len(two_steps["path"]) == 2
    last = {c["id"] for c in two_steps["path"][-1]["new_cues"] if c["kind"] == "entity"}
    assert last and last <= {e["id"] for e in two_steps["entities"]}  # the last step made cues, listed …
    searched_entities = {where.get("head_id") or where.get("tail_id") for where in searched} - {None}
    assert searched_entities and not last & searched_entities  # … their facts never searched


def test_a_walk_that_ends_as_its_budget_is_spent_says_why_as_before(real_embedder):
    """The answer of a walk whose budget is spent by the step after which nothing is left to take
    is the answer of a larger budget, its stop reason ("exhausted") included: the last step's cues
    are searched to tell."""

    async def main():
        stages = InProcess(None, ScriptedExtractor(SCRIPT), real_embedder, tau=1)
        for i, text in enumerate([BOOK, BIRTH]):
            await stages.publish(f"doc-{i}", text)
        try:
            free = await stages.query(QUESTION, top_k=5, mode="reconstruct", budget={"steps": 32})
            tight = await stages.query(QUESTION, top_k=5, mode="reconstruct", budget={"steps": len(free["path"])})
            return free, tight
        finally:
            await stages.close()

    free, tight = run(main())
    assert free["stopped"]["reason"] == "exhausted" and len(free["path"]) == 2
    assert tight["path"][-1]["new_cues"]  # the last step made a cue: the one the walk must search to say why
    assert {k: v for k, v in tight.items() if k not in ("budget", "timings_ms")} == {
        k: v for k, v in free.items() if k not in ("budget", "timings_ms")
    }


def test_the_first_stage_starts_once_the_querys_cues_are_known(real_embedder):
    """Redis answers one command at a time: the walk looks its cues up first (one round trip:
    the mentions' canonical ids with their names), then starts the first stage's searches, which
    ran beside the lookup and made it wait. The entities nearest the query are searched only
    where no mention is a cue (then after the lookup); they were searched with every lookup. A lookup that fails starts no first stage (and leaves no coroutine unawaited)."""

    async def main():
        stages = await _memory(real_embedder)
        calls: list[str] = []
        memory = stages.memory
        for name in ("canonical_names", "lexical", "knn"):
            original = getattr(memory, name)

            def logged(*args, _original=original, _name=name, **kwargs):
                calls.append(f"knn:{args[1]}" if _name == "knn" else _name)
                return _original(*args, **kwargs)

            setattr(memory, name, logged)
        try:
            seen = []
            for question in (QUESTION, "Where was the poet Quillon Drabe born?"):
                answer = await stages.query(question, top_k=5, mode="reconstruct")
                seen.append((list(calls), {cue["from"] for cue in answer["cues"]["entities"]}))
                calls.clear()

            async def unreachable(*args, **kwargs):
                raise ConnectionError("the memory went away")

            memory.canonical_names = unreachable  # type: ignore[method-assign]
            with pytest.raises(ConnectionError), warnings.catch_warnings():
                warnings.simplefilter("error")  # a first stage made and never awaited warns
                await stages.query(QUESTION + " ", top_k=5, mode="reconstruct")
                gc.collect()
            return seen, list(calls)
        finally:
            await stages.close()

    ((named, named_origins), (unknown, _)), failed = run(main())
    assert named[0] == "canonical_names" and "lexical" in named  # the cues' names, then the first stage
    assert "knn:entities" not in named and "entity-knn" not in named_origins  # a mention is a cue
    # no mention names an entity of the memory: the nearest entities, once the lookup says so
    assert unknown.index("canonical_names") < unknown.index("knn:entities") and "lexical" in unknown
    assert failed == []  # the lookup failed first: no first stage ran
