"""Every form of the pages is under the text rules JSON bodies are under (issue 41): a crawl of
every POST route the pages have (enumerated from the app's routes, so a new form is crawled too)
posts bad text into each of its fields, urlencoded and multipart, and then reads every text cell
of the database.

- Bytes that are not UTF-8 (`%ED%A0%80`, a lone surrogate's UTF-8 form) in any field are a 422
  naming the field, and nothing changes (`app.api.form_bytes`): before, urlencoded forms saved
  "\\ufffd\\ufffd\\ufffd" and multipart ones Latin-1 "í\\xa0\\x80".
- A NUL, or text of zero-width characters only, in any field saves no row holding it (the handlers
  validate with the API's types), and no post is a 5xx.
- The trajectory editor's JSONL import, and the plain form's `turns`, with `{"append": "\\ud800"}`
  are a 422 naming the line (they were 500s while rendering); a CSV cell of 1 MB is a 422 naming
  the cap of a value (it was `_csv.Error: field larger than field limit`, a 500).
"""

from __future__ import annotations

import inspect
import itertools
import json
import re
from urllib.parse import urlencode

from sqlalchemy import text as sql

from tests.web.conftest import DOC, HX, add_field, new_notebook, session
from vocabulary.text_rules import visible

NOT_UTF8 = b"\xed\xa0\x80"  # U+D800 as UTF-8 would spell it: no UTF-8 decoder accepts it
BAD_TEXTS = {"a NUL": b"bad\x00text", "zero-width only": "\u200b\u200b".encode(), "not UTF-8": NOT_UTF8}
BOUNDARY = "kvnotes-form-boundary"
# handlers that read `request.form()` themselves: the fields their forms post (checked to be complete
# by `test_every_raw_form_is_listed`)
RAW_FORMS = {
    "/notebooks/{notebook_id}/sweeps": ["question", "choices", "strategies", "threshold", "values_0"],
    "/notebooks/{notebook_id}/trajectory/turns": ["op", "turn_count", "turns.0.append",
                                                  "turns.0.fields.status", "turns.0.question",
                                                  "turns.0.choices", "import_text"],
    "/notebooks/{notebook_id}/trajectories": ["question", "choices", "strategies", "turns"],
    "/sweeps/{sweep_id}/adopt": ["threshold", "per_field"],
}


def _routes(app) -> list:
    """Every page route that takes a POST (the JSON API takes JSON: tests/api/test_text_rules.py)."""
    from app.web.router import router

    def walk(routes):
        for route in routes:
            if hasattr(route, "original_router"):  # an included router
                yield from walk(route.original_router.routes)
            else:
                yield route
    return [r for r in walk(router.routes) if "POST" in (getattr(r, "methods", None) or ())]


def _fields(route) -> list[str]:
    return [f.alias for f in route.dependant.body_params] + RAW_FORMS.get(route.path, [])


def _multipart(pairs: list[tuple[str, bytes]]) -> tuple[bytes, str]:
    body = b"".join(f'--{BOUNDARY}\r\nContent-Disposition: form-data; name="{name}"\r\n\r\n'.encode()
                    + value + b"\r\n" for name, value in pairs) + f"--{BOUNDARY}--\r\n".encode()
    return body, f"multipart/form-data; boundary={BOUNDARY}"


def _post(client, path: str, pairs: list[tuple[str, bytes]], multipart: bool):
    body, kind = (_multipart(pairs) if multipart
                  else (urlencode(pairs).encode(), "application/x-www-form-urlencoded"))
    return client.post(path, content=body, headers={**HX, "Content-Type": kind})


def _bad_cells() -> list[str]:
    """Every text cell of the database (JSON columns' strings too) that breaks the text rules, or
    holds what a lenient decoder makes of bad bytes."""
    found: list[str] = []

    def check(where: str, value, blank_is_bad: bool) -> None:
        if isinstance(value, dict):
            for k, v in value.items():
                check(f"{where}.{k}", k, False)
                check(f"{where}.{k}", v, False)
        elif isinstance(value, list):
            for v in value:
                check(where, v, False)
        elif isinstance(value, str):
            if ("\x00" in value or "\ufffd" in value or "\u00ed\u00a0\u0080" in value
                    or (blank_is_bad and value and not visible(value))):
                found.append(f"{where}: {value[:40]!r}")

    with session() as s:
        tables = s.execute(sql("SELECT name FROM sqlite_master WHERE type='table'")).scalars().all()
        for table in tables:
            for row in s.execute(sql(f'SELECT * FROM "{table}"')).mappings():
                for column, value in row.items():
                    if isinstance(value, str) and value[:1] in "[{":
                        try:
                            check(f"{table}.{column}", json.loads(value), False)
                            continue
                        except ValueError:
                            pass
                    check(f"{table}.{column}", value, True)
    return found


def _row_counts() -> dict[str, int]:
    with session() as s:
        tables = s.execute(sql("SELECT name FROM sqlite_master WHERE type='table'")).scalars().all()
        return {t: s.execute(sql(f'SELECT count(*) FROM "{t}"')).scalar_one() for t in tables}


def _notebook_with_rows(client) -> dict[str, int]:
    """A notebook with a labelled field, an erratum and a skill: the ids the routes take (a skill is
    placed only once compiled: a placement's routes get an id that is none, and answer 404)."""
    nb = new_notebook(client)
    assert add_field(client, nb).status_code == 200
    client.post(f"/notebooks/{nb}/errata", data={"text": "[NOTE] by hand"}, headers=HX)
    client.post("/skills", data={"name": "tone", "text": "Answer briefly.", "model": "smollm2-135m"})
    from data.models import Erratum, Field, Skill

    with session() as s:
        skill = s.query(Skill).one()
        def last(model) -> int:
            return s.query(model).order_by(model.id.desc()).first().id
        return {"notebook_id": nb, "field_id": last(Field), "erratum_id": last(Erratum), "skill_id": skill.id}


def _path(route, ids: dict[str, int]) -> str:
    return re.sub(r"\{(\w+)\}", lambda m: str(ids.get(m.group(1), 1)), route.path).replace(
        "/examples/1", "/examples/access-policy")


def test_every_raw_form_is_listed() -> None:
    """A handler that reads `request.form()` itself declares (some of) its fields in its body: it must
    be in RAW_FORMS, so
    the crawl below posts to its fields (a new one fails here until it is listed)."""
    unlisted = [r.path for r in _routes(None)
                if "request.form()" in inspect.getsource(r.endpoint) and r.path not in RAW_FORMS]
    assert unlisted == []


def test_bytes_that_are_not_utf8_in_any_form_field_are_a_422_naming_it(make_client) -> None:
    client = make_client()
    ids = _notebook_with_rows(client)
    before, posted = _row_counts(), 0
    for route in _routes(client.app):
        for field in _fields(route):
            for multipart in (False, True):
                r = _post(client, _path(route, ids), [(field, b"ok" + NOT_UTF8)], multipart)
                named = field in r.text and "UTF-8" in r.text
                assert r.status_code == 422 and named, (route.path, field, r.text)
                posted += 1
    assert posted >= 80  # every field of every form, both encodings
    assert _row_counts() == before and _bad_cells() == []


def test_a_crawl_of_every_form_saves_no_bad_text(make_client) -> None:
    """Each field of each form, the others left as the crawl fills them (a valid value where the
    form has one), set to a NUL, to zero-width text or to bytes that are not UTF-8, urlencoded and
    multipart: no 5xx, and no cell of the database holds it (or what a lenient decoder makes of it)."""
    client = make_client()
    ids = _notebook_with_rows(client)
    fills = {"title": "T", "text": DOC, "model": "smollm2-135m", "new_value": "suspended", "label": "tier",
             "start": str(DOC.index("Dana")), "end": str(DOC.index("Dana") + 4), "selected": "Dana",
             "find": "Lee", "occurrence": "1", "question": "Can the user log in?", "choices": "yes, no",
             "strategies": "recompute", "name": "style", "values": "paused", "turns": '{"append": "Later."}',
             "turn_count": "1", "turns.0.append": "Later.", "op": "export", "values_0": "paused",
             "threshold": "0.9", "import_text": '{"append": "Later."}', "requests": "2"}
    statuses: list[int] = []
    for route in _routes(client.app):
        fields = _fields(route)
        for field in fields:
            for (what, bad), multipart in itertools.product(BAD_TEXTS.items(), (False, True)):
                pairs = [(f, bad if f == field else fills.get(f, "").encode()) for f in fields]
                r = _post(client, _path(route, ids), pairs, multipart)
                statuses.append(r.status_code)
                assert r.status_code < 500, (route.path, field, what, r.text[:300])
                assert _bad_cells() == [], (route.path, field, what, multipart)
    assert len(statuses) >= 300 and statuses.count(422) >= 150


def test_text_no_page_can_show_is_a_422_where_it_was_a_500(make_client) -> None:
    client = make_client()
    nb = new_notebook(client)
    assert add_field(client, nb).status_code == 200
    surrogate = '{"append": "\\ud800"}'
    r = client.post(f"/notebooks/{nb}/trajectory/turns", data={"op": "import", "import_text": surrogate},
                    headers=HX)
    assert r.status_code == 422 and "line 1: append is not valid Unicode" in r.text
    r = client.post(f"/notebooks/{nb}/trajectories", data={"turns": surrogate, "strategies": "recompute"},
                    headers=HX)
    assert r.status_code == 422 and "not valid Unicode" in r.text
    cell = "x" * 1_000_000  # 1 MB: within the upload limit (1 MiB), past the csv module's own
    r = client.post(f"/notebooks/{nb}/sweeps", data={"question": "Can the user log in?"}, headers=HX,
                    files={"upload": ("edits.csv", f"status\n{cell}\n".encode(), "text/csv")})
    assert r.status_code == 422 and "KVNOTES_MAX_VALUE_CHARS" in r.text
    assert _bad_cells() == []
