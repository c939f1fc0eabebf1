"""A strategy is one file: its class carries its descriptor and its algorithm and registers itself
(no list names it, no order matters: lists follow the descriptors' rank). The torch-free side reads
the same descriptors from vocabulary/strategies.json, written from the classes; and a throwaway
strategy added as one file of another package shows in the registry, the descriptors written for
the torch-free side, the run form, the API schema and the stylesheet fragment."""

from __future__ import annotations

import ast
import json
import os
import shutil
import subprocess
import sys
import textwrap
from pathlib import Path

from tests.conftest import kvnotes_env
from vocabulary import COMPOSE_INFO, EDIT_INFO
from vocabulary.strategies import DESCRIPTORS, read_descriptors
from worker.engine.strategies import COMPOSITIONS, EDITS, PACKAGES, descriptors

REPO = Path(__file__).resolve().parents[2]
FOLDERS = {"edit": REPO / "worker/engine/strategies/edits",
           "compose": REPO / "worker/engine/strategies/compositions"}

SHOUT = '''
"""`shout`: a throwaway strategy, the whole of it in this one file."""

from vocabulary import StrategyInfo
from worker.engine.strategies.base import Strategy
from worker.engine.strategies.edit import EditCase
from worker.engine.strategies.edits.stale import stale


class Shout(Strategy[EditCase]):
    info = StrategyInfo(name="shout", kind="edit", rank=65, help="a throwaway: the old notes, kept",
                        recomputes="nothing", colour="#123456")

    def surgery(self, case):
        return stale(case.editor)
'''

ENGINE_SIDE = '''
import json, sys
from worker.engine.strategies import EDITS, descriptors, discover
before = list(EDITS.names)
discover("kvnotes_extra")
built = EDITS.build(["shout"])["shout"]
open(sys.argv[1], "w").write(descriptors())
print(json.dumps({"before": before, "after": list(EDITS.names), "built": type(built).__name__}))
'''

WEB_SIDE = '''
import json, re, sys
from fastapi.testclient import TestClient
from app.main import create_app
from data.migrate import upgrade_to_head
upgrade_to_head()
client = TestClient(create_app(), base_url="http://127.0.0.1", client=("127.0.0.1", 50000))
made = client.post("/notebooks", data={"title": "T", "model": "smollm2-135m", "text": "status: active"},
                   follow_redirects=False)
page = client.get(made.headers["location"]).text
schema = client.get("/openapi.json").json()["components"]["schemas"]
home = client.get("/").text
print(json.dumps({
    "form": re.findall(r'name="strategies" value="([a-z_]+)"', page),
    "enum": schema["RunCreate"]["properties"]["strategies"]["items"]["enum"],
    "css": re.findall(r"--s-shout: (#[0-9a-f]{6});", home) + re.findall(r"\\.strategy\\.shout\\b", home),
    "torch": "torch" in sys.modules,
}))
'''


def test_the_descriptors_the_torch_free_side_reads_are_the_classes_own() -> None:
    # when this fails: python -m worker.engine.strategies (writes vocabulary/strategies.json)
    assert DESCRIPTORS.read_text(encoding="utf-8") == descriptors()
    kinds = read_descriptors(descriptors())
    assert kinds["edit"] == EDITS.infos == EDIT_INFO
    assert kinds["compose"] == COMPOSITIONS.infos == COMPOSE_INFO
    assert (len(EDIT_INFO), len(COMPOSE_INFO)) == (9, 6)


def test_each_strategy_is_one_file_holding_its_class_and_nothing_names_them_in_a_list() -> None:
    for kind, registry in (("edit", EDITS), ("compose", COMPOSITIONS)):
        for name, cls in registry.classes.items():
            path = Path(sys.modules[cls.__module__].__file__)
            assert path == FOLDERS[kind] / f"{name}.py", (name, path)
            tree = ast.parse(path.read_text(encoding="utf-8"))
            described = [n.name for n in tree.body if isinstance(n, ast.ClassDef)
                         and any(isinstance(s, ast.Assign) and s.targets[0].id == "info" for s in n.body
                                 if isinstance(s, ast.Assign) and isinstance(s.targets[0], ast.Name))]
            assert described == [cls.__name__]  # one strategy per file, its descriptor written in it
    assert {p.stem for p in FOLDERS["edit"].glob("*.py")} - {"__init__"} == set(EDIT_INFO)
    assert {p.stem for p in FOLDERS["compose"].glob("*.py")} - {"__init__"} == set(COMPOSE_INFO)
    assert PACKAGES == ("worker.engine.strategies.edits", "worker.engine.strategies.compositions")


def test_a_throwaway_strategy_is_one_file_and_shows_everywhere(tmp_path: Path) -> None:
    package = tmp_path / "extra" / "kvnotes_extra"
    package.mkdir(parents=True)
    (package / "__init__.py").write_text("")
    (package / "shout.py").write_text(textwrap.dedent(SHOUT))
    overlay = tmp_path / "overlay"
    shutil.copytree(REPO / "vocabulary", overlay / "vocabulary",
                    ignore=shutil.ignore_patterns("__pycache__"))
    written = overlay / "vocabulary" / "strategies.json"

    env = {**os.environ, "PYTHONPATH": os.pathsep.join([str(tmp_path / "extra"), str(REPO)])}
    engine = subprocess.run([sys.executable, "-c", ENGINE_SIDE, str(written)], cwd=tmp_path, env=env,
                            capture_output=True, text=True, timeout=300)
    assert engine.returncode == 0, engine.stderr
    seen = json.loads(engine.stdout.strip().splitlines()[-1])
    assert "shout" not in seen["before"] and seen["built"] == "Shout"
    # in the registry, between selective (rank 60) and hoist (70): its rank places it, no list does
    assert seen["after"] == [*seen["before"][:7], "shout", *seen["before"][7:]]
    assert read_descriptors(written.read_text())["edit"]["shout"].colour == "#123456"

    data = tmp_path / "data"
    data.mkdir()
    env = {**os.environ, **kvnotes_env(data), "PYTHONPATH": os.pathsep.join([str(overlay), str(REPO)])}
    web = subprocess.run([sys.executable, "-c", WEB_SIDE], cwd=tmp_path, env=env, capture_output=True,
                         text=True, timeout=300)
    assert web.returncode == 0, web.stderr
    shown = json.loads(web.stdout.strip().splitlines()[-1])
    assert shown["form"] == seen["after"] == shown["enum"]  # the run form and the API schema
    assert shown["css"] == ["#123456", ".strategy.shout"]  # the stylesheet fragment
    assert shown["torch"] is False  # the web side read the descriptors without the engine
