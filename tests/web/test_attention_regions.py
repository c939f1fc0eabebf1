"""Attention by region, the paper's figure: which region each cached token belongs to, and a real
run's decision attention summed over the regions (each strategy's shares sum to 1, the erratum's
own tokens draw attention only where an erratum was appended, the placed skill's only where spliced)."""

from __future__ import annotations

import numpy as np
import pytest

from app.services.attention import attention_regions, compare_heads, heads_moved_most
from vocabulary.regions import REGIONS, Span, token_regions

DOC = ("Account record\nstatus: active\nregion: north\nplan: basic\n"
       "Only accounts whose status is active may log in. Support answers within a day.\n")


def test_token_regions_by_segment_position_and_field():
    frame = [Span(-1, -1, "frame")] * 2
    # the first three spans: ", "status:", " active"
    doc = [Span(0, 7, "document"), Span(8, 14, "document"), Span(15, 22, "document"),
           Span(22, 23, "document"), Span(23, 30, "document")]
    tail = [Span(-1, -1, "erratum"), Span(-1, -1, "skill"), Span(-1, -1, "question"), Span(-1, -1, "answer")]
    assert token_regions(frame + doc + tail, [(16, 22)]) == [
        "sink", "sink", "sink", "sink",          # the first 4 tokens, whatever their segment
        "field", "after_field", "after_field",   # overlapping the field; after its start
        "errata", "skills", "question", "question"]
    assert token_regions(frame + doc, []) == ["sink"] * 4 + ["before_field"] * 3  # no field: all before
    skill_as_text = [Span(-1, -1, "frame")] * 4 + [Span(0, 5, "document"), Span(-1, -1, "document")]
    # recompute reads a skill as text
    assert token_regions(skill_as_text, [])[4:] == ["before_field", "skills"]
    late = [Span(-1, -1, "frame")] * 4 + [Span(0, 5, "document"), Span(16, 22, "document"),
                                          Span(-1, -1, "frame")]
    assert token_regions(late, [(16, 22)]) == ["sink"] * 4 + ["before_field", "field", "after_field"]


@pytest.fixture(scope="module")
def real_run():
    """A real run on a tiny random model: a field, an erratum strategy, a skill spliced mid-document."""
    from worker.engine import Field, Placement, Question, RunRequest, load
    from worker.mapping import result_rows

    eng = load("tiny-llama")
    start = DOC.index("active")
    request = RunRequest(DOC, Question("What is the status of the account?", max_new_tokens=4),
                         fields=(Field(start, start + 6, "suspended", "status"),),
                         strategies=("recompute", "stale", "in_place", "erratum", "field_erratum"),
                         placements=(Placement("Skill: answer in one word.", at=DOC.index("Only")),),
                         attention=True)
    report = eng.run(request)
    return {row.strategy: row for row in result_rows(1, report)}, [(start, start + 6)]


def test_every_strategys_regions_sum_to_one_on_a_real_run(real_run):
    results, fields = real_run
    regions = attention_regions(results, fields)
    assert list(regions)[0] == "recompute" and set(regions) == set(results)
    for name, shares in regions.items():
        assert list(shares.mean) == list(REGIONS)
        assert sum(shares.mean.values()) == pytest.approx(1.0, abs=0.01), name
        assert all(0.0 <= v <= 1.0 for v in shares.mean.values()), name
        layers = results[name].attention_shape[0]
        assert len(shares.per_layer) == layers
        assert all(sum(layer.values()) == pytest.approx(1.0, abs=0.01) for layer in shares.per_layer)
        # the mean over layers is the mean of the per-layer shares
        assert shares.mean["sink"] == pytest.approx(np.mean([layer["sink"] for layer in shares.per_layer]),
                                                    abs=0.01)
        assert shares.mean["field"] > 0 and shares.mean["skills"] > 0 and shares.mean["question"] > 0, name
    for name in ("erratum", "field_erratum"):
        assert regions[name].mean["errata"] > 0.001
    for name in ("recompute", "stale", "in_place"):
        assert regions[name].mean["errata"] == 0.0


def test_the_heads_that_moved_most_are_ranked_against_recompute(real_run):
    results, _ = real_run
    moved = heads_moved_most(compare_heads(results["stale"], results["recompute"], "stale"), n=3)
    diff = compare_heads(results["stale"], results["recompute"], "stale").head_diff
    assert len(moved) == 3 and moved[0].moved == pytest.approx(float(diff.max()))
    assert moved[0].moved >= moved[1].moved >= moved[2].moved > 0
    assert diff[moved[0].layer, moved[0].head] == pytest.approx(moved[0].moved)
    # attention that did not move names no head (not "layer 14 head 8, 0% moved")
    same = compare_heads(results["recompute"], results["recompute"], "recompute")
    assert float(same.head_diff.max()) == 0.0 and heads_moved_most(same) == []


def _finished(client):
    """A notebook with a field on "active" and a finished run written as a worker writes one."""
    from tests.web.conftest import page_run

    return page_run(client, strategies=("recompute", "stale", "field_erratum"))[2]


def test_the_api_carries_attention_regions_summing_to_one(make_client):
    client = make_client()
    run = _finished(client)
    regions = client.get(f"/api/runs/{run.id}").json()["attention_regions"]
    assert set(regions) == {"recompute", "stale", "field_erratum"}
    for name, shares in regions.items():
        assert list(shares) == list(REGIONS)
        assert sum(shares.values()) == pytest.approx(1.0, abs=0.01), name
    assert regions["field_erratum"]["errata"] > 0 and regions["recompute"]["errata"] == 0
    assert regions["stale"]["sink"] > 0.3  # the fixture's first token holds most of each head's attention
    # the fixture's tokens are words of "Account record\n\nstatus: active\n…": one field token
    assert 0 < regions["recompute"]["field"] < 0.1


def test_the_run_page_shows_regions_beside_the_papers_reading(make_client):
    client = make_client()
    run = _finished(client)
    page = client.get(f"/runs/{run.id}").text
    # above the token heatmap, loaded after the page opens (it reads every strategy's attention)
    assert page.index(f'hx-get="/runs/{run.id}/regions"') < page.index('id="attention"')
    html = client.get(f"/runs/{run.id}/regions").text
    api = client.get(f"/api/runs/{run.id}").json()["attention_regions"]
    for region in REGIONS:  # the panel draws the API's numbers
        assert f'data-region="{region}" data-share="{api["stale"][region]:.5f}"' in html
    assert "the paper's reading" in html and "≈ 0.1%" in html and "≈ 56%" in html and "≈ 36%" in html
    # a per-layer plot per strategy: 4 layers × 14 px
    assert html.count("<svg width=\"56\" height=\"64\"") == 3
    assert html.count("<title>layer 3: sink") == 3
    assert "Heads that moved most against recompute" in html and "?strategy=stale&amp;layer=" in html
    assert 'id="hm-top-all"' in page  # the sink, whitespace and punctuation behind a toggle
