"""`kvnotes attribute` names each field's own share and says what the shares are."""

from __future__ import annotations

import json
import re

from tests.worker.conftest import DOC, kvnotes


def test_attribute_names_each_fields_share_and_says_shares_do_not_add_up(doc) -> None:  # noqa: F811
    args = ("attribute", "--model", "tiny-llama", "--document", str(doc[0]), "--replace", "active", "closed",
            "--replace", "Ada", "Grace", "--question", "Can the user log in?")
    out = kvnotes(*args)
    assert out.returncode == 0, out.stderr
    alone = re.findall(r"alone, '(\w+)' closes (-?\d+)% of the gap", out.stdout)
    assert [name for name, _ in alone] == ["active", "Ada"]
    assert "each share is that patch alone (they do not add up)" in out.stdout
    data = json.loads(kvnotes(*args, "--json").stdout)
    status, owner = DOC.index("active"), DOC.index("Ada")
    spans = [(e["start_char"], e["end_char"]) for e in data["edits"]]
    assert spans == [(status, status + 6), (owner, owner + 3)]
    assert [int(share) for _, share in alone] == [round(100 * e["share"]) for e in data["edits"]]
