"""A query as the worker takes it: the POST /v1/query body parsed strictly into a QueryRequest
(every way it can be wrong a ContractError naming the field), before anything runs — no NaN, no
infinity, no unencodable text, a registered mode, retrieval parameters inside `PARAM_RANGES`."""

from __future__ import annotations

import json
import math
from dataclasses import asdict, dataclass
from difflib import get_close_matches

from topics import ContractError, tenant_or_default
from topics.contract import QUOTED_CHARS, quoted, quoted_names
from workers.algorithms.expiry import parse_as_of
from workers.algorithms.reconstruction import Budget
from workers.algorithms.retrieval import RetrievalParams
from workers.query.modes import DEFAULT_MODE, MAX_TOP_K, QueryMode, mode_names, mode_of, query_mode, registered

MAX_QUERY_CHARS = 4096
DEFAULT_PARAMS = RetrievalParams()  # frozen: one instance serves every default


def parse_json_body(raw: bytes):
    """A request body as JSON, strictly: NaN, Infinity and numbers beyond float range (which
    Python's json accepts) and integers of more than 4,300 digits are a ContractError, as are
    invalid UTF-8 and nesting too deep to parse."""
    if not raw:
        raise ContractError("request body is empty: expected a JSON object with 'query'")
    try:
        text = raw.decode("utf-8")
    except UnicodeDecodeError as exc:
        raise ContractError(f"request body is not UTF-8 (invalid byte at offset {exc.start})") from None
    try:
        return json.loads(text, parse_constant=_reject_constant, parse_float=_finite_float)
    except RecursionError:
        raise ContractError("request body is nested too deeply") from None
    except ValueError as exc:  # JSONDecodeError, and what the hooks and int() raise
        raise ContractError(f"request body is not valid JSON: {exc}") from None


def _reject_constant(name: str):
    raise ValueError(f"{name} is not a JSON number")


def _finite_float(text: str) -> float:
    value = float(text)
    if not math.isfinite(value):
        raise ValueError(f"number {text[:40]} is beyond the range of a double")
    return value


def _check_encodable(body) -> None:
    """Every string in the body, keys included, must be encodable as UTF-8: json.loads accepts
    escaped lone surrogates ("\\ud800"), which Redis, the tokenizer and the response would fail on."""
    pending = [("", body)]
    while pending:  # iterative: the body may be nested as deep as the parser allowed
        path, value = pending.pop()
        if isinstance(value, dict):
            for key, item in value.items():
                _encodable(key, f"a key in {path or 'the body'}")
                pending.append((f"{path}.{key}" if path else key, item))
        elif isinstance(value, list):
            pending.extend((f"{path}[{i}]", item) for i, item in enumerate(value))
        elif isinstance(value, str):
            _encodable(value, repr(path))


def _encodable(text: str, what: str) -> None:
    try:
        text.encode("utf-8")
    except UnicodeEncodeError as exc:
        raise ContractError(
            f"{what} is not valid Unicode: lone surrogate U+{ord(text[exc.start]):04X} at character {exc.start}"
        ) from None


@dataclass(frozen=True)
class QueryRequest:
    query: str
    tenant: str
    top_k: int
    mode: QueryMode = DEFAULT_MODE  # a registered mode's name (workers.query.modes)
    params: RetrievalParams = DEFAULT_PARAMS
    answer: bool = False
    budget: Budget | None = None  # mode reconstruct: what the walk may read (unset fields: the worker's defaults)
    as_of: float | None = None  # seconds since the epoch: answer from the facts valid then (see _facts_as_of)

    @classmethod
    def from_bytes(
        cls, raw: bytes, default_tenant: str, default_top_k: int, defaults: RetrievalParams = DEFAULT_PARAMS
    ) -> "QueryRequest":
        """The request of a POST /v1/query body; every way it can be wrong is a ContractError."""
        return cls.from_json(parse_json_body(raw), default_tenant, default_top_k, defaults)

    @classmethod
    def from_json(
        cls, body, default_tenant: str, default_top_k: int, defaults: RetrievalParams = DEFAULT_PARAMS
    ) -> "QueryRequest":
        if not isinstance(body, dict):
            raise ContractError("request body must be a JSON object with 'query'")
        _check_encodable(body)
        unknown_fields(body, QUERY_FIELDS, "the request body")
        query = body.get("query")
        if not isinstance(query, str) or not query.strip():
            raise ContractError("'query' must be a non-empty string")
        if len(query) > MAX_QUERY_CHARS:
            raise ContractError(f"'query' is {len(query)} characters, over the limit of {MAX_QUERY_CHARS}")
        if "\x00" in query:
            raise ContractError("'query' must not contain NUL characters")
        tenant = tenant_or_default(body.get("tenant"), default_tenant)
        top_k = body.get("top_k", default_top_k)
        if not isinstance(top_k, int) or isinstance(top_k, bool) or not 1 <= top_k <= MAX_TOP_K:
            raise ContractError(f"'top_k' must be an integer from 1 to {MAX_TOP_K}")
        mode = query_mode(body.get("mode", DEFAULT_MODE))
        if mode is None:
            raise ContractError(f"'mode' must be one of {', '.join(mode_names())}")
        generate = body.get("answer", False)
        if not isinstance(generate, bool):
            raise ContractError("'answer' must be true or false")
        try:
            overrides = body.get("params")
            if overrides is not None and not isinstance(overrides, dict):
                raise ValueError("'params' must be an object")
            params = RetrievalParams.from_json({**asdict(defaults), **overrides}) if overrides else defaults
        except ValueError as exc:
            raise ContractError(str(exc)) from None
        budget = _budget(body, mode)
        return cls(query, tenant, top_k, mode, params, generate, budget, _as_of(body))


# the fields of a POST /v1/query body: any other name is refused (a misspelt "asof" or "topk"
# would otherwise answer from today, or with the default top_k, without a word)
QUERY_FIELDS = ("query", "tenant", "top_k", "mode", "answer", "params", "budget", "as_of")


def unknown_fields(given, known: tuple[str, ...], where: str) -> None:
    """ContractError naming the first few names of `given` not in `known` (topics.contract.
    quoted_names: with the nearest known name of each, where one is close) and how many more,
    and every known name. A few only: a body of 300,000 unknown names cost seconds of the event
    loop, a close match each, and an 11 MB answer (an audit)."""
    unknown = sorted(set(given) - set(known), key=str)
    if not unknown:
        return

    def hint(name) -> str:
        near = get_close_matches(str(name)[:QUOTED_CHARS], known, 1)
        return f"{quoted(name)} (did you mean {near[0]!r}?)" if near else quoted(name)

    raise ContractError(f"unknown field(s) in {where}: {quoted_names(unknown, hint)}; known: {', '.join(known)}")


def _budget(body: dict, mode: str) -> Budget | None:
    if body.get("budget") is None:
        return None
    if not mode_of(mode).walks:
        walking = [m.name for m in registered() if m.walks]
        raise ContractError(f"'budget' applies to mode {' and '.join(walking)} only, not {mode!r}")
    try:
        return Budget.from_json(body["budget"])
    except ValueError as exc:
        raise ContractError(str(exc)) from None


def _as_of(body: dict) -> float | None:
    """The request's "as_of" (an ISO 8601 time) as seconds since the epoch; None when absent."""
    if body.get("as_of") is None:
        return None
    try:
        return parse_as_of(body["as_of"])
    except ValueError as exc:
        raise ContractError(str(exc)) from None
