"""Fact categories without an LLM: the `rules` extractor's categories on conversation turns of
each kind (workers.algorithms.categories), the facts tied to the passage of their turn through
the stages in process, rejections and failures that never compete in a conflict group, and the
LLM extractor's prompt carrying a turn's context line apart from its text."""

import asyncio

import pytest

from tests.inprocess import InProcess
from topics.records import CATEGORY_PRECEDENCE, VALUE_TYPES
from workers.algorithms import categories
from workers.algorithms.turns import turn_context, when_of
from workers.models.extraction import LLMExtractor, RulesExtractor
from workers.models.prompts import EXTRACTION_CONTEXT_NOTE, extraction_messages, passage_fence

TS = 1748854800.0  # 2 June 2025 09:00 UTC
ANA = turn_context("Ana", when_of(ts=TS))
AGENT = turn_context("travel_agent", when_of(ts=TS + 60))
TOOL = turn_context("hotel_booking", when_of(ts=TS + 120))

BUDGET = "Our budget is 3,000 USD for flights and hotel together, and the total must not exceed that."
REFUSAL = "We won't transit through Miami because Luis and Sofia have no US visa."
CONFLICT = 'reserve(hotel="Hotel Gran Via", nights=7) returned HTTP 409 Conflict: {"error": "ROOM_UNAVAILABLE"}'
EXCEPTION = "The call to the Iberia fares API raised ConnectionRefusedError after three retries."
PLAIN = "Madrid is hot in July and the Prado opens at 10."


def triples(extraction):
    return {(f.head, f.relation, f.tail, f.category) for f in extraction.facts}


def test_a_budget_constraint_is_the_speakers_hard_constraint():
    extraction = RulesExtractor().extract_sync(BUDGET, ANA)
    assert triples(extraction) == {("Ana", "must not exceed", "3,000 USD", "HARD_CONSTRAINT")}
    fact = extraction.facts[0]
    assert (fact.head_type, fact.tail_type) == ("SPEAKER", "MONEY")
    assert {e.name for e in extraction.entities} >= {"Ana", "3,000 USD"}


def test_a_refusal_with_its_reason_is_a_rejected_option_and_every_fact_of_it_too():
    extraction = RulesExtractor().extract_sync(REFUSAL, ANA)
    facts = triples(extraction)
    assert ("Ana", "rejected", "Miami", "REJECTED_OPTION") in facts
    # the neighbour facts of the sentence (the reason) carry its category
    assert len(facts) > 1 and {f[3] for f in facts} == {"REJECTED_OPTION"}
    assert "Luis and Sofia" in {f[0] for f in facts} | {f[2] for f in facts}


def test_an_http_409_with_an_error_code_is_a_tool_failure_of_the_tool():
    extraction = RulesExtractor().extract_sync(CONFLICT, TOOL)
    facts = triples(extraction)
    assert ("hotel_booking", "failed with", "ROOM_UNAVAILABLE", "TOOL_FAILURE") in facts
    assert {f[3] for f in facts} == {"TOOL_FAILURE"}
    # without an error code, the HTTP status is what the failure is reported with
    bare = RulesExtractor().extract_sync("The reservation call returned HTTP 409 Conflict.", TOOL)
    assert ("hotel_booking", "failed with", "HTTP 409", "TOOL_FAILURE") in triples(bare)


def test_an_exception_name_is_a_tool_failure():
    """The tool the agent names as what raised heads the failure (the agent only reports it)."""
    facts = triples(RulesExtractor().extract_sync(EXCEPTION, AGENT))
    assert ("Iberia fares API", "failed with", "ConnectionRefusedError", "TOOL_FAILURE") in facts
    assert {f[3] for f in facts} == {"TOOL_FAILURE"}
    assert categories.classify("fares_api timed out after 30 s").category == "TOOL_FAILURE"
    assert categories.classify("It raised TimeoutError.").object == "TimeoutError"


def test_a_plain_turn_is_declarative_and_gains_no_speaker_fact():
    with_context = RulesExtractor().extract_sync(PLAIN, ANA)
    assert with_context == RulesExtractor().extract_sync(PLAIN)
    assert with_context.facts and {f.category for f in with_context.facts} == {"DECLARATIVE"}
    assert "Ana" not in {e.name for e in with_context.entities}


def test_precedence_failure_over_rejection_over_constraint():
    assert CATEGORY_PRECEDENCE == ("TOOL_FAILURE", "REJECTED_OPTION", "HARD_CONSTRAINT", "DECLARATIVE")
    assert (
        categories.classify("We rejected the quote because the API failed with RATE_LIMITED.").category
        == "TOOL_FAILURE"
    )
    assert (
        categories.classify("Miami is not an option because the total must stay under 3,000 USD.").category
        == "REJECTED_OPTION"
    )
    assert categories.classify("No red-eye flights, please.").object == "red-eye flights"
    assert categories.classify("Flights must be direct.").relation == "must be"


INFERENCES_AND_CHEERS = [  # said in the LoCoMo dev conversations: no rule among them
    "Wow, Jon, you must be so excited!",
    "That must have been awesome.",
    "Must have been traumatizing for you guys.",
    "It must be scary stepping into the unknown but I know you can do it, Jon.",
    "They must have felt so appreciated.",
    "That must feel great!",
    "I'll never forget the day my youngest took her first steps.",
    "Nope, never been to something like that.",
    "I've gone camping a few times but never tried mountain climbing.",
    "Keep going and never give up!",
    "You never know the difference a kind gesture makes.",
]
RULES = [  # and rules that read like them
    ("Flights must be direct.", "must be"),
    ("The report must be very short.", "must be"),
    ("The mattress must be hard.", "must be"),
    ("Rooms must have attached bathrooms.", "must have"),
    ("Applicants must have completed the course.", "must have"),
    ("I'd never fly Ryanair.", "never fly"),
    ("Let's never book Ryanair.", "never book"),
    ("The hotel must be under 200 EUR a night.", "must be"),
    ("You must be 18 or older.", "must be"),
    ("The room must have a sea view.", "must have"),
    ("We must arrive by 9 am.", "must arrive"),
    ("I never fly Ryanair.", "never fly"),
    ("We never take red-eye flights.", "never take"),
]


def test_a_must_that_infers_and_a_never_that_tells_an_experience_state_no_constraint():
    """ "must" that infers ("you must be so excited") and "never" that tells an experience or
    cheers ("never been", "never give up") are no hard constraints: in the LoCoMo dev
    conversations they were 45 of the rules extractor's 45 ("Gina — must be — Jon"). Rules
    stay rules."""
    for sentence in INFERENCES_AND_CHEERS:
        assert categories.classify(sentence) is None, sentence
        facts = RulesExtractor().extract_sync(sentence, "Gina (4:04 pm on 20 January, 2023):").facts
        assert all(f.category == "DECLARATIVE" for f in facts), (sentence, facts)
    for sentence, relation in RULES:
        finding = categories.classify(sentence)
        assert finding is not None and (finding.category, finding.relation) == ("HARD_CONSTRAINT", relation), sentence


PROMISES_AND_EXCLAMATIONS = [  # said in the LoCoMo dev conversations: no option refused among them
    "Gina, you won't believe it - I got mentored by this amazing business dude yesterday!",
    "I won't forget that.",
    "I won't give up, Gina!",
    "I won't quit - your words motivate me to keep going!",
    "I won't quit on my dreams.",
    "I won't quit, no matter what.",
    "I won't let you down!",
    "Don't worry, I won't let anything get me down.",
    "Trust me, you won't regret it.",
]
PROMISES_WORDED_OTHERWISE = [
    "I won't ever forget that.",
    "You won't even believe it!",
    "I won’t let y’all down.",
    "I won't let this setback get me down.",
    "I won't give up so easily.",
    "They would not believe the quote.",
]
REFUSALS = [  # and refusals that read like them
    "We won't transit through Miami.",
    "I won't fly Ryanair.",
    "I won't give up my window seat.",
    "I won't quit my job for this trip.",
    "I won't give up sugar.",
    "I won't give up that seat.",
    "We won't quit the tour.",
    "I won't let them go.",
    "We won't let the kids go alone.",
    "They would not believe the quote, so they rejected it.",
]


def test_a_promise_or_an_exclamation_with_wont_refuses_no_option():
    """ "you won't believe it", "I won't forget", "I won't give up / quit", "I won't let you down"
    promise or exclaim: 12 of the rules extractor's 13 REJECTED_OPTION facts on the LoCoMo dev
    turns were such sentences, and an agent is shown a rejected option as one it must not offer
    again. "won't" with a thing refused ("won't fly Ryanair", "won't give up my seat") still
    refuses it."""
    for sentence in PROMISES_AND_EXCLAMATIONS + PROMISES_WORDED_OTHERWISE:
        assert categories.classify(sentence) is None, sentence
        facts = RulesExtractor().extract_sync(sentence, "Jon (4:04 pm on 20 January, 2023):").facts
        assert all(f.category == "DECLARATIVE" for f in facts), (sentence, facts)
    for sentence in REFUSALS:
        finding = categories.classify(sentence)
        assert finding is not None and finding.category == "REJECTED_OPTION", sentence


def test_a_person_who_failed_something_reports_no_tool_failure():
    """ "I failed the military aptitude test" (the LoCoMo dev turns' one TOOL_FAILURE) and "she
    failed her exam" are a person's, not a tool's; a failure without an object, or "failed to",
    still is one."""
    for sentence in (
        "Especially after I failed the military aptitude test recently, I've been feeling a bit stressed out.",
        "She failed her driving test twice.",
        "We failed the audit last year.",
        "I've just failed the exam.",
        "I also failed the test.",
        "She's failing her classes.",
    ):
        assert categories.classify(sentence) is None, sentence
    for sentence in (
        "I failed to book the hotel.",
        "The payment failed.",
        "hotel_booking failed the request with a timeout.",
        "Sadly I failed.",
        "They failed the request with a timeout.",  # "they" may be a service
        "The server is failing the health checks.",
    ):
        assert categories.classify(sentence).category == "TOOL_FAILURE", sentence


def test_prose_keeps_its_facts_and_titles_are_no_cues():
    """Wikipedia-like prose: a cue word changes the category of a sentence's facts, never the
    facts; a capitalised cue word inside a sentence is a title; 'declined' as a decrease is no refusal."""
    prose = "The album by Nirvana failed to reach the Billboard Hot 100 in 1998."
    categorised = RulesExtractor().extract_sync(prose)
    plain = RulesExtractor().extract_sync(prose.replace("failed to reach", "went up to"))
    assert [(f.head, f.tail) for f in categorised.facts] == [(f.head, f.tail) for f in plain.facts]
    assert {f.category for f in categorised.facts} == {"TOOL_FAILURE"}
    assert categories.classify("The Devil's Rejects is a 2005 American horror film.") is None
    assert categories.classify('"When Flanders Failed" is the third episode of the third season.') is None
    assert categories.classify("The population declined to 3,000 in 1990.") is None
    assert categories.classify("He declined to comment.").category == "REJECTED_OPTION"


# ---- through the stages, in process -------------------------------------------------------------
TURNS = [
    ("t1", "Ana", BUDGET),
    ("t2", "Ana", REFUSAL),
    ("t3", "hotel_booking", CONFLICT),
    ("t4", "travel_agent", EXCEPTION),
    ("t5", "Ana", PLAIN),
]


async def _index_turns(turns):
    ip = InProcess(None, RulesExtractor(), schema_filter=False)
    try:
        for number, (turn_id, speaker, text) in enumerate(turns, 1):
            await ip.publish(
                f"s1:{turn_id}",
                text,
                session_id="s1",
                turn=number,
                speaker=speaker,
                ts=TS + 60 * number,
                metadata={"turn_id": turn_id},
            )
        facts = await ip.facts()
        ids = sorted({pid for f in facts.values() for pid in f.passage_ids})
        passages = {pid: p for pid, p in zip(ids, await ip.memory.passages(ip.tenant, ids))}
        return facts, passages, ip.dead_letters()
    finally:
        await ip.close()


def test_each_fact_is_tied_to_the_passage_of_its_turn():
    facts, passages, dead = asyncio.run(_index_turns(TURNS))
    assert not dead
    by_turn: dict[str, set] = {}
    for fact in facts.values():
        assert len(fact.passage_ids) == 1
        passage = passages[fact.passage_ids[0]]
        by_turn.setdefault(passage["doc_id"].split(":")[1], set()).add(
            (fact.head, fact.relation, fact.tail, fact.category)
        )
        assert passage["text"] == dict((t, text) for t, _, text in TURNS)[passage["doc_id"].split(":")[1]]
    # the stage normalises relations (workers.algorithms.normalize.relation_name)
    assert ("Ana", "must not exceed", "3,000 USD", "HARD_CONSTRAINT") in by_turn["t1"]
    assert ("Ana", "reject", "Miami", "REJECTED_OPTION") in by_turn["t2"]
    assert ("hotel_booking", "fail with", "ROOM_UNAVAILABLE", "TOOL_FAILURE") in by_turn["t3"]
    assert ("Iberia fares API", "fail with", "ConnectionRefusedError", "TOOL_FAILURE") in by_turn["t4"]
    assert {f[3] for f in by_turn["t5"]} == {"DECLARATIVE"}
    assert all(f.status == "active" for f in facts.values())


def test_a_speaker_rejecting_two_options_keeps_both():
    """Rejections never compete for a single value: as one (Ana, reject) group with two tails,
    the conflict policy kept one refusal and invalidated the other."""
    turns = [
        ("t1", "Ana", "We won't transit through Miami."),
        ("t2", "Ana", "We won't transit through Houston either."),
    ]
    facts, _, dead = asyncio.run(_index_turns(turns))
    assert not dead
    refusals = {(f.head, f.tail): f.status for f in facts.values() if f.category == "REJECTED_OPTION"}
    assert refusals == {("Ana", "Miami"): "active", ("Ana", "Houston"): "active"}


def test_a_stated_constraint_refusal_or_failure_is_admitted_when_said_once_the_rest_waits_for_tau():
    """τ = 2: a schema seen in one passage parks its facts as pending. The budget, the refusal and
    the tool failure as stated (the trigger facts) are active at once
    (workers.algorithms.policy.needs_no_tau); the facts that only share their sentences, and the
    plain turn's, still wait for a second passage."""

    async def run():
        ip = InProcess(None, RulesExtractor(), tau=2)
        try:
            for number, (turn_id, speaker, text) in enumerate(TURNS, 1):
                await ip.publish(
                    f"s1:{turn_id}", text, session_id="s1", turn=number, speaker=speaker, ts=TS + 60 * number
                )
            return await ip.facts(), ip.events(), ip.dead_letters()
        finally:
            await ip.close()

    facts, events, dead = asyncio.run(run())
    assert not dead
    status = {(f.head, f.relation, f.tail): f.status for f in facts.values()}
    stated = {
        ("Ana", "must not exceed", "3,000 USD"),
        ("Ana", "reject", "Miami"),
        ("hotel_booking", "fail with", "ROOM_UNAVAILABLE"),
        ("Iberia fares API", "fail with", "ConnectionRefusedError"),
    }
    assert {status[triple] for triple in stated} == {"active"}
    others = {triple: s for triple, s in status.items() if triple not in stated}
    assert others and set(others.values()) == {"pending"}  # sentence neighbours of any category, and the plain turn
    assert {e["fact_id"] for e in events if e["event"] == "activated"} == {
        f.id for f in facts.values() if (f.head, f.relation, f.tail) in stated
    }


def test_the_llm_extractors_categorised_facts_are_stated():
    from workers.models.extraction import parse_extraction

    fact = {
        "head": "Ana",
        "head_type": "PERSON",
        "relation": "rejected",
        "tail": "Miami",
        "tail_type": "LOCATION",
        "valid_from": None,
        "valid_to": None,
    }
    parsed = parse_extraction(
        {
            "entities": [],
            "facts": [
                {**fact, "category": "REJECTED_OPTION"},
                {**fact, "relation": "visited", "category": "DECLARATIVE"},
            ],
        }
    )
    assert [(f.category, f.stated) for f in parsed.facts] == [("REJECTED_OPTION", True), ("DECLARATIVE", False)]


# ---- the LLM extractor's prompt ---------------------------------------------------------------------
class RecordingChat:
    """Test double of a ChatModel: records the messages, answers with no entities and no facts."""

    def __init__(self):
        self.messages = []

    async def structured(self, stage, messages, schema_name, schema, validate):
        self.messages.append(messages)
        return validate({"entities": [], "facts": []})


def test_the_llm_prompt_carries_the_context_line_apart_from_the_text():
    chat = RecordingChat()
    asyncio.run(LLMExtractor(chat).extract(REFUSAL, ANA))
    (messages,) = chat.messages
    user = messages[-1]["content"]
    assert ANA in user and EXTRACTION_CONTEXT_NOTE in user
    # the passage block holds the text alone; the context line precedes it
    fence = passage_fence(REFUSAL, ANA)
    block = f"{fence} BEGIN PASSAGE {fence}\n{REFUSAL}\n{fence} END PASSAGE {fence}"
    assert block in user and user.index(ANA) < user.index(block)
    # a plain document's messages are those without a context (the LLM cache keeps its answers)
    assert extraction_messages(PLAIN, "") == extraction_messages(PLAIN)
    assert EXTRACTION_CONTEXT_NOTE not in extraction_messages(PLAIN)[-1]["content"]


# ---- one triple said with two categories: the most specific stays ----------------------------


def test_the_cues_are_in_the_contracts_precedence():
    assert tuple(dict.fromkeys(cue.category for cue in categories.CUES)) + ("DECLARATIVE",) == CATEGORY_PRECEDENCE


async def _said_twice(redis_url: str | None, first: str, second: str):
    """The same triple from two turns, in the categories `first` then `second` (the second
    delivered twice): the fact as it ends."""
    from tests.test_expiry import CategoryExtractor, PrefixEmbedder

    script = {f"turn {n}": [("Ana", "rejected", "Miami", category)] for n, category in enumerate((first, second))}
    stages = InProcess(redis_url, CategoryExtractor(script), PrefixEmbedder(), tau=1)
    try:
        await stages.publish("d0", "turn 0")
        await stages.publish("d1", "turn 1")
        await stages.publish("d1", "turn 1")
        [fact] = (await stages.facts()).values()
        return fact
    finally:
        await stages.close()


PAIRS = [
    ("REJECTED_OPTION", "DECLARATIVE"),
    ("HARD_CONSTRAINT", "DECLARATIVE"),
    ("TOOL_FAILURE", "DECLARATIVE"),
    ("TOOL_FAILURE", "REJECTED_OPTION"),
    ("REJECTED_OPTION", "HARD_CONSTRAINT"),
]


@pytest.mark.parametrize("specific,plain", PAIRS)
@pytest.mark.parametrize("specific_first", [True, False])
def test_a_plain_re_mention_keeps_the_most_specific_category_in_memory(specific, plain, specific_first):
    order = (specific, plain) if specific_first else (plain, specific)
    fact = asyncio.run(_said_twice(None, *order))
    assert (fact.category, fact.status, len(fact.passage_ids)) == (specific, "active", 2)


@pytest.mark.parametrize("specific_first", [True, False])
def test_a_plain_re_mention_keeps_the_most_specific_category_in_redis(stack_env, specific_first):
    order = ("REJECTED_OPTION", "DECLARATIVE") if specific_first else ("DECLARATIVE", "REJECTED_OPTION")
    fact = asyncio.run(_said_twice(stack_env["MEMSTREAM_REDIS_URL"], *order))
    assert (fact.category, fact.status, len(fact.passage_ids)) == ("REJECTED_OPTION", "active", 2)


def test_values_are_no_nodes_a_walk_passes_through():
    """A constraint's amount and a deadline stay their facts' tails, active, but the graph has no
    edge to them — passage, fact or type — so no walk passes through "3,000 USD" to every passage
    naming the same sum (before: "3", "000", "3,000 USD" each joined to the passage)."""

    async def run():
        ip = InProcess(None, RulesExtractor(), schema_filter=False)
        try:
            await ip.publish("s1:t1", BUDGET, session_id="s1", turn=1, speaker="Ana", ts=TS)
            await ip.publish(
                "s1:t2",
                "The deposit must arrive no later than 8 September.",
                session_id="s1",
                turn=2,
                speaker="Ana",
                ts=TS + 60,
            )
            facts = await ip.facts()
            nodes = await ip.memory.adjacency_nodes(ip.tenant)
            edges = [edge async for batch in ip.memory.adjacency(ip.tenant, nodes) for edge in batch]
            entity_ids = sorted({n[2:] for e in edges for n in (e.a, e.b) if n.startswith("e:")})
            types = {eid: row["type"] for eid, row in (await ip.memory.entity_names(ip.tenant, entity_ids)).items()}
            return facts, edges, types
        finally:
            await ip.close()

    facts, edges, types = asyncio.run(run())
    stated = {(f.head, f.relation, f.tail): f for f in facts.values()}
    assert stated[("Ana", "must not exceed", "3,000 USD")].status == "active"
    assert stated[("Ana", "no later than", "8 September")].status == "active", sorted(stated)
    assert edges and types, "the turns made no graph at all"
    walked_values = {eid: kind for eid, kind in types.items() if kind in VALUE_TYPES}
    assert walked_values == {}, f"values with edges: {walked_values}"
