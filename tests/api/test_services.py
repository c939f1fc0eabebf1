"""Only services commit (`app.services.unit`): no route or page of `app/api` or `app/web` calls
`.commit()`, an action commits what it did, nested actions commit once when the outermost ends, and
an error anywhere inside rolls all of it back."""

from __future__ import annotations

import ast
from pathlib import Path

import pytest

from tests.api.conftest import DOC

ROOT = Path(__file__).resolve().parents[2]


def test_no_route_or_page_commits() -> None:
    found = []
    for path in sorted([*(ROOT / "app" / "api").rglob("*.py"), *(ROOT / "app" / "web").rglob("*.py")]):
        for node in ast.walk(ast.parse(path.read_text())):
            if (isinstance(node, ast.Call) and isinstance(node.func, ast.Attribute)
                    and node.func.attr == "commit"):
                found.append(f"{path.relative_to(ROOT)}:{node.lineno}")
    assert found == []


def test_an_action_commits_and_nested_actions_commit_once_or_not_at_all(make_client) -> None:
    make_client()
    from app.services import notebooks as actions
    from app.services.errors import Unprocessable
    from app.services.unit import saving
    from data.db import get_sessionmaker
    from data.models import Field, Notebook

    maker = get_sessionmaker()
    with maker() as session:
        notebook = actions.create_notebook(session, "one", "smollm2-135m", DOC)
        ident = notebook.id
    with maker() as other:  # a new session sees it: it was committed
        assert other.get(Notebook, ident).title == "one"

    with maker() as session, pytest.raises(Unprocessable):
        with saving(session):
            notebook = session.get(Notebook, ident)
            actions.add_field(session, notebook, 0, 8, "Client", "kind")  # an action, nested: not yet saved
            with maker() as other:
                assert other.query(Field).count() == 0
            actions.add_field(session, notebook, 4, 12, "x", "overlapping")  # refused: all of it goes
    with maker() as other:
        assert other.query(Field).count() == 0
        assert other.get(Notebook, ident).errata == []

    with maker() as session:
        with saving(session):
            notebook = session.get(Notebook, ident)
            actions.add_field(session, notebook, 0, 8, "Client", "kind")
            actions.rename_notebook(notebook, "two")
    with maker() as other:
        assert [f.new_value for f in other.query(Field)] == ["Client"]
        assert other.get(Notebook, ident).title == "two"
        assert len(other.get(Notebook, ident).errata) == 1


def test_an_action_keeps_what_it_did_before_a_refusal_it_keeps(make_client) -> None:
    """`saving(session, keeps=(Refusal,))`: a kept refusal commits what the block did, then
    propagates; any other exception still rolls all of it back."""
    make_client()
    from app.services import notebooks as actions
    from app.services.errors import Unprocessable
    from app.services.unit import saving
    from data.db import get_sessionmaker
    from data.models import Notebook

    class Refused(Exception):
        pass

    maker = get_sessionmaker()
    with maker() as session, pytest.raises(Refused):
        with saving(session, keeps=(Refused,)):
            actions.create_notebook(session, "kept", "smollm2-135m", DOC)
            raise Refused
    with maker() as session, pytest.raises(Unprocessable):
        with saving(session, keeps=(Refused,)):
            actions.create_notebook(session, "gone", "smollm2-135m", DOC)
            raise Unprocessable("title", "refused, not kept")
    with maker() as other:
        assert [n.title for n in other.query(Notebook)] == ["kept"]
