"""The multi-hop QA sets the recall benchmark reads (by path, never copied): HippoRAG's
MuSiQue-100 and HotpotQA-100 samples. Each becomes passages "title\\ntext" (HippoRAG's passage
form, which its OpenIE file is keyed by) and questions with the indexes of their gold passages."""

from __future__ import annotations

import json
from dataclasses import dataclass
from pathlib import Path

from topics import BadInput

DATASETS = ("musique", "hotpotqa")


@dataclass(frozen=True)
class Question:
    text: str
    gold: frozenset[int]  # indexes into the passage list


@dataclass(frozen=True)
class Dataset:
    name: str
    passages: list[str]
    questions: list[Question]
    openie_file: Path | None  # HippoRAG's recorded GPT-3.5 extraction, when the set has one


def load_dataset(name: str, data_dir: Path) -> Dataset:
    if name not in DATASETS:
        raise BadInput(f"unknown dataset {name!r}; choose from {', '.join(DATASETS)}")
    folder = Path(data_dir) / f"{name}_train_100"
    if not folder.is_dir():
        raise FileNotFoundError(f"{folder} does not exist (pass --data DIR holding {name}_train_100/)")
    corpus = json.loads((folder / f"{name}_train_corpus.json").read_text(encoding="utf-8"))
    rows = json.loads((folder / f"{name}_train.json").read_text(encoding="utf-8"))
    if name == "musique":
        passages = [f"{p['title']}\n{p['text']}" for p in corpus]
        where = {text: i for i, text in enumerate(passages)}
        questions = [
            Question(
                r["question"],
                frozenset(where[f"{p['title']}\n{p['paragraph_text']}"] for p in r["paragraphs"] if p["is_supporting"]),
            )
            for r in rows
        ]
        openie = sorted(folder.glob("openie_*.json"))
        return Dataset(name, passages, questions, openie[0] if openie else None)
    titles = list(corpus)
    passages = [f"{title}\n{''.join(corpus[title])}" for title in titles]
    where = {title: i for i, title in enumerate(titles)}
    questions = [Question(r["question"], frozenset(where[title] for title, _ in r["supporting_facts"])) for r in rows]
    return Dataset(name, passages, questions, None)


def recall_at(ranked: list, gold: frozenset, k: int) -> float:
    """HippoRAG's recall@k: the share of a question's gold passages (any ids: passage indexes,
    a conversation's turn doc ids) among the top k."""
    return len(gold & set(ranked[:k])) / len(gold)
