"""A sweep's statistics (`vocabulary.sweeps`), pure and torch-free: the Wilson interval and the
confidence sequence against known values, agreement and changed-edit agreement on choices and on
free answers (undetermined edits counted apart), accuracy against `expected`, cost share, speed-up
median and IQR, the policy (both lower bounds, every candidate) and its sentence at several
thresholds, when it is decided, `needed`, a policy per field, and every candidate's worst cases."""

from __future__ import annotations

import pytest

from vocabulary.confidence import confidence_sequence, more_needed
from vocabulary.sweeps import EditRecord, Outcome, needed_words, standing_dict, sweep_stats, wilson


def _o(decision: str, tokens: int, ttft: float = 10.0, followed: str | None = None,
       kl: float = 0.0) -> Outcome:
    return Outcome(decision=decision, followed=followed, kl=kl, tokens=tokens, prefix_cache_share=0.5,
                   ttft_ms=ttft)


def test_wilson_matches_known_values():
    lo, hi = wilson(38, 40)
    assert (round(lo, 3), round(hi, 3)) == (0.835, 0.986)
    lo, hi = wilson(40, 40)
    assert round(lo, 3) == 0.912 and hi == 1.0
    lo, hi = wilson(0, 10)
    assert lo == 0.0 and round(hi, 3) == 0.278
    assert wilson(0, 0) is None
    for k in range(21):
        lo, hi = wilson(k, 20)
        assert lo <= k / 20 <= hi


def _choice_sweep(n: int, erratum_misses: int, group: str = "") -> list[EditRecord]:
    """n edits; the first half change recompute's decision (yes → no); erratum misses the first
    `erratum_misses` changed ones; in_place never follows."""
    edits = []
    for i in range(n):
        moved = i < n // 2
        ref = "no" if moved else "yes"
        erratum = "yes" if moved and i < erratum_misses else ref
        edits.append(EditRecord(
            position=i, group=group, values={"status": f"v{i}"}, expected=ref if i % 2 == 0 else None,
            run_id=100 + i,
            outcomes={"recompute": _o(ref, 1000, ttft=100.0), "stale": _o("yes", 0, ttft=5.0),
                      "erratum": _o(erratum, 20, ttft=10.0 if i % 2 else 20.0, kl=0.1 * i),
                      "in_place": _o("yes", 5, ttft=4.0), "prefix_reuse": _o(ref, 600, ttft=50.0)}))
    return edits


def test_agreement_changed_cost_and_speedup_on_choices():
    edits = _choice_sweep(40, erratum_misses=2)
    stats = sweep_stats(edits, ["recompute", "stale", "erratum", "in_place", "prefix_reuse"], True)
    e = stats.strategies["erratum"]
    assert (e.agreement.k, e.agreement.n) == (38, 40)
    assert (e.changed.k, e.changed.n) == (18, 20)
    lo, hi = e.agreement.ci95
    assert lo <= e.agreement.value <= hi
    assert e.cost_share == pytest.approx(20 / 1000)
    assert e.speedup_median == pytest.approx(7.5)  # half at 10×, half at 5×
    assert e.speedup_iqr == (5.0, 10.0)
    assert stats.strategies["stale"].changed.k == 0 and stats.strategies["stale"].agreement.k == 20
    assert stats.strategies["in_place"].changed.k == 0
    assert stats.strategies["recompute"].changed.k == 20 and stats.strategies["recompute"].cost_share == 1.0
    acc = stats.strategies["erratum"].accuracy
    assert acc.n == 20 and acc.k == 19  # even positions carry `expected`; position 0 is a miss
    # no approximate strategy reaches 0.95 on 20 changed edits: prefix_reuse, exact, is the policy
    assert stats.policy.strategy == "prefix_reuse"
    assert stats.policy.sentence == (
        "erratum agreed with recompute on 38 of 40 determined edits (lower bound 0.76) and 18 of 20 "
        "changed edits (lower bound 0.59): held back by both bounds, below 0.95, so prefix_reuse is "
        "exact (it agreed on all 40 determined edits), at 60% of recompute's tokens")
    # not decided: erratum (12% of prefix_reuse's cost) could still qualify, in_place is proven below
    assert not stats.policy.decided
    standing = {st.name: st for st in stats.policy.standings}
    assert [st.name for st in stats.policy.standings] == ["stale", "in_place", "erratum", "prefix_reuse"]
    assert (standing["in_place"].below, standing["erratum"].below, standing["stale"].needed) == \
        (True, False, None)
    assert standing["erratum"].needed == 234 and standing["prefix_reuse"].needed == 0
    # without it the policy is recompute; the worst cases are every candidate's disagreements,
    # cheapest first, at most 10 each, answers side by side with their runs
    stats = sweep_stats(edits, ["recompute", "stale", "erratum", "in_place"], True)
    assert stats.policy.strategy == "recompute"
    worst = [(w.strategy, w.run_id, w.answer, w.recompute) for w in stats.worst]
    assert [w[0] for w in worst] == ["stale"] * 10 + ["in_place"] * 10 + ["erratum"] * 2
    assert worst[-2:] == [("erratum", 100, "yes", "no"), ("erratum", 101, "yes", "no")]
    labels = {p.label for p in stats.frontier}
    assert {"erratum", "in-place", "hoist-to-end"} <= labels


def test_policy_moves_with_the_threshold_without_prefix_reuse():
    edits = _choice_sweep(80, erratum_misses=0)
    strategies = ["recompute", "stale", "erratum", "in_place"]
    high = sweep_stats(edits, strategies, True, threshold=0.9)
    assert high.policy.strategy == "recompute"
    assert high.policy.sentence == (
        "erratum agreed with recompute on 80 of 80 determined edits (lower bound 0.91) and 40 of 40 "
        "changed edits (lower bound 0.85): held back by its agreement on the changed edits, below 0.90, "
        "so recompute")
    low = sweep_stats(edits, strategies, True, threshold=0.8)
    assert low.policy.strategy == "erratum" and low.policy.decided  # in_place and stale proven below
    assert low.policy.sentence.endswith(
        "so erratum agreed with recompute on 80 of 80 determined edits (lower bound 0.91) and 40 of 40 "
        "changed edits (lower bound 0.85), both >= 0.80, at 2.0% of recompute's tokens")


def test_free_answers_count_undetermined_and_policy_per_field():
    edits = []
    for i in range(10):
        ref_verdict = "new" if i < 6 else "neither"  # 4 edits where recompute names no value
        edits.append(EditRecord(
            position=i, group="status" if i % 2 else "time", values={}, expected=None, run_id=i,
            outcomes={"recompute": _o("it is banned", 100, followed=ref_verdict),
                      "stale": _o("it is active", 0, followed="old"),
                      "erratum": _o("banned", 10, followed="new" if i != 0 else "old")}))
    stats = sweep_stats(edits, ["recompute", "stale", "erratum"], False)
    e = stats.strategies["erratum"]
    assert e.undetermined == 4 and (e.agreement.k, e.agreement.n) == (5, 6)
    assert (e.changed.k, e.changed.n) == (5, 6)
    assert [p.group for p in stats.policies] == ["status", "time"]
    assert all(p.strategy == "recompute" for p in stats.policies)


def test_no_changed_edit_says_so():
    edits = [EditRecord(i, "", {}, None, i, {"recompute": _o("yes", 100), "stale": _o("yes", 0),
                                             "erratum": _o("yes", 10)}) for i in range(5)]
    stats = sweep_stats(edits, ["recompute", "stale", "erratum"], True)
    assert stats.policy.strategy == "recompute"
    assert stats.policy.sentence == ("no edit changed recompute's decision (5 edits, 0 undetermined): "
                                     "the sweep cannot tell the strategies apart on this prompt, "
                                     "so recompute")
    # a free answer that never names either value: every edit undetermined, and it says so
    free = [EditRecord(i, "", {}, None, i, {"recompute": _o("yes", 100, followed="neither"),
                                            "stale": _o("yes", 0, followed="neither"),
                                            "prefix_reuse": _o("yes", 60, followed="neither")})
            for i in range(4)]
    stats = sweep_stats(free, ["recompute", "stale", "prefix_reuse"], False)
    assert stats.strategies["prefix_reuse"].undetermined == 4
    assert stats.policy.strategy == "prefix_reuse"
    assert stats.policy.sentence.startswith(
        "recompute's answer named neither the old nor a new value on all 4")
    assert stats.policy.sentence.endswith("so prefix_reuse is exact (by construction), at 60% of "
                                          "recompute's tokens")


def test_the_engines_paired_speedup_is_used_when_it_measured_one():
    edits = [EditRecord(i, "", {}, None, i, {
        "recompute": _o("yes", 100, ttft=100.0), "stale": _o("yes", 0),
        "erratum": Outcome("yes", None, 0.0, 10, 0.5, ttft_ms=50.0, speedup=[3.0, 4.0, 5.0][i])})
        for i in range(3)]
    e = sweep_stats(edits, ["recompute", "stale", "erratum"], True).strategies["erratum"]
    assert e.speedup_median == 4.0 and e.speedup_iqr == (3.5, 4.5)  # not 100 / 50 = 2.0


def test_a_per_field_policy_applies_the_most_conservative_strategy_of_the_edited_fields():
    from vocabulary.sweep_policy import apply_policy, caution
    from vocabulary.sweeps import Policy

    # recompute, then an exact strategy, then by share of recompute's tokens (unknown: careful)
    assert caution("recompute", 1.0) > caution("prefix_reuse", 0.95) > caution("selective", 0.15)
    assert caution("selective", 0.15) > caution("erratum", 0.12) > caution("in_place", 0.006)
    assert caution("erratum", None) > caution("selective", 0.15)
    fields = [Policy("in_place", 0.95, "", "timestamp", 0.006), Policy("erratum", 0.95, "", "status", 0.12)]
    assert apply_policy("erratum", fields, ["timestamp"]).strategy == "in_place"
    both = apply_policy("erratum", fields, ["timestamp", "status"])
    assert both.strategy == "erratum" and both.note == (
        "the run edits timestamp (in_place) and status (erratum): the most conservative, erratum")
    tier = apply_policy("recompute", fields, ["timestamp", "tier"])
    assert tier.strategy == "recompute" and "tier (no policy of its own: the overall recompute)" in tier.note
    assert apply_policy("in_place", fields, []).strategy == "in_place"


def test_the_confidence_sequence_is_valid_at_every_look_and_wider_than_wilson():
    # all agreeing: the lower end is (alpha / (n + 1)) ** (1 / n) exactly
    for n in (1, 4, 40, 158):
        assert confidence_sequence(n, n)[0] == pytest.approx((0.05 / (n + 1)) ** (1 / n), abs=1e-9)
        assert confidence_sequence(0, n)[1] == pytest.approx(1 - (0.05 / (n + 1)) ** (1 / n), abs=1e-9)
    assert confidence_sequence(157, 157)[0] < 0.95 <= confidence_sequence(158, 158)[0]
    assert more_needed([(0, 0)], 0.95) == 158  # Wilson's fixed-n bound would say 73
    lo, hi = confidence_sequence(4, 7)
    assert (round(lo, 3), round(hi, 3)) == (0.128, 0.939)
    for k in range(0, 21):
        lo, hi = confidence_sequence(k, 20)
        wlo, whi = wilson(k, 20)
        assert lo <= wlo <= k / 20 <= whi <= hi
    assert confidence_sequence(0, 0) is None
    # needed: the smallest m with both lower bounds of (k+m)/(n+m) at the threshold
    m = more_needed([(4, 7), (4, 4)], 0.95)
    assert confidence_sequence(4 + m, 7 + m)[0] >= 0.95 > confidence_sequence(3 + m, 6 + m)[0]


def _city(ref: str, tokens: int, decision: str | None = None) -> Outcome:
    return _o(decision or ref, tokens)


def test_the_shipment_log_case_a_strategy_that_flips_kept_decisions_is_never_the_policy():
    """Issue 31: 7 edits, choices Oslo/Madrid. recompute moves to Madrid on 4 and keeps Oslo on 3;
    in_place answers Madrid on all 7: 4 of 4 changed, but 4 of 7 determined. hoist agrees on all 7."""
    edits = []
    for i, value in enumerate(["Madrid", "Lisbon", "Rome", "Athens", "Paris", "Berlin", "Vienna"]):
        ref = "Madrid" if i < 4 else "Oslo"
        edits.append(EditRecord(i, "destination", {"destination": value}, None, 10 + i, {
            "recompute": _o(ref, 1000), "stale": _o("Oslo", 0), "in_place": _o("Madrid", 6),
            "hoist": _o(ref, 2), "prefix_reuse": _o(ref, 600)}))
    names = ["recompute", "stale", "in_place", "hoist", "prefix_reuse"]
    for threshold in (0.05, 0.1, 0.12, 0.5, 0.95):
        stats = sweep_stats(edits, names, True, threshold)
        assert stats.policy.strategy != "in_place", threshold
    ip = sweep_stats(edits, names, True, 0.5).strategies["in_place"]
    assert (ip.changed.k, ip.changed.n, ip.agreement.k, ip.agreement.n, ip.flips) == (4, 4, 4, 7, 3)
    # at 0.2 in_place's changed edits clear it (lower bound 0.32) but every determined edit does not
    # (0.13): it is held back by that bound, and hoist (7 of 7, 0.48; 4 of 4, 0.32) is the policy
    stats = sweep_stats(edits, names, True, 0.2)
    assert stats.policy.strategy == "hoist"
    standing = {st.name: st for st in stats.policy.standings}
    assert standing["in_place"].held_back == ("determined",)
    assert "held back by its agreement on every determined edit; it moved off 3 decisions recompute " \
           "kept" in standing["in_place"].sentence
    # every candidate's disagreements are listed, in_place's three flips among them (kept: recompute
    # kept its answer there)
    flips = [(w.strategy, w.values["destination"], w.answer, w.recompute, w.kept) for w in stats.worst
             if w.strategy == "in_place"]
    assert flips == [("in_place", "Paris", "Madrid", "Oslo", True),
                     ("in_place", "Berlin", "Madrid", "Oslo", True),
                     ("in_place", "Vienna", "Madrid", "Oslo", True)]
    assert {w.strategy for w in stats.worst} == {"stale", "in_place"}  # hoist, prefix_reuse never differ


def test_decided_only_when_every_cheaper_candidate_is_proven_below_and_needed_in_words():
    def sweep(n: int) -> list[EditRecord]:  # every edit changes recompute's decision
        return [EditRecord(i, "", {}, None, i, {"recompute": _o("no", 100), "stale": _o("yes", 0),
                                                "in_place": _o("yes" if i % 2 else "no", 1),
                                                "erratum": _o("no", 10), "prefix_reuse": _o("no", 60)})
                for i in range(n)]

    names = ["recompute", "stale", "in_place", "erratum", "prefix_reuse"]
    early = sweep_stats(sweep(4), names, True, 0.95).policy
    assert early.strategy == "prefix_reuse" and not early.decided  # in_place could still qualify
    # in_place at 10 of 20: upper bound under 0.95, proven below; erratum 20 of 20 is not yet 0.95
    mid = sweep_stats(sweep(20), names, True, 0.95).policy
    standing = {st.name: st for st in mid.standings}
    assert standing["in_place"].below and not standing["erratum"].below and not mid.decided
    assert standing["erratum"].needed == 138  # 20 + 138 = 158 all agreeing
    assert needed_words("erratum", 138, 0.95) == \
        "erratum would need at least 138 more changed edits, all agreeing, to reach 0.95"
    assert needed_words("stale", None, 0.95).startswith("stale cannot reach 0.95")
    # proven below: the count is still given, and the words say it is not to be expected
    assert standing_dict(standing["in_place"], 0.95)["needed_words"] == (
        f"in_place would need at least {standing['in_place'].needed} more changed edits, all agreeing, "
        "to reach 0.95, which is not to be expected of a strategy proven below it")
    done = sweep_stats(sweep(40), names, True, 0.8).policy  # erratum 40 of 40: 0.85; in_place under 0.73
    assert done.strategy == "erratum" and done.decided


def test_one_determined_edit_reads_as_one_not_all_1_edits():
    """Issue 51: "on all 1 edits" reads "on its one determined edit"."""
    edits = _choice_sweep(2, erratum_misses=0)[:1]
    stats = sweep_stats(edits, ["recompute", "stale", "prefix_reuse"], True)
    assert "it agreed on its one determined edit" in stats.policy.sentence
    assert "all 1 " not in stats.policy.sentence
