"""The replay pipeline from documents to events and answers, the stages in this process over
the test stack's Redis (tests/inprocess.py): every scripted fact activated once, the fact two
documents share merged with both passages, a query over the memory, and publishing the same
documents again changing nothing and emitting nothing. The same path through Kafka and the CLI
is test_end_to_end's rules test."""

import asyncio
import json

from tests import inprocess
from tests.inprocess import InProcess
from tests.test_end_to_end import CORPUS, triples
from topics.records import Triple
from workers.algorithms.normalize import canonical_fact, content_hash
from workers.models.extraction import ReplayExtractor

real_embedder = inprocess.real_embedder  # the fixture, for this module's tests

# The replay script: exactly these facts per document (each document is one chunk).
SCRIPT = {
    "lighthouse": [
        ("Ilse Marrow", "PERSON", "built", "Varn Lighthouse", "LANDMARK"),
        ("Varn Lighthouse", "LANDMARK", "stands on", "Kestrel Point", "PLACE"),
    ],
    "harbour": [("Ilse Marrow", "PERSON", "built", "Varn Lighthouse", "LANDMARK")],
    "orchard": [
        ("Dunmore Orchard", "FARM", "grows", "Pellow apples", "PRODUCE"),
        ("Tomas Reed", "PERSON", "owns", "Dunmore Orchard", "FARM"),
    ],
    "observatory": [
        ("Halden Observatory", "ORGANIZATION", "tracks", "Vesk", "COMET"),
        ("Mira Okafor", "PERSON", "directs", "Halden Observatory", "ORGANIZATION"),
    ],
}


def write_replay(path):
    lines = []
    for doc_id, facts in SCRIPT.items():
        entities = {(h, ht) for h, ht, _, _, _ in facts} | {(t, tt) for _, _, _, t, tt in facts}
        lines.append(
            json.dumps(
                {
                    "text_sha256": content_hash(CORPUS[doc_id]),
                    "entities": [{"name": n, "type": t} for n, t in sorted(entities)],
                    "facts": [
                        {
                            "head": h,
                            "head_type": ht,
                            "relation": r,
                            "tail": t,
                            "tail_type": tt,
                            "category": "DECLARATIVE",
                            "valid_from": None,
                            "valid_to": None,
                        }
                        for h, ht, r, t, tt in facts
                    ],
                }
            )
        )
    path.write_text("\n".join(lines) + "\n")
    return path


def test_replay_pipeline_publish_events_query(stack_env, tmp_path, real_embedder):
    """With the real embedder: the query must find the passage it asks about by meaning."""

    async def scenario():
        # τ = 1: every scripted schema is stable at once (the gate is tested in test_memory_agents)
        stages = InProcess(
            stack_env["MEMSTREAM_REDIS_URL"],
            ReplayExtractor(write_replay(tmp_path / "replay.jsonl")),
            real_embedder,
            tau=1,
            sim_bridging=True,
        )
        try:
            for doc_id, text in CORPUS.items():
                await stages.publish(doc_id, text, wait=False)
            await stages.drain()
            events, memory = stages.events(), await stages.export()
            answer = await stages.query("Who directs the observatory that tracks comets?")
            for doc_id, text in CORPUS.items():  # the same documents again
                await stages.publish(doc_id, text, wait=False)
            await stages.drain()
            return stages.tenant, events, memory, answer, stages.events(), await stages.export()
        finally:
            await stages.close()

    tenant, events, memory, answer, events_again, memory_again = asyncio.run(scenario())
    assert len({e["event_id"] for e in events}) == len(events), "an event was published twice"
    assert all(e["tenant"] == tenant and e["graph_version"] > 0 and e["fact"]["status"] == "active" for e in events)
    # every scripted fact activated once; the fact two documents share is merged, not duplicated
    # as memory keeps them: making verbs in the passive ("built" → (Varn Lighthouse, built by, Ilse Marrow))
    canonical = [
        canonical_fact(Triple(head=h, relation=r, tail=t)) for facts in SCRIPT.values() for h, _, r, t, _ in facts
    ]
    assert triples(events, "activated") == sorted({(c.head, c.relation, c.tail) for c in canonical})
    assert triples(events, "merged") == [("Varn Lighthouse", "built by", "Ilse Marrow")]
    (merged,) = [e for e in events if e["event"] == "merged"]
    assert len(merged["passage_ids"]) == 2

    assert answer["passages"][0]["doc_id"] == "observatory"
    assert answer["tenant"] == tenant and answer["graph_version"] >= max(e["graph_version"] for e in events)
    assert {"passages", "entities", "facts", "graph_version", "timings_ms"} <= answer.keys()
    assert any(
        "Mira Okafor" in (f["head"], f["tail"]) for f in answer["facts"]
    )  # (Halden Observatory, directed by, Mira Okafor)

    # publishing the same documents again changes nothing and emits nothing
    assert events_again == events and memory_again == memory
