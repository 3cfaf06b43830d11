"""`memstream bench memory-tax`: memstream keeps the decision trace (the visa refusal and the
409) in a quarter of the full history's tokens, where the rolling summariser loses both."""

import asyncio

from ops.bench import memory_tax
from ops.bench.memory_tax import PROCESS_ITEMS, ROOM_CONFLICT, VISA_REFUSAL, kept
from tests import inprocess

real_embedder = inprocess.real_embedder  # the fixture, for this module's tests


def test_memory_tax_acceptance(real_embedder):
    results = {r.engine: r for r in asyncio.run(memory_tax.memory_tax(real_embedder))}
    memstream, full, summariser = results["memstream"], results["full history"], results["summariser"]
    assert (memstream.process_recall, memstream.constraint_violation) == (1.0, 0.0)
    assert memstream.footprint_tokens <= 0.25 * full.footprint_tokens
    assert (full.process_recall, full.constraint_violation, full.footprint_share) == (1.0, 0.0, 1.0)
    # the summariser keeps destination, party and budget, and loses both items of the trace
    assert summariser.items_kept == {VISA_REFUSAL.name: False, ROOM_CONFLICT.name: False}
    assert (summariser.process_recall, summariser.constraint_violation) == (0.0, 1.0)
    assert "Madrid" in summariser.context and "3,000 USD" in summariser.context and "Sofia" in summariser.context
    # memstream's items come from the standing facts, each tied to the turns that state it
    standing = {(s["category"], s["tail"]): s["turns"] for s in memstream.detail["standing"]}
    assert "t04" in standing[("REJECTED_OPTION", "Miami")]
    assert "t06" in standing[("TOOL_FAILURE", "ROOM_UNAVAILABLE")]


def test_an_item_is_kept_by_a_line_naming_it_in_its_category():
    assert kept("[t04] REJECTED_OPTION: Ana reject Miami", VISA_REFUSAL)
    assert kept("We won't transit through Miami because we have no visa.", VISA_REFUSAL)
    # Miami named, but not refused; the refusal in another line, without Miami
    assert not kept("The cheapest route is via Miami.\nWe won't do that.", VISA_REFUSAL)
    assert kept('returned HTTP 409 Conflict: {"error": "ROOM_UNAVAILABLE"}', ROOM_CONFLICT)
    assert not kept("Summary: destination Madrid; budget 3,000 USD.", ROOM_CONFLICT)
    assert len(PROCESS_ITEMS) == 2


def test_the_rolling_summariser_compresses_every_four_turns():
    turns = memory_tax.session()[:11]
    context = memory_tax.rolling_summary(turns)
    lines = context.splitlines()
    assert lines[0].startswith("Summary: ") and [line.split("]")[0] for line in lines[1:]] == ["[t09", "[t10", "[t11"]
    summary = memory_tax.summarise(turns[:8], {})
    assert summary == {
        "destination": "Madrid",
        "travellers": "Ana, Luis, Sofia, Mateo",
        "origin": "Bogotá",
        "party": "four of us",
        "budget": "3,000 USD",
    }
