"""The LLM client of the agents: any OpenAI-compatible chat endpoint through the `openai`
client, with JSON-schema structured output, temperature 0, bounded concurrency, retries with
capped exponential backoff and jitter on 429/5xx/timeouts, one repair round for malformed
output, responses cached (store.caches.LLMCache) by (model, prompt hash), and tokens counted per stage."""

from __future__ import annotations

import asyncio
import functools
import hashlib
import json
import logging
import time
import weakref
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, Awaitable, Callable, cast

import openai
from prometheus_client import Counter, Histogram

from workers.retry import backoff

if TYPE_CHECKING:
    from openai.types.chat import ChatCompletionMessageParam
    from openai.types.shared_params import ResponseFormatJSONSchema

log = logging.getLogger(__name__)

LLM_CALLS = Counter("memstream_llm_calls_total", "LLM calls per stage and outcome", ["stage", "outcome"])
LLM_TOKENS = Counter("memstream_llm_tokens_total", "LLM tokens per stage", ["stage", "kind"])
LLM_SECONDS = Histogram(
    "memstream_llm_seconds", "Time of one answered LLM request per stage (its wait for a slot excluded)", ["stage"]
)


# Worth retrying after a backoff (also the embeddings endpoint's: workers.models.embedding);
# any other HTTP status below 500 is refused for good.
RETRYABLE_ERRORS = (
    openai.RateLimitError,
    openai.APITimeoutError,
    openai.APIConnectionError,
    openai.InternalServerError,
)


class LLMError(Exception):
    """The endpoint kept failing (after retries)."""


class MalformedOutput(Exception):
    """The model's answer did not validate, even after a repair round. `raw` keeps it."""

    def __init__(self, message: str, raw: str):
        super().__init__(message)
        self.raw = raw


@dataclass(frozen=True)
class LLMConfig:
    base_url: str
    api_key: str
    model: str
    concurrency: int = 8
    timeout_s: float = 60.0
    max_attempts: int = 6
    backoff_base_s: float = 0.5
    backoff_cap_s: float = 20.0


# MEMSTREAM_LLM_CONCURRENCY bounds a process's calls, not a client's: an `all` worker has an
# extractor's, a resolver's, an answerer's and a router's client, and with a semaphore each it
# held up to four times the bound in flight. One per event loop (a semaphore serves one loop).
_SLOTS: "weakref.WeakKeyDictionary[asyncio.AbstractEventLoop, dict[int, asyncio.Semaphore]]" = (
    weakref.WeakKeyDictionary()
)


def process_slots(concurrency: int) -> asyncio.Semaphore:
    """The calls in flight of this process (its running loop) under a bound of `concurrency`."""
    per_loop = _SLOTS.setdefault(asyncio.get_running_loop(), {})
    slots = per_loop.get(concurrency)
    if slots is None:  # made once, not on every call
        slots = per_loop[concurrency] = asyncio.Semaphore(concurrency)
    return slots


class LLMClient:
    def __init__(self, config: LLMConfig, cache=None):
        """`cache`: a store.caches.LLMCache (get/put by prompt), or None."""
        self.config = config
        self.cache = cache
        self._client = openai.AsyncOpenAI(
            base_url=config.base_url, api_key=config.api_key or "none", timeout=config.timeout_s, max_retries=0
        )
        self._calls: dict[str, asyncio.Task] = {}  # prompt hash → the call answering it now

    async def aclose(self) -> None:
        """Close the HTTP client's connection pool (its owner's shutdown)."""
        await self._client.close()

    async def structured(
        self, stage: str, messages: list[dict], schema_name: str, schema: dict, validate: Callable[[Any], Any]
    ) -> Any:
        """Ask for JSON following `schema`; `validate(parsed)` returns the value or raises
        ValueError. One repair round on malformed output, then MalformedOutput. Callers asking
        the same while it is being answered share one call: the read-ahead's prefetch and the
        handler of the same conflict set would otherwise both miss the cache and pay twice."""
        key = hashlib.sha256(
            json.dumps({"messages": messages, "schema": schema}, sort_keys=True, ensure_ascii=False).encode()
        ).hexdigest()
        loop = asyncio.get_running_loop()
        call = self._calls.get(key)
        if call is None or call.get_loop() is not loop:
            call = self._calls[key] = loop.create_task(self._answer(stage, messages, schema_name, schema, validate))
            call.add_done_callback(functools.partial(self._call_done, key))
        else:
            LLM_CALLS.labels(stage=stage, outcome="joined").inc()
        # shielded: a caller that goes (a cancelled prefetch) leaves the call to the others and the cache
        return validate(_parse(await asyncio.shield(call)))

    def _call_done(self, key: str, call: asyncio.Task) -> None:
        if self._calls.get(key) is call:
            del self._calls[key]
        if not call.cancelled():
            call.exception()  # retrieved: every caller may have gone

    async def _answer(
        self, stage: str, messages: list[dict], schema_name: str, schema: dict, validate: Callable[[Any], Any]
    ) -> str:
        """The answer's text that validates: from the cache, else asked (and repaired once), then cached."""
        cached = await self.cache.get(messages, schema) if self.cache is not None else None
        if cached is not None:
            LLM_CALLS.labels(stage=stage, outcome="cache_hit").inc()
            return cached
        raw = await self._complete(stage, messages, schema_name, schema)
        try:
            validate(_parse(raw))
        except ValueError as first_error:
            log.warning("%s: malformed LLM output (%s); asking once to repair it", stage, first_error)
            repair = messages + [
                {"role": "assistant", "content": raw},
                {
                    "role": "user",
                    "content": f"That answer is invalid: {first_error}. Answer again with only the JSON object that follows the schema.",
                },
            ]
            raw = await self._complete(stage, repair, schema_name, schema)
            try:
                validate(_parse(raw))
            except ValueError as second_error:
                LLM_CALLS.labels(stage=stage, outcome="malformed").inc()
                raise MalformedOutput(f"malformed LLM output after one repair round: {second_error}", raw) from None
        if self.cache is not None:
            await self.cache.put(messages, schema, raw)
        return raw

    async def _complete(self, stage: str, messages: list[dict], schema_name: str, schema: dict) -> str:
        # the prompts (workers.models.prompts, the query worker's) build plain {"role", "content"} dicts
        chat = cast("list[ChatCompletionMessageParam]", messages)
        response_format: ResponseFormatJSONSchema = {
            "type": "json_schema",
            "json_schema": {"name": schema_name, "schema": schema, "strict": True},
        }

        async def ask() -> str:
            async with process_slots(self.config.concurrency):
                started = time.perf_counter()
                response = await self._client.chat.completions.create(
                    model=self.config.model, messages=chat, temperature=0, response_format=response_format
                )
                LLM_SECONDS.labels(stage=stage).observe(time.perf_counter() - started)
            LLM_CALLS.labels(stage=stage, outcome="ok").inc()
            if response.usage is not None:
                LLM_TOKENS.labels(stage=stage, kind="prompt").inc(response.usage.prompt_tokens or 0)
                LLM_TOKENS.labels(stage=stage, kind="completion").inc(response.usage.completion_tokens or 0)
            return response.choices[0].message.content or ""

        try:
            return await with_retries(
                ask,
                self.config,
                f"{stage}: LLM call",
                lambda outcome: LLM_CALLS.labels(stage=stage, outcome=outcome).inc(),
            )
        except openai.APIStatusError as exc:
            LLM_CALLS.labels(stage=stage, outcome=f"http_{exc.status_code}").inc()
            raise LLMError(f"LLM endpoint refused the request: HTTP {exc.status_code}: {exc.message}") from None
        except StillFailing as exc:
            raise LLMError(f"LLM endpoint still failing after {exc.attempts} attempts ({exc.outcome})") from None


class StillFailing(Exception):
    """An endpoint call failed in a retryable way on every attempt."""

    def __init__(self, outcome: str, attempts: int):
        super().__init__(f"still failing after {attempts} attempts ({outcome})")
        self.outcome, self.attempts = outcome, attempts


async def with_retries(
    call: Callable[[], Awaitable[Any]], config, what: str, failed: Callable[[str], None] | None = None
) -> Any:
    """`call()`'s answer, asked again on 429s, 5xx, timeouts and refused connections with capped
    exponential backoff and jitter (`config`'s max_attempts, backoff_base_s, backoff_cap_s),
    then StillFailing; any other HTTP status (openai.APIStatusError) is raised as it came, for
    the caller to name. `failed(outcome)` counts each failed attempt. One retry policy for the
    chat client and the embeddings endpoint (workers.models.embedding.OpenAIEmbedder)."""
    for attempt in range(1, config.max_attempts + 1):
        try:
            return await call()
        except RETRYABLE_ERRORS as exc:
            outcome = type(exc).__name__
        except openai.APIStatusError as exc:
            if exc.status_code < 500:
                raise
            outcome = f"http_{exc.status_code}"
        if failed is not None:
            failed(outcome)
        if attempt == config.max_attempts:
            raise StillFailing(outcome, attempt)
        delay = backoff(attempt, config.backoff_base_s, config.backoff_cap_s)
        log.warning("%s failed (%s), retry %d in %.2fs", what, outcome, attempt, delay)
        await asyncio.sleep(delay)
    raise AssertionError("unreachable")


def _parse(raw: str) -> Any:
    text = raw.strip()
    if text.startswith("```"):  # some servers wrap JSON in a fence despite the schema
        text = text.strip("`").removeprefix("json").strip()
    try:
        return json.loads(text)
    except json.JSONDecodeError as exc:
        raise ValueError(f"not JSON ({exc.msg} at position {exc.pos})") from None
