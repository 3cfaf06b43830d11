"""A titled document's passages hold its subject (workers.algorithms.subjects), so a name the
first stage's top passage holds that is another page's subject is a hyperlink: ppr and
reconstruct rank the pages it links to right below it (RetrievalParams.linked_pages,
workers.algorithms.subjects.linked_pages) — the second hop of a question its top passage
answers half of, which a keyword or vector search of the question alone does not find; and
where the name has no page, the first stage's best passage that holds it
(RetrievalParams.bridge_passages, workers.algorithms.subjects.bridge_passages)."""

import asyncio

from tests import inprocess
from tests.inprocess import answers_to, doc_ids
from workers.algorithms.retrieval import NO_LINKS, RetrievalParams
from workers.algorithms.subjects import bridge_passages, linked_pages, named_pages
from workers.query.links import links_of_top, with_links
from workers.query.request import QueryRequest

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


def test_a_second_hop_page_the_top_passage_links_to_ranks_second_in_graph_modes(real_embedder, redis_url):
    """The film's page names its director; her page says where she trained, in none of the
    question's words but "the" and "of". Hybrid ranks the film school's page second, and the walk
    reaches it first (the film and the port both pages name); ppr and reconstruct rank the director's page there
    — and did not before (NO_LINKS); so does ppr where no fact seeds its walk. With no
    passage kept in place (first_kept 0) there is no top passage to follow: no pages. On every
    store."""

    answers = answers_to(
        redis_url,
        real_embedder,
        DOCUMENTS,
        QUESTION,
        [
            ("hybrid", "hybrid", {}),
            ("ppr", "ppr", {}),
            ("reconstruct", "reconstruct", {}),
            ("ppr unlinked", "ppr", NO_LINKS),
            ("reconstruct unlinked", "reconstruct", NO_LINKS),
            ("ppr unseeded", "ppr", {"tau_q": 1.0}),  # no fact seeds the walk: the first stage answers
            ("ppr none kept", "ppr", {"first_kept": 0}),
            ("ppr none kept, no pages", "ppr", {"first_kept": 0, **NO_LINKS}),
        ],
    )
    for name, answer in answers.items():
        assert (answer.get("fallback") == "first_stage") == (name == "ppr unseeded"), answer
    assert answers["ppr"]["passages"][1]["subject"] == "Ottilie Brandvold"
    top = {name: doc_ids(answer) for name, answer in answers.items()}
    for mode in ("ppr", "reconstruct"):
        assert top[mode][:2] == ["harbour-lights", "brandvold"], top
        assert top[f"{mode} unlinked"][:2] != ["harbour-lights", "brandvold"], top
    assert top["ppr unseeded"][:2] == ["harbour-lights", "brandvold"], top
    assert top["ppr none kept"] == top["ppr none kept, no pages"], top
    assert top["hybrid"][0] == "harbour-lights" and top["hybrid"][1] != "brandvold", top


class SubjectsOnly:
    """A test double of the two store reads links_of_top makes (MemoryStore.passage_subjects,
    passages_entities), over a dict of passage id → (subject, entity ids)."""

    def __init__(self, passages: dict[str, tuple[str | None, list[str]]]):
        self.passages = passages

    async def passage_subjects(self, tenant, passage_ids):
        return [self.passages[pid][0] for pid in passage_ids]

    async def passages_entities(self, tenant, passage_ids):
        return [self.passages[pid][1] for pid in passage_ids]


def test_named_pages_lead_and_a_passage_links_to_no_passage_of_its_own_page():
    """The top passage links to no passage of its own page, but a question naming that page names
    its other passages too; a page both named and linked comes once, named pages first; each
    kind at most its parameter; none with no passage kept in place or an untitled top passage."""
    memory = SubjectsOnly(
        {
            "film-1": ("Harbour Lights", ["harbour_lights", "ottilie_brandvold", "varnes"]),
            "film-2": ("Harbour Lights", ["harbour_lights"]),
            "director": ("Ottilie Brandvold", ["ottilie_brandvold"]),
            "port": ("Varnes", ["varnes"]),
            "other": (None, ["varnes"]),
        }
    )
    top = {"id": "film-1", "subject": "Harbour Lights"}
    ranked = ["film-1", "film-2", "other", "port", "director"]

    def pages(query: str, **params) -> list[str]:
        request = QueryRequest(query, "t", 5, "ppr", RetrievalParams(**params))
        return asyncio.run(links_of_top(memory, request, top, ranked, {}, kept=request.params.first_kept))

    assert pages("Did Ottilie Brandvold film Harbour Lights?") == ["film-2", "director", "port"]
    assert pages("Where was it shot?") == ["port", "director"]  # linked only: not film-2
    assert pages("Where is Varnes?") == ["port", "director"]  # named, then the other link
    assert pages("Where is Varnes?", linked_pages=0) == ["port"]
    assert pages("Where is Varnes?", named_pages=0, linked_pages=1) == ["port"]
    assert pages("Where is Varnes?", first_kept=0) == []
    assert (
        asyncio.run(
            links_of_top(
                memory, QueryRequest("q", "t", 5, "ppr", RetrievalParams()), {"id": "other"}, ranked, {}, kept=1
            )
        )
        == []
    )


RIVER_DOCUMENTS = [
    (
        "bubye",
        "Bubye River",
        "The Bubye River is a river in southern Zimbabwe. It rises near Mberengwa and flows south "
        "for about 350 kilometres through dry bush.",
    ),
    (
        "victoria",
        "Victoria Falls",
        "Victoria Falls lies on the Zambezi in Zimbabwe, where the river drops 108 metres into a "
        "gorge. Its spray can be seen from far away.",
    ),
    (
        "angel",
        "Angel Falls",
        "Angel Falls is the name of the tallest waterfall in the world, in the country of Venezuela. "
        "The waterfall drops from the edge of a mountain.",
    ),
    (
        "niagara",
        "Niagara Falls",
        "Niagara Falls is the name of a group of three waterfalls on the river between Canada and "
        "New York. The country of Canada owns the largest waterfall.",
    ),
    (
        "kaieteur",
        "Kaieteur Falls",
        "Kaieteur Falls is a waterfall on the Potaro in Guyana, one of the most powerful waterfalls in the world.",
    ),
]
RIVER_QUESTION = "What is the name of the waterfall in the country where the Bubye River is found?"


def test_a_bridge_passage_is_the_first_stages_best_that_holds_a_name_of_the_top_passage():
    """The river's page names Zimbabwe, which has no page of its own; the waterfall of Zimbabwe is
    the first stage's best passage that names it, below waterfalls of other countries that match
    the question's words. A name the question holds is the first hop, no bridge; a name more than
    half the candidates hold selects nothing."""
    entities_of = {
        "angel": {"venezuela"},
        "niagara": {"canada", "new_york"},
        "victoria": {"zimbabwe", "zambezi"},
        "mberengwa": {"mberengwa", "bubye_river"},
        "kaieteur": {"guyana", "potaro_river"},
    }
    ranked = ["angel", "mberengwa", "niagara", "victoria", "kaieteur"]
    links = {"zimbabwe", "mberengwa", "bubye_river"}
    assert bridge_passages(RIVER_QUESTION, links, ranked, entities_of, set(), 1) == ["mberengwa"]
    assert bridge_passages(RIVER_QUESTION, links, ranked, entities_of, {"mberengwa"}, 1) == ["victoria"]
    assert bridge_passages(RIVER_QUESTION, {"zimbabwe", "bubye_river"}, ranked, entities_of, set(), 2) == ["victoria"]
    assert bridge_passages(RIVER_QUESTION, links, ranked, entities_of, set(), 0) == []
    crowded = {pid: ids | {"zimbabwe"} for pid, ids in entities_of.items() if pid != "angel"}
    assert bridge_passages(RIVER_QUESTION, {"zimbabwe"}, ranked, crowded, set(), 1) == []  # 4 of 5 name it


def test_a_second_hop_whose_name_has_no_page_ranks_second_in_graph_modes(real_embedder, redis_url):
    """The river's page is the first hop; Zimbabwe, the name it holds that the question does not,
    has no page, so no page links it; the waterfall page that names Zimbabwe shares none of the
    question's words but "the" with it, and the first stage ranks pages of other waterfalls
    second. ppr and reconstruct rank it second; reconstruct did not before (bridge_passages 0),
    nor ppr without its walk (which in a graph this small reaches the page through Zimbabwe).
    On every store."""

    runs = [
        ("hybrid", "hybrid", {}),
        ("ppr", "ppr", {}),
        ("reconstruct", "reconstruct", {}),
        ("ppr unwalked", "ppr", {"walk_weight": 0.0}),
        ("ppr unwalked unbridged", "ppr", {"walk_weight": 0.0, "bridge_passages": 0}),
        ("reconstruct unbridged", "reconstruct", {"bridge_passages": 0}),
    ]
    top = {
        name: doc_ids(answer)
        for name, answer in answers_to(redis_url, real_embedder, RIVER_DOCUMENTS, RIVER_QUESTION, runs).items()
    }
    assert top["hybrid"][0] == "bubye" and top["hybrid"][1] != "victoria", top
    for mode in ("ppr", "ppr unwalked", "reconstruct"):
        assert top[mode][:2] == ["bubye", "victoria"], top
    for mode in ("ppr unwalked", "reconstruct"):
        assert top[f"{mode} unbridged"][:2] != ["bubye", "victoria"], top


def test_a_bridge_is_a_current_passage_of_another_page_not_kept_in_place():
    """The river page's other passage names Zimbabwe too, but a passage links to no passage of
    its own page; a passage with no row (retired) is none; a passage kept in place (first_kept 2)
    is none; then the waterfall's page is the bridge, below the pages. A name exactly half the
    candidates hold is still a bridge."""
    memory = SubjectsOnly(
        {
            "river-1": ("Bubye River", ["bubye_river", "zimbabwe", "limpopo"]),
            "river-2": ("Bubye River", ["bubye_river", "zimbabwe"]),
            "retired": ("Old Falls", ["zimbabwe"]),
            "angel": ("Angel Falls", ["venezuela"]),
            "victoria": ("Victoria Falls", ["zimbabwe", "zambezi"]),
            "limpopo": ("Limpopo", ["limpopo"]),
        }
    )
    first = ["river-1", "river-2", "retired", "angel", "victoria", "limpopo"]
    rows = {pid: {"id": pid, "subject": memory.passages[pid][0]} for pid in first if pid != "retired"}

    def links(**params) -> list[str]:
        request = QueryRequest(RIVER_QUESTION, "t", 5, "ppr", RetrievalParams(**params))
        return asyncio.run(
            links_of_top(memory, request, rows["river-1"], first, rows, first, kept=request.params.first_kept)
        )

    # the question names the river: its other passage is a named page, and no bridge
    assert links() == ["river-2", "limpopo", "victoria"]
    assert links(named_pages=0, linked_pages=0) == ["victoria"]
    assert links(named_pages=0, linked_pages=0, bridge_passages=0) == []
    assert links(named_pages=0, linked_pages=0, first_kept=2) == ["victoria"]  # river-2 kept: none anyway
    kept_victoria = ["river-1", "victoria", "angel", "limpopo"]
    request = QueryRequest(RIVER_QUESTION, "t", 5, "ppr", RetrievalParams(named_pages=0, linked_pages=0, first_kept=2))
    assert asyncio.run(links_of_top(memory, request, rows["river-1"], first, rows, kept_victoria, kept=2)) == [
        "limpopo"
    ]
    # of four candidates two hold Limpopo: at most half, a bridge (three of four: none)
    holding = {"limpopo": {"limpopo"}, "victoria": {"limpopo"}}
    four = ["angel", "limpopo", "victoria", "kaieteur"]
    assert bridge_passages(RIVER_QUESTION, {"limpopo"}, four, holding, set(), 1) == ["limpopo"]
    holding["angel"] = {"limpopo"}
    assert bridge_passages(RIVER_QUESTION, {"limpopo"}, four, holding, set(), 1) == []


def test_the_pages_go_below_as_many_passages_as_the_walks_fusion_kept():
    """In a tenant of turns and titled documents, the walk's fusion keeps the first stage's top
    two where most candidates are turns (retrieval.kept_first): the top passage's pages go below
    both, not between them, and with none kept there are none."""
    memory = SubjectsOnly(
        {
            "film-1": ("Harbour Lights", ["harbour_lights", "ottilie_brandvold", "varnes"]),
            "turn-1": (None, ["varnes"]),
            "director": ("Ottilie Brandvold", ["ottilie_brandvold"]),
            "port": ("Varnes", ["varnes"]),
        }
    )
    first = ["film-1", "turn-1", "director", "port"]
    ranked = [("film-1", 1.0), ("turn-1", 0.5), ("director", 0.4), ("port", 0.3)]
    rows = {pid: {"id": pid, "subject": memory.passages[pid][0]} for pid in first}

    def answer(kept: int, **params) -> list[str]:
        request = QueryRequest("Where was it shot?", "t", 5, "ppr", RetrievalParams(**params))
        return [pid for pid, _ in asyncio.run(with_links(memory, request, first, ranked, rows, kept))]

    assert answer(1) == ["film-1", "director", "port", "turn-1"]
    assert answer(2) == ["film-1", "turn-1", "director", "port"]
    assert answer(2, first_kept=0) == ["film-1", "turn-1", "director", "port"]  # what the fusion kept counts
    assert answer(0) == first
