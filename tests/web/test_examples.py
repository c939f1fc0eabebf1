"""Examples explain themselves: each description is on the home page and atop its notebook (not a
hover tooltip), the skill example says it answers in French by design, and every measured number
a description quotes is filled from `examples/<slug>.measured.json`, which the slow test measures
again on the bundled model."""

from __future__ import annotations

import json
import os
import re
import subprocess
import sys
from pathlib import Path

import pytest
from markupsafe import escape

from app.web.notebooks.examples import ExampleError, cited, example_slugs, filled, list_examples, read_spec

REPO = Path(__file__).resolve().parents[2]
EXAMPLES = REPO / "examples"


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
        text, model = filled(spec)
        assert "{" not in text and model == spec.model
    skill = next(ex for ex in list_examples() if ex.slug == "shipment-skill")
    assert "French by design" in skill.description


def test_a_citation_the_measurement_lacks_is_an_error_naming_it(tmp_path) -> None:
    spec = read_spec("access-policy")
    (tmp_path / "access-policy.json").write_text((EXAMPLES / "access-policy.json").read_text())
    stored = json.loads((EXAMPLES / "access-policy.measured.json").read_text())
    del stored["strategies"]["erratum"]["answer"]
    (tmp_path / "access-policy.measured.json").write_text(json.dumps(stored))
    with pytest.raises(ExampleError, match=r"\{erratum\.answer\} is not in access-policy\.measured\.json"):
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
    assert escape(measured["strategies"]["stale"]["answer"]) in page


@pytest.mark.slow
def test_the_stored_measurements_hold_on_the_bundled_model(data_dir) -> None:
    """Every strategy a description cites, and recompute, measured again: same answers and verdicts,
    KL and F1 within the script's tolerance."""
    done = subprocess.run([sys.executable, "scripts/measure_examples.py", "--check"], cwd=REPO,
                          capture_output=True, text=True, timeout=1500,
                          env={**os.environ, "KVNOTES_DATA": str(data_dir)})
    assert done.returncode == 0, done.stdout + done.stderr[-3000:]
    assert done.stdout.count("as stored") == 3, done.stdout
