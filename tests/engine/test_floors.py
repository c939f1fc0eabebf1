"""The engine's import floors, as its `__init__` docstring states them: every module of
worker/engine is on exactly one floor, and imports only from its own floor or below (notes and RoPE
at the bottom, forward and readout above them, surgery, strategies and the measure loops on top)."""

from __future__ import annotations

import ast
import re
from fnmatch import fnmatch
from pathlib import Path

import worker.engine

ENGINE = Path(worker.engine.__file__).resolve().parent


def floors() -> list[tuple[int, list[str]]]:
    """[(floor, module patterns)] read from the docstring's list."""
    text = worker.engine.__doc__ or ""
    block = text.split("Import floors", 1)[1].split("\n\n", 2)[1]
    found: list[tuple[int, list[str]]] = []
    for line in block.splitlines():
        head = re.match(r"\s{4}(\d+) [^:]+:(.*)", line)
        if head:
            found.append((int(head.group(1)), head.group(2).split()))
        else:
            found[-1][1].extend(line.split())
    return found


def modules() -> dict[str, Path]:
    out = {}
    for path in ENGINE.rglob("*.py"):
        parts = path.relative_to(ENGINE).with_suffix("").parts
        name = ".".join(parts[:-1] if parts[-1] == "__init__" else parts)
        if name:
            out[name] = path
    return out


def floor_of(name: str, table: list[tuple[int, list[str]]]) -> list[int]:
    exact = [n for n, patterns in table if name in patterns]
    return exact or [n for n, patterns in table if any(fnmatch(name, p) for p in patterns if "*" in p)]


def imported(path: Path, names: set[str]) -> set[str]:
    """The engine modules `path` imports (every import, TYPE_CHECKING and function bodies included)."""
    out = set()
    for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"))):
        targets = []
        if isinstance(node, ast.ImportFrom) and node.module:
            targets = [node.module, *(f"{node.module}.{a.name}" for a in node.names)]
        elif isinstance(node, ast.Import):
            targets = [a.name for a in node.names]
        for target in targets:
            short = target.removeprefix("worker.engine.")
            if target.startswith("worker.engine.") and short in names:
                out.add(short)
    return out


def test_every_engine_module_is_on_one_floor_and_imports_nothing_above_it() -> None:
    table = floors()
    assert [n for n, _ in table] == list(range(1, 9))
    names = modules()
    assert len(names) > 40
    placed = {name: floor_of(name, table) for name in names}
    assert {name: f for name, f in placed.items() if len(f) != 1} == {}  # each on exactly one floor
    up = [f"{name} (floor {placed[name][0]}) imports {dep} (floor {placed[dep][0]})"
          for name, path in sorted(names.items()) for dep in sorted(imported(path, set(names)))
          if placed[dep][0] > placed[name][0]]
    assert up == []
    assert placed["notes"] == placed["rope"] == [2] and placed["run"] == placed["blend"] == [7]
