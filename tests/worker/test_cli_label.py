"""`kvnotes edit --label` (issue 43): one name per --replace, so an edit writes the erratum a sweep on
that field writes, and decides as the sweep does. On tiny-llama (a byte tokenizer) the erratum's
tokens computed are its length: equal counts are the same erratum text."""

from __future__ import annotations

import json

from tests.worker.conftest import kvnotes

ASK = ("--question", "Can the user log in?", "--choices", "yes,no", "--strategies", "recompute,stale,erratum",
       "--json")


def test_edit_with_a_label_writes_the_sweeps_erratum_and_decides_as_it_does(doc):
    path = str(doc[0])
    edit = kvnotes("edit", "--model", "tiny-llama", "--document", path, "--replace", "active", "closed",
                   "--label", "account status", *ASK)
    sweep = kvnotes("sweep", "--model", "tiny-llama", "--document", path, "--field", "active",
                    "--label", "account status", "--values", "closed", *ASK)
    assert edit.returncode == 0 and sweep.returncode == 0, (edit.stderr, sweep.stderr)
    one, many = json.loads(edit.stdout)["strategies"], json.loads(sweep.stdout)["edits"][0]
    assert one["erratum"]["tokens_computed"] == many["tokens_computed"]["erratum"]
    assert {k: r["decision"] for k, r in one.items()} == many["decisions"]
    # unlabelled, both name the field "the value"
    plain = json.loads(kvnotes("edit", "--model", "tiny-llama", "--document", path, "--replace", "active",
                               "closed", *ASK).stdout)["strategies"]
    unlabelled = json.loads(kvnotes("sweep", "--model", "tiny-llama", "--document", path, "--field", "active",
                                    "--values", "closed", *ASK).stdout)["edits"][0]
    assert plain["erratum"]["tokens_computed"] == unlabelled["tokens_computed"]["erratum"]
    assert plain["erratum"]["tokens_computed"] != one["erratum"]["tokens_computed"]


def test_one_label_per_replace(doc):
    out = kvnotes("edit", "--model", "tiny-llama", "--document", str(doc[0]), "--replace", "active", "closed",
                  "--replace", "Ada", "Grace", "--label", "status", *ASK)
    assert out.returncode == 2 and "--label: give one per --replace (2 --replace, 1 --label)" in out.stderr
