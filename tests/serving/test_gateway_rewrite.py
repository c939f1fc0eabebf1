"""The gateway's rewrite on its own (`serving.gateway`): what a request is sent as, per layout, mode
and limit, with multi-turn conversations keeping their errata where they were told."""

from __future__ import annotations

from hypothesis import given, settings
from hypothesis import strategies as st

from serving.gateway import CHAT, COMPLETIONS, Rewriter, Settings, Slot, Template, read_prompt
from serving.gateway.changes import diff_changes
from vocabulary import render_erratum
from vocabulary.hoist import hoist

BODY = "record_id: SR-20417\ndestination: {}\nstatus: {}\n\n" + "\n".join(
    f"2026-03-01 08:{i:02d} The carrier confirmed step {i}." for i in range(40))


def chat(*contents: str) -> dict:
    roles = ["system"] + ["user", "assistant"] * len(contents)
    return {"model": "m", "messages": [{"role": r, "content": c} for r, c in zip(roles, contents)]}


def plan(rewriter: Rewriter, body: dict, route: str = CHAT):
    prompt, why = read_prompt(route, body)
    return rewriter.plan("client", prompt, why), prompt


def test_errata_stay_where_they_were_told_across_turns():
    rewriter = Rewriter(Settings(check_rate=0))
    first, _ = plan(rewriter, chat(BODY.format("Oslo", "open"), "Where to?"))
    assert (first.context, first.reason) == (None, "new base")
    second, _ = plan(rewriter, chat(BODY.format("Rome", "open"), "Where to?"))
    told = render_erratum("destination", "Oslo", "Rome")
    assert second.context == [BODY.format("Oslo", "open") + told] and second.header == "erratum"
    # the next turn: the conversation grew; the erratum stays on the system message, the new change
    # is told after the last context message (the assistant's answer), and the last message is as sent
    third, _ = plan(rewriter, chat(BODY.format("Rome", "held"), "Where to?", "To Rome.", "Status?"))
    assert third.context == [BODY.format("Oslo", "open") + told, "Where to?",
                             "To Rome." + render_erratum("status", "open", "held")]
    # a change back to the base's value is told too
    fourth, _ = plan(rewriter, chat(BODY.format("Oslo", "held"), "Where to?", "To Rome.", "Status?"))
    assert fourth.context[2].endswith(render_erratum("destination", "Rome", "Oslo"))
    assert fourth.context[0] == third.context[0]  # the prefix the engine cached is untouched


def test_limits_and_what_is_never_read():
    rewriter = Rewriter(Settings(max_fields=1, check_rate=0))
    plan(rewriter, chat(BODY.format("Oslo", "open"), "Where to?"))
    two, _ = plan(rewriter, chat(BODY.format("Rome", "held"), "Where to?"))
    assert two.reason == "2 changed spans, over --max-fields 1"
    rewriter = Rewriter(Settings(check_rate=0))
    plan(rewriter, chat(BODY.format("Oslo", "open"), "Where to?"))
    big = BODY.format("Oslo", "open").replace("step 1.", "step one, " * 20)  # 200 of ~2,000 characters
    wide, _ = plan(rewriter, chat(big, "Where to?"))
    assert wide.context is None
    assert wide.reason.startswith("changes cover ") and wide.reason.endswith("over 5%")
    last, _ = plan(rewriter, chat(BODY.format("Oslo", "open"), "Where to? destination: Rome"))
    assert last.context == [BODY.format("Oslo", "open")]  # the last message is never read: no change
    short, _ = plan(rewriter, chat("destination: Oslo", "Where to?"))
    assert short.reason == "context under 1000 characters"


def test_completions_keep_their_last_paragraph():
    rewriter = Rewriter(Settings(check_rate=0))
    ask = "\n\nQuestion: where to?\nAnswer:"
    plan(rewriter, {"model": "m", "prompt": BODY.format("Oslo", "open") + ask}, COMPLETIONS)
    second, prompt = plan(rewriter, {"model": "m", "prompt": BODY.format("Rome", "open") + ask}, COMPLETIONS)
    assert prompt.last == ask
    assert second.context == [BODY.format("Oslo", "open") + render_erratum("destination", "Oslo", "Rome")]


def test_field_erratum_and_hoist_layouts_as_the_replay_lays_them_out():
    refreshed = Rewriter(Settings(layout="field_erratum", check_rate=0))
    plan(refreshed, chat(BODY.format("Oslo", "open"), "?"))
    sent, _ = plan(refreshed, chat(BODY.format("Rome", "open"), "?"))
    assert sent.context == [BODY.format("Rome", "open") + render_erratum("destination", "Oslo", "Rome")]
    hoisted = Rewriter(Settings(layout="hoist", check_rate=0))
    plan(hoisted, chat(BODY.format("Oslo", "open"), "?"))
    sent, _ = plan(hoisted, chat(BODY.format("Rome", "open"), "?"))
    base = BODY.format("Oslo", "open")
    at = base.index("Oslo")
    expected = hoist(base, [type("F", (), {"start": at, "end": at + 4, "new_value": "Rome"})()]).text
    assert sent.context == [expected] and sent.context[0].endswith("destination: Rome\n")
    again, _ = plan(hoisted, chat(BODY.format("Lisbon", "open"), "?"))
    assert again.context[0][:expected.rindex("destination")] == expected[:expected.rindex("destination")]


def test_template_mode_names_fields_by_their_labels():
    document = BODY.format("Oslo", "open")
    at = document.index("Oslo")
    template = Template(document, [Slot("the shipment's destination", at, at + 4)])
    rewriter = Rewriter(Settings(check_rate=0), template)
    plan(rewriter, chat("Preamble.\n" + document, "?"))
    sent, _ = plan(rewriter, chat("Preamble.\n" + BODY.format("Rome", "open"), "?"))
    told = render_erratum("the shipment's destination", "Oslo", "Rome")
    assert sent.context == ["Preamble.\n" + document + told]
    assert sent.labels == ("the shipment's destination",)
    other, _ = plan(rewriter, chat("Preamble.\n" + BODY.format("Oslo", "held"), "?"))
    assert other.reason == "the notebook's document is not in the prompt"


def test_a_diff_outside_a_key_line_quotes_the_line():
    base = "alpha beta\nthe train leaves at 08:07 today\nomega"
    text = "alpha beta\nthe train leaves at 09:12 today\nomega"
    (change,) = diff_changes(0, base, text)
    assert (change.label, change.old, change.new) == ("the line", '"the train leaves at 08:07 today"',
                                                      '"the train leaves at 09:12 today"')
    assert change.values == ("08:07", "09:12")  # what a check's answers name: never the quoted line


def test_a_diff_mode_checks_values_are_the_changed_text_not_its_lines():
    """The plan's `values` (what the sampled check judges answers by) are each change's own old and
    new text: an answer names "09:12", never the whole line the erratum quotes (issue 51 item 10)."""
    body = BODY.replace("step 3.", "step 3; the train leaves at {} today.")
    rewriter = Rewriter(Settings(check_rate=0))
    plan(rewriter, chat(body.format("Oslo", "open", "08:07"), "When?"))
    changed, _ = plan(rewriter, chat(body.format("Oslo", "open", "09:12"), "When?"))
    assert changed.context is not None and changed.values == ("08:07", "09:12")


def test_bases_are_bounded_per_client_by_count_and_by_characters():
    rewriter = Rewriter(Settings(check_rate=0, bases_per_client=2))
    topics = [f"TOPIC {t}\n" + "".join(f"{t} line {i}: {t * 30}\n" for i in range(30)) for t in "ABC"]
    for topic in topics:  # three unrelated prompts: three bases, the first one evicted
        assert plan(rewriter, chat(topic, "?"))[0].reason == "new base"
    assert plan(rewriter, chat(topics[2], "?"))[0].header == "erratum"  # C is still a base
    assert plan(rewriter, chat(topics[0], "?"))[0].reason == "new base"  # A was forgotten
    small = Rewriter(Settings(check_rate=0, chars_per_client=len(topics[0]) + 10))
    for topic in topics[:2]:
        plan(small, chat(topic, "?"))
    assert plan(small, chat(topics[1], "?"))[0].header == "erratum"  # B is kept
    assert plan(small, chat(topics[0], "?"))[0].reason == "new base"  # B pushed A out by size


def _hoist_requests(rewriter: Rewriter, times: list[str]) -> list:
    body = "record_id: SR-20417\ndeparture: {}\nstatus: open\n\n" + "\n".join(
        f"2026-03-01 log line {i} of the booking." for i in range(40))
    return [plan(rewriter, chat(body.format(t), "When?"))[0] for t in times]


def test_hoist_in_diff_mode_merges_spans_that_overlap():
    """08:07 → 09:07 moves "08", → 08:12 moves "07", → 09:12 changes "08:07" as one span: before the
    fix the three spans overlapped and `hoist` raised ValueError on that request and every later one."""
    plans = _hoist_requests(Rewriter(Settings(layout="hoist", check_rate=0)),
                            ["08:07", "09:07", "08:12", "09:12", "10:30", "08:07"])
    assert [p.header for p in plans] == ["pass-through; reason=new base"] + ["hoist"] * 5
    tails = [p.context[0].rstrip("\n").rsplit("\n", 1)[1] for p in plans[1:]]
    assert tails == [f"departure: {t}" for t in ["09:07", "08:12", "09:12", "10:30", "08:07"]]
    assert all(p.context[0].startswith("record_id: SR-20417\nstatus: open\n") for p in plans[1:])


def test_a_plan_that_fails_passes_through_and_drops_its_base(monkeypatch, caplog):
    """The spans merged as before the fix (each added as it came): the plan raises, the request
    passes through saying so, the base is dropped (the next request starts a new one), logged."""
    import serving.gateway.rewrite as rewrite

    monkeypatch.setattr(rewrite, "_merge_span", lambda spans, start, end: spans.__setitem__((start, end), ""))
    plans = _hoist_requests(Rewriter(Settings(layout="hoist", check_rate=0)),
                            ["08:07", "09:07", "08:12", "09:12", "10:30"])
    assert [p.header for p in plans] == ["pass-through; reason=new base", "hoist", "hoist",
                                         "pass-through; reason=the plan failed",
                                         "pass-through; reason=new base"]
    assert "gateway plan failed: the base is dropped" in caplog.text


def _long(lines: int, first: str, last: str) -> str:
    return "\n".join([f"first: {first}"] + [f"2026-03-01 08:{i % 60:02d} The carrier confirmed step {i}."
                                            for i in range(lines)] + [f"last: {last}"])


def test_the_diff_reads_lines_first_and_stops_past_the_limit():
    """A 4 MiB prompt with its first and last lines changed: the two fields, planned within a second
    of this thread's CPU time (the issue's bound; the token diff took 45 s on 88 kB; this takes ~0.2 s;
    CPU time, not wall time, so other processes on a shared machine do not count). A text with 15
    changed lines and a limit of 4: 5 changes found, then stop."""
    import time

    base, text = _long(82_000, "Oslo", "open"), _long(82_000, "Rome", "held")
    assert 4_000_000 < len(base) < 4 << 20  # as much as the 4 MiB body limit lets through
    rewriter = Rewriter(Settings(check_rate=0, chars_per_client=10 << 20))
    plan(rewriter, chat(base, "?"))
    started = time.thread_time()
    sent, _ = plan(rewriter, chat(text, "?"))
    assert time.thread_time() - started < 1.0
    assert sent.labels == ("first", "last") and sent.context[0].startswith(base)
    many = "\n".join(line.replace("step", "stage") if i % 7 == 0 else line
                     for i, line in enumerate(base[:20_000].split("\n")))
    found = diff_changes(0, base[:20_000], many, limit=4)
    assert len(found) == 5 and all(c.old.count("step") == 1 for c in found)


LINES = ["", "}", "destination: Oslo", "destination: Rome", "status: open", "the train leaves at 08:07",
         "a b c", "x"]


@settings(max_examples=300, deadline=None, derandomize=True, database=None)
@given(st.lists(st.sampled_from(LINES) | st.text(max_size=12), max_size=30),
       st.lists(st.sampled_from(LINES) | st.text(max_size=12), max_size=30))
def test_the_diffs_spans_rebuild_the_text(base_lines, text_lines):
    """For any two texts (repeated lines, blank lines, brackets, any characters), the changes are in
    order, do not overlap, and the base with each span replaced is the text: what is not a change
    is the same on both sides. With a limit, the walk stops after the same first changes."""
    base, text = "\n".join(base_lines), "\n".join(text_lines)
    changes = diff_changes(0, base, text)
    rebuilt, at, at_new = [], 0, 0
    for c in changes:
        assert at <= c.base_start <= c.base_end and at_new <= c.start <= c.end
        assert base[at:c.base_start] == text[at_new:c.start]
        rebuilt += [base[at:c.base_start], text[c.start:c.end]]
        at, at_new = c.base_end, c.end
    assert base[at:] == text[at_new:]
    assert "".join(rebuilt) + base[at:] == text
    assert diff_changes(0, base, text, limit=2) == changes[:3]  # stopping early finds the same first ones


def test_a_one_line_document_is_diffed_and_quoted_around_the_change():
    """A 148 kB one-line JSON document with one value changed: one change of that value, its erratum
    quoting 100 characters either side (it quoted the whole line twice: 295 kB)."""
    import json

    record = {f"k{i}": f"value number {i}" for i in range(5000)}
    base = json.dumps(record)
    record["k2500"] = "changed value"
    (change,) = diff_changes(0, base, json.dumps(record))
    at = base.index('"value number 2500"') + 1
    assert (change.base_start, change.base_end, change.start, change.end) == (at, at + 17, at, at + 13)
    assert change.label == "the line" and len(change.old) < 240 and len(change.new) < 240
    assert '"k2500": "value number 2500"' in change.old and '"k2500": "changed value"' in change.new


def test_the_check_judges_by_the_one_agreement_rule():
    """The sampled check agrees by `vocabulary.agreement` (issue 43): answers naming the same changed
    value agree whatever their wording; naming the other value disagrees; where the unchanged
    answer names no value, the first words decide (the old rule, which called the first pair apart)."""
    from serving.gateway.forward import agree

    values = ("active", "suspended")
    assert agree("The account status is suspended.", "The account is suspended.", values)
    assert not agree("The account is active.", "The account is suspended.", values)
    assert not agree("The account status is suspended.", "The account is suspended.")  # no values: words
    assert agree("Yes, it may log in now.", "Yes, it may log in now!", values)
    # naming no value, the rule's own fallback (the same normalised words), not the first 8 words
    long = "The shipment leaves the depot in the morning and arrives"
    assert not agree(long + " on Monday.", long + " on Friday.", values)
    assert agree(long + " on Monday.", long.lower() + " on monday", values)
