"""The trajectory's web side (issue 26 items 1 and 5):

- the notebook's Turns editor, through its form: add a turn, move one, delete one, import JSONL
  (pasted or a file) and show the JSONL Start sends; a bad import names the turn and keeps the rows;
  Start sends the rows as turns, and a bad turn is a 422 beside its row with nothing saved;
- the offline report of a trajectory run by the real `kvnotes.trajectory` task in this process (the
  engine on a tiny random model): one self-contained file (no script, nothing loaded from anywhere),
  each strategy's verdict, a row per turn and strategy, the three drawings; built once and served
  again from the render store with its ETag;
- a prompt past the model's context at some turn: a 422 naming the turn and the length, counted
  from the converted bundled model's files (its tokenizer.json and config.json), with nothing
  saved; the count is the one transformers makes with the worker's frame.
"""

from __future__ import annotations

import re
from pathlib import Path

import pytest
from sqlalchemy import func, select

from tests.api.conftest import DOC
from tests.conftest import REPO

HX = {"HX-Request": "true"}


def _count() -> int:
    from data.db import get_sessionmaker
    from data.trajectories import Trajectory

    with get_sessionmaker()() as s:
        return s.scalar(select(func.count(Trajectory.id)))


def _with_field(client, model: str = "smollm2-135m") -> int:
    r = client.post("/api/notebooks", json={"title": "agent", "model": model, "text": DOC})
    assert r.status_code == 201, r.text
    nb = r.json()["id"]
    start = DOC.index("active")
    r = client.post(f"/api/notebooks/{nb}/fields",
                    json={"start": start, "end": start + 6, "new_value": "banned", "label": "status"})
    assert r.status_code == 201, r.text
    return nb


def _appends(html: str) -> list[str]:
    """The editor's rows as drawn: each turn's appended text, in order."""
    return re.findall(r'name="turns\.\d+\.append" rows="3"[^>]*>\n([^<]*)</textarea>', html)


def _form(rows: list[dict], **extra) -> dict:
    data = {"turn_count": str(len(rows)), "question": "Can this customer log in?", "choices": "yes, no",
            "strategies": ["erratum"], **extra}
    for i, row in enumerate(rows):
        for key, value in row.items():
            data[f"turns.{i}.{key}"] = value
    return data


def test_the_turns_editor_adds_moves_deletes_imports_and_shows_jsonl(make_client) -> None:
    client = make_client()
    nb = _with_field(client)
    panel = client.get(f"/notebooks/{nb}/trajectory")
    assert panel.status_code == 200 and len(_appends(panel.text)) == 1  # one empty turn to start
    assert 'name="turns.0.fields.status"' in panel.text and "(before this turn “active”)" in panel.text
    edit = f"/notebooks/{nb}/trajectory/turns"
    rows = [{"append": "A"}, {"append": "B", "fields.status": "suspended"}]
    added = client.post(edit, data={**_form(rows), "op": "add"}, headers=HX)
    assert added.status_code == 200 and _appends(added.text) == ["A", "B", ""]
    # each turn's field label reads the value as that turn starts: turn 2 set it, turn 3 reads it
    assert added.text.count("(before this turn “active”)") == 2
    assert added.text.count("(before this turn “suspended”)") == 1
    assert re.search(r'name="turns\.2\.append"[^>]*autofocus', added.text)  # the new turn has the focus
    rows.append({"append": "C", "question": "Is the plan business?", "choices": "yes, no"})
    moved = client.post(edit, data={**_form(rows), "op": "up:2"}, headers=HX)
    assert _appends(moved.text) == ["A", "C", "B"]
    assert 'name="turns.2.fields.status" value="suspended"' in moved.text  # the field moved with its turn
    rows = [rows[0], rows[2], rows[1]]
    deleted = client.post(edit, data={**_form(rows), "op": "delete:0"}, headers=HX)
    assert _appends(deleted.text) == ["C", "B"] and "Turn 1 deleted." in deleted.text
    shown = client.post(edit, data={**_form(rows[1:]), "op": "export"}, headers=HX)
    jsonl = re.search(r'id="trajectory-jsonl"[^>]*>\n([^<]*)</textarea>', shown.text).group(1)
    assert jsonl.replace("&#34;", '"').splitlines() == [
        '{"append": "C", "question": "Is the plan business?", "choices": ["yes", "no"]}',
        '{"append": "B", "fields": {"status": "suspended"}}']
    pasted = '{"append": "x"}\n\n{"fields": {"status": "active"}}\n{"append": "y", "question": "Why?"}\n'
    imported = client.post(edit, data={**_form(rows), "op": "import", "import_text": pasted}, headers=HX)
    assert imported.status_code == 200 and _appends(imported.text) == ["x", "", "y"]
    assert "Imported 3 turns" in imported.text
    upload = {"import_file": ("turns.jsonl", b'{"append": "from a file"}\n', "text/plain")}
    as_file = client.post(edit, data={**_form(rows), "op": "import"}, headers=HX, files=upload)
    assert _appends(as_file.text) == ["from a file"]
    pasted = '{"append": "a"}\n{"append": "b"}\n{"fields": {"tier": "x"}}'
    bad = client.post(edit, data={**_form(rows), "op": "import", "import_text": pasted}, headers=HX)
    assert bad.status_code == 422
    assert "turn 3: field &#39;tier&#39; does not exist in this notebook (fields: status)" in bad.text
    assert _appends(bad.text) == ["A", "C", "B"]  # the rows as they were
    bad = client.post(edit, data={**_form(rows), "op": "import", "import_text": '{"append": 3}'}, headers=HX)
    assert bad.status_code == 422 and "import: line 1: append must be text" in bad.text
    # a browser posts a textarea's lines ended by CR LF; the text's own first newline is kept
    kept = client.post(edit, data={**_form([{"append": "\r\n[tool] one\r\ntwo"}]), "op": "add"}, headers=HX)
    assert _appends(kept.text) == ["\n[tool] one\ntwo", ""]
    assert _count() == 0  # editing saves nothing


def test_start_sends_the_rows_and_a_bad_turn_is_named_beside_its_row(make_client) -> None:
    client = make_client(KVNOTES_MAX_TURNS="3")
    nb = _with_field(client)
    start = f"/notebooks/{nb}/trajectories"
    cases = [
        ([{"append": "a"}, {"append": ""}, {"append": "c"}], "turn-2-error", "turn 2 is empty"),
        ([{"append": "a"}, {"append": "b", "fields.tier": "gold"}], "turn-2-error",
         "turn 2 changes a field &#39;tier&#39;"),
        ([{"append": "a" * 8001}], "turn-1-error",
         "turn 1: append: at most 8000 characters; got 8001"),
        ([{"append": "a"}] * 4, "role=\"alert\"", "4 turns, more than KVNOTES_MAX_TURNS (3)"),
    ]
    for rows, where, message in cases:
        r = client.post(start, data=_form(rows), headers=HX)
        assert r.status_code == 422, (message, r.status_code)
        assert where in r.text and message in r.text, message
        assert len(_appends(r.text)) == len(rows)  # the rows stay as written
    assert _count() == 0
    rows = [{"append": "\n[tool] 2 tickets open."}, {"fields.status": "suspended"},
            {"append": "\n[tool] 3 tickets open.", "question": "Is the plan business?", "choices": "yes, no"}]
    strategies = ["prefix_reuse", "erratum.one_per_field"]
    ok = client.post(start, data=_form(rows, strategies=strategies), headers=HX)
    assert ok.status_code == 204, ok.text
    t = client.get(f"/api{ok.headers['HX-Redirect']}").json()
    assert [dict((k, v) for k, v in turn.items() if v) for turn in t["spec"]["turns"]] == [
        {"append": "\n[tool] 2 tickets open."}, {"fields": {"status": "suspended"}},
        {"append": "\n[tool] 3 tickets open.", "question": "Is the plan business?", "choices": ["yes", "no"]}]
    assert t["strategies"] == ["recompute", "prefix_reuse", "erratum.one_per_field"] and _count() == 1


def test_a_turn_places_a_compiled_skill_chosen_in_its_row(make_client) -> None:
    from data.db import get_sessionmaker
    from data.models import Skill

    client = make_client()
    nb = _with_field(client)
    assert 'name="turns.0.skill"' not in client.get(f"/notebooks/{nb}/trajectory").text  # none compiled
    with get_sessionmaker()() as s:  # as a worker leaves a compiled skill
        s.add_all([Skill(name="terse", text="Answer in one word.", model="smollm2-135m", status="compiled",
                         token_count=6, compile_ms=12.0),
                   Skill(name="other model", text="x", model="gemma3-270m", status="compiled",
                         token_count=1)])
        s.commit()
    panel = client.get(f"/notebooks/{nb}/trajectory").text
    assert re.findall(r'<option value="([^"]*)"', panel) == ["", "terse"]  # the notebook's model's only
    rows = [{"append": "\n[tool] 2 tickets open."}, {"skill": "terse", "append": "\n[user] May I log in?"}]
    shown = client.post(f"/notebooks/{nb}/trajectory/turns", data={**_form(rows), "op": "export"}, headers=HX)
    jsonl = re.search(r'id="trajectory-jsonl"[^>]*>\n([^<]*)</textarea>', shown.text).group(1)
    second = jsonl.replace("&#34;", '"').splitlines()[1]
    assert second == '{"append": "\\n[user] May I log in?", "skill": "terse"}'
    assert re.search(r'<option value="terse" selected>', shown.text)
    ok = client.post(f"/notebooks/{nb}/trajectories", data=_form(rows), headers=HX)
    assert ok.status_code == 204, ok.text
    t = client.get(f"/api{ok.headers['HX-Redirect']}").json()
    assert [turn["skill"] for turn in t["spec"]["turns"]] == [None, "terse"]
    assert [s["name"] for s in t["spec"]["skills"]] == ["terse"]


STRATEGIES = ["prefix_reuse", "erratum", "erratum.one_per_field"]


def _finished_trajectory(client) -> dict:
    """A 4-turn trajectory on tiny-llama (status suspended at turn 2, active at turn 4), started
    through the API and run by the real task in this process; its API view."""
    from worker.trajectory_task import trajectory_task

    nb = _with_field(client, "tiny-llama")
    turns = [{"append": "\n[tool] lookup 1: 2 tickets open."}, {"fields": {"status": "suspended"}},
             {"append": "\n[tool] lookup 2: 3 tickets open."},
             {"append": "\n[tool] lookup 3: 1 ticket open.", "fields": {"status": "active"}}]
    r = client.post(f"/api/notebooks/{nb}/trajectories",
                    json={"turns": turns, "strategies": STRATEGIES, "question": "Can this customer log in?",
                          "choices": ["yes", "no"]})
    assert r.status_code == 201, r.text
    from data.db import get_sessionmaker
    from data.trajectories import Trajectory

    with get_sessionmaker()() as s:
        token = s.get(Trajectory, r.json()["id"]).task_id
    outcome = trajectory_task.apply(args=(r.json()["id"],), task_id=token).get()
    assert outcome["status"] == "succeeded", outcome
    return client.get(f"/api/trajectories/{r.json()['id']}").json()


def test_the_offline_report_is_one_self_contained_file(make_client,
        engines_without_store) -> None:
    client = make_client(KVNOTES_MODELS="smollm2-135m,tiny-llama")
    t = _finished_trajectory(client)
    keys = ["recompute", *STRATEGIES]
    assert t["status"] == "succeeded" and len(t["turns"]) == 4 and list(t["turns"][0]["results"]) == keys
    page = client.get(f"/trajectories/{t['id']}")
    assert f'href="/trajectories/{t["id"]}/report.html"' in page.text and page.text.count("<svg") == 3
    r = client.get(f"/trajectories/{t['id']}/report.html")
    assert r.status_code == 200 and r.headers["content-type"].startswith("text/html")
    assert r.headers["content-security-policy"].startswith("default-src 'none'")
    html = r.text
    # nothing it loads or links to: no script, no src/href naming a host or a path of the app
    assert "<script" not in html and "/static" not in html
    assert re.findall(r"""(?:src|href)\s*=\s*["']?\s*(?:https?:)?//""", html, flags=re.I) == []
    assert re.findall(r"""(?:src|href)\s*=\s*["']?\s*/""", html, flags=re.I) == []
    assert "<style>" in html and html.count("<svg") == 3
    for key, sentence in t["verdicts"].items():
        assert f"{sentence[:1].upper()}{sentence[1:]}." in html, key
    assert len(t["verdicts"]) == 3
    assert len(re.findall(r'<tr data-turn="\d+"', html)) == 4 * len(keys)  # a row per turn and strategy
    assert len(re.findall(r"<tr data-turn-head=", html)) == 4
    for turn in t["turns"]:
        for key, result in turn["results"].items():
            row = re.search(rf'<tr data-turn="{turn["index"] + 1}" data-strategy="{re.escape(key)}"[^>]*>'
                            r"<td>[^<]*</td><td>([^<]*)</td>", html)
            assert row and row.group(1) == result["decision"], (turn["index"], key)
    # built once: the second answer comes from the render store, and a matching ETag is a 304
    again = client.get(f"/trajectories/{t['id']}/report.html")
    assert again.headers["etag"] == r.headers["etag"] and again.content == r.content
    assert client.get(f"/trajectories/{t['id']}/report.html",
                      headers={"If-None-Match": r.headers["etag"]}).status_code == 304
    saved = client.get(f"/trajectories/{t['id']}/report.html?download=1")
    assert saved.headers["content-disposition"] == f'attachment; filename="trajectory-{t["id"]}-report.html"'


LONG = ("The customer wrote again about the invoice for March, asked whether the discount still "
        "applies after the plan change, and attached the logs of the last three sign-in attempts. ")


@pytest.mark.slow
def test_a_prompt_past_the_context_is_refused_naming_the_turn_and_its_length(make_client,
                                                                             tmp_path: Path) -> None:
    from transformers import AutoTokenizer

    from vocabulary import render_erratum
    from vocabulary.prompt import question_text
    from worker.engine.models import ensure_converted
    from worker.engine.readout import make_frame

    folder = ensure_converted("smollm2-135m", REPO / "var" / "test-data")  # the bundled model's files
    (tmp_path / "models").symlink_to(folder.parent)
    client = make_client()
    nb = _with_field(client)
    turns = [{"append": f"\n[tool] ticket {i}: " + (LONG * 60)[:7900]} for i in range(8)]
    turns[2]["fields"] = {"status": "suspended"}
    body = {"turns": turns, "strategies": ["erratum"], "question": "Can this customer log in?",
            "choices": ["yes", "no"]}
    # the worker's count, made here with transformers: the frame, the document as it then is, every
    # turn's text so far, every erratum so far and the question (without the worker's 8 of margin)
    tok = AutoTokenizer.from_pretrained(folder)
    frame = make_frame(tok)
    erratum = len(tok(render_erratum("status", "active", "suspended"), add_special_tokens=False)["input_ids"])
    question = len(tok(question_text("Can this customer log in?", ["yes", "no"]) + frame.tail,
                       add_special_tokens=False)["input_ids"])
    lengths = []
    for k in range(1, len(turns) + 1):
        document = DOC.replace("active", "suspended", 1) if k >= 3 else DOC
        text = frame.prefix + document + "".join(t["append"] for t in turns[:k])
        lengths.append(len(tok(text, add_special_tokens=False)["input_ids"]) + (erratum if k >= 3 else 0)
                       + question)
    first = next(k for k, n in enumerate(lengths, 1) if n > 8192)
    assert 3 <= first < len(turns), lengths
    print("prompt lengths per turn", lengths, "first past 8192:", first)
    r = client.post(f"/api/notebooks/{nb}/trajectories", json=body)
    assert r.status_code == 422, r.text
    detail = r.json()["detail"][0]
    assert detail["loc"][-1] == f"turns.{first - 1}"
    assert detail["msg"] == (f"turn {first}: the prompt would be {lengths[first - 1]} tokens (the document, "
                             "every turn's text so far, 1 erratum and the question), past smollm2-135m's "
                             "context of 8192 tokens"), detail
    assert _count() == 0  # nothing saved
    # the same through the Turns panel: beside the turn
    rows = [{"append": t["append"], **({"fields.status": "suspended"} if "fields" in t else {})}
            for t in turns]
    panel = client.post(f"/notebooks/{nb}/trajectories", data=_form(rows), headers=HX)
    assert panel.status_code == 422 and f'id="turn-{first}-error"' in panel.text
    assert f"the prompt would be {lengths[first - 1]} tokens" in panel.text and _count() == 0
    # the turns before it fit: accepted, and saved
    r = client.post(f"/api/notebooks/{nb}/trajectories", json={**body, "turns": turns[:first - 1]})
    assert r.status_code == 201, r.text
    assert _count() == 1
