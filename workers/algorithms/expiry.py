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

from topics import BadInput
from topics.times import EARLIEST_TS, LATEST_TS, document_ttls, fact_category, iso_moment

TTL_SETTING = "MEMSTREAM_TTL_SECONDS"
_PERIOD = re.compile(r"^\d{1,4}(-\d{1,2}){0,2}$")  # a year, a month or a day


def parse_ttl_setting(text: str) -> dict[str, int]:
    """'TOOL_FAILURE=86400,DECLARATIVE=0' → {category: seconds}; ValueError naming the setting."""
    ttls: dict[str, int] = {}
    for item in (text or "").split(","):
        if not item.strip():
            continue
        name, sep, raw = item.partition("=")
        name, raw = name.strip(), raw.strip()
        if not sep:
            raise BadInput(f"{TTL_SETTING}: {item.strip()!r} is not CATEGORY=SECONDS")
        fact_category(name, TTL_SETTING)
        try:
            seconds = int(raw)
        except ValueError:
            raise BadInput(f"{TTL_SETTING}: {name}={raw!r}: expected whole seconds") from None
        if seconds < 0:
            raise BadInput(
                f"{TTL_SETTING}: {name} must be a whole number of seconds >= 0 (0: never expires), not {seconds}"
            )
        ttls[name] = seconds
    return ttls


def passage_ttls(settings_ttls: dict[str, int], metadata: dict) -> dict[str, int]:
    """The TTL of each category for one passage (0 or absent: never): the document's own
    (`metadata.ttl_seconds`, topics.times.document_ttls: ContractError if bad), else the
    settings'. Read once per chunk."""
    return {**settings_ttls, **document_ttls(metadata)}


def lapse_time(extracted_at: float, ttl: int) -> float | None:
    """When support given at `extracted_at` lapses (None: never)."""
    return extracted_at + ttl if ttl else None


def turn_time(metadata: dict) -> str:
    """The time of a conversation turn — chunk metadata `ts`, which the chunker writes from the
    Document's own `ts` (seconds since the epoch) — as an ISO time in UTC; '' for a passage that
    is no timed turn (or a time no date can hold)."""
    ts = (metadata or {}).get("ts")
    if isinstance(ts, bool) or not isinstance(ts, (int, float)) or not EARLIEST_TS <= ts <= LATEST_TS:
        return ""
    return datetime.fromtimestamp(ts, tz=timezone.utc).strftime("%Y-%m-%dT%H:%M:%SZ")


def parse_as_of(value, where: str = "as_of") -> float:
    """An ISO 8601 time ('2023-05-08', '2023-05-08T13:56:00Z', '…+02:00'; no zone = UTC) →
    seconds since the epoch (topics.times.iso_moment); ValueError naming the field."""
    if not isinstance(value, str) or not value.strip():
        raise BadInput(f"'{where}' must be an ISO 8601 time such as \"2023-05-08T13:56:00Z\"")
    moment = iso_moment(value)
    if moment is None:
        raise BadInput(f"'{where}' is {value[:64]!r}, not an ISO 8601 time such as \"2023-05-08T13:56:00Z\"")
    return moment


def world_time(value: str | None, end: bool = False) -> float | None:
    """An event time as the evidence gives it — '1998', '1998-05', '1998-05-17' or an ISO time —
    as seconds since the epoch: the start of the period it names, or with `end` the end of it
    ('1998' ends when 1999 begins). None when it is no time."""
    if not value:
        return None
    text = str(value).strip()
    if not _PERIOD.match(text):  # a full ISO time: a moment, no period
        return iso_moment(text)
    numbers = [int(p) for p in text.split("-")]  # 1 to 3 of them (_PERIOD)
    year = numbers[0]
    month = numbers[1] if len(numbers) > 1 else None
    day = numbers[2] if len(numbers) > 2 else None
    try:
        start = datetime(year, 1 if month is None else month, 1 if day is None else day, tzinfo=timezone.utc)
    except ValueError:
        return None
    if not end:
        return start.timestamp()
    if day is not None:
        return start.timestamp() + 86400
    try:
        if month is not None:
            return datetime(year + month // 12, month % 12 + 1, 1, tzinfo=timezone.utc).timestamp()
        return datetime(year + 1, 1, 1, tzinfo=timezone.utc).timestamp()
    except ValueError:  # the period ends after year 9999 ('9999', '9999-12'): never, for a datetime
        return math.inf


def was_valid(
    as_of: float,
    *,
    event_start: str | None,
    event_end: str | None,
    created_at: float | None,
    expired_at: float | None,
    expires_at: float | None,
    activated_at: float | None,
) -> bool:
    """Whether a fact was valid at `as_of` (seconds since the epoch). Each end of its span is
    its event time when known, else its transaction time: from `event_start` (else
    `created_at`) up to, not including, `event_end` (else the earlier of `expired_at` and
    `expires_at` — its TTL lapsed, swept or not; neither: still valid). A fact never activated
    (new, pending, or excluded from birth) never entered memory: never valid."""
    if activated_at is None:
        return False
    start = world_time(event_start)
    if start is None:
        start = created_at
    end = world_time(event_end, end=True)
    if end is None:
        ends = [at for at in (expired_at, expires_at) if at is not None]
        end = min(ends) if ends else None
    return (start is None or start <= as_of) and (end is None or as_of < end)


def said_by(row: dict, as_of: float | None) -> bool:
    """Whether a passage (a stored row) was in memory at `as_of`: a conversation turn from its
    time (metadata `ts`) on; a passage without a time always (no moment is known for it)."""
    ts = said_at(row)
    return as_of is None or ts is None or ts <= as_of


def said_at(row: dict) -> float | None:
    """When a passage (a stored row) was said: a conversation turn's metadata `ts`; None for a
    passage without one."""
    ts = (row.get("metadata") or {}).get("ts")
    return None if isinstance(ts, bool) or not isinstance(ts, (int, float)) else float(ts)
