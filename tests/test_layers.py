"""The house rules of docs/architecture.md (the floors), checked on the source and in fresh interpreters.

Layers, bottom to top — every import points down:

    vocabulary  vocabulary/   the shared words; imports nothing but the stdlib
    engine      worker/engine/                torch + transformers; never the web, database or queue
    serving     serving/                      the vLLM replay: httpx + vocabulary; never torch, data or app
    data        data/                         settings, ORM models, contracts, queue client
    web         app/                          FastAPI pages and API; never torch or the worker's tasks
    worker      worker/ (tasks, Celery app)   the engine and the data layer; never FastAPI or app
    commands    commands/                     the `kvnotes` command line and `serve`; app by name only

Every import counts, including those inside functions and under TYPE_CHECKING.
"""

from __future__ import annotations

import ast
import re
import subprocess
import sys
from dataclasses import fields as dataclass_fields
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[1]
PACKAGES = ("app", "commands", "data", "serving", "vocabulary", "worker")
MAX_LINES = 400
LONG_FILE_REASON = "Longer than 400 lines because"

# layer -> (first-party layers it may import, third-party packages it must not import)
RULES: dict[str, tuple[set[str], set[str]]] = {
    "vocabulary": ({"vocabulary"}, set()),  # plus: stdlib only, checked below
    "engine": ({"engine", "vocabulary"}, {"celery", "kombu", "sqlalchemy", "alembic", "fastapi", "starlette",
                                          "uvicorn", "pydantic", "pydantic_settings"}),
    "serving": ({"serving", "vocabulary"}, {"torch", "transformers", "safetensors", "celery", "kombu",
                                            "sqlalchemy", "alembic", "fastapi", "starlette", "uvicorn"}),
    "data": ({"data", "vocabulary"}, {"torch", "transformers", "fastapi", "starlette", "uvicorn"}),
    "web": ({"web", "data", "serving", "vocabulary"}, {"torch", "transformers", "safetensors"}),
    "worker": ({"worker", "engine", "data", "serving", "vocabulary"}, {"fastapi", "starlette", "uvicorn"}),
    "commands": ({"commands", "worker", "engine", "data", "serving", "vocabulary"}, {"fastapi", "starlette"}),
}


def layer_of(module: str) -> str | None:
    if module == "vocabulary" or module.startswith("vocabulary."):
        return "vocabulary"
    if module == "worker.engine" or module.startswith("worker.engine."):
        return "engine"
    top = module.split(".")[0]
    return {"data": "data", "serving": "serving", "app": "web", "worker": "worker",
            "commands": "commands"}.get(top)


def module_name(path: Path) -> str:
    parts = list(path.relative_to(REPO).with_suffix("").parts)
    return ".".join(parts[:-1] if parts[-1] == "__init__" else parts)


SOURCES = {module_name(p): p for pkg in PACKAGES for p in sorted((REPO / pkg).rglob("*.py"))}


def imports_of(module: str) -> set[str]:
    """Every module `module` imports anywhere in its file (first-party names resolved to modules)."""
    tree = ast.parse(SOURCES[module].read_text(encoding="utf-8"))
    found: set[str] = set()
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            found.update(alias.name for alias in node.names)
        elif isinstance(node, ast.ImportFrom) and node.module and node.level == 0:
            for alias in node.names:
                candidate = f"{node.module}.{alias.name}"
                found.add(candidate if candidate in SOURCES else node.module)
    return found


GRAPH = {module: {m for m in imports_of(module) if m in SOURCES and m != module} for module in SOURCES}


def test_every_module_belongs_to_a_layer():
    assert [m for m in SOURCES if layer_of(m) is None] == []


@pytest.mark.parametrize("module", sorted(SOURCES))
def test_imports_point_down(module: str):
    layer = layer_of(module)
    allowed, forbidden = RULES[layer]
    upward = sorted(m for m in GRAPH[module] if layer_of(m) not in allowed)
    assert upward == [], f"{module} ({layer}) imports {upward}"
    third_party = {m.split(".")[0] for m in imports_of(module) if m.split(".")[0] not in PACKAGES}
    assert sorted(third_party & forbidden) == [], (
        f"{module} ({layer}) imports {sorted(third_party & forbidden)}")
    if layer == "vocabulary":
        assert third_party <= set(sys.stdlib_module_names) | {"__future__"}


def test_no_two_modules_import_each_other_directly_or_in_a_circle():
    """Tarjan's strongly connected components over the first-party import graph: all of size one."""
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    on_stack: set[str] = set()
    cycles: list[list[str]] = []

    def visit(node: str) -> None:
        index[node] = low[node] = len(index)
        stack.append(node)
        on_stack.add(node)
        for nxt in GRAPH[node]:
            if nxt not in index:
                visit(nxt)
                low[node] = min(low[node], low[nxt])
            elif nxt in on_stack:
                low[node] = min(low[node], index[nxt])
        if low[node] == index[node]:
            component = []
            while True:
                member = stack.pop()
                on_stack.discard(member)
                component.append(member)
                if member == node:
                    break
            if len(component) > 1:
                cycles.append(sorted(component))

    for node in sorted(GRAPH):
        if node not in index:
            visit(node)
    assert cycles == []


def test_the_worker_tasks_never_reach_the_web():
    for module in sorted(m for m in SOURCES if layer_of(m) == "worker"):
        assert not any(m.startswith(("app.", "fastapi", "starlette")) or m == "app"
                       for m in imports_of(module))


@pytest.mark.parametrize("module", sorted(SOURCES))
def test_files_stay_under_400_lines_or_say_why(module: str):
    text = SOURCES[module].read_text(encoding="utf-8")
    n = text.count("\n")
    if n > MAX_LINES:
        docstring = ast.get_docstring(ast.parse(text)) or ""
        assert LONG_FILE_REASON in docstring, f"{SOURCES[module]} has {n} lines and no reason at its top"


ENV_READ = re.compile(r"os\.environ\.get\(|os\.getenv\(|os\.environ\[[^\]]+\](?!\s*=)")


@pytest.mark.parametrize("module", sorted(SOURCES))
def test_environment_is_read_only_by_settings(module: str):
    if module == "data.settings":
        return
    text = SOURCES[module].read_text(encoding="utf-8")
    assert ENV_READ.findall(text) == [], f"{module} reads the environment; add the variable to data.settings"


# ---- what a fresh interpreter loads ------------------------------------------------------------

PROBE = """
import sys
import {module}
{then}
print(*sorted(m for m in sys.modules if m.split('.')[0] in {roots!r} or m in {exact!r}))
"""


def loaded_by(module: str, roots: set[str], exact: set[str] = frozenset(), then: str = "") -> list[str]:
    code = PROBE.format(module=module, then=then, roots=sorted(roots), exact=sorted(exact))
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True,
                         check=True, timeout=120, cwd=REPO)
    return out.stdout.split()


WORKER_MODULES = {"worker.tasks", "worker.celery_app", "worker.engine.engine", "worker.engine.notes"}


def test_the_web_app_loads_no_torch_transformers_or_worker_code():
    assert loaded_by("app.main", {"torch", "transformers", "safetensors"}, WORKER_MODULES) == []


def test_the_engine_loads_no_celery_database_web_or_data_layer():
    forbidden = {"celery", "kombu", "sqlalchemy", "fastapi", "starlette", "uvicorn", "app", "data"}
    assert loaded_by("worker.engine", forbidden, then="from worker.engine import load, RunRequest") == []


def test_the_shared_vocabulary_loads_nothing_heavy():
    assert loaded_by("vocabulary", {"torch", "transformers", "numpy", "sqlalchemy", "pydantic"},
                     WORKER_MODULES) == []


def test_importing_the_data_or_web_layer_sets_no_environment_variable():
    """Thread settings belong to the worker's and the CLI's entry points, not to an import."""
    code = ("import os; os.environ.pop('OMP_WAIT_POLICY', None); import data.contracts, app.main; "
            "print(os.environ.get('OMP_WAIT_POLICY'))")
    env = {k: v for k, v in __import__("os").environ.items() if k != "OMP_WAIT_POLICY"}
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True,
                         check=True, timeout=120, cwd=REPO, env=env)
    assert out.stdout.split() == ["None"]


def test_the_serving_replay_loads_no_torch_database_or_web():
    forbidden = {"torch", "transformers", "sqlalchemy", "celery", "fastapi", "starlette", "app", "data"}
    assert loaded_by("serving", forbidden, WORKER_MODULES) == []


def test_the_data_layer_loads_no_torch_or_web():
    assert loaded_by("data.models", {"torch", "transformers", "fastapi", "starlette"}, WORKER_MODULES) == []


# ---- one concept, one place ------------------------------------------------------------------------


def test_the_metric_list_is_the_vocabulary_everywhere():
    """`METRICS` is the one list: the engine's result, the database columns and the API carry it."""
    from app.schemas import StrategyResultOut
    from data.models import RunResult
    from vocabulary import METRIC_NAMES
    from worker.engine.types import StrategyResult

    assert tuple(f.name for f in dataclass_fields(StrategyResult)) == METRIC_NAMES
    assert set(METRIC_NAMES) <= set(RunResult.__table__.columns.keys())
    assert tuple(StrategyResultOut.model_fields)[: len(METRIC_NAMES)] == METRIC_NAMES


# ---- the web's rooms: app/web/ is the shared part, one folder per page family ----------------------

WEB_FAMILIES = {"accounts", "notebooks", "runs", "serving", "skills", "sweeps", "trajectories"}
WEB_SHARED = {"templating", "forms", "errors", "paging", "strategy_css"}  # below every family
WEB_TOP = {"app.web", "app.web.router", "app.web.components"} | {f"app.web.{m}" for m in WEB_SHARED}
WEB_MODULES = sorted(m for m in SOURCES if m.startswith("app.web."))


def test_app_web_has_no_flat_page_modules_left():
    """A page, its routes and its view-model live in their family's folder; the top holds the
    shared part, the router and the component gallery."""
    top = {m for m in SOURCES if m == "app.web" or m.count(".") == 2 and m.startswith("app.web.")}
    assert top == WEB_TOP | {f"app.web.{f}" for f in WEB_FAMILIES}
    assert {m.split(".")[2] for m in WEB_MODULES if m.count(".") >= 3} == WEB_FAMILIES


def test_the_shared_web_modules_import_no_page_family():
    for shared in sorted(WEB_SHARED):
        reached = {m.split(".")[2] for m in GRAPH[f"app.web.{shared}"] if m.startswith("app.web.")}
        assert reached & WEB_FAMILIES == set(), f"app.web.{shared} imports a page family: {sorted(reached)}"


@pytest.mark.parametrize("module", [m for m in WEB_MODULES if m.rsplit(".", 1)[1].endswith("view")])
def test_web_view_models_import_no_fastapi(module: str):
    """`view` / `*_view` modules turn rows into what a template shows: plain functions, no routing."""
    assert {m.split(".")[0] for m in imports_of(module)} & {"fastapi", "starlette"} == set()


@pytest.mark.parametrize("module", WEB_MODULES)
def test_web_modules_import_only_public_names_of_one_another(module: str):
    tree = ast.parse(SOURCES[module].read_text(encoding="utf-8"))
    private = sorted(f"{node.module}.{alias.name}" for node in ast.walk(tree)
                     if isinstance(node, ast.ImportFrom) and (node.module or "").startswith("app.web")
                     for alias in node.names if alias.name.startswith("_"))
    assert private == [], f"{module} imports private helpers {private}"


def test_no_test_module_imports_another():
    """Helpers shared by tests live in a conftest.py or a helper module, never in a test module,
    so that collecting one file never runs (or depends on) another's tests."""
    offenders = []
    for path in sorted((REPO / "tests").rglob("*.py")):
        tree = ast.parse(path.read_text(encoding="utf-8"))
        for node in ast.walk(tree):
            names = ([node.module or ""] if isinstance(node, ast.ImportFrom)
                     else [a.name for a in node.names] if isinstance(node, ast.Import) else [])
            offenders += [f"{path.relative_to(REPO)} imports {name}" for name in names
                          if name.startswith("tests.") and name.rsplit(".", 1)[-1].startswith("test_")]
    assert offenders == []
