"""Optional answer generation over retrieved passages, with citations, through the
OpenAI-compatible chat client (structured output; citations must name given passages)."""

from __future__ import annotations

from workers.models.prompts import ANSWER_SCHEMA, answer_messages
from workers.models.protocols import ChatModel


async def generate_answer(llm: ChatModel, question: str, passages: list[dict]) -> dict:
    ids = {p["id"] for p in passages}

    def validate(parsed):
        if not isinstance(parsed, dict) or not isinstance(parsed.get("answer"), str) or not isinstance(parsed.get("citations"), list):
            raise ValueError("expected an object with 'answer' (string) and 'citations' (list of passage ids)")
        unknown = [c for c in parsed["citations"] if c not in ids]
        if unknown:
            raise ValueError(f"citations {unknown} are not among the given passages")
        return {"text": parsed["answer"], "citations": list(dict.fromkeys(parsed["citations"]))}

    return await llm.structured("answer", answer_messages(question, passages), "answer", ANSWER_SCHEMA, validate)
