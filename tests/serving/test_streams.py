"""The request streams a replay sends, without a server: Poisson arrivals, the three variants'
texts, what each shares with the prompt before the edit, and the spec's checks."""

from __future__ import annotations

import statistics

import pytest

from serving import ReplaySpec, arrivals, plan_variant
from serving.streams import field_label, question_text, variant_document
from vocabulary import render_erratum

DOC = ("SHIPMENT RECORD\nrecord_id: SR-1\ndestination: Oslo\ncarrier: NordFreight\n\n"
       "Operations log:\n2026-03-01 07:20 Customer care archived the invoice draft.\n"
       "2026-03-01 08:04 Operations logged the insurance check.\n")
START = DOC.index("Oslo")


def spec(**kw) -> ReplaySpec:
    base = dict(document=DOC, start=START, end=START + 4, label="destination",
                values=("Madrid", "Rome", "Lisbon"),
                question="What is the destination?", choices=("Oslo", "Madrid", "Rome", "Lisbon"))
    return ReplaySpec(**{**base, **kw})


def test_arrivals_are_a_seeded_poisson_process_at_the_rate():
    times = arrivals(4000, rate=5.0, seed=3)
    gaps = [b - a for a, b in zip(times, times[1:])]
    assert times[0] == 0.0 and all(g > 0 for g in gaps)
    assert statistics.fmean(gaps) == pytest.approx(1 / 5.0, rel=0.05)  # exponential: mean 1/rate
    assert statistics.stdev(gaps) == pytest.approx(1 / 5.0, rel=0.08)  # ... and standard deviation 1/rate
    assert arrivals(50, 5.0, seed=3) == times[:50]  # the same seed, the same times
    assert arrivals(50, 5.0, seed=4) != times[:50]


def test_every_variant_gets_the_same_arrival_times_and_one_request_per_value():
    plans = {v: plan_variant(spec(rate=2.0), v)[1] for v in ("in_place", "erratum", "hoist")}
    times = [[r.arrival_s for r in planned] for planned in plans.values()]
    assert times[0] == times[1] == times[2] and len(times[0]) == 3
    assert [r.value for r in plans["hoist"]] == ["Madrid", "Rome", "Lisbon"]
    assert [r.value for r in plan_variant(spec(requests=5), "erratum")[1]] == ["Madrid", "Rome", "Lisbon",
                                                                              "Madrid", "Rome"]


def test_in_place_rewrites_the_field_and_breaks_the_prefix_at_it():
    warm, planned = plan_variant(spec(), "in_place")
    ask = question_text("What is the destination?", ("Oslo", "Madrid", "Rome", "Lisbon"))
    assert warm == DOC + ask
    assert planned[0].content == DOC.replace("Oslo", "Madrid") + ask
    assert _common(warm, planned[0].content) == START  # everything after the field differs


def test_the_erratum_keeps_the_whole_original_prompt_and_appends_the_correction():
    warm, planned = plan_variant(spec(), "erratum")
    ask = question_text("What is the destination?", ("Oslo", "Madrid", "Rome", "Lisbon"))
    assert warm == DOC + ask
    assert planned[1].content == DOC + render_erratum("destination", "Oslo", "Rome") + ask
    assert "has changed from Oslo to Rome" in planned[1].content
    assert _common(warm, planned[1].content) >= len(DOC)  # the whole document is shared


def test_hoist_moves_the_fields_line_after_the_document():
    warm, planned = plan_variant(spec(), "hoist")
    body = DOC.replace("destination: Oslo\n", "")
    assert warm.startswith(body + "destination: Oslo\n")
    assert planned[2].content.startswith(body + "destination: Lisbon\n")
    assert _common(warm, planned[2].content) == len(body) + len("destination: ")
    assert variant_document(spec(), "hoist", None).count("Oslo") == 1


def test_the_question_is_written_as_kvnotes_frames_it_for_a_chat_model():
    from worker.engine import Question
    from worker.engine.readout import Frame

    frame = Frame(prefix="<user>", tail="<end><assistant>", chat=True, add_special_tokens=False)
    question = Question("Where does it go?", choices=("Oslo", "Madrid"))
    assert frame.suffix(question) == question_text("Where does it go?", ("Oslo", "Madrid")) + frame.tail
    assert frame.suffix(Question("Where?")) == question_text("Where?") + frame.tail


def test_field_labels_come_from_key_value_lines():
    assert field_label(DOC, START) == "destination"
    assert field_label("Ship to Oslo today", 8) == "the value"


@pytest.mark.parametrize(("change", "named"), [
    ({"start": 10, "end": 10}, "field [10, 10)"),
    ({"end": len(DOC) + 5}, "must be a non-empty span inside the document"),
    ({"values": ()}, "values: give at least one"),
    ({"values": ("Madrid", " ")}, "values: give at least one non-empty value"),
    ({"question": " "}, "question: must not be empty"),
    ({"choices": ("Oslo",)}, "choices: give at least two"),
    ({"variants": ("in_place", "rewrite")}, "variants: unknown 'rewrite'; valid: in_place, erratum, hoist"),
    ({"rate": 0.0}, "rate: must be more than 0"),
    ({"concurrency": 0}, "concurrency: must be at least 1"),
])
def test_a_bad_spec_names_what_is_wrong(change, named):
    problems = spec(**change).problems()
    assert len(problems) == 1 and named in problems[0]
    with pytest.raises(ValueError, match="^" + problems[0].split(":")[0][:10].replace("[", r"\[")):
        spec(**change).check()


def test_a_spec_round_trips_through_stored_fields():
    stored = {"document": DOC, "start": START, "end": START + 4, "label": "destination", "values": ["Madrid"],
              "question": "Q?", "choices": [], "rate": 2.0, "url": "http://x", "model": ""}
    built = ReplaySpec.of(stored)
    assert built.values == ("Madrid",) and built.rate == 2.0 and built.total_requests == 1


def _common(a: str, b: str) -> int:
    n = 0
    while n < min(len(a), len(b)) and a[n] == b[n]:
        n += 1
    return n
