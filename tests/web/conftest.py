"""What the page and browser tests share: their documents, where screenshots go, and the page
helpers (a notebook made through the form, a field, a database session).
"""

from __future__ import annotations

from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[2]
ARTIFACTS = REPO / "test-artifacts"
HX = {"HX-Request": "true"}

# the document the page tests edit (a field on "active")
DOC = "Account record\n\nstatus: active\nowner: Dana Lee\n\nOnly accounts whose status is active may log in."
# the browser tests' document: an injected script must stay text
BROWSER_DOC = (
    "Account record\n\nAccount holder: Dana Lee\nstatus: active\nPlan: business\n\n"
    "Access policy\n\nOnly accounts whose status is active may log in. <script>window.pwned = 1</script>"
)
LONG_DOC = "Account record\nstatus: active\n\n" + "".join(
    f"2026-03-{d:02d} 09:{d:02d} The operations desk logged routine entry number {d} without remarks.\n"
    for d in range(1, 29)
) + "\nOnly accounts whose status is active may log in.\n"


def session():
    from data.db import get_sessionmaker

    return get_sessionmaker()()


def new_notebook(client, text: str = DOC, title: str = "Policy") -> int:
    resp = client.post("/notebooks", data={"title": title, "model": "smollm2-135m", "text": text},
                       follow_redirects=False)
    assert resp.status_code == 303, resp.text
    return int(resp.headers["location"].rsplit("/", 1)[1])


def add_field(client, nb: int, find: str = "active", new: str = "suspended", label: str = "status"):
    start = DOC.index(find)
    return client.post(
        f"/notebooks/{nb}/fields",
        data={"start": start, "end": start + len(find), "selected": find, "new_value": new, "label": label},
        headers=HX,
    )


def long_record_run(s, strategies: tuple[str, ...], notes_map: bool = False):
    """In session `s`: a notebook on `LONG_DOC` with a field on "active" ("suspended") and a free
    question, and a finished run of `strategies` written as a worker writes one; the run."""
    from app.services.notebooks import add_field
    from data.models import Notebook, Question
    from tests.web.finished_run import finished_run

    nb = Notebook(title="Long record", model="smollm2-135m", document=LONG_DOC)
    s.add(nb)
    s.flush()
    at = LONG_DOC.index("active")
    add_field(s, nb, at, at + 6, "suspended", "status")
    nb.questions.append(Question(text="What is the status?", choices=[]))
    s.commit()
    return finished_run(s, nb, strategies=strategies, notes_map=notes_map)


def page_run(client, **kw):
    """A notebook (through the form) with a field and a choice question, and a finished run of it
    written as a worker writes one (`finished_run`'s keywords): (notebook id, notebook, run)."""
    from data.models import Notebook, Question
    from tests.web.finished_run import finished_run

    nb = new_notebook(client)
    add_field(client, nb)
    s = session()
    notebook = s.get(Notebook, nb)
    notebook.questions.append(Question(text="What is the status?", choices=["active", "suspended"]))
    s.commit()
    return nb, notebook, finished_run(s, notebook, **kw)


STRATEGIES = ("recompute", "prefix_reuse", "stale", "field_erratum")


def finished(client, doc: str = DOC, notes_map: bool = True, strategies=STRATEGIES, title: str = "Policy"):
    """A notebook with the status field, its question, and a finished run with attention:
    (notebook id, run id)."""
    from data.models import Notebook, Question
    from tests.web.finished_run import finished_run

    nb = new_notebook(client, text=doc, title=title)
    at = doc.index("active")
    client.post(f"/notebooks/{nb}/fields", data={"start": at, "end": at + 6, "selected": "active",
                                                "new_value": "suspended", "label": "status"},
                headers={"HX-Request": "true"})
    s = session()
    notebook = s.get(Notebook, nb)
    notebook.questions.append(Question(text="What is the status?", choices=["active", "suspended"]))
    s.commit()
    return nb, finished_run(s, notebook, strategies=strategies, notes_map=notes_map).id


# ---- Chromium (the run's one: `browser`, tests/conftest.py) ----------------------------------------


@pytest.fixture
def browser_page(browser):
    """A page at 1400×1000 in a context of its own in the run's Chromium (`browser`), and the page
    errors it collects. The CSP is bypassed: the tests' own `wait_for_function` strings need eval,
    which the app's CSP forbids (tests/web/test_security_browser.py drives the pages with the CSP in
    force)."""
    ARTIFACTS.mkdir(exist_ok=True)
    page = browser.new_context(viewport={"width": 1400, "height": 1000}, bypass_csp=True).new_page()
    errors: list[str] = []
    page.on("pageerror", lambda exc: errors.append(str(exc)))
    return page, errors
