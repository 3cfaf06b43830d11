"""An extraction that commits while a version retires its passage (tests/test_rebuild_from_log.py
`..._ends_as_a_fresh_build[emptied]`, flaky: replayed side by side, the extractor of an edit's
chunk committed between the reverting version's reads of that passage and its commit). The
extractor writes the passage's counted sets — its entities (the passage edges a retirement
removes), its schemas' support — so its commit must move the passage's revision (Memory.stage_passage), which the
retirement is fenced on (workers.stages.chunker.Versions.replace); otherwise the retirement,
having read the passage before it was extracted, left its passage edges in the graph and its
schemas counting it. Run in process over both stores (the `redis_url` fixture)."""

from __future__ import annotations

import asyncio
import json

from tests.inprocess import InProcess
from tests.test_versions import ILSE, ILSE_EDITED, current_memory, fresh, run
from topics import Chunk
from workers.models.extraction import RulesExtractor


def test_an_extraction_that_lands_while_a_revert_retires_its_passage_leaves_nothing_of_it(redis_url):
    async def scenario():
        stages = InProcess(redis_url, RulesExtractor(), tau=1)
        try:
            await stages.publish("x", ILSE, version=1)
            await stages.publish("x", ILSE_EDITED, version=2, wait=False)
            await stages.publish("x", ILSE, version=3, wait=False)  # the revert: retires the edit's passage
            original, fired = stages.memory.passage_entities, []

            async def raced(tenant, passage_id):
                found = await original(tenant, passage_id)  # the retirement's read: nothing extracted yet
                edit = [o for o in stages.sent if o.topic == Chunk.TOPIC and ILSE_EDITED in o.value.decode()]
                if edit and passage_id == json.loads(edit[0].value)["chunk_id"] and not fired:
                    fired.append(passage_id)
                    # the edit's chunk, handled to its commit by another consumer right now (the
                    # broker still delivers its own copy later: a redelivery)
                    chunk = edit[0]
                    await asyncio.ensure_future(stages.pipeline.process(chunk.topic, chunk.key.encode(), chunk.value))
                return found

            stages.memory.passage_entities = raced  # type: ignore[method-assign]
            await stages.drain()
            assert fired, "the revert did not retire the edit's passage"
            return await current_memory(stages)
        finally:
            await stages.close()

    assert run(scenario()) == run(fresh(redis_url, {"x": ILSE}, tau=1))
