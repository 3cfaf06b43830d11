"""Time in memory (pure): how long a fact's support lasts (TTL per category, from the settings
and from a document's metadata) and which facts were valid at a given moment (`as_of`).

Two timelines, as Graphiti keeps them:
- event time — when the fact held in the world: the evidence's own span (`valid_from` /
  `valid_to`, for a conversation turn the turn's time when the text names none), as the
  resolver qualifies it (`valid_at` / `invalid_at`);
- transaction time — when memory held it: `created_at` (first extracted) to `expired_at`
  (invalidated, merged, expired or retracted), system time.

A TTL is transaction time: a passage's support for a fact lapses `ttl` seconds after the passage
was extracted; a fact holds until the latest of its supporting passages lapses (`expires_at`),
forever if any of them has no TTL."""

from __future__ import annotations

import math
import re
from datetime import datetime, timezone

from topics.records import FACT_CATEGORIES

TTL_SETTING = "MEMSTREAM_TTL_SECONDS"
TTL_METADATA = "ttl_seconds"  # the document metadata field
_PERIOD = re.compile(r"^\d{1,4}(-\d{1,2}){0,2}$")  # a year, a month or a day


def _seconds(value, where: str) -> int:
    """A TTL: whole seconds, 0 = never lapses."""
    if isinstance(value, bool) or not isinstance(value, int) or value < 0:
        raise ValueError(f"{where} must be a whole number of seconds >= 0 (0: never expires), not {value!r}")
    return value


def _category(name, where: str) -> str:
    if name not in FACT_CATEGORIES:
        raise ValueError(f"{where}: unknown fact category {name!r}; expected one of {', '.join(FACT_CATEGORIES)}")
    return name


def parse_ttl_setting(text: str) -> dict[str, int]:
    """'TOOL_FAILURE=86400,DECLARATIVE=0' → {category: seconds}; ValueError naming the setting."""
    ttls: dict[str, int] = {}
    for item in (text or "").split(","):
        if not item.strip():
            continue
        name, sep, raw = item.partition("=")
        name, raw = name.strip(), raw.strip()
        if not sep:
            raise ValueError(f"{TTL_SETTING}: {item.strip()!r} is not CATEGORY=SECONDS")
        _category(name, TTL_SETTING)
        try:
            seconds = int(raw)
        except ValueError:
            raise ValueError(f"{TTL_SETTING}: {name}={raw!r}: expected whole seconds") from None
        ttls[name] = _seconds(seconds, f"{TTL_SETTING}: {name}")
    return ttls


def document_ttls(metadata: dict) -> dict[str, int]:
    """A document's own TTLs, from `metadata.ttl_seconds`: an integer for every category, or an
    object {CATEGORY: seconds}; {} when absent. ValueError naming the field."""
    raw = (metadata or {}).get(TTL_METADATA)
    where = f"metadata.{TTL_METADATA}"
    if raw is None:
        return {}
    if isinstance(raw, dict):
        return {_category(name, where): _seconds(value, f"{where}.{name}") for name, value in raw.items()}
    seconds = _seconds(raw, where)
    return {name: seconds for name in FACT_CATEGORIES}


def ttl_for(category: str, settings_ttls: dict[str, int], metadata: dict) -> int:
    """A fact's TTL in seconds from one passage (0: never): the document's, else the settings'."""
    own = document_ttls(metadata)
    return own[category] if category in own else settings_ttls.get(category, 0)


def lapse_time(extracted_at: float, ttl: int) -> float | None:
    """When support given at `extracted_at` lapses (None: never)."""
    return extracted_at + ttl if ttl else None


def turn_time(metadata: dict) -> str:
    """The time of a conversation turn (chunk metadata `ts`, seconds since the epoch) as an ISO
    time in UTC, '' for a passage that is no timed turn."""
    ts = (metadata or {}).get("ts")
    if isinstance(ts, bool) or not isinstance(ts, (int, float)) or not math.isfinite(ts):
        return ""
    return datetime.fromtimestamp(ts, tz=timezone.utc).strftime("%Y-%m-%dT%H:%M:%SZ")


def parse_as_of(value, where: str = "as_of") -> float:
    """An ISO 8601 time ('2023-05-08', '2023-05-08T13:56:00Z', '…+02:00'; no zone = UTC) →
    seconds since the epoch; ValueError naming the field."""
    if not isinstance(value, str) or not value.strip():
        raise ValueError(f"'{where}' must be an ISO 8601 time such as \"2023-05-08T13:56:00Z\"")
    text = value.strip()
    try:
        moment = datetime.fromisoformat(text[:-1] + "+00:00" if text.endswith(("Z", "z")) else text)
    except ValueError:
        raise ValueError(f"'{where}' is {value[:64]!r}, not an ISO 8601 time such as \"2023-05-08T13:56:00Z\"") from None
    if moment.tzinfo is None:
        moment = moment.replace(tzinfo=timezone.utc)
    return moment.timestamp()


def world_time(value: str | None, end: bool = False) -> float | None:
    """An event time as the evidence gives it — '1998', '1998-05', '1998-05-17' or an ISO time —
    as seconds since the epoch: the start of the period it names, or with `end` the end of it
    ('1998' ends when 1999 begins). None when it is no time."""
    if not value:
        return None
    text = str(value).strip()
    if not _PERIOD.match(text):  # a full ISO time: a moment, no period
        try:
            return parse_as_of(text)
        except ValueError:
            return None
    numbers = [int(p) for p in text.split("-")]
    try:
        start = datetime(numbers[0], *(numbers[1:] + [1, 1][len(numbers) - 1:]), tzinfo=timezone.utc)
    except ValueError:
        return None
    if not end:
        return start.timestamp()
    year, month, day = (numbers + [None, None])[:3]
    if day is not None:
        return start.timestamp() + 86400
    if month is not None:
        return datetime(year + month // 12, month % 12 + 1, 1, tzinfo=timezone.utc).timestamp()
    return datetime(year + 1, 1, 1, tzinfo=timezone.utc).timestamp() if year < 9999 else math.inf


def was_valid(as_of: float, *, event_start: str | None, event_end: str | None, created_at: float | None,
             expired_at: float | None, entered_memory: bool) -> bool:
    """Whether a fact was valid at `as_of` (seconds since the epoch). Each end of its span is
    its event time when known, else its transaction time: from `event_start` (else
    `created_at`) up to, not including, `event_end` (else `expired_at`; neither: still valid).
    A fact that never entered memory (new or pending: never activated) was never valid."""
    if not entered_memory:
        return False
    start = world_time(event_start)
    if start is None:
        start = created_at
    end = world_time(event_end, end=True)
    if end is None:
        end = expired_at
    return (start is None or start <= as_of) and (end is None or as_of < end)
