"""The query modes, as values, and the bound on top_k, in one light module: the engine answers
them, and the CLI, the MCP server and the explorer offer them without importing the engine
(numpy, scipy, the store). A mode is its name, what it is good for (the hint an agent or a person
chooses by) and its recipe: the steps the engine runs for it. Adding a mode is a `register` call
in its own module; every place that offers or answers modes reads the registry (`registered`)."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Literal, get_args

# The engine's step sequences (workers.query.engine.QueryEngine.answer), in the order benchmark
# tables show them (each leg, the first stage, then what re-ranks it):
# - "lexical": the store's BM25 alone (no model: the query is not embedded);
# - "dense": KNN over the passages alone;
# - "first_stage": BM25 and dense, fused (with episodes for conversation turns);
# - "walk": the first stage re-ranked by PPR over entities and facts;
# - "reconstruct": the first stage re-ranked by the cue → tag → content walk.
Recipe = Literal["lexical", "dense", "first_stage", "walk", "reconstruct"]
RECIPES: tuple[Recipe, ...] = get_args(Recipe)
QueryMode = str  # a registered mode's name
MAX_TOP_K = 100  # passages a query may ask for (top_k from 1 to this)
DEFAULT_MODE = "ppr"


@dataclass(frozen=True)
class Mode:
    name: str
    hint: str  # what it is good for, for whoever chooses a mode (the MCP tool's schema, --help)
    recipe: Recipe

    @property
    def embeds(self) -> bool:
        """Whether the query is embedded (every recipe but the lexical one uses the model)."""
        return self.recipe != "lexical"

    @property
    def walks(self) -> bool:
        """Whether a reconstruct walk runs: only its modes take a `budget`."""
        return self.recipe == "reconstruct"


_REGISTRY: dict[str, Mode] = {}


def register(mode: Mode) -> Mode:
    """Add a mode (ValueError for a taken name, an unknown recipe or a name that is not a word)."""
    if not mode.name or not mode.name.replace("-", "").replace("_", "").isalnum():
        raise ValueError(f"a mode's name is a word (letters, digits, - or _), not {mode.name!r}")
    if mode.name in _REGISTRY:
        raise ValueError(f"mode {mode.name!r} is registered already")
    if mode.recipe not in RECIPES:
        raise ValueError(f"mode {mode.name!r}: recipe {mode.recipe!r} is not one of {', '.join(RECIPES)}")
    _REGISTRY[mode.name] = mode
    return mode


def unregister(name: str) -> None:
    """Take a mode out (a test's toy mode); the built-in ones stay."""
    if name in BUILT_IN:
        raise ValueError(f"mode {name!r} is built in")
    _REGISTRY.pop(name, None)


def registered() -> tuple[Mode, ...]:
    """Every mode, the default first, then in the order they were registered."""
    return tuple(sorted(_REGISTRY.values(), key=lambda m: m.name != DEFAULT_MODE))


def mode_names() -> tuple[str, ...]:
    return tuple(mode.name for mode in registered())


def table_order() -> tuple[str, ...]:
    """The modes in a benchmark table's order: by recipe (RECIPES), then as registered."""
    return tuple(m.name for m in sorted(registered(), key=lambda m: RECIPES.index(m.recipe)))


def query_mode(value: object) -> QueryMode | None:
    """`value` as a query mode's name, None when no mode has it."""
    return value if isinstance(value, str) and value in _REGISTRY else None


def mode_of(name: str) -> Mode:
    """The registered mode of that name (ValueError naming the modes when none is)."""
    found = _REGISTRY.get(name)
    if found is None:
        raise ValueError(f"unknown query mode {name!r}; the modes: {', '.join(mode_names())}")
    return found


BUILT_IN = tuple(
    register(mode).name
    for mode in (
        Mode("ppr", "follows facts and entities across passages: multi-hop questions", "walk"),
        Mode("dense", "ranks passages by embedding similarity to the query alone", "dense"),
        Mode(
            "lexical",
            "ranks passages by BM25 keyword match alone (no model): exact names, numbers, rare words",
            "lexical",
        ),
        Mode(
            "hybrid",
            "fuses keyword (BM25) and embedding rankings: the first stage every graph mode starts from",
            "first_stage",
        ),
        Mode(
            "reconstruct",
            "recalls step by step (cue → tag → content → new cue) and returns the path it took",
            "reconstruct",
        ),
    )
)
