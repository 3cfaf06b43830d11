"""A titled document's passages hold its subject (workers.algorithms.subjects), so a name the
first stage's top passage holds that is another page's subject is a hyperlink: ppr and
reconstruct rank the pages it links to right below it (RetrievalParams.linked_pages,
workers.algorithms.retrieval.linked_pages) — the second hop of a question its top passage
answers half of, which a keyword or vector search of the question alone does not find."""

import asyncio

from tests import inprocess
from tests.inprocess import InProcess
from workers.algorithms.subjects import linked_pages, named_pages
from workers.models.extraction import RulesExtractor

real_embedder = inprocess.real_embedder  # the fixture, for this module's tests

DOCUMENTS = [
    (
        "harbour-lights",
        "Harbour Lights (film)",
        "Harbour Lights is a 1987 drama film directed by Ottilie Brandvold. It was shot in the "
        "fishing port of Varnes and premiered at a regional festival.",
    ),
    (
        "brandvold",
        "Ottilie Brandvold",
        "Ottilie Brandvold is a Norwegian painter and photographer. She trained at the Bergen "
        "Academy of Arts before she made her first feature.",
    ),
    (
        "film-school",
        "Varnes Film School",
        "The Varnes Film School in the port of Varnes is where a director can study film. "
        "Directors of drama films study directing there, and scenes of Harbour Lights were shot "
        "in its studio.",
    ),
]
QUESTION = "Where did the director of the film Harbour Lights study?"


def test_the_pages_a_passage_links_to_are_those_whose_subject_it_names():
    subject_of = {"p1": "ottilie_brandvold", "p2": "varnes", "p3": "film_schools", "top": "harbour_lights"}
    links = {"ottilie_brandvold", "varnes"}  # the top passage's names, its own subject left out
    assert linked_pages(links, "top", ["top", "p3", "p2", "p1"], subject_of, 2) == ["p2", "p1"]
    assert linked_pages(links, "top", ["p3", "p1", "p2"], subject_of, 1) == ["p1"]
    assert linked_pages(links, "top", ["p3", "p1"], subject_of, 0) == []
    assert linked_pages(set(), "top", ["p1"], subject_of, 2) == []


def test_the_pages_a_question_names_are_those_whose_subject_a_span_of_it_names():
    subject_of = {"p1": "ottilie_brandvold", "p2": "varnes", "p3": "varnes_film_school", "top": "harbour_lights"}
    ranked = ["top", "p1", "p2", "p3"]
    # the longest span that names a subject: "Varnes Film School", not "Varnes" inside it
    assert named_pages("Who taught at the Varnes Film School?", "top", ranked, subject_of, 2) == ["p3"]
    assert named_pages("Did Ottilie Brandvold live in Varnes?", "top", ranked, subject_of, 2) == ["p1", "p2"]
    assert named_pages("Did Ottilie Brandvold live in Varnes?", "top", ranked, subject_of, 1) == ["p1"]
    assert named_pages("Where was Harbour Lights shot?", "top", ranked, subject_of, 2) == []  # the top itself
    assert named_pages("Who directed it?", "top", ranked, subject_of, 2) == []


def test_a_second_hop_page_the_top_passage_links_to_ranks_second_in_graph_modes(real_embedder):
    """The film's page names its director; her page says where she trained, in none of the
    question's words but "the" and "of". Hybrid ranks the film school's page second, and the walk
    reaches it first (the film and the port both pages name); ppr and reconstruct rank the director's page there
    — and did not before (linked_pages 0); so does ppr where no fact seeds its walk."""

    async def scenario():
        stages = InProcess(None, RulesExtractor(), real_embedder, tau=1)
        try:
            for doc_id, title, text in DOCUMENTS:
                await stages.publish(doc_id, text, title=title)
            top = {}
            for name, mode, params in (
                ("hybrid", "hybrid", {}),
                ("ppr", "ppr", {}),
                ("reconstruct", "reconstruct", {}),
                ("ppr unlinked", "ppr", {"linked_pages": 0}),
                ("reconstruct unlinked", "reconstruct", {"linked_pages": 0}),
                ("ppr unseeded", "ppr", {"tau_q": 1.0}),  # no fact seeds the walk: the first stage answers
            ):
                answer = await stages.query(QUESTION, top_k=3, mode=mode, params=params)
                top[name] = [p["doc_id"] for p in answer["passages"]]
                assert (answer.get("fallback") == "first_stage") == (name == "ppr unseeded"), answer
                if name == "ppr":
                    assert answer["passages"][1]["subject"] == "Ottilie Brandvold"
            return top
        finally:
            await stages.close()

    top = asyncio.run(scenario())
    for mode in ("ppr", "reconstruct"):
        assert top[mode][:2] == ["harbour-lights", "brandvold"], top
        assert top[f"{mode} unlinked"][:2] != ["harbour-lights", "brandvold"], top
    assert top["ppr unseeded"][:2] == ["harbour-lights", "brandvold"], top
    assert top["hybrid"][0] == "harbour-lights" and top["hybrid"][1] != "brandvold", top
