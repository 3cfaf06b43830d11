"""Time as a cue (workers.algorithms.time_cue): what a question says about time, which turns
meet it, and the graph modes ranking those turns higher (RetrievalParams.time_weight). The
stages run in process (tests.inprocess, InMemoryStore) with the real embedder."""

from __future__ import annotations

import asyncio
from datetime import datetime, timezone

from tests import inprocess
from tests.inprocess import InProcess
from workers.algorithms.time_cue import Period, matches, says_when, time_boost, time_cue
from workers.models.extraction import RulesExtractor

real_embedder = inprocess.real_embedder  # the fixture, for this module's tests


def _ts(year: int, month: int, day: int) -> float:
    return datetime(year, month, day, 12, tzinfo=timezone.utc).timestamp()


def test_a_question_asks_when_or_names_a_period():
    assert time_cue("When did Caroline go to the support group?").asks_when
    assert time_cue("How long ago was Caroline's 18th birthday?").asks_when
    assert time_cue("In which year did Jon open his studio?").asks_when
    assert not time_cue("What is Caroline's identity?")  # no cue at all: falsy
    assert time_cue("What did Caroline do in May 2023?").periods == (Period(2023, 5),)
    assert time_cue("When did Melanie go camping in June?").periods == (Period(None, 6),)
    assert time_cue("Where did Jon travel in 2022?").periods == (Period(2022, None),)
    assert not time_cue("What may Jon bring to the party?")  # the verb, not the month


def test_a_turn_meets_a_cue_by_what_it_says_or_when_it_was_said():
    assert says_when("I went to a support group yesterday.") and says_when("We went camping last weekend.")
    assert says_when("That was three years ago.") and says_when("I started painting in 2016.")
    assert not says_when("I love painting sunsets.")
    when = time_cue("When did Melanie go camping?")
    assert matches(when, "We slept in a tent last weekend.", _ts(2023, 6, 27))
    assert not matches(when, "Camping is the best.", _ts(2023, 6, 27))
    june = time_cue("What did Melanie do in June?")
    assert matches(june, "We went camping.", _ts(2023, 6, 27))  # said in June
    assert matches(june, "Back in June we went camping.", _ts(2023, 8, 1))  # names June
    assert not matches(june, "We went camping.", _ts(2023, 7, 3))
    # a passage without a time is no turn: a document's dates are about its subject
    assert not matches(when, "Tesla was born on 10 July 1856.", None)


def test_matched_passages_are_raised_and_the_rest_keep_their_order():
    scores = [("a", 0.5), ("b", 0.34), ("c", 0.25)]
    assert time_boost(scores, {"c"}, 1.0) == [("a", 0.5), ("c", 0.5), ("b", 0.34)]
    assert time_boost(scores, {"c"}, 0.0) == scores


# A session of one conversation: the turn that answers "when" shares no word with the question
# but says "yesterday"; the turn that shares its words says nothing of time.
SESSION = [
    ("Melanie", "Camping is my favourite thing, I go camping with the kids whenever I can."),
    ("Caroline", "That sounds lovely, the kids must enjoy it."),
    ("Melanie", "We drove to the lake yesterday and slept in a tent under the stars."),
    ("Caroline", "The museum opened a new dinosaur exhibit."),
    ("Melanie", "I signed up for a pottery class."),
    ("Caroline", "My cat sleeps all day on the windowsill."),
]


async def _ask(embedder, question: str, mode: str, params: dict) -> list[str]:
    stages = InProcess(None, RulesExtractor(), embedder)
    try:
        for turn, (speaker, text) in enumerate(SESSION, 1):
            await stages.publish(f"D1:{turn}", text, session_id="D1", turn=turn, speaker=speaker, ts=_ts(2023, 6, 27))
        answer = await stages.query(question, mode=mode, top_k=3, params=params)
        return [p["doc_id"] for p in answer["passages"]]
    finally:
        await stages.close()


def test_a_when_question_ranks_the_turn_that_says_when_first(real_embedder):
    """Fails without the time cue (time_weight 0, as before it existed): the turn sharing the
    question's words ranks first, the one that says when is second."""
    question = "When did Melanie go camping?"
    for mode in ("ppr", "reconstruct"):
        assert asyncio.run(_ask(real_embedder, question, mode, {}))[0] == "D1:3", mode
        assert asyncio.run(_ask(real_embedder, question, mode, {"time_weight": 0.0}))[0] == "D1:1", mode
    # hybrid is the first stage alone: no cue
    assert asyncio.run(_ask(real_embedder, question, "hybrid", {}))[0] == "D1:1"
