"""The LLM extractor through the real `openai` client over real HTTP, against a scripted
OpenAI-compatible test server: structured output, retries, repair, cache, concurrency, DLQ."""

import asyncio
import json
import time
import urllib.request
import uuid

import pytest

from ops.fake_llm import FakeOpenAI
from store import Memory
from tests.inprocess import InProcess
from workers.models.extraction import LLMExtractor
from workers.models.llm import LLMClient, LLMConfig, LLMError, MalformedOutput

ANSWERS = {
    "Greta Holm runs the Northwind Mill.": {
        "entities": [{"name": "Greta Holm", "type": "PERSON"}, {"name": "Northwind Mill", "type": "ORGANIZATION"}],
        "facts": [
            {
                "head": "Greta Holm",
                "head_type": "PERSON",
                "relation": "runs",
                "tail": "Northwind Mill",
                "tail_type": "ORGANIZATION",
                "category": "DECLARATIVE",
                "valid_from": None,
                "valid_to": None,
            }
        ],
    },
    "The team must never deploy on a Friday.": {
        "entities": [{"name": "deploy", "type": "ACTION"}],
        "facts": [
            {
                "head": "team",
                "head_type": "GROUP",
                "relation": "must not deploy on",
                "tail": "Friday",
                "tail_type": "DATE",
                "category": "HARD_CONSTRAINT",
                "valid_from": None,
                "valid_to": None,
            }
        ],
    },
}


NOTHING = json.dumps({"entities": [], "facts": []})


def scripted_llm(raw_answers: dict[str, str] | None = None, latency_s: float = 0.0) -> FakeOpenAI:
    """The fake LLM answering ANSWERS (and raw_answers: text → answer as sent) by the text it is
    given, and an extraction of nothing for any other text."""
    answers = {**{text: json.dumps(a) for text, a in ANSWERS.items()}, **(raw_answers or {})}
    return FakeOpenAI(answers=answers, default=lambda body: NOTHING, latency_s=latency_s)


def run(coro):
    return asyncio.run(coro)


async def _extract(server, texts, stack_env, **config):
    memory = Memory.from_url(stack_env["MEMSTREAM_REDIS_URL"])
    settings = {"model": f"test-{uuid.uuid4().hex[:8]}", "backoff_base_s": 0.01, "backoff_cap_s": 0.05, **config}
    extractor = LLMExtractor(
        LLMClient(LLMConfig(server.base_url, "sk-test", **settings), memory.llm_cache(settings["model"]))
    )
    try:
        return await asyncio.gather(*(extractor.extract(t) for t in texts))
    finally:
        await memory.close()


def test_structured_extraction_over_http_and_cache_hits(stack_env):
    with scripted_llm() as server:
        client_model = f"cache-{uuid.uuid4().hex[:8]}"
        (result,) = run(_extract(server, ["Greta Holm runs the Northwind Mill."], stack_env, model=client_model))
        assert [(f.head, f.relation, f.tail) for f in result.facts] == [("Greta Holm", "runs", "Northwind Mill")]
        assert [e.type for e in result.entities] == ["PERSON", "ORGANIZATION"]
        body = server.requests[0]
        assert body["temperature"] == 0 and body["response_format"]["type"] == "json_schema"
        assert body["response_format"]["json_schema"]["strict"] is True
        run(_extract(server, ["Greta Holm runs the Northwind Mill."], stack_env, model=client_model))
        assert server.calls == 1, "the second run must be served from the cache"


def test_the_fake_llm_answers_by_input_whatever_the_prompt_layout():
    def ask(server, content, schema="extraction"):
        body = {
            "model": "m",
            "messages": [{"role": "system", "content": "rules"}, {"role": "user", "content": content}],
            "response_format": {"type": "json_schema", "json_schema": {"name": schema, "schema": {}, "strict": True}},
        }
        request = urllib.request.Request(
            f"{server.base_url}/chat/completions",
            data=json.dumps(body).encode(),
            headers={"Content-Type": "application/json"},
        )
        with urllib.request.urlopen(request, timeout=10) as response:
            return json.loads(response.read())["choices"][0]["message"]["content"]

    answers = {"Greta Holm": "short", "Greta Holm runs the Northwind Mill.": "long", "Mill": lambda body: body["model"]}
    with FakeOpenAI(
        answers=answers, schema_answers={"resolution": "resolved"}, default=lambda body: "default"
    ) as server:
        assert (
            ask(server, "any layout\n[[Greta Holm runs the Northwind Mill.]]") == "long"
        )  # the longest snippet that occurs
        assert ask(server, "Greta Holm sleeps.") == "short"
        assert ask(server, "The Mill.") == "m"  # a callable gets the request body
        assert ask(server, "Greta Holm runs the Northwind Mill.", schema="resolution") == "resolved"
        assert ask(server, "nothing known") == "default"
        server.script.append({"content": "scripted"})
        assert ask(server, "Greta Holm sleeps.") == "scripted"  # the script comes first
        assert server.answered_by == ["Greta Holm runs the Northwind Mill.", "Greta Holm", "Mill", None, None, None]


def test_categories_come_through():
    from workers.models.extraction import parse_extraction

    result = parse_extraction(ANSWERS["The team must never deploy on a Friday."])
    assert result.facts[0].category == "HARD_CONSTRAINT"
    with pytest.raises(ValueError, match="category 'GOSSIP'"):
        parse_extraction(
            {
                "entities": [],
                "facts": [{**ANSWERS["The team must never deploy on a Friday."]["facts"][0], "category": "GOSSIP"}],
            }
        )


def test_retries_429_5xx_and_timeouts_then_succeeds(stack_env):
    with scripted_llm() as server:
        server.script.extend([{"status": 429}, {"status": 503}, {"delay": 1.5}])
        (result,) = run(_extract(server, ["Greta Holm runs the Northwind Mill."], stack_env, timeout_s=0.5))
        assert len(result.facts) == 1
        assert server.calls == 4


def test_gives_up_after_the_attempt_budget(stack_env):
    with FakeOpenAI() as server:
        server.script.extend([{"status": 500}] * 3)
        with pytest.raises(LLMError, match="after 3 attempts"):
            run(_extract(server, ["x"], stack_env, max_attempts=3))
        server.script.extend([{"status": 400}])
        with pytest.raises(LLMError, match="HTTP 400"):
            run(_extract(server, ["y"], stack_env))


def test_broken_json_gets_one_repair_round(stack_env):
    with scripted_llm() as server:
        server.script.append({"content": "Sure! Here are the facts: {"})
        (result,) = run(_extract(server, ["Greta Holm runs the Northwind Mill."], stack_env))
        assert len(result.facts) == 1 and server.calls == 2
        repair = server.requests[1]["messages"]
        assert repair[-2]["content"] == "Sure! Here are the facts: {" and "invalid" in repair[-1]["content"]


def test_persistent_garbage_raises_with_the_raw_text(stack_env):
    with FakeOpenAI() as server:
        server.script.extend([{"content": '{"entities": "nope"}'}, {"content": "still nope"}])
        with pytest.raises(MalformedOutput) as info:
            run(_extract(server, ["x"], stack_env))
        assert info.value.raw == "still nope" and server.calls == 2


def test_concurrency_is_bounded(stack_env):
    with scripted_llm(latency_s=0.3) as server:
        started = time.monotonic()
        run(_extract(server, [f"text {i}" for i in range(6)], stack_env, concurrency=2))
        assert server.max_in_flight == 2 and server.calls == 6
        assert time.monotonic() - started >= 0.9  # 6 calls, 2 at a time, 0.3 s each


def _llm(server, memory, model: str) -> LLMClient:
    """The workers' LLM client against the fake server, cached in `memory` as a worker's is."""
    return LLMClient(
        LLMConfig(server.base_url, "sk-test", model, backoff_base_s=0.01, backoff_cap_s=0.05), memory.llm_cache(model)
    )


def test_llm_extractor_in_the_pipeline_and_dead_letters_on_garbage(stack_env):
    """The stages in process (tests/inprocess.py) with the LLM extractor over real HTTP; the
    `MEMSTREAM_EXTRACTOR=llm` worker itself runs through Kafka in the SIGTERM and rebalance
    tests (tests/test_effectively_once.py)."""
    garbage = "The ledger is unreadable."
    docs = {"mill": "Greta Holm runs the Northwind Mill.", "rule": "The team must never deploy on a Friday."}

    async def scenario(server):
        first = InProcess(stack_env["MEMSTREAM_REDIS_URL"], None, tau=1)  # its Redis client, shared by the two tenants
        llm = _llm(server, first.memory, f"pipe-{uuid.uuid4().hex[:6]}")
        stages = InProcess(
            stack_env["MEMSTREAM_REDIS_URL"], LLMExtractor(llm), tau=1, memory=first.memory, tenant=first.tenant
        )
        again = InProcess(stack_env["MEMSTREAM_REDIS_URL"], LLMExtractor(llm), tau=1, memory=first.memory)
        try:
            for doc_id, text in docs.items():
                await stages.publish(doc_id, text)
            events, calls = stages.events(), server.calls
            await stages.publish("ledger", garbage)
            letters, calls_after_garbage = stages.dead_letters(), server.calls
            for doc_id, text in docs.items():  # the same documents in another tenant
                await again.publish(doc_id, text)
            return events, calls, letters, calls_after_garbage, again.events(), server.calls
        finally:
            await first.close()

    with scripted_llm({garbage: "<<garbage>>"}) as server:
        events, calls, letters, calls_after_garbage, other_events, calls_at_end = run(scenario(server))
    assert sorted(e["fact"]["relation"] for e in events if e["event"] == "activated") == ["must not deploy on", "run"]
    assert {e["fact"]["category"] for e in events} == {"DECLARATIVE", "HARD_CONSTRAINT"}
    assert calls == 2
    (letter,) = letters
    assert letter["topic"].endswith(".chunks") and "raw output: <<garbage>>" in letter["error"]
    assert calls_after_garbage == calls + 2  # one call and one repair round
    # every answer for the other tenant comes from the cache
    assert calls_at_end == calls + 2 and len([e for e in other_events if e["event"] == "activated"]) == 2


def test_llm_resolver_names_an_action_and_evidence_per_fact(stack_env, tmp_path):
    """The LLM resolver decides a single-valued group from the evidence, over real HTTP (the
    stages in process); garbage twice and the deterministic policy decides instead."""
    from tests.test_memory_agents import CONFLICTS, _ids, facts_by_id, write_script
    from workers.algorithms.chunking import chunk_id_of
    from workers.models.extraction import ReplayExtractor

    def decision(doc: str, action: str) -> dict:
        return {
            "fact_id": _ids(doc),
            "action": action,
            "evidence": "Mira Okafor was born in Oslo, her passport says",
            "evidence_passage_id": chunk_id_of(CONFLICTS["m2"][0]),
            "valid_from": None,
            "valid_to": None,
            "scope": None,
        }

    async def scenario(server):
        probe = InProcess(stack_env["MEMSTREAM_REDIS_URL"], None, tau=1)
        llm = _llm(server, probe.memory, f"res-{uuid.uuid4().hex[:6]}")
        stages = InProcess(
            None,
            ReplayExtractor(str(write_script(tmp_path / "s.jsonl", CONFLICTS))),
            tau=1,
            memory=probe.memory,
            tenant=probe.tenant,
            resolver_llm=llm,
        )
        try:
            await stages.publish("m2", CONFLICTS["m2"][0])  # Oslo, one passage
            await stages.publish("m1", CONFLICTS["m1"][0])  # Bergen, one passage, later: the rules policy would keep it
            first = facts_by_id(await stages.export()), stages.events(), server.calls, list(server.requests)
            server.script.extend([{"content": "no idea"}, {"content": "{}"}])  # garbage twice
            await stages.publish("t1", CONFLICTS["t1"][0])
            await stages.publish("t2", CONFLICTS["t2"][0])
            return first, facts_by_id(await stages.export()), server.calls
        finally:
            await probe.close()

    # the conflict of Bergen (m1) and Oslo (m2), named by the Bergen fact's id
    oslo_wins = json.dumps({"decisions": [decision("m2", "keep"), decision("m1", "invalidate")]})
    with FakeOpenAI(answers={_ids("m1"): oslo_wins}) as server:
        (facts, events, calls, requests), later, calls_at_end = run(scenario(server))
    assert facts[_ids("m2")]["status"] == "active" and facts[_ids("m1")]["status"] == "invalid"
    assert "LLM: Mira Okafor was born in Oslo, her passport says" in facts[_ids("m1")]["reason"]
    (invalidated,) = [e for e in events if e["event"] == "invalidated"]
    assert invalidated["fact_id"] == _ids("m1") and invalidated["evidence_passage_ids"]
    assert calls == 1
    assert requests[0]["response_format"]["json_schema"]["name"] == "resolution"
    assert later[_ids("t1")]["qualifiers"]["time"] == {"from": "1990", "to": "1999"}
    assert later[_ids("t2")]["status"] == "active" and calls_at_end == 3


def test_llm_resolution_answers_are_validated():
    from workers.algorithms.policy import GroupFact
    from workers.models.resolution import parse_resolution

    group = [GroupFact("a", "x", 1, 1.0, passage_ids=("p1",)), GroupFact("b", "y", 1, 2.0, passage_ids=("p2",))]
    ok = {
        "decisions": [
            {
                "fact_id": "a",
                "action": "qualify_time",
                "evidence": "From 1990 to 1999.",
                "evidence_passage_id": "p1",
                "valid_from": "1990",
                "valid_to": "1999",
                "scope": None,
            },
            {
                "fact_id": "b",
                "action": "uncertain",
                "evidence": "Unclear.",
                "evidence_passage_id": "p2",
                "valid_from": None,
                "valid_to": None,
                "scope": None,
            },
        ]
    }
    decisions = parse_resolution(ok, group, {"p1", "p2"})
    assert decisions["a"].qualifiers == {"time": {"from": "1990", "to": "1999"}} and decisions["b"].qualifiers == {
        "uncertain": True
    }
    with pytest.raises(ValueError, match="no decision for fact"):
        parse_resolution({"decisions": ok["decisions"][:1]}, group, {"p1", "p2"})
    with pytest.raises(ValueError, match="not one of the evidence passages"):
        parse_resolution(
            {"decisions": [dict(ok["decisions"][0], evidence_passage_id="p9"), ok["decisions"][1]]}, group, {"p1", "p2"}
        )
    with pytest.raises(ValueError, match="action 'delete'"):
        parse_resolution(
            {"decisions": [dict(ok["decisions"][0], action="delete"), ok["decisions"][1]]}, group, {"p1", "p2"}
        )


def test_llm_resolution_ids_that_are_not_strings_are_malformed_not_a_crash():
    """A list or an object as fact_id or evidence_passage_id (a server that does not hold to the
    schema) is a ValueError, which earns the repair round and then the evidence policy; it was a
    TypeError (unhashable, tested `in` a set or dict), which skipped both and failed the message."""
    from workers.algorithms.policy import GroupFact
    from workers.models.resolution import parse_resolution

    group = [GroupFact("a", "x", 1, 1.0, passage_ids=("p1",))]
    good = {"fact_id": "a", "action": "keep", "evidence": "So it is.", "evidence_passage_id": "p1"}
    passages = {"p1": "So it is."}  # as the resolver passes them: a dict by passage id
    assert parse_resolution({"decisions": [good]}, group, passages)["a"].evidence == ("p1",)
    for field in ("fact_id", "evidence_passage_id"):
        for bad in (["p1"], {"id": "p1"}):
            with pytest.raises(ValueError, match=field):
                parse_resolution({"decisions": [dict(good, **{field: bad})]}, group, passages)


class DictCache:
    """A test double of store.caches.LLMCache: answers kept in a dict by prompt."""

    def __init__(self):
        self.answers: dict[str, str] = {}

    async def get(self, messages, schema):
        return self.answers.get(json.dumps([messages, schema]))

    async def put(self, messages, schema, answer):
        self.answers[json.dumps([messages, schema])] = answer


SCHEMA = {"type": "object"}


def _ask(client: LLMClient, text: str):
    return client.structured(
        "resolution", [{"role": "user", "content": text}], "resolution", SCHEMA, lambda value: value
    )


def test_callers_asking_the_same_at_once_share_one_call_and_a_caller_that_goes_leaves_it_to_the_others():
    async def main(server):
        client = LLMClient(LLMConfig(server.base_url, "sk-test", "m"), DictCache())
        together = await asyncio.gather(
            _ask(client, "Greta Holm runs the Northwind Mill."), _ask(client, "Greta Holm runs the Northwind Mill.")
        )
        prefetch = asyncio.ensure_future(_ask(client, "The team must never deploy on a Friday."))
        await asyncio.sleep(0.05)
        handle = asyncio.ensure_future(_ask(client, "The team must never deploy on a Friday."))
        await asyncio.sleep(0.05)
        prefetch.cancel()  # the read-ahead drops a prefetch whose message turned out done
        return together, await handle, prefetch.cancelled()

    with scripted_llm(latency_s=0.3) as server:
        together, handled, cancelled = run(main(server))
        calls = server.calls
    assert together[0] == together[1] == ANSWERS["Greta Holm runs the Northwind Mill."]
    assert handled == ANSWERS["The team must never deploy on a Friday."] and cancelled
    assert calls == 2  # one per distinct prompt


def test_a_fenced_answer_comes_back_from_the_cache_as_it_was_accepted():
    async def main(server):
        client = LLMClient(LLMConfig(server.base_url, "sk-test", "m"), DictCache())
        first = await _ask(client, "fenced")
        again = await _ask(client, "fenced")  # from the cache: the text as the server sent it, fence and all
        return first, again

    with FakeOpenAI(answers={"fenced": '```json\n{"ok": true}\n```'}) as server:
        first, again = run(main(server))
        calls = server.calls
    assert first == again == {"ok": True} and calls == 1


def test_the_concurrency_bound_holds_for_every_client_of_a_process():
    """Two clients of one process (an `all` worker's extractor and resolver) with
    MEMSTREAM_LLM_CONCURRENCY 2: six calls at once, never more than two in flight (each client
    had a bound of its own before, so four)."""

    async def ask_both(server):
        config = LLMConfig(server.base_url, "sk-test", "m", concurrency=2)
        clients = [LLMClient(config), LLMClient(config)]
        try:
            return await asyncio.gather(
                *(
                    clients[i % 2].structured(
                        "extraction",
                        [{"role": "user", "content": f"text {i}"}],
                        "extraction",
                        {"type": "object"},
                        lambda parsed: parsed,
                    )
                    for i in range(6)
                )
            )
        finally:
            for client in clients:
                await client.aclose()

    with scripted_llm(latency_s=0.2) as server:
        answers = run(ask_both(server))
        assert answers == [json.loads(NOTHING)] * 6
        assert server.calls == 6 and server.max_in_flight == 2


def test_the_fake_counts_a_request_in_flight_until_its_answer_is_sent(monkeypatch):
    """The fake's count of calls in flight ends as a request's answer leaves, not when its
    handler's thread ends: a client may send its next call in between. A loaded machine delays
    that thread's end — here made certain by a socket write that returns 0.3 s after it sent its
    bytes (the fake's handler threads are its only writers in this test) — and one client bounded
    to one call in flight was counted as two (the concurrency bound's test saw three of two in CI)."""
    import socketserver

    sent = socketserver._SocketWriter.write  # type: ignore[attr-defined]

    def write_then_linger(self, data):
        written = sent(self, data)
        time.sleep(0.3)
        return written

    monkeypatch.setattr(socketserver._SocketWriter, "write", write_then_linger)  # type: ignore[attr-defined]

    async def three_in_turn(server):
        client = LLMClient(LLMConfig(server.base_url, "sk-test", "m", concurrency=1))
        try:
            return [await _ask(client, f"text {i}") for i in range(3)]
        finally:
            await client.aclose()

    with FakeOpenAI(default=lambda body: '{"ok": true}') as server:
        answers = run(three_in_turn(server))
        assert answers == [{"ok": True}] * 3
        assert server.calls == 3 and server.max_in_flight == 1
