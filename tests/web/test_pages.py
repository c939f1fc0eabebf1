"""The HTML pages and htmx fragments, through FastAPI's test client on a fresh database with the
embedded SQLite broker (runs are really enqueued; no worker runs them here)."""

from __future__ import annotations

import re

import pytest

from data.models import Notebook, Run, Skill, utcnow
from tests.web.conftest import DOC, HX, add_field, new_notebook, session  # noqa: F401
from tests.web.conftest import page_run as finished


@pytest.fixture
def client(make_client):
    return make_client()


def test_index_empty_state_offers_examples(client) -> None:
    page = client.get("/").text
    assert "No notebooks yet" in page
    assert 'action="/examples/access-policy"' in page
    assert '<option value="smollm2-135m" selected>' in page  # the default model is preselected


def test_user_text_is_escaped_everywhere(client) -> None:
    nb = new_notebook(client, text="Hello <script>alert(1)</script> world", title="<b>bold</b>")
    page = client.get(f"/notebooks/{nb}").text
    assert "<script>alert(1)</script>" not in page
    assert "&lt;script&gt;alert(1)&lt;/script&gt;" in page
    assert "&lt;b&gt;bold&lt;/b&gt;" in page
    assert "<b>bold</b>" not in client.get("/").text


def test_create_errors_sit_next_to_their_field_and_keep_what_was_typed(client) -> None:
    resp = client.post("/notebooks", data={"title": "Kept title", "model": "smollm2-135m", "text": "   "})
    assert resp.status_code == 422
    assert 'id="err-text"' in resp.text and "paste a document or upload a file" in resp.text
    assert 'value="Kept title"' in resp.text
    resp = client.post("/notebooks", data={"title": "x" * 500, "model": "smollm2-135m", "text": "some text"})
    assert resp.status_code == 422
    assert 'id="err-title"' in resp.text and "at most 200 characters" in resp.text
    assert ">some text</textarea>" in resp.text
    resp = client.post("/notebooks", data={"title": "t", "model": "gpt-9", "text": "x"})
    assert resp.status_code == 422 and 'id="err-model"' in resp.text


def test_upload_json_and_markdown(client) -> None:
    resp = client.post(
        "/notebooks", data={"title": "up", "model": "smollm2-135m", "text": ""},
        files={"file": ("doc.json", b'{"text": "from json"}', "application/json")}, follow_redirects=True,
    )
    assert resp.status_code == 200 and "from json" in resp.text
    resp = client.post(
        "/notebooks", data={"title": "up", "model": "smollm2-135m", "text": ""},
        files={"file": ("doc.json", b'{"nope": 1}', "application/json")},
    )
    assert resp.status_code == 422 and 'id="err-file"' in resp.text
    resp = client.post(
        "/notebooks", data={"model": "smollm2-135m"},
        files={"file": ("a.md", b"# Title\n\nbody", "text/markdown")},
        follow_redirects=True,
    )
    assert "# Title" in resp.text


def test_selection_makes_a_field_chip_and_its_erratum(client) -> None:
    nb = new_notebook(client)
    resp = add_field(client, nb)
    assert resp.status_code == 200 and resp.headers["HX-Reswap"] == "none"
    html = resp.text
    assert 'id="document"' in html and 'hx-swap-oob="true"' in html
    chip = re.search(r'<mark class="field-chip"[^>]*data-start="(\d+)" data-end="(\d+)"', html)
    assert chip and DOC[int(chip[1]) : int(chip[2])] == "active"
    assert "status has changed from active to suspended" in html  # generated erratum
    # the text pieces still cover the document exactly, with their offsets
    pieces = re.findall(r'<span class="(?:old )?t" data-start="(\d+)" data-end="(\d+)">', html)
    assert sorted((int(a), int(b)) for a, b in pieces)[-1][1] == len(DOC)


def test_field_errors_come_back_in_the_popover_with_values_kept(client) -> None:
    nb = new_notebook(client)
    assert add_field(client, nb).status_code == 200
    resp = add_field(client, nb, find="active", new="closed", label="again")
    assert resp.status_code == 422
    assert "overlaps field" in resp.text and 'value="closed"' in resp.text and 'value="again"' in resp.text
    resp = add_field(client, nb, find="owner", new="", label="who")
    assert resp.status_code == 422 and 'id="err-new_value"' in resp.text
    # a selection that no longer matches the text is refused with a reason
    resp = client.post(f"/notebooks/{nb}/fields",
                       data={"start": 0, "end": 5, "selected": "Other", "new_value": "x"}, headers=HX)
    assert resp.status_code == 422 and "select the span again" in resp.text


def test_edit_and_remove_field(client) -> None:
    nb = new_notebook(client)
    add_field(client, nb)
    fid = session().get(Notebook, nb).fields[0].id
    resp = client.post(f"/notebooks/{nb}/fields/{fid}",
                       data={"label": "state", "new_value": "closed"}, headers=HX)
    assert resp.status_code == 200 and "state has changed from active to closed" in resp.text
    resp = client.post(f"/notebooks/{nb}/fields/{fid}", data={"label": "state", "new_value": ""}, headers=HX)
    assert resp.status_code == 422 and f'id="field-{fid}"' in resp.text and 'id="err-new_value"' in resp.text
    resp = client.post(f"/notebooks/{nb}/fields/{fid}/delete", headers=HX)
    assert resp.status_code == 200 and "field-chip" not in resp.text


def test_errata_add_edit_reorder_remove(client) -> None:
    nb = new_notebook(client)
    add_field(client, nb)
    resp = client.post(f"/notebooks/{nb}/errata", data={"text": "[NOTE] the owner moved."}, headers=HX)
    assert resp.status_code == 200 and "[NOTE] the owner moved." in resp.text
    assert "≈ 6 tokens" in resp.text  # 23 characters / 4, labelled as an estimate
    resp = client.post(f"/notebooks/{nb}/errata", data={"text": "  "}, headers=HX)
    assert resp.status_code == 422 and "write the correction" in resp.text
    s = session()
    first, second = [e.id for e in s.get(Notebook, nb).errata]
    client.post(f"/notebooks/{nb}/errata/{second}/move", data={"move": "-1"}, headers=HX)
    assert [e.id for e in session().get(Notebook, nb).errata] == [second, first]
    resp = client.post(f"/notebooks/{nb}/errata/{first}", data={"text": "edited by hand"}, headers=HX)
    assert resp.status_code == 200
    edited = [e for e in session().get(Notebook, nb).errata if e.id == first][0]
    assert edited.text == "edited by hand" and edited.source == "custom"
    resp = client.post(f"/notebooks/{nb}/errata/{first}", data={"text": ""}, headers=HX)
    assert resp.status_code == 422 and "remove it instead" in resp.text
    client.post(f"/notebooks/{nb}/errata/{first}/delete", headers=HX)
    assert [e.id for e in session().get(Notebook, nb).errata] == [second]


def _compiled_skill(name: str = "one word", model: str = "smollm2-135m") -> int:
    s = session()
    skill = Skill(name=name, text="Answer with one word.", model=model, status="compiled",
                  token_count=7, compile_ms=80.0)
    s.add(skill)
    s.commit()
    return skill.id


def test_palette_and_placements(client) -> None:
    nb = new_notebook(client)
    sid = _compiled_skill()
    assert f'data-skill-id="{sid}"' in client.get(f"/notebooks/{nb}").text
    para = DOC.index("Only")
    resp = client.post(f"/notebooks/{nb}/placements", data={"skill_id": sid, "position": para}, headers=HX)
    assert resp.status_code == 200
    assert f"at char {para}" in resp.text and f"RoPE shift Δ ≈ {-(-para // 4)} positions" in resp.text
    pid = session().get(Notebook, nb).placements[0].id
    client.post(f"/notebooks/{nb}/placements/{pid}/move", data={"step": "1"}, headers=HX)
    assert session().get(Notebook, nb).placements[0].position is None  # moved to the end
    resp = client.post(f"/notebooks/{nb}/placements", data={"skill_id": sid, "position": 10_000}, headers=HX)
    assert resp.status_code == 422 and "past the end of the document" in resp.json()["detail"]
    draft = session()
    d = Skill(name="draft", text="x", model="smollm2-135m", status="draft")
    draft.add(d)
    draft.commit()
    resp = client.post(f"/notebooks/{nb}/placements", data={"skill_id": d.id, "position": ""}, headers=HX)
    assert resp.status_code == 422 and "not compiled" in resp.json()["detail"]
    client.post(f"/notebooks/{nb}/placements/{pid}/delete", headers=HX)
    assert session().get(Notebook, nb).placements == []


def test_run_is_queued_and_polling_stops_when_it_ends(client) -> None:
    nb = new_notebook(client)
    add_field(client, nb)
    resp = client.post(
        f"/notebooks/{nb}/runs",
        data={"question": "What is the status?", "choices": "active\nsuspended",
              "strategies": ["recompute", "stale", "field_erratum"]},
        headers=HX,
    )
    assert resp.status_code == 200, resp.text
    run = session().query(Run).one()
    assert run.strategies == ["recompute", "stale", "field_erratum"] and run.status == "queued"
    assert run.snapshot.question.choices == ["active", "suspended"]
    assert 'hx-trigger="every 1s"' in resp.text  # the progress fragment, swapped out of band
    live = client.get(f"/runs/{run.id}/progress", headers=HX)
    assert live.status_code == 200 and 'hx-trigger="every 1s"' in live.text
    s = session()
    r = s.get(Run, run.id)
    r.status, r.stage, r.progress = "running", "prefill", 0.4
    r.started_at = r.heartbeat_at = utcnow()  # as a live worker does (else the watchdog reaps it)
    s.commit()
    live = client.get(f"/runs/{run.id}/progress", headers=HX)
    assert 'aria-valuenow="40"' in live.text and "prefill" in live.text and "every 1s" in live.text
    r.status, r.stage, r.error = "failed", "readout", "engine said: out of memory"
    s.commit()
    done = client.get(f"/runs/{run.id}/progress", headers=HX)
    assert done.status_code == 286  # htmx stops polling
    assert "hx-trigger" not in done.text and "engine said: out of memory" in done.text
    compact = client.get(f"/runs/{run.id}/progress?compact=1", headers=HX)
    assert compact.status_code == 200 and "hx-trigger" not in compact.text
    assert '<div id="runs-table" hx-swap-oob="true">' in compact.text  # the notebook's runs table refreshes


def test_run_form_errors_and_cancel(client, make_client) -> None:
    nb = new_notebook(client)
    resp = client.post(f"/notebooks/{nb}/runs", data={"question": "", "choices": "a"}, headers=HX)
    assert resp.status_code == 422 and 'id="err-question"' in resp.text and ">a</textarea>" in resp.text
    resp = client.post(f"/notebooks/{nb}/runs",
                       data={"question": "q?", "strategies": ["recompute", "telepathy"]}, headers=HX)
    assert resp.status_code == 422 and "unknown strategy &#39;telepathy&#39;" in resp.text
    client.post(f"/notebooks/{nb}/runs", data={"question": "q?", "strategies": ["recompute"]}, headers=HX)
    run = session().query(Run).one()
    resp = client.post(f"/runs/{run.id}/cancel", headers=HX)
    assert "cancelled" in resp.text and "hx-trigger" not in resp.text
    assert session().get(Run, run.id).status == "cancelled"


def test_unreachable_broker_shows_the_reason_and_keeps_the_question(make_client) -> None:
    client = make_client(broker_url="redis://127.0.0.1:1/0")
    nb = new_notebook(client)
    resp = client.post(f"/notebooks/{nb}/runs",
                       data={"question": "Still here?", "strategies": ["recompute"]}, headers=HX)
    assert resp.status_code == 503
    assert "could not be queued" in resp.text and "Still here?" in resp.text
    assert session().query(Run).count() == 0




def test_finished_run_page_decision_table_answers_and_heatmap(client) -> None:
    nb, notebook, run = finished(client)
    page = client.get(f"/runs/{run.id}")
    assert page.status_code == 200
    html = page.text
    assert "1 of 2</strong> strategies follow the edit, as recompute does" in html
    assert html.count('class="disagrees"') == 1  # stale decides differently
    assert "188.0×" in html  # on time to first token: 470 ms / 2.5 ms (not latency's 160×)
    assert "Time to first token</th>" in html and "What each column measures" in html
    assert "the speed-up is recompute's time to first token divided by this one" in html  # the legend says so
    # the note is computed from this run: stale keeps the old choice, so the edit moved recompute's
    assert "The edit moved recompute&#39;s choice from “active” (stale notes) to “suspended”" in html
    assert "Follows the edit: field_erratum · keeps the old value: stale." in html
    assert '<option value="stale" selected>' in html  # the heatmap opens on the strategy that differs
    assert 'id="attention"' in html and 'data-layers="4" data-heads="6"' in html
    assert 'hx-trigger="every' not in html  # a finished run does not poll
    heads = client.get(f"/runs/{run.id}/attention/heads", params={"strategy": "field_erratum"}).json()
    assert heads["shape"][:2] == [4, 6] and len(heads["head_diff"]) == 4
    assert heads["map"].count(-1) == 2  # the two erratum tokens have no counterpart in recompute
    assert all(0.0 <= v <= 1.0 for row in heads["head_diff"] for v in row)
    # the notebook hovers the stale strategy's tokens (they index the document as it is)
    tokens = client.get(f"/notebooks/{nb}/tokens.json").json()
    assert tokens["run_id"] == run.id and tokens["tokens"][0] == {
        "i": 3, "id": 103, "text": "Account", "start": 0, "end": 7}


def test_notes_map_is_drawn_over_the_document_with_the_fields_share(client) -> None:
    nb, notebook, run = finished(client, notes_map=True)
    html = client.get(f"/runs/{run.id}").text
    assert "Refreshing the status field&#39;s own notes closed <strong>94%</strong>" in html  # named
    assert "the opposite of the paper's large models" in html
    spans = run.attribution.spans
    assert html.count('class="map-span pos"') == sum(1 for sp in spans if sp.share >= 0)
    assert html.count('class="map-span neg"') == sum(1 for sp in spans if sp.share < 0) > 0
    assert 'data-share="0.2800"' in html  # the first span's share, drawn over its text
    api = client.get(f"/api/runs/{run.id}").json()["attribution"]
    assert api["field_share"] == 0.94 and api["spans"][0]["start_char"] == notebook.fields[0].start


def test_attention_from_any_question_or_answer_token(client) -> None:
    nb, notebook, run = finished(client)
    url = f"/api/runs/{run.id}/attention"
    decision = client.get(url, params={"strategy": "stale"}).json()
    n = decision["shape"][2]
    assert decision["query"] == decision["decision"] == n - 2  # the last question token; the answer follows
    assert decision["tokens"][decision["query_start"]]["segment"] == "question"
    answer = client.get(url, params={"strategy": "stale", "query": n - 1}).json()
    assert answer["query"] == n - 1 and answer["layer"] is None and answer["agg"] == "mean"
    assert abs(sum(answer["values"]) - 1) < 1e-2 and answer["values"] != decision["values"]
    early = client.get(url, params={"strategy": "stale", "query": decision["query_start"]}).json()
    assert all(v == 0 for v in early["values"][decision["query_start"] + 1 :])  # causal: nothing after itself
    bad = client.get(url, params={"strategy": "stale", "query": 2})
    assert bad.status_code == 422 and "is not a question or answer token" in bad.text
    per_head = client.get(url, params={"strategy": "stale", "query": n - 1, "layer": 0})
    assert per_head.status_code == 422 and "kept for the decision only" in per_head.text


def test_word_diff_of_answers() -> None:
    from app.web.runs.view import word_diff

    assert word_diff("The status is active.", "The status is suspended.") == [
        ("equal", "The status is "), ("delete", "active."), ("insert", "suspended."),
    ]


def test_skills_library(client) -> None:
    assert "No skills yet" in client.get("/skills").text
    resp = client.post("/skills", data={"name": "", "text": "Answer briefly.", "model": "smollm2-135m"})
    assert resp.status_code == 422 and 'id="err-name"' in resp.text and "Answer briefly." in resp.text
    resp = client.post("/skills", data={"name": "brief", "text": "Answer briefly.", "model": "smollm2-135m",
                                        "compile": "1"}, follow_redirects=False)
    assert resp.status_code == 303
    skill = session().query(Skill).one()
    assert skill.status == "compiling" and skill.task_id
    row = client.get(f"/skills/{skill.id}/row").text
    assert 'hx-trigger="every 1s"' in row
    s = session()
    k = s.get(Skill, skill.id)
    k.status, k.token_count, k.compile_ms = "compiled", 5, 61.0
    s.commit()
    row = client.get(f"/skills/{skill.id}/row").text
    assert "hx-trigger" not in row and "5 tokens" in row and "61 ms" in row


def test_examples_load_with_fields_question_and_skills(client) -> None:
    from app.web.notebooks.examples import list_examples

    examples = list_examples()
    assert len(examples) >= 2
    for ex in examples:
        resp = client.post(f"/examples/{ex.slug}", follow_redirects=False)
        assert resp.status_code == 303, resp.text
        nb = session().get(Notebook, int(resp.headers["location"].rsplit("/", 1)[1]))
        assert nb.fields and nb.question is not None
        assert client.get(f"/notebooks/{nb.id}").status_code == 200
    assert client.post("/examples/nope").status_code == 422


def test_components_gallery_and_runs_list(client) -> None:
    assert client.get("/_components").status_code == 200
    assert client.get("/runs").status_code == 200
    assert client.get("/notebooks/999").status_code == 404


def test_textarea_crlf_is_stored_as_lf_so_offsets_match_the_page(client) -> None:
    nb = new_notebook(client, text="one\r\n\r\ntwo: active")
    assert session().get(Notebook, nb).document == "one\n\ntwo: active"


def test_counts_are_singular_for_one(client) -> None:
    """One field, one token: never "1 fields" on the first page, a card or a skill row."""
    from app.web.templating import count

    assert [count(1, "field"), count(2, "field"), count(0, "erratum", "errata")] == \
        ["1 field", "2 fields", "0 errata"]
    nb = new_notebook(client)
    assert add_field(client, nb).status_code == 200
    home = client.get("/").text
    assert "1 field<" in home and "0 skills" in home
    assert not re.search(r"\b1 (fields|skills|tokens|runs)\b", home)
    s = session()
    s.add(Skill(name="one", text="Hi", model="smollm2-135m", status="compiled", token_count=1,
                compile_ms=3.0))
    s.commit()
    skills = client.get("/skills").text
    assert "1 token<" in skills and "1 tokens" not in skills


def test_first_page_gives_each_example_one_sentence_and_its_numbers_behind_details(client) -> None:
    from app.web.notebooks.examples import list_examples

    page = client.get("/").text
    examples = list_examples()
    assert len(examples) >= 3 and all(ex.summary for ex in examples)
    for ex in examples:
        assert not re.search(r"\d", ex.summary), ex.summary  # the plain sentence carries no numbers
        assert f'<p class="example-summary">{ex.summary}' in page.replace("&#39;", "'")
    assert page.count('<details class="example-details">') == len(examples)
    assert 'class="narrow-only">below<' in page and 'class="wide-only">on the right<' in page


CHOICES_EXAMPLE = 'placeholder="e.g. “yes” and “no”, one per line (type your choices)"'


def test_run_form_placeholders_read_as_examples_and_choices_stay_put_as_fields_are_made(client) -> None:
    nb = new_notebook(client)
    before = client.get(f"/notebooks/{nb}").text  # no field yet
    add_field(client, nb)  # status: active → suspended
    page = client.get(f"/notebooks/{nb}").text
    assert 'placeholder="e.g. What is the status? (type your question)"' in page
    assert CHOICES_EXAMPLE in before and CHOICES_EXAMPLE in page  # the same before and after the field
    other = new_notebook(client, text="Shipment to Oslo by NordFreight.", title="Shipment")
    at = "Shipment to Oslo by NordFreight.".index("Oslo")
    field = {"start": at, "end": at + 4, "selected": "Oslo", "new_value": "Madrid", "label": "destination"}
    client.post(f"/notebooks/{other}/fields", data=field, headers=HX)
    page = client.get(f"/notebooks/{other}").text
    assert 'placeholder="e.g. What is the destination? (type your question)"' in page
    assert CHOICES_EXAMPLE in page
    assert "active&#10;suspended" not in page and "Oslo&#10;Madrid" not in page
