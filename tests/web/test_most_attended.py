"""The most-attended notes, ranked once on the server (`top_tokens`): the run page's rows
(`GET /runs/{id}/attention/top`, what heatmap.js shows), the report's data and the JSON export
list the same tokens; only notes (document, errata, skills), words unless asked, each with the
text around it, so ten " the"s say which ones they are."""

from __future__ import annotations

import html
import json
import re

from data.models import RunResult
from tests.web.conftest import long_record_run, session

ROW = re.compile(r'<tr data-i="(\d+)"[^>]*><td>(\d+)</td><td>(.*?)</td><td class="in-context">'
                 r'<span class="faint">(.*?)</span><mark>(.*?)</mark><span class="faint">(.*?)</span></td>'
                 r"<td>(\w+)</td>", re.S)


def _rows(client, run_id: int, query: str) -> list[tuple]:
    r = client.get(f"/runs/{run_id}/attention/top?{query}")
    assert r.status_code == 200, r.text
    return [(int(i), int(rank), html.unescape(before), html.unescape(mark), html.unescape(after), segment)
            for i, rank, _, before, mark, after, segment in ROW.findall(r.text)]


def test_one_ranking_of_the_notes_each_with_its_context(make_client):
    client = make_client()
    s = session()
    run = long_record_run(s, ("recompute", "stale", "field_erratum"))
    tokens = s.query(RunResult).filter_by(run_id=run.id, strategy="field_erratum").one().tokens
    rows = _rows(client, run.id, "strategy=field_erratum")
    assert [r[1] for r in rows] == list(range(1, 11))
    by_segment: dict[str, str] = {}
    for t in tokens:
        by_segment[t.segment] = by_segment.get(t.segment, "") + t.text
    for i, _, before, mark, after, segment in rows:
        assert i >= 4 and segment in ("document", "erratum", "skill"), (i, segment)
        assert tokens[i].segment == segment and re.search(r"\w", mark)
        assert mark == tokens[i].text.replace("\n", " ")  # the token, on one line
        assert before and after and len(before) <= 25 and len(after) <= 25, (before, after)
        seen = before.removeprefix("…") + mark + after.removesuffix("…")
        assert seen in " ".join(by_segment[segment].split("\n")), seen  # the text just around it
    # the report's script and the JSON export list the same tokens in the same order
    report = client.get(f"/runs/{run.id}/report.html").text
    data = json.loads(re.search(r'<script type="application/json" id="report-data">(.*?)</script>',
                                report, re.S).group(1))
    assert [t["inline"] for t in data["strategies"]["field_erratum"]["top"]] == [r[3] for r in rows]
    export = client.get(f"/runs/{run.id}/export.json?strategy=field_erratum").json()
    assert [t["text"].replace("\n", " ") for t in export["view"]["top_tokens"]] == [r[3] for r in rows]


def test_the_rows_follow_the_view_and_the_toggle(make_client):
    client = make_client()
    run = long_record_run(session(), ("recompute", "stale"))
    words = _rows(client, run.id, "strategy=stale&layer=1&head=2")
    every = _rows(client, run.id, "strategy=stale&layer=1&head=2&all=1")
    assert len(words) == len(every) == 10
    assert min(r[0] for r in words) >= 4  # the sink aside unless asked
    assert _rows(client, run.id, "strategy=stale&query=0")  # a question token as the query
    assert client.get(f"/runs/{run.id}/attention/top?strategy=in_place").status_code == 422
