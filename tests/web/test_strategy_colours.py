"""A strategy's colour is written once, in its descriptor: the server writes the stylesheet fragment
(`--s-{name}` and the chips' classes) from the descriptors, every page carries it, and the shared
stylesheet defines no strategy colour of its own."""

from __future__ import annotations

import re

from app.web.strategy_css import strategy_css
from app.web.templating import ROOT
from vocabulary import COMPOSE_INFO, EDIT_INFO, FLOOR, REFERENCE


def test_the_fragment_carries_every_descriptor_colour_and_its_chip_class() -> None:
    css = strategy_css()
    for infos in (EDIT_INFO, COMPOSE_INFO):
        for name, info in infos.items():
            assert re.fullmatch(r"#[0-9a-f]{6}", info.colour), name
            assert f"  --s-{name}: {info.colour};\n" in css
            assert f".strategy.{name}, .s-{name} {{ --c: var(--s-{name}); }}" in css
    shared = set(EDIT_INFO) & set(COMPOSE_INFO)
    assert shared == {"recompute", "selective", "prefix_reuse"}  # one colour each, both kinds
    assert all(EDIT_INFO[n].colour == COMPOSE_INFO[n].colour for n in shared)
    assert len(re.findall(r"^  --s-", css, re.M)) == len(set(EDIT_INFO) | set(COMPOSE_INFO)) == 12
    assert f"  --role-reference: var(--s-{REFERENCE});" in css and f"  --role-floor: var(--s-{FLOOR});" in css


def test_the_shared_stylesheet_defines_no_strategy_colour() -> None:
    sheet = (ROOT / "static" / "css" / "kvnotes.css").read_text(encoding="utf-8")
    assert re.findall(r"--s-[\w-]+\s*:", sheet) == []
    assert re.findall(r"\.strategy\.\w+", sheet) == []


def test_every_page_carries_the_fragment(make_client) -> None:
    client = make_client()
    page = client.get("/").text
    styles = re.findall(r"<style>(.*?)</style>", page, re.S)
    assert styles == [strategy_css()]
    assert f"--s-{FLOOR}: {EDIT_INFO[FLOOR].colour};" in styles[0] == strategy_css()
