"""Query modes are values (workers.query.modes): a mode registered in its own module is answered
by the engine and offered by the MCP search tool, the explorer's mode picker and `memstream
query --mode` with no edit anywhere else."""

from __future__ import annotations

import asyncio
import contextlib
import io

import pytest
from mcp import Client

from ops import cli
from tests.inprocess import InProcess, ScriptedExtractor
from workers.publisher import ClientPublisher
from workers.query import modes, page
from workers.query.engine import QueryEngine, QueryRequest
from workers.query.mcp_server import memory_server

NOTE = "Ines keeps the harbour ledger in Porto."


@pytest.fixture
def toy_mode():
    """A mode of its own: the first stage alone, under another name and hint."""
    mode = modes.register(modes.Mode("toy", "answers with the first stage, for a test", "first_stage"))
    try:
        yield mode
    finally:
        modes.unregister("toy")


def test_a_registered_mode_is_answered_and_offered_everywhere(toy_mode):
    async def main():
        stages = InProcess(None, ScriptedExtractor({NOTE: [("Ines", "keeps", "harbour ledger", "PERSON", "THING")]}))
        try:
            await stages.publish("note", NOTE)
            engine = QueryEngine(stages.memory, stages.embedder)
            answered = await engine.answer(QueryRequest("Who keeps the ledger?", stages.tenant, 3, "toy"))
            parsed = QueryRequest.from_json({"query": "ledger", "mode": "toy"}, stages.tenant, 3)
            server = memory_server(stages.tenant, engine, stages.settings, ClientPublisher(stages.settings))
            async with Client(server) as client:
                tools = {t.name: t for t in (await client.list_tools()).tools}
                found = await client.call_tool("search_memory", {"query": "ledger", "mode": "toy"})
            engine.close()
            return answered, parsed, tools["search_memory"].input_schema["properties"]["mode"], found
        finally:
            await stages.close()

    answered, parsed, schema, found = asyncio.run(main())
    assert answered.mode == "toy" and answered.passages and answered.passages[0].text == NOTE
    assert parsed.mode == "toy"
    assert "'toy' answers with the first stage, for a test" in schema["description"]
    assert not found.is_error and found.structured_content["mode"] == "toy"
    served = page.page_html()
    assert '<option value="toy" title="answers with the first stage, for a test">toy</option>' in served
    assert page.MODES_MARK not in served
    helped = io.StringIO()
    with contextlib.redirect_stdout(helped), pytest.raises(SystemExit):
        cli.main(["query", "--help"])
    offered = " ".join(helped.getvalue().split())  # argparse wraps its lines
    assert "{ppr,dense,lexical,hybrid,reconstruct,toy}" in offered, offered
    assert "toy: answers with the first stage, for a test" in offered, offered


def test_the_built_in_modes_and_bad_registrations():
    assert modes.mode_names() == ("ppr", "dense", "lexical", "hybrid", "reconstruct")
    assert [m.name for m in modes.registered() if m.walks] == ["reconstruct"]
    assert [m.name for m in modes.registered() if not m.embeds] == ["lexical"]
    with pytest.raises(ValueError, match="registered already"):
        modes.register(modes.Mode("ppr", "again", "walk"))
    with pytest.raises(ValueError, match="recipe 'fast' is not one of"):
        modes.register(modes.Mode("quick", "no such recipe", "fast"))  # type: ignore[arg-type]
    with pytest.raises(ValueError, match="is a word"):
        modes.register(modes.Mode("two words", "", "dense"))
    with pytest.raises(ValueError, match="built in"):
        modes.unregister("dense")
    with pytest.raises(ValueError, match="unknown query mode 'toy'; the modes: ppr, dense"):
        modes.mode_of("toy")
