"""Reading MuSiQue examples for `bench_qa.py`, in either of the two shapes it is published in.
Plain Python (no torch): the tests import it directly.

- CacheBlend's (`inputs/musique_s.json`, and `bench/data/musique_dev.json`): a JSON list of
  `{"question": str, "answers": [str], "ctxs": [{"title": str, "text": str}]}`.
- MuSiQue's own release (`musique_ans_v1.0_dev.jsonl`, `musique_full_v1.0_dev.jsonl`): one JSON
  object per line (or a JSON list of them), `{"question": str, "answer": str, "answer_aliases":
  [str], "paragraphs": [{"idx": int, "title": str, "paragraph_text": str}], "answerable": bool}`.
  The gold answers are the answer and its aliases; unanswerable examples (the "full" release) are
  skipped, since F1 against an answer the passages do not support measures nothing here. MuSiQue
  gives 20 paragraphs; cut to K (CacheBlend's 10), the supporting ones are always kept, the others
  fill up in order, and the kept ones stay in their original order.

Each passage becomes `"{title}\\n\\n{text}\\n\\n"` (CacheBlend's chunk); blank ones are dropped, since a
skill needs text. A malformed example is an error naming the file, the example and the field.
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from pathlib import Path


class DataError(ValueError):
    """The data file cannot be read as MuSiQue examples; the message names where and why."""


@dataclass(frozen=True)
class Example:
    question: str
    answers: tuple[str, ...]
    passages: tuple[str, ...]


def normalize_question(question: str) -> str:
    """CacheBlend's: lower-case first letter, ending in '?'."""
    q = question.strip()
    q = q[:1].lower() + q[1:]
    return q if q.endswith("?") else q + "?"


def read_items(path: Path) -> list[dict]:
    """The file's examples as raw objects: a JSON list, or JSON lines."""
    try:
        text = path.read_text(encoding="utf-8")
    except OSError as exc:
        raise DataError(f"{path}: cannot read it ({exc.strerror or exc})") from exc
    stripped = text.lstrip()
    if stripped.startswith("["):
        try:
            items = json.loads(text)
        except json.JSONDecodeError as exc:
            raise DataError(f"{path}: not valid JSON ({exc.msg} at line {exc.lineno})") from exc
    else:
        items = []
        for n, line in enumerate(text.splitlines(), 1):
            if not line.strip():
                continue
            try:
                items.append(json.loads(line))
            except json.JSONDecodeError as exc:
                raise DataError(f"{path}: line {n} is not a JSON object ({exc.msg})") from exc
    for n, item in enumerate(items):
        if not isinstance(item, dict):
            raise DataError(f"{path}: example {n} is a {type(item).__name__}, not an object")
    return items


def _text(item: dict, key: str, where: str) -> str:
    value = item.get(key)
    if not isinstance(value, str):
        raise DataError(f"{where}: '{key}' must be a string, got {type(value).__name__}")
    return value


def parse_example(item: dict, passages: int, where: str) -> Example | None:
    """One example (None for an unanswerable one); `passages` keeps the first K (0 = all)."""
    question = _text(item, "question", where)
    if "ctxs" in item:  # CacheBlend's shape
        answers, chunks, body = item.get("answers"), item["ctxs"], "text"
        if isinstance(answers, str):
            answers = [answers]
    elif "paragraphs" in item:  # MuSiQue's own
        if item.get("answerable") is False:
            return None
        answers, chunks, body = ([_text(item, "answer", where), *(item.get("answer_aliases") or [])],
                                 item["paragraphs"], "paragraph_text")
    else:
        raise DataError(f"{where}: no passages: expected 'ctxs' (CacheBlend) or 'paragraphs' (MuSiQue)")
    if not isinstance(answers, list) or not answers or not all(isinstance(a, str) for a in answers):
        raise DataError(f"{where}: the gold answers must be a non-empty list of strings")
    if not isinstance(chunks, list):
        raise DataError(f"{where}: the passages must be a list")
    for i, chunk in enumerate(chunks):
        if not isinstance(chunk, dict):
            raise DataError(f"{where}: passage {i} is not an object")
    if passages and len(chunks) > passages:
        if body == "paragraph_text":  # keep every supporting paragraph
            ranked = sorted(range(len(chunks)), key=lambda i: not chunks[i].get("is_supporting"))
            chunks = [chunks[i] for i in sorted(ranked[:passages])]
        else:
            chunks = chunks[:passages]
    texts = []
    for chunk in chunks:
        title, content = chunk.get("title") or "", chunk.get(body) or ""
        if f"{title}{content}".strip():
            texts.append(f"{title}\n\n{content}\n\n")
    if not texts:
        raise DataError(f"{where}: every passage is blank")
    return Example(normalize_question(question), tuple(answers), tuple(texts))


def load_examples(path: Path, limit: int, passages: int = 0, start: int = 0) -> list[Example]:
    """Up to `limit` answerable examples from the `start`-th on, each with its first `passages`
    passages (0 = all)."""
    if limit < 1 or start < 0 or passages < 0:
        raise DataError("--limit must be at least 1, --start and --passages at least 0")
    items = read_items(path)
    if start >= len(items):
        raise DataError(f"{path}: {len(items)} examples, none from --start {start}")
    out: list[Example] = []
    for n, item in enumerate(items[start:], start):
        example = parse_example(item, passages, f"{path}: example {n}")
        if example is not None:
            out.append(example)
        if len(out) == limit:
            break
    return out


__all__ = ["DataError", "Example", "load_examples", "normalize_question", "parse_example", "read_items"]
