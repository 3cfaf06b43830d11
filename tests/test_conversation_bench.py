"""`memstream bench conversation`: loose evidence ids, the recall arithmetic over turn doc ids,
ingestion through the real pipeline (in-process; over Redis with the stack), and the CLI on the
shipped sample conversation."""

from __future__ import annotations

import asyncio
import json
import subprocess

import pytest

from ops.bench.conversation import (
    SAMPLE_CONVERSATION,
    Answer,
    Probe,
    format_ablations,
    load_conversations,
    plan,
    run,
    summarize,
    walk_reach,
)
from ops.cli import main
from tests import inprocess
from tests.conftest import MEMSTREAM, ROOT
from topics.conversations import Question, locomo_questions, locomo_turns, parse_evidence, unreadable_evidence
from workers.settings import Settings

real_embedder = inprocess.real_embedder  # the fixture, for this module's tests


def turns_of(session: int, *texts: tuple[str, str]) -> list[dict]:
    return [{"speaker": who, "dia_id": f"D{session}:{i}", "text": text} for i, (who, text) in enumerate(texts, 1)]


def tiny_sample(sample_id: str = "tiny") -> dict:
    """Two sessions, five turns, questions of every kind of evidence the benchmark must read."""
    return {
        "sample_id": sample_id,
        "conversation": {
            "speaker_a": "Ada",
            "speaker_b": "Bo",
            "session_1_date_time": "9:00 am on 3 January, 2023",
            "session_1": turns_of(
                1,
                ("Ada", "I adopted a grey cat called Pixel last week."),
                ("Bo", "My brother Sven works as a glassblower in Malmo."),
                ("Ada", "Pixel already sleeps on my keyboard."),
            ),
            "session_2_date_time": "6:30 pm on 14 February, 2023",
            "session_2": turns_of(
                2,
                ("Bo", "Sven sent me a blue glass bowl for my birthday."),
                ("Ada", "I took Pixel to the vet for her vaccinations today."),
            ),
        },
        "qa": [
            {"question": "What is the name of Ada's cat?", "answer": "Pixel", "evidence": ["D1:1"], "category": 4},
            {
                "question": "What did the glassblower send Bo?",
                "answer": "A blue glass bowl",
                "evidence": ["D1:2; D2:2"],
                "category": 1,
            },
            {
                "question": "When did Ada take her cat to the vet?",
                "answer": "14 February 2023",
                "evidence": ["D:2:02"],
                "category": 2,
            },
            {"question": "What colour is Bo's car?", "answer": "unknown", "evidence": ["see session 3"], "category": 3},
            {"question": "Where does Sven work?", "answer": "Malmo", "evidence": ["D9:9", "D01:2"], "category": 4},
            {"question": "Who is Pixel's vet?", "adversarial_answer": "not mentioned", "category": 5},
        ],
    }


def test_loose_evidence_ids_are_read_and_what_cannot_be_read_is_counted():
    assert parse_evidence(["D8:6; D9:17"]) == ["D8:6", "D9:17"]
    assert parse_evidence(["D:11:26"]) == ["D11:26"]
    assert parse_evidence(["D30:05", "D30:5"]) == ["D30:5"]
    assert parse_evidence("D2:3") == ["D2:3"]
    assert unreadable_evidence(["D8:6; D9:17", "D:11:26", "D30:05"]) == []
    assert unreadable_evidence(["see session 3", "D", "D1:2", 7]) == ["see session 3", "D", "7"]
    assert unreadable_evidence(None) == [] and unreadable_evidence([]) == []
    questions = locomo_questions(tiny_sample())
    assert [q.evidence for q in questions] == [["D1:1"], ["D1:2", "D2:2"], ["D2:2"], [], ["D9:9", "D1:2"], []]
    assert [q.unreadable_evidence for q in questions] == [(), (), (), ("see session 3",), (), ()]


def test_plan_asks_questions_with_evidence_in_their_own_conversation_and_counts_the_rest():
    data = [tiny_sample("a"), tiny_sample("b")]
    turns = locomo_turns(data)
    work = plan(turns, locomo_questions(data), "t")
    assert work.tenants == {"a": "t-0", "b": "t-1"}
    assert work.questions == 12 and len(work.probes) == 8
    assert work.no_evidence == 4  # per sample: the unreadable one and the one without evidence
    assert work.unreadable_evidence == 2 and work.unknown_evidence == 2  # "see session 3"; "D9:9"
    first_b = next(p for p in work.probes if p.tenant == "t-1")
    assert first_b.gold == frozenset({"b:D1:1"})  # the same dia_id in sample a is another turn
    sven = [p for p in work.probes if p.question.question == "Where does Sven work?"]
    assert [p.gold for p in sven] == [frozenset({"a:D1:2"}), frozenset({"b:D1:2"})]


def test_recall_counts_evidence_turns_among_the_top_passages_by_doc_id_per_category():
    work = plan(locomo_turns(tiny_sample()), locomo_questions(tiny_sample()), "t")
    cat, hop, when, sven = work.probes
    other = [f"tiny:D{n}" for n in range(10, 20)]  # doc ids of no evidence turn
    answers = [
        # the evidence at rank 1, and again at rank 2 (a turn chunked into two passages counts once)
        Answer(cat, "dense", ["tiny:D1:1", "tiny:D1:1"] + other, 1.0, False),
        # one evidence turn in the top 5, the other at rank 7
        Answer(hop, "dense", other[:2] + ["tiny:D1:2"] + other[2:5] + ["tiny:D2:2"], 2.0, False),
        # beyond the top 10
        Answer(when, "dense", other + ["tiny:D2:2"], 3.0, False),
        # the same dia_id in another conversation is not the evidence
        Answer(sven, "dense", ["other:D1:2"] + other, 4.0, False),
        Answer(cat, "ppr", other[:4] + ["tiny:D1:1"], 5.0, True),
        Answer(hop, "ppr", ["tiny:D2:2", "tiny:D1:2"], 5.0, False),
        Answer(when, "ppr", ["tiny:D2:2"], 5.0, False),
        Answer(sven, "ppr", ["tiny:D1:2"], 5.0, False),
    ]
    result = summarize(answers, ["dense", "ppr"])
    dense, ppr = result["dense"], result["ppr"]
    assert dense["overall"] == {
        "n": 4,
        "R@2": round(100 * (1 + 0 + 0 + 0) / 4, 1),
        "R@5": round(100 * (1 + 0.5 + 0 + 0) / 4, 1),
        "R@10": round(100 * (1 + 1 + 0 + 0) / 4, 1),
    }
    assert dense["by_category"] == {
        "1": {"n": 1, "R@2": 0.0, "R@5": 50.0, "R@10": 100.0},
        "2": {"n": 1, "R@2": 0.0, "R@5": 0.0, "R@10": 0.0},
        "4": {"n": 2, "R@2": 50.0, "R@5": 50.0, "R@10": 50.0},
    }
    # R@2: the evidence at rank 5 of `cat` counts at 5, not at 2
    assert ppr["overall"] == {"n": 4, "R@2": 75.0, "R@5": 100.0, "R@10": 100.0}
    assert (dense["p50_ms"], dense["fallbacks"], ppr["fallbacks"]) == (2.5, 0, 1)


def test_ingest_maps_every_passage_back_to_its_turn(real_embedder, tmp_path):
    path = tmp_path / "tiny.json"
    path.write_text(json.dumps([tiny_sample()]))
    result = asyncio.run(run(Settings.from_env({}), path, ["dense", "ppr"], None, embedder=real_embedder))
    assert (result["turns"], result["questions"], result["evaluated"]) == (5, 6, 4)
    assert (result["skipped_no_evidence"], result["unreadable_evidence"], result["unknown_evidence"]) == (2, 1, 1)
    shape = result["graph_shape"]  # the indexed turns' graph (workers.algorithms.graph_shape)
    assert shape["passages"] == 5 and shape["entities"] >= 1 and 0 <= shape["joined"] <= 1
    # five passages in all: the top 10 holds every one, so each evidence turn is found — only if
    # passages map back to their turns through their doc ids
    for mode in ("dense", "ppr"):
        assert result["modes"][mode]["overall"]["R@10"] == 100.0
        assert set(result["modes"][mode]["by_category"]) == {"1", "2", "4"}


def test_ablation_rows_ask_a_mode_with_other_parameters_of_the_same_memory(real_embedder, tmp_path):
    path = tmp_path / "tiny.json"
    path.write_text(json.dumps([tiny_sample()]))
    ablations = {"ppr, no walk": ("ppr", {"walk_weight": 0.0}), "hybrid, rrf_k 60": ("hybrid", {"rrf_k": 60.0})}
    result = asyncio.run(
        run(Settings.from_env({}), path, ["hybrid", "ppr"], None, embedder=real_embedder, ablations=ablations)
    )
    assert list(result["modes"]) == ["hybrid", "ppr"] and list(result["ablations"]) == list(ablations)
    row = result["ablations"]["ppr, no walk"]
    assert row["mode"] == "ppr" and row["params"] == {"walk_weight": 0.0} and row["overall"]["n"] == 4
    assert all(set(q["modes"]) == {"hybrid", "ppr"} for q in result["per_question"])  # ablations stay out of the detail
    table = format_ablations(result)
    assert "ablation" in table and "ppr, no walk" in table
    assert table.splitlines()[2].split() == ["R@2", "R@5", "R@10"] * 4  # all, then categories 1, 2, 4
    reach = result["walk_reach"]  # what a walk from "ppr, no walk"'s top 5 could reach, per category
    assert set(reach) == {"all", "1", "2", "4"} and reach["all"]["below_5"] >= reach["all"]["within_one_hop"] >= 0
    assert "walk reach" in format_ablations(result)


def test_walk_reach_counts_the_evidence_one_non_hub_hop_from_the_top_5():
    """c shares x with the top 5's a: within reach; d shares nothing; h is one hop away, not evidence."""
    question = Question("q", "", ["D1:1"], 1, "s")
    probe = Probe(question, "t", frozenset({"a", "c", "d"}))
    answer = Answer(probe, "ppr, no walk", ["a", "b", "e", "f", "g", "c", "d"], 1.0, False)
    turns = {"a": {"x"}, "b": {"y"}, "c": {"x"}, "d": {"z"}, "h": {"y"}, "e": set(), "f": set(), "g": set()}
    reach = walk_reach([answer], {"t": turns})
    assert reach == {
        "all": {"below_5": 2, "within_one_hop": 1, "one_hop_turns": 2.0},
        "1": {"below_5": 2, "within_one_hop": 1, "one_hop_turns": 2.0},
    }


def test_ingest_over_redis(stack_env, real_embedder, tmp_path):
    path = tmp_path / "tiny.json"
    path.write_text(json.dumps(tiny_sample()))
    result = asyncio.run(
        run(Settings.from_env(stack_env), path, ["dense"], stack_env["MEMSTREAM_REDIS_URL"], embedder=real_embedder)
    )
    assert result["store"] == "redis" and result["evaluated"] == 4
    assert result["modes"]["dense"]["overall"]["R@10"] == 100.0


def test_cli_on_the_sample_conversation_prints_a_row_per_category():
    turns, questions = load_conversations(SAMPLE_CONVERSATION)
    assert 60 <= len(turns) <= 100 and 25 <= len(questions) <= 40
    proc = subprocess.run(
        MEMSTREAM + ["bench", "conversation", str(SAMPLE_CONVERSATION), "--modes", "dense,ppr"],
        cwd=ROOT,
        capture_output=True,
        text=True,
        timeout=600,
    )
    assert proc.returncode == 0, proc.stderr
    assert f"turns indexed {len(turns)}/{len(turns)}" in proc.stderr
    assert f"questions asked {2 * len(questions)}/{2 * len(questions)}" in proc.stderr
    lines = proc.stdout.splitlines()
    assert (
        "categories as in the public LoCoMo file: 1 multi-hop, 2 temporal, 3 open domain, 4 single hop, 5 adversarial"
        in lines
    )
    assert lines[3].split() == ["dense", "ppr"]
    assert lines[4].split() == ["category", "n"] + ["R@2", "R@5", "R@10"] * 2  # every k, each mode
    rows = {line[:18].strip(): line[18:].split() for line in lines[5:] if line[:18].strip()}
    counts = {c: sum(1 for q in questions if q.category == c) for c in (1, 2, 4, 5)}
    assert int(rows["all"][0]) == len(questions)
    for category, name in ((1, "multi-hop"), (2, "temporal"), (4, "single hop"), (5, "adversarial")):
        row = rows[f"{category} {name}"]
        assert int(row[0]) == counts[category]
        assert len(row) == 1 + 3 * 2 and all(0 <= float(cell) <= 100 for cell in row[1:])
    assert lines[-1].startswith("graph: ") and "entities a passage" in lines[-1]
    assert len(rows["p50 ms"]) == 2 and len(rows["p99 ms"]) == 2


@pytest.mark.parametrize(
    "argv, message",
    [
        (["bench", "conversation", "--modes", "dense,psychic"], "--modes: psychic; the query engine has"),
        (["bench", "recall", "file.json"], "unrecognized arguments: file.json"),
    ],
)
def test_cli_refuses_what_it_cannot_run(argv, message, capsys):
    try:
        code = main(argv)
    except SystemExit as refused:  # argparse's: an argument the bench does not take
        code = refused.code
    assert code == 2
    assert message in capsys.readouterr().err


def test_cli_refuses_a_file_that_is_not_the_locomo_layout(tmp_path, capsys):
    path = tmp_path / "turns.json"
    path.write_text(json.dumps([{"doc_id": "a", "text": "not a conversation"}]))
    assert main(["bench", "conversation", str(path)]) == 2
    assert "expected the LoCoMo layout" in capsys.readouterr().err
