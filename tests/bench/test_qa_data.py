"""Reading MuSiQue for the question-answering benchmark: both published shapes, every example (not
just the first), the passage limit, unanswerable examples skipped, and errors that name the problem."""

from __future__ import annotations

import json
import sys
from pathlib import Path

import pytest

sys.path.insert(0, str(Path(__file__).resolve().parents[2] / "bench"))

from qa_data import DataError, load_examples  # noqa: E402

# the real data, vendored with its README and licence (CC BY 4.0) so the test always finds it
SHARED = Path(__file__).resolve().parents[2] / "bench" / "data" / "musique_dev.json"


def cacheblend(question: str, answers: list[str], n: int) -> dict:
    return {"question": question, "answers": answers,
            "ctxs": [{"title": f"T{i}", "text": f"passage {i} of {question}"} for i in range(n)]}


def musique(question: str, answer: str, aliases: list[str], n: int, answerable: bool = True,
            supporting: tuple[int, ...] = (0,)) -> dict:
    return {"id": question, "question": question, "answer": answer, "answer_aliases": aliases,
            "answerable": answerable,
            "paragraphs": [{"idx": i, "title": f"P{i}", "paragraph_text": f"text {i}",
                            "is_supporting": i in supporting}
                           for i in range(n)]}


def test_cacheblend_list_every_example_keeps_its_own_passage_limit(tmp_path):
    path = tmp_path / "cb.json"
    path.write_text(json.dumps([cacheblend(f"Who is {i}", [f"a{i}"], 10) for i in range(3)]))
    examples = load_examples(path, limit=3, passages=4)
    assert [len(e.passages) for e in examples] == [4, 4, 4]  # the limit applies to the 2nd and 3rd too
    assert [e.question for e in examples] == ["who is 0?", "who is 1?", "who is 2?"]
    assert examples[2].passages[0] == "T0\n\npassage 0 of Who is 2\n\n"
    assert [len(e.passages) for e in load_examples(path, limit=2, passages=0)] == [10, 10]


def test_musique_jsonl_uses_answer_and_aliases_and_skips_unanswerable(tmp_path):
    path = tmp_path / "m.jsonl"
    rows = [musique("Where was X born?", "Oslo", ["Christiania"], 20),
            musique("Unanswerable?", "n/a", [], 20, answerable=False),
            musique("When did Y die?", "1901", [], 20)]
    path.write_text("\n".join(json.dumps(r) for r in rows) + "\n")
    examples = load_examples(path, limit=5, passages=10)
    assert [e.answers for e in examples] == [("Oslo", "Christiania"), ("1901",)]
    assert [len(e.passages) for e in examples] == [10, 10]
    assert examples[0].passages[3] == "P3\n\ntext 3\n\n"


def test_cutting_musique_paragraphs_keeps_the_supporting_ones_in_their_order(tmp_path):
    path = tmp_path / "m.jsonl"
    path.write_text(json.dumps(musique("Who?", "Ada", [], 20, supporting=(15, 18))) + "\n")
    (example,) = load_examples(path, limit=1, passages=10)
    assert [p.split("\n")[0] for p in example.passages] == [f"P{i}" for i in (*range(8), 15, 18)]
    (whole,) = load_examples(path, limit=1, passages=0)
    assert len(whole.passages) == 20


def test_start_skips_examples_and_blank_passages_are_dropped(tmp_path):
    items = [cacheblend(f"q{i}", ["a"], 3) for i in range(5)]
    items[3]["ctxs"][1] = {"title": "", "text": "  "}
    path = tmp_path / "cb.json"
    path.write_text(json.dumps(items))
    examples = load_examples(path, limit=10, start=3)
    assert [e.question for e in examples] == ["q3?", "q4?"]
    assert [len(e.passages) for e in examples] == [2, 3]


@pytest.mark.parametrize("content, message", [
    ("[1, 2]", "example 0 is a int, not an object"),
    ('[{"question": "q", "answers": ["a"]}]', "expected 'ctxs' (CacheBlend) or 'paragraphs'"),
    ('[{"question": "q", "answers": [], "ctxs": [{"title": "t", "text": "x"}]}]',
     "non-empty list of strings"),
    ('[{"question": 3, "answers": ["a"], "ctxs": []}]', "'question' must be a string, got int"),
    ('[{"question": "q", "answers": ["a"], "ctxs": [{"title": "", "text": ""}]}]', "every passage is blank"),
    ('{"question": "q"\n', "line 1 is not a JSON object"),
    ("[{", "not valid JSON"),
])
def test_malformed_files_name_the_problem(tmp_path, content, message):
    path = tmp_path / "bad.json"
    path.write_text(content)
    with pytest.raises(DataError, match=message.replace("(", r"\(").replace(")", r"\)")):
        load_examples(path, limit=5)


def test_start_past_the_end_is_an_error(tmp_path):
    path = tmp_path / "cb.json"
    path.write_text(json.dumps([cacheblend("q", ["a"], 2)]))
    with pytest.raises(DataError, match="1 examples, none from --start 1"):
        load_examples(path, limit=1, start=1)


def test_the_shared_musique_file_reads_whole():
    examples = load_examples(SHARED, limit=100, passages=10)
    assert len(examples) == 100
    assert sum(len(e.passages) for e in examples) == 1000
    assert all(e.question.endswith("?") and e.answers for e in examples)
