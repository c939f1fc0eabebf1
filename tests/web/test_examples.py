"""Examples explain themselves: each description is on the home page and atop its notebook (not a
hover tooltip), the skill example says its model answers in English and why, and every measured number
a description quotes is filled from `examples/<slug>.measured.json`, which the slow test measures
again on the example's model. That file holds both bundled models' runs and the model the example
runs on, the one that reads its field back (recompute names the new value, the stale notes keep the
old one), with the sentence saying why, which the card and the notebook page show."""

from __future__ import annotations

import json
import os
import re
import subprocess
import sys
from pathlib import Path

import pytest
from markupsafe import escape

from app.web.notebooks.examples import (
    ExampleError,
    chosen_model,
    cited,
    example_slugs,
    filled,
    list_examples,
    read_spec,
)
from vocabulary.readback import Reading, choose_model

REPO = Path(__file__).resolve().parents[2]
EXAMPLES = REPO / "examples"
# measured: both models read access-policy's status back (so the default); on the shipment log
# smollm2-135m's stale notes name Madrid, on shipment-skill they name neither city
CHOSEN = {"access-policy": "smollm2-135m", "shipment-log": "gemma3-270m", "shipment-skill": "gemma3-270m"}


@pytest.fixture
def client(make_client):
    return make_client()


def test_every_example_cites_measurements_and_types_no_measured_number() -> None:
    slugs = example_slugs()
    assert len(slugs) == 3 and len(list_examples()) == 3  # every example loads, none is left out
    for slug in slugs:
        spec = read_spec(slug)
        assert len(cited(spec.description)) >= 3, slug
        prose = re.sub(r"\{\w+\.\w+\}", "", spec.description)
        assert not re.search(r"\d\.\d|\d+(\.\d+)?\s*%", prose), (slug, prose)  # no F1, KL or share by hand
        text, model, reason = filled(spec)
        assert "{" not in text and model == spec.model and reason.startswith(f"On {spec.model}")
    skill = next(ex for ex in list_examples() if ex.slug == "shipment-skill")
    runs = json.loads((EXAMPLES / "shipment-skill.measured.json").read_text())["models"]
    assert " est " in runs["smollm2-135m"]["strategies"]["recompute"]["answer"]  # the skill's French there
    assert runs["gemma3-270m"]["strategies"]["recompute"]["answer"].startswith("The shipment goes")  # English
    assert "the answers are in English" in skill.description and "smollm2-135m answers in French" in \
        skill.description  # the card says which, and why the example runs on the English one


def test_a_citation_the_measurement_lacks_is_an_error_naming_it(tmp_path) -> None:
    spec = read_spec("access-policy")
    (tmp_path / "access-policy.json").write_text((EXAMPLES / "access-policy.json").read_text())
    stored = json.loads((EXAMPLES / "access-policy.measured.json").read_text())
    del stored["models"][stored["model"]]["strategies"]["erratum"]["answer"]
    (tmp_path / "access-policy.measured.json").write_text(json.dumps(stored))
    with pytest.raises(ExampleError, match=r"\{erratum\.answer\} is not in access-policy\.measured\.json"):
        filled(read_spec("access-policy", tmp_path), tmp_path)
    stored["model"] = "gemma3-270m" if spec.model != "gemma3-270m" else "smollm2-135m"
    (tmp_path / "access-policy.measured.json").write_text(json.dumps(stored))
    with pytest.raises(ExampleError, match=f"chose '{stored['model']}' but access-policy.json names"):
        filled(read_spec("access-policy", tmp_path), tmp_path)
    (tmp_path / "access-policy.measured.json").unlink()
    with pytest.raises(ExampleError, match="measure_examples.py"):
        filled(spec, tmp_path)


def test_descriptions_are_on_the_home_page_and_atop_their_notebook(client) -> None:
    home = client.get("/").text
    examples = list_examples()
    for ex in examples:
        assert f'<p class="example-description">{escape(ex.description)}</p>' in home
        assert f'title="{escape(ex.description)}"' not in home  # not a tooltip
    loaded = client.post("/examples/access-policy", follow_redirects=False)
    assert loaded.status_code == 303, loaded.text
    page = client.get(loaded.headers["location"]).text
    access = next(ex for ex in examples if ex.slug == "access-policy")
    assert f'<p class="example-note"><strong>Example:</strong> {escape(access.description)}</p>' in page
    measured = json.loads((EXAMPLES / "access-policy.measured.json").read_text())
    assert escape(measured["models"][measured["model"]]["strategies"]["stale"]["answer"]) in page
    for ex in examples:  # which model and why: on every card, and atop the example's notebook
        assert f'<p class="example-model">{escape(ex.model_reason)}</p>' in home
    assert f'<p class="example-note example-model">{escape(access.model_reason)}</p>' in page
    loaded_as = client.get("/api" + loaded.headers["location"]).json()
    assert loaded_as["model"] == read_spec("access-policy").model == measured["model"]  # loads on the choice


@pytest.mark.slow
def test_the_stored_measurements_hold_on_the_bundled_model(data_dir) -> None:
    """Every strategy a description cites, and recompute, measured again: same answers and verdicts,
    KL and F1 within the script's tolerance."""
    done = subprocess.run([sys.executable, "scripts/measure_examples.py", "--check"], cwd=REPO,
                          capture_output=True, text=True, timeout=1500,
                          env={**os.environ, "KVNOTES_DATA": str(data_dir)})
    assert done.returncode == 0, done.stdout + done.stderr[-3000:]
    assert done.stdout.count("as stored") == 3, done.stdout


def test_the_model_that_reads_the_field_back_is_chosen_and_the_reason_says_why() -> None:
    kept = Reading("smollm2-135m", "Oslo", "old", "Oslo", "old")  # recompute does not follow the edit
    flips = Reading("gemma3-270m", "Madrid", "new", "Oslo", "old")
    assert choose_model([kept, flips]) == ("gemma3-270m", "On gemma3-270m: smollm2-135m does not read the "
                                           "field back here (recompute named the old value, “Oslo”).")
    both = Reading("smollm2-135m", "Madrid", "new", "Oslo", "old")
    assert choose_model([both, flips]) == ("smollm2-135m", "On smollm2-135m, the default model: gemma3-270m "
                                           "reads the field back here too.")  # both do: the first listed
    leaky = Reading("smollm2-135m", "Madrid", "new", "Madrid", "new")  # the stale notes follow too
    model, reason = choose_model([kept, leaky])  # neither: the one whose recompute follows comes closest
    assert model == "smollm2-135m" and reason.startswith("On smollm2-135m: no bundled model reads")
    assert "“" + "x" * 39 + "…”" in choose_model([Reading("m", "x" * 80, "old", "y", "old")])[1]  # cut short


def test_each_example_runs_on_the_model_its_measurement_chose() -> None:
    """Both bundled models were measured on every example; the stored choice and its sentence are
    what `chosen_model` derives from the stored runs; the example loads on that model, and there
    recompute named the new value while the stale notes kept the old one."""
    for slug in example_slugs():
        spec = read_spec(slug)
        measured = json.loads((EXAMPLES / f"{slug}.measured.json").read_text())
        assert tuple(measured["models"]) == ("smollm2-135m", "gemma3-270m"), slug
        assert chosen_model(measured["models"]) == (measured["model"], measured["reason"]), slug
        assert spec.model == measured["model"] == CHOSEN[slug], slug
        rows = measured["models"][spec.model]["strategies"]
        assert (rows["recompute"]["edit_followed"], rows["stale"]["edit_followed"]) == ("new", "old"), slug


def test_the_readme_table_of_models_is_the_stored_measurement() -> None:
    """README's table (both models side by side) says what the measured files say."""
    rows = {line.split("|")[1].strip().strip("`"): [c.strip() for c in line.split("|")[3:6]]
            for line in (REPO / "README.md").read_text().splitlines() if line.startswith("| `")}
    for slug in example_slugs():
        measured = json.loads((EXAMPLES / f"{slug}.measured.json").read_text())
        runs = measured["models"]
        said = [" / ".join(runs[m]["strategies"][s]["edit_followed"] for s in ("recompute", "stale"))
                for m in ("smollm2-135m", "gemma3-270m")]
        assert rows[slug] == [*said, measured["model"]], slug
