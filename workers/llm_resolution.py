"""A_res with an LLM: one structured call per conflict group that names, for every fact, the
action and the evidence sentence it relies on. Prompt building and answer validation are pure;
the call goes through workers.llm.LLMClient (cached by prompt, so re-adjudicating an unchanged
group costs nothing)."""

from __future__ import annotations

from workers.policy import Decision, GroupFact

ACTIONS = ("keep", "invalidate", "qualify_time", "qualify_scope", "uncertain")

RESOLUTION_PROMPT = (
    "You resolve conflicting facts in a knowledge memory. All facts share one head entity and one "
    "relation that should have a single value. Read the evidence passages and decide, for every "
    "fact, one action: keep (the evidence supports it), invalidate (the evidence contradicts it or "
    "supports another fact instead), qualify_time (it held during a time span: give valid_from and "
    "valid_to), qualify_scope (it holds at another granularity: scope 'broader' or 'narrower'), or "
    "uncertain (the evidence cannot decide). Quote the evidence sentence and name its passage id."
)

RESOLUTION_SCHEMA = {
    "type": "object",
    "additionalProperties": False,
    "required": ["decisions"],
    "properties": {"decisions": {"type": "array", "items": {
        "type": "object", "additionalProperties": False,
        "required": ["fact_id", "action", "evidence", "evidence_passage_id", "valid_from", "valid_to", "scope"],
        "properties": {
            "fact_id": {"type": "string"},
            "action": {"type": "string", "enum": list(ACTIONS)},
            "evidence": {"type": "string"},
            "evidence_passage_id": {"type": "string"},
            "valid_from": {"type": ["string", "null"]},
            "valid_to": {"type": ["string", "null"]},
            "scope": {"type": ["string", "null"], "enum": ["broader", "narrower", None]},
        },
    }}},
}


def resolution_messages(head: str, relation: str, facts: list[tuple[GroupFact, str]], passages: dict[str, str]) -> list[dict]:
    """facts: (group fact, 'head relation tail' text); passages: id → text."""
    lines = [f"Relation: {head} — {relation}", "Facts:"]
    for fact, text in sorted(facts, key=lambda pair: pair[0].id):
        span = f" [{fact.valid_from or '?'} – {fact.valid_to or '?'}]" if fact.valid_from or fact.valid_to else ""
        lines.append(f"- {fact.id}: {text}{span}; passages {', '.join(fact.passage_ids)}")
    lines.append("Evidence passages:")
    for pid in sorted(passages):
        lines.append(f"[{pid}] {passages[pid]}")
    return [{"role": "system", "content": RESOLUTION_PROMPT}, {"role": "user", "content": "\n".join(lines)}]


def parse_resolution(data, group: list[GroupFact], passage_ids: set[str]) -> dict[str, Decision]:
    """Validate the model's decisions: one per fact of the group, a known action, an evidence
    sentence and a passage id from the evidence. ValueError names the problem."""
    if not isinstance(data, dict) or not isinstance(data.get("decisions"), list):
        raise ValueError("expected an object with an array 'decisions'")
    wanted = {f.id for f in group}
    decisions: dict[str, Decision] = {}
    for i, item in enumerate(data["decisions"]):
        if not isinstance(item, dict):
            raise ValueError(f"decisions[{i}] is not an object")
        fid, action = item.get("fact_id"), item.get("action")
        if fid not in wanted or fid in decisions:
            raise ValueError(f"decisions[{i}].fact_id {fid!r} is not a fact of this group, or is decided twice")
        if action not in ACTIONS:
            raise ValueError(f"decisions[{i}].action {action!r} is not one of {', '.join(ACTIONS)}")
        evidence, source = item.get("evidence"), item.get("evidence_passage_id")
        if not isinstance(evidence, str) or not evidence.strip():
            raise ValueError(f"decisions[{i}] has no evidence sentence")
        if source not in passage_ids:
            raise ValueError(f"decisions[{i}].evidence_passage_id {source!r} is not one of the evidence passages")
        reason = f"LLM: {evidence.strip()}"
        if action == "keep":
            decisions[fid] = Decision("active", "", reason, {}, (source,))
        elif action == "invalidate":
            decisions[fid] = Decision("invalid", "mutual_exclusion", reason, {}, (source,))
        elif action == "qualify_time":
            decisions[fid] = Decision("active", "temporal", reason, {"time": {"from": item.get("valid_from"), "to": item.get("valid_to")}}, (source,))
        elif action == "qualify_scope":
            if item.get("scope") not in ("broader", "narrower"):
                raise ValueError(f"decisions[{i}]: qualify_scope needs scope 'broader' or 'narrower'")
            decisions[fid] = Decision("active", "granularity", reason, {"scope": {"level": item["scope"]}}, (source,))
        else:
            decisions[fid] = Decision("active", "uncertain", reason, {"uncertain": True}, (source,))
    missing = wanted - set(decisions)
    if missing:
        raise ValueError(f"no decision for fact(s) {', '.join(sorted(missing))}")
    return decisions
