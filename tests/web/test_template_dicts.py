"""A template never reads a dict's key as an attribute whose name is also a dict method: Jinja finds
the method first, so `{% if errors.values %}` was always true and printed `<built-in method values
of dict object at 0x…>`, a heap address, on every Sweep panel (issue 32 item 6). The dicts the pages
hand templates (`errors`, `form`, `values`) are read with `.get('…')` or `['…']` for such names."""

from __future__ import annotations

import re
from pathlib import Path

TEMPLATES = Path(__file__).resolve().parents[2] / "templates"
METHODS = "values|items|keys|get|pop|copy|update|clear|setdefault|popitem|fromkeys"
# a dict of the pages' context, then a method's name read as a key (not called)
AS_KEY = re.compile(rf"\b(errors|form|values)\.({METHODS})\b(?!\s*\()")


def test_no_template_reads_a_dict_method_name_as_a_key() -> None:
    found = [f"{path.name}:{text[:m.start()].count(chr(10)) + 1}: {m.group(0)}"
             for path in sorted(TEMPLATES.rglob("*.html")) for text in [path.read_text(encoding="utf-8")]
             for m in AS_KEY.finditer(text)]
    assert len(list(TEMPLATES.rglob("*.html"))) >= 20
    assert found == []
