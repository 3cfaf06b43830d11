"""Optional answer generation over retrieved passages, with citations, through the
OpenAI-compatible chat client (structured output). A citation must be the id of a passage the
answer was given: any other (a model that invents an id, or one a passage told it to cite) is
dropped, counted, and named in the answer's `dropped_citations`."""

from __future__ import annotations

import logging
from typing import Sequence

from workers import metrics
from workers.models.prompts import ANSWER_SCHEMA, answer_messages
from workers.models.protocols import ChatModel
from workers.query.answers import Answer, Passage

log = logging.getLogger(__name__)


async def generate_answer(llm: ChatModel, question: str, passages: Sequence[Passage]) -> Answer:
    """The answer, its citations (ids of given passages) and the other ids the model cited."""
    ids = {p.id for p in passages}

    def validate(parsed) -> Answer:
        if (
            not isinstance(parsed, dict)
            or not isinstance(parsed.get("answer"), str)
            or not isinstance(parsed.get("citations"), list)
            or not all(isinstance(c, str) for c in parsed["citations"])
        ):
            raise ValueError("expected an object with 'answer' (string) and 'citations' (list of passage ids)")
        cited = list(dict.fromkeys(parsed["citations"]))
        return Answer(
            text=parsed["answer"],
            citations=[c for c in cited if c in ids],
            dropped_citations=[c for c in cited if c not in ids],
        )

    context = [{"id": p.id, "text": p.text} for p in passages]
    answer: Answer = await llm.structured(
        "answer", answer_messages(question, context), "answer", ANSWER_SCHEMA, validate
    )
    if answer.dropped_citations:
        metrics.DROPPED_CITATIONS.inc(len(answer.dropped_citations))
        log.warning(
            "answer: citations %s are not passages of its context; dropped",
            [c[:40] for c in answer.dropped_citations],
        )
    return answer
