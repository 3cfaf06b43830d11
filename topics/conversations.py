"""Conversations as memstream reads them: the LoCoMo layout and JSONL of turns → `Turn`s →
one `Document` per turn (one immutable passage each), plus the parsing the conversation
benchmark needs (questions, evidence ids).

LoCoMo layout: a sample (or a list of samples) `{"sample_id", "conversation": {"speaker_a",
"speaker_b", "session_N": [{"speaker", "dia_id", "text"}, ...], "session_N_date_time": "1:56 pm
on 8 May, 2023"}, "qa": [{"question", "answer", "evidence": ["D1:3"], "category": 2}]}`.

JSONL of turns: one object per line with `session_id`, `turn`, `speaker`, `ts` (seconds since
the epoch, or an ISO time), `text`, optional `turn_id` and `doc_id`.

Evidence ids are written loosely in the public file ("D8:6; D9:17", "D:11:26", "D30:05"):
`parse_evidence` reads every id it can and canonicalises it ("D30:5"), and turn ids go through
the same canonical form, so the two always compare equal."""

from __future__ import annotations

import re
from dataclasses import dataclass, field
from datetime import datetime, timezone
from typing import Any

from topics import ContractError, Document
from topics.times import EARLIEST_TS, LATEST_TS, MONTHS, epoch_seconds, iso_moment

_SESSION_KEY = re.compile(r"^session_(\d+)$")
_LOCOMO_DATE = re.compile(r"^\s*(\d{1,2}):(\d{2})\s*([ap]\.?m\.?)\s+on\s+(\d{1,2})\s+([A-Za-z]+),?\s+(\d{4})\s*$", re.I)
_MONTHS = {m: i for i, m in enumerate(MONTHS, 1)}
_DIA_ID = re.compile(r"D\s*:?\s*(\d+)\s*:\s*(\d+)", re.I)
# Session and turn numbers of more digits are no ids (int() refuses over 4,300 digits with ValueError)
MAX_ID_DIGITS = 18


def _id_number(digits: str) -> int | None:
    return int(digits) if len(digits) <= MAX_ID_DIGITS else None


def _dia_id(match: re.Match) -> str | None:
    """ "D30:5" of a match of _DIA_ID; None when a number is too long to be one."""
    session, turn = _id_number(match.group(1)), _id_number(match.group(2))
    return None if session is None or turn is None else f"D{session}:{turn}"


def parse_time(value: Any) -> float | None:
    """A LoCoMo session date ("1:56 pm on 8 May, 2023"), an ISO time, or seconds since the
    epoch → seconds since the epoch (UTC when no zone is given); None when unreadable or out of
    the years 1-9999 (topics.times)."""
    if value is None or isinstance(value, bool):
        return None
    if isinstance(value, (int, float)):
        try:
            return epoch_seconds(value)
        except ContractError:
            return None
    if not isinstance(value, str) or not value.strip():
        return None
    match = _LOCOMO_DATE.match(value)
    if match:
        hour, minute, half, day, month, year = match.groups()
        month_no = _MONTHS.get(month.lower()) or next(
            (n for m, n in _MONTHS.items() if m.startswith(month.lower()[:3])), None
        )
        if month_no is None:
            return None
        hour = int(hour) % 12 + (12 if half.lower().startswith("p") else 0)
        try:
            return datetime(int(year), month_no, int(day), hour, int(minute), tzinfo=timezone.utc).timestamp()
        except ValueError:
            return None
    moment = iso_moment(value)  # '9999-12-31T23:59-23:59' is in the year 10000 in UTC
    return moment if moment is not None and EARLIEST_TS <= moment <= LATEST_TS else None


def turn_ts(value: Any, where: str) -> float | None:
    """A turn's `ts` as a caller gives it (seconds since the epoch, an ISO time or a LoCoMo
    date; None: none) → seconds since the epoch; ContractError saying what is wrong."""
    if value is None:
        return None
    if isinstance(value, (int, float)) and not isinstance(value, bool):
        try:
            return epoch_seconds(value)
        except ContractError as exc:  # says why: not finite, out of range, milliseconds
            raise ContractError(f"{where}: {exc}") from None
    ts = parse_time(value)
    if ts is None:
        raise ContractError(f"{where}: 'ts' must be seconds since the epoch or an ISO time, got {value!r}")
    return ts


def canonical_dia_id(text: str) -> str | None:
    """ "D30:05" → "D30:5", "D:11:26" → "D11:26"; None when `text` holds no dialogue id."""
    return next(filter(None, map(_dia_id, _DIA_ID.finditer(text or ""))), None)


def parse_evidence(evidence: Any) -> list[str]:
    """Every dialogue id that can be read from a question's evidence (a list of strings, or a
    string), canonical and in order, without repeats; unreadable parts are skipped."""
    items = evidence if isinstance(evidence, list) else [evidence]
    found: list[str] = []
    for item in items:
        if not isinstance(item, str):
            continue
        for match in _DIA_ID.finditer(item):
            dia = _dia_id(match)
            if dia is not None and dia not in found:
                found.append(dia)
    return found


def unreadable_evidence(evidence: Any) -> list[str]:
    """The parts of a question's evidence that `parse_evidence` reads no dialogue id from: each
    non-string item, and each string's text left over around its ids when it holds letters or
    digits ("see D3", "D", "session 4"), as written. No evidence at all (None, []) is none."""
    items = evidence if isinstance(evidence, list) else [] if evidence is None else [evidence]
    unreadable = []
    for item in items:
        leftover = _DIA_ID.sub(lambda m: " " if _dia_id(m) else m.group(), item) if isinstance(item, str) else None
        if leftover is None or re.search(r"\w", leftover):
            unreadable.append(item if isinstance(item, str) else repr(item))
    return unreadable


@dataclass(frozen=True)
class Turn:
    """One turn of a conversation: one immutable passage."""

    session_id: str
    turn: int
    speaker: str
    text: str
    turn_id: str  # the caller's id for it (LoCoMo: the canonical dia_id)
    ts: float | None = None
    date: str = ""  # the session's date as the source wrote it ("1:56 pm on 8 May, 2023")
    doc_id: str = ""
    metadata: dict = field(default_factory=dict)

    @property
    def document_id(self) -> str:
        """The doc id its document is published under: the caller's, else session:turn id."""
        return self.doc_id or f"{self.session_id}:{self.turn_id}"

    def document(self, tenant: str) -> Document:
        metadata = {**self.metadata, "turn_id": self.turn_id}
        if self.date:
            metadata["date"] = self.date
        return Document(
            tenant=tenant,
            doc_id=self.document_id,
            text=self.text,
            metadata=metadata,
            session_id=self.session_id,
            turn=self.turn,
            speaker=self.speaker,
            ts=self.ts,
        )


@dataclass(frozen=True)
class Question:
    question: str
    answer: str
    evidence: list[str]  # canonical dia ids
    category: int | None
    sample_id: str
    unreadable_evidence: tuple[str, ...] = ()  # evidence parts without a readable id (unreadable_evidence)


def is_locomo(data: Any) -> bool:
    """A LoCoMo sample, or a non-empty list whose first item is one."""
    first = data[0] if isinstance(data, list) and data else data
    return isinstance(first, dict) and isinstance(first.get("conversation"), dict)


def locomo_text(row: dict) -> str:
    """A LoCoMo turn's text, with the photo it shares: a turn that shares one holds its caption
    (`blip_caption`, a captioning model's description) after what was said — "… By the way,
    take a look at this. [shared a photo of a painting of a sunset over a lake]" — as LoCoMo's
    own retrieval code gives a turn to its retrievers ("… and shared <caption>"). A third of the
    LoCoMo dev conversations' evidence turns share a photo, and some answer only in it ("What
    has Melanie painted?"). `query` (the search words the dataset's makers found the photo with)
    is not part of the conversation: it stays in the metadata, as the caption does."""
    caption = row.get("blip_caption")
    if not isinstance(caption, str) or not caption.strip():
        return row["text"]
    return f"{row['text']} [shared {' '.join(caption.split())}]"  # "shared": no tag ("shares" is a noun)


def locomo_turns(data: Any, where: str = "conversation", errors: list[str] | None = None) -> list[Turn]:
    """Every turn of every sample, in session and turn order. ContractError names the sample,
    session or turn that does not follow the layout; given `errors`, each such message is added
    to it instead and the rest is still read (`memstream publish` publishes the good turns)."""
    samples = data if isinstance(data, list) else [data]
    turns: list[Turn] = []

    def refuse(message: str) -> None:
        if errors is None:
            raise ContractError(message)
        errors.append(message)

    for index, sample in enumerate(samples):
        here = f"{where}[{index}]" if isinstance(data, list) else where
        if not isinstance(sample, dict) or not isinstance(sample.get("conversation"), dict):
            refuse(f"{here}: expected an object with a 'conversation' object (LoCoMo layout)")
            continue
        sample_id = str(sample.get("sample_id") or f"conv-{index}")
        conversation = sample["conversation"]
        sessions = []
        for key in conversation:
            if (m := _SESSION_KEY.match(key)) is None:
                continue
            if (number := _id_number(m.group(1))) is None:
                refuse(f"{here}.conversation: {key[:40]}…: a session number of more than {MAX_ID_DIGITS} digits")
            else:
                sessions.append((number, key))
        sessions.sort()
        if not sessions:
            refuse(f"{here}.conversation: no session_N lists")
            continue
        for number, key in sessions:
            rows = conversation[key]
            if not isinstance(rows, list):
                refuse(f"{here}.conversation.{key}: expected a list of turns")
                continue
            date = conversation.get(f"{key}_date_time") or ""
            date = date if isinstance(date, str) else ""
            ts = parse_time(date)
            for position, row in enumerate(rows, 1):
                at = f"{here}.conversation.{key}[{position - 1}]"
                if not isinstance(row, dict) or not all(
                    isinstance(row.get(k), str) and row[k].strip() for k in ("speaker", "text")
                ):
                    refuse(f"{at}: a turn needs non-empty strings 'speaker' and 'text'")
                    continue
                dia_id = canonical_dia_id(str(row.get("dia_id") or "")) or f"D{number}:{position}"
                extra = {k: v for k, v in row.items() if k not in ("speaker", "text", "dia_id") and isinstance(v, str)}
                turns.append(
                    Turn(
                        session_id=f"{sample_id}:session_{number}",
                        turn=position,
                        speaker=row["speaker"].strip(),
                        text=locomo_text(row),
                        turn_id=dia_id,
                        ts=ts,
                        date=date,
                        doc_id=f"{sample_id}:{dia_id}",
                        metadata={"sample_id": sample_id, "session": number, "dia_id": dia_id, **extra},
                    )
                )
    return turns


def turn_from_json(row: Any, where: str) -> Turn:
    """One line of a JSONL of turns."""
    if not isinstance(row, dict):
        raise ContractError(f"{where}: expected a JSON object")
    for name in ("session_id", "speaker", "text"):
        if not isinstance(row.get(name), str) or not row[name].strip():
            raise ContractError(f"{where}: a turn needs a non-empty string '{name}'")
    number = row.get("turn")
    if not isinstance(number, int) or isinstance(number, bool) or number < 0:
        raise ContractError(f"{where}: 'turn' must be a non-negative integer")
    ts = turn_ts(row.get("ts"), where)
    turn_id = row.get("turn_id")
    if turn_id is not None and (not isinstance(turn_id, str) or not turn_id.strip()):
        raise ContractError(f"{where}: 'turn_id' must be a non-empty string")
    metadata = row.get("metadata")
    if not isinstance(metadata, dict):
        metadata = {}
    turn_id = turn_id or str(number)
    return Turn(
        session_id=row["session_id"],
        turn=number,
        speaker=row["speaker"].strip(),
        text=row["text"],
        turn_id=turn_id,
        ts=ts,
        doc_id=str(row.get("doc_id") or f"{row['session_id']}:{turn_id}"),
        metadata=metadata,
    )


def is_turn(row: Any) -> bool:
    """A JSON object that is a turn rather than a document: one that gives `turn`, as the
    Document it becomes is a turn (Document.is_turn). turn_from_json then requires its
    session_id, speaker and text; an object without `turn` is a document, session_id or not."""
    return isinstance(row, dict) and row.get("turn") is not None


def locomo_questions(data: Any) -> list[Question]:
    samples = data if isinstance(data, list) else [data]
    questions = []
    for index, sample in enumerate(samples):
        sample_id = str(sample.get("sample_id") or f"conv-{index}")
        for row in sample.get("qa") or []:
            if not isinstance(row, dict) or not isinstance(row.get("question"), str):
                continue
            category = row.get("category")
            questions.append(
                Question(
                    row["question"],
                    str(row.get("answer", row.get("adversarial_answer", ""))),
                    parse_evidence(row.get("evidence")),
                    category if isinstance(category, int) and not isinstance(category, bool) else None,
                    sample_id,
                    tuple(unreadable_evidence(row.get("evidence"))),
                )
            )
    return questions
