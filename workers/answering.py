"""Optional answer generation over retrieved passages, with citations, through the
OpenAI-compatible chat client (structured output; citations must name given passages)."""

from __future__ import annotations

from workers.llm import LLMClient

ANSWER_PROMPT = ("Answer the question from the numbered passages only. Cite the ids of the passages the answer rests on. "
                 "If the passages do not contain the answer, say so and cite nothing.")
ANSWER_SCHEMA = {
    "type": "object",
    "properties": {"answer": {"type": "string"}, "citations": {"type": "array", "items": {"type": "string"}}},
    "required": ["answer", "citations"],
    "additionalProperties": False,
}


async def generate_answer(llm: LLMClient, question: str, passages: list[dict]) -> dict:
    ids = {p["id"] for p in passages}
    context = "\n\n".join(f"[{p['id']}] {p['text']}" for p in passages)

    def validate(parsed):
        if not isinstance(parsed, dict) or not isinstance(parsed.get("answer"), str) or not isinstance(parsed.get("citations"), list):
            raise ValueError("expected an object with 'answer' (string) and 'citations' (list of passage ids)")
        unknown = [c for c in parsed["citations"] if c not in ids]
        if unknown:
            raise ValueError(f"citations {unknown} are not among the given passages")
        return {"text": parsed["answer"], "citations": list(dict.fromkeys(parsed["citations"]))}

    messages = [{"role": "system", "content": ANSWER_PROMPT}, {"role": "user", "content": f"{context}\n\nQuestion: {question}"}]
    return await llm.structured("answer", messages, "answer", ANSWER_SCHEMA, validate)
