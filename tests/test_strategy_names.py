"""No strategy name is written as a string outside its own file: the pages and the engine ask for
roles (`vocabulary.REFERENCE`, `FLOOR`) and facts (`moves_keys`, `parts`), or name a strategy
through its class (`InPlace.info.name`). Checked on the source: every string constant of every
module of app/ and worker/ but the strategy files themselves."""

from __future__ import annotations

import ast
from pathlib import Path

from vocabulary import COMPOSE_INFO, EDIT_INFO

REPO = Path(__file__).resolve().parents[1]
STRATEGY_FILES = ("worker/engine/strategies/edits", "worker/engine/strategies/compositions")


def test_no_module_outside_a_strategy_file_writes_a_strategy_name() -> None:
    names = set(EDIT_INFO) | set(COMPOSE_INFO)
    assert len(names) == 12
    found, read = [], 0
    for root in ("app", "worker"):
        for path in sorted((REPO / root).rglob("*.py")):
            where = path.relative_to(REPO).as_posix()
            if where.startswith(STRATEGY_FILES):
                continue
            read += 1
            for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"))):
                if isinstance(node, ast.Constant) and node.value in names:
                    found.append(f"{where}:{node.lineno}: {node.value!r}")
    assert read > 100
    assert found == []
