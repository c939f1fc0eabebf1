"""`/compare`: each run's column holds the text the chosen strategy's notes actually hold (new values
for recompute and the editing strategies, old ones for stale and erratum, the erratum after them,
placed skills in place), aligned line by line. Runs are real: the run task on a tiny model."""

from __future__ import annotations

import re

import pytest

from tests.web.engine_run import engine_notebook, engine_run

pytestmark = pytest.mark.slow

DOC = "Account record\n\nstatus: active\nowner: Dana Lee\n\nOnly accounts whose status is active may log in."
REWORDED = DOC.replace("Only accounts", "Just accounts")
STRATEGIES = ["recompute", "stale", "erratum", "field_erratum"]
SKILL = "House rule: answer in one word.\n"


@pytest.fixture
def client(make_client):
    return make_client(KVNOTES_MODELS="tiny-llama,smollm2-135m")


def rows(html: str, label: str = "notes") -> list[list[str]]:
    """The aligned rows labelled `label`: each row's cells as plain text."""
    row = rf'<div role="row" style="display:contents" data-row="{label}">(.*?</div>)</div>'
    found = re.findall(row, html, re.S)
    cells = [re.findall(r'<div class="cell[^"]*" role="cell">(.*?)</div>', r, re.S) for r in found]
    return [[_plain(c) for c in row] for row in cells]


def changed(html: str) -> list[str]:
    return [_plain(c) for c in re.findall(r'<div class="cell changed" role="cell">(.*?)</div>', html, re.S)]


def differing(html: str) -> list[list[str]]:
    """Per marked cell, its runs of words outlined as differing."""
    out = []
    for cell in re.findall(r'<div class="cell changed" role="cell">(.*?)</div>', html, re.S):
        pieces = re.findall(r'<span class="([^"]*)"[^>]*>(.*?)</span>|([^<]+)', cell, re.S)
        runs, current = [], ""
        for classes, text, _bare in pieces:
            if "cmp-diff" in classes:
                current += text
            elif current:
                runs, current = [*runs, current], ""
        out.append([*runs, current] if current else runs)
    return out


def _plain(cell: str) -> str:
    return re.sub(r"<[^>]+>", "", cell).replace("&#39;", "'").replace("&amp;", "&")


def test_each_column_shows_what_the_strategy_read_aligned_line_by_line(client) -> None:
    fields = [("active", "suspended", "status")]
    a = engine_run(engine_notebook(DOC, fields, title="Before"), STRATEGIES)
    b = engine_run(engine_notebook(REWORDED, fields, title="After"), STRATEGIES)
    lines = DOC.split("\n")  # 6 lines; the reworded document has the same 6, one of them reworded
    line = lines[5]

    page = client.get(f"/compare?runs={a},{b}&strategy=recompute")
    assert page.status_code == 200
    recompute = rows(page.text)
    assert len(recompute) == len(lines) == 6  # one row per aligned line, not one per word
    assert recompute[2] == ["status: suspended\n"] * 2  # recompute read the new value in both runs
    assert recompute[5] == [line.replace("Only", word) for word in ("Only", "Just")]
    assert changed(page.text) == recompute[5]  # the reworded line is the one marked row
    assert differing(page.text) == [["Only"], ["Just"]]  # and in it, the word that differs, in each run
    assert page.text.count('class="cmp-field"') >= 2  # the new value is underlined as the field
    assert "errata" not in re.findall(r'data-row="(\w+)"', page.text)  # recompute read no erratum

    stale = rows(client.get(f"/compare?runs={a},{b}&strategy=stale").text)
    assert len(stale) == 6 and stale[2] == ["status: active\n"] * 2  # stale's notes hold the old value

    erratum_page = client.get(f"/compare?runs={a},{b}&strategy=erratum").text
    assert rows(erratum_page)[2] == ["status: active\n"] * 2  # the original text …
    errata = rows(erratum_page, "errata")
    assert len(errata) == 1 and all("suspended" in cell for cell in errata[0])  # … and the erratum after it
    field_erratum = rows(client.get(f"/compare?runs={a},{b}&strategy=field_erratum").text)
    assert field_erratum[2] == ["status: suspended\n"] * 2


def test_a_spliced_skill_sits_where_it_was_placed(client) -> None:
    fields = [("active", "suspended", "status")]
    at = DOC.index("Only")
    with_skill = engine_run(engine_notebook(DOC, fields, skill=(SKILL, at), title="Skill"),
                            ["recompute", "stale"])
    without = engine_run(engine_notebook(DOC, fields, title="Plain"), ["recompute", "stale"])
    for strategy, value in (("recompute", "suspended"), ("stale", "active")):
        html = client.get(f"/compare?runs={with_skill},{without}&strategy={strategy}").text
        notes = rows(html)
        assert len(notes) == len(DOC.split("\n")) + 1  # the skill's line is one more aligned line
        assert notes[2] == [f"status: {value}\n"] * 2
        assert notes[5] == [SKILL, ""]  # the skill in place: after the blank line, before "Only accounts"
        assert notes[6][0] == notes[6][1] == "Only accounts whose status is active may log in."
        assert changed(html) == [SKILL, ""]
        skill_spans = re.findall(r'<span class="cmp-skill" style[^>]*>(.*?)</span>', html, re.S)
        assert "".join(skill_spans) == SKILL  # every character of the skill drawn as the skill


def test_lines_and_sentences_align_across_three_texts() -> None:
    from app.web.runs.compare_view import aligned_units, unit_key, units

    text = "Title\n\nOne sentence here. Another one follows.\nLast line."
    assert [text[a:b] for a, b in units(text)] == [
        "Title\n", "\n", "One sentence here. ", "Another one follows.\n", "Last line."]
    docs = ["A.\nB old.\nC.\nD.", "A.\nB new.\nC.\nD.\nE.", "A.\nC.\nD."]
    keys = [[unit_key(d[a:b]) for a, b in units(d)] for d in docs]
    aligned = [(shared, [None if i is None else k[i] for k, i in zip(keys, picked)])
               for shared, picked in aligned_units(keys)]
    assert aligned == [
        (True, ["A."] * 3), (False, ["B old.", "B new.", None]), (True, ["C."] * 3), (True, ["D."] * 3),
        (False, [None, "E.", None]),
    ]
    for k, seq in enumerate(keys):  # every line of every text is shown once, in order
        shown = [picked[k] for _, picked in aligned_units(keys) if picked[k] is not None]
        assert shown == list(range(len(seq)))


def test_unrelated_documents_align_by_their_common_lines_only() -> None:
    from app.web.runs.compare_view import aligned_units, paired_when_alike, unit_key, units

    docs = ["Shipment log\nDestination: Oslo\nCarrier: NordFreight ships on Mondays.\nstatus: active\n",
            "Account record\nOwner: Dana Lee of the northern branch.\nstatus: active\n"
            "Only accounts may log in.\n"]
    keys = [[unit_key(d[a:b]) for a, b in units(d)] for d in docs]
    rows = [(shared, [None if i is None else k[i] for k, i in zip(keys, picked)])
            for shared, picked in paired_when_alike(aligned_units(keys), keys)]
    assert (True, ["status: active", "status: active"]) in rows  # the one common line, on one row
    assert all(shared or None in texts for shared, texts in rows), rows  # no unrelated pair
    for k, seq in enumerate(keys):  # every line still shown once, in order
        assert [p[k] for _, p in paired_when_alike(aligned_units(keys), keys) if p[k] is not None] == \
            list(range(len(seq)))
    reworded = [["Only accounts whose status is active may log in."],
                ["Just accounts whose status is active may log in."]]
    assert paired_when_alike(aligned_units(reworded), reworded) == [(False, [0, 0])]  # alike: paired


def test_compare_says_when_two_runs_share_little_text(make_client) -> None:
    from tests.web.conftest import finished

    client = make_client()
    other = ("Shipment log\n\nDestination: Oslo\nCarrier: NordFreight ships on Mondays.\n"
             "status: active\nThe depot closes at noon on Fridays.")
    _, a = finished(client)
    _, b = finished(client, doc=other, title="Shipment")
    page = client.get(f"/compare?runs={a},{b}").text
    assert "These runs share little text:" in page and "lines are common to every run" in page
    assert differing(page) == [[]] * len(differing(page))  # no word outlined against an unrelated line
    _, c = finished(client)
    assert "share little text" not in client.get(f"/compare?runs={a},{c}").text
