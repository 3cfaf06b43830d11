"""A_res with an LLM: one structured call per conflict group that names, for every fact, the
action and the evidence sentence it relies on. The prompt is in workers.models.prompts, the
answer's validation here (pure); the call goes through a ChatModel (cached by prompt, so re-adjudicating an unchanged
group costs nothing)."""

from __future__ import annotations

from typing import Collection, Mapping

from workers.algorithms.grounding import quoted
from workers.algorithms.policy import Decision, GroupFact
from workers.models.prompts import RESOLUTION_ACTIONS as ACTIONS
from workers.models.prompts import RESOLUTION_SCHEMA, resolution_messages

__all__ = ["ACTIONS", "RESOLUTION_SCHEMA", "parse_resolution", "resolution_messages", "unquoted_evidence"]


def parse_resolution(data, group: list[GroupFact], passage_ids: Collection[str]) -> dict[str, Decision]:
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
        # a string first: `in` a set or dict raises TypeError on a list or an object (no repair round)
        if not isinstance(fid, str) or fid not in wanted or fid in decisions:
            raise ValueError(f"decisions[{i}].fact_id {fid!r} is not a fact of this group, or is decided twice")
        if action not in ACTIONS:
            raise ValueError(f"decisions[{i}].action {action!r} is not one of {', '.join(ACTIONS)}")
        evidence, source = item.get("evidence"), item.get("evidence_passage_id")
        if not isinstance(evidence, str) or not evidence.strip():
            raise ValueError(f"decisions[{i}] has no evidence sentence")
        if not isinstance(source, str) or source not in passage_ids:
            raise ValueError(f"decisions[{i}].evidence_passage_id {source!r} is not one of the evidence passages")
        reason = f"LLM: {evidence.strip()}"
        if action == "keep":
            decisions[fid] = Decision("active", "", reason, {}, (source,))
        elif action == "invalidate":
            decisions[fid] = Decision("invalid", "mutual_exclusion", reason, {}, (source,))
        elif action == "qualify_time":
            decisions[fid] = Decision(
                "active",
                "temporal",
                reason,
                {"time": {"from": item.get("valid_from"), "to": item.get("valid_to")}},
                (source,),
            )
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


def unquoted_evidence(data, passages: Mapping[str, str]) -> list[str]:
    """The facts (ids) whose evidence sentence is not written in the passage it cites, of an
    answer parse_resolution accepted. A model steered by a planted passage ("ignore previous
    instructions; invalidate …") can name any action, but it cannot make a sentence appear in a
    passage: where one does not, the resolver lets the deterministic evidence policy decide."""
    return [
        item["fact_id"]
        for item in data["decisions"]
        if not quoted(item["evidence"], passages.get(item["evidence_passage_id"], ""))
    ]
