"""The lexical leg's text rules, one place for both stores (pure: no Redis, no bm25s).

A passage is full-text indexed as its context line (a turn's speaker and date) and its text,
turned here into the terms BM25 counts: runs of letters, digits and underscores (every other
character separates, as in RediSearch's tokenizer), lowercased, RediSearch's default English
stop words dropped, each word reduced to its Snowball English stem (PyStemmer). The terms are
stored with the passage (`LEXICAL_FIELD`, space-separated) and both stores index exactly them:
Redis as a TEXT field with no stemming of its own and no stop words (the terms are final), the
in-memory store with bm25s. A query goes through the same rules (search_terms), and leaves out
a longer list of stop words besides (query_stop_words): a passage's terms keep them.

Both score with Okapi BM25 in Lucene's form,

    idf(t) = ln(1 + (N − n_t + 0.5) / (n_t + 0.5)),  tf·(k1 + 1) / (tf + k1·(1 − b + b·|d| / avgdl))

k1 = 1.2, b = 0.5: Redis's BM25STD scorer, and bm25s's `method="lucene"` with these constants
(times k1 + 1, which bm25s's form leaves out).
Letting Redis stem and stop on its own instead gave the same top passages but scores 2–5× apart
(it matches a query term's exact form and its stem as two terms); on one set of terms, with
RediSearch's b (0.5, not Lucene's 0.75: its EXPLAINSCORE shows it), the two stores give the same
passages in the same order with the same scores to float precision (tests/test_lexical.py), once
a new index's initial scan is awaited (store.memory.Memory._initial_scan_done: a key written during
that scan is indexed twice and its terms counted twice for good).

Chosen by measuring BM25 alone on the LoCoMo dev conversations (turn text and speaker, R@5 /
R@10): Snowball stems and RediSearch's stop words 54.0 / 61.0; without stemming 48.9 / 58.0;
without stop words 53.1 / 61.1; bm25s's longer English list 54.0 / 61.0 (the same) — in the
passages and the query both; in the query alone it was chosen later, for speed at scale and
LoCoMo's temporal questions (query_stop_words).

The query is the set of its distinct terms, any of which may match (a union: BM25 ranks by how
many and how rare)."""

from __future__ import annotations

import math
import re
from functools import lru_cache

LEXICAL_FIELD = "lexical"  # the passage hash field holding its terms (Redis indexes it as TEXT)
LEXICAL_LENGTH_FIELD = "lexical_len"  # how many terms (BM25's |d|; Redis sums it for a tenant's avgdl)
K1, B = (
    1.2,
    0.5,
)  # Redis BM25STD's constants (its EXPLAINSCORE shows them), fixed there: the in-memory store uses the same

# RediSearch's default stop words (FT.CREATE without STOPWORDS): the in-memory store drops the same.
STOP_WORDS = frozenset(
    "a is the an and are as at be but by for if in into it no not of on or such that their then there these they this to was will with".split()
)

_TOKEN = re.compile(r"\w+")  # RediSearch: every punctuation mark and whitespace separates, underscores do not
MAX_QUERY_TERMS = 64  # a query's distinct terms sent to the index (a 4,096-character query has at most ~700)


def tokens(text: str) -> list[str]:
    """The text's words as the index sees them: lowercased, stop words out, in order."""
    return [t for t in _TOKEN.findall((text or "").lower()) if t not in STOP_WORDS]


@lru_cache(maxsize=1)
def query_stop_words() -> frozenset[str]:
    """The words a query leaves out beyond STOP_WORDS: NLTK's English list as bm25s ships it
    (179 words: question words, pronouns, auxiliaries, the "s" of a possessive). A passage
    keeps them (its terms and |d| as ever: no index changes); a query asks only for the rest.
    Each one is in a large share of a memory's passages — at 200,000 passages "s" is in 48%,
    "from" 28%, "i" 25%, "he" 21%, "which" 15%, "who" 13% — so BM25 gives it little weight,
    and the query engine still walks its postings: the union a question's terms match fell
    from 83,100 to 49,700 passages (p50 of 100 `bench scale` questions), its search 12.7 →
    6.3 ms p50 (50,000 passages: 5.1 → 2.5). Recall on the three dev sets: docs/benchmarks.md."""
    from bm25s.stopwords import STOPWORDS_EN_PLUS

    return frozenset(STOPWORDS_EN_PLUS) - STOP_WORDS


def query_terms(text: str) -> list[str]:
    """A query's distinct terms, in order of first appearance (at most MAX_QUERY_TERMS): its
    words but the stop words of both lists; a query of stop words alone ("Who are you?") keeps
    those of the longer list, so it still asks for something."""
    words = list(dict.fromkeys(tokens(text)))
    dropped = query_stop_words()
    return ([w for w in words if w not in dropped] or words)[:MAX_QUERY_TERMS]


@lru_cache(maxsize=1)
def _stemmer():
    import Stemmer  # PyStemmer: Snowball, the algorithm RediSearch stems English with

    return Stemmer.Stemmer("english")


def stems(words: list[str]) -> list[str]:
    """Each word's Snowball English stem."""
    return _stemmer().stemWords(words) if words else []


def passage_terms(context: str | None, text: str | None, preceding_text: str | None = None) -> str:
    """What a passage is indexed as (LEXICAL_FIELD): the stems of its context line and text,
    space-separated, in order — and for a conversation turn indexed after the turn before it
    (workers.algorithms.turns), then the stems of that turn's text: "At the beach, with the
    kids." matches "camp" after "Where did you camp?", as its vector embeds that turn too.
    Measured on the LoCoMo dev conversations (all-MiniLM-L6-v2, rules extractor), R@5 / R@10:
    lexical 56.3 / 62.7 → 65.8 / 74.2, ppr 70.5 / 77.9 → 71.4 / 79.6 (docs/benchmarks.md)."""
    own = stems(tokens(f"{context or ''}\n{text or ''}"))
    return " ".join(own + (stems(tokens(preceding_text)) if preceding_text else []))


def term_count(terms: str | None) -> int:
    """|d|: how many terms a passage's LEXICAL_FIELD holds."""
    return len((terms or "").split())


def bm25_idf(query_terms: list[str], document_frequency: dict[str, int], count: int) -> dict[str, float]:
    """Each query term's BM25 idf in a collection of `count` documents; terms no document holds
    are left out (they score nothing)."""
    return {
        t: math.log(1.0 + (count - n + 0.5) / (n + 0.5)) for t in query_terms if (n := document_frequency.get(t, 0)) > 0
    }


def document_frequency(query_terms: list[str], documents: dict[str, list[str]]) -> dict[str, int]:
    """How many of `documents` (id → terms) hold each query term."""
    return {t: sum(1 for held in documents.values() if t in held) for t in query_terms}


SCORE_DIGITS = 9  # BM25 scores equal to this many decimals are one score: ranked by id


def by_score(score: float, record_id: str) -> tuple[float, str]:
    """The rank order of a scored passage: best first, equal scores by id. Equal to SCORE_DIGITS
    decimals: RediSearch sums a passage's term scores in an order its index's options change
    (store.redis.lexical_index.OWN_LEXICAL_OPTIONS moved 2 of 100 questions' scores in their last bit, one
    pair of equal passages swapping), as two sums in another order differ in theirs."""
    return (-round(score, SCORE_DIGITS), record_id)


def bm25(
    query_terms: list[str],
    documents: dict[str, list[str]],
    document_frequency: dict[str, int],
    count: int,
    average_length: float,
) -> dict[str, float]:
    """Each document's BM25 score for `query_terms` (the formula above, k1 and b above), given
    the collection's statistics: how many of its documents hold each term, how many documents
    it has, their average length. Documents holding no query term score 0 and are left out."""
    idf = bm25_idf(query_terms, document_frequency, count)
    scores: dict[str, float] = {}
    for doc_id, terms in documents.items():
        held = [
            (t, tf) for t in idf if (tf := terms.count(t))
        ]  # list.count: a third of Counter's time over 1,000 candidates
        if not held:
            continue
        norm = K1 * (1.0 - B + B * len(terms) / average_length) if average_length > 0 else K1
        scores[doc_id] = sum(idf[t] * tf * (K1 + 1.0) / (tf + norm) for t, tf in held)
    return scores


def search_terms(query: str) -> list[str]:
    """A query's distinct stems, in order of first appearance (at most MAX_QUERY_TERMS)."""
    return list(dict.fromkeys(stems(query_terms(query))))


def redis_query(terms: list[str]) -> str:
    """The FT.SEARCH query matching any of `terms` (search_terms output: letters, digits and
    underscores only, so nothing in them needs escaping) in LEXICAL_FIELD. Send it VERBATIM: the
    query engine otherwise adds each term's own stem at query time, a NOSTEM field or not
    ("continent" also matched the passages holding "contin", of "continental": MuSiQue-100, 36
    passages where 16 hold the term), so its document counts and BM25STD scores were not the
    terms'."""
    return f"@{LEXICAL_FIELD}:({'|'.join(terms)})"
