"""A sweep's statistics (`vocabulary.sweeps`), pure and torch-free: the Wilson interval against
known values, agreement and changed-edit agreement on choices and on free answers (undetermined
edits counted apart), accuracy against `expected`, cost share, speed-up median and IQR, the policy
and its sentence at two thresholds, a policy per field, and the worst cases."""

from __future__ import annotations

import pytest

from vocabulary.sweeps import EditRecord, Outcome, sweep_stats, wilson


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
    assert stats.policy.sentence.startswith(
        "erratum followed recompute on 18 of 20 changed edits [0.70, 0.97]")
    assert "below 0.95" in stats.policy.sentence
    assert stats.worst_strategy == "prefix_reuse" and stats.worst == []  # it never disagreed
    # without it the policy is recompute and the worst cases are the best approximate one's misses,
    # answers side by side, with their runs
    stats = sweep_stats(edits, ["recompute", "stale", "erratum", "in_place"], True)
    assert stats.policy.strategy == "recompute" and stats.worst_strategy == "erratum"
    worst = [(w.run_id, w.answer, w.recompute) for w in stats.worst]
    assert worst == [(100, "yes", "no"), (101, "yes", "no")]
    labels = {p.label for p in stats.frontier}
    assert {"erratum", "in-place", "hoist-to-end"} <= labels


def test_policy_moves_with_the_threshold_without_prefix_reuse():
    edits = _choice_sweep(80, erratum_misses=0)
    strategies = ["recompute", "stale", "erratum", "in_place"]
    high = sweep_stats(edits, strategies, True, threshold=0.99)
    assert high.policy.strategy == "recompute"
    assert high.policy.sentence == ("erratum followed recompute on 40 of 40 changed edits [0.91, 1.00]: "
                                    "below 0.99, so recompute")
    low = sweep_stats(edits, strategies, True, threshold=0.9)
    assert low.policy.strategy == "erratum" and "lower bound 0.91 >= 0.90" in low.policy.sentence


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
    assert stats.policy.sentence.endswith("so prefix_reuse, which is exact (by construction), at 60% of "
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
