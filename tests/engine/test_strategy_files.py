"""A strategy is one file: its class carries its descriptor and its algorithm and registers itself
(no list names it, no order matters: lists follow the descriptors' rank). The torch-free side reads
the same descriptors from vocabulary/strategies.json, written from the classes; and a throwaway
strategy added as one file of another package shows in the registry, the descriptors written for
the torch-free side, the run form, the API schema and the stylesheet fragment; and, from the serving
layout and the carrying its descriptor declares, in a trajectory the engine runs, in the replays'
variants (the replay form, the API schema, the prompts each replay sends) and in the gateway's
policies."""

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
"""`shout`: a throwaway strategy, the whole of it in this one file: the old notes kept, a
correction appended (sent to a server as the prompt as it was with an erratum appended, carried
through a trajectory by its own surgery)."""

from vocabulary import StrategyInfo
from vocabulary.strategies import APPEND_ERRATUM, OWN_SURGERY
from worker.engine.edit import with_erratum
from worker.engine.strategies.base import Strategy
from worker.engine.strategies.edit import EditCase
from worker.engine.strategies.edits.stale import stale


class Shout(Strategy[EditCase]):
    info = StrategyInfo(name="shout", kind="edit", rank=65, help="a throwaway: the old notes, kept",
                        recomputes="an appended correction", colour="#123456", appends_errata=True,
                        serving_layout=APPEND_ERRATUM, carrying=OWN_SURGERY)

    def surgery(self, case):
        return with_erratum(stale(case.editor), case.erratum_ids)
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
serving = client.get(made.headers["location"] + "/serving").text
schema = client.get("/openapi.json").json()["components"]["schemas"]
home = client.get("/").text
print(json.dumps({
    "form": re.findall(r'name="strategies" value="([a-z_]+)"', page),
    "enum": schema["RunCreate"]["properties"]["strategies"]["items"]["enum"],
    "css": re.findall(r"--s-shout: (#[0-9a-f]{6});", home) + re.findall(r"\\.strategy\\.shout\\b", home),
    "replay_form": re.findall(r'name="variants" value="([a-z_]+)"', serving),
    "replay_variants_at_most": schema["ReplayCreate"]["properties"]["variants"]["maxItems"],
    "torch": "torch" in sys.modules,
}))
'''

# The engine side with the descriptors written (the overlay): a trajectory asked for nothing runs
# every carried strategy, the throwaway among them; the replays' variants and the prompts they send,
# and the gateway's policies, follow its serving layout.
TRAJECTORY_SIDE = '''
import json
from serving.gateway import LAYOUTS
from serving.streams import plan_variant
from serving.trajectory import plan_turns
from vocabulary.replay import VARIANTS, ReplaySpec, TrajectoryReplaySpec
from vocabulary.trajectories import FieldSpec, TurnSpec
from worker.engine import Field, Question, load
from worker.engine.strategies import discover
from worker.engine.trajectory import Turn, TrajectoryRequest, trajectory
discover("kvnotes_extra")
doc = "Account record. status: active. Only active accounts may log in.\\n"
at = doc.index("active")
request = TrajectoryRequest(doc, (Field(at, at + 6, "active", "status"),),
                            (Turn(append="\\nTool: 3 items."), Turn(fields=(("status", "suspended"),))),
                            Question("Can this user log in?", ("yes", "no")))
report = trajectory(load("tiny-llama", device="cpu"), request)
last = report.turns[-1].results
spec = ReplaySpec(doc, at, at + 6, "status", ("suspended",), "Can this user log in?", ("yes", "no"))
prompts = {v: [p.content for p in plan_variant(spec, v)[1]] for v in VARIANTS}
same = {v: prompts[v] == prompts["shout"] for v in VARIANTS}
tspec = TrajectoryReplaySpec(doc, (FieldSpec("status", at, at + 6),),
                             (TurnSpec(append="x"), TurnSpec(fields={"status": "suspended"})), "Why?")
turns = {v: [t.content for t in plan_turns(tspec, v)[1]] for v in VARIANTS}
print(json.dumps({
    "turns": [list(t.results) for t in report.turns],
    "errata": {k: r.errata for k, r in last.items()},
    "computed": {k: r.tokens_computed for k, r in last.items()},
    "variants": list(VARIANTS), "same_prompts": same,
    "same_turns": {v: turns[v] == turns["shout"] for v in VARIANTS},
    "gateway": list(LAYOUTS),
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
    # a replay's variants: its serving layout (an erratum appended) puts it between erratum and hoist
    assert shown["replay_form"] == ["in_place", "erratum", "shout", "hoist"]
    assert shown["replay_variants_at_most"] == 4

    env = {**os.environ, "PYTHONPATH": os.pathsep.join([str(overlay), str(tmp_path / "extra"), str(REPO)])}
    ran = subprocess.run([sys.executable, "-c", TRAJECTORY_SIDE], cwd=tmp_path, env=env, capture_output=True,
                         text=True, timeout=600)
    assert ran.returncode == 0, ran.stderr
    seen = json.loads(ran.stdout.strip().splitlines()[-1])
    carried = ["recompute", "prefix_reuse", "stale", "in_place", "erratum", "field_erratum", "selective",
               "shout", "hoist"]
    assert seen["turns"] == [carried, carried]  # its carrying makes it one of a trajectory's defaults
    # its own surgery carried its cache: the old notes kept and one erratum appended at the change,
    # as erratum's (the same surgery) did, computing as many tokens
    assert seen["errata"]["shout"] == seen["errata"]["erratum"] == 1
    assert seen["computed"]["shout"] == seen["computed"]["erratum"] > 0
    assert seen["errata"]["stale"] == 0
    assert seen["variants"] == ["in_place", "erratum", "shout", "hoist"]
    # the prompts it sends are its layout's: erratum's, and no other variant's
    assert seen["same_prompts"] == {"in_place": False, "erratum": True, "shout": True, "hoist": False}
    assert seen["same_turns"] == {"in_place": False, "erratum": True, "shout": True, "hoist": False}
    assert seen["gateway"] == ["erratum", "field_erratum", "shout", "hoist"]
