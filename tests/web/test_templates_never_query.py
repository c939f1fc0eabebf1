"""Templates receive what their page built and never query: every page is rendered here with
`app.web.templating.templates_never_query` on, so a template that walks into a relationship or an
attribute that was not loaded fails with `TemplateQueried` instead of reaching the database."""

from __future__ import annotations

import pytest

from tests.web.conftest import finished, session

STEPS = (1, 2, 3, 4)  # the presentation's slides: edit, decisions, attention, notes


def test_every_page_renders_without_querying_from_a_template(make_client) -> None:
    from app.web.templating import templates_never_query

    client = make_client()
    nb, run = finished(client)
    other = finished(client, title="Second")[1]
    skill = client.post("/api/skills", json={"name": "house rule", "text": "Answer in one word.",
                                             "model": "smollm2-135m"}).json()["id"]
    pages = ["/", f"/notebooks/{nb}", f"/notebooks/{nb}?history=1", f"/notebooks/{nb}/delete", "/runs",
             f"/runs/{run}", f"/runs/{run}?strategy=stale&layer=1&head=2", f"/runs/{run}/progress",
             f"/runs/{run}/present", *(f"/runs/{run}/present/{step}" for step in STEPS),
             f"/runs/{run}/attention/top?strategy=stale", f"/runs/{run}/attention/heads?strategy=stale",
             f"/compare?runs={run},{other}", "/skills", f"/skills/{skill}/row", "/_components"]
    with templates_never_query():
        answers = {page: client.get(page) for page in pages}
    assert {page: r.status_code for page, r in answers.items()} == dict.fromkeys(pages, 200)
    assert all(len(r.text) > 200 for r in answers.values())


def test_a_template_that_would_query_fails(make_client) -> None:
    from starlette.requests import Request

    from app.web.templating import TemplateQueried, render, templates_never_query
    from data.models import Notebook

    client = make_client()
    nb = finished(client)[0]
    s = session()
    notebook = s.get(Notebook, nb)
    s.expire(notebook)  # its title is no longer loaded: the template would have to query for it
    request = Request({"type": "http", "method": "GET", "path": "/", "headers": [], "query_string": b""})
    with templates_never_query(), pytest.raises(TemplateQueried, match="confirm_delete.html"):
        render(request, "confirm_delete.html", notebook=notebook, run_count=1, nav="notebooks")
    assert "Policy" in render(request, "confirm_delete.html", notebook=notebook, run_count=1,
                              nav="notebooks").body.decode()  # without the guard it queries, and works
