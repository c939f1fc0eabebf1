"""No strategy name is written as a string outside its own file: the pages, the serving side and the
engine ask for roles (`vocabulary.REFERENCE`, `FLOOR`) and facts (`moves_keys`, `parts`,
`serving_layout`, `carrying`), or take a name from the registry (`EDITS.field_alone()`); the run
page's script reads the reference from the page (`data-reference`). Checked on the source: every
string constant of every Python module of app/, worker/, serving/, vocabulary/, data/ and commands/
but the strategy files themselves, and every quoted string of the templates and of static/js (not
the vendored scripts). A literal that is the same word but no strategy stays, named below."""

from __future__ import annotations

import ast
import re
from collections import Counter
from pathlib import Path

from vocabulary import COMPOSE_INFO, EDIT_INFO

REPO = Path(__file__).resolve().parents[1]
STRATEGY_FILES = ("worker/engine/strategies/edits", "worker/engine/strategies/compositions")
PYTHON = ("app", "worker", "serving", "vocabulary", "data", "commands")

# The words that are a strategy's name and also mean something else, where they mean the other
# thing: (file, word) -> how many times. At most 8 in all.
ALLOWED = {
    # accelerate's device_map word for a model spread over every GPU (KVNOTES_DEVICE=auto)
    ("vocabulary/__init__.py", "auto"): 1,
    # KVNOTES_AUTH=auto|required: sign-in off for a loopback client (a setting's value and default)
    ("data/settings.py", "auto"): 2,
    # the segment of an erratum's tokens (the constant every layer reads as vocabulary.ERRATUM)
    ("vocabulary/regions.py", "erratum"): 1,
    # the paper's own label for its erratum point on the editing frontier (a quotation)
    ("vocabulary/sweeps.py", "erratum"): 1,
    # a key of `kvnotes sweep --json`'s worst cases (the reference's answer), a fixed contract
    ("commands/sweep.py", "recompute"): 1,
    # the replay form's placeholder for an empty request count (one request per value)
    ("templates/_serving.html", "auto"): 1,
}


def _python(names: set[str]) -> tuple[Counter, int]:
    found: Counter = Counter()
    read = 0
    for root in PYTHON:
        for path in sorted((REPO / root).rglob("*.py")):
            where = path.relative_to(REPO).as_posix()
            if where.startswith(STRATEGY_FILES):
                continue
            read += 1
            for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"))):
                if isinstance(node, ast.Constant) and node.value in names:
                    found[(where, node.value)] += 1
    return found, read


def _quoted(names: set[str], paths: list[Path], root: Path = REPO) -> Counter:
    """Every quoted string ('…', "…" or `…`) of these files whose whole text is a name."""
    pattern = re.compile(r"""(["'`])(""" + "|".join(map(re.escape, sorted(names))) + r")\1")
    found: Counter = Counter()
    for path in paths:
        for match in pattern.finditer(path.read_text(encoding="utf-8")):
            found[(path.relative_to(root).as_posix(), match.group(2))] += 1
    return found


def test_no_module_page_or_script_outside_a_strategy_file_writes_a_strategy_name() -> None:
    names = set(EDIT_INFO) | set(COMPOSE_INFO)
    assert len(names) == 12
    assert sum(ALLOWED.values()) <= 8
    found, read = _python(names)
    templates = sorted((REPO / "templates").rglob("*.html"))
    scripts = sorted((REPO / "static" / "js").glob("*.js"))
    assert read > 200 and len(templates) > 50 and len(scripts) >= 9
    found += _quoted(names, templates + scripts)
    assert dict(found) == ALLOWED


def test_the_scan_finds_a_name_quoted_in_a_page_or_a_script_and_not_a_word_that_holds_one(
        tmp_path: Path) -> None:
    (tmp_path / "page.html").write_text("""{% if s == 'hoist' %}<option value="in_place">{% endif %}
        <p title="recompute's answer">'restale' "stale_notes"</p>""")
    (tmp_path / "x.js").write_text("""get(url(`recompute`)); mark(t.segment === "erratum");""")
    found = _quoted(set(EDIT_INFO), [tmp_path / "page.html", tmp_path / "x.js"], tmp_path)
    assert found == Counter({("page.html", "hoist"): 1, ("page.html", "in_place"): 1,
                             ("x.js", "recompute"): 1, ("x.js", "erratum"): 1})
