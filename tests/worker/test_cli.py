"""The `kvnotes` command line: its JSON contract and its one-line errors."""

from __future__ import annotations

import json

import pytest

from tests.worker.conftest import DOC, kvnotes
from vocabulary import METRIC_NAMES


def test_edit_prints_the_json_contract(doc):
    out = kvnotes("edit", "--model", "tiny-llama", "--document", str(doc[0]), "--replace", "active", "closed",
                  "--replace", "Ada", "Grace", "--question", "Can the user log in?", "--choices", "yes,no",
                  "--strategies", "recompute,stale,erratum", "--json")
    assert out.returncode == 0, out.stderr
    data = json.loads(out.stdout)
    assert data["model"] == "tiny-llama" and data["document_tokens"] == len(DOC) + 1  # bytes + start token
    assert list(data["strategies"]) == ["recompute", "stale", "erratum"]
    for r in data["strategies"].values():
        assert tuple(r) == METRIC_NAMES and set(r["choice_probs"]) == {"yes", "no"}


def test_edit_with_mechanism_prints_its_three_views(doc):
    args = ("edit", "--model", "tiny-llama", "--document", str(doc[0]), "--replace", "active", "closed",
            "--question", "Can the user log in?", "--choices", "yes,no", "--strategies", "recompute,stale",
            "--mechanism")
    data = json.loads(kvnotes(*args, "--json").stdout)["mechanism"]
    measured = [row for row in data["knockout"] if row["reading"] is not None]
    assert len(measured) >= 6 and all(row["control"]["draws"] == 5 for row in measured)
    # in_place (K = 0) already decides as recompute on the tiny model: the sweep is skipped, and says so
    assert data["selective_k"] == [] and "the sweep was skipped" in data["selective_skipped"]
    assert {name: len(ps) for name, ps in data["logit_lens"].items()} == {"recompute": 2, "stale": 2}
    text = kvnotes(*args).stdout  # the text form says the same in lines
    assert text.count("  knockout recompute") == sum(r["strategy"] == "recompute" for r in data["knockout"])
    assert "selective@K skipped: in_place (the field alone, K = 0)" in text and "lens stale" in text


def test_compose_reports_recompute_and_splice(doc):
    out = kvnotes("compose", "--model", "tiny-qwen3", "--context", str(doc[0]), "--skill", str(doc[1]),
                  "--skill", str(doc[1]), "--at", "16", "--seam", "2", "--question", "Who owns it?", "--json")
    assert out.returncode == 0, out.stderr
    data = json.loads(out.stdout)
    assert list(data["strategies"]) == ["recompute", "splice"]
    assert data["strategies"]["splice"]["tokens_computed"] == 4  # seam repair: 2 tokens of each of 2 skills


@pytest.mark.parametrize("args, message", [
    (["edit", "--document", "/nope/doc.txt", "--replace", "a", "b", "--question", "q"],
     "document file not found"),
    (["edit", "--document", "{doc}", "--replace", "zzz", "b", "--question", "q"],
     "'zzz' is not in the document"),
    (["edit", "--model", "no-such-model", "--document", "{doc}", "--replace", "Ada", "b", "--question", "q"],
     "unknown model 'no-such-model'"),
    (["compose", "--model", "tiny-gpt2", "--context", "{doc}", "--skill", "{doc}", "--question", "q"],
     "no rotary position embedding"),
    (["edit", "--model", "tiny-llama", "--document", "{doc}", "--replace", "Ada", "b", "--question", "q",
      "--strategies", "recompute,magic"], "unknown strategy 'magic'"),
    (["compose", "--model", "tiny-llama", "--context", "{doc}", "--skill", "{doc}", "--at", "9999",
      "--question", "q"], "outside the document"),
])
def test_bad_input_exits_nonzero_with_one_clear_line(doc, args, message):
    out = kvnotes(*[a.replace("{doc}", str(doc[0])) for a in args])
    assert out.returncode == 2
    lines = [ln for ln in out.stderr.splitlines() if ln.startswith("kvnotes:")]
    assert len(lines) == 1 and message in lines[0], out.stderr
    assert "Traceback" not in out.stderr


def test_models_lists_every_alias():
    out = kvnotes("models", "--json")
    aliases = {m["alias"] for m in json.loads(out.stdout)}
    assert {"smollm2-135m", "gemma3-270m", "tiny-llama", "tiny-gemma3", "tiny-gpt2"} <= aliases
