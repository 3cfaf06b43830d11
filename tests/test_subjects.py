"""Documents link to their subject: a document's title is the subject entity
every passage of it holds, so a passage of another document naming that entity shares a node
with it — the hyperlink structure of a Wikipedia-style or notes corpus, without an LLM
(workers.algorithms.subjects). Published as a producer would (the JSON contract), read back
through the export and the query engine."""

import asyncio
import json

from store.nodes import entity_node, node_id
from tests import inprocess
from tests.inprocess import InProcess
from topics import Chunk, Document, decode, document_key
from workers.algorithms.normalize import entity_id
from workers.algorithms.subjects import subject_name, titled_chunk_id
from workers.models.extraction import RulesExtractor

real_embedder = inprocess.real_embedder  # the fixture, for this module's tests


def run(coro):
    return asyncio.run(coro)


# the lighthouse's own page never names it: only its title says what it is about
LIGHTHOUSE = "The tower stands on a granite reef at the northern cape and was first lit in 1858."
KARL = "Karl Olsen was an engineer who restored the Varn Lighthouse in 1990."
MUSEUM = "The museum restored a lighthouse lens from the old fleet."


async def _publish(stages: InProcess, doc_id: str, text: str, title: str | None = None, version: int = 1) -> None:
    """As a producer in any language publishes: JSON under the key tenant/doc id."""
    body = {"v": 1, "tenant": stages.tenant, "doc_id": doc_id, "text": text, "version": version}
    if title is not None:
        body["title"] = title
    await stages.deliver(Document.TOPIC, document_key(stages.tenant, doc_id).encode(), json.dumps(body).encode())


async def _linked_documents(stages: InProcess, name: str) -> set[str]:
    """The documents whose current passages the entity `name` is joined to (passage edges of
    the exported graph)."""
    node = entity_node(entity_id(name))
    passages = [
        node_id(e["source"] if e["target"] == node else e["target"])
        for e in (await stages.export())["edges"]
        if e["kind"] == "passage" and node in (e["source"], e["target"])
    ]
    owners = await stages.memory.passage_documents(stages.tenant, passages)
    states = await stages.memory.passage_states(stages.tenant, passages)
    return {doc for docs, state in zip(owners, states) if not state.retired for doc in docs}


def test_subject_names_drop_a_trailing_qualifier():
    assert subject_name("The Prestige (film)") == "The Prestige"
    assert subject_name("  Leland,  North Carolina ") == "Leland, North Carolina"
    assert subject_name("(1998)") == "(1998)"  # nothing left without it: kept whole
    assert subject_name(None) == subject_name("") == subject_name(" ... ") == ""
    # a passage id is of its subject and text: the same words under two titles are two passages
    assert titled_chunk_id("Varn Lighthouse", LIGHTHOUSE) != titled_chunk_id("Skaw Lighthouse", LIGHTHOUSE)


def test_messages_without_a_title_or_subject_still_decode():
    doc = decode(Document, json.dumps({"v": 1, "tenant": "t", "doc_id": "d", "text": "x"}).encode())
    assert doc.title is None
    chunk = {"v": 1, "tenant": "t", "chunk_id": "c", "doc_id": "d", "seq": 0, "n_chunks": 1, "text": "x"}
    assert decode(Chunk, json.dumps(chunk).encode()).subject == ""


def test_a_passage_naming_another_documents_title_is_linked_to_it():
    """Before: the lighthouse's page held no entity (its text names nothing), so the passage of
    Karl Olsen's page that names the Varn Lighthouse reached no other document."""

    async def scenario():
        stages = InProcess(None, RulesExtractor(), tau=1)
        try:
            await _publish(stages, "karl", KARL, "Karl Olsen")
            await _publish(stages, "lighthouse", LIGHTHOUSE, "Varn Lighthouse (Denmark)")
            assert await _linked_documents(stages, "Varn Lighthouse") == {"karl", "lighthouse"}
            # an edit that retitles the page takes its passage off the old subject
            await _publish(stages, "lighthouse", LIGHTHOUSE, "Skaw Lighthouse", version=2)
            assert await _linked_documents(stages, "Varn Lighthouse") == {"karl"}
            assert await _linked_documents(stages, "Skaw Lighthouse") == {"lighthouse"}
            # a deleted page leaves no link behind
            await stages.delete("lighthouse")
            assert await _linked_documents(stages, "Skaw Lighthouse") == set()
        finally:
            await stages.close()

    run(scenario())


def test_the_link_forms_in_either_order_and_under_redelivery():
    async def links(order, **delivery):
        stages = InProcess(None, RulesExtractor(), tau=1)
        try:
            for doc_id, text, title in order:
                await _publish(stages, doc_id, text, title)
            return await _linked_documents(stages, "Varn Lighthouse")
        finally:
            await stages.close()

    docs = [("karl", KARL, "Karl Olsen"), ("lighthouse", LIGHTHOUSE, "Varn Lighthouse")]
    assert run(links(docs)) == run(links(docs[::-1])) == {"karl", "lighthouse"}


def test_a_two_hop_question_finds_the_second_hop_through_the_subject(real_embedder):
    """ "Where is the lighthouse that Karl Olsen restored?": the first hop (Karl Olsen's page)
    names the lighthouse; the answer, on the lighthouse's page, shares no word with the question
    but its subject. Hybrid ranks the museum's page (the question's words) second; ppr walks
    from the first hop through the subject to the answer. Before: ppr ranked it as hybrid. (The
    real embedder: the walk is seeded by the facts near the question.)"""

    async def scenario():
        stages = InProcess(None, RulesExtractor(), real_embedder, tau=1)
        try:
            await _publish(stages, "karl", KARL, "Karl Olsen")
            await _publish(stages, "lighthouse", LIGHTHOUSE, "Varn Lighthouse")
            await _publish(stages, "museum", MUSEUM, "Skaw Museum")
            question = "Where is the lighthouse that Karl Olsen restored?"
            top = {}
            for mode in ("hybrid", "ppr"):
                answer = await stages.query(question, top_k=3, mode=mode)
                top[mode] = [p["doc_id"] for p in answer["passages"]]
            return top
        finally:
            await stages.close()

    top = run(scenario())
    assert top["hybrid"][0] == top["ppr"][0] == "karl"
    assert "lighthouse" not in top["hybrid"][:2]
    assert "lighthouse" in top["ppr"][:2]


def test_a_turn_has_no_subject():
    async def scenario():
        stages = InProcess(None, RulesExtractor(), tau=1)
        try:
            await stages.publish("s1:0", "the tower was first lit in 1858", session_id="s1", turn=0, title="Varn")
            return [o for o in stages.sent if o.topic == Chunk.TOPIC]
        finally:
            await stages.close()

    [chunk] = run(scenario())
    assert decode(Chunk, chunk.value).subject == ""
