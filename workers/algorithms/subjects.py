"""A document's subject: the entity its title names (topics.Document.title). Every passage of a
titled document holds its subject entity, so a passage of another document that names the same
entity (its extractor's mention, normalised to the same entity id: workers.algorithms.normalize)
shares a node with it — the hyperlink a Wikipedia page or a note's link would make, found
without an LLM and in any order of arrival, since both sides derive the node from the name.

At query time a subject joins pages to the question and to the first stage's top passage
(`named_pages`, `linked_pages`), and the top passage's other names join it to the first stage's
passages that hold them (`bridge_passages`); ppr and reconstruct rank them right below that
passage (workers.query.links)."""

from __future__ import annotations

import re
from collections import Counter
from typing import Sequence

from workers.algorithms.chunking import TextChunk
from workers.algorithms.normalize import content_hash, has_entity_id, mention_words
from workers.algorithms.reconstruction import STOPWORDS

# a trailing qualifier in parentheses ("The Prestige (film)", "Mercury (planet)"): Wikipedia's
# way, and a notes corpus's, of keeping two pages of one name apart; a passage names the thing
# without it ("The Prestige")
_QUALIFIER = re.compile(r"\s*\([^()]*\)\s*$")
# a name more than this share of the first stage's candidates hold is no bridge (bridge_passages)
BRIDGE_HUB_SHARE = 0.5


def subject_name(title: str | None) -> str:
    """The name of the entity a title makes a document's subject: the title without a trailing
    parenthesised qualifier and surrounding whitespace; '' when it names nothing (no title, a
    title of only punctuation)."""
    if not title:
        return ""
    name = " ".join(title.split())
    bare = _QUALIFIER.sub("", name)
    name = bare if has_entity_id(bare) else name
    return name if has_entity_id(name) else ""


def titled_chunk_id(subject: str, text: str) -> str:
    """A titled document's passage id: of its subject and text, so the same words under two
    titles are two passages, each holding its own subject (an untitled document's passage id
    is its text's hash alone: workers.algorithms.chunking.chunk_id_of)."""
    return content_hash("\x1f".join(("subject", subject, text)))[:32]


def titled_pieces(subject: str, pieces: list[TextChunk]) -> list[TextChunk]:
    """A document's pieces with the ids of its subject's passages (unchanged without one)."""
    if not subject:
        return pieces
    return [TextChunk(titled_chunk_id(subject, p.text), p.seq, p.text) for p in pieces]


def named_pages(query: str, top: str, ranked: Sequence[str], subject_of: dict[str, str], k: int) -> list[str]:
    """The pages the question names: of `ranked` (passage ids, best first), the first `k` other
    than `top` whose subject (`subject_of`: passage id → its subject's entity id) the query's
    words name — the longest such run of words, none overlapping a longer one, as reconstruct's
    cues are chosen (workers.algorithms.reconstruction.choose_mentions): "Are King Vidor and Géza
    von Cziffra both American directors?" names both directors' pages. Matched word for word
    (the words entity ids are made of: normalize.mention_words), so a query costs a pass per
    candidate subject, not an entity id per span of it (~0.4–0.9 ms for HotpotQA's questions).
    A subject of stop words alone ("The Who") is named by no question."""
    if k <= 0:
        return []
    words = mention_words(query)
    at: dict[str, list[int]] = {}
    for i, word in enumerate(words):
        at.setdefault(word, []).append(i)
    found = []  # (words, start, subject)
    for sid in set(subject_of.values()):
        parts = sid.split("_")
        if all(part in STOPWORDS for part in parts):
            continue
        n = len(parts)
        found += [(n, i, sid) for i in at.get(parts[0], ()) if words[i : i + n] == parts]
    named: set[str] = set()
    covered: set[int] = set()
    for n, i, sid in sorted(found, key=lambda f: (-f[0], f[1])):  # longest first, then in query order
        span = set(range(i, i + n))
        if not span & covered:
            named.add(sid)
            covered |= span
    return _pages_of(named, top, ranked, subject_of, k)


def bridge_passages(
    query: str, links: set[str], ranked: Sequence[str], entities_of: dict[str, set[str]], placed: set[str], k: int
) -> list[str]:
    """The second hop where no page of it is titled: of `ranked` (the first stage's candidates,
    best first, the top passage left out), the first `k` not `placed` already that name one of
    the top passage's bridge entities — the names it holds (`links`) that the question does not
    (a first hop's name, not a bridge) and that at most half the candidates name
    (BRIDGE_HUB_SHARE: a name most of them share links everything and selects nothing).
    `entities_of`: passage id → its entity ids. "What is the waterfall in the country where the
    Bubye River is found?": the river's page names Zimbabwe, the question does not; ppr ranked
    Victoria Falls' page, which names Zimbabwe, twelfth, below waterfalls of other countries.
    The first stage's order picks them better than the walk's, which ranks the passages sharing
    the top passage's names high already: MuSiQue-100 (replay) ppr R@2 / R@5 59.9 / 77.2 against
    57.6 / 74.4 when ppr's ranking picks them (74.1 with none)."""
    if k <= 0 or not links:
        return []
    words = f" {' '.join(mention_words(query))} "
    named = {eid for eid in links if f" {' '.join(mention_words(eid))} " in words}
    shared = Counter(eid for pid in ranked for eid in entities_of.get(pid, ()) if eid in links)
    bridges = links - named - {eid for eid, n in shared.items() if n > BRIDGE_HUB_SHARE * len(ranked)}
    return [pid for pid in ranked if pid not in placed and entities_of.get(pid, set()) & bridges][:k]


def linked_pages(links: set[str], top: str, ranked: Sequence[str], subject_of: dict[str, str], k: int) -> list[str]:
    """The pages a passage links to, as a titled corpus's hyperlinks: of `ranked` (passage ids,
    best first), the first `k` other than `top` whose subject (`subject_of`) is one of `links` —
    the entities `top` names, its own subject left out. The first stage's top passage is the
    first hop of a multi-hop question; the page of a name it holds is the likeliest second
    ("Which university did the director of Inception attend?": the film's page names
    Christopher Nolan, whose page answers). On HotpotQA-100 (rules) 46 of the 69 pages its top
    passages link to were gold."""
    if k <= 0 or not links:
        return []
    return _pages_of(links, top, ranked, subject_of, k)


def _pages_of(subjects: set[str], top: str, ranked: Sequence[str], subject_of: dict[str, str], k: int) -> list[str]:
    """The first `k` of `ranked` other than `top` whose subject is one of `subjects`."""
    return [pid for pid in ranked if pid != top and subject_of.get(pid) in subjects][:k]
