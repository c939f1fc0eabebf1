"""Bad input and too much work answer 4xx, never 500: ids past 2^63 are 404, a lone surrogate is a
422 naming the field, a 422 quotes only a short prefix of what was sent, huge bodies are 413,
blank texts are refused like the forms refuse them, timestamps carry their timezone, and the run
caps answer 429 with nothing saved."""

from __future__ import annotations

import json
import re
from pathlib import Path

from tests.api.conftest import _broker_messages, _notebook

BIG = 2**63


def test_ids_past_the_database_integers_are_404(make_client) -> None:
    client = make_client()
    nb = _notebook(client)["id"]
    for path in (f"/api/notebooks/{BIG}", f"/api/runs/{BIG}", f"/api/fields/{BIG * 10}",
                 f"/api/skills/{-BIG - 1}",
                 f"/notebooks/{BIG}", f"/runs/{BIG}", f"/runs/{BIG}/progress", f"/api/runs/{BIG}/attention"):
        assert client.get(path).status_code == 404, path
    assert client.delete(f"/api/errata/{BIG}").status_code == 404
    assert client.post(f"/notebooks/{nb}/fields/{BIG}/delete").status_code == 404
    r = client.post(f"/api/notebooks/{nb}/placements", json={"skill_id": BIG})
    assert r.status_code == 422 and r.json()["detail"][0]["loc"] == ["body", "skill_id"]


def test_a_lone_surrogate_is_a_422_naming_the_field(make_client) -> None:
    client = make_client()
    raw = '{"title": "ok", "text": "bad \\ud800 text"}'
    r = client.post("/api/notebooks", content=raw, headers={"Content-Type": "application/json"})
    assert r.status_code == 422
    assert r.json()["detail"][0]["loc"] == ["body", "text"] and "unicode" in r.json()["detail"][0]["msg"]
    nb = _notebook(client)["id"]
    for path, body in ((f"/api/notebooks/{nb}/runs", '{"question": "ok?", "choices": ["a", "\\udc00"]}'),
                       (f"/api/notebooks/{nb}/errata", '{"text": "\\ud800' + "x" * 6000 + '"}'),
                       ("/api/skills", '{"name": "\\udfff", "text": "t"}')):
        r = client.post(path, content=body, headers={"Content-Type": "application/json"})
        assert r.status_code == 422, (path, r.text)
        json.loads(r.content.decode("utf-8"))  # valid UTF-8 JSON, whatever was sent


def test_a_422_quotes_a_short_prefix_and_huge_bodies_are_413(make_client) -> None:
    client = make_client()
    nb = _notebook(client)["id"]
    r = client.put(f"/api/notebooks/{nb}/question", json={"text": "q" * 1_000_000})
    assert r.status_code == 422 and len(r.content) < 1000 and "2000" in r.text
    r = client.post("/api/notebooks", json={"title": "t", "text": "a" * 10_000_000})
    assert r.status_code == 413 and len(r.content) < 200


def test_the_api_refuses_what_the_forms_refuse(make_client) -> None:
    client = make_client()
    for body, field in (({"title": "t", "text": "  \n "}, "text"), ({"title": "t", "text": ""}, "text"),
                        ({"title": "   ", "text": "doc"}, "title")):
        r = client.post("/api/notebooks", json=body)
        assert r.status_code == 422 and r.json()["detail"][0]["loc"] == ["body", field], body
    nb = _notebook(client)["id"]
    r = client.post(f"/api/notebooks/{nb}/fields", json={"start": 0, "end": 3, "new_value": "  "})
    assert r.status_code == 422 and r.json()["detail"][0]["loc"] == ["body", "new_value"]
    assert client.post(f"/api/notebooks/{nb}/errata", json={"text": " \n"}).status_code == 422
    assert client.put(f"/api/notebooks/{nb}/question", json={"text": "  "}).status_code == 422
    assert client.post("/api/skills", json={"name": " ", "text": "t"}).status_code == 422


def test_timestamps_carry_their_timezone_on_every_read(make_client) -> None:
    client = make_client()
    created = _notebook(client)
    nb = created["id"]
    run = client.post(f"/api/notebooks/{nb}/runs", json={"question": "Log in?"}).json()
    for stamp in (created["created_at"], client.get(f"/api/notebooks/{nb}").json()["created_at"],
                  client.get("/api/notebooks").json()[0]["updated_at"],
                  client.get(f"/api/runs/{run['id']}").json()["created_at"],
                  client.get(f"/api/notebooks/{nb}/runs").json()[0]["created_at"]):
        assert stamp.endswith("Z"), stamp


def test_run_caps_answer_429_and_save_nothing(make_client, tmp_path: Path) -> None:
    client = make_client(KVNOTES_MAX_ACTIVE_RUNS_PER_USER="2", KVNOTES_MAX_ACTIVE_RUNS="3")
    nb = _notebook(client)["id"]
    for _ in range(2):
        assert client.post(f"/api/notebooks/{nb}/runs", json={"question": "Log in?"}).status_code == 201
    r = client.post(f"/api/notebooks/{nb}/runs", json={"question": "Other?"})
    assert r.status_code == 429 and "KVNOTES_MAX_ACTIVE_RUNS_PER_USER" in r.json()["detail"]
    assert r.headers["retry-after"] == "30"
    assert len(_broker_messages(tmp_path)) == 2
    assert client.get(f"/api/notebooks/{nb}").json()["question"]["text"] == "Log in?"  # not "Other?"
    page = client.post(f"/notebooks/{nb}/runs", data={"question": "Log in?", "strategies": ["recompute"]},
                       headers={"HX-Request": "true"})
    assert page.status_code == 429 and "KVNOTES_MAX_ACTIVE_RUNS_PER_USER" in page.text
    first = client.get(f"/api/notebooks/{nb}/runs").json()[-1]["id"]
    client.post(f"/api/runs/{first}/cancel")  # a finished run frees its place
    assert client.post(f"/api/notebooks/{nb}/runs", json={"question": "Log in?"}).status_code == 201
    # the global cap counts everyone's runs
    from data.db import get_sessionmaker
    from data.models import Run

    with get_sessionmaker()() as session:
        for run in session.query(Run).filter(Run.status == "queued"):
            run.created_by = "someone-else"  # 2 of theirs, 0 of ours
        session.commit()
    r = client.post(f"/api/notebooks/{nb}/runs", json={"question": "Log in?"})
    assert r.status_code == 201  # 3 in all
    r = client.post(f"/api/notebooks/{nb}/runs", json={"question": "Log in?"})
    assert r.status_code == 429 and "KVNOTES_MAX_ACTIVE_RUNS)" in r.json()["detail"]


def test_run_caps_on_postgresql(make_client, postgres_url: str) -> None:
    """The same cap with PostgreSQL's advisory lock serializing run creation."""
    client = make_client(DATABASE_URL=postgres_url, KVNOTES_MAX_ACTIVE_RUNS_PER_USER="2")
    nb = _notebook(client)["id"]
    codes = [client.post(f"/api/notebooks/{nb}/runs", json={"question": "Log in?"}).status_code
             for _ in range(3)]
    assert codes == [201, 201, 429]
    from data.db import reset_engines

    reset_engines()  # let the scratch database be dropped


def test_a_chunked_body_past_the_limit_is_413_and_bytes_that_are_not_utf8_are_422(make_client) -> None:
    client = make_client()

    def chunks():  # 30 MB with no Content-Length (chunked transfer)
        for _ in range(30):
            yield b"x" * (1 << 20)

    r = client.post("/api/notebooks", content=chunks(), headers={"Content-Type": "application/json"})
    assert r.status_code == 413 and "larger than" in r.json()["detail"]
    small = client.post("/api/notebooks", content=iter([b'{"title": "t", ', b'"text": "doc"}']),
                        headers={"Content-Type": "application/json"})
    assert small.status_code == 201  # a chunked body under the limit still arrives whole
    r = client.post("/api/notebooks", content=b'{"title": "t", "text": "caf\xe9 \xff"}',
                    headers={"Content-Type": "application/json"})
    assert r.status_code == 422
    assert r.json()["detail"][0]["msg"] == "the body is not valid UTF-8 (at byte offset 27)"


def test_the_api_refuses_nul_and_invisible_titles_like_the_forms(make_client) -> None:
    client = make_client()
    for body, field in (({"title": "t", "text": "a\x00b"}, "text"),
                        ({"title": "\u200b", "text": "doc"}, "title"),
                        ({"title": "\u200b \ufeff\u2060", "text": "doc"}, "title"),
                        ({"title": "a\x00", "text": "d"}, "title")):
        r = client.post("/api/notebooks", json=body)
        assert r.status_code == 422 and r.json()["detail"][0]["loc"] == ["body", field], body
    nb = _notebook(client)["id"]
    r = client.post(f"/api/notebooks/{nb}/errata", json={"text": "fix\x00"})
    assert r.status_code == 422 and "NUL" in r.json()["detail"][0]["msg"]
    r = client.post("/api/skills", json={"name": "s", "text": "Be brief.\x00"})
    assert r.status_code == 422 and r.json()["detail"][0]["loc"] == ["body", "text"]
    page = client.post("/notebooks", data={"title": "\u200b", "model": "smollm2-135m", "text": "doc"})
    assert page.status_code == 422 and "cannot be blank" in page.text  # the form says the same


# characters that show nothing though they are not whitespace or format characters: the combining
# grapheme joiner, variation selectors, Hangul fillers, the blank Braille pattern, a lone accent
BLANKS = ["\u034f", "\ufe0f", "\U000e0100", "\u115f", "\u1160", "\u3164", "\uffa0", "\u2800", "\u0300",
          "\u3164 \u2800\u200b\ufe0f"]


def test_titles_of_characters_that_show_nothing_are_blank(make_client) -> None:
    client = make_client()
    pattern = re.compile(client.get("/openapi.json").json()["components"]["schemas"]["NotebookCreate"]
                         ["properties"]["title"]["pattern"])
    for title in BLANKS:
        r = client.post("/api/notebooks", json={"title": title, "text": "doc"})
        assert r.status_code == 422 and r.json()["detail"][0]["loc"] == ["body", "title"], repr(title)
        assert "cannot be blank" in r.text and not pattern.match(title), repr(title)
    for title in ("e\u0301", "\u3164a", "\U0001f600", "\u65e5"):  # with something that shows: kept
        r = client.post("/api/notebooks", json={"title": title, "text": "doc"})
        assert r.status_code == 201 and r.json()["title"] == title and pattern.match(title), repr(title)


def test_limits_are_read_when_a_request_comes_not_at_import(make_client) -> None:
    import os

    from data.settings import get_settings

    client = make_client()
    assert client.post("/api/notebooks", json={"title": "t" * 150, "text": "doc"}).status_code == 201
    os.environ["KVNOTES_MAX_TITLE_CHARS"] = "100"  # undone with the rest of the test's environment
    get_settings.cache_clear()
    r = client.post("/api/notebooks", json={"title": "t" * 150, "text": "doc"})
    assert r.status_code == 422 and "at most 100 characters (KVNOTES_MAX_TITLE_CHARS); got 150" in r.text


def test_the_openapi_schema_says_what_the_app_answers(make_client) -> None:
    client = make_client(KVNOTES_MAX_TITLE_CHARS="50", KVNOTES_MODELS="smollm2-135m")
    nb = _notebook(client)["id"]
    r = client.put(f"/api/notebooks/{nb}")  # 405: every method of the path, not only the first route's
    assert r.status_code == 405 and r.headers["allow"] == "DELETE, GET, PATCH"
    assert client.request("OPTIONS", "/api/skills").headers["allow"] == "GET, POST"
    r = client.post(f"/api/notebooks/{nb}/placements", json={"skill_id": 12345})
    assert r.status_code == 422 and r.json()["detail"][0]["loc"] == ["body", "skill_id"]  # not 404: nb exists
    schema = client.get("/openapi.json").json()["components"]["schemas"]
    title = schema["NotebookCreate"]["properties"]["title"]
    assert title["maxLength"] == 50
    matches = [bool(re.match(title["pattern"], t)) for t in ("ok", "\u200b", " \n", "o\x00k")]
    assert matches == [True, False, False, False]
    assert schema["NotebookCreate"]["properties"]["model"]["enum"] == ["smollm2-135m"]
    assert schema["ErrataOrder"]["properties"]["ids"]["items"]["maximum"] == 2**53 - 1  # exact in a double


def test_page_routes_that_answer_json_refuse_in_json(make_client) -> None:
    """The run page's painted views answer JSON, so their 404 and 422 are JSON too (were HTML pages);
    the run page itself keeps its HTML error page."""
    client = make_client()
    for path, status in (("/runs/999/attention/paint", 404), ("/runs/999/attention/heads", 422),
                         ("/runs/999/attention/heads?strategy=recompute", 404)):
        r = client.get(path)
        assert r.status_code == status and r.headers["content-type"] == "application/json", (path, r.text)
        assert r.json()["detail"], path
    page = client.get("/runs/999")
    assert page.status_code == 404 and page.headers["content-type"].startswith("text/html")
