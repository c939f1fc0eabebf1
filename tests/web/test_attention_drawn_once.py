"""Attention drawn once, on the server. The most-attended notes (`top_tokens`): the run page's rows
(`GET /runs/{id}/attention/top`, what heatmap.js shows), the report's data and the JSON export
list the same tokens; only notes (document, errata, skills), words unless asked, each with the
text around it, so ten " the"s say which ones they are. The colours (`paint`): what the run
page's script and the report's paint is what the server-drawn panels carry."""

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


def test_one_colour_model_for_the_run_page_and_the_report(make_client):
    """The run page's script paints what `/runs/{id}/attention/paint` computes: the colours the
    report's server-drawn panels carry for the same view, token for token, scales included."""
    client = make_client()
    run = long_record_run(session(), ("recompute", "stale", "field_erratum"))
    for view in ("strategy=field_erratum", "strategy=stale&layer=2&head=1", "strategy=stale&query=1"):
        paint = client.get(f"/runs/{run.id}/attention/paint?{view}").json()
        report = client.get(f"/runs/{run.id}/report.html?{view}").text
        for side, box in (("ref", "rp-ref"), ("res", "rp-res"), ("diff", "rp-diff")):
            cells = report.split(f'id="{box}">')[1].split("</div>")[0]
            drawn = re.findall(r'style="background-color:(#[0-9a-f]{6})(?:;color:(#[0-9a-f]{3}))?"', cells)
            assert [bg for bg, _ in drawn] == paint[side]["bg"], (view, side)
            assert [fg for _, fg in drawn] == paint[side]["fg"], (view, side)
        assert f"0 … {paint['vmax']:.4f}" in report and f"±{paint['dmax']:.4f}" in report
        assert len(set(paint["res"]["bg"])) > 5 and paint["diff"]["sign"].count("pos") > 0
    heads = client.get(f"/runs/{run.id}/attention/heads?strategy=stale").json()
    assert len(heads["colours"]) == len(heads["head_diff"]) and heads["zero"] == 0.005
    assert all(re.fullmatch(r"#[0-9a-f]{6}", c) for row in heads["colours"] for c in row)
    # the report's script shows any strategy with the same colours the page gets for it
    data = json.loads(re.search(r'<script type="application/json" id="report-data">(.*?)</script>',
                                client.get(f"/runs/{run.id}/report.html").text, re.S).group(1))
    page = client.get(f"/runs/{run.id}/attention/paint?strategy=stale").json()
    assert data["strategies"]["stale"]["paint"] == page


def test_dark_slides_draw_a_zero_on_the_dark_panel(make_client):
    """The dark variant of the colour model: a token with no attention (and a difference of 0) takes
    the dark panel's own colour, never a lighter box; every dark level's text reads at WCAG AA; the
    slides carry each cell's dark class and the rules for it."""
    from app.web.runs.heatmap_view import (
        STYLESHEET,
        contrast,
        dark_class,
        dark_colours,
        dark_css,
        div_t,
        luminance,
        palette,
        seq_t,
    )

    panel = re.search(r'html\.present-mode\[data-theme="dark"\] \{[^}]*--paper: (#[0-9a-f]{6})',
                      STYLESHEET.read_text()).group(1)
    rgb = lambda h: tuple(int(h[i:i + 2], 16) for i in (1, 3, 5))  # noqa: E731
    assert panel == "#1b2130" and rgb(panel) == palette()["dark-paper"]
    colours = dark_colours()
    for zero in (dark_class("s", seq_t(0.0, 0.0123)), dark_class("d", div_t(0.0, 0.004))):
        assert colours[zero][0] == panel and luminance(rgb(colours[zero][0])) <= luminance(rgb(panel)), zero
    assert len(colours) == 66 and luminance(rgb(colours["dk-s32"][0])) > 0.8  # the scale ends light
    ink = rgb("#eef1f6")  # the dark theme's --ink
    for name, (bg, fg) in colours.items():
        text = ink if fg == "var(--ink)" else rgb(fg + fg[1:] if len(fg) == 4 else fg)
        assert contrast(text, rgb(bg)) >= 4.5, (name, bg, fg)
    client = make_client()
    run = long_record_run(session(), ("recompute", "stale", "field_erratum"))
    slide = client.get(f"/runs/{run.id}/present/3?strategy=stale").text
    assert dark_css() in slide
    for box, scale in (("pr-ref", "s"), ("pr-res", "s"), ("pr-diff", "d")):
        cells = slide.split(f'id="{box}">')[1].split("</div>")[0]
        classes = re.findall(r'<span class="tok [^"]*\bdk-([sd])(\d+)\b', cells)
        assert len(classes) == cells.count('<span class="tok ') > 50, box
        assert {s for s, _ in classes} == {scale}, box
