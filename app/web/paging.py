"""Pagination for every list the pages show (notebooks, runs, a notebook's history, skills): one
`Page` (which slice, how many in all) and the `_pager.html` partial that links to its neighbours.
Pages count from 1; a page past the last shows the last (a list shrinks while someone reads it)."""

from __future__ import annotations

from dataclasses import dataclass
from urllib.parse import urlencode

from fastapi import Query
from sqlalchemy import Select, func, select
from sqlalchemy.orm import Session


def page_param():
    """A page-number query parameter (a fresh one per route: FastAPI binds it to its name)."""
    return Query(default=1, ge=1, le=10**9, description="page number, from 1")


@dataclass(frozen=True)
class Page:
    number: int
    size: int
    total: int
    path: str  # where the pager's links point
    param: str = "page"
    keep: tuple[tuple[str, str], ...] = ()  # other query parameters the links carry
    fragment: str = ""

    @property
    def pages(self) -> int:
        return max(1, -(-self.total // self.size))

    @property
    def offset(self) -> int:
        return (self.number - 1) * self.size

    @property
    def first_item(self) -> int:
        return min(self.total, self.offset + 1)

    @property
    def last_item(self) -> int:
        return min(self.total, self.offset + self.size)

    @property
    def has_prev(self) -> bool:
        return self.number > 1

    @property
    def has_next(self) -> bool:
        return self.number < self.pages

    def url(self, number: int) -> str:
        params = [*self.keep, *([(self.param, str(number))] if number > 1 else [])]
        query = ("?" + urlencode(params)) if params else ""
        return self.path + query + (f"#{self.fragment}" if self.fragment else "")


def paginate(session: Session, query: Select, number: int, size: int, path: str,
             **options) -> tuple[Page, list]:
    """The `number`-th page of `query` (ordered by the caller) and its rows (scalars when the query
    selects one entity or column, else rows); `number` past the end gives the last page."""
    total = session.scalar(select(func.count()).select_from(query.order_by(None).subquery())) or 0
    page = Page(number, size, total, path, **options)
    if number > page.pages:
        page = Page(page.pages, size, total, path, **options)
    result = session.execute(query.limit(size).offset(page.offset))
    rows = list(result.scalars()) if len(query.column_descriptions) == 1 else list(result)
    return page, rows
