"""The routers of a reconstruct walk (workers.query.reconstruct): each chooses the walk's next
branch among the open ones, or stops. `SimilarityRouter` (offline, the default) takes the best
branch by score, stopping once the best open one falls STOP_MARGIN below the best taken;
`LLMRouter` (MEMSTREAM_ROUTER=llm) asks the model, through the OpenAI-compatible client, for
the key of the branch to take or to stop — the walk falls back to the similarity router when
it fails."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Protocol

from workers.algorithms.reconstruction import STOP_MARGIN, Branch, Stop, ranked, similarity_choice
from workers.models.llm import LLMClient
from workers.models.prompts import ROUTE_SCHEMA, route_messages

ROUTE_SHORTLIST = 8  # branches the LLM router is shown, best by similarity first


@dataclass(frozen=True)
class Route:
    branch: Branch | None  # the branch to take; None: stop
    stop: Stop | None = None
    why: str = ""


class Router(Protocol):
    """Chooses the walk's next branch among the open ones (in no order: a router ranks what it
    reads of them — reconstruction.best, ranked) or stops."""

    name: str

    async def choose(
        self, question: str, facts: list[str], passages: list[str], branches: list[Branch], best_taken: float | None
    ) -> Route: ...


class SimilarityRouter:
    name = "similarity"

    def __init__(self, margin: float = STOP_MARGIN):
        self.margin = margin

    async def choose(self, question, facts, passages, branches, best_taken) -> Route:
        choice = similarity_choice(branches, best_taken, self.margin)
        return Route(None, choice) if isinstance(choice, Stop) else Route(choice, why="best score")


class LLMRouter:
    """Shows the model the question, the evidence read and the best ROUTE_SHORTLIST branches, each
    by its key ("fact:<id>" or "passage:<id>"); it answers the key of the branch to take, or stop.
    A key not offered is malformed output (one repair round, then MalformedOutput: the walk falls
    back to the similarity router)."""

    name = "llm"

    def __init__(self, llm: LLMClient):
        self.llm = llm

    async def choose(self, question, facts, passages, branches, best_taken) -> Route:
        shortlist = ranked(branches)[:ROUTE_SHORTLIST]
        if not shortlist:
            return Route(None, Stop("exhausted", "no open branch adds a fact, passage or cue"))
        offered = {b.key: b for b in shortlist}
        messages = route_messages(question, facts, passages, [(b.key, b.cue.name, b.chain) for b in shortlist])

        def validate(value) -> Route:
            if (
                not isinstance(value, dict)
                or not isinstance(value.get("stop"), bool)
                or not isinstance(value.get("reason", ""), str)
            ):
                raise ValueError("expected an object with branch, stop (boolean) and reason")
            if value["stop"]:
                return Route(None, Stop("router", value.get("reason") or "the router says the evidence suffices"))
            if value.get("branch") not in offered:
                raise ValueError(f"branch {value.get('branch')!r} is not one of the open branches {sorted(offered)}")
            return Route(offered[value["branch"]], why=value.get("reason", ""))

        return await self.llm.structured("route", messages, "route", ROUTE_SCHEMA, validate)
