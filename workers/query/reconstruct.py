"""Query mode "reconstruct": recall step by step, as a person does.

1. Cues from the query: the entities it names (spans whose entity id, aliases resolved, the
   memory holds; else the entities nearest the query vector), its times and its remaining
   attribute words (workers.algorithms.reconstruction).
2. Tags: each entity cue's active facts — as head or tail — ranked by the facts index's
   similarity to the query, and the ENTITY_PASSAGES passages that mention it nearest the query;
   the attribute cue's tags are the facts nearest the query, whatever their entities, and the
   QUERY_PASSAGES passages nearest it (the dense ranking's top). A (cue → tag) pair is a branch.
3. A router takes one branch a step: its content is the fact and its evidence passages, or the
   passage.
4. The reverse step: a fact's other entity and the entities of the passages read (those that
   name something: not "I'm", "That's") become new cues (one hop further), whose tags become new
   branches, scored by their chain (the texts that led there and this tag; scored as the sum
   of their vectors, read once per walk — chain_cosines — with no model call); a
   passage past the first hop scores no more than the branch that raised its cue. Temporal
   contiguity: a conversation turn read (metadata session_id and turn) also becomes an "episode"
   cue whose tags are its session's turns at most EPISODE_RADIUS from it — recalling one moment
   brings back its neighbours, as in human free recall — scored by the same chain rule and cap,
   nearer and later turns first at equal scores (reconstruction.episode_score).
5. It stops when no open branch adds anything, the router says the evidence suffices, or the
   budget (steps, passages, tokens) is spent. The cues of the step that spends it are recorded
   but their tags not searched (no step follows to take them) unless nothing else is open,
   where they tell which of the first and the last reasons holds: a seventh of a walk's
   searches.

On the LoCoMo dev conversations (../shared/data/locomo_dev, 495 questions; the engine's first
stage, episodes and fusion, see engine.py): R@5 / R@10 66.0 / 75.4 against hybrid 61.1 / 69.9,
p50 10.8 ms. Earlier, on our own sample conversation, before the first stage (dense only):
Measured on the conversation benchmark (ops/sample_conversation/maya-jonas.json, 36 questions,
rules extractor, all-MiniLM-L6-v2, in-memory): R@5 / R@10 overall 69.2 / 81.0 (dense 64.1 /
75.5), multi-hop 67.4 / 83.3 (dense 64.4 / 87.9), temporal 81.2 / 87.5 (75.0 / 81.2), single hop
73.1 / 80.8 (equal), adversarial 37.5 / 62.5 (12.5 / 12.5); p50 126 ms (the chains are embedded
per step). Before episode cues: 64.1 / 75.5 and multi-hop 64.4 / 87.9, equal to dense — the rules
extractor's entities rarely join a multi-hop question's turns ("Dolores" / "Dolores Okafor",
"Henrik" / "Henrik's" are different ids); most are joined by being neighbouring turns (a
question and its reply). Multi-hop R@10 falls below dense: the turns read (first in the
response) push dense's ranks 7–10 out, and some of those are evidence. EPISODE_RADIUS 2 measured
multi-hop 70.5 / 83.3 but overall 67.4 / 82.4 (6 steps); 1 is the default. Ordering the top k by
branch score instead of reading order changes nothing here (the similarity router reads best
first); merging the walk's and the dense ranking's passages by score: R@5 the same, R@10 78.2.

Two routers behind `Router`: `SimilarityRouter` (offline, the default: the best branch by
score, stopping once the best open one falls STOP_MARGIN below the best taken) and `LLMRouter`
(`MEMSTREAM_ROUTER=llm`: the model picks the branch by its key, "fact:<id>" or "passage:<id>", or stops, through the
OpenAI-compatible client; when it fails the walk goes on with the similarity router and the
response says so). The response carries the path: each step's cue → tag → content with scores,
and why the walk stopped. The answer's passages are the first stage's ranking (the engine's
hybrid of BM25 and dense) fused with the walk's, the passages read in reading order
(`read_weight`, workers.algorithms.retrieval.fuse_walk): the walk re-ranks the first stage below
its top passage (`first_kept`; its top two over conversation turns, `turn_first_kept`) and never
empties it, and top_k is always filled ("via": "walk" for a passage the walk read,
"first_stage" for the rest). The query cue's passages are the first stage's top, with their
cosines to the query.

Here the mode (`Reconstructor`: its router and default budget); one query's walk in
workers.query.reconstruct_walk, the routers in workers.query.routing, the answer a walk gives in
workers.query.reconstruct_result."""

from __future__ import annotations

from typing import Awaitable

import numpy as np

from topics import BadInput
from workers.algorithms.reconstruction import DEFAULT_BUDGET, Budget
from workers.algorithms.retrieval import FirstStage
from workers.models.llm import LLMClient
from workers.query.answers import QueryResult
from workers.query.reconstruct_walk import FactSearch, Walk
from workers.query.routing import LLMRouter, Router, SimilarityRouter


class Reconstructor:
    """Mode "reconstruct" of a query worker: its router and default budget."""

    def __init__(self, memory, router: Router | None = None, budget: Budget = DEFAULT_BUDGET):
        self.memory = memory
        self.router = router or SimilarityRouter()
        self.budget = budget.check()
        self.owned_llm: LLMClient | None = None  # the LLM router's client from_settings made: aclose closes it

    @classmethod
    def from_settings(cls, settings, memory) -> "Reconstructor":
        """MEMSTREAM_ROUTER (similarity | llm, the LLM at MEMSTREAM_LLM_*) and the default budget
        MEMSTREAM_RECONSTRUCT_STEPS / _PASSAGES / _TOKENS; ValueError for a bad one."""
        budget = Budget(settings.reconstruct_steps, settings.reconstruct_passages, settings.reconstruct_tokens)
        try:
            budget.check()
        except ValueError as exc:
            raise BadInput(f"MEMSTREAM_RECONSTRUCT_*: {exc}") from None
        llm = (
            LLMClient(settings.llm_config(), memory.llm_cache(settings.llm_model)) if settings.router == "llm" else None
        )
        made = cls(memory, LLMRouter(llm) if llm else None, budget)
        made.owned_llm = llm
        return made

    async def aclose(self) -> None:
        if self.owned_llm is not None:
            await self.owned_llm.aclose()

    async def answer(
        self,
        request,
        vector: np.ndarray,
        facts: FactSearch,
        timings: dict[str, float],
        first: Awaitable[FirstStage],
    ) -> QueryResult:
        """The walk; `first` (the first stage, not yet awaited) runs while the query's cues are
        found and their branches searched, which need no first stage."""
        budget = (request.budget or Budget()).over(self.budget)
        walk = Walk(self, request, np.asarray(vector, dtype=np.float32), facts, budget)
        return await walk.run(timings, first)
