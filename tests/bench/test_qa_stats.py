"""The question-answering benchmark's scoring: SQuAD normalisation and token F1 on known pairs (the
numbers CacheBlend's scorer gives), best-of-golds F1, the bootstrap interval and the --json shape."""

from __future__ import annotations

import sys
from pathlib import Path

import pytest

sys.path.insert(0, str(Path(__file__).resolve().parents[2] / "bench"))

from qa_stats import bootstrap, first_line, gold_f1, normalize_answer, summarize  # noqa: E402


@pytest.mark.parametrize("text, normalised", [
    ("The Exeter College.", "exeter college"),
    ("  An   apple, a PEAR!  ", "apple pear"),
    ("Charles County, Maryland", "charles county maryland"),
    ("the theatre", "theatre"),  # only whole-word articles go
    ("U.S.A.", "usa"),
    ("", ""),
])
def test_normalisation_lower_cases_and_drops_punctuation_articles_and_extra_spaces(text, normalised):
    assert normalize_answer(text) == normalised


@pytest.mark.parametrize("prediction, gold, f1", [
    ("Exeter College", "Exeter College", 1.0),
    ("the Exeter College.", "Exeter College", 1.0),
    ("Exeter", "Exeter College", 2 / 3),  # precision 1, recall 1/2
    ("Exeter College, Oxford", "Exeter College", 0.8),  # precision 2/3, recall 1
    ("University of Oxford", "Exeter College", 0.0),
    ("a", "Exeter College", 0.0),  # nothing left after normalisation
    ("college college exeter", "exeter college", 0.8),  # bags of words: the repeat counts once
])
def test_token_f1_on_known_pairs(prediction, gold, f1):
    assert gold_f1(prediction, [gold]) == pytest.approx(f1)


def test_gold_f1_takes_the_best_gold_answer_and_the_first_line():
    assert gold_f1("Charles County", ["Maryland", "Charles County"]) == 1.0
    assert gold_f1(first_line("Charles County\nbecause the passage says so"), ["Charles County"]) == 1.0
    assert gold_f1("anything", []) == 0.0


def test_bootstrap_interval_brackets_the_statistic_and_is_degenerate_for_constants():
    values = [0.0] * 10 + [1.0] * 10
    lo, hi = bootstrap(values, lambda xs: sum(xs) / len(xs), rounds=2000, seed=1)
    assert 0.2 < lo < 0.4 and 0.6 < hi < 0.8  # ≈ 0.5 ± 1.96 · 0.11
    assert bootstrap([3.0] * 7, max) == (3.0, 3.0)


def test_summary_has_the_json_shape_of_bench_qa():
    rec = {"f1_gold": 0.5, "f1_vs_recompute": 1.0, "first_token_agrees": 1.0, "kl": 0.0, "ttft_speedup": 1.0}
    fast = {"f1_gold": 0.0, "f1_vs_recompute": 0.5, "first_token_agrees": 0.0, "kl": 0.2, "ttft_speedup": 4.0}
    summary = summarize([{"recompute": rec, "splice": fast},
                         {"recompute": rec, "splice": {**fast, "kl": 0.4}}])
    assert summary["examples"] == 2
    splice = summary["strategies"]["splice"]
    keys = ("f1_gold", "f1_vs_recompute", "first_token_agrees", "kl_median", "ttft_speedup_median")
    assert all(k in splice and len(splice[f"{k}_ci95"]) == 2 for k in keys)
    assert splice["kl_median"] == pytest.approx(0.3) and splice["ttft_speedup_median"] == 4.0
    assert summary["strategies"]["recompute"]["f1_gold"] == 0.5
