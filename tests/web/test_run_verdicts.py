"""The run page's verdicts know the edit: each strategy is judged by whether its answer names the
field's new value (as recompute's does), the headline counts what that makes count, a run whose
recompute names neither value says so in plain words, and speed-ups too short to time say so."""

from __future__ import annotations

from types import SimpleNamespace as NS

import pytest

from app.web.runs.verdict_view import headline, timing
from app.web.runs.view import decision_rows, run_note
from data.contracts import RunSnapshot, SnapshotField, SnapshotQuestion
from data.models import RunResult

DOC = "Account record\nstatus: active\nOnly accounts whose status is active may log in.\n"
START = DOC.index("active")


def snapshot(choices: tuple[str, ...] = (), old: str = "active", new: str = "suspended") -> RunSnapshot:
    field = SnapshotField(start=START, end=START + 6, old=old, new=new, label="status")
    return RunSnapshot(model="m", document=DOC, fields=[field], errata=[], placements=[],
                       question=SnapshotQuestion(text="What is the status?",
                                                 choices=list(choices), cot=False),
                       strategies=[])


def result(strategy: str, decision: str, same: bool, ttft: float = 40.0, spread=None) -> RunResult:
    row = RunResult(strategy=strategy, decision=decision, decision_matches_recompute=same, tokens_computed=10,
                    ttft_ms=ttft, latency_ms=ttft + 1)
    row.ttft_spread_ms = spread  # a plain attribute on runs stored before the column existed
    return row


def run_of(answers: dict[str, str], **kw) -> NS:
    reference = answers["recompute"]
    results = [result(name, text, text == reference, ttft=600.0 if name == "recompute" else 40.0)
               for name, text in answers.items()]
    return NS(results=results, strategies=list(answers), snapshot=snapshot(**kw))


ACCESS = {  # the access-policy run a newcomer saw marked wrong
    "recompute": "The account status is suspended.",
    "stale": "The account status is active.",
    "in_place": "Suspended.",
    "erratum": "The account status is active.",
    "field_erratum": "The status is suspended now.",
}


def test_a_strategy_that_follows_the_edit_in_other_words_is_not_a_different_decision():
    run = run_of(ACCESS)
    rows = {r.strategy: r for r in decision_rows(run)}
    assert {name: r.followed for name, r in rows.items()} == {
        "recompute": "new", "stale": "old", "in_place": "new", "erratum": "old", "field_erratum": "new"}
    assert rows["field_erratum"].agrees and rows["in_place"].agrees  # their wording differs from recompute's
    assert rows["field_erratum"].mark.text == "✓ follows the edit"
    assert rows["stale"].mark.text == "✗ keeps the old value" and not rows["stale"].agrees
    assert rows["recompute"].mark.text == "the reference · follows the edit"
    top = headline(list(rows.values()), True)
    assert (top.count, top.text) == ("2 of 4", "strategies follow the edit, as recompute does")
    note = run_note(list(rows.values()), run.snapshot)
    assert note.startswith("Follows the edit: in_place, field_erratum · "
                           "keeps the old value: stale, erratum. ")
    assert "The edit moved recompute's answer from “The account status is active.” (stale notes)" in note


def test_when_the_edit_did_not_change_recomputes_answer_the_headline_does_not_count_agreement():
    run = run_of({"recompute": "Oslo", "stale": "Oslo.", "in_place": "It goes to Oslo", "erratum": "Madrid"},
                 old="Oslo", new="Madrid")
    rows = decision_rows(run)
    top = headline(rows, True)
    assert (top.count == ""
            and top.text == "the edit did not change recompute's answer: it keeps the old value")
    assert "of 3" not in top.text
    assert [r.agrees for r in rows] == [True, True, True, False]  # erratum names the new value, recompute not
    assert "Recompute's answer still names the old value" in run_note(rows, run.snapshot)


def test_when_recompute_names_neither_value_the_page_says_so_in_plain_words():
    run = run_of({"recompute": "I do not know.", "stale": "I don't know", "field_erratum": "Suspended"})
    rows = decision_rows(run)
    assert [r.followed for r in rows] == ["neither", "neither", "new"]
    top = headline(rows, True)
    assert top.count == "" and "names neither value: read KL and NLL" in top.text
    note = run_note(rows, run.snapshot)
    assert "this model does not read the field back here" in note and "Read KL and the NLL" in note
    # the strategy naming the new value is not called a "different decision"
    assert rows[2].mark.text == "names the new value (recompute's answer names neither)"


def test_a_yes_no_choice_is_judged_on_the_decision_not_on_named_values():
    run = run_of({"recompute": "no", "stale": "yes", "field_erratum": "no"}, choices=("yes", "no"))
    rows = decision_rows(run)
    assert [r.followed for r in rows] == [None, None, None]
    assert [r.mark.text for r in rows[1:]] == ["✗ different decision", "✓ same decision"]
    assert ((headline(rows, True).count, headline(rows, True).text)
            == ("1 of 2", "strategies give recompute's decision"))


def test_a_page_without_a_snapshot_still_has_rows():  # the home page's summary passes results only
    rows = decision_rows(NS(results=[result("recompute", "a", True), result("stale", "b", False)],
                            strategies=[]))
    assert [(r.followed, r.agrees) for r in rows] == [(None, True), (None, False)]


@pytest.mark.parametrize(("ref_ms", "ref_spread", "ms", "spread", "label"), [
    (600.0, [550.0, 650.0], 40.0, [35.0, 45.0], None),                 # 12×–19×: stands
    (600.0, [300.0, 900.0], 400.0, [250.0, 700.0], "noisy: 0.4–3.6×"),  # crosses 1× widely
    (200.0, [190.0, 210.0], 20.0, [19.0, 21.0], "too short to time"),  # no paired rounds, under 250 ms
    (600.0, [590.0, 610.0], 600.0, [580.0, 620.0], "noisy: 1.0–1.1×, about the same as recompute"),
    (600.0, None, 500.0, None, None),                      # stored before spreads: the 250 ms rule only
    (240.0, None, 20.0, None, "too short to time"),
])
def test_a_speed_up_that_does_not_stand_says_what_happened(ref_ms, ref_spread, ms, spread, label):
    tip = timing(result("in_place", "x", True, ms, spread),
                 result("recompute", "x", True, ref_ms, ref_spread))
    assert (tip.label if tip else None) == label
    if tip is not None:
        assert f"recompute {ref_ms:.1f} ms" in tip.tip and f"this strategy {ms:.1f} ms" in tip.tip


@pytest.mark.parametrize(("ref_ms", "paired", "label"), [
    (6540.0, [12.0, 19.0], None),  # stands, a factor of 1.6
    (6540.0, [0.9, 1.1], "noisy: 0.9–1.1×, about the same as recompute"),  # issue 33: prefix_reuse
    (10000.0, [4.1, 9.8], "at least 4.1×"),  # more than a factor of 2, but faster in every round
    (10000.0, [5.1, 22.2], "at least 5.1×"),  # issue 51: in_place on the shipment log, never "noisy"
    (10000.0, [0.2, 0.6], "at most 0.6×"),  # slower in every round
    (10000.0, [1.04, 2.6], "at least 1.04×"),  # never "at least 1.0×"
    (10000.0, [0.5, 3.0], "noisy: 0.5–3.0×"),  # across 1× and wide: not "about the same"
    (6540.0, [1.2, 2.3], None),
    (120.0, [0.8, 1.5], "too short to time"),  # noisy, and recompute's first token under the floor
    (120.0, [1.2, 2.3], None),  # under the floor, but the paired range stands
])
def test_a_paired_speed_up_range_reads_noisy_with_its_range_and_too_short_only_under_the_floor(
        ref_ms, paired, label):
    mine, ref = result("in_place", "x", True, 40.0, [35.0, 45.0]), result("recompute", "x", True, ref_ms)
    mine.speedup, mine.speedup_range = sum(paired) / 2, paired
    tip = timing(mine, ref)
    assert (tip.label if tip else None) == label
    if tip is not None and tip.kind in ("noisy", "bound"):
        assert f"ranges {paired[0]:.1f}×–{paired[1]:.1f}× over the paired timings" in tip.tip
    assert "noisy" not in (tip.label if tip else "") or paired[0] <= 1.0 <= paired[1]  # noisy only across 1×


def test_the_page_shows_the_paired_range_the_spread_over_orders_and_flags_a_first_choice_answer(make_client):
    from data.models import Notebook, Question
    from tests.web.conftest import add_field, new_notebook, session
    from tests.web.finished_run import finished_run

    client = make_client()
    nb = new_notebook(client)
    add_field(client, nb)
    s = session()
    notebook = s.get(Notebook, nb)
    notebook.questions.append(Question(text="What is the status?", choices=["active", "suspended"]))
    s.commit()
    run = finished_run(s, notebook, strategies=("recompute", "stale"))
    rows = {r.strategy: r for r in s.query(RunResult).filter_by(run_id=run.id)}
    rows["recompute"].choice_probs = {"active": 0.61, "suspended": 0.39}
    rows["recompute"].choice_spread = {"active": [0.24, 0.98], "suspended": [0.02, 0.76]}
    rows["recompute"].order_bias = "first"
    rows["stale"].speedup, rows["stale"].speedup_range = 20.5, [18.1, 24.3]
    s.commit()
    html = client.get(f"/runs/{run.id}").text
    assert "This model picks the first choice here: read KL instead." in html
    assert "61.0% <span" in html and ">(24–98)</span>" in html and ">(2–76)</span>" in html
    assert "<strong>20.5×</strong>" in html and "18.1–24.3×" in html
    export = client.get(f"/runs/{run.id}/export.json").json()
    stale = next(d for d in export["decisions"] if d["strategy"] == "stale")
    assert stale["speedup_range"] == [18.1, 24.3] and stale["speedup"] == 20.5
    reference = next(d for d in export["decisions"] if d["strategy"] == "recompute")
    assert reference["order_bias"] == "first" and reference["choice_spread"]["active"] == [0.24, 0.98]


def _free_answer_run(client, decisions: dict[str, str]):
    """A finished free-answer run of a notebook whose field changes "active" to "suspended", its
    strategies answering `decisions`."""
    from data.models import Notebook, Question
    from tests.web.conftest import add_field, new_notebook, session
    from tests.web.finished_run import finished_run
    from vocabulary.verdicts import edit_followed

    nb = new_notebook(client)
    add_field(client, nb)
    s = session()
    notebook = s.get(Notebook, nb)
    notebook.questions.append(Question(text="What is the status?", choices=[]))
    s.commit()
    run = finished_run(s, notebook, strategies=tuple(decisions))
    for row in s.query(RunResult).filter_by(run_id=run.id):
        row.decision = row.text = decisions[row.strategy]
        row.decision_matches_recompute = decisions[row.strategy] == decisions["recompute"]
        row.edit_followed = edit_followed(row.decision, ["active"], ["suspended"])  # as the worker would
    s.commit()
    return run


def test_the_page_leads_with_the_edit_and_counts_who_follows_it(make_client):
    client = make_client()
    run = _free_answer_run(client, {"recompute": "The account is currently suspended.",
                                    "stale": "The account is currently active.",
                                    "field_erratum": "The account status is suspended."})
    html = client.get(f"/runs/{run.id}").text
    assert "<strong>1 of 2</strong> strategies follow the edit, as recompute does" in html
    assert "Follows the edit: field_erratum · keeps the old value: stale." in html
    assert 'data-followed="new">✓ follows the edit</span>' in html  # never "✗ different decision"
    assert "✗ different decision" not in html
    assert html.count('data-followed="new">follows the edit</span>') == 2  # the answers' badges
    assert "strategies agree" not in html


def test_the_page_says_in_plain_words_when_recompute_names_neither_value(make_client):
    client = make_client()
    run = _free_answer_run(client, {"recompute": "I cannot say.", "stale": "I cannot say.",
                                    "field_erratum": "Suspended."})
    html = client.get(f"/runs/{run.id}").text
    assert "recompute&#39;s answer names neither value: read KL and NLL" in html
    assert "this model does not read the field back here" in html and "of 2</strong>" not in html


def test_a_speed_up_too_short_to_time_says_so_with_the_numbers(make_client):
    from tests.web.conftest import session

    client = make_client()
    run = _free_answer_run(client, {"recompute": "Suspended.", "stale": "Active.",
                                    "field_erratum": "Suspended."})
    s = session()
    s.query(RunResult).filter_by(run_id=run.id, strategy="recompute").one().ttft_ms = 180.0
    s.commit()
    html = client.get(f"/runs/{run.id}").text
    assert html.count(">too short to time</span>") == 2  # both strategies against a 180 ms recompute
    assert ('title="recompute&#39;s time to first token is under 250 ms: '
            'recompute 180.0 ms, this strategy 2.5 ms"') in html
    assert "72.0×" not in html  # 180 / 2.5 is not shown as a speed-up


def test_a_sweep_s_decision_only_edit_reads_not_timed_not_too_short():
    mine, ref = result("in_place", "x", True, 0.0), result("recompute", "x", True, 0.0)
    mine.detail, ref.detail = "decisions only: not timed", "computed exactly from the first change on; " \
        "decisions only: not timed"
    tip = timing(mine, ref)
    assert (tip.label, tip.kind) == ("not timed", "untimed") and "timed edits give the speed-ups" in tip.tip
    mine.detail = ""  # not a decision-only edit: never "not timed"
    assert getattr(timing(mine, ref), "label", None) != "not timed"


def test_the_home_page_judges_agreement_as_the_run_page_does(make_client):
    """Where recompute's answer names no value, the rule falls back to the first answer token
    (`top1_agrees`): the home page's summary reads that column too, so it and the run page count the
    same strategies as agreeing (issue 51 item 10: it read a column it never selected, and fell back
    to the exact wording)."""
    from app.web.notebooks.home_view import last_run_outcomes
    from app.web.runs.view import decision_rows
    from data.models import Run
    from tests.web.conftest import session

    client = make_client()
    run = _free_answer_run(client, {"recompute": "I cannot say.", "stale": "I cannot say for sure.",
                                    "field_erratum": "I can not say."})
    s = session()
    for row in s.query(RunResult).filter_by(run_id=run.id):
        row.top1_agrees = row.strategy != "stale"  # field_erratum's first token is recompute's
    s.commit()
    full = s.get(Run, run.id)
    on_page = {r.strategy: r.agrees for r in decision_rows(full)}
    assert on_page == {"recompute": True, "stale": False, "field_erratum": True}
    home = last_run_outcomes(s, [full.notebook_id])[full.notebook_id]
    assert home.headline.count == "1 of 2"
    assert home.best_strategy == "field_erratum"  # it agrees on the home page too, and is the fastest


def test_a_choice_read_over_some_of_its_orders_is_marked_partial(make_client):
    """Issue 51 item 11: a decision-only reading that stopped once settled averages only the orders it
    read; the decision table says so beside its probabilities, a full reading says nothing."""
    from data.models import Notebook, Question
    from tests.web.conftest import add_field, new_notebook, session
    from tests.web.finished_run import finished_run

    client = make_client()
    nb = new_notebook(client)
    add_field(client, nb)
    s = session()
    notebook = s.get(Notebook, nb)
    notebook.questions.append(Question(text="What is the status?", choices=["active", "suspended"]))
    s.commit()
    run = finished_run(s, notebook, strategies=("recompute", "stale", "in_place"))
    rows = {r.strategy: r for r in s.query(RunResult).filter_by(run_id=run.id)}
    rows["recompute"].orders_read, rows["recompute"].orders_total = 8, 8
    rows["in_place"].orders_read, rows["in_place"].orders_total = 6, 8
    s.commit()
    html = client.get(f"/runs/{run.id}").text
    assert html.count("data-partial-orders=") == 1
    assert 'data-partial-orders="6/8">partial: the mean of 6 of 8 orders' in html
    api = client.get(f"/api/runs/{run.id}").json()
    got = {name: (r["orders_read"], r["orders_total"]) for name, r in api["results"].items()}
    assert got["in_place"] == (6, 8) and got["recompute"] == (8, 8)


def test_the_note_quoting_an_answer_does_not_double_its_full_stop(make_client):
    """Issue 51: "…suspended.”." read as a doubled full stop: an answer's own stop ends the sentence."""
    from tests.web.conftest import long_record_run, session

    client = make_client()
    run = long_record_run(session(), ("recompute", "stale"))
    page = client.get(f"/runs/{run.id}").text
    assert "to “The status is suspended.” " in page and ".”." not in page
